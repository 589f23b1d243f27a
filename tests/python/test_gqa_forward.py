"""GQA/MHA forward paths against the float64 explicit-mask reference.

Every case builds metadata with aar.MetadataBuilder(...).build(...), runs
aar.AttentionImpl(...).forward(...) over a paged cache whose context part was
written by Python indexing, and checks
  * the output rows [0, num_actual_tokens) against the reference,
  * rows past md.num_kernel_tokens untouched (sentinel),
  * the KV cache: the new tokens' slots hold k/v, no other slot changed,
  * impl.last_path (the documented path selection).
"""

import math

import pytest
import torch

import ascend_attn_rt as aar
from _harness import S, check_cache_unchanged, check_cache_written, check_output, make_builder, make_impl, run_forward
from _reference import DTYPES, SENTINEL, assert_close, make_batch, write_dense_into_cache

# Core shapes: GQA ratio 4 (8 q heads / 2 kv heads), head size 64, block size 16.
N, NKV, D, BS = 8, 2, 64, 16

DECODE32_SEQ = [(7 * i + 3) % 80 + 1 for i in range(32)]


def _sinks(n):
    # Per-head sink logits spanning "negligible" to "dominant".
    return torch.linspace(-3.0, 4.0, n, dtype=torch.float32)


# name -> case description. `expect` keys: path, state (optional), causal,
# window, sinks (bool).
CASES = {
    "decode_1": dict(seq=[37], q=[1], state=S.DecodeOnly, path="fused_paged"),
    "decode_32": dict(seq=DECODE32_SEQ, q=[1] * 32, state=S.DecodeOnly, path="fused_paged"),
    "prefill_no_cache": dict(seq=[5, 17, 9], q=[5, 17, 9], state=S.PrefillNoCache, path="fused_dense"),
    "prefill_cache_hit": dict(seq=[20, 45, 33], q=[5, 17, 9], state=S.PrefillCacheHit, path="fused_paged"),
    "chunked_mixed": dict(seq=[19, 40, 30, 13], q=[1, 1, 6, 13], state=S.ChunkedPrefill, path="fused_paged"),
    "spec_mtp_3": dict(
        seq=[40, 23, 64, 4], q=[4, 4, 4, 4], state=None, expect_state=S.SpecDecoding, spec=3,
        path="fused_paged"),
    "spec_mtp_7": dict(seq=[50, 8, 33], q=[8, 8, 8], state=None, expect_state=S.SpecDecoding, spec=7,
                       path="fused_paged"),
    "sliding_window": dict(seq=[19, 40, 30, 13], q=[1, 1, 6, 13], state=S.ChunkedPrefill, window=8,
                           path="fused_paged"),
    "sliding_window_decode": dict(seq=[37, 5, 60], q=[1, 1, 1], state=S.DecodeOnly, window=16,
                                  pa_graph=True, path="fused_paged"),
    "sinks": dict(seq=[19, 40, 30, 13], q=[1, 1, 6, 13], state=S.ChunkedPrefill, sinks=True, path="fused_sinks"),
    "sinks_window": dict(seq=[19, 40, 30, 13], q=[1, 1, 6, 13], state=S.ChunkedPrefill, sinks=True, window=8,
                         path="fused_sinks"),
    "sinks_decode": dict(seq=[37, 5, 60], q=[1, 1, 1], state=S.DecodeOnly, sinks=True, path="fused_sinks"),
    "sinks_prefill_no_cache": dict(seq=[5, 17], q=[5, 17], state=S.PrefillNoCache, sinks=True, window=4,
                                   path="fused_sinks"),
    "paged_attention": dict(seq=DECODE32_SEQ[:6], q=[1] * 6, state=S.DecodeOnly, pa_graph=True,
                            path="paged_attention"),
    "encoder_pooling": dict(seq=[5, 17, 9], q=[5, 17, 9], state=None, pooling=True, causal=False,
                            attn_type="encoder_only", path="encoder"),
    "encoder_only_paged": dict(seq=[5, 17, 9], q=[5, 17, 9], state=S.ChunkedPrefill, attn_type="encoder_only",
                               causal=False, path="fused_paged"),
    "encoder_only_dense": dict(seq=[5, 17, 9], q=[5, 17, 9], state=S.PrefillNoCache, attn_type="encoder_only",
                               causal=False, path="fused_dense"),
    "a5_split": dict(seq=[19, 40, 30, 13], q=[1, 1, 6, 13], state=S.ChunkedPrefill, device_kind="a5",
                     path="fused_split"),
}


