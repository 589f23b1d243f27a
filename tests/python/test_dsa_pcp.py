"""DSA (DeepSeek-V4) PCP (docs/design/sparse_cp.md §13) over real gloo process groups of 2 local processes.

Every rank builds the GLOBAL step (the same on both) with pcp_world_size=2 and its pcp_rank; its layer input and
output are its local rows (metadata.local_token_index: the decodes, then its head and tail chunk of every prefill,
-1 for a pad). Next to its PCP layer each rank runs the single-rank DSA layer (test_dsa_cp.Run without any CP) on
its own caches, the same weights and the same steps, from empty caches, and checks per step:
  * its real rows against the single-rank layer's rows of the same tokens, and on rank 0 against the float64
    reference of _dsa_reference (with the single-rank selection, as test_dsa_dcp does); pad rows are 0;
  * the C4 top-k rows of its real rows equal to the single-rank selection of the same tokens;
  * every cache (SWA, compressed KV, compressor states, indexer K and scales) equal to the single-rank caches:
    every rank writes every token's rows (the hidden rows all-gathered and restored to the step's order);
  * the collectives: one all-gather per layer step with prefills, none in a decode-only step (replicated rows).
Sequences: fresh prefills with token counts not divisible by 2 and a 2-token request (fewer tokens than the
2 Wp chunks: every rank holds a pad chunk of it), a mixed step (decodes and a chunked prefill), a chunked
prefill without decodes, a decode step; ratios 1, 4 and 128 (fp32), ratio 4 in bf16; speculative decodes (ratio 4,
decode_threshold 3); an IndexCache pair.
Refusals by name, the layer's with caches untouched and no collective issued. The W8A8-dynamic prolog and multistream
under PCP: test_dsa_cp_w8a8_streams.py.
Decode graph capture and drafts (§13.4, test_dsa_pcp_two_ranks_decode_graph_and_drafts): a decode step is replicated
on every rank, so a PCP decode bucket is captured as without PCP and replayed with no collective; draft steps of
decodes run eagerly the same way.
"""

import pytest
import torch

import ascend_attn_rt as aar
from _cp_harness import run_ranks
from _dsa_harness import group_kw
import _dsa_reference as ref
from test_dsa import tol as ref_tol
from test_dsa_cp import Run, dims
from test_dsa_dcp import _draft_step, _reference

dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

WORLD = 2

# ratio: (requests, new tokens) per step, from empty caches. k = 0 (decode_threshold 1): a 2-token request is a
# prefill; request 1 (2 tokens) is shorter than the 2 Wp = 4 chunks of the split.
SEQ = {
    1: [([0, 1, 2], [13, 2, 5]), ([0, 1, 2], [1, 1, 9]), ([1, 2], [7, 4]), ([0, 1, 2], [1, 1, 1])],
    4: [([0, 1, 2], [23, 2, 5]), ([0, 1, 2], [1, 1, 14]), ([1, 2], [9, 3]), ([0, 1, 2], [1, 1, 1])],
    # request 0's prefill completes compressed row 0 (131 tokens: 1 pad in rank 0's tail chunk), request 1's
    # chunked prefill its row 0 (positions 9..130), the decode after it reads both
    128: [([0, 1], [131, 9]), ([0, 1], [1, 122]), ([0, 1], [1, 1])],
}


def _local(hid, idx):
    """This rank's local rows of the global hidden states: pads (-1) zeros."""
    out = hid[idx.clamp(min=0).long()].clone()
    out[idx < 0] = 0
    return out


def _wire(t):
    return None if t is None else t.to(torch.float64).tolist()


def _caches_equal(a, b, dtype):
    for x, y in zip(a.caches(), b.caches()):
        if dtype == torch.float32 or not x.is_floating_point():
            if not torch.equal(x, y):
                return False
        elif not torch.allclose(x.float(), y.float(), atol=1e-2, rtol=1e-2):
            return False
    return True


# k = 2 (decode_threshold 3): prefills, then speculative decodes of 3 and 2 tokens (replicated on every rank, one
# segment each, bottom-right causal) beside a one-token decode.
SPEC = [([0, 1, 2], [9, 5, 4]), ([0, 1, 2], [3, 2, 1]), ([0, 1, 2], [3, 3, 3])]


