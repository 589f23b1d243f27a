"""SFA PCP decode graph capture (docs/design/sparse_cp.md §11.1) over real gloo process groups.

Each rank captures one decode bucket (the recording provider: nothing runs at capture), then builds a series of
decode-only batches smaller than the bucket (padded with dummy decode requests, graph_decode_padding), updates
and replays it. The collectives run inside the replayed call. Every replay is checked against
  * the eager PCP layer of the same step (unpadded builder, twin caches): output rows, top-k rows, caches;
  * the float64 reference of _sfa_reference and the single-rank SFA backend (real rows);
  * the dummy rows: output 0 whatever their input, selection empty, nothing written;
  * the collectives of the replay: the decode-only road (§11.2), one PCP all-gather of the attention wire (with
    DCP: one query all-gather and one all-to-all on the DCP group).
A step with prefills is refused by name at capture (build_for_graph_capture and a forward inside a capture), as a
padded build, and at update, with no cache written and no collective issued.
"""

import pytest
import torch

import ascend_attn_rt as aar
from _cp_harness import cp_tol as _tol, pcp_dcp_groups as _groups, run_ranks
from _mla_reference import rope_tables
from _sfa_cp_steps import build_args, caches, make_impl, make_step, qsl, reference, single_rank

dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

sfa = aar.sfa

BUCKET = 4  # decode requests of the captured bucket
# Decode-only batches replayed in the bucket (history of at least one token; [2]: a request shorter than the group).
_GRAPH_STEPS = [[2, 17, 40, 33], [3, 18], [41, 34, 5], [2], [12, 29, 7, 40]]
NB, MB = 48, 8  # cache blocks and block-table columns, fixed across the steps (the capture holds the caches)


def _calls(comm):
    return (comm.calls_of("all_gather"), comm.calls_of("all_to_all_single"), comm.calls_of("all_reduce"))


def _builder(st, wp, rp, wd, rd, **kw):
    d, dtype = st["d"], st["dtype"]
    cos, sin = rope_tables(64, d.R)
    if wd > 1:
        kw.update(dcp_world_size=wd, dcp_rank=rd)
    return sfa.MetadataBuilder(max_num_reqs=8, max_num_tokens=64, max_blocks_per_req=MB, block_size=st["bs"],
                               num_blocks=NB, cos_table=cos.to(dtype), sin_table=sin.to(dtype),
                               num_speculative_tokens=st["spec"], pcp_world_size=wp, pcp_rank=rp,
                               cp_kv_cache_interleave_size=st["I"], **kw)


def _table(st):
    t = torch.zeros(st["B"], MB, dtype=torch.int32)
    t[:, :st["table"].shape[1]] = st["table"]
    return t


def _into(dst, src):
    """The step's caches (its blocks) copied into the fixed-size ones; the other blocks zero."""
    for a, b in zip(dst, src):
        a.zero_()
        a[:b.shape[0]] = b