def _run_case(case, *, dtype, gen, num_heads=N, num_kv_heads=NKV, head_size=D, block_size=BS, scale=None,
              shuffle=True, num_input_tokens=0, builder_extra=None, impl_extra=None):
    batch = make_batch(case["seq"], case["q"], num_heads=num_heads, num_kv_heads=num_kv_heads,
                       head_size=head_size, dtype=dtype, block_size=block_size, gen=gen, shuffle=shuffle,
                       num_input_tokens=num_input_tokens)
    builder_kw, build_kw, impl_kw = {}, {}, {}
    if case.get("spec"):
        builder_kw.update(num_speculative_tokens=case["spec"], spec_method="mtp")
        build_kw["num_spec_tokens"] = torch.full((len(case["q"]),), case["spec"], dtype=torch.int32)
        impl_kw["has_speculative_config"] = True
    if case.get("pooling"):
        builder_kw["pooling"] = True
    causal = case.get("causal", True)
    if not causal:
        build_kw["causal"] = False
    window = case.get("window")
    if window is not None:
        impl_kw["sliding_window"] = window
    sinks = _sinks(num_heads) if case.get("sinks") else None
    if sinks is not None:
        impl_kw["sinks"] = sinks
    if case.get("attn_type"):
        impl_kw["attn_type"] = case["attn_type"]
    if case.get("device_kind"):
        impl_kw["device_kind"] = case["device_kind"]
    if case.get("pa_graph"):
        impl_kw.update(full_decode_only_graph=True, pa_shape_list=[batch.q.shape[0]])
    if scale is not None:
        impl_kw["scale"] = scale
    builder_kw.update(builder_extra or {})
    impl_kw.update(impl_extra or {})
    res = run_forward(batch, state=case["state"], builder_kw=builder_kw, build_kw=build_kw, impl_kw=impl_kw)
    return batch, res, dict(scale=scale, causal=causal, window=window, sinks=sinks)


# ----------------------------------------------------------------------------- core matrix: path x dtype


@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("name", list(CASES))
def test_path_matrix(name, dtype, gen):
    case = CASES[name]
    batch, res, ref_kw = _run_case(case, dtype=DTYPES[dtype], gen=gen)
    if "expect_state" in case:
        assert res.md.attn_state == case["expect_state"]
    elif case["state"] is not None:
        assert res.md.attn_state == case["state"]
    check_output(batch, res, **ref_kw)
    check_cache_written(batch, res)
    assert res.impl.last_path == case["path"]


def test_spec_decode_metadata(gen):
    case = CASES["spec_mtp_3"]
    _, res, _ = _run_case(case, dtype=torch.float32, gen=gen)
    md = res.md
    assert md.attn_state == S.SpecDecoding
    assert res.builder.decode_threshold == 4
    assert (md.num_decodes, md.num_prefills, md.num_decode_tokens) == (4, 0, 16)


# ----------------------------------------------------------------------------- sweeps (fp32, mixed path)


@pytest.mark.parametrize("block_size", [16, 128])
@pytest.mark.parametrize("head_size", [64, 128])
@pytest.mark.parametrize("gqa", [1, 4, 8])
def test_mixed_sweep_gqa_head_block(gqa, head_size, block_size, gen):
    case = dict(seq=[19, 140, 30, 13, 129], q=[1, 1, 6, 13, 2], state=S.ChunkedPrefill)
    batch, res, ref_kw = _run_case(case, dtype=torch.float32, gen=gen, num_heads=8, num_kv_heads=8 // gqa,
                                   head_size=head_size, block_size=block_size)
    check_output(batch, res, **ref_kw)
    check_cache_written(batch, res)
    assert res.impl.last_path == "fused_paged"