def _pcp_case(rank, comm, ratio, dtype, k=0):
    d = dims(ratio)
    seq = SPEC if k else SEQ[ratio]
    nreq = max(max(r[0]) for r in seq) + 1
    mb = 40 if ratio == 128 else 24
    one = Run(d, dtype, nreq, k=k, max_blocks=mb)
    pcp = Run(d, dtype, nreq, k=k, max_blocks=mb, sb_extra=dict(pcp_world_size=WORLD, pcp_rank=rank),
              impl_extra=dict(pcp_comm=comm))
    at, rt = ref_tol(dtype)
    report = []
    for reqs, qlens in seq:
        where = f"rank {rank} ratio {ratio} {dtype} step {reqs} {qlens}"
        st, md, S, qsl = pcp.build(reqs, qlens)
        assert (st.pcp_world_size, st.pcp_rank) == (WORLD, rank), where
        idx = st.local_token_index.clone()
        assert idx.tolist() == st.local_token_index_list and idx.numel() == st.num_local_tokens, where
        hid = _local(pcp.hidden(reqs, qlens, S, 0), idx)
        out = torch.full_like(hid, float("nan"))
        comm.reset_counters()
        pcp.impl.forward(hid, pcp.kv, st, md["swa"], out, **group_kw(ratio, md, st))
        calls = tuple(comm.calls_of(op) for op in ("all_gather", "all_to_all_single", "all_reduce"))
        # one all-gather of the hidden rows per layer step with prefills, none in a decode-only step
        assert calls == ((1 if st.num_prefills else 0), 0, 0), (where, calls)
        for i, b in enumerate(reqs):
            pcp.S[b] = S[i]
        _, want, _, _ = one.step(reqs, qlens)
        real = idx >= 0
        assert torch.equal(out[~real], torch.zeros_like(out[~real])), f"{where}: pad rows"
        got = out[real].to(torch.float64)
        exp = want[idx[real].long()].to(torch.float64)
        scale = max(1.0, exp.abs().max().item())
        torch.testing.assert_close(got, exp, atol=at * scale, rtol=rt,
                                   msg=lambda m: f"{where}: vs the single-rank layer: {m}")
        if ratio == 4 and dtype == torch.float32:
            assert torch.equal(pcp.impl.last_topk[real], one.impl.last_topk[idx[real].long()]), f"{where}: top-k"
        assert _caches_equal(pcp, one, dtype), f"{where}: a cache differs from the single-rank one"
        if rank == 0 and dtype == torch.float32:
            tk = one.impl.last_topk if ratio == 4 else None
            refs = torch.cat([ref.dsa_layer(d, one.w, one.x[b][: S[i]], qlens[i], one.cos, one.sin,
                                            topk=None if tk is None else tk[qsl[i]: qsl[i + 1], 0].to(torch.int64))
                              for i, b in enumerate(reqs)])
            r = refs[idx[real].long()]
            torch.testing.assert_close(got, r, atol=at * max(1.0, r.abs().max().item()), rtol=rt,
                                       msg=lambda m: f"{where}: vs the float64 reference: {m}")
        kind = "mixed" if st.num_prefills and st.num_decodes else "prefill" if st.num_prefills else "decode"
        report.append((where, kind, int(real.sum()), int((~real).sum()), str(st.attn_state).rsplit(".", 1)[-1]))
    return report


