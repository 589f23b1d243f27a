"""DSA (DeepSeek-V4) DSA-CP x DCP (docs/design/sparse_cp.md §14) over real gloo process groups.

4 local processes form two groups of 2 ({0, 1} and {2, 3}); each group is at once the DSA-CP (TP) group and the DCP
group (DCP rank r holds token slice r), and runs its own cases next to the other group. Every rank holds every head's
query weights and sinks (DSA-CP) and its row-parallel o_proj shard; its SWA and compressed caches are its DCP shard,
its compressor states and indexer cache replicated. Next to the layer each rank runs the single-rank layer (full
weights, whole caches) on the same steps. Two kinds of runs:
  * decode on filled caches: the single-rank prefill, the replicated caches copied and each shard filled with the
    single-rank rows the rank owns at its local slots (test_dsa_dcp's placement helpers), then decode and
    speculative-decode steps;
  * whole sequences from empty caches: fresh prefills, a mixed step, chunked prefill, decodes with graph padding,
    a speculative decode, a one-token step (rank 1's slice empty).
Per step, on every rank:
  * the output (complete on every rank) against the single-rank layer, rows past the step's tokens zeros; on the
    group's rank 0 (fp32) against the float64 reference of _dsa_reference with the single-rank selection;
  * the C4 top-k (every row of the step, gathered) equal to the single-rank selection;
  * replicated caches equal to the single-rank caches, each shard equal to the owned single-rank rows;
  * the collectives of the layer step: decode road 1 + (C4) 1 all-gathers, 2 all-to-alls, 1 all-reduce; prefill
    road (full o_proj) 4 + (C4) 1 all-gathers and 1 all-to-all.
An IndexCache pair (use_index_cache, skip_topk) against the single-rank pair. Refusals by name, before any write
and any collective: a DCP group that is not the DSA-CP group (layer and
builder), PCP with both, a layer given metadata without DCP.
"""

import pytest
import torch

import ascend_attn_rt as aar
from _cp_harness import pcp_dcp_groups, run_ranks
from _dsa_harness import group_kw
from test_dsa import check_step
from test_dsa_cp import Run, dims, same_bytes, shard
from test_dsa_dcp import SHARDED, expected_shard, replicated

dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

W = 2

# ratio: (prefill steps of the single-rank layer, then (reqs, qlens, pad) steps of both)
FILLED = {
    4: ([([0, 1, 2], [23, 10, 5])], [([0, 1, 2], [1, 1, 1], 0), ([0, 1, 2], [3, 3, 3], 0), ([0, 1, 2], [1, 2, 1], 1),
                                     ([2], [1], 0)]),
}
# ratio: a sequence from empty caches (odd token counts: 9, 13, 5 with padding; the last step one token)
SEQ = {
    1: [([0, 1, 2], [13, 5, 4], 0), ([0, 1, 2], [1, 1, 6], 0), ([0, 1, 2], [1, 1, 1], 2), ([0, 1, 2], [3, 3, 3], 0),
        ([1], [1], 0)],
    4: [([0, 1, 2], [23, 10, 5], 0), ([0, 1, 2], [1, 1, 14], 0), ([1, 2], [9, 4], 0), ([0, 1, 2], [1, 2, 1], 2),
        ([0, 1, 2], [3, 3, 3], 0), ([2], [1], 0)],
    # request 1's chunk completes compressed rows 0 and 1 (owned by different ranks at interleave 1)
    128: [([0, 1], [255, 9], 0), ([0, 1], [1, 250], 0), ([0, 1], [1, 1], 0), ([0], [1], 0)],
}


def _calls(comm):
    return tuple(comm.calls_of(op) for op in ("all_gather", "all_to_all_single", "all_reduce"))


def _runs(rank, comm, ratio, dtype, il, nreq, mb):
    d = dims(ratio)
    one = Run(d, dtype, nreq, max_blocks=mb)
    cp = Run(d, dtype, nreq, world=W, rank=rank, comm=comm, max_blocks=mb,
             sb_extra=dict(dcp_world_size=W, dcp_rank=rank, dcp_interleave=il), impl_extra=dict(dcp_comm=comm))
    return d, one, cp


