# The DSA multistream prolog (ImplConfig::multistream, docs/design/dsa.md §5.5): the compressors and the indexer's
# cache write on a side stream, the prolog, selection and attention on the main one. On CPU both are the default
# stream (the same code, events elided), so the outputs and every cache must be identical with and without it;
# the layer's stream log (log_streams=True) shows the assignment and the waits that order the KV writes.
import pytest
import torch

import ascend_attn_rt as aar
import _dsa_reference as ref
from _dsa_harness import LayerRun, group_kw
from test_dsa import dims

F64 = torch.float64
STEPS = [([0, 1], [9, 13]), ([0, 1], [6, 2]), ([0, 1], [1, 1]), ([0, 1], [1, 3])]


def pair(ratio, dtype, **kw):
    d = dims(ratio)
    runs = [LayerRun(d, "a2", dtype, 2, seed=7) for _ in range(2)]
    runs[0].impl = runs[0].make_impl(log_streams=True, **kw)
    runs[1].impl = runs[1].make_impl(multistream=True, log_streams=True, **kw)
    return d, runs


@pytest.mark.parametrize("ratio", [4, 128])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_same_outputs_and_caches_with_and_without(ratio, dtype):
    d, (serial, multi) = pair(ratio, dtype)
    steps = STEPS if ratio == 4 else [([0], [130]), ([0], [1]), ([0], [3])]
    for reqs, qlens in steps:
        a, qsl, S = serial.step(reqs, qlens)
        b, _, _ = multi.step(reqs, qlens)
        assert torch.equal(a, b)
        if ratio == 4:
            assert torch.equal(serial.impl.last_topk, multi.impl.last_topk)
        for x, y in zip(serial.caches(), multi.caches()):
            assert torch.equal(x, y)
    # and both are the layer (the float64 reference; the float32 layer tolerance)
    if dtype == torch.float32:
        tk = multi.impl.last_topk[qsl[0]: qsl[1], 0].to(torch.int64) if ratio == 4 else None
        want = ref.dsa_layer(d, multi.w, multi.x[0][: S[0]], qlens[0], multi.cos, multi.sin, topk=tk)
        torch.testing.assert_close(b[qsl[0]: qsl[1]].to(F64), want, atol=2e-5 * max(1.0, want.abs().max().item()),
                                   rtol=2e-5)


def test_stream_log_shows_the_assignment():
    _, (serial, multi) = pair(4, torch.float32)
    serial.step([0, 1], [9, 13])
    multi.step([0, 1], [9, 13])
    parts = [(p, role) for p, role, _ in multi.impl.stream_log]
    # the side stream forks from the main one, writes the indexer cache and the compressed KV; the main stream
    # runs the prolog and the SWA write meanwhile, waits for the indexer cache before the selection and for the
    # compressed KV before the attention
    assert parts == [("fork", "side"), ("indexer_cache", "side"), ("compressor", "side"), ("prolog", "main"),
                     ("swa_write", "main"), ("wait_indexer_cache", "main"), ("indexer_select", "main"),
                     ("wait_compressed_kv", "main"), ("attention", "main"), ("o_proj", "main")]
    # without it: everything on the main stream, in the serial order of §5.1
    assert [(p, role) for p, role, _ in serial.impl.stream_log] == [
        ("prolog", "main"), ("swa_write", "main"), ("indexer_cache", "main"), ("indexer_select", "main"),
        ("compressor", "main"), ("attention", "main"), ("o_proj", "main")]
    # on CPU both roles are the default stream
    assert {sid for _, _, sid in multi.impl.stream_log} == {0}
    # the log is per forward, and off by default
    multi.step([0, 1], [1, 1])
    assert len(multi.impl.stream_log) == 10
    assert LayerRun(dims(4), "a2", torch.float32, 1).impl.stream_log == []


def test_skip_topk_and_swa_layers():
    # an SWA-only layer has nothing for the side stream: one stream whatever the flag
    d = dims(1)
    run = LayerRun(d, "a2", torch.float32, 1)
    run.impl = run.make_impl(multistream=True, log_streams=True)
    run.step([0], [5])
    assert all(role == "main" for _, role, _ in run.impl.stream_log)
    assert [p for p, _, _ in run.impl.stream_log] == ["prolog", "swa_write", "attention", "o_proj"]


def test_graph_capture_records_without_writing():
    # Inside a capture the layer is recorded (its two-stream order replays with it: test_dsa_graph_plans.py);
    # the recording provider runs nothing.
    d = dims(4)
    run = LayerRun(d, "a2", torch.float32, 2)
    run.impl = run.make_impl(multistream=True, log_streams=True)
    run.step([0, 1], [8, 5])
    st, md, S, qsl = run.build([0, 1], [1, 1])
    hid = torch.stack([run.x[0][8], run.x[1][5]])
    out = torch.zeros_like(hid)
    before = [t.clone() for t in run.caches()]
    g = aar.GraphParams("recording")
    with g.capture(2):
        run.impl.forward(hid, run.kv, st, md["swa"], out, **group_kw(4, md, st))
    assert all(torch.equal(a, b) for a, b in zip(before, run.caches()))
    assert torch.equal(out, torch.zeros_like(out))