def _index_cache(rank, comm):
    """IndexCache under PCP: a use_index_cache C4 layer stores its local rows' selection in the TopkBuffer, a
    skip_topk layer attends over it; both equal the single-rank pair's rows of the same tokens."""
    d = dims(4)
    one = Run(d, torch.float32, 3, k=0)
    pcp = Run(d, torch.float32, 3, k=0, sb_extra=dict(pcp_world_size=WORLD, pcp_rank=rank),
              impl_extra=dict(pcp_comm=comm))
    for r in (one, pcp):
        r.topk = aar.sfa.TopkBuffer(64, d.K)
        r.store, r.skip = r.make_impl(use_index_cache=True), r.make_impl(skip_topk=True)
    reqs, qlens = [0, 1, 2], [11, 2, 6]
    a1, b1, sel1 = one.index_cache_pair(reqs, qlens)[:3]
    st, md, S, qsl = pcp.build(reqs, qlens)
    idx = st.local_token_index.clone()
    hid = _local(pcp.hidden(reqs, qlens, S, 0), idx)
    a, b = torch.full_like(hid, float("nan")), torch.full_like(hid, float("nan"))
    kw = group_kw(4, md, st)
    snap = [t.clone() for t in pcp.caches()]
    pcp.store.forward(hid, pcp.kv, st, md["swa"], a, topk_buffer=pcp.topk, **kw)
    sel = pcp.store.last_topk.clone()
    for t, v in zip(pcp.caches(), snap):
        t.copy_(v)
    pcp.skip.forward(hid, pcp.kv, st, md["swa"], b, topk_buffer=pcp.topk, **kw)
    real = idx >= 0
    g = idx[real].long()
    assert torch.equal(sel[real], sel1[g]) and torch.equal(pcp.topk.buffer[: sel.shape[0]], sel[:, 0])
    torch.testing.assert_close(a[real], a1[g], atol=2e-5, rtol=2e-5)
    torch.testing.assert_close(b[real], b1[g], atol=2e-5, rtol=2e-5)
    assert torch.equal(b[~real], torch.zeros_like(b[~real]))
    return True


def _refusals(rank, comm):
    d = dims(4)
    msgs = {}

    def catch(key, fn):
        try:
            fn()
        except (ValueError, NotImplementedError) as e:
            msgs[key] = (type(e).__name__, str(e))

    comm.reset_counters()
    pcp = Run(d, torch.float32, 1, k=0, sb_extra=dict(pcp_world_size=WORLD, pcp_rank=rank),
              impl_extra=dict(pcp_comm=comm))
    plain = Run(d, torch.float32, 1, k=0)
    snap = [t.clone() for t in pcp.caches()]
    # the PCP layer given plain metadata, a plain layer given PCP metadata, the PCP layer given the global rows
    st, md, S, qsl = plain.build([0], [5])
    hid = plain.hidden([0], [5], S, 0)
    catch("comm_vs_plain", lambda: pcp.impl.forward(hid, pcp.kv, st, md["swa"], torch.zeros_like(hid),
                                                    **group_kw(4, md, st)))
    st2, md2, S2, _ = pcp.build([0], [5])
    hid2 = pcp.hidden([0], [5], S2, 0)
    catch("plain_vs_pcp", lambda: plain.impl.forward(hid2, plain.kv, st2, md2["swa"], torch.zeros_like(hid2),
                                                     **group_kw(4, md2, st2)))
    catch("rows", lambda: pcp.impl.forward(hid2, pcp.kv, st2, md2["swa"], torch.zeros_like(hid2),
                                           **group_kw(4, md2, st2)))
    base = dict(hidden_size=d.hidden, num_heads=d.N, head_dim=d.D, rope_dim=d.R, q_lora_rank=d.q_lora,
                compress_ratio=4, index_n_heads=d.n_idx, index_head_dim=d.Di, index_topk=d.K, eps=d.eps,
                o_groups=d.G, o_lora_rank=d.o_lora)
    catch("dsa_cp", lambda: aar.dsa.Impl(pcp.w, pcp_comm=comm, dsa_cp_comm=comm, **base))
    catch("dcp", lambda: aar.dsa.Impl(pcp.w, pcp_comm=comm, dcp_comm=comm, **base))
    catch("a5", lambda: aar.dsa.Impl(pcp.w, pcp_comm=comm, device_kind="a5", **base))
    calls = sum(comm.calls_of(op) for op in ("all_gather", "all_to_all_single", "all_reduce"))
    untouched = all(torch.equal(a, b) for a, b in zip(pcp.caches(), snap))
    return msgs, calls, untouched