@pytest.mark.parametrize("gqa", [1, 8])
@pytest.mark.parametrize("name", ["paged_attention", "prefill_no_cache", "sinks", "sliding_window"])
def test_paths_gqa_extremes(name, gqa, gen):
    batch, res, ref_kw = _run_case(CASES[name], dtype=torch.float32, gen=gen, num_heads=8, num_kv_heads=8 // gqa,
                                   head_size=128, block_size=128)
    check_output(batch, res, **ref_kw)
    check_cache_written(batch, res)
    assert res.impl.last_path == CASES[name]["path"]


@pytest.mark.parametrize("name", ["chunked_mixed", "prefill_no_cache", "paged_attention", "sinks", "encoder_pooling"])
def test_explicit_scale(name, gen):
    batch, res, ref_kw = _run_case(CASES[name], dtype=torch.float32, gen=gen, scale=0.05)
    check_output(batch, res, **ref_kw)


@pytest.mark.parametrize("window", [1, 2, 13, 16, 17, 200])
def test_sliding_window_sizes(window, gen):
    # Window edges around the block size (16) and longer than any sequence.
    case = dict(seq=[19, 40, 30, 13], q=[1, 3, 6, 13], state=S.ChunkedPrefill, window=window)
    batch, res, ref_kw = _run_case(case, dtype=torch.float32, gen=gen)
    check_output(batch, res, **ref_kw)


def test_state_none_treated_as_derived(gen):
    # attn_state=None: the builder derives it (docs/design/gqa.md §2.1); mixed batch -> ChunkedPrefill.
    case = dict(seq=[19, 40, 30, 13], q=[1, 1, 6, 13], state=None)
    batch, res, ref_kw = _run_case(case, dtype=torch.float32, gen=gen)
    assert res.md.attn_state == S.ChunkedPrefill
    check_output(batch, res, **ref_kw)
    check_cache_written(batch, res)


# ----------------------------------------------------------------------------- large head (D=512)


@pytest.mark.parametrize(
    "state,seq,q,device_kind,path",
    [
        (S.PrefillNoCache, [5, 9], [5, 9], "a2", "large_head"),
        (S.ChunkedPrefill, [19, 30], [1, 6], "a2", "large_head"),
        (S.DecodeOnly, [19, 30], [1, 1], "a2", "paged_attention"),
        (S.PrefillNoCache, [5, 9], [5, 9], "a5", "fused_dense"),
    ],
)
def test_large_head_512(state, seq, q, device_kind, path, gen):
    case = dict(seq=seq, q=q, state=state, device_kind=device_kind)
    batch, res, ref_kw = _run_case(case, dtype=torch.float32, gen=gen, num_heads=2, num_kv_heads=1,
                                   head_size=512, builder_extra=dict(dense_context=True))
    check_output(batch, res, **ref_kw)
    check_cache_written(batch, res)
    assert res.impl.last_path == path


def test_large_head_sliding_window_rejected_before_write(gen):
    # The large-head fallback has no window: rejected, and before the KV write.
    batch = make_batch([19, 30], [1, 6], num_heads=2, num_kv_heads=1, head_size=512, dtype=torch.float32,
                       block_size=BS, gen=gen)
    kc, vc = batch.key_cache.clone(), batch.value_cache.clone()
    with pytest.raises(NotImplementedError, match="sliding_window"):
        run_forward(batch, state=S.ChunkedPrefill, impl_kw=dict(sliding_window=8))
    assert torch.equal(kc, batch.key_cache) and torch.equal(vc, batch.value_cache)


# ----------------------------------------------------------------------------- paged-attention selection (docs/design/gqa.md §2.6)


@pytest.mark.parametrize(
    "impl_extra,path",
    [
        (dict(full_decode_only_graph=True), "paged_attention"),
        (dict(full_decode_only_graph=False), "fused_paged"),
        (dict(full_decode_only_graph=True, has_speculative_config=True), "fused_paged"),
        (dict(full_decode_only_graph=True, device_kind="a5"), "fused_paged"),
        (dict(full_decode_only_graph=True, sliding_window=8), "fused_paged"),
    ],
)
def test_paged_attention_selection(impl_extra, path, gen):
    case = dict(seq=[37, 5, 60, 17], q=[1, 1, 1, 1], state=S.DecodeOnly)
    impl_extra = dict(impl_extra, pa_shape_list=[4])
    batch, res, ref_kw = _run_case(case, dtype=torch.float32, gen=gen, impl_extra=impl_extra)
    ref_kw["window"] = impl_extra.get("sliding_window")
    check_output(batch, res, **ref_kw)
    assert res.impl.last_path == path


