"""Backend facts, block swaps/copies, masks, metadata fields for known batches,
attention-state derivation, the plan helpers and the zero-copy round trip."""

import math

import pytest
import torch

import ascend_attn_rt as aar
from _reference import SENTINEL, assert_close, make_batch

S = aar.AttentionState


# ----------------------------------------------------------------------------- static facts


def test_backend_name():
    assert aar.Backend.name() == "CUSTOM"


def test_supported_block_sizes():
    sizes = list(aar.Backend.supported_block_sizes())
    assert 128 in sizes
    assert sizes == [16, 32, 64, 128]


@pytest.mark.parametrize("args", [(10, 20, 30, 40), (1, 128, 8, 128), (8192, 128, 2, 64)])
def test_kv_cache_shape(args):
    nb, bs, nkv, d = args
    assert tuple(aar.Backend.kv_cache_shape(nb, bs, nkv, d)) == (2, nb, bs, nkv, d)


def _int(e):
    try:
        return int(e)
    except TypeError:
        return int(e.value)


def test_attention_state_values():
    states = [S.PrefillNoCache, S.PrefillCacheHit, S.DecodeOnly, S.ChunkedPrefill, S.SpecDecoding]
    assert [_int(s) for s in states] == [0, 1, 2, 3, 4]


# ----------------------------------------------------------------------------- swap / copy