def _case(rank, world, cases):
    comm = aar.cp.Comm(dist.group.WORLD, timeout_s=60.0)
    reports = [_pcp_case(rank, comm, *c) for c in cases]
    return reports, _index_cache(rank, comm), _refusals(rank, comm)


def test_dsa_pcp_two_ranks():
    cases = [(1, torch.float32), (4, torch.float32), (128, torch.float32), (4, torch.bfloat16), (4, torch.float32, 2)]
    results = run_ranks(WORLD, _case, cases, deadline_s=120.0)
    for c in range(len(cases)):
        assert any(s[3] > 0 for res in results for s in res[0][c]), ("a step with pad rows", cases[c])
    for rank, (reports, index_cache, refusals) in enumerate(results):
        assert index_cache
        for rep in reports[:-1]:
            kinds = [s[1] for s in rep]
            assert kinds[0] == "prefill" and kinds[1] == "mixed" and kinds[-1] == "decode", kinds
        # multi-token decodes: every request a decode (replicated rows, no pad)
        assert [(s[1], s[3]) for s in reports[-1][1:]] == [("decode", 0), ("decode", 0)], reports[-1]
        msgs, calls, untouched = refusals
        assert calls == 0 and untouched, (rank, calls, untouched)
        want = {
            "comm_vs_plain": ("ValueError", "pcp_world_size=1"),
            "plain_vs_pcp": ("ValueError", "the layer has no pcp_comm"),
            "rows": ("ValueError", "this rank's local rows, num_local_tokens="),
            "dsa_cp": ("NotImplementedError", "DSA-CP x PCP"),
            "dcp": ("NotImplementedError", "DSA PCP x DCP"),
            "a5": ("NotImplementedError", "A2/A3 npu_sparse_attn_sharedkv plan only"),
        }
        for key, (kind, text) in want.items():
            assert key in msgs, (rank, key, msgs)
            assert msgs[key][0] == kind and text in msgs[key][1], (rank, key, msgs[key])


def _sb(**kw):
    d = dims(4)
    cos = torch.zeros(64, d.R)
    base = dict(max_num_reqs=4, max_num_tokens=64, cos_table=cos, sin_table=cos, compress_cos_table=cos,
                compress_sin_table=cos, num_speculative_tokens=1, head_dim=d.D, window=d.W)
    base.update(kw)
    return aar.dsa.StepBuilder(**base)