def _case(rank, comm, ratio, dtype, il, seq):
    """One case on this rank of its group (rank: the group rank)."""
    steps = SEQ[ratio] if seq else FILLED[ratio][1]
    prefills = [] if seq else FILLED[ratio][0]
    nreq = max(max(r[0]) for r in prefills + steps) + 1
    d, one, cp = _runs(rank, comm, ratio, dtype, il, nreq, 40 if ratio == 128 else 24)
    if not seq:
        for reqs, qlens in prefills:
            one.step(reqs, qlens)
        for a, b in zip(replicated(cp), replicated(one)):
            a.copy_(b)
        for kd in SHARDED:
            if kd in cp.kinds:
                getattr(cp, SHARDED[kd]).copy_(expected_shard(one, cp, kd, W, rank, il))
        cp.S = list(one.S)
    tol = dict(atol=2e-5, rtol=2e-5) if dtype == torch.float32 else dict(atol=3e-2, rtol=3e-2)
    shards = shard(cp.w, d, W, rank)
    report = []
    for reqs, qlens, pad in steps:
        comm.reset_counters()
        st, out, qsl, S = cp.step(reqs, qlens, pad)
        calls = _calls(comm)
        _, want, _, _ = one.step(reqs, qlens, pad)
        where = f"rank {rank} ratio {ratio} {dtype} I {il} {'seq' if seq else 'filled'} step {reqs} {qlens} pad {pad}"
        n = qsl[-1]
        scale = max(1.0, want[:n].abs().max().item())
        torch.testing.assert_close(out[:n], want[:n], atol=tol["atol"] * scale, rtol=tol["rtol"],
                                   msg=lambda m: f"{where}: output vs the single-rank layer: {m}")
        assert torch.equal(out[n:], torch.zeros_like(out[n:])), f"{where}: rows past the step's tokens"
        assert (st.dcp_world_size, st.dcp_rank, st.dcp_interleave) == (W, rank, il), where
        if ratio == 4:
            assert cp.impl.last_topk.shape[0] == n, where  # every row of the step (gathered)
            if dtype == torch.float32:
                assert torch.equal(cp.impl.last_topk, one.impl.last_topk), f"{where}: top-k"
        if rank == 0 and dtype == torch.float32:
            check_step(one, reqs, qlens, out, qsl, S, one.impl.last_topk if ratio == 4 else None)
        for a, b in zip(replicated(cp), replicated(one)):
            assert same_bytes(a, b), f"{where}: a replicated cache differs from the single-rank one"
        for kd in SHARDED:
            if kd in cp.kinds:
                got, exp = getattr(cp, SHARDED[kd]), expected_shard(one, cp, kd, W, rank, il)
                torch.testing.assert_close(got, exp, atol=1e-6 if dtype == torch.float32 else 1e-2, rtol=0,
                                           msg=lambda m: f"{where}: the {kd} shard: {m}")
        decode = st.attn_state in (aar.AttentionState.DecodeOnly, aar.AttentionState.SpecDecoding)
        c4 = 1 if ratio == 4 else 0
        want_calls = (1 + c4, 2, 1) if decode else (4 + c4, 1, 0)
        assert calls == want_calls, (where, calls, str(st.attn_state))
        assert torch.equal(cp.impl.wo_a, shards["wo_a"]) and torch.equal(cp.impl.wo_b, shards["wo_b"]), where
        kind = "mixed" if st.num_prefills and st.num_decodes else "prefill" if st.num_prefills else "decode"
        report.append((kind, st.local_end - st.local_start, n))
    return report


def _index_cache(rank, comm):
    """IndexCache under DSA-CP x DCP: a use_index_cache C4 layer stores every row's (gathered, single-rank) selection
    in the TopkBuffer, a skip_topk layer attends over it with no gather of its own; both equal the single-rank
    pair's."""
    d, one, cp = _runs(rank, comm, 4, torch.float32, 1, 3, 24)
    for r in (one, cp):
        r.step([0, 1, 2], [23, 10, 5])
        r.topk = aar.sfa.TopkBuffer(64, d.K)
        r.store, r.skip = r.make_impl(use_index_cache=True), r.make_impl(skip_topk=True)
    for reqs, qlens in (([0, 1, 2], [1, 1, 1]), ([0, 1, 2], [1, 1, 9])):
        a, b, sel, _ = cp.index_cache_pair(reqs, qlens)
        comm.reset_counters()
        a1, b1, sel1, _ = one.index_cache_pair(reqs, qlens)
        n = sum(qlens)
        torch.testing.assert_close(a[:n], a1[:n], atol=2e-5, rtol=2e-5)
        torch.testing.assert_close(b[:n], b1[:n], atol=2e-5, rtol=2e-5)
        assert torch.equal(sel, sel1) and torch.equal(cp.topk.buffer[:n], sel[:, 0])
    return True


