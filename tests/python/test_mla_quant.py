"""Quantised MLA layers (issue 10) against the float64 MLA reference run with the dequantised weights
(_quant_reference): the W8A8 native paths (static and dynamic projections, decode + prefill + chunked
context), the W8A8-static MLAPO decode (vllm-ascend's mla_preprocess) and the W8A8-dynamic fused prolog,
each equal to the native path on the same weights (the same quantisation, so within float rounding), the
fallbacks to the native path, the FA-quant layer (int8 NZ latent cache; npu_mla_prolog_v2 + fully
quantised FIA v2 decode; the prefill write decided in mla/impl.h), graph capture of the fused decodes, and
bad configurations rejected by name."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

import ascend_attn_rt as aar
from _mla_reference import MlaDims, attend_request, fill_context, half_split, make_weights, project, rope_tables
from _quant_reference import from_nz, quantize_latent, quantize_mla_weights, to_nz

mla = aar.mla
F64 = torch.float64
# Activation quantisation (int8, ~1% per element) against the reference with the dequantised weights.
QTOL = dict(atol=4e-2, rtol=4e-2)
FA_SCALE = 4.5 / 127  # the FA-quant latent cache's dequant scale (c_kv is RMSNorm'd: |c| < ~4.5)


def setup(seq_lens, q_lens, *, quant="w8a8_static", dtype=torch.float32, bs=16, spec=0, workspace=0, seed=0,
          dims=None, fa=False, builder_kw=None, **impl_kw):
    """A quantised layer's weights, caches holding the context (FA-quant: int8 NZ latent, NZ rope), the
    step's metadata, the hidden states and the reference output with the dequantised weights."""
    d = dims or MlaDims()
    g = torch.Generator().manual_seed(seed)
    ws = make_weights(d, dtype, g)
    kw, deq = quantize_mla_weights(ws, quant, dtype) if quant != "none" else (dict(ws), ws)
    B = len(seq_lens)
    per_req = [math.ceil(s / bs) for s in seq_lens]
    nb = sum(per_req) + 3
    perm = torch.randperm(nb, generator=g).tolist()
    table = torch.zeros(B, max(per_req), dtype=torch.int32)
    blocks, k = [], 0
    for r, n in enumerate(per_req):
        blocks.append(perm[k:k + n])
        table[r, :n] = torch.tensor(perm[k:k + n], dtype=torch.int32)
        k += n
    nope = torch.randn(nb, bs, 1, d.L, generator=g).to(dtype)
    rope = torch.randn(nb, bs, 1, d.R, generator=g).to(dtype)
    xs = [torch.randn(s, d.hidden, generator=g, dtype=F64).to(dtype) for s in seq_lens]
    for r in range(B):
        fill_context(d, deq, xs[r][: seq_lens[r] - q_lens[r]], nope, rope, blocks[r], bs)
    if fa:
        # The int8 latent of the context, quantised like the layer writes it.
        lat = torch.randint(-100, 100, (nb, bs, 1, d.L), generator=g, dtype=torch.int8)
        for r in range(B):
            n = seq_lens[r] - q_lens[r]
            if n:
                _, _, c, _ = project(d, deq, xs[r][:n], torch.arange(n))
                q8 = quantize_latent(c, FA_SCALE)
                for p in range(n):
                    lat[blocks[r][p // bs], p % bs, 0] = q8[p]
        nope = to_nz(lat)
        rope = to_nz(rope)
        impl_kw.setdefault("fa_quant_kv_scale", FA_SCALE)
        impl_kw.setdefault("enable_kv_nz", True)
    qsl = torch.tensor([0] + list(torch.tensor(q_lens).cumsum(0)), dtype=torch.int32)
    cos, sin = rope_tables(max(seq_lens) + 4, d.R)
    bkw = dict(max_num_reqs=8, max_num_tokens=256, max_blocks_per_req=table.shape[1], block_size=bs, num_blocks=nb,
               cos_table=cos.to(dtype), sin_table=sin.to(dtype), num_speculative_tokens=spec,
               workspace_tokens=workspace)
    bkw.update(builder_kw or {})
    builder = mla.MetadataBuilder(**bkw)
    md = builder.build(qsl, torch.tensor(seq_lens, dtype=torch.int32), table)
    scale = 1.0 / math.sqrt(d.P + d.R)
    base = dict(num_heads=d.H, hidden_size=d.hidden, q_lora_rank=d.Q, kv_lora_rank=d.L, qk_nope_head_dim=d.P,
                qk_rope_head_dim=d.R, v_head_dim=d.V, scale=scale, **kw)
    hidden = torch.cat([xs[r][seq_lens[r] - q_lens[r]:] for r in range(B)])
    ref = torch.cat([attend_request(d, deq, xs[r], q_lens[r], scale) for r in range(B)])
    return SimpleNamespace(d=d, kw=base, impl_kw=impl_kw, builder=builder, md=md, nope=nope, rope=rope, hidden=hidden,
                           ref=ref, xs=xs, blocks=blocks, table=table, bs=bs, deq=deq, qsl=qsl, gen=g)


def run(c, **extra):
    """Runs a fresh layer on copies of the caches: (impl, output, nope, rope)."""
    impl = mla.Impl(**c.kw, **{**c.impl_kw, **extra})
    nope, rope = c.nope.clone(), c.rope.clone()
    out = torch.full_like(c.hidden, 7.0)
    impl.forward(c.hidden, nope, rope, c.md, out)
    return impl, out, nope, rope


def close(a, b, **tol):
    torch.testing.assert_close(a.to(F64), b.to(F64), **tol)


# ------------------------------------------------------------------------------- native W8A8 projections


@pytest.mark.parametrize("quant", ["w8a8_static", "w8a8_dynamic"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_native_w8a8_layer_matches_the_reference_with_dequantised_weights(quant, dtype):
    # Two decodes, a prefill with context in two chunks, a prefill without context.
    c = setup([12, 20, 40, 9], [1, 1, 7, 9], quant=quant, dtype=dtype, workspace=16)
    impl, out, *_ = run(c)
    assert impl.last_decode_path == "native" and impl.fused_decode_path == "none"
    assert c.md.num_context_chunks >= 2
    close(out, c.ref, **(QTOL if dtype == torch.float32 else dict(atol=6e-2, rtol=6e-2)))


def test_native_w8a8_static_float16_layer():
    # docs/design/mla.md §4.5: npu_quant_matmul documents float16 output with float32 scales and an int32 bias
    # (A2/A3 table, eager); the native preprocess takes fp16 W8A8-static weights. fp16's own rounding is far
    # below the int8 activation quantisation's error (QTOL).
    c = setup([12, 20, 40, 9], [1, 1, 7, 9], quant="w8a8_static", dtype=torch.float16, workspace=16)
    impl, out, *_ = run(c)
    assert impl.last_decode_path == "native"
    close(out, c.ref, **QTOL)


def test_quantised_and_float_weights_differ_only_by_quantisation():
    # The dequantised weights given as float weights reproduce the reference tightly: the tolerance above
    # is the activation quantisation's, nothing else.
    c = setup([12, 20, 40], [1, 1, 7], quant="none", workspace=16)
    dq = setup([12, 20, 40], [1, 1, 7], quant="w8a8_static", workspace=16)
    kw = {k: v for k, v in c.kw.items() if k not in ("q_a_proj", "q_proj", "kv_a_proj_with_mqa")}
    for k in ("q_a_proj", "q_proj", "kv_a_proj_with_mqa"):
        kw[k] = dq.deq[k]
    impl = mla.Impl(**kw)
    nope, rope = dq.nope.clone(), dq.rope.clone()
    out = torch.zeros_like(dq.hidden)
    impl.forward(dq.hidden, nope, rope, dq.md, out)
    close(out, dq.ref, atol=1e-4, rtol=1e-4)
    _, qout, *_ = run(dq)
    err = (qout.to(F64) - dq.ref).abs().max()
    assert 1e-4 < err < 4e-2, err  # quantised: measurably different, within the quantisation error


# ------------------------------------------------------------------------------- MLAPO (W8A8 static)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mlapo_decode_equals_the_native_w8a8_path(dtype):
    c = setup([5, 17, 33], [1, 1, 1], quant="w8a8_static", dtype=dtype)
    native, out_n, nope_n, rope_n = run(c)
    fused, out_f, nope_f, rope_f = run(c, enable_mlapo=True)
    assert fused.fused_decode_path == "mlapo" and fused.last_decode_path == "mlapo"
    assert native.last_decode_path == "native"
    # The same quantisation on both paths: equal within float rounding.
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    close(out_f, out_n, **tol)
    close(nope_f, nope_n, **tol)
    close(rope_f, rope_n, **tol)
    close(out_f, c.ref, **(QTOL if dtype == torch.float32 else dict(atol=6e-2, rtol=6e-2)))


def test_mlapo_speculative_decode():
    c = setup([12, 20], [2, 2], quant="w8a8_static", spec=1)
    impl, out, *_ = run(c, enable_mlapo=True)
    assert impl.last_decode_path == "mlapo"
    close(out, c.ref, **QTOL)


def test_mlapo_falls_back_to_native_on_mixed_steps():
    c = setup([12, 20, 40], [1, 1, 7], quant="w8a8_static", workspace=16)
    impl, out, *_ = run(c, enable_mlapo=True)
    assert impl.last_decode_path == "native"  # docs/design/mla.md §5.1: prefills present
    _, out_n, *_ = run(c)
    close(out, out_n, atol=1e-6, rtol=1e-6)


def test_mlapo_falls_back_to_native_above_1024_decode_tokens():
    # Graph decode padding to 1025 kernel tokens (dummy requests attend nothing).
    c = setup([9, 14], [1, 1], quant="w8a8_static",
              builder_kw=dict(graph_decode_padding=True, max_num_reqs=1100, max_num_tokens=1100))
    md = c.builder.build(c.qsl, torch.tensor([9, 14], dtype=torch.int32), c.table, num_input_tokens=1025)
    assert md.decode_num_kernel_tokens == 1025
    hidden = torch.cat([c.hidden, torch.zeros(1023, c.d.hidden)])
    out = torch.zeros_like(hidden)
    impl = mla.Impl(**c.kw, enable_mlapo=True)
    impl.forward(hidden, c.nope.clone(), c.rope.clone(), md, out)
    assert impl.last_decode_path == "native"
    close(out[:2], c.ref, **QTOL)
    md = c.builder.build(c.qsl, torch.tensor([9, 14], dtype=torch.int32), c.table, num_input_tokens=1024)
    impl.forward(hidden[:1024], c.nope.clone(), c.rope.clone(), md, out[:1024])
    assert impl.last_decode_path == "mlapo"
    close(out[:2], c.ref, **QTOL)


def test_mlapo_with_nz_caches():
    c = setup([5, 17, 33], [1, 1, 1], quant="w8a8_static")
    impl = mla.Impl(**c.kw, enable_mlapo=True, enable_kv_nz=True)
    nope, rope = to_nz(c.nope), to_nz(c.rope)
    out = torch.zeros_like(c.hidden)
    impl.forward(c.hidden, nope, rope, c.md, out)
    assert impl.last_decode_path == "mlapo"
    _, out_n, nope_n, rope_n = run(c)
    close(out, out_n, atol=1e-5, rtol=1e-5)
    close(from_nz(nope), nope_n, atol=1e-5, rtol=1e-5)
    close(from_nz(rope), rope_n, atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------------------- W8A8-dynamic fused prolog


def test_prolog_v3_w8a8_dynamic_equals_the_native_w8a8_path():
    c = setup([5, 17, 33], [1, 1, 1], quant="w8a8_dynamic")
    native, out_n, nope_n, rope_n = run(c)
    fused, out_f, nope_f, rope_f = run(c, enable_prolog=True)
    assert fused.last_decode_path == "prolog"
    close(out_f, out_n, atol=1e-5, rtol=1e-5)
    close(nope_f, nope_n, atol=1e-5, rtol=1e-5)
    close(rope_f, rope_n, atol=1e-5, rtol=1e-5)
    close(out_f, c.ref, **QTOL)


# ------------------------------------------------------------------------------- FA-quant layers


def _fa_expected_latent(c, r, n_ctx, q):
    """The int8 latent rows of request r's new tokens (positions n_ctx .. n_ctx + q)."""
    _, _, lat, _ = project(c.d, c.deq, c.xs[r][: n_ctx + q], torch.arange(n_ctx + q))
    return quantize_latent(lat[n_ctx:], FA_SCALE)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fa_quant_decode(dtype):
    c = setup([5, 17, 33], [1, 1, 1], quant="w8a8_dynamic", dtype=dtype, fa=True)
    impl, out, nope, rope = run(c)
    assert impl.fused_decode_path == "fa_quant" and impl.last_decode_path == "fa_quant"
    assert nope.dtype == torch.int8 and nope.dim() == 5
    # int8 query, int8 latent: a few percent.
    close(out, c.ref, atol=8e-2, rtol=8e-2)
    # The new tokens' latent rows: rint(c_kv / scale), within one step (float rounding of c_kv).
    lat = from_nz(nope)
    for r, s in enumerate([5, 17, 33]):
        blk, off = c.blocks[r][(s - 1) // c.bs], (s - 1) % c.bs
        want = _fa_expected_latent(c, r, s - 1, 1)[0]
        assert (lat[blk, off, 0].to(torch.int32) - want.to(torch.int32)).abs().max() <= 1


def test_fa_quant_speculative_decode():
    c = setup([12, 20], [2, 2], quant="w8a8_dynamic", spec=1, fa=True)
    impl, out, *_ = run(c)
    assert impl.last_decode_path == "fa_quant"
    close(out, c.ref, atol=8e-2, rtol=8e-2)


def test_fa_quant_prefill_writes_the_int8_cache_and_reads_its_context():
    # The decision of mla/impl.h: the prefill writes rint(c_kv / scale) rows into the NZ int8 cache, attends
    # its new tokens at full precision and its context dequantised; a mixed step's decodes go through the
    # FA-quant prolog.
    c = setup([12, 20, 40, 9], [1, 1, 7, 9], quant="w8a8_dynamic", fa=True, workspace=16)
    impl, out, nope, rope = run(c)
    assert impl.last_decode_path == "fa_quant"
    assert c.md.num_context_chunks >= 2
    close(out, c.ref, atol=8e-2, rtol=8e-2)
    lat = from_nz(nope)
    for r, (s, q) in enumerate(zip([12, 20, 40, 9], [1, 1, 7, 9])):
        want = _fa_expected_latent(c, r, s - q, q)
        for i in range(q):
            p = s - q + i
            got = lat[c.blocks[r][p // c.bs], p % c.bs, 0].to(torch.int32)
            assert (got - want[i].to(torch.int32)).abs().max() <= 1, (r, i)
    # Prefill-only steps (no context) too.
    c2 = setup([6, 9], [6, 9], quant="w8a8_dynamic", fa=True)
    _, out2, *_ = run(c2)
    close(out2, c2.ref, atol=5e-2, rtol=5e-2)


def test_fa_quant_decode_and_prefill_write_the_same_rows():
    # A token written by the prolog (decode) and by the prefill path: the same int8 row (within one step)
    # and the same rope row.
    c = setup([9], [1], quant="w8a8_dynamic", fa=True)
    _, _, nope_d, rope_d = run(c)
    c2 = setup([9], [9], quant="w8a8_dynamic", fa=True)
    _, _, nope_p, rope_p = run(c2)
    blk, off = c.blocks[0][8 // c.bs], 8 % c.bs
    blk2, off2 = c2.blocks[0][8 // c2.bs], 8 % c2.bs
    a, b = from_nz(nope_d)[blk, off, 0].to(torch.int32), from_nz(nope_p)[blk2, off2, 0].to(torch.int32)
    assert (a - b).abs().max() <= 1
    close(from_nz(rope_d)[blk, off, 0], from_nz(rope_p)[blk2, off2, 0], atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------------------- graph capture


@pytest.mark.parametrize("kind", ["mlapo", "fa_quant"])
def test_fused_quantised_decode_graph_replays_like_eager(kind):
    fa = kind == "fa_quant"
    quant = "w8a8_dynamic" if fa else "w8a8_static"
    c = setup([16, 16, 16, 16], [1, 1, 1, 1], quant=quant, fa=fa)
    extra = {} if fa else dict(enable_mlapo=True)
    layer = mla.Impl(**c.kw, **c.impl_kw, **extra)
    hidden_s, out_s = torch.zeros(4, c.d.hidden), torch.zeros(4, c.d.hidden)
    nope, rope = c.nope.clone(), c.rope.clone()
    graph = aar.GraphParams("recording")
    with graph.capture(4):
        layer.forward(hidden_s, nope, rope, c.md, out_s)
    assert [x[0] for x in graph.calls(4)] == ["prepare", "fia_v2", "prepare"]
    for seq in ([5, 17, 33, 9], [40, 2, 11, 23]):
        hidden = torch.randn(4, c.d.hidden, generator=c.gen)
        seq_t = torch.tensor([min(s, 16 * c.table.shape[1]) for s in seq], dtype=torch.int32)
        md = c.builder.build(c.qsl, seq_t, c.table)
        e_nope, e_rope = nope.clone(), rope.clone()
        e_out = torch.zeros_like(out_s)
        mla.Impl(**c.kw, **c.impl_kw, **extra).forward(hidden, e_nope, e_rope, md, e_out)
        hidden_s.copy_(hidden)
        graph.update(4, md)
        graph.replay(4)
        close(out_s, e_out, atol=1e-5, rtol=1e-5)
        assert torch.equal(nope, e_nope) and torch.equal(rope, e_rope)


# ------------------------------------------------------------------------------- bad configurations


def _kw(quant="w8a8_static", dtype=torch.float32, dims=None):
    d = dims or MlaDims()
    ws = make_weights(d, dtype, torch.Generator().manual_seed(1))
    kw, _ = quantize_mla_weights(ws, quant, dtype) if quant != "none" else (ws, ws)
    return dict(num_heads=d.H, hidden_size=d.hidden, q_lora_rank=d.Q, kv_lora_rank=d.L, qk_nope_head_dim=d.P,
                qk_rope_head_dim=d.R, v_head_dim=d.V, **kw), ws


def test_bad_quantised_configurations_are_rejected_by_name():
    kw, ws = _kw("w8a8_dynamic")
    with pytest.raises(ValueError, match="enable_mlapo needs W8A8-static weights"):
        mla.Impl(**kw, enable_mlapo=True)
    kw_none, _ = _kw("none")
    with pytest.raises(ValueError, match="enable_mlapo needs W8A8-static weights"):
        mla.Impl(**kw_none, enable_mlapo=True)
    kw_s, _ = _kw("w8a8_static")
    with pytest.raises(RuntimeError, match="mla_preprocess takes no epsilon"):
        mla.Impl(**kw_s, enable_mlapo=True, q_norm_eps=1e-5)
    with pytest.raises(ValueError, match="at most one"):
        mla.Impl(**kw, enable_prolog=True, fa_quant_kv_scale=0.02, enable_kv_nz=True)
    with pytest.raises(ValueError, match="needs W8A8-dynamic weights"):
        mla.Impl(**kw_s, fa_quant_kv_scale=0.02, enable_kv_nz=True)
    with pytest.raises(ValueError, match="set enable_kv_nz"):
        mla.Impl(**kw, fa_quant_kv_scale=0.02)
    with pytest.raises(ValueError, match="must be positive"):
        mla.Impl(**kw, fa_quant_kv_scale=0.0, enable_kv_nz=True)
    kw5, _ = _kw("w8a8_dynamic", dims=MlaDims(H=5))
    with pytest.raises(RuntimeError, match="FA-quant layer with 5 heads"):
        mla.Impl(**kw5, fa_quant_kv_scale=0.02, enable_kv_nz=True)
    # MLAPO with float16 activations: the fp16 kernel's int64 descales (undocumented layout); native fp16 runs.
    with pytest.raises(NotImplementedError, match="MLAPO.*float16 activations.*npu_trans_quant_param"):
        mla.Impl(**_kw("w8a8_static", dtype=torch.float16)[0], enable_mlapo=True)
    # int8 weights under quant type mxfp8 (and float32 activations): named (test_mla_mxfp8 has the MXFP8 layers)
    with pytest.raises(ValueError, match="MXFP8 weights need bfloat16 or float16 activations"):
        mla.Impl(**{**kw, "quant": mla.QuantWeights("mxfp8", kw["quant"].fused_qkv_a_proj, kw["quant"].q_proj)})
    with pytest.raises(ValueError, match="quant_type must be one of"):
        mla.QuantWeights("int4", kw["quant"].fused_qkv_a_proj, kw["quant"].q_proj)
    # Float projections next to quantised ones, missing / extra static parameters, wrong shapes.
    with pytest.raises(ValueError, match="do not pass them"):
        mla.Impl(**kw, q_proj=ws["q_proj"])
    f = kw_s["quant"].fused_qkv_a_proj
    with pytest.raises(ValueError, match="needs input_scale, input_offset and quant_bias"):
        mla.Impl(**{**kw_s, "quant": mla.QuantWeights("w8a8_static", mla.QuantLinear(f.weight, f.weight_scale),
                                                      kw_s["quant"].q_proj)})
    with pytest.raises(ValueError, match="belong to W8A8-static linears"):
        mla.Impl(**{**kw, "quant": mla.QuantWeights("w8a8_dynamic", f, kw["quant"].q_proj)})
    with pytest.raises(ValueError, match=r"fused_qkv_a_proj.weight must be"):
        mla.Impl(**{**kw, "quant": mla.QuantWeights("w8a8_dynamic", mla.QuantLinear(
            f.weight.to(torch.float32), f.weight_scale), kw["quant"].q_proj)})
    with pytest.raises(ValueError, match=r"q_proj.weight_scale must have shape"):
        q = kw["quant"].q_proj
        mla.Impl(**{**kw, "quant": mla.QuantWeights("w8a8_dynamic", kw["quant"].fused_qkv_a_proj,
                                                    mla.QuantLinear(q.weight, q.weight_scale[:-1]))})


def test_fa_quant_caches_are_checked_by_name():
    c = setup([5, 17], [1, 1], quant="w8a8_dynamic", fa=True)
    impl = mla.Impl(**c.kw, **c.impl_kw)
    out = torch.zeros_like(c.hidden)
    with pytest.raises(ValueError, match="int8 latent cache"):
        impl.forward(c.hidden, to_nz(from_nz(c.nope).to(torch.float32)), c.rope.clone(), c.md, out)
    before = c.nope.clone()
    with pytest.raises(ValueError, match="nope_cache must be the 5-D NZ cache"):
        impl.forward(c.hidden, from_nz(c.nope).contiguous(), c.rope, c.md, out)
    assert torch.equal(c.nope, before)


def test_mlapo_weights_layout():
    # docs/design/mla.md §4.4: kv rows (rope permuted) before q rows; NZ staging of (out, in); per-head rope permutation.
    kw, ws = _kw("w8a8_static")
    d = MlaDims()
    w = mla.prepare_mlapo_weights(num_heads=d.H, hidden_size=d.hidden, q_lora_rank=d.Q, kv_lora_rank=d.L,
                                  qk_nope_head_dim=d.P, qk_rope_head_dim=d.R, v_head_dim=d.V,
                                  q_a_layernorm=ws["q_a_layernorm"], kv_a_layernorm=ws["kv_a_layernorm"],
                                  kv_b_proj=ws["kv_b_proj"], o_proj=ws["o_proj"], quant=kw["quant"])
    f = kw["quant"].fused_qkv_a_proj
    W = f.weight  # (Q + L + R, hidden)
    kv = W[d.Q:]
    perm = torch.cat([torch.arange(d.L), d.L + torch.arange(0, d.R, 2), d.L + torch.arange(1, d.R, 2)])
    want = torch.cat([kv[perm], W[: d.Q]])  # (L + R + Q, hidden)
    z = w["wd_qkv"]
    assert z.shape == (1, d.hidden // 32, d.L + d.R + d.Q, 32)
    nd = z[0].permute(1, 0, 2).reshape(z.shape[2], -1)
    assert torch.equal(nd[:, : d.hidden], want)
    deq = f.weight_scale * f.input_scale.to(torch.float32)
    torch.testing.assert_close(w["deq_scale_qkv"], torch.cat([deq[d.Q:][perm], deq[: d.Q]]))
    assert torch.equal(w["quant_bias_qkv"], torch.cat([f.quant_bias[d.Q:][perm], f.quant_bias[: d.Q]]))
    q = kw["quant"].q_proj
    hp = torch.cat([torch.arange(d.P), d.P + torch.arange(0, d.R, 2), d.P + torch.arange(1, d.R, 2)])
    rows = torch.cat([h * (d.P + d.R) + hp for h in range(d.H)])
    zq = w["wu_q"]
    ndq = zq[0].permute(1, 0, 2).reshape(zq.shape[2], -1)
    assert torch.equal(ndq[: d.H * (d.P + d.R), : d.Q], q.weight[rows])
    assert torch.equal(ndq[:, d.Q:], torch.zeros_like(ndq[:, d.Q:]))  # Q=48 padded to 64 columns


# ------------------------------------------------------------------------------- no-compute provider


def test_quantised_paths_run_on_the_no_compute_provider():
    # Host work only: every quantised path dispatches (shapes consistent), nothing is written.
    cases = [
        (setup([5, 17, 33], [1, 1, 1], quant="w8a8_static"), dict(enable_mlapo=True), "mlapo"),
        (setup([12, 20, 40, 9], [1, 1, 7, 9], quant="w8a8_static", workspace=16), {}, "native"),
        (setup([5, 17, 33], [1, 1, 1], quant="w8a8_dynamic"), dict(enable_prolog=True), "prolog"),
        (setup([12, 20, 40, 9], [1, 1, 7, 9], quant="w8a8_dynamic", fa=True, workspace=16), {}, "fa_quant"),
    ]
    aar.set_provider("no_compute")
    try:
        for c, extra, path in cases:
            impl = mla.Impl(**c.kw, **{**c.impl_kw, **extra})
            nope, rope = c.nope.clone(), c.rope.clone()
            impl.forward(c.hidden, nope, rope, c.md, torch.zeros_like(c.hidden))
            assert impl.last_decode_path == path
            assert torch.equal(nope, c.nope) and torch.equal(rope, c.rope)
    finally:
        aar.set_provider("auto")


@pytest.mark.parametrize("extra", [dict(enable_mlapo=True), {}])
def test_reload_quantised_weights_in_place(extra):
    # docs/design/mla.md §4.6: new W8A8 weights are copied into the layer's tensors and the derived ones (W8A8 linears,
    # MLAPO weights) recomputed in place; the layer then computes like a fresh one.
    c = setup([5, 17, 33], [1, 1, 1], quant="w8a8_static")
    impl = mla.Impl(**c.kw, **extra)
    c2 = setup([5, 17, 33], [1, 1, 1], quant="w8a8_static", seed=1)
    impl.reload_weights(**{k: c2.kw[k] for k in ("q_a_layernorm", "kv_a_layernorm", "kv_b_proj", "o_proj", "quant")})
    out = torch.zeros_like(c2.hidden)
    impl.forward(c2.hidden, c2.nope.clone(), c2.rope.clone(), c2.md, out)
    _, fresh, *_ = run(c2, **extra)
    close(out, fresh, atol=1e-6, rtol=1e-6)
    with pytest.raises(ValueError, match="the new weights are w8a8_dynamic"):
        c3 = setup([5], [1], quant="w8a8_dynamic")
        impl.reload_weights(**{k: c3.kw[k] for k in ("q_a_layernorm", "kv_a_layernorm", "kv_b_proj", "o_proj",
                                                     "quant")})
