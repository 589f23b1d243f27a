"""Issue 9 hardening, parts 2, 3, 5 and 6, through the Python facade:

* metadata lifetime: every build has a generation; a metadata object of an earlier build is stale and
  forward (GQA, C8, FA3, MLA), its list properties, graph update and update_draft reject it;
* staging buffers on the device path (separate buffers, used in turn) give the same metadata as the CPU path;
* attn_type decides causality and whether a layer has a cache;
* one capture policy: a forward that cannot be captured refuses inside a capture (FA3, no metadata);
* C8 producers validate their scales and keep none;
* the host work the split / FA3 / large-head / C8 paths did per layer is in the metadata of the build.
"""

import math

import pytest
import torch

import ascend_attn_rt as aar
from _harness import check_cache_unchanged, check_output, make_builder, make_impl, run_forward
from _mla_reference import MlaDims, rope_tables
from _reference import make_batch, new_output

S = aar.AttentionState
N, NKV, D, BS = 8, 2, 32, 16


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(2024)


def _batch(gen, seq=(19, 40, 30, 13), q=(1, 1, 6, 13), **kw):
    kw.setdefault("head_size", D)
    return make_batch(list(seq), list(q), num_heads=N, num_kv_heads=NKV, dtype=torch.float32, block_size=BS,
                      gen=gen, **kw)


def _build(builder, b, **kw):
    return builder.build(b.query_start_loc, b.seq_lens_t, b.block_table, num_input_tokens=b.num_input_tokens, **kw)


# ----------------------------------------------------------------------------- metadata lifetime


def test_each_build_is_a_new_generation(gen):
    b = _batch(gen)
    builder = make_builder(b)
    assert builder.generation == 0
    md1 = _build(builder, b)
    assert (md1.generation, builder.generation, md1.is_current) == (1, 1, True)
    md2 = _build(builder, b)
    assert md2 is not md1
    assert (md2.generation, md1.is_current, md2.is_current) == (2, False, True)


@pytest.mark.parametrize("prop", ["actual_seq_lengths_q", "seq_lens_list", "prefill_actual_seq_lengths_q"])
def test_stale_metadata_lists_are_not_read(gen, prop):
    b = _batch(gen)
    builder = make_builder(b)
    md1 = _build(builder, b)
    expected = getattr(md1, prop)
    _build(builder, _batch(gen, seq=(7,), q=(7,)))
    with pytest.raises(ValueError, match="stale"):
        getattr(md1, prop)
    assert expected  # it was readable while current


def test_stale_metadata_is_rejected_by_forward_before_any_write(gen):
    b = _batch(gen)
    builder = make_builder(b)
    stale = _build(builder, b)
    _build(builder, b)  # the same step again: the lists hold the same values, but the build is newer
    kc, vc = b.key_cache.clone(), b.value_cache.clone()
    out = new_output(b)
    with pytest.raises(ValueError, match="stale"):
        make_impl(b).forward(b.q, b.k, b.v, b.key_cache, b.value_cache, stale, out)
    assert torch.equal(kc, b.key_cache) and torch.equal(vc, b.value_cache)


def test_metadata_keeps_its_builder_alive(gen):
    b = _batch(gen)
    md = _build(make_builder(b), b)  # the builder object is dropped at once
    assert md.is_current and md.actual_seq_lengths_q == [1, 2, 8, 21]
    res_out = new_output(b)
    make_impl(b).forward(b.q, b.k, b.v, b.key_cache, b.value_cache, md, res_out)


def test_stale_metadata_rejected_by_c8_and_fa3(gen):
    b = _batch(gen)
    builder = make_builder(b, dense_context=True)
    stale = _build(builder, b)
    _build(builder, b)
    out = new_output(b)
    fa3 = aar.FA3AttentionImpl(N, D, num_kv_heads=NKV)
    with pytest.raises(ValueError, match="stale"):
        fa3.forward(b.q, b.k, b.v, b.key_cache, b.value_cache, stale, out)
    from test_c8 import make_builder as make_c8_builder, make_c8_batch, make_impl as make_c8_impl
    cb = make_c8_batch([19, 40], [1, 1], gen=gen)
    cbuilder = make_c8_builder(cb)
    cargs = (cb.qsl, cb.seq_lens_t, cb.block_table)
    cstale = cbuilder.build(*cargs)
    cbuilder.build(*cargs)
    kc = cb.key_cache.clone()
    with pytest.raises(ValueError, match="stale"):
        make_c8_impl(cb).forward(cb.q, cb.k, cb.v, cb.key_cache, cb.value_cache, cstale, torch.zeros_like(cb.q))
    assert torch.equal(kc, cb.key_cache)