def _graph_case(rank, world, wp, wd, I, dtype_name, spec):
    torch.set_num_threads(1)
    dtype = getattr(torch, dtype_name)
    if wd == 1:
        pcp, dcp = aar.cp.Comm(dist.group.WORLD, timeout_s=20.0), None
    else:
        pg, dg = _groups(rank, wp, wd)
        pcp, dcp = aar.cp.Comm(pg, timeout_s=20.0), aar.cp.Comm(dg, timeout_s=20.0)
    rp, rd = pcp.rank, dcp.rank if dcp is not None else 0
    W, kv_rank = wp * wd, pcp.rank * wd + (dcp.rank if dcp is not None else 0)
    qn = 1 + spec
    NT = BUCKET * qn
    steps = [[s + spec for s in seq] for seq in _GRAPH_STEPS]
    st0 = make_step(W, I=I, dtype=dtype, spec=spec, seq_lens=steps[0], q_lens=[qn] * len(steps[0]))
    d, idx = st0["d"], st0["idx"]
    layer = dict(pcp_comm=pcp, dcp_comm=dcp)
    b_graph = _builder(st0, wp, rp, wd, rd, graph_decode_padding=True)
    b_eager = _builder(st0, wp, rp, wd, rd)
    g_impl, e_impl = make_impl(st0, **layer), make_impl(st0, **layer)
    bs = st0["bs"]
    kv_g = [torch.zeros(NB, bs, 1, d.L, dtype=dtype), torch.zeros(NB, bs, 1, d.R, dtype=dtype),
            torch.zeros(NB * W, bs, 1, idx.D, dtype=dtype)]
    hidden_s, out_s = torch.zeros(NT, d.hidden, dtype=dtype), torch.zeros(NT, d.hidden, dtype=dtype)

    # Capture on a one-request step padded to the bucket.
    md = b_graph.build_for_graph_capture(torch.tensor([0, qn], dtype=torch.int32),
                                         torch.tensor([9], dtype=torch.int32), _table(st0)[:1].contiguous(),
                                         num_input_tokens=NT)
    assert md.num_local_tokens == NT and md.num_kernel_reqs == BUCKET
    assert md.pcp_local_token_index_list == list(range(qn)) + [-1] * (NT - qn)
    g = aar.GraphParams("recording")
    pcp.reset_counters()
    with g.capture(NT):
        g_impl.forward(hidden_s, kv_g, md, out_s)
    assert pcp.calls == 0, "the recording capture runs nothing"
    addrs = g.call_addresses(NT)
    tol, ctol = _tol(dtype), (dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=1e-2, rtol=1e-2))
    gen = torch.Generator().manual_seed(7 + rank)
    for seq in steps:
        B, T = len(seq), len(seq) * qn
        spec_d = dict(I=I, dtype=dtype, spec=spec, seq_lens=seq, q_lens=[qn] * B)
        st = make_step(W, **spec_d)
        assert st["nb"] <= NB and st["table"].shape[1] <= MB
        _into(kv_g, caches(st, kv_rank, upto_context=True))
        kv_e = [t.clone() for t in kv_g]
        hidden = torch.cat([st["xs"][r][seq[r] - qn:] for r in range(B)]).to(dtype)
        args = (qsl(st["q_lens"]), torch.tensor(seq, dtype=torch.int32), _table(st))
        md_g = b_graph.build(*args, num_input_tokens=NT)
        assert md_g.num_local_tokens == NT and md_g.num_kernel_reqs == BUCKET
        assert md_g.pcp_local_token_index_list == list(range(T)) + [-1] * (NT - T)
        hidden_s[:T] = hidden
        hidden_s[T:] = torch.randn(NT - T, d.hidden, generator=gen).to(dtype)  # dummies: any input
        out_s.fill_(float("nan"))
        g.update(NT, md_g)
        pcp.reset_counters()
        if dcp is not None:
            dcp.reset_counters()
        g.replay(NT)
        assert md_g.num_prefills == 0
        assert _calls(pcp) == (1, 0, 0), _calls(pcp)  # decode-only (§11.2): one all-gather of the wire
        if dcp is not None:
            assert _calls(dcp) == (1, 1, 0), _calls(dcp)
        assert g.call_addresses(NT) == addrs
        topk_g = _own_topk(g_impl, md_g, rp)
        # The eager PCP layer of the same step, unpadded, on twin caches.
        md_e = b_eager.build(*args)
        assert md_e.num_local_tokens == T
        out_e = torch.full_like(hidden, 7.0)
        e_impl.forward(hidden, kv_e, md_e, out_e)
        topk_e = _own_topk(e_impl, md_e, rp)
        torch.testing.assert_close(out_s[:T].double(), out_e.double(), **ctol)
        assert not torch.isnan(out_s).any() and float(out_s[T:].abs().sum()) == 0.0, "dummies attend nothing"
        assert torch.equal(topk_g[:T], topk_e) and torch.all(topk_g[T:] == -1)
        for a, b in zip(kv_g, kv_e):
            torch.testing.assert_close(a, b, **ctol)
        want = caches(st, kv_rank, upto_context=False)
        for name, got, w in zip(("latent", "rope", "indexer"), kv_g, want):
            torch.testing.assert_close(got[:w.shape[0]].double(), w.double(), **tol, msg=lambda m: f"{name}: {m}")
            assert float(got[w.shape[0]:].abs().sum()) == 0.0, f"{name}: a dummy wrote a row"
        ref, ref_topk = reference(st)
        one, one_topk = single_rank(spec_d)
        torch.testing.assert_close(out_s[:T].double(), ref, **tol)
        torch.testing.assert_close(out_s[:T].double(), one[:T], **tol)
        if dtype == torch.float32:
            assert torch.equal(topk_g[:T], ref_topk) and torch.equal(topk_g[:T], one_topk)

    # A step with prefills: refused by name at capture and at update, nothing written, no collective.
    st = make_step(W, I=I, dtype=dtype, spec=spec, seq_lens=[12, 20, 37], q_lens=[qn, qn, 7])
    args = (qsl(st["q_lens"]), torch.tensor(st["seq_lens"], dtype=torch.int32), _table(st))
    _into(kv_g, caches(st, kv_rank, upto_context=True))
    before = [t.clone() for t in kv_g]
    last = md_g
    pcp.reset_counters()
    if dcp is not None:
        dcp.reset_counters()
    errors = []

    def expect(exc, fn):
        try:
            fn()
            errors.append(None)
        except exc as e:
            errors.append(str(e))

    expect(NotImplementedError, lambda: b_graph.build_for_graph_capture(*args))
    errors.append(last.is_current)  # the refused build wrote nothing
    expect(ValueError, lambda: b_graph.build(*args, num_input_tokens=int(args[0][-1]) + qn))
    errors.append(last.is_current)
    md_p = b_graph.build(*args)  # eager: the PCP head/tail split
    x = torch.zeros(md_p.num_local_tokens, d.hidden, dtype=dtype)

    def capture():
        g2 = aar.GraphParams("recording")
        with g2.capture(x.shape[0]):
            g_impl.forward(x, kv_g, md_p, torch.zeros_like(x))
    expect(NotImplementedError, capture)
    expect(NotImplementedError, lambda: g.update(NT, md_p))
    # a decode-only step not padded to the bucket
    dec = make_step(W, I=I, dtype=dtype, spec=spec, seq_lens=steps[1], q_lens=[qn] * len(steps[1]))
    md_u = b_graph.build(qsl(dec["q_lens"]), torch.tensor(steps[1], dtype=torch.int32), _table(dec))
    expect(ValueError, lambda: g.update(NT, md_u))
    untouched = all(torch.equal(a, b) for a, b in zip(before, kv_g))
    return errors, untouched, pcp.calls + (dcp.calls if dcp is not None else 0)


