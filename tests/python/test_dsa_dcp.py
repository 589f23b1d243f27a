"""DSA (DeepSeek-V4) DCP (docs/design/sparse_cp.md §12) over real gloo process groups of 2 and 4 local processes.

Each rank is a TP rank of a group that is also its DCP group: it holds its heads [r N/W, (r+1) N/W) (wq_b's rows,
the sinks) and its row-parallel o_proj shard (wo_a's groups, wo_b's columns), so the layer's output is a partial sum
that the parent process sums over the ranks (what the model's TP reduction does; the ranks issue no collective of
their own besides the layer's). Two kinds of runs, against the single-rank layer (test_dsa_cp.Run without any CP):
  * decode on filled caches: the caches filled by the single-rank prefill, the replicated ones (compressor states,
    indexer) copied whole, the sharded ones (SWA, compressed KV) holding exactly the single-rank rows the rank owns,
    placed at their local slots of the rank's local block table; then decode and speculative-decode steps;
  * whole sequences (SEQ) from empty caches, the shards written by the DCP layer alone: fresh prefills, chunked
    prefills, mixed steps, decodes and speculative decodes (docs/design/sparse_cp.md §12.4).
Per step:
  * the summed output against the single-rank layer and against the float64 reference of _dsa_reference (rank 0
    computes it with the single-rank selection, as test_dsa.check_step does);
  * the C4 top-k rows equal to the single-rank selection (the indexer runs on the replicated cache);
  * every cache: the replicated ones equal to the single-rank caches, the sharded ones equal to the single-rank
    caches' owned rows at the local slots (and nothing else written);
  * the collectives: one all-gather (the query heads) and one all-to-all (the partials) per layer step.
Ratios 1, 4 and 128, interleave 1 and 2, fp32 and bf16, 2 ranks and one 4-rank case. Refusals by name (builder and
layer) before any write and any collective.
"""

import pytest
import torch

import ascend_attn_rt as aar
from _cp_harness import run_ranks
from _dsa_harness import group_kw
import _dsa_reference as ref
from test_dsa import tol as ref_tol
from test_dsa_cp import Run, dims, shard

dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

SHARDED = {"swa": "swa", "c4_kv": "cmp", "c128_kv": "cmp"}