def _refusals(rank, group_rank, world_comm, comm):
    """Refused by name before any write and any collective."""
    msgs = {}

    def catch(key, fn):
        try:
            fn()
        except (ValueError, NotImplementedError) as e:
            msgs[key] = (type(e).__name__, str(e))

    d = dims(4)
    world_comm.reset_counters()
    comm.reset_counters()
    _, one, cp = _runs(group_rank, comm, 4, torch.float32, 1, 1, 8)
    snap = [t.clone() for t in cp.caches()]
    base = dict(hidden_size=d.hidden, num_heads=d.N, head_dim=d.D, rope_dim=d.R, q_lora_rank=d.q_lora,
                compress_ratio=4, index_n_heads=d.n_idx, index_head_dim=d.Di, index_topk=d.K, eps=d.eps,
                o_groups=d.G, o_lora_rank=d.o_lora)
    # the DCP group (2 ranks) inside a DSA-CP group of 4: not the same group
    w4 = shard(cp.w, d, 4, rank)
    catch("groups", lambda: aar.dsa.Impl(w4, dsa_cp_comm=world_comm, dcp_comm=comm, **base))
    sb = dict(max_num_reqs=4, max_num_tokens=64, cos_table=cp.cos, sin_table=cp.sin, compress_cos_table=cp.cos,
              compress_sin_table=cp.sin, head_dim=d.D, window=d.W)
    catch("ranks", lambda: aar.dsa.StepBuilder(dcp_world_size=2, dcp_rank=group_rank, dsa_cp_world_size=2,
                                               dsa_cp_rank=1 - group_rank, **sb))
    catch("pcp", lambda: aar.dsa.StepBuilder(dcp_world_size=2, dcp_rank=group_rank, dsa_cp_world_size=2,
                                             dsa_cp_rank=group_rank, pcp_world_size=2, **sb))
    # the combined layer given the step of a DSA-CP-only builder (no DCP)
    only = Run(d, torch.float32, 1, world=W, rank=group_rank, comm=comm, max_blocks=8)
    st, md, S, qsl = only.build([0], [5])
    hid = only.hidden([0], [5], S, 0)
    catch("no_dcp_step", lambda: cp.impl.forward(hid, cp.kv, st, md["swa"], torch.zeros_like(hid),
                                                 **group_kw(4, md, st)))
    calls = sum(c.calls_of(op) for c in (world_comm, comm) for op in ("all_gather", "all_to_all_single", "all_reduce"))
    untouched = all(torch.equal(a, b) for a, b in zip(cp.caches(), snap))
    return msgs, calls, untouched


# group: the cases of ranks {0, 1} and of ranks {2, 3}, run side by side
GROUP_CASES = [
    [(4, torch.float32, 1, False), (4, torch.float32, 2, True), (4, torch.bfloat16, 1, True)],
    [(1, torch.float32, 1, True), (128, torch.float32, 1, True)],
]


def _main(rank, world):
    _, dcp = pcp_dcp_groups(rank, 2, W)
    world_comm = aar.cp.Comm(dist.group.WORLD, timeout_s=60.0)
    comm = aar.cp.Comm(dcp, timeout_s=60.0)
    g, r = rank // W, rank % W
    reports = [_case(r, comm, *c) for c in GROUP_CASES[g]]
    if g == 1:
        assert _index_cache(r, comm)
    return reports, _refusals(rank, r, world_comm, comm)