def test_stale_mla_metadata_is_rejected():
    from test_mla import run_case
    md, impl, (nope, rope), ws, d, _ = run_case([9, 20], [1, 1])
    cos, sin = rope_tables(64, d.R)
    builder = aar.mla.MetadataBuilder(max_num_reqs=4, max_num_tokens=16, max_blocks_per_req=2, block_size=16,
                                      num_blocks=nope.shape[0], cos_table=cos.float(), sin_table=sin.float())
    args = (torch.tensor([0, 1, 2], dtype=torch.int32), torch.tensor([9, 20], dtype=torch.int32),
            torch.tensor([[0, 1], [2, 3]], dtype=torch.int32))
    stale = builder.build(*args)
    builder.build(*args)
    n0, r0 = nope.clone(), rope.clone()
    hidden = torch.randn(2, d.hidden)
    with pytest.raises(ValueError, match="stale"):
        impl.forward(hidden, nope, rope, stale, torch.zeros_like(hidden))
    with pytest.raises(ValueError, match="stale"):
        stale.decode_seq_lens_list
    assert torch.equal(n0, nope) and torch.equal(r0, rope)


class _GraphModel:
    """Two KV-sharing layers captured at bucket 4 (no cache writes: a replay only reads)."""

    def __init__(self, gen, provider="recording", **hooks):
        self.caches = [(torch.randn(32, BS, NKV, D, generator=gen), torch.randn(32, BS, NKV, D, generator=gen))
                       for _ in range(2)]
        self.impls = [aar.AttentionImpl(N, D, num_kv_heads=NKV, layer_index=i, kv_sharing=True) for i in range(2)]
        self.q = torch.randn(4, N, D, generator=gen)
        self.out = [torch.zeros(4, N, D) for _ in range(2)]
        self.builders = [aar.MetadataBuilder(max_num_reqs=8, max_num_tokens=16, max_blocks_per_req=4, block_size=BS,
                                             num_blocks=32) for _ in range(2)]
        self.g = aar.GraphParams(provider, **hooks)
        md = self.build(0, 10)
        with self.g.capture(4):
            for i, impl in enumerate(self.impls):
                impl.forward(self.q, None, None, *self.caches[i], md, self.out[i])

    def build(self, which, seq):
        table = torch.arange(16, dtype=torch.int32).view(4, 4)
        return self.builders[which].build(torch.arange(5, dtype=torch.int32), torch.full((4,), seq, dtype=torch.int32),
                                          table)


def test_graph_update_rejects_stale_metadata(gen):
    m = _GraphModel(gen)
    stale = m.build(0, 12)
    m.build(0, 13)
    with pytest.raises(ValueError, match=r"metadata\[0\] is stale"):
        m.g.update(4, stale)
    with pytest.raises(ValueError, match="replay of bucket 4 before update"):
        m.g.replay(4)  # the rejected update left no call updated


def test_update_draft_rejects_two_builds_of_one_builder(gen):
    m = _GraphModel(gen)
    md_a = m.build(0, 12)
    md_b = m.build(0, 20)  # same builder: md_a's lists now hold md_b's step
    with pytest.raises(ValueError, match=r"metadata\[0\] is stale"):
        m.g.update_draft(4, [md_a, md_b])
    # One builder per draft step: accepted, and each layer reads its own step.
    md_a = m.build(0, 12)
    m.g.update_draft(4, [md_a, md_b := m.build(1, 20)])
    m.g.replay(4)
    for i, md in enumerate((md_a, md_b)):
        ref = torch.zeros(4, N, D)
        aar.AttentionImpl(N, D, num_kv_heads=NKV, kv_sharing=True).forward(m.q, None, None, *m.caches[i], md, ref)
        torch.testing.assert_close(m.out[i], ref, atol=1e-6, rtol=0)