def test_dsa_pcp_builder():
    with pytest.raises(NotImplementedError, match="DSA-CP x PCP"):
        _sb(pcp_world_size=2, dsa_cp_world_size=2)
    with pytest.raises(NotImplementedError, match="DSA PCP x DCP"):
        _sb(pcp_world_size=2, dcp_world_size=2)
    with pytest.raises(NotImplementedError, match="DSpark under DSA PCP"):
        _sb(pcp_world_size=2, dspark_num_spec=1)
    with pytest.raises(ValueError, match="pcp_rank=2"):
        _sb(pcp_world_size=2, pcp_rank=2)
    sb = _sb(pcp_world_size=2, pcp_rank=1)
    qsl, S = torch.tensor([0, 1], dtype=torch.int32), torch.tensor([5], dtype=torch.int32)
    # a step with prefills: no graph padding, no capture build, not a draft step (decode_threshold 2)
    pq, pS = torch.tensor([0, 3], dtype=torch.int32), torch.tensor([5], dtype=torch.int32)
    with pytest.raises(ValueError, match="a PCP step with prefills is the global batch without graph padding"):
        sb.build(pq, pS, num_input_tokens=4)
    with pytest.raises(ValueError, match="build_for_graph_capture: the batch has 1 prefill"):
        sb.build_for_graph_capture(pq, pS, state=aar.AttentionState.SpecDecoding)
    with pytest.raises(NotImplementedError, match="build_for_drafting with pcp_world_size=2: the draft step has 1 "):
        sb.build_for_drafting(pq, pS, draft_index=0)
    # a decode bucket (§13.4): replicated, graph padding allowed; the rank's rows are the step's input rows
    cq, cS = torch.tensor([0, 1, 2, 3], dtype=torch.int32), torch.tensor([5, 3, 1], dtype=torch.int32)
    st = sb.build_for_graph_capture(cq, cS, state=aar.AttentionState.DecodeOnly, num_reqs_actual=2,
                                    num_input_tokens=5)
    assert (st.pcp_world_size, st.pcp_rank, st.num_local_tokens, st.num_input_tokens) == (2, 1, 5, 5)
    assert st.local_token_index_list == [0, 1, 2, -1, -1]
    gb0 = aar.dsa.GroupBuilder(sb, kind="swa", cache_block_size=32, max_blocks_per_req=4, num_blocks=8,
                               device_kind="a2", cache_dtype=None, model_dtype="bfloat16")
    md0 = gb0.build(st, torch.tensor([[1, 2, 3, 4], [5, 6, 7, 0], [0, 0, 0, 0]], dtype=torch.int32))
    assert md0.pcp_block_table is None  # the global table is read
    # a draft step of decodes: replicated too
    dst = sb.build_for_drafting(torch.tensor([0, 2, 3], dtype=torch.int32), torch.tensor([6, 4], dtype=torch.int32),
                                draft_index=0)
    assert (dst.pcp_world_size, dst.pcp_rank, dst.num_local_tokens, dst.local_token_index_list) == (2, 1, 3, [0, 1, 2])
    with pytest.raises(NotImplementedError, match="A2/A3 npu_sparse_attn_sharedkv plan only"):
        aar.dsa.GroupBuilder(sb, kind="swa", cache_block_size=32, max_blocks_per_req=4, num_blocks=8,
                             device_kind="a5", cache_dtype=None, model_dtype="bfloat16")
    # a decode (replicated on both ranks) and a 7-token prefill (c = 2): rank 1 holds chunks 1 and 2, p 2..5
    st = sb.build(torch.tensor([0, 1, 8], dtype=torch.int32), torch.tensor([5, 7], dtype=torch.int32))
    assert (st.pcp_world_size, st.pcp_rank, st.num_local_tokens) == (2, 1, 5)
    assert st.local_token_index_list == [0, 3, 4, 5, 6]
    # segments: the decode (1 row, KV 5), chunk 1 (2 rows, KV 4), chunk 2 (2 rows, KV 6)
    assert st.pcp_query_start_loc_list == [0, 1, 3, 5] and st.pcp_seq_lens_list == [5, 4, 6]
    assert st.pcp_req_list == [0, 1, 1]
    gb = aar.dsa.GroupBuilder(sb, kind="swa", cache_block_size=32, max_blocks_per_req=4, num_blocks=8,
                              device_kind="a2", cache_dtype=None, model_dtype="bfloat16")
    md = gb.build(st, torch.tensor([[1, 2, 3, 4], [5, 6, 7, 0]], dtype=torch.int32))
    assert md.pcp_block_table.tolist() == [[1, 2, 3, 4], [5, 6, 7, 0], [5, 6, 7, 0]]
    # the global step's slots: every token written on every rank
    assert md.slot_mapping.shape[0] == 8


def _pcp_eager(pcp, reqs, qlens, comm):
    """One eager PCP step (the rank's local rows in, out); the number of collectives it issued."""
    st, md, S, _ = pcp.build(reqs, qlens)
    idx = st.local_token_index.clone()
    hid = _local(pcp.hidden(reqs, qlens, S, 0), idx)
    out = torch.full_like(hid, float("nan"))
    comm.reset_counters()
    pcp.impl.forward(hid, pcp.kv, st, md["swa"], out, **group_kw(pcp.d.ratio, md, st))
    for i, b in enumerate(reqs):
        pcp.S[b] = S[i]
    return comm.calls


