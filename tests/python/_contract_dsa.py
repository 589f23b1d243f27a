"""Contract adapter (test_contract.py) of the "dsa" backend: a small C4 layer (it reads every kind of KV-cache group)
and a decode step of three requests with context, one token each. The StepBuilder is the contract's builder; forward
builds the step's groups (GroupBuilder.build for the step it is given) and routes them (aar.dsa.route_layer)."""

from types import SimpleNamespace

import torch

import ascend_attn_rt as aar
import _dsa_reference as ref
from _dsa_harness import allocate_caches, cache_kinds

D = ref.DsaDims(hidden=64, N=2, D=32, R=16, q_lora=32, W=8, ratio=4, n_idx=2, Di=16, K=8, G=2, o_lora=8)
MAX_BLOCKS = 24  # C4 state pages hold 2 rows at cache block size 32


class _Builders:
    """A StepBuilder with one draft lane and the C4 layer's groups; request b owns blocks 1 + b * MAX_BLOCKS ..."""

    def __init__(self, cos, sin, num_blocks):
        self.sb = aar.dsa.StepBuilder(max_num_reqs=4, max_num_tokens=16, cos_table=cos, sin_table=sin,
                                      compress_cos_table=cos, compress_sin_table=sin, num_drafts=1, head_dim=D.D,
                                      window=D.W, num_heads_q=D.N, index_topk=D.K, index_n_heads=D.n_idx,
                                      index_head_dim=D.Di)
        self.gb = {kd: aar.dsa.GroupBuilder(self.sb, kind=kd, cache_block_size=32, max_blocks_per_req=MAX_BLOCKS,
                                            num_blocks=num_blocks, device_kind="a2")
                   for kd in cache_kinds(D.ratio)}
        self.table = torch.arange(1, 1 + 3 * MAX_BLOCKS, dtype=torch.int32).view(3, MAX_BLOCKS)

    def route(self, st):
        groups = {kd: gb.build(st, self.table) for kd, gb in self.gb.items()}
        for g in groups.values():
            assert (g.num_reqs, g.num_kernel_reqs, g.num_reqs_actual) == (st.num_reqs, st.num_kernel_reqs, st.num_reqs)
        return aar.dsa.route_layer(D.ratio, st, groups)


def case():
    g = torch.Generator().manual_seed(0)
    qsl = torch.tensor([0, 1, 2, 3], dtype=torch.int32)
    seq = torch.tensor([9, 41, 20], dtype=torch.int32)
    cos, sin = ref.rope_tables(512, D.R)
    num_blocks = 3 * MAX_BLOCKS + 1
    main, capture, draft = (_Builders(cos, sin, num_blocks) for _ in range(3))
    c = allocate_caches(main.gb, torch.float32)
    kv = aar.dsa.compose_kv_cache(compress_kv=c["compress_kv"], swa_kv=c["swa"], state=c["state"],
                                  indexer_state=c["indexer_state"], indexer_k=c["indexer_k"],
                                  indexer_scale=c["indexer_scale"], device_kind="a2")
    w = ref.make_dsa_weights(D, torch.float32, g)
    layer = aar.dsa.Impl(w, hidden_size=D.hidden, num_heads=D.N, head_dim=D.D, rope_dim=D.R, q_lora_rank=D.q_lora,
                         compress_ratio=D.ratio, index_n_heads=D.n_idx, index_head_dim=D.Di, index_topk=D.K,
                         eps=D.eps, o_groups=D.G, o_lora_rank=D.o_lora, device_kind="a2")
    hidden = torch.randn(3, D.hidden, generator=g)
    made = {}  # id(step metadata) -> (metadata, its builders): forward routes with the builders that made it

    def keep(builders, st):
        made[id(st)] = (st, builders)
        return st

    def forward(md, out):
        if md is None:
            return layer.forward(hidden, kv, None, out)
        return layer.forward(hidden, kv, made[id(md)][1].route(md), out)

    def build_for_drafting(i):
        st = draft.sb.build_for_drafting(qsl, seq, i)
        if i == 0:  # the SWA group drafts for it; the main lane's metadata stays current
            m = draft.sb.build(qsl, seq)
            swa = draft.gb["swa"].build(m, draft.table)
            d = draft.gb["swa"].build_for_drafting(st, draft.table, i)
            assert d.draft_index == i and d.num_reqs == st.num_reqs and swa.is_current and m.is_current
        return st

    return SimpleNamespace(
        query_start_loc=qsl, seq_lens=seq, output_like=hidden, bucket=3,
        build=lambda: keep(main, main.sb.build(qsl, seq)),
        build_for_graph_capture=lambda state: keep(capture, capture.sb.build_for_graph_capture(qsl, seq, state=state)),
        build_for_drafting=build_for_drafting,
        forward=forward)