def test_dsa_cp_dcp_two_groups_of_two():
    results = run_ranks(4, _main, deadline_s=170.0)
    for rank, (reports, refusals) in enumerate(results):
        kinds = {k for rep in reports for k, _, _ in rep}
        assert {"prefill", "mixed", "decode"} <= kinds, (rank, kinds)
        if rank % W == 1:
            assert any(nloc == 0 for rep in reports for _, nloc, _ in rep), "no empty slice on rank 1"
        assert any(n % W for rep in reports for _, _, n in rep), "no step with a token count not divisible by W"
        msgs, calls, untouched = refusals
        assert calls == 0 and untouched, (rank, calls, untouched)
        want = {
            "groups": ("NotImplementedError", "DCP group that is the DSA-CP group"),
            "ranks": ("NotImplementedError", "DCP group that is the DSA-CP group"),
            "pcp": ("NotImplementedError", "DSA-CP x PCP"),
            "no_dcp_step": ("ValueError", "dcp_world_size=1"),
        }
        for key, (kind, text) in want.items():
            assert key in msgs, (rank, key, msgs)
            assert msgs[key][0] == kind and text in msgs[key][1], (rank, key, msgs[key])


def _graph(rank, world):
    """A decode bucket of the combined layer captured on each rank of one 2-rank group (the recording provider:
    nothing runs, no collective) and replayed with 3, 2 and 1 real requests (graph padding): each replay equals the
    single-rank layer on the same padded step (and the float64 reference on rank 0) with the same caches' owned
    rows, the decode road's collectives inside the replay (query and top-k all-gathers, two all-to-alls, one
    all-reduce)."""
    comm = aar.cp.Comm(dist.group.WORLD, timeout_s=60.0)
    done = []
    for ratio, q, B in ((4, 1, 5), (128, 1, 3), (1, 2, 3)):
        d, one, cp = _runs(rank, comm, ratio, torch.float32, 1, 3, 40 if ratio == 128 else 24)
        # cp's and one's runs have the same speculative setting (Run's default num_speculative_tokens)
        first = [140, 9, 30] if ratio == 128 else [20, 9, 30]
        for r in (cp, one):
            r.step([0, 1, 2], first)
        n = B * q
        hidden = torch.zeros(n, d.hidden)
        out = torch.zeros(n, d.hidden)
        g = aar.GraphParams("recording")
        st, md, _, _ = cp.build_padded([0, 1, 2], B, q, capture=True)
        snap = [t.clone() for t in cp.caches()]
        comm.reset_counters()
        with g.capture(n):
            cp.impl.forward(hidden, cp.kv, st, md["swa"], out, **group_kw(ratio, md, st))
        assert comm.calls == 0 and all(same_bytes(a, b) for a, b in zip(snap, cp.caches()))
        for reqs in ([0, 1, 2], [2, 0], [1]):
            st, md, S, qsl = cp.build_padded(reqs, B, q)
            hidden.zero_()
            hidden[: len(reqs) * q] = torch.cat([cp.x[b][S[i] - q: S[i]] for i, b in enumerate(reqs)])
            out.fill_(float("nan"))
            aar.dsa.graph_update(g, n, st, md["swa"])
            comm.reset_counters()
            g.replay(n)
            assert _calls(comm) == (1 + (ratio == 4), 2, 1), _calls(comm)
            for i, b in enumerate(reqs):
                cp.S[b] = S[i]
            st1, md1, _, _ = one.build_padded(reqs, B, q)
            want = torch.full_like(out, float("nan"))
            one.impl.forward(hidden, one.kv, st1, md1["swa"], want, **group_kw(ratio, md1, st1))
            for i, b in enumerate(reqs):
                one.S[b] = S[i]
            m = len(reqs) * q
            torch.testing.assert_close(out[:m], want[:m], atol=2e-5, rtol=2e-5)
            if rank == 0:
                check_step(one, reqs, [q] * len(reqs), out, qsl, S, one.impl.last_topk if ratio == 4 else None)
            for a, b in zip(replicated(cp), replicated(one)):
                assert same_bytes(a, b), (ratio, reqs)
            for kd in SHARDED:
                if kd in cp.kinds:
                    assert torch.equal(getattr(cp, SHARDED[kd]), expected_shard(one, cp, kd, W, rank, 1)), (ratio, kd)
        done.append((ratio, q))
    return done


def test_dsa_cp_dcp_decode_graph_replays_like_the_single_rank_layer():
    for done in run_ranks(2, _graph, deadline_s=150.0):
        assert done == [(4, 1), (128, 1), (1, 2)]
