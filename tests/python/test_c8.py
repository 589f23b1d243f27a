"""C8 backend (static INT8 KV cache, docs/design/gqa.md §5) against an independent float64 reference.

The reference here never calls the runtime:
* quantisation q = clamp(round_half_even(x * (1/scale) + offset), -128, 127) (fp32, as
  stated by the backend), dequantisation (q - offset) * scale;
* the NZ cache (nb, Nkv, D/32, bs, 32) is written and read with plain Python indexing:
  token at position p of a request lives at block bt[p // bs], offset p % bs, and its
  (h, d) element at cache[blk, h, d // 32, off, d % 32];
* attention is _reference.reference_attention over K/V that are: for the INT8 decode
  kernel, every position dequantised; for the prefill paths, the cached context
  dequantised and the new tokens at full precision (the runtime's documented fix of
  upstream's re-read through INT8).
Every case uses both a zero and a non-zero offset (upstream drops the offset when it
dequantises; these tests fail if it is dropped anywhere).
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

import ascend_attn_rt as aar
from _reference import (SENTINEL, assert_close, num_blocks_for, random_block_table, reference_attention,
                        slot_of, tolerance)

S = aar.AttentionState
N, NKV, D, BS = 8, 2, 64, 32


# ----------------------------------------------------------------------------- reference helpers


def ref_quant(x, scale, offset):
    inv = 1.0 / scale.float()
    return torch.round(x.float() * inv + offset.float()).clamp(-128, 127).to(torch.int8)


def ref_dequant(q, scale, offset):
    return (q.double() - offset.double()) * scale.double()


def nz_write(cache5, bt_row, start, q_int8):
    """q_int8 (n, Nkv, D) -> positions start.. of the request, NZ layout, by indexing."""
    bs = cache5.shape[3]
    nkv, d = q_int8.shape[1], q_int8.shape[2]
    for i in range(q_int8.shape[0]):
        p = start + i
        blk, off = int(bt_row[p // bs]), p % bs
        cache5[blk, :, :, off, :] = q_int8[i].reshape(nkv, d // 32, 32)


def nz_read(cache5, bt_row, n):
    bs = cache5.shape[3]
    nkv, d1 = cache5.shape[1], cache5.shape[2]
    rows = []
    for p in range(n):
        blk, off = int(bt_row[p // bs]), p % bs
        rows.append(cache5[blk, :, :, off, :].reshape(nkv, d1 * 32))
    return torch.stack(rows) if rows else torch.zeros(0, nkv, d1 * 32, dtype=torch.int8)


def make_scales(gen, kv_sample, offset_kind):
    """Per-channel, per-head scales from the data range (|x/scale| <= 100) and offsets."""
    amax = kv_sample.abs().amax(dim=0).float().clamp_min(1e-3)  # (Nkv, D)
    scale = (amax / 100.0).reshape(1, *amax.shape)
    if offset_kind == "zero":
        offset = torch.zeros_like(scale)
    else:
        offset = torch.randint(-20, 21, scale.shape, generator=gen).float()
    return scale, offset


def make_c8_batch(seq_lens, q_lens, *, gen, dtype=torch.float32, offset="nonzero", num_input_tokens=0,
                  num_heads=N, num_kv_heads=NKV, head_size=D, block_size=BS, write_new_tokens=False):
    need = sum(num_blocks_for(s, block_size) for s in seq_lens)
    num_blocks = need + 3
    bt = random_block_table(seq_lens, block_size, num_blocks, gen)

    def rnd(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float32).to(dtype)

    k_full = [rnd(s, num_kv_heads, head_size) for s in seq_lens]
    v_full = [rnd(s, num_kv_heads, head_size) for s in seq_lens]
    ks, ko = make_scales(gen, torch.cat(k_full), offset)
    vs, vo = make_scales(gen, torch.cat(v_full), offset)
    shape5 = (num_blocks, num_kv_heads, head_size // 32, block_size, 32)
    key_cache = torch.randint(-128, 128, shape5, generator=gen, dtype=torch.int8)  # garbage
    value_cache = torch.randint(-128, 128, shape5, generator=gen, dtype=torch.int8)
    new_k, new_v, slots = [], [], []
    for r, (s, ql) in enumerate(zip(seq_lens, q_lens)):
        ctx = s - ql
        upto = s if write_new_tokens else ctx
        nz_write(key_cache, bt[r], 0, ref_quant(k_full[r][:upto], ks, ko))
        nz_write(value_cache, bt[r], 0, ref_quant(v_full[r][:upto], vs, vo))
        new_k.append(k_full[r][ctx:])
        new_v.append(v_full[r][ctx:])
        slots.extend(slot_of(bt[r], p, block_size) for p in range(ctx, s))
    n_act = sum(q_lens)
    t_in = max(num_input_tokens, n_act)
    pad = t_in - n_act
    k = torch.cat(new_k + [rnd(pad, num_kv_heads, head_size)])
    v = torch.cat(new_v + [rnd(pad, num_kv_heads, head_size)])
    q = rnd(t_in, num_heads, head_size)
    qsl = torch.zeros(len(q_lens) + 1, dtype=torch.int32)
    qsl[1:] = torch.cumsum(torch.tensor(q_lens), 0).to(torch.int32)
    return SimpleNamespace(seq_lens=list(seq_lens), q_lens=list(q_lens), num_blocks=num_blocks, block_table=bt,
                           k_full=k_full, v_full=v_full, k=k, v=v, q=q, qsl=qsl,
                           seq_lens_t=torch.tensor(seq_lens, dtype=torch.int32), key_cache=key_cache,
                           value_cache=value_cache, ks=ks, ko=ko, vs=vs, vo=vo, slots=slots, n_act=n_act,
                           num_input_tokens=num_input_tokens, dtype=dtype, num_heads=num_heads,
                           num_kv_heads=num_kv_heads, head_size=head_size, block_size=block_size)


def reference(b, *, decode_rows_int8, scale=None, causal=True):
    """decode_rows_int8: number of leading requests attended entirely through INT8
    (the decode kernel); the rest see dequantised context + float new tokens."""
    ks, ko, vs, vo = b.ks[0], b.ko[0], b.vs[0], b.vo[0]
    kf, vf = [], []
    for r, (s, ql) in enumerate(zip(b.seq_lens, b.q_lens)):
        cut = s if r < decode_rows_int8 else s - ql
        kd = ref_dequant(ref_quant(b.k_full[r][:cut], ks, ko), ks, ko)
        vd = ref_dequant(ref_quant(b.v_full[r][:cut], vs, vo), vs, vo)
        kf.append(torch.cat([kd, b.k_full[r][cut:].double()]))
        vf.append(torch.cat([vd, b.v_full[r][cut:].double()]))
    scale = 1.0 / math.sqrt(b.head_size) if scale is None else scale
    return reference_attention(b.q[: b.n_act], kf, vf, b.q_lens, scale=scale, causal=causal)


def make_builder(b, **kw):
    cfg = dict(max_num_reqs=16, max_num_tokens=max(64, b.q.shape[0]), max_blocks_per_req=max(8, b.block_table.shape[1]),
               block_size=b.block_size, num_blocks=b.num_blocks)  # dense context: on demand (the default)
    cfg.update(kw)
    return aar.MetadataBuilder(**cfg)


def make_impl(b, **kw):
    kw.setdefault("num_kv_heads", b.num_kv_heads)
    return aar.C8AttentionImpl(b.num_heads, b.head_size, k_scale=b.ks, k_offset=b.ko, v_scale=b.vs, v_offset=b.vo,
                               **kw)


def run(b, *, state=None, builder_kw=None, build_kw=None, impl_kw=None, pass_kv=True, caches=True):
    builder = make_builder(b, **(builder_kw or {}))
    md = builder.build(b.qsl, b.seq_lens_t, b.block_table, num_input_tokens=b.num_input_tokens, attn_state=state,
                       **(build_kw or {}))
    impl = make_impl(b, **(impl_kw or {}))
    kc0, vc0 = b.key_cache.clone(), b.value_cache.clone()
    out = torch.full(b.q.shape, SENTINEL, dtype=b.dtype)
    ret = impl.forward(b.q, b.k if pass_kv else None, b.v if pass_kv else None,
                       b.key_cache if caches else None, b.value_cache if caches else None, md, out)
    assert ret.data_ptr() == out.data_ptr()
    return SimpleNamespace(builder=builder, md=md, impl=impl, out=out, kc0=kc0, vc0=vc0)


def check_int8_cache_written(b, res):
    """New tokens' slots hold ref_quant(new) bit for bit; every other byte unchanged."""
    for cache0, cache, new, sc, off in ((res.kc0, b.key_cache, b.k, b.ks, b.ko),
                                        (res.vc0, b.value_cache, b.v, b.vs, b.vo)):
        expected = cache0.clone()
        qn = ref_quant(new[: b.n_act], sc, off)
        bs = b.block_size
        for t, s in enumerate(b.slots):
            expected[s // bs, :, :, s % bs, :] = qn[t].reshape(b.num_kv_heads, b.head_size // 32, 32)
        assert torch.equal(cache, expected), "NZ int8 cache differs from the expected write"


def check_out(b, res, ref):
    assert_close(res.out[: b.n_act], ref, b.dtype)
    if b.q.shape[0] > b.n_act:
        assert bool((res.out[b.n_act:] == SENTINEL).all()), "padded rows were written"


# ----------------------------------------------------------------------------- backend facts, scales


def test_backend_facts():
    assert aar.C8Backend.name() == "CUSTOM"
    assert aar.C8Backend.supported_block_sizes() == [32, 64, 128]
    assert aar.C8Backend.kv_cache_shape(10, 128, 4, 128) == [2, 10, 4, 4, 128, 32]
    with pytest.raises(ValueError, match="block_size 16"):
        aar.C8Backend.kv_cache_shape(10, 16, 4, 128)
    with pytest.raises(ValueError, match="head_size"):
        aar.C8Backend.kv_cache_shape(10, 128, 4, 80)


def _raw(n, val=0.5):
    return torch.full((n,), val)


def test_scales_per_tensor_local_and_tp_shard():
    # per-tensor scalar broadcasts (upstream's (Nkv,1,D) view of a scalar fails)
    s = aar.c8_prepare_scales(torch.tensor([0.25]), torch.tensor([3.0]), torch.tensor(0.5), torch.tensor([0.0]),
                              num_kv_heads=2, head_size=32)
    assert s.k_scale.shape == (1, 2, 32) and bool((s.k_scale == 0.25).all()) and bool((s.k_offset == 3).all())
    assert s.k_antiquant_scale.shape == (2, 1, 32)
    assert bool((s.k_antiquant_offset == -3).all()), "the kernel computes (x + offset) * scale: offset negated"
    assert s.has_offset
    # local heads
    ks = torch.arange(1, 2 * 32 + 1, dtype=torch.float32)
    s = aar.c8_prepare_scales(ks, torch.zeros(64), ks, torch.zeros(64), num_kv_heads=2, head_size=32)
    assert torch.equal(s.k_scale.flatten(), ks) and not s.has_offset
    assert torch.allclose(s.k_inv_scale.flatten(), 1 / ks)
    # TP shard: 8 heads total, tp 4 -> 2 heads per rank; rank 1 owns heads 2, 3
    full = torch.arange(1, 8 * 32 + 1, dtype=torch.float32).reshape(8, 32)
    s = aar.c8_prepare_scales(full, torch.zeros(8, 32), full, torch.zeros(8, 32), num_kv_heads=2, head_size=32,
                              tp_rank=1, tp_size=4)
    assert torch.equal(s.k_scale[0], full[2:4])
    # replication: 2 heads total, tp 4 -> one head per rank, ranks 0,1 -> head 0; 2,3 -> head 1
    full = torch.arange(1, 2 * 32 + 1, dtype=torch.float32).reshape(2, 32)
    for rank, head in [(0, 0), (1, 0), (2, 1), (3, 1)]:
        s = aar.c8_prepare_scales(full, torch.zeros(2, 32), full, torch.zeros(2, 32), num_kv_heads=1, head_size=32,
                                  tp_rank=rank, tp_size=4)
        assert torch.equal(s.k_scale[0, 0], full[head]), (rank, head)


@pytest.mark.parametrize(
    "which,value,match",
    [
        ("k_scale", torch.zeros(64), r"k_scale\[0\]=0"),
        ("v_scale", torch.tensor([0.5] * 63 + [float("nan")]), r"v_scale\[63\]=nan is not finite"),
        ("k_offset", torch.tensor([float("inf")] + [0.0] * 63), r"k_offset\[0\]=inf is not finite"),
        ("v_offset", torch.zeros(7), r"v_offset has 7 elements"),
        ("k_scale", torch.ones(64, dtype=torch.int32), r"k_scale must be a floating tensor"),
        ("v_scale", torch.ones(6 * 32), r"v_scale holds 6 KV heads"),
    ],
)
def test_bad_scales_rejected(which, value, match):
    raw = dict(k_scale=_raw(64), k_offset=torch.zeros(64), v_scale=_raw(64), v_offset=torch.zeros(64))
    raw[which] = value
    with pytest.raises(ValueError, match=match):
        aar.c8_prepare_scales(**raw, num_kv_heads=2, head_size=32, tp_size=4 if which == "v_scale" and
                              value.numel() == 192 else 1)
    with pytest.raises(ValueError, match=match):
        aar.C8AttentionImpl(4, 32, num_kv_heads=2, **raw, tp_size=4 if value.numel() == 192 else 1)


def test_bad_tp_and_missing_scales():
    raw = dict(k_scale=_raw(64), k_offset=torch.zeros(64), v_scale=_raw(64), v_offset=torch.zeros(64))
    with pytest.raises(ValueError, match="tp_rank=4"):
        aar.c8_prepare_scales(**raw, num_kv_heads=2, head_size=32, tp_rank=4, tp_size=4)
    with pytest.raises(ValueError, match="k_scale, k_offset, v_scale and v_offset"):
        aar.C8AttentionImpl(4, 32, num_kv_heads=2, k_scale=_raw(64))


def test_quantize_round_half_even_and_clamp():
    x = torch.tensor([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.49, 200.0, -300.0, 126.5, -128.5]).reshape(-1, 1, 1)
    one, zero = torch.ones(1, 1, 1), torch.zeros(1, 1, 1)
    q = aar.c8_quantize(x, one, zero)
    assert q.dtype == torch.int8
    assert q.flatten().tolist() == [0, 2, 2, 0, -2, -2, 3, 127, -128, 126, -128]
    # with an offset: round(x + 0.5) for x = 0.0, 1.0, 2.0 -> 0, 2, 2 (ties to even)
    q = aar.c8_quantize(torch.tensor([0.0, 1.0, 2.0]).reshape(-1, 1, 1), one, torch.full((1, 1, 1), 0.5))
    assert q.flatten().tolist() == [0, 2, 2]


@pytest.mark.parametrize("offset", ["zero", "nonzero"])
def test_dequant_paged_to_dense(offset, gen):
    b = make_c8_batch([37, 5, 70], [37, 5, 70], gen=gen, offset=offset, write_new_tokens=True)
    got = aar.c8_dequant_paged_to_dense(b.key_cache, b.block_table, b.seq_lens, b.ks, b.ko, "float32")
    exp = torch.cat([ref_dequant(nz_read(b.key_cache, b.block_table[r], s), b.ks[0], b.ko[0])
                     for r, s in enumerate(b.seq_lens)])
    assert got.shape == exp.shape
    assert torch.allclose(got.double(), exp, atol=1e-6)
    if offset == "nonzero":  # dropping the offset (upstream) would be far off
        assert not torch.allclose(got.double(), exp + b.ko[0].double() * b.ks[0].double(), atol=1e-3)


# ----------------------------------------------------------------------------- decision table

# name -> (seq_lens, q_lens, state, expected path, requests attended through INT8, extra)
CASES = {
    "decode": ([37, 5, 60, 33], [1, 1, 1, 1], S.DecodeOnly, "c8_decode", 4, {}),
    "decode_padded": ([37, 5, 60], [1, 1, 1], S.DecodeOnly, "c8_decode", 3, dict(num_input_tokens=8)),
    "chunked_split": ([19, 40, 30, 13], [1, 1, 6, 13], S.ChunkedPrefill, "c8_chunked_split", 2, {}),
    "chunked_split_all_new": ([19, 40, 6, 13], [1, 1, 6, 13], S.ChunkedPrefill, "c8_chunked_split", 2, {}),
    "chunked_split_padded": ([19, 40, 30, 13], [1, 1, 6, 13], S.ChunkedPrefill, "c8_chunked_split", 2,
                             dict(num_input_tokens=28)),
    "prefill_no_cache": ([5, 17, 9], [5, 17, 9], S.PrefillNoCache, "fused_dense", 0, {}),
    "prefill_cache_hit": ([20, 45, 33], [5, 17, 9], S.PrefillCacheHit, "c8_dequant", 0, {}),
    "chunked_prefill_only": ([20, 45, 33], [5, 17, 9], S.ChunkedPrefill, "c8_dequant", 0, {}),
    "spec_decoding": ([40, 23, 64], [4, 4, 4], S.SpecDecoding, "c8_dequant", 0, dict(spec=3)),
    "chunked_multi_token_decodes": ([40, 23, 64, 30], [3, 3, 2, 10], S.ChunkedPrefill, "c8_dequant", 0,
                                    dict(spec=2)),
    "consumer_decode": ([37, 5, 60], [1, 1, 1], S.DecodeOnly, "c8_decode", 3, dict(kv_transfer="consumer")),
    # upstream returns None for a consumer's non-decode states
    "consumer_chunked": ([19, 40, 30, 13], [1, 1, 6, 13], S.ChunkedPrefill, "c8_chunked_split", 2,
                         dict(kv_transfer="consumer")),
    "consumer_cache_hit": ([20, 45, 33], [5, 17, 9], S.PrefillCacheHit, "c8_dequant", 0,
                           dict(kv_transfer="consumer")),
}


def _run_case(name, *, gen, offset, dtype=torch.float32, scale=None):
    seq, ql, state, path, n_int8, extra = CASES[name]
    b = make_c8_batch(seq, ql, gen=gen, offset=offset, dtype=dtype, num_input_tokens=extra.get("num_input_tokens", 0))
    builder_kw, build_kw, impl_kw = {}, {}, {}
    if extra.get("spec"):
        builder_kw.update(num_speculative_tokens=extra["spec"], spec_method="mtp")
        build_kw["num_spec_tokens"] = torch.full((len(ql),), extra["spec"], dtype=torch.int32)
    if extra.get("kv_transfer"):
        impl_kw["kv_transfer"] = extra["kv_transfer"]
    if scale is not None:
        impl_kw["scale"] = scale
    res = run(b, state=state, builder_kw=builder_kw, build_kw=build_kw, impl_kw=impl_kw)
    return b, res, path, n_int8


@pytest.mark.parametrize("offset", ["zero", "nonzero"])
@pytest.mark.parametrize("name", list(CASES))
def test_decision_table(name, offset, gen):
    b, res, path, n_int8 = _run_case(name, gen=gen, offset=offset)
    assert res.impl.last_path == path
    check_out(b, res, reference(b, decode_rows_int8=n_int8))
    check_int8_cache_written(b, res)


@pytest.mark.parametrize("name", ["decode", "chunked_split", "prefill_cache_hit", "prefill_no_cache"])
def test_bf16_and_explicit_scale(name, gen):
    b, res, path, n_int8 = _run_case(name, gen=gen, offset="nonzero", dtype=torch.bfloat16, scale=0.07)
    assert res.impl.last_path == path
    check_out(b, res, reference(b, decode_rows_int8=n_int8, scale=0.07))


@pytest.mark.parametrize("name", ["decode", "chunked_split", "prefill_cache_hit", "spec_decoding"])
def test_close_to_unquantised_gqa(name, gen):
    """The INT8 result stays within the quantisation error of the float GQA path."""
    b, res, _, _ = _run_case(name, gen=gen, offset="nonzero")
    exact = reference_attention(b.q[: b.n_act], b.k_full, b.v_full, b.q_lens, scale=1 / math.sqrt(D))
    err = (res.out[: b.n_act].double() - exact).abs().max().item()
    # |x/scale| <= 100: relative rounding error <= 0.5%, inputs ~N(0,1)
    assert err < 0.05, err
    assert err > 0.0  # it did go through INT8


def test_encoder_pooling_non_causal(gen):
    b = make_c8_batch([5, 17, 9], [5, 17, 9], gen=gen)
    res = run(b, state=None, builder_kw=dict(pooling=True), build_kw=dict(causal=False),
              impl_kw=dict(attn_type="encoder_only"))
    assert res.impl.last_path == "encoder"
    ref = reference_attention(b.q[: b.n_act], b.k_full, b.v_full, b.q_lens, scale=1 / math.sqrt(D), causal=False)
    check_out(b, res, ref)  # float K/V (upstream feeds the int8 tensors)
    check_int8_cache_written(b, res)


def test_producer_is_float_gqa(gen):
    """A KV producer keeps a float cache: every state (incl. DecodeOnly, where
    upstream returns None) is the float GQA path."""
    from _reference import make_batch
    from _harness import check_output, check_cache_written
    for seq, ql, state in (([37, 5, 60], [1, 1, 1], S.DecodeOnly), ([19, 40, 30], [1, 6, 13], S.ChunkedPrefill)):
        b = make_batch(seq, ql, num_heads=N, num_kv_heads=NKV, head_size=D, dtype=torch.float32, block_size=BS,
                       gen=gen)
        builder = aar.MetadataBuilder(max_num_reqs=8, max_num_tokens=64, max_blocks_per_req=8, block_size=BS,
                                      num_blocks=b.num_blocks)
        md = builder.build(b.query_start_loc, b.seq_lens_t, b.block_table, attn_state=state)
        impl = aar.C8AttentionImpl(N, D, num_kv_heads=NKV, kv_transfer="producer")
        kc0, vc0 = b.key_cache.clone(), b.value_cache.clone()
        out = torch.full(b.q.shape, SENTINEL)
        ret = impl.forward(b.q, b.k, b.v, b.key_cache, b.value_cache, md, out)
        assert impl.last_path == "float"
        check_output(b, SimpleNamespace(ret=ret, out=out, md=md), causal=True)
        check_cache_written(b, SimpleNamespace(kc_before=kc0, vc_before=vc0))


def test_metadata_none_zero_fills(gen):
    b = make_c8_batch([5], [1], gen=gen)
    impl = make_impl(b)
    out = torch.full(b.q.shape, SENTINEL)
    impl.forward(b.q, b.k, b.v, b.key_cache, b.value_cache, None, out)
    assert bool((out == 0).all()) and impl.last_path == "none"


def test_kv_sharing_reads_without_writing(gen):
    b = make_c8_batch([19, 40, 30], [1, 1, 6], gen=gen, write_new_tokens=True)
    res = run(b, state=S.ChunkedPrefill, impl_kw=dict(kv_sharing=True))
    assert torch.equal(res.kc0, b.key_cache) and torch.equal(res.vc0, b.value_cache)
    check_out(b, res, reference(b, decode_rows_int8=2))


def test_cache_only_reads_dequantise_new_tokens_too(gen):
    """key/value None: everything (new tokens included) comes from the INT8 cache."""
    b = make_c8_batch([20, 45, 33], [5, 17, 9], gen=gen, write_new_tokens=True)
    res = run(b, state=S.PrefillCacheHit, pass_kv=False)
    assert res.impl.last_path == "c8_dequant"
    check_out(b, res, reference(b, decode_rows_int8=3))


def test_declared_nd_shape_cache_is_nz(gen):
    """The cache may be given with its declared ND shape (nb, bs, Nkv, D); its bytes are NZ."""
    b = make_c8_batch([37, 5, 60], [1, 1, 1], gen=gen)
    nd_k = b.key_cache.view(b.num_blocks, BS, NKV, D)
    nd_v = b.value_cache.view(b.num_blocks, BS, NKV, D)
    builder = make_builder(b)
    md = builder.build(b.qsl, b.seq_lens_t, b.block_table, attn_state=S.DecodeOnly)
    impl = make_impl(b)
    kc0, vc0 = b.key_cache.clone(), b.value_cache.clone()
    out = torch.full(b.q.shape, SENTINEL)
    impl.forward(b.q, b.k, b.v, nd_k, nd_v, md, out)
    check_out(b, SimpleNamespace(out=out), reference(b, decode_rows_int8=3))
    check_int8_cache_written(b, SimpleNamespace(kc0=kc0, vc0=vc0))


def test_decode_call_exposes_capture_arguments(gen):
    b = make_c8_batch([37, 5, 60], [1, 1, 1], gen=gen, offset="nonzero")
    res = run(b, state=S.DecodeOnly)
    call = res.impl.decode_call(b.q, res.md, 3, res.out)
    assert call["input_layout"] == "BNSD" and call["sparse_mode"] == 0 and call["inner_precise"] == 1
    assert call["query"].shape == (3, N, 1, D) and call["output"].shape == (3, N, 1, D)
    assert call["key"].shape == b.key_cache.shape and call["key"].dtype == torch.int8
    assert call["block_table"].shape[0] == 3
    assert call["actual_seq_lengths_kv"] == [37, 5, 60]
    assert call["key_antiquant_scale"].shape == (NKV, 1, D)
    assert torch.equal(call["key_antiquant_offset"], -b.ko.reshape(NKV, 1, D))
    assert call["block_size"] == BS and call["key_antiquant_mode"] == 0
    b0 = make_c8_batch([37], [1], gen=gen, offset="zero")
    r0 = run(b0, state=S.DecodeOnly)
    assert r0.impl.decode_call(b0.q, r0.md, 1, r0.out)["key_antiquant_offset"] is None  # symmetric


# ----------------------------------------------------------------------------- rejections


def test_unsupported_features_rejected():
    raw = dict(k_scale=_raw(64), k_offset=torch.zeros(64), v_scale=_raw(64), v_offset=torch.zeros(64))
    with pytest.raises(NotImplementedError, match="sliding_window"):
        aar.C8AttentionImpl(4, 32, num_kv_heads=2, sliding_window=8, **raw)
    with pytest.raises(NotImplementedError, match="sinks"):
        aar.C8AttentionImpl(4, 32, num_kv_heads=2, sinks=torch.zeros(4), **raw)
    with pytest.raises(NotImplementedError, match="soft-cap"):
        aar.C8AttentionImpl(4, 32, num_kv_heads=2, logits_soft_cap=30.0, **raw)
    with pytest.raises(ValueError, match="multiple of 32"):
        aar.C8AttentionImpl(4, 40, num_kv_heads=2, k_scale=_raw(80), k_offset=torch.zeros(80), v_scale=_raw(80),
                            v_offset=torch.zeros(80))
    with pytest.raises(ValueError, match="kv_transfer"):
        aar.C8AttentionImpl(4, 32, num_kv_heads=2, kv_transfer="both", **raw)


def test_forward_rejects_bad_cache_before_writing(gen):
    b = make_c8_batch([19, 40], [1, 6], gen=gen)
    builder = make_builder(b)
    md = builder.build(b.qsl, b.seq_lens_t, b.block_table, attn_state=S.ChunkedPrefill)
    impl = make_impl(b)
    out = torch.zeros(b.q.shape)
    with pytest.raises(ValueError, match="key_cache must be int8"):
        impl.forward(b.q, b.k, b.v, b.key_cache.float(), b.value_cache, md, out)
    kc0 = b.key_cache.clone()
    bad_v = torch.zeros(b.num_blocks, NKV, D // 32, 64, 32, dtype=torch.int8)  # block size 64 != 32
    with pytest.raises(ValueError, match="block_size"):
        impl.forward(b.q, b.k, b.v, b.key_cache, bad_v, md, out)
    assert torch.equal(kc0, b.key_cache)
    with pytest.raises(ValueError, match="key dtype"):
        impl.forward(b.q, b.k.half(), b.v.half(), b.key_cache, b.value_cache, md, out)


# ----------------------------------------------------------------------------- the CPU twin's antiquant arguments


def _twin(q, kc, vc, bt, kv_lens, **kw):
    return torch.ops.ascend_cpu.npu_fused_infer_attention_score(
        q, kc, vc, block_table=bt, actual_seq_lengths_kv=kv_lens, num_heads=N, num_key_value_heads=NKV,
        scale=0.125, input_layout="BNSD", block_size=BS, inner_precise=1, **kw)[0]


def test_twin_antiquant_arguments(gen):
    b = make_c8_batch([37, 5], [1, 1], gen=gen, write_new_tokens=True)
    q = b.q[:2].unsqueeze(2)
    aks, avs = b.ks.reshape(NKV, 1, D), b.vs.reshape(NKV, 1, D)
    ako, avo = -b.ko.reshape(NKV, 1, D), -b.vo.reshape(NKV, 1, D)
    got = _twin(q, b.key_cache, b.value_cache, b.block_table, [37, 5], key_antiquant_scale=aks,
                value_antiquant_scale=avs, key_antiquant_offset=ako, value_antiquant_offset=avo)
    assert got.shape == (2, N, 1, D)
    check_out(SimpleNamespace(q=b.q[:2], n_act=2, dtype=torch.float32), SimpleNamespace(out=got.squeeze(2)),
              reference(SimpleNamespace(**{**vars(b), "q_lens": [1, 1], "n_act": 2}), decode_rows_int8=2,
                        scale=0.125))
    # Through torch.ops every rejection here surfaces as RuntimeError.
    with pytest.raises(RuntimeError, match="key_antiquant_mode=1"):
        _twin(q, b.key_cache, b.value_cache, b.block_table, [37, 5], key_antiquant_scale=aks,
              value_antiquant_scale=avs, key_antiquant_mode=1, value_antiquant_mode=1)
    with pytest.raises(RuntimeError, match="not supported by the CPU twin: key_antiquant_scale in this combination"):
        _twin(q, b.key_cache, b.value_cache, b.block_table, [37, 5], key_antiquant_scale=aks)
    with pytest.raises(RuntimeError, match="not supported by the CPU twin: value_antiquant_offset"):
        _twin(q.float(), b.key_cache.float(), b.value_cache.float(), b.block_table, [37, 5],
              value_antiquant_offset=avo)
    with pytest.raises(RuntimeError, match="int8 key"):
        _twin(q, b.key_cache, b.value_cache, b.block_table, [37, 5])
    with pytest.raises(RuntimeError, match="key_antiquant_scale of shape"):
        _twin(q, b.key_cache, b.value_cache, b.block_table, [37, 5], key_antiquant_scale=aks.reshape(NKV, D),
              value_antiquant_scale=avs)
