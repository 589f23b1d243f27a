"""Graph mode (docs/design/graph.md §1): capture at a bucket, then per step update the
captured calls from the step's metadata and replay. On CPU the recording provider
re-issues the recorded calls; every replay must equal an eager run of the same
batch and the float64 reference."""

import math
import weakref

import pytest
import torch

import ascend_attn_rt as aar
from _reference import reference_attention

S = aar.AttentionState
N, NKV, D, BS, NB = 8, 2, 32, 16, 96
BUCKET = 8
SCALE = 1.0 / math.sqrt(D)


class Model:
    """A few attention layers over their own paged caches, with per-request
    dense K/V history for the reference."""

    def __init__(self, gen, layer_indices=(0, 1, 2), impl_kw=None, dtype=torch.float32, heads=None):
        self.gen = gen
        self.dtype = dtype
        heads = heads or [N] * len(layer_indices)
        self.impls = [
            aar.AttentionImpl(h, D, num_kv_heads=NKV, layer_index=li, **(impl_kw or {}))
            for h, li in zip(heads, layer_indices)
        ]
        self.heads = heads
        self.caches = [(torch.zeros(NB, BS, NKV, D, dtype=dtype), torch.zeros(NB, BS, NKV, D, dtype=dtype))
                       for _ in self.impls]
        self.builder = aar.MetadataBuilder(max_num_reqs=16, max_num_tokens=64, max_blocks_per_req=8,
                                           block_size=BS, num_blocks=NB)
        # Static graph buffers (stable addresses, as a captured graph needs).
        self.q = [torch.zeros(BUCKET, h, D, dtype=dtype) for h in heads]
        self.k = [torch.zeros(BUCKET, NKV, D, dtype=dtype) for _ in heads]
        self.v = [torch.zeros(BUCKET, NKV, D, dtype=dtype) for _ in heads]
        self.out = [torch.zeros(BUCKET, h, D, dtype=dtype) for h in heads]

    def block_table(self, num_reqs):
        # Request r owns blocks [1 + 8r, 9 + 8r): block 0 stays a padding target.
        return (torch.arange(num_reqs * 8, dtype=torch.int32) + 1).view(num_reqs, 8)

    def meta(self, q_lens, seq_lens, *, num_input_tokens=0, capture=False, state=None):
        qsl = torch.tensor([0] + list(torch.tensor(q_lens).cumsum(0).tolist()), dtype=torch.int32)
        seq = torch.tensor(seq_lens, dtype=torch.int32)
        bt = self.block_table(len(q_lens))
        if capture:
            return self.builder.build_for_graph_capture(qsl, seq, bt, num_input_tokens=num_input_tokens,
                                                        state=state or S.DecodeOnly)
        return self.builder.build(qsl, seq, bt, num_input_tokens=num_input_tokens, attn_state=state)

    def capture(self, g, md):
        with g.capture(BUCKET):
            for i, impl in enumerate(self.impls):
                kc, vc = self.caches[i]
                impl.forward(self.q[i], self.k[i], self.v[i], kc, vc, md, self.out[i])

    def step_inputs(self, n_tokens):
        qs = [torch.randn(n_tokens, h, D, generator=self.gen).to(self.dtype) for h in self.heads]
        ks = [torch.randn(n_tokens, NKV, D, generator=self.gen).to(self.dtype) for _ in self.heads]
        vs = [torch.randn(n_tokens, NKV, D, generator=self.gen).to(self.dtype) for _ in self.heads]
        return qs, ks, vs

    def load_static(self, qs, ks, vs):
        for i in range(len(self.impls)):
            n = qs[i].shape[0]
            for buf, src in ((self.q[i], qs[i]), (self.k[i], ks[i]), (self.v[i], vs[i])):
                buf.zero_()
                buf[:n].copy_(src)


