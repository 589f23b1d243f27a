"""Contract adapter (test_contract.py) of the "fa3" backend (block size 128, eager only)."""

import ascend_attn_rt as aar
from _contract_gqa import D, H, HKV, gqa_case


def case():
    return gqa_case(lambda: aar.FA3AttentionImpl(H, D, num_kv_heads=HKV), block_size=128, num_blocks=2)
