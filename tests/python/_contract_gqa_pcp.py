"""Contract adapter (test_contract.py) of the "gqa_pcp" backend: the GQA adapter's decode step through the PCP
builder (sharded KV, the default) and layer over a one-rank group."""

from types import SimpleNamespace

import torch

import ascend_attn_rt as aar
from _contract_gqa_dcp import BS, D, H, NB, group_of_one, step


def case():
    g = torch.Generator().manual_seed(0)
    comm = group_of_one()
    qsl, seq, table = step()
    kw = dict(max_num_reqs=4, max_num_tokens=16, max_blocks_per_req=2, block_size=BS, num_blocks=NB, pcp_size=1,
              pcp_rank=0)
    builders = [aar.cp.PcpMetadataBuilder(**kw) for _ in range(3)]
    layer = aar.cp.PcpAttentionImpl(H, D, pcp=comm, num_kv_heads=2)
    q = torch.randn(3, H, D, generator=g)
    k, v = torch.randn(3, 2, D, generator=g), torch.randn(3, 2, D, generator=g)
    kc, vc = torch.randn(NB, BS, 2, D, generator=g), torch.randn(NB, BS, 2, D, generator=g)
    return SimpleNamespace(
        query_start_loc=qsl, seq_lens=seq, output_like=q, bucket=3,
        build=lambda: builders[0].build(qsl, seq, table),
        build_for_graph_capture=lambda state: builders[1].build_for_graph_capture(qsl, seq, table, state=state),
        build_for_drafting=lambda i: builders[2].build_for_drafting(qsl, seq, table, i),
        forward=lambda md, out: layer.forward(q, k, v, kc, vc, md, out))