def eager(model, md, qs, ks, vs, caches):
    outs = []
    for i, impl in enumerate(model.impls):
        out = torch.full((BUCKET, model.heads[i], D), 7.0, dtype=model.dtype)
        q = torch.zeros(BUCKET, model.heads[i], D, dtype=model.dtype)
        k = torch.zeros(BUCKET, NKV, D, dtype=model.dtype)
        v = torch.zeros(BUCKET, NKV, D, dtype=model.dtype)
        n = qs[i].shape[0]
        q[:n], k[:n], v[:n] = qs[i], ks[i], vs[i]
        eager_impl = aar.AttentionImpl(model.heads[i], D, num_kv_heads=NKV)
        eager_impl.forward(q, k, v, caches[i][0], caches[i][1], md, out)
        outs.append(out)
    return outs


def prefill_history(model, seq_lens):
    """Write random context K/V for each request directly into every layer's cache."""
    hist = []
    for i in range(len(model.impls)):
        per_req = []
        bt = model.block_table(len(seq_lens))
        for r, s in enumerate(seq_lens):
            k = torch.randn(s, NKV, D, generator=model.gen).to(model.dtype)
            v = torch.randn(s, NKV, D, generator=model.gen).to(model.dtype)
            for p in range(s):
                blk, off = int(bt[r, p // BS]), p % BS
                model.caches[i][0][blk, off] = k[p]
                model.caches[i][1][blk, off] = v[p]
            per_req.append((k, v))
        hist.append(per_req)
    return hist


# Steps replayed through one bucket-8 graph: (query lens, context lens before the step).
STEPS = [
    ([1] * 8, [5, 9, 17, 33, 2, 40, 11, 3]),         # 8 decodes, exactly the bucket
    ([1] * 5, [12, 30, 7, 50, 21]),                  # 5 decodes padded to 8 (dummy request)
    ([1, 1, 6], [20, 35, 9]),                        # mixed: 2 decodes + a 6-token chunk
    ([4, 4], [16, 28]),                              # speculative-style 4-token queries
]


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(1234)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_replay_equals_eager_and_reference(gen, dtype):
    model = Model(gen, layer_indices=(10, 2, 5), dtype=dtype)
    g = aar.GraphParams("recording")
    md_cap = model.meta([1] * BUCKET, [16] * BUCKET, capture=True)
    model.capture(g, md_cap)
    # Capture records, it does not run: nothing was written to the caches.
    assert all(float(kc.abs().sum()) == 0 for kc, _ in model.caches)
    assert [c[1] for c in g.calls(BUCKET)] == [2, 2, 5, 5, 10, 10]
    assert [c[0] for c in g.calls(BUCKET)] == ["kv_write", "fia"] * 3

    for q_lens, ctx in STEPS:
        for i in range(len(model.impls)):
            model.caches[i][0].zero_()
            model.caches[i][1].zero_()
        hist = prefill_history(model, ctx)
        seq = [c + q for c, q in zip(ctx, q_lens)]
        n = sum(q_lens)
        md = model.meta(q_lens, seq, num_input_tokens=BUCKET)
        assert md.num_kernel_tokens == BUCKET
        qs, ks, vs = model.step_inputs(n)
        eager_caches = [(kc.clone(), vc.clone()) for kc, vc in model.caches]
        expected_eager = eager(model, md, qs, ks, vs, eager_caches)

        model.load_static(qs, ks, vs)
        g.clear_update_log()
        g.update(BUCKET, md)
        # Updates run in layer order (10, 2, 5 captured -> 2, 5, 10 updated).
        assert len(g.update_log) == 3  # one update per captured attention call
        g.replay(BUCKET)

        tol = dict(atol=2e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=1e-2, rtol=1e-2)
        for i in range(len(model.impls)):
            torch.testing.assert_close(model.out[i][:n], expected_eager[i][:n], atol=1e-6, rtol=0)
            assert torch.equal(model.caches[i][0], eager_caches[i][0])
            k_full = [torch.cat([hist[i][r][0], ks[i][sum(q_lens[:r]):sum(q_lens[: r + 1])]]) for r in range(len(q_lens))]
            v_full = [torch.cat([hist[i][r][1], vs[i][sum(q_lens[:r]):sum(q_lens[: r + 1])]]) for r in range(len(q_lens))]
            ref = reference_attention(qs[i].double(), [x.double() for x in k_full], [x.double() for x in v_full],
                                      q_lens, scale=SCALE)
            torch.testing.assert_close(model.out[i][:n].double(), ref, **tol)


def test_update_order_follows_layer_index(gen):
    model = Model(gen, layer_indices=(10, 2, 5))
    g = aar.GraphParams("recording")
    model.capture(g, model.meta([1] * BUCKET, [16] * BUCKET, capture=True))
    g.clear_update_log()
    g.update(BUCKET, model.meta([1] * BUCKET, [20] * BUCKET))
    # Task handles were assigned in capture order (layer 10 -> 1, 2 -> 2, 5 -> 3).
    assert g.update_log == [2, 3, 1]


def test_batch_that_does_not_fit_is_rejected(gen):
    model = Model(gen)
    g = aar.GraphParams("recording")
    model.capture(g, model.meta([1] * BUCKET, [16] * BUCKET, capture=True))
    with pytest.raises(ValueError, match="pad the batch"):
        g.update(BUCKET, model.meta([1] * 5, [9] * 5))  # 5 tokens, not padded to 8
    with pytest.raises(ValueError, match="num_tokens=16"):
        g.update(16, model.meta([1] * BUCKET, [9] * BUCKET))  # no such bucket
    # The rejected update recorded nothing: the replay refuses to run stale calls.
    with pytest.raises(ValueError, match="before update"):
        g.replay(BUCKET)


def _other_builder():
    return aar.MetadataBuilder(max_num_reqs=16, max_num_tokens=64, max_blocks_per_req=8, block_size=BS, num_blocks=NB)


def test_update_with_another_builders_metadata_is_refused(gen):
    # docs/design/graph.md §1.2: the captured KV writes read the slot mapping of the builder whose
    # metadata the capture used; a step of another builder would leave them writing that builder's
    # last slots. The update refuses it before touching anything.
    model = Model(gen)
    g = aar.GraphParams("recording")
    model.capture(g, model.meta([1] * BUCKET, [16] * BUCKET, capture=True))
    prefill_history(model, [20] * BUCKET)
    seq = torch.full((BUCKET,), 21, dtype=torch.int32)
    foreign = _other_builder().build(torch.arange(BUCKET + 1, dtype=torch.int32), seq, model.block_table(BUCKET))
    with pytest.raises(ValueError, match=r"metadata\[0\] comes from another metadata builder"):
        g.update(BUCKET, foreign)
    with pytest.raises(ValueError, match="before update"):
        g.replay(BUCKET)  # nothing was refreshed
    with pytest.raises(ValueError, match="none of whose metadata"):
        g.update_draft(BUCKET, [model.meta([1] * BUCKET, [21] * BUCKET), foreign])
    # The capturing builder's step still updates and replays like eager.
    md = model.meta([1] * BUCKET, [21] * BUCKET)
    qs, ks, vs = model.step_inputs(BUCKET)
    expected = eager(model, md, qs, ks, vs, [(kc.clone(), vc.clone()) for kc, vc in model.caches])
    _update_replay_and_compare(model, g, md, (qs, ks, vs), expected)


def _update_replay_and_compare(model, g, md, inputs, expected):
    model.load_static(*inputs)
    g.update(BUCKET, md)
    g.replay(BUCKET)
    for i in range(len(model.impls)):
        torch.testing.assert_close(model.out[i], expected[i], atol=1e-6, rtol=0)


def test_update_of_calls_that_read_only_the_step_takes_any_builder(gen):
    # KV-sharing layers capture no KV write: their fused calls take the block table and lengths from
    # the step itself, so a step of another builder is served (as update_draft's per-step builders).
    model = Model(gen, impl_kw=dict(kv_sharing=True))
    g = aar.GraphParams("recording")
    model.capture(g, model.meta([1] * BUCKET, [16] * BUCKET, capture=True))
    prefill_history(model, [20] * BUCKET)
    seq = torch.full((BUCKET,), 20, dtype=torch.int32)
    foreign = _other_builder().build(torch.arange(BUCKET + 1, dtype=torch.int32), seq, model.block_table(BUCKET))
    qs, ks, vs = model.step_inputs(BUCKET)
    expected = [torch.zeros(BUCKET, N, D) for _ in model.impls]
    for i, (kc, vc) in enumerate(model.caches):
        aar.AttentionImpl(N, D, num_kv_heads=NKV, kv_sharing=True).forward(qs[i], ks[i], vs[i], kc, vc, foreign,
                                                                            expected[i])
    _update_replay_and_compare(model, g, foreign, (qs, ks, vs), expected)


def test_a_group_captured_with_two_builders_is_refused_at_update(gen):
    model = Model(gen, layer_indices=(0, 1))
    other = _other_builder()
    mds = [model.meta([1] * BUCKET, [16] * BUCKET, capture=True),
           other.build_for_graph_capture(torch.arange(BUCKET + 1, dtype=torch.int32),
                                         torch.full((BUCKET,), 16, dtype=torch.int32), model.block_table(BUCKET),
                                         state=S.DecodeOnly)]
    g = aar.GraphParams("recording")
    with g.capture(BUCKET):
        for i, impl in enumerate(model.impls):
            impl.forward(model.q[i], model.k[i], model.v[i], *model.caches[i], mds[i], model.out[i])
    with pytest.raises(ValueError, match="captured with the metadata of 2 builders"):
        g.update(BUCKET, model.meta([1] * BUCKET, [16] * BUCKET))


def test_replay_without_update_is_rejected(gen):
    model = Model(gen)
    g = aar.GraphParams("recording")
    model.capture(g, model.meta([1] * BUCKET, [16] * BUCKET, capture=True))
    g.update(BUCKET, model.meta([1] * BUCKET, [16] * BUCKET))
    g.replay(BUCKET)
    with pytest.raises(ValueError, match="before update"):
        g.replay(BUCKET)


def test_release_drops_records_and_workspaces(gen):
    model = Model(gen)
    g = aar.GraphParams("recording")
    model.capture(g, model.meta([1] * BUCKET, [16] * BUCKET, capture=True))
    ws, _ = g.workspaces(BUCKET)
    ws_ref = weakref.ref(ws)
    del ws
    assert g.live_events == 3 and g.has(BUCKET)
    with pytest.raises(ValueError, match="already captured"):
        g.begin_capture(BUCKET)
    g.release(BUCKET)
    assert not g.has(BUCKET) and g.live_events == 0 and g.buckets() == []
    import gc

    gc.collect()
    assert ws_ref() is None, "the bucket's workspace outlived the released graph"
    model.capture(g, model.meta([1] * BUCKET, [16] * BUCKET, capture=True))  # capturable again
    assert g.has(BUCKET)


def test_failed_capture_drops_the_bucket(gen):
    model = Model(gen)
    g = aar.GraphParams("recording")
    md = model.meta([8], [8], state=S.PrefillNoCache)
    with pytest.raises(NotImplementedError, match="graph capture"):
        model.capture(g, md)
    assert not g.has(BUCKET) and not g.capturing


def test_paged_attention_capture(gen):
    model = Model(gen, impl_kw=dict(full_decode_only_graph=True, pa_shape_list=[BUCKET]))
    g = aar.GraphParams("recording")
    model.capture(g, model.meta([1] * BUCKET, [16] * BUCKET, capture=True))
    assert [c[0] for c in g.calls(BUCKET)] == ["kv_write", "paged_attention"] * 3
    ctx = [5, 9, 17, 33, 2, 40, 11, 3]
    prefill_history(model, ctx)
    md = model.meta([1] * 8, [c + 1 for c in ctx])
    qs, ks, vs = model.step_inputs(8)
    eager_caches = [(kc.clone(), vc.clone()) for kc, vc in model.caches]
    expected = eager(model, md, qs, ks, vs, eager_caches)
    model.load_static(qs, ks, vs)
    g.update(BUCKET, md)
    g.replay(BUCKET)
    for i in range(3):
        torch.testing.assert_close(model.out[i], expected[i], atol=1e-6, rtol=0)
    _, pa_ws = g.workspaces(BUCKET)
    assert pa_ws is not None
    # Paged attention takes one token per request: a padded batch does not fit.
    with pytest.raises(ValueError, match="one-token requests"):
        g.update(BUCKET, model.meta([1] * 5, [9] * 5, num_input_tokens=BUCKET))


def test_sinks_capture(gen):
    sinks = torch.linspace(-2, 3, N)
    model = Model(gen, impl_kw=dict(sinks=sinks))
    g = aar.GraphParams("recording")
    model.capture(g, model.meta([1] * BUCKET, [16] * BUCKET, capture=True))
    assert [c[0] for c in g.calls(BUCKET)] == ["kv_write", "fia_v2"] * 3
    ctx = [5, 9, 17, 33, 2]
    prefill_history(model, ctx)
    md = model.meta([1] * 5, [c + 1 for c in ctx], num_input_tokens=BUCKET)
    qs, ks, vs = model.step_inputs(5)
    eager_caches = [(kc.clone(), vc.clone()) for kc, vc in model.caches]
    outs = []
    for i in range(3):
        out = torch.zeros(BUCKET, N, D)
        q = torch.zeros(BUCKET, N, D); k = torch.zeros(BUCKET, NKV, D); v = torch.zeros(BUCKET, NKV, D)
        q[:5], k[:5], v[:5] = qs[i], ks[i], vs[i]
        aar.AttentionImpl(N, D, num_kv_heads=NKV, sinks=sinks).forward(q, k, v, *eager_caches[i], md, out)
        outs.append(out)
    model.load_static(qs, ks, vs)
    g.update(BUCKET, md)
    g.replay(BUCKET)
    for i in range(3):
        torch.testing.assert_close(model.out[i][:5], outs[i][:5], atol=1e-6, rtol=0)


def test_draft_update_cycles_metadata(gen):
    # Two captured layers stand for two draft steps; each step has its own lengths.
    # KV-sharing layers (no cache write) keep the steps' slot mappings out of it.
    model = Model(gen, layer_indices=(0, 1), impl_kw=dict(kv_sharing=True))
    g = aar.GraphParams("recording")
    model.capture(g, model.meta([1] * BUCKET, [16] * BUCKET, capture=True))
    prefill_history(model, [20] * 8)
    b2 = aar.MetadataBuilder(max_num_reqs=16, max_num_tokens=64, max_blocks_per_req=8, block_size=BS, num_blocks=NB)
    md_a = model.meta([1] * 8, [10] * 8)
    md_b = b2.build(torch.arange(9, dtype=torch.int32), torch.full((8,), 21, dtype=torch.int32), model.block_table(8))
    qs, ks, vs = model.step_inputs(8)
    model.load_static(qs, ks, vs)
    g.update_draft(BUCKET, [md_a, md_b])
    # Reference per layer with its own metadata.
    expected = []
    for i, md in enumerate([md_a, md_b]):
        kc, vc = (c.clone() for c in model.caches[i])
        out = torch.zeros(BUCKET, N, D)
        aar.AttentionImpl(N, D, num_kv_heads=NKV, kv_sharing=True).forward(qs[i], ks[i], vs[i], kc, vc, md, out)
        expected.append(out)
    g.replay(BUCKET)
    assert [c[0] for c in g.calls(BUCKET)] == ["fia", "fia"]
    for i in range(2):
        torch.testing.assert_close(model.out[i], expected[i], atol=1e-6, rtol=0)
    assert not torch.allclose(expected[0], expected[1])  # the two steps really differ


@pytest.mark.parametrize("use_max,expect", [(False, "first"), (True, "max")])
def test_workspace_policies(gen, use_max, expect):
    # Layers with 4 and 8 query heads ask for different workspace sizes.
    model = Model(gen, layer_indices=(0, 1), heads=[4, 8])
    g = aar.GraphParams("recording", use_max_workspace=use_max)
    md = model.meta([1] * BUCKET, [16] * BUCKET, capture=True)
    ws_sizes = []
    for h in (4, 8):
        q = torch.zeros(BUCKET, h, D)
        t = aar.GraphParams("recording")
        with t.capture(BUCKET):
            aar.AttentionImpl(h, D, num_kv_heads=NKV).forward(q, None, None, *model.caches[0], md, torch.zeros_like(q))
        ws_sizes.append(t.workspaces(BUCKET)[0].numel())
    assert ws_sizes[0] != ws_sizes[1]
    model.capture(g, md)
    got = g.workspaces(BUCKET)[0].numel()
    assert got == (ws_sizes[0] if expect == "first" else max(ws_sizes))


def test_python_hooks_drive_capture_and_update(gen):
    log = []

    class Event:
        pass

    events = []

    def create_event():
        e = Event()
        events.append(weakref.ref(e))
        log.append("create_event")
        return e

    model = Model(gen, layer_indices=(0, 1))
    g = aar.GraphParams(
        "hooks",
        create_event=create_event,
        event_wait_and_reset=lambda e: log.append("wait_reset"),
        task_group_begin=lambda: log.append("group_begin"),
        task_group_end=lambda: (log.append("group_end"), object())[1],
        task_update_begin=lambda t: log.append("update_begin"),
        task_update_end=lambda: log.append("update_end"),
        event_record=lambda e: log.append("record"),
    )
    model.capture(g, model.meta([1] * BUCKET, [16] * BUCKET, capture=True))
    assert log == ["create_event", "wait_reset", "group_begin", "group_end"] * 2
    log.clear()
    g.update(BUCKET, model.meta([1] * BUCKET, [20] * BUCKET))
    assert log == ["update_begin", "update_end", "record"] * 2
    with pytest.raises(ValueError, match="replays on the device"):
        g.replay(BUCKET)
    assert all(r() is not None for r in events)  # kept alive by the store
    g.release(BUCKET)
    import gc

    gc.collect()
    assert all(r() is None for r in events)  # released with the bucket


def test_paged_attention_padded_decode_with_uniform_dummies(gen):
    """A decode batch smaller than the bucket is padded with one-token dummy
    requests (docs/design/gqa.md §2.5 uniform case), so the paged-attention graph replays it."""
    model = Model(gen, impl_kw=dict(full_decode_only_graph=True, pa_shape_list=[BUCKET]))
    model.builder = aar.MetadataBuilder(max_num_reqs=16, max_num_tokens=64, max_blocks_per_req=8, block_size=BS,
                                        num_blocks=NB, uniform_decode_padding=True)
    g = aar.GraphParams("recording")
    model.capture(g, model.meta([1] * BUCKET, [16] * BUCKET, capture=True))
    ctx = [12, 30, 7, 50, 21]
    prefill_history(model, ctx)
    md = model.meta([1] * 5, [c + 1 for c in ctx], num_input_tokens=BUCKET)
    assert md.num_kernel_reqs == BUCKET and md.num_reqs == 5
    assert md.actual_seq_lengths_q == list(range(1, BUCKET + 1))
    assert md.seq_lens_list[5:] == [1, 1, 1]
    assert md.block_tables[5:].abs().sum() == 0
    assert md.slot_mapping[5:].tolist() == [-1, -1, -1]
    qs, ks, vs = model.step_inputs(5)
    eager_caches = [(kc.clone(), vc.clone()) for kc, vc in model.caches]
    expected = eager(model, md, qs, ks, vs, eager_caches)
    model.load_static(qs, ks, vs)
    g.update(BUCKET, md)
    g.replay(BUCKET)
    for i in range(3):
        torch.testing.assert_close(model.out[i][:5], expected[i][:5], atol=1e-6, rtol=0)
        assert torch.equal(model.caches[i][0], eager_caches[i][0])  # dummies wrote nothing


def test_c8_decode_capture_replays_like_eager(gen):
    """C8 (INT8 NZ cache) decode graph: the quantise + NZ write is a captured
    prepare call, the BNSD decode a fused call refreshed per step."""
    d, nkv, n_heads, bs, nb = 64, 2, 8, 32, 40
    scale = torch.rand(1, nkv, d, generator=gen) * 0.02 + 0.01
    offset = torch.randint(-5, 6, (1, nkv, d), generator=gen).float()
    kw = dict(k_scale=scale, k_offset=offset, v_scale=scale * 1.3, v_offset=-offset, num_kv_heads=nkv)
    builder = aar.MetadataBuilder(max_num_reqs=16, max_num_tokens=64, max_blocks_per_req=4, block_size=bs,
                                  num_blocks=nb, uniform_decode_padding=True)
    layers = [aar.C8AttentionImpl(n_heads, d, layer_index=i, **kw) for i in range(2)]
    caches = [(torch.zeros(nb, nkv, d // 32, bs, 32, dtype=torch.int8),
               torch.zeros(nb, nkv, d // 32, bs, 32, dtype=torch.int8)) for _ in layers]
    q_s = torch.zeros(BUCKET, n_heads, d)
    k_s = torch.zeros(BUCKET, nkv, d)
    v_s = torch.zeros(BUCKET, nkv, d)
    outs = [torch.zeros(BUCKET, n_heads, d) for _ in layers]
    bt = (torch.arange(16 * 4, dtype=torch.int32) % (nb - 1) + 1).view(16, 4)

    def meta(seq, capture=False, pad=BUCKET):
        b = len(seq)
        qsl = torch.arange(b + 1, dtype=torch.int32)
        s = torch.tensor(seq, dtype=torch.int32)
        if capture:
            return builder.build_for_graph_capture(qsl, s, bt[:b].contiguous(), num_input_tokens=pad)
        return builder.build(qsl, s, bt[:b].contiguous(), num_input_tokens=pad)

    g = aar.GraphParams("recording")
    md = meta([8] * BUCKET, capture=True)
    with g.capture(BUCKET):
        for layer, (kc, vc), out in zip(layers, caches, outs):
            layer.forward(q_s, k_s, v_s, kc, vc, md, out)
    assert [c[0] for c in g.calls(BUCKET)] == ["prepare", "fia"] * 2
    for seq in ([9, 17, 40, 3, 70, 12, 5, 33], [20, 31, 7]):
        for kc, vc in caches:
            kc.random_(-100, 100, generator=gen)
            vc.random_(-100, 100, generator=gen)
        md = meta(seq)
        n = len(seq)
        q = torch.randn(n, n_heads, d, generator=gen)
        k = torch.randn(n, nkv, d, generator=gen)
        v = torch.randn(n, nkv, d, generator=gen)
        expected, eager_caches = [], []
        for i, layer in enumerate(layers):
            kc, vc = caches[i][0].clone(), caches[i][1].clone()
            out = torch.zeros(BUCKET, n_heads, d)
            qp, kp, vp = (torch.zeros(BUCKET, *t.shape[1:]) for t in (q, k, v))
            qp[:n], kp[:n], vp[:n] = q, k, v
            aar.C8AttentionImpl(n_heads, d, **kw).forward(qp, kp, vp, kc, vc, md, out)
            assert layer is not None
            expected.append(out)
            eager_caches.append((kc, vc))
        for t, src in ((q_s, q), (k_s, k), (v_s, v)):
            t.zero_()
            t[:n] = src
        g.update(BUCKET, md)
        g.replay(BUCKET)
        for i in range(2):
            torch.testing.assert_close(outs[i][:n], expected[i][:n], atol=1e-5, rtol=1e-5)
            assert torch.equal(caches[i][0], eager_caches[i][0]) and torch.equal(caches[i][1], eager_caches[i][1])


def test_torch_npu_hooks_follow_the_capture_and_update_protocol(gen):
    """The torch_npu adapter, against a stand-in for torch.npu that logs its calls."""
    from ascend_attn_rt.npu_graph import torch_npu_hooks

    log = []

    class FakeEvent:
        def wait(self, s):
            log.append(("wait", s))

        def reset(self, s):
            log.append(("reset", s))

        def record(self, s):
            log.append(("record", s))

    class FakeNpu:
        ExternalEvent = FakeEvent

        @staticmethod
        def graph_task_group_begin(s):
            log.append(("group_begin", s))

        @staticmethod
        def graph_task_group_end(s):
            log.append(("group_end", s))
            return "handle"

        @staticmethod
        def graph_task_update_begin(s, h):
            log.append(("update_begin", s, h))

        @staticmethod
        def graph_task_update_end(s):
            log.append(("update_end", s))

    model = Model(gen, layer_indices=(0,))
    g = aar.GraphParams("hooks", **torch_npu_hooks("capture_stream", "update_stream", npu=FakeNpu))
    model.capture(g, model.meta([1] * BUCKET, [16] * BUCKET, capture=True))
    attention_calls = [e for e in log if e[0] == "group_begin"]
    assert len(attention_calls) == 1
    assert log == [("wait", "capture_stream"), ("reset", "capture_stream"), ("group_begin", "capture_stream"),
                   ("group_end", "capture_stream")]
    log.clear()
    g.update(BUCKET, model.meta([1] * BUCKET, [20] * BUCKET))
    assert log == [("update_begin", "update_stream", "handle"), ("update_end", "update_stream"),
                   ("record", "update_stream")]


def test_torch_npu_hooks_launch_host_functions_on_the_captured_stream():
    """A captured host callback (docs/design/graph.md §1.5) goes to torch_npu's _launch_host_func on the capture
    stream; torch_npu calls fn(args), the runtime's callback takes no argument."""
    from ascend_attn_rt.npu_graph import torch_npu_hooks

    launched = []

    class FakeNpu:
        ExternalEvent = object

        @staticmethod
        def graph_task_group_begin(s):
            pass

        graph_task_group_end = graph_task_update_begin = graph_task_update_end = graph_task_group_begin

        @staticmethod
        def _launch_host_func(stream, fn, args):
            launched.append((stream, fn, args))

    hooks = torch_npu_hooks("capture_stream", "update_stream", npu=FakeNpu)
    ran = []
    hooks["launch_host_func"](lambda: ran.append(1))
    assert [(s, a) for s, _, a in launched] == [("capture_stream", None)]
    launched[0][1](launched[0][2])  # what torch_npu does at each replay
    assert ran == [1]


def test_torch_npu_hooks_need_torch_npu():
    from ascend_attn_rt.npu_graph import torch_npu_hooks

    if hasattr(torch, "npu") and hasattr(torch.npu, "graph_task_update_begin"):
        pytest.skip("torch_npu is loaded here")
    with pytest.raises(RuntimeError, match="torch_npu is not loaded"):
        torch_npu_hooks(None, None)