def _case_graph(rank, world):
    """docs/design/sparse_cp.md §13.4: a decode step under PCP is replicated (every rank's rows are the step's, the
    single-rank road over complete caches, no collective). A C4 SpecDecoding bucket (3 requests x 2 tokens) is
    captured on each rank (the recording provider: nothing runs, no collective) and replayed with 3, 2, 1 and 3
    real requests (graph padding): per replay the output equals the PCP layer run eagerly on the same step (caches
    restored in between) and the single-rank layer on the same padded step, rank 0 also the float64 reference; the
    caches equal the single-rank caches; no collective inside a replay. A step with prefills is refused at capture
    (caches untouched, no collective) and at graph update. Ratio 1: draft steps of decodes on the draft lanes equal
    the single-rank draft steps, no collective; a draft step with a prefill is refused by name."""
    comm = aar.cp.Comm(dist.group.WORLD, timeout_s=60.0)
    ratio, k, B = 4, 1, 3
    q = 1 + k
    d = dims(ratio)
    one = Run(d, torch.float32, 3, k=k)
    pcp = Run(d, torch.float32, 3, k=k, sb_extra=dict(pcp_world_size=world, pcp_rank=rank),
              impl_extra=dict(pcp_comm=comm))
    first = [20, 9, 30]
    one.step([0, 1, 2], first)
    assert _pcp_eager(pcp, [0, 1, 2], first, comm) == 1  # the prefill's hidden-row gather
    assert _caches_equal(pcp, one, torch.float32)
    n = B * q
    hidden, out = torch.zeros(n, d.hidden), torch.zeros(n, d.hidden)
    g = aar.GraphParams("recording")
    st, md, _, _ = pcp.build_padded([0, 1, 2], B, q, capture=True)
    assert (st.pcp_world_size, st.num_local_tokens) == (world, n)
    snap = [t.clone() for t in pcp.caches()]
    comm.reset_counters()
    with g.capture(n):
        pcp.impl.forward(hidden, pcp.kv, st, md["swa"], out, **group_kw(ratio, md, st))
    assert comm.calls == 0 and all(torch.equal(a, b) for a, b in zip(snap, pcp.caches()))
    at, rt = ref_tol(torch.float32)
    report = []
    for reqs in ([0, 1, 2], [2, 0], [1], [1, 2, 0]):
        where = f"rank {rank} replay {reqs}"
        st, md, S, qsl = pcp.build_padded(reqs, B, q)
        m = len(reqs) * q
        hidden.zero_()
        hidden[:m] = torch.cat([pcp.x[b][S[i] - q: S[i]] for i, b in enumerate(reqs)])
        # the PCP layer eagerly on the same step (no collective), then the caches restored for the replay
        before = [t.clone() for t in pcp.caches()]
        eager = torch.full_like(out, float("nan"))
        comm.reset_counters()
        pcp.impl.forward(hidden, pcp.kv, st, md["swa"], eager, **group_kw(ratio, md, st))
        assert comm.calls == 0, (where, "eager")
        eager_topk = pcp.impl.last_topk[:m].clone()
        after = [t.clone() for t in pcp.caches()]
        for t, v in zip(pcp.caches(), before):
            t.copy_(v)
        out.fill_(float("nan"))
        aar.dsa.graph_update(g, n, st, md["swa"])
        comm.reset_counters()
        g.replay(n)
        assert comm.calls == 0, (where, "replay", comm.calls)
        torch.testing.assert_close(out[:m], eager[:m], atol=1e-6, rtol=1e-6, msg=lambda e: f"{where}: vs eager: {e}")
        assert torch.equal(pcp.impl.last_topk[:m], eager_topk), f"{where}: top-k vs eager"
        assert all(torch.equal(a, b) for a, b in zip(pcp.caches(), after)), f"{where}: replay vs eager caches"
        for i, b in enumerate(reqs):
            pcp.S[b] = S[i]
        # the single-rank layer on the same padded step
        st1, md1, _, _ = one.build_padded(reqs, B, q)
        want = torch.full_like(out, float("nan"))
        one.impl.forward(hidden, one.kv, st1, md1["swa"], want, **group_kw(ratio, md1, st1))
        for i, b in enumerate(reqs):
            one.S[b] = S[i]
        torch.testing.assert_close(out[:m], want[:m], atol=1e-6, rtol=1e-6,
                                   msg=lambda e: f"{where}: vs the single-rank layer: {e}")
        assert torch.equal(pcp.impl.last_topk[:m], one.impl.last_topk[:m]), f"{where}: top-k vs single-rank"
        assert _caches_equal(pcp, one, torch.float32), f"{where}: a cache differs from the single-rank one"
        if rank == 0:
            refs = _reference(one, d, reqs, [q] * len(reqs), S, qsl)
            torch.testing.assert_close(out[:m].to(torch.float64), refs, atol=at * max(1.0, refs.abs().max().item()),
                                       rtol=rt, msg=lambda e: f"{where}: vs the float64 reference: {e}")
        report.append((where, m))
    # A step with prefills: refused at capture (before anything is recorded or written, no collective) ...
    msgs = {}
    snap = [t.clone() for t in pcp.caches()]
    st, md, S, _ = pcp.build([0, 1, 2], [1, 2, 3])  # request 2 (3 tokens > decode_threshold 2) is a prefill
    hid = _local(pcp.hidden([0, 1, 2], [1, 2, 3], S, 0), st.local_token_index.clone())
    g2 = aar.GraphParams("recording")
    comm.reset_counters()
    with g2.capture(hid.shape[0]):
        try:
            pcp.impl.forward(hid, pcp.kv, st, md["swa"], torch.zeros_like(hid), **group_kw(ratio, md, st))
        except NotImplementedError as e:
            msgs["capture"] = str(e)
    # ... and at the update of the captured bucket (3 requests, 6 tokens: it fits the bucket's sizes)
    try:
        aar.dsa.graph_update(g, n, st, md["swa"])
    except NotImplementedError as e:
        msgs["update"] = str(e)
    assert comm.calls == 0 and all(torch.equal(a, b) for a, b in zip(snap, pcp.caches()))
    # Ratio 1 (SWA-only layers draft): draft steps of decodes, replicated; a draft step with a prefill refused.
    d1 = dims(1)
    one1, pcp1 = Run(d1, torch.float32, 3, k=2), Run(d1, torch.float32, 3, k=2, sb_extra=dict(
        pcp_world_size=world, pcp_rank=rank), impl_extra=dict(pcp_comm=comm))
    one1.step([0, 1, 2], [11, 4, 7])
    assert _pcp_eager(pcp1, [0, 1, 2], [11, 4, 7], comm) == 1
    for draft, reqs, qlens in ((0, [0, 1, 2], [3, 3, 3]), (1, [2, 0], [2, 1])):
        where = f"rank {rank} draft {draft} {reqs} {qlens}"
        comm.reset_counters()
        dst, got, dqsl, dS = _draft_step(pcp1, reqs, qlens, draft)
        assert comm.calls == 0, where
        assert (dst.pcp_world_size, dst.pcp_rank, dst.num_local_tokens) == (world, rank, dqsl[-1]), where
        _, want, _, _ = _draft_step(one1, reqs, qlens, draft)
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6, msg=lambda e: f"{where}: {e}")
        assert _caches_equal(pcp1, one1, torch.float32), f"{where}: caches"
        if rank == 0:
            refs = _reference(one1, d1, reqs, qlens, dS, dqsl)
            torch.testing.assert_close(got.to(torch.float64), refs, atol=at * max(1.0, refs.abs().max().item()),
                                       rtol=rt, msg=lambda e: f"{where}: vs the float64 reference: {e}")
        report.append((where, dqsl[-1]))
    try:
        _draft_step(pcp1, [0], [4], 0)
    except NotImplementedError as e:
        msgs["draft"] = str(e)
    return report, msgs


def test_dsa_pcp_two_ranks_decode_graph_and_drafts():
    results = run_ranks(WORLD, _case_graph, deadline_s=90.0)
    for rank, (report, msgs) in enumerate(results):
        assert [m for _, m in report] == [6, 4, 2, 6, 9, 3], (rank, report)
        want = {"capture": "DSA graph capture under PCP (pcp_world_size=2) of a step with 1 prefill",
                "update": "captured for a decode-only step; the step has 1 prefill request(s) (under PCP",
                "draft": "build_for_drafting with pcp_world_size=2: the draft step has 1 request(s)"}
        for key, text in want.items():
            assert text in msgs.get(key, ""), (rank, key, msgs)