def owner(x, world, il):
    return (x // il) % world


def local_index(x, world, il):
    return (x // (world * il)) * il + x % il


def tp_weights(w, d, world, rank):
    """Rank `rank`'s TP shard: its heads' wq_b rows and sinks, its o_proj groups / columns (test_dsa_cp.shard)."""
    ws = shard(w, d, world, rank)
    h = d.N // world
    ws["wq_b"] = w["wq_b"][rank * h * d.D:(rank + 1) * h * d.D].contiguous()
    ws["attn_sink"] = w["attn_sink"][rank * h:(rank + 1) * h].contiguous()
    return ws


def nrows(kd, ratio, S):
    return S if kd == "swa" else S // ratio


def place_shard(one, cp, kd, b, world, rank, il, into):
    """The single-rank rows of request b in cache kd that `rank` owns, at their local slots of cp's table."""
    src = getattr(one, SHARDED[kd])
    rows = src.shape[1]
    for x in range(nrows(kd, one.d.ratio, one.S[b])):
        if owner(x, world, il) != rank:
            continue
        li = local_index(x, world, il)
        into[cp.tables[kd][b][li // rows], li % rows] = src[one.tables[kd][b][x // rows], x % rows]


def expected_shard(one, cp, kd, world, rank, il):
    out = torch.zeros_like(getattr(cp, SHARDED[kd]))
    for b in range(len(one.S)):
        place_shard(one, cp, kd, b, world, rank, il, out)
    return out


def replicated(run):
    idx = (run.raw,) if run.raw is not None else (run.ik, run.isc)
    return [t for t in (run.state, run.istate) + idx if t is not None]


# ratio: (prefill steps of the single-rank layer, then decode / speculative-decode steps of both)
STEPS = {
    1: ([([0, 1, 2], [13, 5, 4])], [([0, 1, 2], [1, 1, 1]), ([0, 1, 2], [3, 3, 3]), ([1], [1])]),
    # (a decode step may carry rows past its requests' tokens: num_input_tokens padding, output zeros)
    4: ([([0, 1, 2], [23, 10, 5])], [([0, 1, 2], [1, 1, 1]), ([0, 1, 2], [3, 3, 3]), ([0, 1, 2], [1, 2, 1], 2),
                                     ([2], [1])]),
    # 255 tokens: the first decode completes compressed row 1 (rows 0 and 1 on different ranks at interleave 1)
    128: ([([0, 1], [255, 9])], [([0, 1], [1, 1]), ([0, 1], [1, 1]), ([0], [1])]),
}


# ratio: a whole sequence run by both layers from empty caches (the DCP run's shards are never filled from the
# single rank): fresh prefills (request 2 shorter than the window), a mixed step (decodes with a chunked prefill:
# request 2 with context), C4 a chunked-prefill step without decodes, decodes (with num_input_tokens padding) and a speculative decode. Every prefill's first
# row (position 0, its only key on rank 0) has no key on the other ranks: their LSE -inf partials merge to nothing.
SEQ = {
    1: [([0, 1, 2], [13, 5, 4]), ([0, 1, 2], [1, 1, 6]), ([0, 1, 2], [1, 1, 1], 2), ([0, 1, 2], [3, 3, 3])],
    4: [([0, 1, 2], [23, 10, 5]), ([0, 1, 2], [1, 1, 14]), ([1, 2], [9, 4]), ([0, 1, 2], [1, 2, 1], 2),
        ([0, 1, 2], [3, 3, 3])],
    # request 1's chunk completes compressed rows 0 and 1 (rank 1's first row at interleave 1), request 0's decode
    # after 255 prefilled tokens row 1
    128: [([0, 1], [255, 9]), ([0, 1], [1, 250]), ([0, 1], [1, 1])],
}


def _setup(rank, world, comm, ratio, dtype, il, k, seq=False):
    """The single-rank run and the DCP run of this rank. seq: both from empty caches, the steps SEQ[ratio]; else the
    single rank after its prefills, the DCP run's caches filled from it, the steps the decodes of STEPS[ratio]."""
    d = dims(ratio)
    prefills, decodes = ([], SEQ[ratio]) if seq else STEPS[ratio]
    nreq = max(max(r[0]) for r in prefills + decodes) + 1
    mb = 40 if ratio == 128 else 24  # the C128 state's small blocks: 255 tokens need 32 columns
    one = Run(d, dtype, nreq, k=k, max_blocks=mb)
    cp = Run(d, dtype, nreq, k=k, max_blocks=mb,
             sb_extra=dict(dcp_world_size=world, dcp_rank=rank, dcp_interleave=il),
             impl_extra=dict(dcp_comm=comm, num_heads=d.N // world, o_groups=d.G // world),
             weights_of=lambda w: tp_weights(w, d, world, rank))
    if seq:
        return d, one, cp, decodes
    for reqs, qlens in prefills:
        one.step(reqs, qlens)
    # the caches after the single-rank prefill: replicated ones whole, sharded ones the owned rows
    for a, b in zip(replicated(cp), replicated(one)):
        a.copy_(b)
    for kd in SHARDED:
        if kd in cp.kinds:
            getattr(cp, SHARDED[kd]).copy_(expected_shard(one, cp, kd, world, rank, il))
    cp.S = list(one.S)
    return d, one, cp, decodes


def _dcp_case(rank, world, comm, ratio, dtype, il, k, seq=False):
    d, one, cp, decodes = _setup(rank, world, comm, ratio, dtype, il, k, seq)
    tol = dict(atol=2e-5, rtol=2e-5) if dtype == torch.float32 else dict(atol=3e-2, rtol=3e-2)
    report = []
    for reqs, qlens, *pad in decodes:
        pad = pad[0] if pad else 0
        comm.reset_counters()
        st, out, qsl, S = cp.step(reqs, qlens, pad)
        calls = tuple(comm.calls_of(op) for op in ("all_gather", "all_to_all_single", "all_reduce"))
        _, want, _, _ = one.step(reqs, qlens, pad)
        where = f"rank {rank} W {world} I {il} ratio {ratio} {dtype} {'seq ' if seq else ''}step {reqs} {qlens} pad {pad}"
        assert calls == (1, 1, 0), (where, calls)
        assert st.dcp_world_size == world and st.dcp_rank == rank and st.dcp_interleave == il, where
        n = qsl[-1]
        assert torch.equal(out[n:], torch.zeros_like(out[n:])), f"{where}: rows past the step's tokens"
        refs = None
        if rank == 0 and dtype == torch.float32:
            # the float64 reference with the single-rank selection (test_dsa.check_step's)
            tk = one.impl.last_topk if ratio == 4 else None
            refs = torch.cat([ref.dsa_layer(d, one.w, one.x[b][: S[i]], qlens[i], one.cos, one.sin,
                                            topk=None if tk is None else tk[qsl[i]: qsl[i + 1], 0].to(torch.int64))
                              for i, b in enumerate(reqs)])
        if ratio == 4 and dtype == torch.float32:
            assert torch.equal(cp.impl.last_topk, one.impl.last_topk), f"{where}: top-k"
        for a, b in zip(replicated(cp), replicated(one)):
            assert torch.equal(a, b), f"{where}: a replicated cache differs from the single-rank one"
        for kd in SHARDED:
            if kd in cp.kinds:
                got, exp = getattr(cp, SHARDED[kd]), expected_shard(one, cp, kd, world, rank, il)
                torch.testing.assert_close(got, exp, atol=1e-6 if dtype == torch.float32 else 1e-2, rtol=0,
                                           msg=lambda m: f"{where}: the {kd} shard: {m}")
        kind = "mixed" if st.num_prefills and st.num_decodes else "prefill" if st.num_prefills else "decode"
        # seq: the TP reduction inside the ranks too, cp.Comm.all_reduce from Python between the layer calls (which
        # hung now and then while the layer's forward held the GIL during its collectives)
        tp = comm.all_reduce(out[:n].clone()) if seq else None
        report.append((where, str(st.attn_state).rsplit(".", 1)[-1], _wire(out[:n]), _wire(want[:n]), _wire(refs),
                       kind, _wire(tp)))
    return report


def _wire(t):
    """A tensor as nested lists (tensors returned through the harness's queue would travel as shared-memory handles
    of a process that has exited)."""
    return None if t is None else t.to(torch.float64).tolist()


def check_sums(results, dtype_of):
    """The parent's side: per step, the ranks' partial outputs summed against the single-rank output and the
    float64 reference (rank 0's)."""
    for c, steps in enumerate(results[0]):
        at, rt = ref_tol(dtype_of(c))
        for j, (where, _, _, want, refs, *more) in enumerate(steps):
            summed = sum(torch.tensor(res[c][j][2], dtype=torch.float64) for res in results)
            if len(more) > 1 and more[1] is not None:
                for res in results:  # the ranks' own all_reduce of the partials
                    torch.testing.assert_close(torch.tensor(res[c][j][6], dtype=torch.float64), summed, atol=1e-5,
                                               rtol=1e-5 if dtype_of(c) == torch.float32 else 1e-2,
                                               msg=lambda m: f"{where}: the ranks' all_reduce: {m}")
            want = torch.tensor(want, dtype=torch.float64)
            refs = None if refs is None else torch.tensor(refs, dtype=torch.float64)
            scale = max(1.0, want.abs().max().item())
            torch.testing.assert_close(summed, want, atol=at * scale, rtol=rt,
                                       msg=lambda m: f"{where}: summed output vs the single-rank layer: {m}")
            if refs is not None:
                torch.testing.assert_close(summed, refs, atol=at * max(1.0, refs.abs().max().item()), rtol=rt,
                                           msg=lambda m: f"{where}: summed output vs the float64 reference: {m}")


def _index_cache(rank, world, comm):
    """IndexCache under DCP: a use_index_cache C4 layer stores the (global, single-rank) selection in the TopkBuffer,
    a skip_topk layer attends over it on the same caches: both TP-summed outputs equal the single-rank pair's."""
    d, one, cp, decodes = _setup(rank, world, comm, 4, torch.float32, 1, 2)
    steps = []
    for r in (one, cp):
        r.topk = aar.sfa.TopkBuffer(64, d.K)
        r.store, r.skip = r.make_impl(use_index_cache=True), r.make_impl(skip_topk=True)
    for reqs, qlens, *_ in decodes[:2]:
        out = {}
        for name, r in (("cp", cp), ("one", one)):
            out[name] = r.index_cache_pair(reqs, qlens)[:3]
        (a, b, sel), (a1, b1, sel1) = out["cp"], out["one"]
        assert torch.equal(sel, sel1) and torch.equal(cp.topk.buffer[: sel.shape[0]], sel[:, 0])
        # (the parent sums the partials: the store and skip layers' against the single-rank pair's)
        steps.append((f"IndexCache rank {rank} step {reqs} {qlens}", "pair", _wire(torch.cat([a, b])),
                      _wire(torch.cat([a1, b1])), None))
    return steps


def _refusals(rank, world, comm):
    d = dims(4)
    msgs = {}

    def catch(key, fn):
        try:
            fn()
        except (ValueError, NotImplementedError) as e:
            msgs[key] = (type(e).__name__, str(e))

    comm.reset_counters()
    cp = Run(d, torch.float32, 1, sb_extra=dict(dcp_world_size=world, dcp_rank=rank),
             impl_extra=dict(dcp_comm=comm, num_heads=d.N // world, o_groups=d.G // world),
             weights_of=lambda w: tp_weights(w, d, world, rank))
    plain = Run(d, torch.float32, 1)
    snap = [t.clone() for t in cp.caches()]
    # the layer given plain metadata, and a plain layer given DCP metadata
    plain.S = [0]
    st, md, S, qsl = plain.build([0], [5])
    hid = plain.hidden([0], [5], S, 0)
    catch("comm_vs_plain", lambda: cp.impl.forward(hid, cp.kv, st, md["swa"], torch.zeros_like(hid),
                                                   **group_kw(4, md, st)))
    cp.S = [4]
    st2, md2, S2, qsl2 = cp.build([0], [1])
    hid2 = cp.hidden([0], [1], S2, 0)
    catch("plain_vs_dcp", lambda: plain.impl.forward(hid2, plain.kv, st2, md2["swa"], torch.zeros_like(hid2),
                                                     **group_kw(4, md2, st2)))
    base = dict(hidden_size=d.hidden, num_heads=d.N // world, head_dim=d.D, rope_dim=d.R, q_lora_rank=d.q_lora,
                compress_ratio=4, index_n_heads=d.n_idx, index_head_dim=d.Di, index_topk=d.K, eps=d.eps,
                o_groups=d.G // world, o_lora_rank=d.o_lora)
    tw = tp_weights(cp.w, d, world, rank)
    catch("a5", lambda: aar.dsa.Impl(tw, dcp_comm=comm, device_kind="a5", **base))
    calls = sum(comm.calls_of(op) for op in ("all_gather", "all_to_all_single", "all_reduce"))
    untouched = all(torch.equal(a, b) for a, b in zip(cp.caches(), snap))
    return msgs, calls, untouched


def _case(rank, world, cases, refusals):
    # 60 s: rank 0 alone runs the float64 reference between two collectives (a loaded machine is slow)
    comm = aar.cp.Comm(dist.group.WORLD, timeout_s=60.0)
    reports = [_dcp_case(rank, world, comm, *c) for c in cases]
    if refusals:
        reports.append(_index_cache(rank, world, comm))
    return reports, (_refusals(rank, world, comm) if refusals else None)


def test_dsa_dcp_two_ranks_decode_every_ratio():
    cases = [(1, torch.float32, 1, 2), (4, torch.float32, 1, 2), (4, torch.float32, 2, 2),
             (128, torch.float32, 1, 0), (128, torch.float32, 2, 0), (4, torch.bfloat16, 1, 2)]
    results = run_ranks(2, _case, cases, True, deadline_s=150.0)
    # the cases, then the IndexCache pair (fp32)
    check_sums([r for r, _ in results], lambda c: cases[c][1] if c < len(cases) else torch.float32)
    for rank, (reports, refusals) in enumerate(results):
        states = {s[1] for rep in reports[:-1] for s in rep}
        assert {"DecodeOnly", "SpecDecoding"} <= states, states
        msgs, calls, untouched = refusals
        assert calls == 0 and untouched, (rank, calls, untouched)
        want = {
            "comm_vs_plain": ("ValueError", "dcp_world_size=1"),
            "plain_vs_dcp": ("ValueError", "the layer has no dcp_comm"),
            "a5": ("NotImplementedError", "A2/A3 npu_sparse_attn_sharedkv plan only"),
        }
        for key, (kind, text) in want.items():
            assert key in msgs, (rank, key, msgs)
            assert msgs[key][0] == kind and text in msgs[key][1], (rank, key, msgs[key])


def test_dsa_dcp_two_ranks_prefill_sequence():
    """docs/design/sparse_cp.md §12.3: whole sequences under DCP from empty caches (prefill, chunked prefill, mixed,
    decode, speculative decode), every ratio, interleave 1 and 2, fp32 and bf16."""
    cases = [(1, torch.float32, 1, 2, True), (1, torch.bfloat16, 2, 2, True), (4, torch.float32, 1, 2, True),
             (4, torch.float32, 2, 2, True), (4, torch.bfloat16, 2, 2, True), (128, torch.float32, 1, 0, True),
             (128, torch.bfloat16, 2, 0, True)]
    results = run_ranks(2, _case, cases, False, deadline_s=150.0)
    check_sums([r for r, _ in results], lambda c: cases[c][1])
    for reports, _ in results:
        assert len(reports) == len(cases)
        for rep in reports:
            assert [s[5] for s in rep[:2]] == ["prefill", "mixed"] and rep[-1][5] == "decode", [s[5] for s in rep]


def test_dsa_dcp_four_ranks():
    # decode steps on caches filled from the single rank; a sequence from empty caches at interleave 2, where the
    # 5-token request 2 has no key on rank 3 in its prefill
    cases = [(4, torch.float32, 1, 2), (4, torch.float32, 2, 2, True)]
    results = run_ranks(4, _case, cases, False, deadline_s=150.0)
    check_sums([r for r, _ in results], lambda c: torch.float32)
    assert "SpecDecoding" in {s[1] for s in results[0][0][0]}
    assert [s[5] for s in results[0][0][1][:2]] == ["prefill", "mixed"]


def _sb(**kw):
    d = dims(4)
    cos = torch.zeros(64, d.R)
    base = dict(max_num_reqs=4, max_num_tokens=64, cos_table=cos, sin_table=cos, compress_cos_table=cos,
                compress_sin_table=cos, num_speculative_tokens=1, head_dim=d.D, window=d.W)
    base.update(kw)
    return aar.dsa.StepBuilder(**base)


def test_dsa_dcp_builder_refusals():
    # DSA-CP x DCP is built for one group (docs/design/sparse_cp.md §14): other ranks are refused
    with pytest.raises(NotImplementedError, match="DSA DCP x DSA-CP is built for a DCP group that is the DSA-CP"):
        _sb(dcp_world_size=2, dsa_cp_world_size=2, dsa_cp_rank=1)
    with pytest.raises(NotImplementedError, match="DSpark under DSA DCP"):
        _sb(dcp_world_size=2, dspark_num_spec=1)
    with pytest.raises(ValueError, match="dcp_rank=2"):
        _sb(dcp_world_size=2, dcp_rank=2)
    with pytest.raises(ValueError, match="dcp_interleave"):
        _sb(dcp_world_size=2, dcp_interleave=0)
    sb = _sb(dcp_world_size=2, dcp_rank=1)
    qsl, S = torch.tensor([0, 1], dtype=torch.int32), torch.tensor([5], dtype=torch.int32)
    # a decode bucket and a draft step build under DCP (docs/design/sparse_cp.md §12.5, §12.6)
    cap = sb.build_for_graph_capture(qsl, S, state=aar.AttentionState.DecodeOnly)
    assert (cap.dcp_world_size, cap.dcp_rank) == (2, 1)
    dr = sb.build_for_drafting(qsl, S, draft_index=0)
    assert (dr.dcp_world_size, dr.dcp_rank, dr.dcp_interleave) == (2, 1, 1)
    # a prefill step builds under DCP (docs/design/sparse_cp.md §12)
    assert sb.build(torch.tensor([0, 5], dtype=torch.int32), S).num_prefills == 1
    with pytest.raises(NotImplementedError, match="A2/A3 npu_sparse_attn_sharedkv plan only"):
        aar.dsa.GroupBuilder(sb, kind="swa", cache_block_size=32, max_blocks_per_req=4, num_blocks=8,
                             device_kind="a5", cache_dtype=None, model_dtype="bfloat16")
    st = sb.build(qsl, S)
    assert (st.dcp_world_size, st.dcp_rank, st.dcp_interleave) == (2, 1, 1)
    # a local column rank 1 reads (positions 1, 3 of S = 5: local 0, 1, column 0) holding no block id: refused
    # by name before the group writes anything
    gb = aar.dsa.GroupBuilder(sb, kind="swa", cache_block_size=32, max_blocks_per_req=4, num_blocks=8,
                              device_kind="a2", cache_dtype=None, model_dtype="bfloat16")
    with pytest.raises(ValueError, match=r"block_table\[0\]\[0\]=9 \(a local column DCP rank 1 reads\)"):
        gb.build(st, torch.tensor([[9, 1, 2, 3]], dtype=torch.int32))
    md = gb.build(st, torch.tensor([[5, 1, 2, 3]], dtype=torch.int32))
    # the token at position 4 belongs to rank 0: rank 1 writes nothing (the skip encoding)
    assert md.slot_mapping[0, 0].item() == -1, md.slot_mapping


def _draft_step(run, reqs, qlens, draft):
    """A draft step of an SWA-only layer on draft lane `draft` (docs/design/dsa.md §3.1 draft mode)."""
    S = [run.S[b] + q for b, q in zip(reqs, qlens)]
    qsl = [0]
    for q in qlens:
        qsl.append(qsl[-1] + q)
    st = run.sb.build_for_drafting(torch.tensor(qsl, dtype=torch.int32), torch.tensor(S, dtype=torch.int32), draft)
    md = {kd: run.gb[kd].build_for_drafting(st, run.tables[kd][reqs].contiguous(), draft) for kd in run.kinds}
    assert md["swa"].draft_index == draft
    hid = run.hidden(reqs, qlens, S, 0)
    out = torch.full_like(hid, float("nan"))
    run.impl.forward(hid, run.kv, st, md["swa"], out, **group_kw(run.d.ratio, md, st))
    for i, b in enumerate(reqs):
        run.S[b] = S[i]
    return st, out, qsl, S


def _check_caches(one, cp, world, rank, il, where):
    for a, b in zip(replicated(cp), replicated(one)):
        assert torch.equal(a, b), f"{where}: a replicated cache differs from the single-rank one"
    for kd in SHARDED:
        if kd in cp.kinds:
            got, exp = getattr(cp, SHARDED[kd]), expected_shard(one, cp, kd, world, rank, il)
            torch.testing.assert_close(got, exp, atol=1e-6, rtol=0, msg=lambda m: f"{where}: the {kd} shard: {m}")


def _reference(one, d, reqs, qlens, S, qsl):
    tk = one.impl.last_topk if d.ratio == 4 else None
    return torch.cat([ref.dsa_layer(d, one.w, one.x[b][: S[i]], qlens[i], one.cos, one.sin,
                                    topk=None if tk is None else tk[qsl[i]: qsl[i + 1], 0].to(torch.int64))
                      for i, b in enumerate(reqs)])


def _case_graph(rank, world):
    """docs/design/sparse_cp.md §12.5 / §12.6: decode buckets captured under DCP (the recording provider: nothing
    runs, no collective) and replayed with graph padding (fewer real requests than the bucket): per replay the
    output equals the DCP layer run eagerly on the same step (caches restored in between), the TP-summed output the
    single-rank layer's on the same padded step and the float64 reference, the caches the single-rank caches' (the
    padding rows write nothing), the query gather and the partials' all-to-all issued inside the replay. Ratio 1
    also runs draft steps on the draft lanes (eager)."""
    comm = aar.cp.Comm(dist.group.WORLD, timeout_s=60.0)
    reports = []
    # (ratio, q per request, bucket B, interleave); 128: request 0 of 140 tokens has complete compressed rows
    for ratio, q, B, il in ((1, 1, 4, 1), (4, 3, 3, 2), (128, 1, 3, 1)):
        d = dims(ratio)
        k = 2
        one = Run(d, torch.float32, 3, k=k)
        cp = Run(d, torch.float32, 3, k=k, sb_extra=dict(dcp_world_size=world, dcp_rank=rank, dcp_interleave=il),
                 impl_extra=dict(dcp_comm=comm, num_heads=d.N // world, o_groups=d.G // world),
                 weights_of=lambda w: tp_weights(w, d, world, rank))
        first = [140, 9, 30] if ratio == 128 else [20, 9, 30]
        for r in (cp, one):  # the prefill, eager (the DCP run's shards written by the DCP layer)
            r.step([0, 1, 2], first)
        n = B * q
        hidden, out = torch.zeros(n, d.hidden), torch.zeros(n, d.hidden)
        g = aar.GraphParams("recording")
        st, md, _, _ = cp.build_padded([0, 1, 2], B, q, capture=True)
        assert st.dcp_world_size == world
        snap = [t.clone() for t in cp.caches()]
        comm.reset_counters()
        with g.capture(n):
            cp.impl.forward(hidden, cp.kv, st, md["swa"], out, **group_kw(ratio, md, st))
        assert comm.calls == 0 and all(torch.equal(a, b) for a, b in zip(snap, cp.caches()))
        steps = []
        for reqs in ([0, 1, 2], [2, 0], [1]):
            where = f"rank {rank} ratio {ratio} q {q} B {B} I {il} replay {reqs}"
            st, md, S, qsl = cp.build_padded(reqs, B, q)
            hidden.zero_()
            hidden[: len(reqs) * q] = torch.cat([cp.x[b][S[i] - q: S[i]] for i, b in enumerate(reqs)])
            # the DCP layer eagerly on the same step, then the caches restored for the replay
            snap = [t.clone() for t in cp.caches()]
            eager = torch.full_like(out, float("nan"))
            cp.impl.forward(hidden, cp.kv, st, md["swa"], eager, **group_kw(ratio, md, st))
            after = [t.clone() for t in cp.caches()]
            for t, v in zip(cp.caches(), snap):
                t.copy_(v)
            out.fill_(float("nan"))
            aar.dsa.graph_update(g, n, st, md["swa"])
            comm.reset_counters()
            g.replay(n)
            calls = tuple(comm.calls_of(op) for op in ("all_gather", "all_to_all_single", "all_reduce"))
            assert calls == (1, 1, 0), (where, calls)
            m = len(reqs) * q
            torch.testing.assert_close(out[:m], eager[:m], atol=1e-6, rtol=1e-6, msg=lambda e: f"{where}: {e}")
            assert all(torch.equal(a, b) for a, b in zip(cp.caches(), after)), f"{where}: replay vs eager caches"
            for i, b in enumerate(reqs):
                cp.S[b] = S[i]
            st1, md1, _, _ = one.build_padded(reqs, B, q)
            want = torch.full_like(out, float("nan"))
            one.impl.forward(hidden, one.kv, st1, md1["swa"], want, **group_kw(ratio, md1, st1))
            for i, b in enumerate(reqs):
                one.S[b] = S[i]
            _check_caches(one, cp, world, rank, il, where)
            refs = _reference(one, d, reqs, [q] * len(reqs), S, qsl) if rank == 0 else None
            steps.append((where, "replay", _wire(out[:m]), _wire(want[:m]), _wire(refs)))
        if ratio == 1:
            # draft steps under DCP (eager): draft lanes 0 and 1, one request shorter than its draft block
            for draft, reqs, qlens in ((0, [0, 1, 2], [3, 3, 3]), (1, [2, 0], [2, 1])):
                where = f"rank {rank} ratio 1 I {il} draft {draft} {reqs} {qlens}"
                comm.reset_counters()
                dst, got, qsl, S = _draft_step(cp, reqs, qlens, draft)
                assert (dst.dcp_world_size, dst.dcp_rank) == (world, rank), where
                assert tuple(comm.calls_of(op) for op in ("all_gather", "all_to_all_single")) == (1, 1), where
                _, want, _, _ = _draft_step(one, reqs, qlens, draft)
                _check_caches(one, cp, world, rank, il, where)
                refs = _reference(one, d, reqs, qlens, S, qsl) if rank == 0 else None
                steps.append((where, "draft", _wire(got[: qsl[-1]]), _wire(want[: qsl[-1]]), _wire(refs)))
        reports.append(steps)
    return reports


def test_dsa_dcp_two_ranks_decode_graph_and_drafts():
    results = run_ranks(2, _case_graph, deadline_s=120.0)
    check_sums(results, lambda c: torch.float32)
    assert [len(r) for r in results[0]] == [5, 3, 3], [len(r) for r in results[0]]