def test_update_draft_closes_the_task_update_when_a_launch_fails(gen):
    log = []

    class Handle:
        pass

    hooks = dict(create_event=lambda: Handle(), event_wait_and_reset=lambda e: None,
                 task_group_begin=lambda: None, task_group_end=lambda: Handle(),
                 task_update_begin=lambda t: log.append("begin"), task_update_end=lambda: log.append("end"),
                 event_record=lambda e: None)
    m = _GraphModel(gen, provider="hooks", **hooks)
    # A builder that believes in more blocks than the captured caches hold: the
    # update's relaunch reads block 40 of a 32-block cache and the operator throws.
    big = aar.MetadataBuilder(max_num_reqs=8, max_num_tokens=16, max_blocks_per_req=4, block_size=BS,
                              num_blocks=64)
    md = big.build(torch.arange(5, dtype=torch.int32), torch.full((4,), 10, dtype=torch.int32),
                   torch.full((4, 4), 40, dtype=torch.int32))
    log.clear()
    with pytest.raises(Exception):
        m.g.update_draft(4, [md])
    assert log and log.count("begin") == log.count("end"), log
    log.clear()
    with pytest.raises(Exception):
        m.g.update(4, md)
    assert log and log.count("begin") == log.count("end"), log


# ----------------------------------------------------------------------------- staging on the device path


@pytest.mark.parametrize("buffers", [1, 2, 3])
def test_separate_staging_buffers_give_the_same_metadata(gen, buffers):
    # Eager copies on the CPU: the alternating host buffers must hand out the
    # same metadata (and the same outputs) as the single aliased buffer.
    steps = [_batch(gen, num_blocks=24), _batch(gen, seq=(7, 33), q=(7, 1), num_blocks=24),
             _batch(gen, seq=(5, 6, 70), q=(1, 1, 1), num_blocks=24)]
    ref_builder = make_builder(steps[0], max_blocks_per_req=8)
    dev_builder = make_builder(steps[0], max_blocks_per_req=8, separate_device_buffers=True, staging_buffers=buffers)
    tensors = ["query_start_loc", "seq_lens", "block_tables", "slot_mapping"]
    for b in steps * 2:
        want = _build(ref_builder, b)
        got = _build(dev_builder, b)
        for name in tensors:
            assert torch.equal(getattr(got, name), getattr(want, name)), name
        assert got.actual_seq_lengths_q == want.actual_seq_lengths_q
        out = new_output(b)
        make_impl(b).forward(b.q, b.k, b.v, b.key_cache.clone(), b.value_cache.clone(), got, out)
        ref_out = new_output(b)
        make_impl(b).forward(b.q, b.k, b.v, b.key_cache.clone(), b.value_cache.clone(), want, ref_out)
        assert torch.equal(out, ref_out)


def test_device_path_block_table_staging_is_the_engines_own(gen):
    b = _batch(gen)
    builder = make_builder(b, separate_device_buffers=True)
    t = builder.block_table_staging
    t[: b.num_reqs, : b.block_table.shape[1]] = b.block_table
    md = builder.build(b.query_start_loc, b.seq_lens_t, t[: b.num_reqs])
    t.fill_(0)  # the engine rewrites its table at once
    assert torch.equal(md.block_tables[: b.num_reqs, : b.block_table.shape[1]], b.block_table)


def test_bad_staging_buffer_count():
    with pytest.raises(ValueError, match="staging_buffers"):
        aar.MetadataBuilder(max_num_reqs=4, max_num_tokens=16, max_blocks_per_req=4, block_size=16, num_blocks=8,
                            separate_device_buffers=True, staging_buffers=5)


# ----------------------------------------------------------------------------- attn_type


def test_decoder_layer_rejects_non_causal_metadata(gen):
    b = _batch(gen, seq=(5, 17), q=(5, 17))
    kc, vc = b.key_cache.clone(), b.value_cache.clone()
    with pytest.raises(ValueError, match="attn_type='decoder'.*causal=False"):
        run_forward(b, build_kw=dict(causal=False))
    assert torch.equal(kc, b.key_cache) and torch.equal(vc, b.value_cache)


@pytest.mark.parametrize("attn_type", ["encoder", "encoder_only"])
def test_encoder_layers_reject_causal_metadata(gen, attn_type):
    b = _batch(gen, seq=(5, 17), q=(5, 17))
    with pytest.raises(ValueError, match=f"attn_type='{attn_type}'.*causal=True"):
        run_forward(b, impl_kw=dict(attn_type=attn_type), caches=attn_type == "encoder_only")