def test_sinks_decode_with_paged_attention_config(gen):
    # DecodeOnly + the paged-attention rule satisfied + sinks: whatever path is taken, the
    # sinks must take part in the softmax (the PA kernel has no sink argument).
    case = dict(seq=[37, 5, 60, 17], q=[1, 1, 1, 1], state=S.DecodeOnly, sinks=True, pa_graph=True)
    batch, res, ref_kw = _run_case(case, dtype=torch.float32, gen=gen)
    # Paged attention has no sink input, so a correct runtime must not take it here.
    check_output(batch, res, **ref_kw)


def test_paged_attention_shape_not_listed(gen):
    case = dict(seq=[37, 5, 60], q=[1, 1, 1], state=S.DecodeOnly)
    batch, res, ref_kw = _run_case(case, dtype=torch.float32, gen=gen,
                                   impl_extra=dict(full_decode_only_graph=True, pa_shape_list=[4, 8]))
    check_output(batch, res, **ref_kw)
    assert res.impl.last_path == "fused_paged"


# ----------------------------------------------------------------------------- upstream precision specs (docs/design/gqa.md §7), scaled down

# (seq_lens, query_lens); single_* use a shorter context than upstream's 1024.
PRECISION_SPECS = {
    "small_decode": ([32, 40], [1, 1]),
    "small_prefill": ([32, 40], [8, 8]),
    "mixed_small": ([32, 40, 48, 56], [1, 1, 5, 5]),
    "medium_decode_small": ([128, 256, 300, 129], [1, 1, 1, 1]),
    "mixed_medium_small": ([130, 256, 300, 130, 256, 300], [1, 1, 1, 7, 7, 7]),
    "single_decode": ([256], [1]),
    "single_prefill": ([256], [64]),
    "mtp_small": ([64, 128, 256], [4, 4, 4]),
}

# Qwen3-8B: 32 q heads, 8 kv heads, D=128; TP divides both.
TP_HEADS = {2: (16, 4), 4: (8, 2)}


@pytest.mark.parametrize("tp", [2, 4])
@pytest.mark.parametrize("spec", list(PRECISION_SPECS))
def test_upstream_precision_specs(spec, tp):
    g = torch.Generator().manual_seed(42)
    seq, q = PRECISION_SPECS[spec]
    n, nkv = TP_HEADS[tp]
    # Upstream fixture: contiguous (unshuffled) block tables, bf16, block size 128, state None.
    batch = make_batch(seq, q, num_heads=n, num_kv_heads=nkv, head_size=128, dtype=torch.bfloat16, block_size=128,
                       gen=g, shuffle=False)
    res = run_forward(batch, state=None, builder_kw=dict(max_num_reqs=8), impl_kw=dict(scale=1 / math.sqrt(128)))
    check_output(batch, res)
    check_cache_written(batch, res)


@pytest.mark.parametrize("tp", [2, 4])
def test_upstream_precision_encoder_only(tp):
    g = torch.Generator().manual_seed(42)
    seq = [32, 64, 128, 256]  # small_encoder_prefill
    n, nkv = TP_HEADS[tp]
    batch = make_batch(seq, seq, num_heads=n, num_kv_heads=nkv, head_size=128, dtype=torch.bfloat16, block_size=128,
                       gen=g, shuffle=False)
    res = run_forward(batch, state=None, build_kw=dict(causal=False), impl_kw=dict(attn_type="encoder_only"))
    check_output(batch, res, causal=False)
    check_cache_written(batch, res)


# ----------------------------------------------------------------------------- padded tokens


@pytest.mark.parametrize("pad", [1, 3])
@pytest.mark.parametrize("name", ["chunked_mixed", "decode_32", "prefill_no_cache", "sinks", "sliding_window",
                                  "spec_mtp_3"])
