"""Contract adapter (test_contract.py) of the "gqa_dcp" backend: the GQA adapter's decode step (three requests with
context, one token each) through the DCP builder and layer over a one-rank group (the contract is the same on every
rank; the multi-rank behaviour is test_gqa_dcp.py's). _contract_gqa_pcp reuses the group."""

from types import SimpleNamespace

import torch

import ascend_attn_rt as aar

H, D, BS, NB = 4, 32, 16, 8


def group_of_one():
    """A cp.Comm over this process alone: torch's default group, made a one-rank gloo group if there is none."""
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    assert dist.get_world_size() == 1, "the contract adapters run in one process"
    return aar.cp.Comm(dist.group.WORLD, timeout_s=30.0)


def step():
    qsl = torch.tensor([0, 1, 2, 3], dtype=torch.int32)
    seq = torch.tensor([5, 17, 9], dtype=torch.int32)
    table = (torch.arange(6, dtype=torch.int32) + 1).view(3, 2)
    return qsl, seq, table


def case():
    g = torch.Generator().manual_seed(0)
    comm = group_of_one()
    qsl, seq, table = step()
    kw = dict(max_num_reqs=4, max_num_tokens=16, max_blocks_per_req=2, block_size=BS, num_blocks=NB, dcp_world=1,
              dcp_rank=0)
    builders = [aar.DcpMetadataBuilder(**kw) for _ in range(3)]
    layer = aar.DcpAttentionImpl(comm, H, D, num_kv_heads=1)
    q = torch.randn(3, H, D, generator=g)
    k, v = torch.randn(3, 1, D, generator=g), torch.randn(3, 1, D, generator=g)
    kc, vc = torch.randn(NB, BS, 1, D, generator=g), torch.randn(NB, BS, 1, D, generator=g)
    return SimpleNamespace(
        query_start_loc=qsl, seq_lens=seq, output_like=q, bucket=3,
        build=lambda: builders[0].build(qsl, seq, table),
        build_for_graph_capture=lambda state: builders[1].build_for_graph_capture(qsl, seq, table, state=state),
        build_for_drafting=lambda i: builders[2].build_for_drafting(qsl, seq, table, i),
        forward=lambda md, out: layer.forward(q, k, v, kc, vc, md, out))
