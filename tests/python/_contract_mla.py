"""Contract adapter (test_contract.py) of the "mla" backend: a decode step of three requests with context, one token
each, through the MLA builder and an MLA layer (aar.mla.LatentAttention takes the same metadata: no backend of its
own)."""

from types import SimpleNamespace

import torch

import ascend_attn_rt as aar
from _mla_reference import MlaDims, make_weights, rope_tables

BS, NB = 16, 9


def case():
    g = torch.Generator().manual_seed(0)
    d = MlaDims(Q=None)
    qsl = torch.tensor([0, 1, 2, 3], dtype=torch.int32)
    seq = torch.tensor([5, 17, 9], dtype=torch.int32)
    table = (torch.arange(12, dtype=torch.int32) % NB).view(3, 4)
    cos, sin = rope_tables(64, d.R)
    kw = dict(max_num_reqs=4, max_num_tokens=16, max_blocks_per_req=4, block_size=BS, num_blocks=NB,
              cos_table=cos.float(), sin_table=sin.float())
    builders = [aar.mla.MetadataBuilder(**kw) for _ in range(3)]
    layer = aar.mla.Impl(num_heads=d.H, hidden_size=d.hidden, q_lora_rank=d.Q, kv_lora_rank=d.L,
                         qk_nope_head_dim=d.P, qk_rope_head_dim=d.R, v_head_dim=d.V,
                         **make_weights(d, torch.float32, g))
    nope, rope = (torch.randn(*s, generator=g) for s in aar.mla.Backend.kv_cache_shapes(NB, BS, d.L, d.R))
    hidden = torch.randn(3, d.hidden, generator=g)
    return SimpleNamespace(
        query_start_loc=qsl, seq_lens=seq, output_like=hidden, bucket=3,
        build=lambda: builders[0].build(qsl, seq, table),
        build_for_graph_capture=lambda state: builders[1].build_for_graph_capture(qsl, seq, table, state=state),
        build_for_drafting=lambda i: builders[2].build_for_drafting(qsl, seq, table, i),
        forward=lambda md, out: layer.forward(hidden, nope, rope, md, out))