def test_padded_tokens_fia_dummy(name, pad, gen):
    case = CASES[name]
    n_act = sum(case["q"])
    batch, res, ref_kw = _run_case(case, dtype=torch.float32, gen=gen, num_input_tokens=n_act + pad)
    md = res.md
    assert md.num_actual_tokens == n_act
    assert md.num_input_tokens == n_act + pad
    assert md.num_reqs == md.num_real_reqs == len(case["q"])
    assert md.num_kernel_reqs == len(case["q"]) + 1
    assert md.num_kernel_tokens == n_act + pad
    assert md.actual_seq_lengths_q[-1] == n_act + pad
    check_output(batch, res, **ref_kw)
    # Padded tokens are never written into the cache.
    check_cache_written(batch, res)


def test_padded_decode_paged_attention(gen):
    # Graph-mode decode padded to a captured size: 3 real decodes, T=4.
    case = dict(seq=[37, 5, 60], q=[1, 1, 1], state=S.DecodeOnly)
    batch, res, ref_kw = _run_case(case, dtype=torch.float32, gen=gen, num_input_tokens=4,
                                   impl_extra=dict(full_decode_only_graph=True, pa_shape_list=[4]))
    assert res.md.num_kernel_reqs == 4 and res.md.num_reqs == 3
    check_output(batch, res, **ref_kw)
    check_cache_written(batch, res)
    assert res.impl.last_path == "paged_attention"


@pytest.mark.parametrize("name", ["chunked_mixed", "decode_32", "prefill_no_cache", "sinks"])
def test_padded_tokens_no_fia_padding(name, gen):
    # pad_fia_batch=False: the kernel sees only the real tokens; padded rows keep the sentinel.
    case = CASES[name]
    n_act = sum(case["q"])
    batch, res, ref_kw = _run_case(case, dtype=torch.float32, gen=gen, num_input_tokens=n_act + 5,
                                   builder_extra=dict(pad_fia_batch=False))
    assert res.md.num_kernel_tokens == n_act
    assert res.md.num_reqs == res.md.num_kernel_reqs == len(case["q"])
    check_output(batch, res, **ref_kw)
    assert bool((res.out[n_act:] == SENTINEL).all())
    check_cache_written(batch, res)


# ----------------------------------------------------------------------------- cache-write variants


@pytest.mark.parametrize("state,seq,q", [
    (S.ChunkedPrefill, [19, 40, 30, 13], [1, 1, 6, 13]),
    (S.DecodeOnly, [37, 5, 60], [1, 1, 1]),
    (S.PrefillCacheHit, [20, 45], [5, 17]),
])
def test_kv_sharing_layer_never_writes(state, seq, q, gen):
    # The owner layer already wrote the new tokens' K/V; the sharing layer only reads.
    batch = make_batch(seq, q, num_heads=N, num_kv_heads=NKV, head_size=D, dtype=torch.float32, block_size=BS,
                       gen=gen, write_new_tokens=True)
    res = run_forward(batch, state=state, impl_kw=dict(kv_sharing=True))
    check_cache_unchanged(batch, res)
    check_output(batch, res)


@pytest.mark.parametrize("state,seq,q,impl_kw,path", [
    (S.ChunkedPrefill, [19, 40, 30, 13], [1, 1, 6, 13], {}, "fused_paged"),
    (S.DecodeOnly, [37, 5, 60], [1, 1, 1], {}, "fused_paged"),
    (S.DecodeOnly, [37, 5, 60], [1, 1, 1], dict(full_decode_only_graph=True, pa_shape_list=[3]), "paged_attention"),
    (S.ChunkedPrefill, [19, 40], [1, 6], dict(sinks=_sinks(N)), "fused_sinks"),
])
def test_no_key_value_means_no_write(state, seq, q, impl_kw, path, gen):
    batch = make_batch(seq, q, num_heads=N, num_kv_heads=NKV, head_size=D, dtype=torch.float32, block_size=BS,
                       gen=gen, write_new_tokens=True)
    res = run_forward(batch, state=state, impl_kw=impl_kw, pass_kv=False)
    check_cache_unchanged(batch, res)
    check_output(batch, res, sinks=impl_kw.get("sinks"))
    assert res.impl.last_path == path


