# Graph capture of DSA decode (dsa/impl.h "Graph capture", dsa/graph.h): a bucket is captured once
# (the CPU recording provider records the layer; nothing runs), then later decode steps - other
# seq_lens and block tables, fewer real requests than the bucket (graph padding), MTP (SpecDecoding) -
# are replayed. Replay == eager (a twin run stepped eagerly) and == the float64 reference
# (_dsa_reference.py); the caches' rows, the compressor state carried across replays; an update
# re-issues nothing; bad input named, nothing written.
import pytest
import torch

import ascend_attn_rt as aar
from _dsa_harness import group_kw
from test_dsa import DT, F64, Run, check_caches, check_step, dims, tol


def caches(run):
    return [t for t in (run.swa, run.cmp, run.state, run.istate, run.ik, run.isc) if t is not None]


def same(a, b):
    """Bit equality (one-byte caches by their bytes: the A5 fp8 rows hold scale bytes that read as NaN)."""
    return torch.equal(a.view(torch.uint8), b.view(torch.uint8)) if a.element_size() == 1 else torch.equal(a, b)


class Bucket:
    """A captured decode bucket of B requests x q tokens over a Run."""

    def __init__(self, run, B, q, impls=None, kvs=None):
        self.run, self.B, self.q = run, B, q
        self.n = B * q
        self.state = aar.AttentionState.SpecDecoding if q > 1 else aar.AttentionState.DecodeOnly
        d = run.d
        self.hidden = torch.zeros(self.n, d.hidden, dtype=run.dtype)
        self.impls = impls or [run.impl]
        self.kvs = kvs or [run.kv]
        self.outs = [torch.zeros(self.n, d.hidden, dtype=run.dtype) for _ in self.impls]
        self.g = aar.GraphParams("recording")

    def build(self, reqs, capture=False, width=None, num_input_tokens=None, B=None):
        """The padded step: the real requests, then dummy requests of q tokens (S = q: they read the zeroed
        table rows' block 0; their KV slots are skip slots) so that every bucket row is in a request."""
        run, q = self.run, self.q
        B = B or self.B
        n = len(reqs)
        S = [run.S[b] + q for b in reqs] + [q] * (B - n)
        qsl = [i * q for i in range(B + 1)]
        args = (torch.tensor(qsl, dtype=torch.int32), torch.tensor(S, dtype=torch.int32))
        kw = dict(num_reqs_actual=n, num_input_tokens=num_input_tokens or self.n)
        st = (run.sb.build_for_graph_capture(*args, state=self.state, **kw) if capture
              else run.sb.build(*args, **kw))
        rows = list(reqs) + [reqs[0]] * (B - n)  # padding rows: any table (the builder zeroes them)
        md = {kd: run.gb[kd].build(st, run.tables[kd][rows][:, : width or run.tables[kd].shape[1]].contiguous())
              for kd in run.kinds}
        return st, md, S[:n], qsl[: n + 1]

    def capture(self, reqs):
        st, md, _, _ = self.build(reqs, capture=True)
        snap = [t.clone() for t in caches(self.run)]
        with self.g.capture(self.n):
            for impl, kv, out in zip(self.impls, self.kvs, self.outs):
                impl.forward(self.hidden, kv, st, md["swa"], out, **group_kw(self.run.d.ratio, md, st))
        # the recording provider ran nothing: caches and outputs as they were
        for a, b in zip(snap, caches(self.run)):
            assert same(a, b)
        assert all(torch.count_nonzero(o) == 0 for o in self.outs)

    def replay(self, reqs):
        run, q = self.run, self.q
        st, md, S, qsl = self.build(reqs)
        self.hidden.zero_()
        self.hidden[: len(reqs) * q] = torch.cat([run.x[b][S[i] - q: S[i]] for i, b in enumerate(reqs)])
        for o in self.outs:
            o.fill_(float("nan"))
        self.g.clear_update_log()
        aar.dsa.graph_update(self.g, self.n, st, md["swa"])
        assert self.g.update_log == []  # nothing re-issued: every value the layer reads is at a stable address
        self.g.replay(self.n)
        for i, b in enumerate(reqs):
            run.S[b] = S[i]
        return S, qsl