def _blocks(nb=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(nb, 4, 2, 8, generator=g)


@pytest.mark.parametrize("idx_dtype", [torch.int64, torch.int32])
def test_swap_blocks_between_caches(idx_dtype):
    sk, sv, dk, dv = _blocks(seed=1), _blocks(seed=2), _blocks(seed=3), _blocks(seed=4)
    sk0, sv0, dk0, dv0 = sk.clone(), sv.clone(), dk.clone(), dv.clone()
    pairs = torch.tensor([[0, 5], [3, 1], [4, 4]], dtype=idx_dtype)
    aar.Backend.swap_blocks(sk, sv, dk, dv, pairs)
    ek, ev = dk0.clone(), dv0.clone()
    for s, d in pairs.tolist():
        ek[d] = sk0[s]
        ev[d] = sv0[s]
    assert torch.equal(dk, ek) and torch.equal(dv, ev)
    assert torch.equal(sk, sk0) and torch.equal(sv, sv0)  # sources untouched


def test_swap_blocks_same_cache_gathers_first():
    k, v = _blocks(seed=5), _blocks(seed=6)
    k0, v0 = k.clone(), v.clone()
    # Chain 0->1, 1->2, 2->0: each destination gets the pre-copy source.
    aar.Backend.swap_blocks(k, v, k, v, torch.tensor([[0, 1], [1, 2], [2, 0]]))
    for s, d in [(0, 1), (1, 2), (2, 0)]:
        assert torch.equal(k[d], k0[s]) and torch.equal(v[d], v0[s])
    assert torch.equal(k[3:], k0[3:]) and torch.equal(v[3:], v0[3:])


def test_swap_blocks_empty():
    k, v, dk, dv = _blocks(), _blocks(), _blocks(seed=9), _blocks(seed=10)
    dk0 = dk.clone()
    aar.Backend.swap_blocks(k, v, dk, dv, torch.zeros(0, 2, dtype=torch.int64))
    assert torch.equal(dk, dk0)


def test_copy_blocks_gather_then_scatter():
    layers = [(_blocks(seed=11), _blocks(seed=12)), (_blocks(seed=13), _blocks(seed=14))]
    orig = [(k.clone(), v.clone()) for k, v in layers]
    # Row 1 is both a destination (of 0) and a source (for 2): 2 must get the pre-copy row 1.
    pairs = torch.tensor([[0, 1], [1, 2], [4, 5]], dtype=torch.int64)
    ret = aar.Backend.copy_blocks(layers, pairs)
    assert ret is None
    for (k, v), (k0, v0) in zip(layers, orig):
        ek, ev = k0.clone(), v0.clone()
        for s, d in pairs.tolist():
            ek[d] = k0[s]
            ev[d] = v0[s]
        assert torch.equal(k, ek) and torch.equal(v, ev)


# ----------------------------------------------------------------------------- masks


def _builder(**kw):
    cfg = dict(max_num_reqs=8, max_num_tokens=32, max_blocks_per_req=4, block_size=16, num_blocks=16)
    cfg.update(kw)
    return aar.MetadataBuilder(**cfg)


def _known():
    qsl = torch.tensor([0, 1, 2, 6], dtype=torch.int32)
    seq = torch.tensor([10, 20, 30], dtype=torch.int32)
    bt = torch.tensor([[3, 0, 0, 0], [5, 7, 0, 0], [2, 9, 0, 0]], dtype=torch.int32)
    return qsl, seq, bt


def test_causal_mask_is_compressed_splitfuse():
    md = _builder().build(*_known())
    m = md.attn_mask
    assert m is not None
    assert tuple(m.shape) == (2048, 2048)
    assert m.dtype == torch.int8
    expected = torch.ones(2048, 2048, dtype=torch.int8).triu(1)
    assert torch.equal(m, expected)


def test_non_causal_mask_is_none():
    md = _builder().build(*_known(), causal=False)
    assert md.attn_mask is None
    assert md.causal is False


def test_pooling_causal_mask_is_bool():
    md = _builder(pooling=True).build(*_known())
    m = md.attn_mask
    assert m is not None and tuple(m.shape) == (2048, 2048)
    assert m.dtype == torch.bool
    assert torch.equal(m, torch.ones(2048, 2048, dtype=torch.bool).triu(1))
    assert md.is_pooling is True


# ----------------------------------------------------------------------------- metadata of a known batch


def test_metadata_known_batch():
    md = _builder().build(*_known())
    assert md.num_reqs == 3 and md.num_real_reqs == 3
    assert (md.num_decodes, md.num_prefills, md.num_decode_tokens) == (2, 1, 2)
    assert md.num_actual_tokens == 6 and md.num_input_tokens == 6 and md.num_kernel_tokens == 6
    assert md.max_query_len == 4 and md.max_seq_len == 30
    assert md.block_size == 16
    assert list(md.actual_seq_lengths_q) == [1, 2, 6]
    assert list(md.seq_lens_list) == [10, 20, 30]
    assert md.query_start_loc.tolist() == [0, 1, 2, 6]
    assert md.seq_lens.tolist() == [10, 20, 30]
    assert md.query_start_loc.dtype == md.seq_lens.dtype == md.slot_mapping.dtype == torch.int32
    assert md.block_tables.dtype == torch.int32
    assert md.block_tables[:3, :2].tolist() == [[3, 0], [5, 7], [2, 9]]
    # By hand (bs 16): req0 pos 9 -> block 3: 57; req1 pos 19 -> block 7 off 3: 115;
    # req2 pos 26..29 -> block 9 off 10..13: 154..157.
    assert md.slot_mapping[:6].tolist() == [57, 115, 154, 155, 156, 157]
    assert md.attn_state == S.ChunkedPrefill  # derived: mixed, chunked prefill enabled
    assert md.causal is True


def test_metadata_fia_padding_dummy():
    md = _builder().build(*_known(), num_input_tokens=8)
    assert md.num_kernel_reqs == 4 and md.num_reqs == 3 and md.num_real_reqs == 3
    assert md.num_actual_tokens == 6 and md.num_input_tokens == 8 and md.num_kernel_tokens == 8
    assert list(md.actual_seq_lengths_q) == [1, 2, 6, 8]
    assert list(md.seq_lens_list) == [10, 20, 30, 1]
    assert md.query_start_loc.tolist() == [0, 1, 2, 6, 8]
    assert md.seq_lens.tolist() == [10, 20, 30, 1]
    assert md.block_tables.shape[0] == 4
    assert md.block_tables[3].tolist() == [0] * md.block_tables.shape[1]
    sm = md.slot_mapping.tolist()
    assert sm[:6] == [57, 115, 154, 155, 156, 157]
    assert all(s == -1 for s in sm[6:8])


def test_metadata_no_fia_padding():
    md = _builder(pad_fia_batch=False).build(*_known(), num_input_tokens=8)
    assert md.num_reqs == md.num_kernel_reqs == 3 and md.num_kernel_tokens == 6 and md.num_input_tokens == 8
    assert list(md.actual_seq_lengths_q) == [1, 2, 6]
    assert all(s == -1 for s in md.slot_mapping.tolist()[6:8])


def test_metadata_slots_cross_block_boundary():
    # One prefill chunk crossing two block boundaries, bs 16: positions 10..40.
    qsl = torch.tensor([0, 31], dtype=torch.int32)
    seq = torch.tensor([41], dtype=torch.int32)
    bt = torch.tensor([[11, 4, 8, 0]], dtype=torch.int32)
    md = _builder().build(qsl, seq, bt)
    expected = [int(bt[0, p // 16]) * 16 + p % 16 for p in range(10, 41)]
    assert md.slot_mapping[:31].tolist() == expected
    assert md.attn_state == S.ChunkedPrefill
    assert (md.num_decodes, md.num_prefills) == (0, 1)


def test_metadata_valid_until_next_build_and_rebuild():
    b = _builder()
    md = b.build(*_known())
    assert list(md.seq_lens_list) == [10, 20, 30]
    md2 = b.build(torch.tensor([0, 1], dtype=torch.int32), torch.tensor([5], dtype=torch.int32),
                  torch.tensor([[6, 0, 0, 0]], dtype=torch.int32))
    assert list(md2.seq_lens_list) == [5]
    assert md2.slot_mapping[:1].tolist() == [6 * 16 + 4]
    assert md2.attn_state == S.DecodeOnly


def test_builder_thresholds():
    assert _builder().decode_threshold == 1
    b = _builder(num_speculative_tokens=3, spec_method="mtp")
    assert b.decode_threshold == 4 and b.reorder_batch_threshold == 4


def test_block_table_staging_zero_copy():
    b = _builder()
    st = b.block_table_staging
    assert st.dtype == torch.int32 and tuple(st.shape) == (8 + 1, 4)
    qsl, seq, bt = _known()
    st[:3] = bt
    md = b.build(qsl, seq, st[:3])
    assert md.block_tables[:3].tolist() == bt.tolist()
    assert md.slot_mapping[:6].tolist() == [57, 115, 154, 155, 156, 157]


def test_separate_device_buffers_same_result():
    md1 = _builder(separate_device_buffers=True).build(*_known(), num_input_tokens=8)
    md2 = _builder(separate_device_buffers=False).build(*_known(), num_input_tokens=8)
    for f in ("query_start_loc", "seq_lens", "slot_mapping", "block_tables"):
        assert torch.equal(getattr(md1, f), getattr(md2, f)), f
    assert list(md1.actual_seq_lengths_q) == list(md2.actual_seq_lengths_q)


def test_build_for_graph_capture():
    b = _builder()
    md = b.build_for_graph_capture(torch.tensor([0, 1, 2], dtype=torch.int32),
                                   torch.tensor([8, 9], dtype=torch.int32),
                                   torch.tensor([[1, 0, 0, 0], [2, 0, 0, 0]], dtype=torch.int32),
                                   state=S.SpecDecoding)
    assert md.attn_state == S.SpecDecoding
    with pytest.raises(NotImplementedError):
        b.build_for_graph_capture(torch.tensor([0, 1], dtype=torch.int32), torch.tensor([8], dtype=torch.int32),
                                  torch.tensor([[1, 0, 0, 0]], dtype=torch.int32), state=S.PrefillNoCache)


# ----------------------------------------------------------------------------- attention state derivation (docs/design/gqa.md §2.1)


def _state(q_lens, seq_lens, num_spec=None, **builder_kw):
    qsl = torch.zeros(len(q_lens) + 1, dtype=torch.int32)
    qsl[1:] = torch.cumsum(torch.tensor(q_lens), 0)
    bt = torch.arange(1, len(q_lens) * 4 + 1, dtype=torch.int32).reshape(len(q_lens), 4) % 30 + 1
    b = _builder(max_num_reqs=8, max_num_tokens=64, num_blocks=32, **builder_kw)
    kw = {}
    if num_spec is not None:
        kw["num_spec_tokens"] = torch.tensor(num_spec, dtype=torch.int32)
    return b.build(qsl, torch.tensor(seq_lens, dtype=torch.int32), bt, **kw).attn_state


def test_state_prefill_no_cache():
    assert _state([5, 3], [5, 3]) == S.PrefillNoCache


def test_state_decode_only():
    assert _state([1, 1], [9, 3]) == S.DecodeOnly


def test_state_decode_only_mtp_is_spec():
    assert _state([1, 1], [9, 3], num_speculative_tokens=1, spec_method="mtp") == S.SpecDecoding


def test_state_spec_decoding_mtp():
    assert _state([4, 4], [9, 13], num_spec=[3, 3], num_speculative_tokens=3, spec_method="mtp") == S.SpecDecoding


def test_state_spec_decoding_non_mtp_rewritten():
    assert _state([4, 4], [9, 13], num_spec=[3, 3], num_speculative_tokens=3,
                  spec_method="other") == S.ChunkedPrefill


def test_state_chunked_prefill():
    assert _state([1, 6], [9, 13]) == S.ChunkedPrefill


def test_state_prefill_cache_hit_without_chunked_prefill():
    assert _state([1, 6], [9, 13], chunked_prefill_enabled=False) == S.PrefillCacheHit


def test_state_explicit_wins():
    assert _state([1, 1], [9, 3]) == S.DecodeOnly
    qsl = torch.tensor([0, 1, 2], dtype=torch.int32)
    md = _builder().build(qsl, torch.tensor([9, 3], dtype=torch.int32),
                          torch.tensor([[1, 0, 0, 0], [2, 0, 0, 0]], dtype=torch.int32),
                          attn_state=S.ChunkedPrefill)
    assert md.attn_state == S.ChunkedPrefill


@pytest.mark.parametrize(
    "computed,sched,kw,expected",
    [
        ([0, 0], [5, 3], {}, S.PrefillNoCache),
        ([4, 7], [1, 1], {}, S.DecodeOnly),
        ([4, 7], [1, 1], dict(spec_method="mtp"), S.SpecDecoding),
        ([4, 7], [4, 4], dict(num_spec=[3, 3], spec_method="mtp"), S.SpecDecoding),
        ([4, 7], [4, 4], dict(num_spec=[3, 3], spec_method="other"), S.ChunkedPrefill),
        ([4, 7], [4, 4], dict(num_spec=[3, 3]), S.ChunkedPrefill),
        ([4, 0], [1, 6], {}, S.ChunkedPrefill),
        ([4, 0], [1, 6], dict(chunked_prefill_enabled=False), S.PrefillCacheHit),
        ([4, 2], [1, 6], dict(chunked_prefill_enabled=False), S.PrefillCacheHit),
    ],
)
def test_plan_select_attention_state(computed, sched, kw, expected):
    if "num_spec" in kw:
        kw = dict(kw, num_spec=torch.tensor(kw["num_spec"], dtype=torch.int32))
    got = aar.plan.select_attention_state(torch.tensor(computed, dtype=torch.int32),
                                          torch.tensor(sched, dtype=torch.int32), **kw)
    assert got == expected


# ----------------------------------------------------------------------------- split (docs/design/gqa.md §2.2)


def _split(qsl, n_act, max_q, **kw):
    r = aar.plan.split_decodes_and_prefills(torch.tensor(qsl, dtype=torch.int32), n_act, max_q, **kw)
    if hasattr(r, "num_decodes"):
        return (r.num_decodes, r.num_prefills, r.num_decode_tokens, r.num_prefill_tokens)
    return tuple(r)


def test_split_spec_example():
    assert _split([0, 1, 5], 5, 4, decode_threshold=1, treat_short_extends_as_decodes=False,
                  is_prefilling=torch.tensor([True, True])) == (0, 2, 0, 5)


@pytest.mark.parametrize(
    "qsl,n_act,max_q,kw,expected",
    [
        ([0, 1, 2, 6], 6, 4, {}, (2, 1, 2, 4)),
        ([0, 1, 2, 3], 3, 1, {}, (3, 0, 3, 0)),  # fast path
        ([0, 4, 5, 6], 6, 4, {}, (0, 3, 0, 6)),  # first request is a prefill -> all prefill
        ([0, 4, 8, 12], 12, 4, dict(decode_threshold=4), (3, 0, 12, 0)),
        ([0, 4, 8, 14], 14, 6, dict(decode_threshold=4), (2, 1, 8, 6)),
        ([0, 2, 4, 5], 5, 2, dict(decode_threshold=2, require_uniform=True), (2, 1, 4, 1)),
        ([0, 1, 2, 3], 3, 1, dict(treat_short_extends_as_decodes=False,
                                  is_prefilling=torch.tensor([False, True, False])), (1, 2, 1, 2)),
        ([0], 0, 0, {}, (0, 0, 0, 0)),
    ],
)
def test_split_cases(qsl, n_act, max_q, kw, expected):
    assert _split(qsl, n_act, max_q, **kw) == expected


# ----------------------------------------------------------------------------- workspace size (docs/design/gqa.md §2.6)


@pytest.mark.parametrize(
    "args,expected",
    [
        ((1024, 4, 128), 8192),
        ((100000, 2, 128), 131072),
        ((16, 2048, 128), 262144),
        ((100, 16, 128), 8192),
    ],
)
def test_chunked_prefill_workspace_size(args, expected):
    mml, mns, bs = args
    assert expected == max(min(max(8 * mml, 4 * mns * bs), 131072), mns * bs)
    assert aar.plan.chunked_prefill_workspace_size(*args) == expected


# ----------------------------------------------------------------------------- providers / schemas


def test_provider_roundtrip():
    old = aar.get_provider()
    try:
        aar.set_provider("cpu")
        assert aar.get_provider() == "cpu"
    finally:
        aar.set_provider(old)
    assert aar.get_provider() == old


def test_set_provider_rejects_unknown():
    with pytest.raises(ValueError):
        aar.set_provider("gpu9")


def test_op_schemas_listed():
    schemas = aar.op_schemas()
    names = [s[0] for s in schemas]
    assert any("fused_infer_attention_score" in n for n in names)
    assert any("paged_attention" in n for n in names)
    for name, schema, is_atb in schemas:
        assert isinstance(name, str) and isinstance(schema, str) and isinstance(is_atb, bool)


# ----------------------------------------------------------------------------- zero-copy round trip


def test_forward_returns_same_output_tensor():
    g = torch.Generator().manual_seed(3)
    batch = make_batch([19, 40, 30], [1, 1, 6], num_heads=4, num_kv_heads=2, head_size=32, dtype=torch.float32,
                       block_size=16, gen=g)
    b = _builder(num_blocks=batch.num_blocks)
    md = b.build(batch.query_start_loc, batch.seq_lens_t, batch.block_table)
    impl = aar.AttentionImpl(4, 32, num_kv_heads=2)
    out = torch.full((8, 4, 32), SENTINEL)
    ptr = out.data_ptr()
    ret = impl.forward(batch.q, batch.k, batch.v, batch.key_cache, batch.value_cache, md, out)
    assert ret.data_ptr() == ptr and out.data_ptr() == ptr
    assert ret.shape == out.shape and ret.dtype == out.dtype
    ret[0, 0, 0] = 123.0  # a view of the same storage
    assert float(out[0, 0, 0]) == 123.0


def test_forward_writes_into_output_view():
    # A non-owning view (slice of a bigger buffer) is written in place; the rest is untouched.
    g = torch.Generator().manual_seed(4)
    batch = make_batch([19, 40], [1, 6], num_heads=4, num_kv_heads=2, head_size=32, dtype=torch.float32,
                       block_size=16, gen=g)
    b = _builder(num_blocks=batch.num_blocks)
    md = b.build(batch.query_start_loc, batch.seq_lens_t, batch.block_table)
    impl = aar.AttentionImpl(4, 32, num_kv_heads=2)
    big = torch.full((12, 4, 32), SENTINEL)
    view = big[2:9]
    impl.forward(batch.q, batch.k, batch.v, batch.key_cache, batch.value_cache, md, view)
    assert_close(big[2:9], batch.reference(), torch.float32)
    assert bool((big[:2] == SENTINEL).all()) and bool((big[9:] == SENTINEL).all())


def test_metadata_tensors_are_views_of_persistent_buffers():
    b = _builder()
    md = b.build(*_known())
    p1 = md.slot_mapping.data_ptr()
    md2 = b.build(*_known())
    assert md2.slot_mapping.data_ptr() == p1


def test_scale_default_is_rsqrt_head_size():
    g = torch.Generator().manual_seed(8)
    batch = make_batch([12], [3], num_heads=2, num_kv_heads=1, head_size=64, dtype=torch.float32, block_size=16,
                       gen=g)
    b = _builder(num_blocks=batch.num_blocks)
    md = b.build(batch.query_start_loc, batch.seq_lens_t, batch.block_table)
    out = torch.zeros(3, 2, 64)
    aar.AttentionImpl(2, 64, num_kv_heads=1).forward(batch.q, batch.k, batch.v, batch.key_cache,
                                                     batch.value_cache, md, out)
    assert_close(out, batch.reference(scale=1 / math.sqrt(64)), torch.float32)