def test_encoder_pooling_without_cache(gen):
    # Encoder-only layers may have no cache at all; the pooling encoder path reads dense K/V.
    batch = make_batch([5, 17, 9], [5, 17, 9], num_heads=N, num_kv_heads=NKV, head_size=D, dtype=torch.float32,
                       block_size=BS, gen=gen)
    res = run_forward(batch, state=None, builder_kw=dict(pooling=True), build_kw=dict(causal=False),
                      impl_kw=dict(attn_type="encoder_only"), caches=False)
    check_output(batch, res, causal=False)
    check_cache_unchanged(batch, res)
    assert res.impl.last_path == "encoder"


def test_metadata_none_zero_output(gen):
    batch = make_batch([19, 40], [1, 6], num_heads=N, num_kv_heads=NKV, head_size=D, dtype=torch.float32,
                       block_size=BS, gen=gen)
    impl = aar.AttentionImpl(N, D, num_kv_heads=NKV)
    out = torch.full_like(batch.q, SENTINEL)
    kc, vc = batch.key_cache.clone(), batch.value_cache.clone()
    ret = impl.forward(batch.q, batch.k, batch.v, batch.key_cache, batch.value_cache, None, out)
    assert ret.data_ptr() == out.data_ptr()
    assert bool((out == 0).all())
    assert impl.last_path == "none"
    assert torch.equal(kc, batch.key_cache) and torch.equal(vc, batch.value_cache)


def test_metadata_reuse_across_layers(gen):
    # One build, several layers (each its own cache): every layer correct.
    b1 = make_batch([19, 40, 30], [1, 1, 6], num_heads=N, num_kv_heads=NKV, head_size=D, dtype=torch.float32,
                    block_size=BS, gen=gen)
    g2 = torch.Generator().manual_seed(99)
    b2 = make_batch([19, 40, 30], [1, 1, 6], num_heads=N, num_kv_heads=NKV, head_size=D, dtype=torch.float32,
                    block_size=BS, gen=g2, num_blocks=b1.num_blocks)
    b2.block_table = b1.block_table  # same table, different caches/data: rebuild b2's context
    b2.new_slots = b1.new_slots
    for r, (s, ql) in enumerate(zip(b2.seq_lens, b2.q_lens)):
        write_dense_into_cache(b2.key_cache, b1.block_table[r], 0, b2.k_full[r][: s - ql])
        write_dense_into_cache(b2.value_cache, b1.block_table[r], 0, b2.v_full[r][: s - ql])
    builder = make_builder(b1)
    md = builder.build(b1.query_start_loc, b1.seq_lens_t, b1.block_table, attn_state=S.ChunkedPrefill)
    for b in (b1, b2):
        impl = make_impl(b)
        out = torch.full_like(b.q, SENTINEL)
        impl.forward(b.q, b.k, b.v, b.key_cache, b.value_cache, md, out)
        assert_close(out, b.reference(), torch.float32)


# ----------------------------------------------------------------------------- unsupported features


def test_alibi_rejected(gen):
    batch = make_batch([19, 40], [1, 6], num_heads=N, num_kv_heads=NKV, head_size=D, dtype=torch.float32,
                       block_size=BS, gen=gen)
    with pytest.raises(NotImplementedError, match=r"(?i)alibi"):
        run_forward(batch, state=S.ChunkedPrefill, impl_kw=dict(alibi_slopes=torch.ones(N)))


def test_logits_soft_cap_rejected(gen):
    batch = make_batch([19, 40], [1, 6], num_heads=N, num_kv_heads=NKV, head_size=D, dtype=torch.float32,
                       block_size=BS, gen=gen)
    with pytest.raises(NotImplementedError, match=r"(?i)soft.?cap"):
        run_forward(batch, state=S.ChunkedPrefill, impl_kw=dict(logits_soft_cap=30.0))


def test_not_implemented_is_runtime_error():
    assert issubclass(NotImplementedError, RuntimeError)
    with pytest.raises(RuntimeError):
        aar.AttentionImpl(N, D, num_kv_heads=NKV, alibi_slopes=torch.ones(N))


def test_int8_kv_cache_dtype_rejected():
    with pytest.raises((NotImplementedError, ValueError), match=r"(?i)kv_cache_dtype|int8"):
        aar.AttentionImpl(N, D, num_kv_heads=NKV, kv_cache_dtype="int8")