def replay_case(ratio, dtype, k, prefill, steps):
    d = dims(ratio)
    q = 1 + k
    run = Run(d, dtype, nreq=3, k=k)
    twin = Run(d, dtype, nreq=3, k=k)  # the same layer stepped eagerly
    run.step([0, 1, 2], prefill)
    twin.step([0, 1, 2], prefill)
    bk = Bucket(run, B=4, q=q)
    bk.capture([0, 1, 2])
    at, rt = tol(dtype)
    for reqs in steps:
        S, qsl = bk.replay(reqs)
        out = bk.outs[0]
        tk = run.impl.last_topk[: len(reqs) * q] if ratio == 4 else None
        check_step(run, reqs, [q] * len(reqs), out, qsl, S, tk)
        assert torch.isfinite(out[len(reqs) * q:]).all()  # dummy rows: attention over block 0
        eager, _, _ = twin.step(reqs, [q] * len(reqs))
        torch.testing.assert_close(out[: len(reqs) * q], eager, atol=at, rtol=rt)
        if ratio == 4:
            assert torch.equal(tk, twin.impl.last_topk)
        # block 0 (the dummies' zeroed table rows: the null block) holds the dummies' compressor state
        for a, b in zip(caches(run), caches(twin)):
            torch.testing.assert_close(a[1:], b[1:], atol=at, rtol=rt)
    for b in range(3):
        check_caches(run, b)
    return run


@pytest.mark.parametrize("dtype", DT)
@pytest.mark.parametrize("ratio", [1, 4, 128])
def test_decode_bucket_replays_like_eager_and_reference(ratio, dtype):
    # prefills near a 128 boundary so the C128 compressor emits rows during the replays (its state carried
    # from the prefill and across replays); fewer real requests than the bucket, other orders and tables.
    steps = [[0, 1, 2], [2, 0], [1], [0, 1, 2], [1, 2, 0], [2], [0, 2, 1], [0, 1, 2]]
    replay_case(ratio, dtype, 0, [125, 61, 126], steps)


@pytest.mark.parametrize("ratio", [1, 4, 128])
def test_spec_decode_bucket_replays_like_eager_and_reference(ratio):
    # MTP: 2 tokens per request (SpecDecoding), bucket 4 x 2
    steps = [[0, 1, 2], [1, 0], [2], [0, 1, 2], [2, 1, 0]]
    replay_case(ratio, torch.float32, 1, [124, 39, 127], steps)


def test_bf16_spec_decode_c4():
    replay_case(4, torch.bfloat16, 1, [30, 41, 17], [[0, 1, 2], [2, 0], [1, 2, 0]])


def test_layers_of_one_shape_share_the_workspace_in_a_bucket():
    # Two C4 layers of the same shape (one workspace), each with its own caches, captured in one bucket:
    # each replayed layer reads its own intermediates (the second overwrites the shared buffers only
    # after the first is done).
    d = dims(4)
    run = Run(d, torch.float32, nreq=3)
    run.step([0, 1, 2], [22, 13, 30])
    kv2 = [None if t is None else t.clone() for t in run.kv]
    impl2 = run.make_impl(layer_index=1)
    run.impl = run.make_impl(layer_index=0)
    bk = Bucket(run, B=4, q=1, impls=[run.impl, impl2], kvs=[run.kv, kv2])
    bk.capture([0, 1, 2])
    for reqs in ([0, 1, 2], [1, 2], [2, 0, 1]):
        S, qsl = bk.replay(reqs)
        n = len(reqs)
        check_step(run, reqs, [1] * n, bk.outs[0], qsl, S, run.impl.last_topk[:n])
        torch.testing.assert_close(bk.outs[1], bk.outs[0], atol=1e-6, rtol=1e-6)
    for a, b in zip(run.kv, kv2):
        if a is not None:
            torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)
    for b in range(3):
        check_caches(run, b)


def test_index_cache_layers_replay():
    # A use_index_cache C4 layer stores its top-k in the TopkBuffer during the replay; a skip_topk layer
    # captured after it reads the stored selection.
    d = dims(4)
    run = Run(d, torch.float32, nreq=3, use_topk=True)
    run.impl = run.make_impl(use_index_cache=True, layer_index=0)
    run.step([0, 1, 2], [22, 13, 30])
    skip = run.make_impl(skip_topk=True, layer_index=1)
    kv2 = [None if t is None else t.clone() for t in run.kv]
    bk = Bucket(run, B=4, q=1, impls=[run.impl, skip], kvs=[run.kv, kv2])
    st, md, _, _ = bk.build([0, 1, 2], capture=True)
    with bk.g.capture(bk.n):
        for impl, kv, out in zip(bk.impls, bk.kvs, bk.outs):
            impl.forward(bk.hidden, kv, st, md["swa"], out, topk_buffer=run.topk, **group_kw(4, md, st))
    for reqs in ([0, 1, 2], [2, 1]):
        S, qsl = bk.replay(reqs)
        n = len(reqs)
        assert torch.equal(run.topk.buffer[:n], run.impl.last_topk[:n, 0])
        check_step(run, reqs, [1] * n, bk.outs[0], qsl, S, run.impl.last_topk[:n])
        # the same weights and caches of the same contents: the skip layer's output equals the first's
        torch.testing.assert_close(bk.outs[1], bk.outs[0], atol=1e-6, rtol=1e-6)


