"""Inputs a probe of the Python API with bad arguments found accepted (2026-12-07), each now refused
by name before anything is written, or (the empty MLA step) served. Every test failed before its fix.

- an engine-given attn_state=PrefillNoCache on a batch with cached tokens (GQA, C8, MLA, SFA, DSA
  builders): that state attends over the new tokens alone, so the context was silently dropped;
- a layer's K and V caches sharing memory (GQA, C8): the V write overwrote the K cache;
- sinks on another device than the query (GQA): the K/V write happened before the failure;
- logits_soft_cap NaN or negative (GQA, C8, FA3, GQA DCP): taken as "no soft-cap";
- staging_buffers out of [1, 4] on a builder without separate device buffers (GQA, MLA): ignored;
- MLA builder max_model_len / workspace_tokens negative: taken as "derive it";
- c8_dequant_paged_to_dense with a block id outside the cache or a float block table: clamped or
  truncated, reading other blocks; a 1-D scale failed with an IndexError naming nothing;
- an MLA forward of an empty step failed inside torch ("strides() called on an undefined Tensor");
- C8 decode_call took a query of another head count; reorder thresholds below 1; negative NZ shapes;
- rope tables with no row (the SFA build then read past them and the process died), of int dtype (the layer
  ran with integer cos / sin) or on meta (torch's "Cannot copy out of meta tensor");
- HostKvPool sizes whose byte count wraps int64 (SIGFPE in blocks_for_budget, create never returned);
- rope rows of another width than the layer's qk_rope_head_dim (MLA, SFA: a view error deep in the rope),
  an SFA rope cache with other blocks than the latent cache, DSA indexer caches with different block counts
  (errors naming internal operators, the DSA one after the SWA and state caches were written);
- builder capacities near INT32_MAX (found through the C API: a staging size overflowed int32, or ~25 GB was
  allocated and the process killed; num_blocks x block_size past the int32 slot range was accepted and every
  build then failed); GraphParams.release(-1) refused for the wrong reason.

Leads of those probes, closed in a later session: a forward without metadata zeroed an output of any
shape or dtype; an output sharing memory with the query, K/V, a cache or the hidden states was accepted;
head sizes and counts up to INT64_MAX and graph buckets of 2^40 tokens were accepted (failing later in an
allocation); C8 offsets outside int8 saturated every quantised value. (A graph update with another
builder's metadata: tests/python/test_graph.py.)"""

import pytest
import torch

import ascend_attn_rt as aar
from _reference import make_batch

S = aar.AttentionState
N, NKV, D, BS, NB = 8, 2, 64, 16, 16


def i32(x):
    return torch.tensor(x, dtype=torch.int32)


def _gqa_batch(seq=(19, 40, 30), q=(1, 1, 6), dtype=torch.float32):
    g = torch.Generator().manual_seed(5)
    return make_batch(list(seq), list(q), num_heads=N, num_kv_heads=NKV, head_size=D, dtype=dtype, block_size=BS,
                      gen=g, num_blocks=NB)


def _gqa_builder(**kw):
    cfg = dict(max_num_reqs=4, max_num_tokens=16, max_blocks_per_req=4, block_size=BS, num_blocks=NB)
    cfg.update(kw)
    return aar.MetadataBuilder(**cfg)


def _rope(rows=64, width=16):
    g = torch.Generator().manual_seed(3)
    return torch.randn(rows, width, generator=g), torch.randn(rows, width, generator=g)


def _latent_builder(family, cos=None, sin=None, **kw):
    """An MLA or SFA MetadataBuilder (`family` aar.mla / aar.sfa) of small capacities."""
    if cos is None:
        cos, sin = _rope()
    cfg = dict(max_num_reqs=4, max_num_tokens=32, max_blocks_per_req=4, block_size=16, num_blocks=8)
    cfg.update(kw)
    return family.MetadataBuilder(cos_table=cos, sin_table=sin, **cfg)


def _c8_case():
    """A C8 batch (blocks of 32), a builder for it and its layer."""
    from test_c8 import make_c8_batch
    b = make_c8_batch([19, 40], [1, 6], gen=torch.Generator().manual_seed(1234))
    builder = aar.MetadataBuilder(max_num_reqs=16, max_num_tokens=64, max_blocks_per_req=8, block_size=b.block_size,
                                  num_blocks=b.num_blocks)
    impl = aar.C8AttentionImpl(b.num_heads, b.head_size, k_scale=b.ks, k_offset=b.ko, v_scale=b.vs, v_offset=b.vo,
                               num_kv_heads=b.num_kv_heads)
    return b, builder, impl