def _own_topk(impl, md, rank):
    """The rank's own rows of the layer's top-k: a decode-only step keeps its rows, a step with a prefill every
    rank's gathered rows, rank-major (docs/design/sparse_cp.md §11, §11.2)."""
    n = md.num_local_tokens
    lt = impl.last_topk if md.num_prefills == 0 else impl.last_topk[rank * n:(rank + 1) * n]
    assert lt.shape[0] == n, (lt.shape, n)
    return lt[:, 0].to(torch.int64)


def _check(res, spec):
    for errors, untouched, calls in res:
        assert None not in errors, errors
        assert "SFA PCP captures decode-only buckets only" in errors[0], errors[0]
        assert errors[1] is True and errors[3] is True, errors
        assert "only a decode-only step is padded to a graph bucket" in errors[2], errors[2]
        assert "SFA PCP capture of a step with prefills is not supported" in errors[4], errors[4]
        assert "the update of bucket" in errors[5] and "with prefills is not supported" in errors[5], errors[5]
        assert f"with {BUCKET * (1 + spec)} rows and {BUCKET} kernel requests, the step has" in errors[6], errors[6]
        assert untouched, "a refused capture or update wrote a cache"
        assert calls == 0, "a refused capture or update issued a collective"


@pytest.mark.parametrize("wp,wd,I,dtype,spec", [(2, 1, 1, "float32", 0), (2, 1, 4, "float32", 2),
                                                (2, 1, 1, "bfloat16", 0)])
def test_sfa_pcp_decode_graph_replays_like_eager(wp, wd, I, dtype, spec):
    _check(run_ranks(wp * wd, _graph_case, wp, wd, I, dtype, spec, deadline_s=120.0), spec)


def test_sfa_pcp2_x_dcp2_decode_graph_replays_like_eager():
    _check(run_ranks(4, _graph_case, 2, 2, 2, "float32", 1, deadline_s=120.0), 1)