def test_builders_make_the_per_step_rows_at_stable_addresses():
    # compressor_metadata's rows (per compressed group) and the -sin rows are the builders', at the same
    # address for a given size, holding each step's values.
    d = dims(4)
    run = Run(d, torch.float32, nreq=2)
    run.step([0, 1], [17, 9])
    seen = None
    for _ in range(3):
        st, md, S, qsl = run.build([0, 1], [1, 1])
        g = md["c4_kv"]
        ptrs = (st.neg_sin.data_ptr(), g.neg_sin.data_ptr(), g.compressed_cos.data_ptr(),
                g.compressed_slots.data_ptr(), md["c4_indexer_k"].compressed_sin.data_ptr())
        assert seen is None or ptrs == seen
        seen = ptrs
        assert torch.equal(st.neg_sin, -st.sin) and torch.equal(g.neg_sin, -st.compress_sin)
        assert md["swa"].compressed_cos is None
        # the group's compressed-row slots are what the host plan computed
        assert torch.equal(g.compressed_slots, g.slot_mapping)
        run.S = S


def test_capture_refuses_prefill_and_wrong_sizes_before_writing():
    d = dims(4)
    run = Run(d, torch.float32, nreq=3)
    run.step([0, 1, 2], [22, 13, 30])
    bk = Bucket(run, B=4, q=1)
    snap = [t.clone() for t in caches(run)]
    # a prefill step
    st, md, _, _ = run.build([0, 1], [5, 3])
    hid = torch.zeros(8, d.hidden)
    with bk.g.capture(8):
        with pytest.raises(NotImplementedError, match="DecodeOnly and SpecDecoding"):
            run.impl.forward(hid, run.kv, st, md["swa"], torch.zeros_like(hid), **group_kw(4, md, st))
    # hidden / the step not padded to the bucket
    st, md, _, _ = bk.build([0, 1, 2], capture=True)
    with bk.g.capture(bk.n + 1):
        with pytest.raises(ValueError, match="bucket 5 needs hidden of 5 rows"):
            run.impl.forward(bk.hidden, run.kv, st, md["swa"], bk.outs[0], **group_kw(4, md, st))
    for a, b in zip(snap, caches(run)):
        assert torch.equal(a, b)


def test_update_refuses_steps_that_do_not_fit_the_bucket():
    d = dims(128)
    run = Run(d, torch.float32, nreq=3)
    run.step([0, 1, 2], [22, 13, 30])
    bk = Bucket(run, B=3, q=1)
    bk.capture([0, 1, 2])
    snap = [t.clone() for t in caches(run)]
    # a step larger than the bucket (more tokens), more requests, another block-table width
    st, md, _, _ = bk.build([0, 1, 2], num_input_tokens=bk.n + 2)
    with pytest.raises(ValueError, match="captured for 3 tokens of 3 requests"):
        aar.dsa.graph_update(bk.g, bk.n, st, md["swa"])
    st, md, _, _ = bk.build([0, 1], B=2)
    with pytest.raises(ValueError, match="captured for 3 tokens of 3 requests"):
        aar.dsa.graph_update(bk.g, bk.n, st, md["swa"])
    st, md, _, _ = bk.build([0, 1, 2], width=50)
    with pytest.raises(ValueError, match="block table of another width"):
        aar.dsa.graph_update(bk.g, bk.n, st, md["swa"])
    with pytest.raises(ValueError, match="no graph is captured for num_tokens=7"):
        aar.dsa.graph_update(bk.g, 7, st, md["swa"])
    for a, b in zip(snap, caches(run)):
        assert torch.equal(a, b)
    # and a fitting step replays
    S, qsl = bk.replay([2, 0, 1])
    check_step(run, [2, 0, 1], [1, 1, 1], bk.outs[0], qsl, S)


def test_update_refuses_a_step_with_prefills_that_fits_the_bucket():
    # A SpecDecoding bucket of 2 requests x 2 tokens; a step of 2 requests holding 4 tokens, one of them a
    # prefill (3 tokens > decode_threshold 2), fits the bucket's sizes: the update refuses it by name, nothing
    # written, and a fitting decode step still replays (docs/design/sparse_cp.md §13.4).
    d = dims(1)
    run = Run(d, torch.float32, nreq=2, k=1)
    run.step([0, 1], [7, 5])
    bk = Bucket(run, B=2, q=2)
    bk.capture([0, 1])
    snap = [t.clone() for t in caches(run)]
    st, md, _, _ = run.build([0, 1], [1, 3])
    assert st.num_prefills == 1
    with pytest.raises(NotImplementedError, match="captured for a decode-only step; the step has 1 prefill"):
        aar.dsa.graph_update(bk.g, bk.n, st, md["swa"])
    for a, b in zip(snap, caches(run)):
        assert torch.equal(a, b)
    S, qsl = bk.replay([1, 0])
    check_step(run, [1, 0], [2, 2], bk.outs[0], qsl, S)