@pytest.mark.parametrize("attn_type", ["encoder", "encoder_only"])
def test_encoder_layers_without_cache_attend_bidirectionally(gen, attn_type):
    b = _batch(gen, seq=(5, 17, 9), q=(5, 17, 9))
    res = run_forward(b, build_kw=dict(causal=False), impl_kw=dict(attn_type=attn_type), caches=False)
    assert res.impl.last_path == "encoder"
    check_output(b, res, causal=False)


def test_encoder_layer_rejects_a_cache(gen):
    b = _batch(gen, seq=(5, 17), q=(5, 17))
    kc = b.key_cache.clone()
    with pytest.raises(ValueError, match="attn_type='encoder' layers keep no KV cache"):
        run_forward(b, build_kw=dict(causal=False), impl_kw=dict(attn_type="encoder"))
    assert torch.equal(kc, b.key_cache)


def test_encoder_layer_rejects_requests_with_context(gen):
    b = _batch(gen, seq=(8, 17), q=(5, 17))
    with pytest.raises(ValueError, match="own new tokens only"):
        run_forward(b, build_kw=dict(causal=False), impl_kw=dict(attn_type="encoder"), caches=False)


def test_encoder_only_with_cache_writes_and_reads_it(gen):
    # Chunked encoder prefill: the second chunk attends the first one through the cache, bidirectionally.
    b = _batch(gen, seq=(8, 17), q=(5, 17))
    res = run_forward(b, state=S.ChunkedPrefill, build_kw=dict(causal=False), impl_kw=dict(attn_type="encoder_only"))
    assert res.impl.last_path == "fused_paged"
    check_output(b, res, causal=False)


def test_c8_and_fa3_follow_attn_type(gen):
    from test_c8 import make_c8_batch, run as run_c8
    cb = make_c8_batch([5, 17], [5, 17], gen=gen)
    with pytest.raises(ValueError, match="attn_type='decoder'"):
        run_c8(cb, build_kw=dict(causal=False))
    res = run_c8(cb, build_kw=dict(causal=False), impl_kw=dict(attn_type="encoder"), caches=False)
    assert res.impl.last_path == "encoder"
    b = make_batch([5, 17], [5, 17], num_heads=N, num_kv_heads=NKV, head_size=D, dtype=torch.float32, block_size=128,
                   gen=gen)
    builder = make_builder(b)
    md = _build(builder, b, causal=False)
    with pytest.raises(ValueError, match="attn_type='decoder'"):
        aar.FA3AttentionImpl(N, D, num_kv_heads=NKV).forward(b.q, b.k, b.v, b.key_cache, b.value_cache, md,
                                                            new_output(b))
    out = new_output(b)
    fa3 = aar.FA3AttentionImpl(N, D, num_kv_heads=NKV, attn_type="encoder")
    fa3.forward(b.q, b.k, b.v, None, None, md, out)
    assert fa3.last_path == "encoder"
    ref = b.reference(causal=False)
    torch.testing.assert_close(out[: b.num_actual_tokens].double(), ref.double(), atol=1e-5, rtol=1e-5)


# ----------------------------------------------------------------------------- one capture policy


def test_fa3_refuses_inside_a_capture(gen):
    b = _batch(gen, seq=(16, 16, 16, 16), q=(1, 1, 1, 1))
    md = _build(make_builder(b), b)
    out = new_output(b)
    g = aar.GraphParams("recording")
    kc = b.key_cache.clone()
    with pytest.raises(NotImplementedError, match="FA3"):
        with g.capture(4):
            aar.FA3AttentionImpl(N, D, num_kv_heads=NKV).forward(b.q, b.k, b.v, b.key_cache, b.value_cache, md, out)
    assert not g.has(4)  # the failed capture was dropped
    assert torch.equal(kc, b.key_cache)
    assert bool((out == new_output(b)).all())  # nothing ran


def test_forward_without_metadata_refuses_inside_a_capture(gen):
    from test_mla import run_case
    b = _batch(gen)
    _, mla_impl, _, _, d, _ = run_case([9], [1])
    hidden = torch.zeros(4, d.hidden)
    calls = [
        lambda: make_impl(b).forward(b.q, b.k, b.v, b.key_cache, b.value_cache, None, new_output(b)),
        lambda: aar.FA3AttentionImpl(N, D, num_kv_heads=NKV).forward(b.q, b.k, b.v, b.key_cache, b.value_cache,
                                                                    None, new_output(b)),
        lambda: mla_impl.forward(hidden, torch.zeros(4, 16, 1, d.L), torch.zeros(4, 16, 1, d.R), None,
                                 torch.ones_like(hidden)),
    ]
    for call in calls:
        g = aar.GraphParams("recording")
        with pytest.raises(NotImplementedError, match="cannot be captured"):
            with g.capture(8):
                call()
        call()  # outside a capture: zero fill


