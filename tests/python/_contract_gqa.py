"""Contract adapter (test_contract.py) of the "gqa" backend; _contract_c8 / _contract_fa3 reuse it."""

from types import SimpleNamespace

import torch

import ascend_attn_rt as aar

H, HKV, D = 4, 2, 32


def gqa_case(make_layer, *, block_size=16, num_blocks=8, kv_caches=None, dtype=torch.float32):
    """A decode step of three requests with context, one token each, through the GQA builder and `make_layer()`."""
    g = torch.Generator().manual_seed(0)
    qsl = torch.tensor([0, 1, 2, 3], dtype=torch.int32)
    seq = torch.tensor([5, 17, 9], dtype=torch.int32)
    table = (torch.arange(12, dtype=torch.int32) % num_blocks).view(3, 4)
    kw = dict(max_num_reqs=4, max_num_tokens=16, max_blocks_per_req=4, block_size=block_size, num_blocks=num_blocks)
    builders = [aar.MetadataBuilder(**kw) for _ in range(3)]
    layer = make_layer()
    q = torch.randn(3, H, D, generator=g).to(dtype)
    k, v = torch.randn(3, HKV, D, generator=g).to(dtype), torch.randn(3, HKV, D, generator=g).to(dtype)
    kc, vc = kv_caches if kv_caches is not None else (torch.randn(num_blocks, block_size, HKV, D, generator=g),
                                                      torch.randn(num_blocks, block_size, HKV, D, generator=g))
    return SimpleNamespace(
        query_start_loc=qsl, seq_lens=seq, output_like=q, bucket=3,
        build=lambda: builders[0].build(qsl, seq, table),
        build_for_graph_capture=lambda state: builders[1].build_for_graph_capture(qsl, seq, table, state=state),
        build_for_drafting=lambda i: builders[2].build_for_drafting(qsl, seq, table, i),
        forward=lambda md, out: layer.forward(q, k, v, kc, vc, md, out))


def case():
    return gqa_case(lambda: aar.AttentionImpl(H, D, num_kv_heads=HKV))
