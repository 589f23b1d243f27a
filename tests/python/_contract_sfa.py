"""Contract adapter (test_contract.py) of the "sfa" backend: a decode step of three requests with context, one token
each, through the SFA builder (a draft lane: the backend declares draft lanes) and an SFA layer with an indexer."""

from types import SimpleNamespace

import torch

import ascend_attn_rt as aar
from _mla_reference import MlaDims, make_weights, rope_tables
from _sfa_reference import IdxDims, make_indexer_weights

BS, NB = 16, 8


def case():
    g = torch.Generator().manual_seed(0)
    d, idx = MlaDims(), IdxDims()
    qsl = torch.tensor([0, 1, 2, 3], dtype=torch.int32)
    seq = torch.tensor([5, 17, 9], dtype=torch.int32)
    table = (torch.arange(12, dtype=torch.int32) % NB).view(3, 4)
    cos, sin = rope_tables(64, d.R)
    kw = dict(max_num_reqs=4, max_num_tokens=16, max_blocks_per_req=4, block_size=BS, num_blocks=NB,
              cos_table=cos.float(), sin_table=sin.float(), num_drafts=1)
    builders = [aar.sfa.MetadataBuilder(**kw) for _ in range(3)]
    iw = make_indexer_weights(d, idx, torch.float32, g)
    layer = aar.sfa.Impl(num_heads=d.H, hidden_size=d.hidden, q_lora_rank=d.Q, kv_lora_rank=d.L,
                         qk_nope_head_dim=d.P, qk_rope_head_dim=d.R, v_head_dim=d.V, index_n_head=idx.n_head,
                         index_head_dim=idx.D, index_topk=idx.K, indexer_wq_b=iw["wq_b"], indexer_wk=iw["wk"],
                         indexer_weights_proj=iw["weights_proj"], indexer_k_norm_weight=iw["k_norm_weight"],
                         indexer_k_norm_bias=iw["k_norm_bias"], **make_weights(d, torch.float32, g))
    kv = [torch.randn(NB, BS, 1, w, generator=g) for w in (d.L, d.R, idx.D)]
    hidden = torch.randn(3, d.hidden, generator=g)
    return SimpleNamespace(
        query_start_loc=qsl, seq_lens=seq, output_like=hidden, bucket=3,
        build=lambda: builders[0].build(qsl, seq, table),
        build_for_graph_capture=lambda state: builders[1].build_for_graph_capture(qsl, seq, table, state=state),
        build_for_drafting=lambda i: builders[2].build_for_drafting(qsl, seq, table, i),
        forward=lambda md, out: layer.forward(hidden, kv, md, out))