# ----------------------------------------------------------------------------- C8 producer


def test_c8_producer_keeps_no_scales_but_checks_them(gen):
    from test_c8 import make_c8_batch, make_impl as make_c8_impl
    cb = make_c8_batch([19, 40], [1, 1], gen=gen)
    impl = make_c8_impl(cb, kv_transfer="producer")
    assert impl.scales.k_scale is None  # a producer's cache is float: nothing prepared
    assert make_c8_impl(cb).scales.k_scale is not None
    with pytest.raises(ValueError, match="k_scale"):
        aar.C8AttentionImpl(cb.num_heads, cb.head_size, num_kv_heads=cb.num_kv_heads, kv_transfer="producer",
                            k_scale=torch.zeros(1), k_offset=cb.ko, v_scale=cb.vs, v_offset=cb.vo)


# ----------------------------------------------------------------------------- host work in build()


def _brute_dense(b, md):
    """The dense context of docs/design/gqa.md §4.5 / §5.5, written out: slots of every KV position, request by request."""
    kv = md.seq_lens_list
    slots, ends, tot = [], [], 0
    for r, s in enumerate(kv):
        row = md.block_tables[r]
        slots += [int(row[p // BS]) * BS + p % BS for p in range(s)]
        tot += s
        ends.append(tot)
    rows, start = [], 0
    q_ends = md.actual_seq_lengths_q
    for r in range(md.num_real_reqs):
        q0 = 0 if r == 0 else q_ends[r - 1]
        ql = q_ends[r] - q0
        rows += [start + kv[r] - ql + i for i in range(ql)]
        start += kv[r]
    return slots, ends, rows


@pytest.mark.parametrize("seq,q,pad", [((19, 40, 30, 13), (1, 1, 6, 13), 0), ((19, 40, 30), (1, 1, 6), 5),
                                       ((5, 9), (5, 9), 0), ((37, 5), (1, 1), 0)])
def test_dense_context_is_computed_by_the_build(gen, seq, q, pad):
    b = _batch(gen, seq=seq, q=q, num_input_tokens=sum(q) + pad)
    md = _build(make_builder(b, dense_context=True), b)
    slots, ends, rows = _brute_dense(b, md)
    assert md.dense_valid
    assert md.dense_slots.tolist() == slots
    assert md.dense_kv_ends == ends
    assert md.dense_token_rows.tolist() == rows
    nd, ndt = md.num_decodes, md.num_decode_tokens
    start = ends[nd - 1] if nd else 0
    assert md.dense_prefill_kv_ends == [e - start for e in ends[nd:]]
    assert md.dense_prefill_token_rows.tolist() == [r - start for r in rows[ndt:]]
    assert md.prefill_actual_seq_lengths_q == [e - ndt for e in md.actual_seq_lengths_q[nd:]]
    assert md.no_context == all(s == ql for s, ql in zip(seq, q))
    assert md.prefill_no_context == all(s == ql for s, ql in zip(seq[nd:], q[nd:]))


def test_dense_context_is_off_by_default(gen):
    b = _batch(gen)
    md = _build(make_builder(b), b)
    assert not md.dense_valid and md.dense_slots is None


def test_paths_that_need_the_dense_context_say_so(gen):
    # Computed on demand by default (see test_user_defects); refused by name when the builder is told never to.
    b = make_batch([19, 30], [1, 6], num_heads=2, num_kv_heads=1, head_size=512, dtype=torch.float32,
                   block_size=BS, gen=gen)
    kc = b.key_cache.clone()
    with pytest.raises(ValueError, match="dense_context=False"):
        run_forward(b, state=S.ChunkedPrefill, builder_kw=dict(dense_context=False))
    assert torch.equal(kc, b.key_cache)  # rejected before the cache write
    from test_c8 import make_c8_batch, run as run_c8
    cb = make_c8_batch([19, 40], [1, 6], gen=gen)
    kc = cb.key_cache.clone()
    with pytest.raises(ValueError, match="dense_context=False"):
        run_c8(cb, state=S.ChunkedPrefill, builder_kw=dict(dense_context=False))
    assert torch.equal(kc, cb.key_cache)
