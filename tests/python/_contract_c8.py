"""Contract adapter (test_contract.py) of the "c8" backend: the GQA step through the INT8 layer."""

import torch

import ascend_attn_rt as aar
from _contract_gqa import D, H, HKV, gqa_case


def case():
    n = HKV * D
    kv = torch.zeros(aar.C8Backend.kv_cache_shape(4, 32, HKV, D), dtype=torch.int8)
    return gqa_case(lambda: aar.C8AttentionImpl(H, D, num_kv_heads=HKV, k_scale=torch.full((n,), 0.05),
                                                k_offset=torch.zeros(n), v_scale=torch.full((n,), 0.05),
                                                v_offset=torch.zeros(n)),
                    block_size=32, num_blocks=4, kv_caches=(kv[0], kv[1]))
