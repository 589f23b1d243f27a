"""The DSA layer's W8A8-dynamic prolog and multistream prolog under DSA-CP, DCP and PCP (docs/design/dsa.md §5.4,
§5.5; docs/design/sparse_cp.md §10, §12, §13), over a real gloo group of 2 local processes.

Per mode, every rank runs three C4 layers on the same requests and steps, each on its own caches:
  * `one`:   the single-rank layer with the W8A8-dynamic prolog (full weights, no CP);
  * `mode`:  the mode's W8A8 layer (DSA-CP: every head, its o_proj shard; DCP: its TP heads and o_proj shard, the
             ranks' partial outputs summed by an all-reduce from Python, the model's TP reduction; PCP: its local
             rows), single stream;
  * `multi`: the same with multistream=True (and log_streams=True).
Checks per step:
  * `mode` against `one` (the float32 layer tolerance, 2e-5 of the output's scale) and, on rank 0, against the float64
    reference of the quantised computation (_dsa_reference: x and qr quantised per token, the int8 products
    dequantised); the inputs are float32 with tie margins above test_dsa_w8a8.py's (MARGIN_X / MARGIN_QR, searched
    over seeds the same way), so the codes are the reference's and that file's derivation gives the float32 layer
    tolerance;
  * `multi` bit-identical to `mode` (outputs, selections and every cache: on CPU both streams are the default
    stream, the same operators on the same inputs in another issue order);
  * the caches of `mode` against `one`'s (DSA-CP, PCP: equal; DCP: the replicated ones equal);
  * `multi`'s stream log: the compressed caches' writers on the side stream after a fork, the waits for them on
    the main stream before the selection and the attention, and the mode's collectives (DSA-CP: the o_proj road's
    all-to-all / all-reduce or all-gathers; DCP: the query gather and the partials' all-to-all inside "attention";
    PCP: the hidden rows' all-gather before the fork) on the main stream after those waits (or, PCP, before the
    fork, whose event orders the side stream after it).
A decode bucket captured under DSA-CP and under DCP (W8A8 + multistream, the recording provider) replays like the
single-rank layer.
"""

import pytest
import torch

import ascend_attn_rt as aar
import _dsa_reference as ref
from _cp_harness import run_ranks
from _dsa_harness import group_kw
from test_dsa_cp import Run, dims, shard
from test_dsa_dcp import tp_weights, replicated
from test_dsa_pcp import _local
from test_dsa_w8a8 import MARGIN_QR, MARGIN_X

dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

F64 = torch.float64
WORLD = 2
NREQ = 3
TOL = dict(atol=2e-5, rtol=2e-5)

# (reqs, qlens, pad) per mode; k the StepBuilder's num_speculative_tokens.
STEPS = {
    # prefills, a mixed step, a speculative decode, a one-token step (rank 1's slice empty)
    "dsa_cp": ([([0, 1, 2], [23, 10, 5], 0), ([0, 1, 2], [1, 1, 14], 0), ([0, 1, 2], [3, 3, 3], 0),
                ([2], [1], 0)], 2),
    # from empty caches: prefills, a mixed step, a decode with padding rows, a speculative decode
    "dcp": ([([0, 1, 2], [23, 10, 5], 0), ([0, 1, 2], [1, 1, 14], 0), ([0, 1, 2], [1, 2, 1], 2),
             ([0, 1, 2], [3, 3, 3], 0)], 2),
    # prefills (one request shorter than the 2 Wp chunks), a mixed step, a decode
    "pcp": ([([0, 1, 2], [23, 2, 5], 0), ([0, 1, 2], [1, 1, 14], 0), ([0, 1, 2], [1, 1, 1], 0)], 0),
}
TOKENS = 40  # every request's tokens over any of the sequences (and the graph case's) stay below this


def w8a8_seed(d):
    """The first seed whose Run weights and token streams (test_dsa_cp.Run's generation) clear the tie margins of
    test_dsa_w8a8.py over the first TOKENS tokens of every request."""
    for s in range(200):
        g = torch.Generator().manual_seed(s)
        w = ref.quantise_prolog(ref.make_dsa_weights(d, torch.float32, g))
        x = [torch.randn(400, d.hidden, generator=g, dtype=F64).to(torch.float32) for _ in range(NREQ)]
        if all(min(m - t for m, t in zip(ref.prolog_tie_margins(d, w, xb[:TOKENS]), (MARGIN_X, MARGIN_QR))) > 0
               for xb in x):
            return s
    raise AssertionError("no seed clears the tie margins")