# ---------------------------------------------------------------- attn_state=PrefillNoCache with context

PNC = r"attn_state=PrefillNoCache was given, but request 1 has cached tokens \(seq_lens\[1\]=9, query length 3\)"


def test_gqa_builder_refuses_prefill_no_cache_over_context_and_keeps_serving():
    b = _gqa_builder()
    qsl, seq, bt = i32([0, 4, 7]), i32([4, 9]), i32([[1, 0, 0, 0], [2, 3, 0, 0]])
    with pytest.raises(ValueError, match=PNC):
        b.build(qsl, seq, bt, attn_state=S.PrefillNoCache)
    md = b.build(qsl, seq, bt)  # derived: the context is read
    assert md.attn_state != S.PrefillNoCache
    # A batch without cached tokens takes the given state.
    md = b.build(qsl, i32([4, 3]), bt, attn_state=S.PrefillNoCache)
    assert md.attn_state == S.PrefillNoCache


def test_gqa_forward_with_a_derived_state_matches_the_reference_where_the_override_dropped_the_context():
    # What the refused override did: FusedDense over the new tokens only, far from the reference.
    batch = _gqa_batch()
    b = _gqa_builder()
    with pytest.raises(ValueError, match="attn_state=PrefillNoCache"):
        b.build(batch.query_start_loc, batch.seq_lens_t, batch.block_table, attn_state=S.PrefillNoCache)
    md = b.build(batch.query_start_loc, batch.seq_lens_t, batch.block_table)
    impl = aar.AttentionImpl(N, D, num_kv_heads=NKV)
    out = torch.zeros_like(batch.q)
    impl.forward(batch.q, batch.k, batch.v, batch.key_cache, batch.value_cache, md, out)
    torch.testing.assert_close(out[:8].double(), batch.reference().double(), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("family", [aar.mla, aar.sfa], ids=["mla", "sfa"])
def test_latent_builders_refuse_prefill_no_cache_over_context(family):
    b = _latent_builder(family)
    qsl, seq, bt = i32([0, 4, 7]), i32([4, 9]), i32([[1, 0, 0, 0], [2, 3, 0, 0]])
    with pytest.raises(ValueError, match=PNC):
        b.build(qsl, seq, bt, attn_state=S.PrefillNoCache)
    assert b.build(qsl, i32([4, 3]), bt, attn_state=S.PrefillNoCache).attn_state == S.PrefillNoCache


def test_dsa_step_builder_refuses_prefill_no_cache_over_context():
    g = torch.Generator().manual_seed(0)
    mk = lambda: torch.randn(1 << 12, 64, generator=g).to(torch.bfloat16)  # noqa: E731
    sb = aar.dsa.StepBuilder(max_num_reqs=4, max_num_tokens=64, cos_table=mk(), sin_table=mk(),
                             compress_cos_table=mk(), compress_sin_table=mk())
    with pytest.raises(ValueError, match=PNC):
        sb.build(i32([0, 4, 7]), i32([4, 9]), attn_state=S.PrefillNoCache)
    assert sb.build(i32([0, 4, 7]), i32([4, 3]), attn_state=S.PrefillNoCache).attn_state == S.PrefillNoCache


# ---------------------------------------------------------------- caches sharing memory


def test_gqa_forward_refuses_one_tensor_as_both_caches_and_writes_nothing():
    batch = _gqa_batch()
    md = _gqa_builder().build(batch.query_start_loc, batch.seq_lens_t, batch.block_table)
    impl = aar.AttentionImpl(N, D, num_kv_heads=NKV)
    before = batch.key_cache.clone()
    with pytest.raises(ValueError, match="key_cache and value_cache share memory"):
        impl.forward(batch.q, batch.k, batch.v, batch.key_cache, batch.key_cache, md, torch.zeros_like(batch.q))
    assert torch.equal(batch.key_cache, before)
    # Overlapping views of one allocation are refused too; disjoint halves of a stacked cache pass.
    kv = torch.zeros(2 * NB + 1, BS, NKV, D)
    with pytest.raises(ValueError, match="share memory"):
        impl.forward(batch.q, batch.k, batch.v, kv[:NB], kv[1:NB + 1], md, torch.zeros_like(batch.q))
    stacked = torch.stack([batch.key_cache, batch.value_cache])
    out = torch.zeros_like(batch.q)
    impl.forward(batch.q, batch.k, batch.v, stacked[0], stacked[1], md, out)
    torch.testing.assert_close(out[:8].double(), batch.reference().double(), atol=1e-5, rtol=1e-5)


def test_c8_forward_refuses_one_tensor_as_both_caches_and_writes_nothing():
    b, builder, impl = _c8_case()
    md = builder.build(b.qsl, b.seq_lens_t, b.block_table)
    before = b.key_cache.clone()
    with pytest.raises(ValueError, match="key_cache and value_cache share memory"):
        impl.forward(b.q, b.k, b.v, b.key_cache, b.key_cache, md, torch.zeros_like(b.q))
    assert torch.equal(b.key_cache, before)


# ---------------------------------------------------------------- sinks, soft-cap


def test_gqa_forward_refuses_sinks_on_another_device_before_writing():
    batch = _gqa_batch()
    md = _gqa_builder().build(batch.query_start_loc, batch.seq_lens_t, batch.block_table)
    impl = aar.AttentionImpl(N, D, num_kv_heads=NKV, sinks=torch.zeros(N, device="meta"))
    k0, v0 = batch.key_cache.clone(), batch.value_cache.clone()
    with pytest.raises(ValueError, match="sinks are on meta but query is on cpu"):
        impl.forward(batch.q, batch.k, batch.v, batch.key_cache, batch.value_cache, md, torch.zeros_like(batch.q))
    assert torch.equal(batch.key_cache, k0) and torch.equal(batch.value_cache, v0)


RAW_C8 = dict(k_scale=torch.full((64,), 0.5), k_offset=torch.zeros(64), v_scale=torch.full((64,), 0.5),
              v_offset=torch.zeros(64))


@pytest.mark.parametrize("bad", [float("nan"), -1.0, float("-inf"), float("inf")])
def test_gqa_family_layers_refuse_a_nan_or_negative_soft_cap(bad):
    match = r"logits_soft_cap must be None, 0 \(none\) or positive"
    with pytest.raises(ValueError, match=match):
        aar.AttentionImpl(N, D, num_kv_heads=NKV, logits_soft_cap=bad)
    with pytest.raises(ValueError, match=match):
        aar.C8AttentionImpl(4, 32, num_kv_heads=2, logits_soft_cap=bad, **RAW_C8)
    with pytest.raises(ValueError, match=match):
        aar.FA3AttentionImpl(4, 128, logits_soft_cap=bad)


def test_soft_cap_zero_is_none_and_positive_is_refused_by_name():
    aar.AttentionImpl(N, D, num_kv_heads=NKV, logits_soft_cap=0.0)
    with pytest.raises(NotImplementedError, match=r"logits soft-cap \(logits_soft_cap=30\) is not supported by the GQA"):
        aar.AttentionImpl(N, D, num_kv_heads=NKV, logits_soft_cap=30.0)


# ---------------------------------------------------------------- builder configuration


@pytest.mark.parametrize("n", [0, -1, 5])
def test_builders_refuse_staging_buffers_out_of_range_without_separate_buffers(n):
    with pytest.raises(ValueError, match=rf"staging_buffers must be in \[1, 4\], got {n}"):
        _gqa_builder(staging_buffers=n)
    with pytest.raises(ValueError, match=rf"staging_buffers must be in \[1, 4\], got {n}"):
        _latent_builder(aar.mla, staging_buffers=n)


@pytest.mark.parametrize("kw,match", [
    (dict(max_model_len=-5), r"max_model_len must be >= 0 \(0: max_blocks_per_req x block_size\), got -5"),
    (dict(workspace_tokens=-1), r"workspace_tokens must be >= 0 \(0: derived from max_model_len\), got -1"),
])
def test_mla_builder_refuses_negative_lengths(kw, match):
    with pytest.raises(ValueError, match=match):
        _latent_builder(aar.mla, **kw)


# ---------------------------------------------------------------- c8_dequant_paged_to_dense


def test_c8_dequant_paged_to_dense_refuses_blocks_outside_the_cache_and_float_tables():
    b = _c8_case()[0]
    good = aar.c8_dequant_paged_to_dense(b.key_cache, b.block_table, [19, 40], b.ks, b.ko)
    assert good.shape == (59, b.num_kv_heads, b.head_size)
    for bad in (b.num_blocks, b.num_blocks + 50, -3):
        bt = b.block_table.clone()
        bt[1, 1] = bad  # request 1 (40 tokens, blocks of 32) reads columns 0 and 1
        with pytest.raises(ValueError, match=rf"block_table\[1\]\[1\]={bad} is out of range \[0, {b.num_blocks}\)"):
            aar.c8_dequant_paged_to_dense(b.key_cache, bt, [19, 40], b.ks, b.ko)
    # Columns past a request's length are not read: any id there is fine.
    assert b.block_size == 32 and b.block_table.shape[1] == 2
    bt = b.block_table.clone()
    bt[0, 1] = 10 ** 6  # request 0 (19 tokens) reads column 0 only
    torch.testing.assert_close(aar.c8_dequant_paged_to_dense(b.key_cache, bt, [19, 40], b.ks, b.ko), good)
    with pytest.raises(ValueError, match="block_table must be int32 or int64, got Float"):
        aar.c8_dequant_paged_to_dense(b.key_cache, b.block_table.float(), [19, 40], b.ks, b.ko)
    with pytest.raises(ValueError, match=r"scale must have shape \(\.\.\., num_kv_heads, head_size\)"):
        aar.c8_dequant_paged_to_dense(b.key_cache, b.block_table, [19, 40], b.ks.flatten(), b.ko.flatten())


# ---------------------------------------------------------------- the empty MLA step


def test_mla_forward_of_an_empty_step_writes_nothing_and_returns_the_output():
    from test_mla import setup_case
    c = setup_case([12, 20], [1, 1], workspace=32)
    md = c.builder.build(i32([0]), i32([]), torch.zeros(0, c.table.shape[1], dtype=torch.int32))
    h = torch.zeros(0, c.hidden.shape[1], dtype=c.hidden.dtype)
    nope0, rope0 = c.nope.clone(), c.rope.clone()
    out = torch.zeros_like(h)
    assert c.impl.forward(h, c.nope, c.rope, md, out).shape == (0, c.hidden.shape[1])
    assert torch.equal(c.nope, nope0) and torch.equal(c.rope, rope0)


# ---------------------------------------------------------------- second pass of the probe


def test_c8_decode_call_checks_query_and_output():
    b, builder, impl = _c8_case()
    md = builder.build(b.qsl, b.seq_lens_t, b.block_table)
    impl.forward(b.q, b.k, b.v, b.key_cache, b.value_cache, md, torch.zeros_like(b.q))  # binds the caches
    md = builder.build(b.qsl, b.seq_lens_t, b.block_table)
    call = impl.decode_call(b.q, md, 1, torch.zeros_like(b.q))
    assert call is not None
    with pytest.raises(ValueError, match=r"decode_call: query must have shape \(T >= num_decodes=2"):
        impl.decode_call(b.q[:1], md, 2, torch.zeros_like(b.q))
    with pytest.raises(ValueError, match=r"decode_call: query must have shape"):
        impl.decode_call(torch.randn(7, 3, b.head_size), md, 1, torch.zeros_like(b.q))
    with pytest.raises(ValueError, match=r"decode_call: query dtype must be float32, float16 or bfloat16, got Int"):
        impl.decode_call(b.q.int(), md, 1, torch.zeros_like(b.q))
    with pytest.raises(ValueError, match=r"decode_call: output must have shape"):
        impl.decode_call(b.q, md, 2, torch.zeros(1, b.num_heads, b.head_size))


def test_mla_forward_names_rope_tables_of_another_width_before_writing():
    from _mla_reference import rope_tables
    from test_mla import setup_case
    c = setup_case([12, 20, 40, 9], [1, 1, 7, 9], workspace=32)
    cos, sin = rope_tables(64, c.d.R // 2)
    b2 = aar.mla.MetadataBuilder(max_num_reqs=8, max_num_tokens=256, max_blocks_per_req=c.table.shape[1],
                                 block_size=16, num_blocks=c.nope.shape[0], cos_table=cos.float(),
                                 sin_table=sin.float(), workspace_tokens=32)
    md = b2.build(i32([0, 1, 2, 9, 18]), i32([12, 20, 40, 9]), c.table)
    nope0, rope0 = c.nope.clone(), c.rope.clone()
    with pytest.raises(ValueError, match=rf"the metadata's rope rows have width {c.d.R // 2} but the layer's "
                                         rf"qk_rope_head_dim={c.d.R}"):
        c.impl.forward(c.hidden, c.nope, c.rope, md, torch.zeros_like(c.hidden))
    assert torch.equal(c.nope, nope0) and torch.equal(c.rope, rope0)


@pytest.mark.parametrize("thr", [0, -1, 17])
def test_reorder_batch_refuses_a_threshold_out_of_range(thr):
    with pytest.raises(ValueError, match=rf"decode_threshold={thr} is out of range \[1, 16\]"):
        aar.mla.reorder_batch(i32([3, 1, 2]), thr)


def test_nz_cache_shape_refuses_negative_sizes():
    with pytest.raises(ValueError, match=r"nz_cache_shape: bad sizes \(num_blocks=-4"):
        aar.mla.Backend.nz_cache_shape(-4, 16, 64, 2)
    assert aar.mla.Backend.nz_cache_shape(4, 16, 64, 2) == [4, 1, 4, 16, 16]


# ---------------------------------------------------------------- the sparse families (SFA, DSA, the host pool)


def test_rope_tables_must_hold_float_rows_of_data():
    # A 0-row table was accepted and the next SFA build read row 0 of it (the process died); an int table
    # ran the layer with integer cos / sin; a meta table failed with torch's "Cannot copy out of meta tensor".
    with pytest.raises(ValueError, match=r"cos_table must have at least one row of qk_rope_head_dim >= 2 columns"):
        _latent_builder(aar.sfa, torch.zeros(0, 8), torch.zeros(0, 8))
    with pytest.raises(ValueError, match=r"cos_table must be a floating tensor \(the rotary cos / sin values\), "
                                         r"got Int"):
        _latent_builder(aar.sfa, torch.ones(64, 8, dtype=torch.int32), torch.ones(64, 8, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"cos_table is a meta tensor"):
        _latent_builder(aar.sfa, torch.zeros(64, 8, device="meta"), torch.zeros(64, 8, device="meta"))
    cos, sin = _rope(64, 8)
    with pytest.raises(ValueError, match=r"cos_table must be a floating tensor"):
        aar.dsa.StepBuilder(max_num_reqs=4, max_num_tokens=16, cos_table=cos.int(), sin_table=sin.int())
    with pytest.raises(ValueError, match=r"cos_table must have at least one row"):
        _latent_builder(aar.mla, torch.zeros(0, 16), torch.zeros(0, 16))
    md = _latent_builder(aar.sfa, cos, sin).build(i32([0, 1]), i32([5]), i32([[1, 0, 0, 0]]))
    assert torch.equal(md.cos[0], cos[4])


def test_host_pool_sizes_that_overflow_int64_are_refused():
    # block_bytes wrapped (to 0: blocks_for_budget then died of SIGFPE; to 2^25: create never returned).
    P = aar.sfa.HostKvPool
    match = r"num_layers=1099511627776 x block_size=1048576 x \(kv_lora_rank=1048576 \+ qk_rope_head_dim=16\) x 2 " \
            r"bytes overflows int64"
    with pytest.raises(ValueError, match=match):
        P.block_bytes(2 ** 40, 2 ** 20, 2 ** 20, 16)
    with pytest.raises(ValueError, match=match):
        P.blocks_for_budget(10 ** 6, 2 ** 40, 2 ** 20, 2 ** 20, 16)
    with pytest.raises(ValueError, match="overflows int64"):
        P.create(num_layers=2 ** 40 + 1, budget_bytes=2 ** 26, block_size=2 ** 20, kv_lora_rank=8,
                 qk_rope_head_dim=8)
    assert P.block_bytes(61, 64, 512, 64) == 61 * 64 * 576 * 2


def _sfa_case():
    from test_sfa import Model, _qsl
    seq, q = [15, 26], [1, 4]
    m = Model(seq)
    for r, (s, ql) in enumerate(zip(seq, q)):
        m.fill(r, s - ql)
    hidden = torch.cat([m.xs[r][s - ql:] for r, (s, ql) in enumerate(zip(seq, q))])
    return m, hidden, _qsl(q), i32(seq)


def test_sfa_forward_names_rope_tables_of_another_width_before_writing():
    m, hidden, qsl, seq = _sfa_case()
    b = m.builder(cos_table=m.cos[:, :8].float().contiguous(), sin_table=m.sin[:, :8].float().contiguous())
    md = b.build(qsl, seq, m.table)
    snap = [c.clone() for c in m.caches()]
    with pytest.raises(ValueError, match=r"the metadata's rope rows have width 8 but the layer's qk_rope_head_dim="):
        m.impl().forward(hidden, m.caches(), md, torch.zeros_like(hidden))
    assert all(torch.equal(a, c) for a, c in zip(snap, m.caches()))


def test_sfa_forward_names_a_rope_cache_with_other_blocks_than_the_latent_cache():
    m, hidden, qsl, seq = _sfa_case()
    md = m.builder().build(qsl, seq, m.table)
    rope2 = torch.cat([m.rope, m.rope])
    caches = [m.nope, rope2, m.idx_k]
    snap = [c.clone() for c in caches]
    with pytest.raises(ValueError, match=r"kv_cache\[1\] \(rope\) has \d+ blocks but kv_cache\[0\] \(latent\) has"):
        m.impl().forward(hidden, caches, md, torch.zeros_like(hidden))
    assert all(torch.equal(a, c) for a, c in zip(snap, caches))


def _dsa_case():
    """A C4 DSA layer after a step of context, its decode step: (run, step, metadata, hidden, groups)."""
    from test_dsa import Run, dims
    run = Run(dims(4), torch.float32, nreq=2)
    run.step([0, 1], [9, 5])
    st, md, S, qsl = run.build([0, 1], [1, 1])
    hid = torch.cat([run.x[0][S[0] - 1:S[0]], run.x[1][S[1] - 1:S[1]]])
    full = dict(attention=md["c4_kv"], compressor_state=md["c4_attn_state"], indexer_cache=md["c4_indexer_k"],
                indexer_state=md["c4_indexer_state"])
    return run, st, md, hid, full


def test_dsa_forward_names_indexer_caches_of_different_blocks_before_writing():
    run, st, md, hid, full = _dsa_case()
    kv = list(run.kv)
    kv[4] = torch.cat([run.ik, run.ik])
    caches = [run.swa, run.cmp, run.state, run.istate, kv[4], run.isc]
    snap = [t.clone() for t in caches]
    with pytest.raises(ValueError, match=r"kv_cache\[5\] \(indexer_scale\) has \d+ blocks but kv_cache\[4\] "
                                         r"\(indexer_k\) has \d+"):
        run.impl.forward(hid, kv, st, md["swa"], torch.zeros_like(hid), **full)
    assert all(torch.equal(a, c) for a, c in zip(snap, caches))


# ---------------------------------------------------------------- builder capacities (found through the C API)


@pytest.mark.parametrize("kw,match", [
    # max_num_reqs + 1 overflowed int32 in a staging region's size ("words=-2147483647" before)
    (dict(max_num_reqs=2 ** 31 - 1), r"max_num_reqs=2147483647 exceeds 1048576"),
    # allocated ~25 GB before
    (dict(max_num_tokens=2 ** 31 - 1), r"max_num_tokens=2147483647 exceeds 16777216"),
    (dict(max_blocks_per_req=2 ** 31 - 1), r"max_blocks_per_req=2147483647 x \(max_num_reqs=4 \+ 1\) exceeds the "
                                           r"block table's 268435456 entries"),
    # accepted before, and every build then failed
    (dict(num_blocks=2 ** 31 - 1), r"num_blocks=2147483647 x block_size=16 exceeds the int32 slot range"),
])
def test_builders_bound_their_capacities_at_construction(kw, match):
    with pytest.raises(ValueError, match=match):
        _gqa_builder(**kw)
    for family in (aar.mla, aar.sfa):
        with pytest.raises(ValueError, match=match):
            _latent_builder(family, **kw)


def test_graph_release_of_a_negative_bucket_names_the_bucket():
    # -1 is the "no capture open" value: it was refused as "while it is being captured".
    g = aar.GraphParams("recording")
    with pytest.raises(ValueError, match=r"release: bucket -1 is not a token count"):
        g.release(-1)
    g.release(5)  # an absent bucket: nothing to drop


# ---------------------------------------------------------------- leads of the probes, closed later


@pytest.mark.parametrize("family", ["gqa", "c8", "mla", "sfa"])
def test_a_forward_without_metadata_checks_the_output_it_zeroes(family):
    # A profiling run (metadata None) zeroed whatever output it was given: one of another shape
    # was zeroed without a word, where the same call with metadata refuses it.
    if family == "gqa":
        impl, like = aar.AttentionImpl(N, D, num_kv_heads=NKV), torch.randn(5, N, D)
        call = lambda out: impl.forward(like, None, None, None, None, None, out)
    elif family == "c8":
        b, _, impl = _c8_case()
        like = torch.randn(5, b.num_heads, b.head_size)
        call = lambda out: impl.forward(like, None, None, None, None, None, out)
    elif family == "mla":
        from test_mla import setup_case
        c = setup_case([12, 20], [1, 1], workspace=32)
        impl, like = c.impl, c.hidden
        call = lambda out: impl.forward(like, c.nope, c.rope, None, out)
    else:
        m, like, _, _ = _sfa_case()
        impl = m.impl()
        call = lambda out: impl.forward(like, m.caches(), None, out)
    wrong = torch.full((like.shape[0] + 1,) + tuple(like.shape[1:]), 3.0, dtype=like.dtype)
    with pytest.raises(ValueError, match="a profiling run"):
        call(wrong)
    assert bool((wrong == 3.0).all())
    with pytest.raises(ValueError, match="a profiling run"):
        call(torch.full(like.shape, 3.0, dtype=torch.float64))
    out = torch.full(like.shape, 3.0, dtype=like.dtype)
    call(out)
    assert bool((out == 0).all())


def test_gqa_forward_refuses_an_output_sharing_memory_with_its_inputs_before_writing():
    batch = _gqa_batch()
    md = _gqa_builder().build(batch.query_start_loc, batch.seq_lens_t, batch.block_table)
    impl = aar.AttentionImpl(N, D, num_kv_heads=NKV)
    kc0, vc0 = batch.key_cache.clone(), batch.value_cache.clone()
    q0 = batch.q.clone()
    with pytest.raises(ValueError, match="output and query share memory"):
        impl.forward(batch.q, batch.k, batch.v, batch.key_cache, batch.value_cache, md, batch.q)
    in_cache = batch.value_cache.view(-1)[: batch.q.numel()].view(batch.q.shape)
    with pytest.raises(ValueError, match="output and value_cache share memory"):
        impl.forward(batch.q, batch.k, batch.v, batch.key_cache, batch.value_cache, md, in_cache)
    assert torch.equal(batch.key_cache, kc0) and torch.equal(batch.value_cache, vc0) and torch.equal(batch.q, q0)
    # A disjoint slice of one buffer holding query and output is served.
    buf = torch.empty(2, *batch.q.shape)
    buf[0].copy_(batch.q)
    impl.forward(buf[0], batch.k, batch.v, batch.key_cache, batch.value_cache, md, buf[1])
    torch.testing.assert_close(buf[1][:8].double(), batch.reference().double(), atol=1e-5, rtol=1e-5)


def test_mla_and_sfa_forwards_refuse_an_output_aliasing_the_hidden_states():
    from test_mla import setup_case
    c = setup_case([12, 20], [1, 1], workspace=32)
    nope0, rope0 = c.nope.clone(), c.rope.clone()
    with pytest.raises(ValueError, match="output and hidden_states share memory"):
        c.impl.forward(c.hidden, c.nope, c.rope, c.md, c.hidden)
    with pytest.raises(ValueError, match="output and nope_cache share memory"):
        c.impl.forward(c.hidden, c.nope, c.rope, c.md, c.nope.view(-1)[: c.hidden.numel()].view(c.hidden.shape))
    assert torch.equal(c.nope, nope0) and torch.equal(c.rope, rope0)
    m, hidden, qsl, seq = _sfa_case()
    md = m.builder().build(qsl, seq, m.table)
    snap = [t.clone() for t in m.caches()]
    with pytest.raises(ValueError, match="output and hidden_states share memory"):
        m.impl().forward(hidden, m.caches(), md, hidden)
    assert all(torch.equal(a, t) for a, t in zip(snap, m.caches()))


def test_head_counts_and_sizes_are_bounded_at_construction():
    with pytest.raises(ValueError, match=r"head_size must be in \[1, 65536\]"):
        aar.AttentionImpl(N, 1 << 40, num_kv_heads=NKV)
    with pytest.raises(ValueError, match=r"num_heads must be in \[1, 65536\]"):
        aar.AttentionImpl(1 << 20, D)


def test_graph_buckets_past_every_builders_capacity_are_refused():
    g = aar.GraphParams("recording")
    with pytest.raises(ValueError, match=r"num_tokens must be in \[1, 16777216\]"):
        with g.capture(1 << 40):
            pass
    assert g.buckets() == []


def test_c8_offsets_outside_int8_are_refused():
    from test_c8 import make_c8_batch
    b = make_c8_batch([19], [1], gen=torch.Generator().manual_seed(1))
    with pytest.raises(ValueError, match=r"k_offset\[\d+\]=200 is outside the int8 range"):
        aar.C8AttentionImpl(b.num_heads, b.head_size, k_scale=b.ks, k_offset=torch.full_like(b.ko, 200.0),
                            v_scale=b.vs, v_offset=b.vo, num_kv_heads=b.num_kv_heads)


def test_gqa_sinks_must_be_logits():
    with pytest.raises(ValueError, match=r"sinks\[2\]=nan must be a logit"):
        aar.AttentionImpl(N, D, num_kv_heads=NKV, sinks=torch.tensor([0.0, 1.0, float("nan")] + [0.0] * (N - 3)))
    with pytest.raises(ValueError, match=r"sinks\[0\]=inf must be a logit"):
        aar.AttentionImpl(N, D, num_kv_heads=NKV, sinks=torch.tensor([float("inf")] + [0.0] * (N - 1)))
    # -inf: a head without a sink, the plain softmax of that head.
    batch = _gqa_batch()
    md = _gqa_builder().build(batch.query_start_loc, batch.seq_lens_t, batch.block_table)
    out = torch.zeros_like(batch.q)
    aar.AttentionImpl(N, D, num_kv_heads=NKV, sinks=torch.full((N,), float("-inf"))).forward(
        batch.q, batch.k, batch.v, batch.key_cache, batch.value_cache, md, out)
    torch.testing.assert_close(out[:8].double(), batch.reference().double(), atol=1e-5, rtol=1e-5)


def test_mla_forward_refuses_caches_sharing_memory_before_writing():
    from test_mla import setup_case
    c = setup_case([12, 20], [1, 1], workspace=32)
    rope_over_nope = c.nope.view(-1)[: c.rope.numel()].view(c.rope.shape)
    nope0 = c.nope.clone()
    with pytest.raises(ValueError, match="nope_cache and rope_cache share memory"):
        c.impl.forward(c.hidden, c.nope, rope_over_nope, c.md, torch.zeros_like(c.hidden))
    assert torch.equal(c.nope, nope0)


# ---------------------------------------------------------------- the C API probes of the latent and sparse families


def test_sfa_forward_refuses_memory_shared_by_its_tuple_output_and_topk_buffer_before_writing():
    # Found through the C API (each DLPack argument is a tensor of its own, so one buffer passed twice
    # arrives as two storages over the same bytes): accepted before, the rope rows landed in the latent
    # cache, and an output over the top-k buffer corrupted the selection the next layer reads.
    m, hidden, qsl, seq = _sfa_case()
    md = m.builder().build(qsl, seq, m.table)
    rope_over_latent = m.nope.view(-1)[: m.rope.numel()].view(m.rope.shape)
    caches = [m.nope, rope_over_latent, m.idx_k]
    snap = [c.clone() for c in m.caches()]
    with pytest.raises(ValueError, match=r"kv_cache\[0\] and kv_cache\[1\] share memory"):
        m.impl().forward(hidden, caches, md, torch.zeros_like(hidden))
    assert all(torch.equal(a, c) for a, c in zip(snap, m.caches()))
    buf = aar.sfa.TopkBuffer(64 + hidden.numel() // m.idx.K, m.idx.K)
    over_buf = buf.buffer.view(-1).view(torch.float32)[: hidden.numel()].view(hidden.shape)
    with pytest.raises(ValueError, match="the top-k buffer and output share memory"):
        m.impl(use_index_cache=True).forward(hidden, m.caches(), md, over_buf, buf)
    assert all(torch.equal(a, c) for a, c in zip(snap, m.caches()))


def test_sfa_and_dsa_bound_their_dims_at_construction():
    m, *_ = _sfa_case()
    with pytest.raises(ValueError, match=r"indexer n_head, head_dim and topk must be in \[1, 65536\]"):
        m.impl(index_topk=2 ** 40)
    with pytest.raises(ValueError, match=r"MLA dims must be in \[1, 65536\]"):
        aar.sfa.Impl(
            num_heads=2 ** 40, hidden_size=m.d.hidden, q_lora_rank=m.d.Q, kv_lora_rank=m.d.L,
            qk_nope_head_dim=m.d.P, qk_rope_head_dim=m.d.R, v_head_dim=m.d.V, **m.ws)


def test_dsa_forward_refuses_an_output_over_a_cache():
    run, st, md, hid, full = _dsa_case()
    kv = list(run.kv)
    caches = [run.swa, run.cmp, run.state, run.istate, run.ik, run.isc]
    snap = [t.clone() for t in caches]
    out_over_swa = run.swa.view(-1)[: hid.numel()].view(hid.shape)
    with pytest.raises(ValueError, match=r"output and kv_cache\[1\] share memory"):
        run.impl.forward(hid, kv, st, md["swa"], out_over_swa, **full)
    assert all(torch.equal(a, c) for a, c in zip(snap, caches))


def test_dsa_group_builder_bounds_its_block_table():
    from test_dsa import Run, dims, CBS
    run = Run(dims(4), torch.float32, nreq=2)
    with pytest.raises(ValueError, match=r"max_blocks_per_req=2147483647 with max_num_reqs=\d+ exceeds the block-table"):
        aar.dsa.GroupBuilder(run.sb, kind="swa", cache_block_size=CBS, num_blocks=run.nb,
                             max_blocks_per_req=2 ** 31 - 1)