def quantised(w):
    return ref.quantise_prolog(w)


def dcp_weights(w, d, world, rank):
    """The rank's TP shard of the W8A8 weights: test_dsa_dcp.tp_weights plus its heads' rows of wq_b_scale."""
    ws = tp_weights(w, d, world, rank)
    h = d.N // world
    ws["wq_b_scale"] = w["wq_b_scale"][rank * h * d.D:(rank + 1) * h * d.D].contiguous()
    return ws


def make_runs(mode, rank, comm, d, seed, k):
    one = Run(d, torch.float32, NREQ, k=k, seed=seed, weights_of=quantised)
    if mode == "dsa_cp":
        kw = dict(world=WORLD, rank=rank, comm=comm, weights_of=lambda w: shard(quantised(w), d, WORLD, rank))
    elif mode == "dcp":
        kw = dict(sb_extra=dict(dcp_world_size=WORLD, dcp_rank=rank),
                  impl_extra=dict(dcp_comm=comm, num_heads=d.N // WORLD, o_groups=d.G // WORLD),
                  weights_of=lambda w: dcp_weights(quantised(w), d, WORLD, rank))
    else:
        kw = dict(sb_extra=dict(pcp_world_size=WORLD, pcp_rank=rank), impl_extra=dict(pcp_comm=comm),
                  weights_of=quantised)
    runs = [Run(d, torch.float32, NREQ, k=k, seed=seed, **kw) for _ in range(2)]
    mode_run, multi = runs
    multi.impl = multi.make_impl(multistream=True, log_streams=True)
    for r in (one, mode_run, multi):
        assert r.impl.w8a8_prolog
    return one, mode_run, multi


def pcp_step(run, reqs, qlens):
    """A PCP step: the rank's local rows in and out (pads 0); returns (step, local out, local token index, S)."""
    st, md, S, qsl = run.build(reqs, qlens)
    idx = st.local_token_index.clone()
    hid = _local(run.hidden(reqs, qlens, S, 0), idx)
    out = torch.full_like(hid, float("nan"))
    run.impl.forward(hid, run.kv, st, md["swa"], out, **group_kw(run.d.ratio, md, st))
    for i, b in enumerate(reqs):
        run.S[b] = S[i]
    return st, out, idx, S


def reference(run, w, reqs, qlens, S, qsl):
    """The float64 W8A8 layer (w: the quantised weights) for the step's rows, with `run`'s C4 selection."""
    tk = run.impl.last_topk
    return torch.cat([ref.dsa_layer(run.d, w, run.x[b][: S[i]], qlens[i], run.cos, run.sin,
                                    topk=tk[qsl[i]: qsl[i + 1], 0].to(torch.int64)) for i, b in enumerate(reqs)])


MULTI_LOG = {
    # the side stream's writers issued first; the main stream waits for them before reading the caches and
    # before the collectives that follow
    "dsa_cp": [("fork", "side"), ("indexer_cache", "side"), ("compressor", "side"), ("swa_write", "main"),
               ("prolog", "main"), ("wait_indexer_cache", "main"), ("indexer_select", "main"),
               ("wait_compressed_kv", "main"), ("attention", "main"), ("o_proj_road", "main")],
    "dsa_cp_empty": [("fork", "side"), ("indexer_cache", "side"), ("compressor", "side"), ("swa_write", "main"),
                     ("wait_indexer_cache", "main"), ("wait_compressed_kv", "main"), ("o_proj_road", "main")],
    "dcp": [("fork", "side"), ("indexer_cache", "side"), ("compressor", "side"), ("prolog", "main"),
            ("swa_write", "main"), ("wait_indexer_cache", "main"), ("indexer_select", "main"),
            ("wait_compressed_kv", "main"), ("attention", "main"), ("o_proj", "main")],
    "pcp": [("gather_hidden", "main"), ("fork", "side"), ("indexer_cache", "side"), ("compressor", "side"),
            ("swa_write", "main"), ("prolog", "main"), ("wait_indexer_cache", "main"), ("indexer_select", "main"),
            ("wait_compressed_kv", "main"), ("attention", "main"), ("o_proj", "main")],
}
SERIAL_LOG = {
    "dsa_cp": ["swa_write", "indexer_cache", "compressor", "prolog", "indexer_select", "attention", "o_proj_road"],
    "pcp": ["gather_hidden", "swa_write", "indexer_cache", "compressor", "prolog", "indexer_select", "attention",
            "o_proj"],
}


def _mode_case(rank, comm, mode, seed):
    d = dims(4)
    steps, k = STEPS[mode]
    one, run, multi = make_runs(mode, rank, comm, d, seed, k)
    wq = quantised(one.w)
    logs = []
    for reqs, qlens, pad in steps:
        where = f"rank {rank} {mode} step {reqs} {qlens} pad {pad}"
        _, want, qsl, S = one.step(reqs, qlens, pad)
        n = qsl[-1]
        if mode == "pcp":
            st, got, idx, _ = pcp_step(run, reqs, qlens)
            _, got_m, _, _ = pcp_step(multi, reqs, qlens)
            real = idx >= 0
            g = idx[real].long()
            got_rows, want_rows = got[real], want[g]
            assert torch.equal(got[~real], torch.zeros_like(got[~real])), where
            assert torch.equal(run.impl.last_topk[real], one.impl.last_topk[g]), where
        else:
            st, got, _, _ = run.step(reqs, qlens, pad)
            _, got_m, _, _ = multi.step(reqs, qlens, pad)
            assert torch.equal(got[n:], torch.zeros_like(got[n:])), where
            if mode == "dcp":  # the TP reduction of the ranks' partial outputs
                got = comm.all_reduce(got[:n].clone())
                got_m = comm.all_reduce(got_m[:n].clone())
                assert torch.equal(run.impl.last_topk, one.impl.last_topk), where
            else:
                lo, hi = st.local_start, st.local_end
                assert torch.equal(run.impl.last_topk, one.impl.last_topk[lo:hi]), where
            got_rows, want_rows = got[:n], want[:n]
        scale = max(1.0, want_rows.abs().max().item())
        torch.testing.assert_close(got_rows, want_rows, atol=TOL["atol"] * scale, rtol=TOL["rtol"],
                                   msg=lambda m: f"{where}: vs the single-rank W8A8 layer: {m}")
        # multistream: the same outputs, selection and caches as the single-stream layer of the mode, bit for bit
        assert torch.equal(got_m, got), f"{where}: multistream output"
        assert torch.equal(multi.impl.last_topk, run.impl.last_topk), f"{where}: multistream top-k"
        assert all(torch.equal(a, b) for a, b in zip(multi.caches(), run.caches())), f"{where}: multistream caches"
        if mode == "dcp":
            assert all(torch.equal(a, b) for a, b in zip(replicated(run), replicated(one))), where
        else:
            assert all(torch.equal(a, b) for a, b in zip(run.caches(), one.caches())), where
        if rank == 0:
            refs = reference(one, wq, reqs, qlens, S, qsl)
            r = refs[g] if mode == "pcp" else refs
            torch.testing.assert_close(got_rows.to(F64), r, atol=TOL["atol"] * max(1.0, r.abs().max().item()),
                                       rtol=TOL["rtol"], msg=lambda m: f"{where}: vs the float64 W8A8 reference: {m}")
        logs.append(([(p, role) for p, role, _ in multi.impl.stream_log], str(st.attn_state).rsplit(".", 1)[-1],
                     st.num_prefills, (st.local_end - st.local_start) if mode == "dsa_cp" else None))
    return logs


def _graph_case(rank, comm, mode, seed):
    """A decode bucket (B = 3 requests of one token, then 2 real requests padded with a dummy) captured under the
    mode with the W8A8 prolog and multistream, replayed against the single-rank W8A8 layer run eagerly on the same
    padded steps; the caches against its (DCP: the replicated ones)."""
    d = dims(4)
    B = 3
    one, run, _ = make_runs(mode, rank, comm, d, seed, 0)
    run.impl = run.make_impl(multistream=True, log_streams=True)
    for r in (one, run):
        r.step([0, 1, 2], [20, 9, 30])
    hidden, out = torch.zeros(B, d.hidden), torch.zeros(B, d.hidden)
    g = aar.GraphParams("recording")
    st, md, _, _ = run.build_padded([0, 1, 2], B, 1, capture=True)
    comm.reset_counters()
    with g.capture(B):
        run.impl.forward(hidden, run.kv, st, md["swa"], out, **group_kw(4, md, st))
    assert comm.calls == 0
    logs = []
    for reqs in ([0, 1, 2], [2, 0]):
        st, md, S, _ = run.build_padded(reqs, B, 1)
        hidden.zero_()
        hidden[: len(reqs)] = torch.stack([run.x[b][S[i] - 1] for i, b in enumerate(reqs)])
        out.fill_(float("nan"))
        aar.dsa.graph_update(g, B, st, md["swa"])
        g.replay(B)
        for i, b in enumerate(reqs):
            run.S[b] = S[i]
        st1, md1, _, _ = one.build_padded(reqs, B, 1)
        want = torch.full_like(out, float("nan"))
        one.impl.forward(hidden, one.kv, st1, md1["swa"], want, **group_kw(4, md1, st1))
        for i, b in enumerate(reqs):
            one.S[b] = S[i]
        m = len(reqs)
        got = comm.all_reduce(out[:m].clone()) if mode == "dcp" else out[:m]
        torch.testing.assert_close(got, want[:m], **TOL)
        if mode == "dcp":
            assert all(torch.equal(a, b) for a, b in zip(replicated(run), replicated(one))), (mode, reqs)
        else:
            assert all(torch.equal(a, b) for a, b in zip(run.caches(), one.caches())), (mode, reqs)
        logs.append([p for p, _, _ in run.impl.stream_log])
    return logs


def _case(rank, world, seed):
    comm = aar.cp.Comm(dist.group.WORLD, timeout_s=60.0)
    out = {m: _mode_case(rank, comm, m, seed) for m in ("dsa_cp", "dcp", "pcp")}
    out["graph"] = {m: _graph_case(rank, comm, m, seed) for m in ("dsa_cp", "dcp")}
    # the serial layers' logs (log_streams without multistream): everything on the main stream, §5.1's order
    return out


def test_w8a8_and_multistream_under_dsa_cp_dcp_pcp():
    seed = w8a8_seed(dims(4))
    results = run_ranks(WORLD, _case, seed, deadline_s=150.0)
    for rank, res in enumerate(results):
        for mode in ("dsa_cp", "dcp", "pcp"):
            for log, state, prefills, nloc in res[mode]:
                if mode == "dsa_cp" and nloc == 0:
                    want = MULTI_LOG["dsa_cp_empty"]
                elif mode == "pcp" and not prefills:
                    # a decode-only step is replicated (sparse_cp.md §13.4): the single-rank road's order, as DCP's
                    want = MULTI_LOG["dcp"]
                else:
                    want = MULTI_LOG[mode]
                assert log == want, (rank, mode, state, log)
        # rank 1's slice of the one-token step is empty
        assert any(n == 0 for *_, n in res["dsa_cp"]) == (rank == 1)
        for mode, logs in res["graph"].items():
            for log in logs:  # the replayed closure runs the two-stream order
                assert log[:3] == ["fork", "indexer_cache", "compressor"] and "wait_compressed_kv" in log, (mode, log)


def _serial_logs(rank, world, seed):
    """The single-stream layers' logs under DSA-CP and PCP (log_streams alone): every part on the main stream, in
    the serial order."""
    comm = aar.cp.Comm(dist.group.WORLD, timeout_s=60.0)
    d = dims(4)
    logs = {}
    for mode, (reqs, qlens) in (("dsa_cp", ([0, 1], [9, 7])), ("pcp", ([0, 1], [9, 7]))):
        _, run, _ = make_runs(mode, rank, comm, d, seed, 0)
        run.impl = run.make_impl(log_streams=True)
        if mode == "pcp":
            pcp_step(run, reqs, qlens)
        else:
            run.step(reqs, qlens)
        logs[mode] = [(p, role) for p, role, _ in run.impl.stream_log]
    return logs


def test_serial_stream_logs_under_dsa_cp_and_pcp():
    for logs in run_ranks(WORLD, _serial_logs, 0, deadline_s=60.0):
        for mode, want in SERIAL_LOG.items():
            assert logs[mode] == [(p, "main") for p in want], (mode, logs[mode])
