# The DSA layer with a W8A8-dynamic prolog (docs/design/dsa.md §5.4): wq_a, wq_b and wkv int8 with float32
# per-output-channel scales, x and qr quantised per token (npu_dynamic_quant), the three projections through
# npu_quant_matmul; against the float64 reference of the same quantised computation
# (tests/python/_dsa_reference.py: quant_per_token, _linear), and its checkpoint loading.
#
# Tolerance. The reference quantises in float64, the twins in float32. The codes are the same whenever no
# pre-quantisation value sits within the implementation's drift of a rounding tie:
#  * x: exact in float32; s = amax / 127 and x / s are each one float32 rounding (2^-24 relative), so x / s
#    drifts by at most 127 * 2 * 2^-24 = 1.5e-5 code units;
#  * qr = RMSNorm(qa) * q_norm: its codes are 127 qr_k / max|qr|, where the RMS factor cancels; what remains is
#    qa = int32 sum (exact) * s_w * s_x (two float32 roundings) times q_norm (one), for the element and for the
#    row maximum: about 127 * 2 * 5 * 2^-24 = 7.6e-5 code units.
# The float32 tests use inputs (seeded, searched deterministically) whose tie margins (ref.tie_margin) exceed
# 5e-5 for x and 4e-4 for qr (3x and 5x the drift), so the codes agree and the layer differs from the reference
# only by float32 arithmetic: the float32 layer tests' tolerance (2e-5 relative to the output's scale) applies.
# bfloat16 rounds qa and qr to 8 bits before their quantisation: a code may move by one step (1/127 of the row's
# maximum, the size of the bf16 rounding of that maximum, 1/256, times two), so the bf16 tests keep the bf16 layer
# tolerance (3e-2), which covers both.
import pytest
import torch

import ascend_attn_rt as aar
import _dsa_reference as ref
from _dsa_harness import LayerRun
from test_dsa import OpLog, check_topk, dims, tol

F64 = torch.float64
MARGIN_X, MARGIN_QR = 5e-5, 4e-4


def quantised_inputs(d, dtype, nreq, tokens, seed=0):
    """W8A8 prolog weights and per-request token streams; for float32, the first seed from `seed` whose first
    `tokens` tokens of every request clear the tie margins above (bfloat16: `seed` itself)."""
    for s in range(seed, seed + 1000):
        g = torch.Generator().manual_seed(s)
        w = ref.quantise_prolog(ref.make_dsa_weights(d, dtype, g))
        x = [torch.randn(400, d.hidden, generator=g, dtype=F64).to(dtype) for _ in range(nreq)]
        if dtype != torch.float32:
            return w, x
        if all(min(m - t for m, t in zip(ref.prolog_tie_margins(d, w, xb[:tokens]), (MARGIN_X, MARGIN_QR))) > 0
               for xb in x):
            return w, x
    raise AssertionError("no seed clears the tie margins")


def check(run, reqs, qlens, out, qsl, S):
    d = run.d
    at, rt = tol(run.dtype)
    topk = run.impl.last_topk if d.ratio == 4 else None
    for i, b in enumerate(reqs):
        tk = topk[qsl[i]: qsl[i + 1], 0].to(torch.int64) if topk is not None else None
        want = ref.dsa_layer(d, run.w, run.x[b][: S[i]], qlens[i], run.cos, run.sin, topk=tk)
        got = out[qsl[i]: qsl[i + 1]].to(F64)
        torch.testing.assert_close(got, want, atol=at * max(1.0, want.abs().max().item()), rtol=rt)
        # the SWA cache rows: the quantised prolog's kv
        kv = ref.swa_rows(d, run.w, run.x[b][: S[i]], run.cos, run.sin)
        torch.testing.assert_close(run.slot_rows(run.swa, "swa", b, S[i]).to(F64), kv, atol=at * 4, rtol=rt)
    if d.ratio == 4:
        check_topk(run, reqs, qlens, qsl, S, topk)


def steps_of(ratio):
    if ratio == 128:
        return [([0], [130]), ([0], [1]), ([0], [3]), ([0], [1])]
    return [([0, 1], [9, 13]), ([0, 1], [6, 2]), ([0, 1], [1, 1]), ([0, 1], [1, 3]), ([0, 1], [1, 1])]


@pytest.mark.parametrize("ratio", [1, 4, 128])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_w8a8_prolog_multi_step_against_reference(ratio, dtype):
    d = dims(ratio, q_lora=16) if ratio == 128 else dims(ratio)
    steps = steps_of(ratio)
    nreq = max(max(r) for r, _ in steps) + 1
    tokens = max(sum(q[r.index(b)] for r, q in steps if b in r) for b in range(nreq))
    w, x = quantised_inputs(d, dtype, nreq, tokens)
    run = LayerRun(d, "a2", dtype, nreq, w=w, x=x)
    assert run.impl.w8a8_prolog
    for reqs, qlens in steps:
        out, qsl, S = run.step(reqs, qlens)
        check(run, reqs, qlens, out, qsl, S)


@pytest.mark.parametrize("ratio", [1, 4])
def test_w8a8_prolog_on_the_a5_bf16_plan(ratio):
    # The A5 + BF16 (SparseFlashMla) plan has plain rows: the prolog is the same code.
    d = dims(ratio)
    w, x = quantised_inputs(d, torch.float32, 2, 24, seed=3)
    run = LayerRun(d, "a5_bf16", torch.float32, 2, w=w, x=x)
    for reqs, qlens in steps_of(ratio)[:3]:
        out, qsl, S = run.step(reqs, qlens)
        check(run, reqs, qlens, out, qsl, S)


@pytest.mark.parametrize("ratio", [1, 4])
def test_w8a8_prolog_calls_the_quantised_operators(ratio):
    # x quantised once for wq_a and wkv (npu_dynamic_quant), three npu_quant_matmul calls. qr for wq_b: on a layer
    # without an indexer the fused npu_rms_norm_dynamic_quant (only its codes are needed); on a C4 layer with its
    # own selection the RMSNorm, then npu_dynamic_quant (the indexer reads the float qr) - besides the indexer's own
    # query and key quantisations.
    d = dims(ratio)
    w, x = quantised_inputs(d, torch.float32, 1, 8)
    run = LayerRun(d, "a2", torch.float32, 1, w=w, x=x)
    with OpLog() as log:
        run.step([0], [5])
    names = [n for n, _ in log.calls]
    assert sum("npu_quant_matmul" in n for n in names) == 3
    fused = sum("npu_rms_norm_dynamic_quant" in n for n in names)
    assert fused == (1 if ratio == 1 else 0)
    # C4: x, qr, the indexer query and the indexer keys
    assert sum("npu_dynamic_quant." in n for n in names) == (1 if ratio == 1 else 4)


# ----------------------------------------------------------------------------------------------------------------
# npu_rms_norm_dynamic_quant (vllm-ascend, _C_ascend): the fused RMSNorm + per-token int8 quantisation of the prolog's
# qr, against the unfused sequence (the RMSNorm, then npu_dynamic_quant) and against its float64 definition.

def _rms_ref(x, gamma, eps, beta=None, smooth=None):
    x = x.to(F64)
    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * gamma.to(F64)
    if beta is not None:
        y = y + beta.to(F64)
    if smooth is not None:
        y = y * smooth.to(F64)
    return y


def test_rms_norm_dynamic_quant_twin_equals_the_unfused_sequence():
    va, npu = torch.ops.ascend_cpu_va, torch.ops.ascend_cpu
    g = torch.Generator().manual_seed(21)
    eps = 1e-6
    x = torch.randn(3, 7, 48, generator=g) * 3  # 3-D: the rows are the leading dims
    x[1, 4] = 0  # an all-zero row: scale 0, codes 0
    gamma = torch.rand(48, generator=g) + 0.5
    q, s = va.npu_rms_norm_dynamic_quant(x, gamma, None, None, eps)
    assert q.dtype == torch.int8 and q.shape == x.shape and s.dtype == torch.float32 and s.shape == (3, 7)
    # fp32: the unfused sequence, the RMSNorm in fp32 followed by npu_dynamic_quant, is the same arithmetic: the
    # same codes and scales, bit for bit
    y = (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * gamma).to(torch.float32)
    q2, s2 = npu.npu_dynamic_quant(y)
    assert torch.equal(q, q2) and torch.equal(s, s2)
    assert s[1, 4] == 0 and not q[1, 4].any()
    # against the float64 definition, with beta and a smooth scale: the scale amax / 127 within float32 rounding;
    # the codes of the float64 row wherever the value is more than 1e-4 code units from a rounding tie (the float32
    # drift of y / s is about 127 * 2 * 5 * 2^-24 = 7.6e-5 units, as test_dsa_w8a8's qr), within one step elsewhere
    beta = torch.randn(48, generator=g) * 0.1
    smooth = torch.rand(48, generator=g) + 0.5
    q3, s3 = va.npu_rms_norm_dynamic_quant(x, gamma, smooth, beta, eps)
    _check_codes(q3, s3, _rms_ref(x, gamma, eps, beta, smooth))


def _check_codes(q, s, y):
    """q, s (the twin's) against the float64 rows y: scales within float32 rounding, codes equal away from ties."""
    codes, scale = ref.quant_per_token(y)
    torch.testing.assert_close(s.to(F64), scale.squeeze(-1), atol=0, rtol=1e-6)
    v = (y / torch.where(scale == 0, torch.ones_like(scale), scale)).abs()
    clear = ((v - v.floor()) - 0.5).abs() > 1e-4
    diff = (q.to(F64) - codes).abs()
    assert bool((diff[clear] == 0).all()) and diff.max() <= 1
    assert clear.to(F64).mean() > 0.99


def test_rms_norm_dynamic_quant_bf16_is_the_unrounded_norm():
    # bfloat16 x: the fused twin quantises the fp32 normed row; the unfused sequence rounds it to bf16 first, so
    # its codes may differ by one step (the bf16 rounding of y is 2^-9 of y, at most 127 * 2^-9 = 0.25 code
    # units, enough to cross a rounding point), never more; the fused codes are the float64 definition's.
    va, npu = torch.ops.ascend_cpu_va, torch.ops.ascend_cpu
    g = torch.Generator().manual_seed(22)
    x = (torch.randn(32, 64, generator=g) * 2).to(torch.bfloat16)
    gamma = (torch.rand(64, generator=g) + 0.5).to(torch.bfloat16)
    q, s = va.npu_rms_norm_dynamic_quant(x, gamma, None, None, 1e-6)
    yb = aar_rms_bf16(x, gamma, 1e-6)
    q2, _ = npu.npu_dynamic_quant(yb)
    diff = (q.to(torch.int32) - q2.to(torch.int32)).abs()
    assert diff.max() <= 1 and diff.sum() > 0
    _check_codes(q, s, _rms_ref(x, gamma, 1e-6))


def aar_rms_bf16(x, gamma, eps):
    """The layer's unfused RMSNorm on bf16 rows: fp32 maths, the result rounded to bf16 (ops::dense::rms_norm)."""
    f = x.float()
    return (f * torch.rsqrt(f.pow(2).mean(-1, keepdim=True) + eps) * gamma.float()).to(torch.bfloat16)


def test_rms_norm_dynamic_quant_bad_input_named():
    va = torch.ops.ascend_cpu_va
    x, gamma = torch.randn(4, 16), torch.ones(16)
    with pytest.raises(Exception, match=r"gamma must have shape \(16\)"):
        va.npu_rms_norm_dynamic_quant(x, torch.ones(8), None, None, 1e-6)
    with pytest.raises(Exception, match=r"beta must have shape \(16\)"):
        va.npu_rms_norm_dynamic_quant(x, gamma, None, torch.ones(3), 1e-6)
    with pytest.raises(Exception, match="epsilon must be positive"):
        va.npu_rms_norm_dynamic_quant(x, gamma, None, None, 0.0)
    with pytest.raises(Exception, match="x must have at least 2 dims"):
        va.npu_rms_norm_dynamic_quant(torch.randn(16), gamma, None, None, 1e-6)
    with pytest.raises(Exception, match="x must be float16/bfloat16/float32"):
        va.npu_rms_norm_dynamic_quant(torch.ones(4, 16, dtype=torch.int32), gamma, None, None, 1e-6)
    # the no-compute provider: the shapes only
    q, s = torch.ops.ascend_noop_va.npu_rms_norm_dynamic_quant(x, gamma, None, None, 1e-6)
    assert q.dtype == torch.int8 and q.shape == (4, 16) and s.dtype == torch.float32 and s.shape == (4,)


def test_w8a8_prolog_is_near_the_dequantised_layer():
    # Sanity of the quantisation itself: the W8A8 layer is within a few int8 steps of the float layer with the
    # dequantised weights (codes * scale). Per-token int8 of x and qr is 1/254 of the row maximum at most per
    # element; through the layer that stays well below 5% of the output's scale.
    d = dims(4)
    w, x = quantised_inputs(d, torch.float32, 1, 16)
    deq = dict(w)
    for k in ("wq_a", "wq_b", "wkv"):
        deq[k] = w[k].to(torch.float32) * deq.pop(k + "_scale").unsqueeze(1)
    a = LayerRun(d, "a2", torch.float32, 1, w=w, x=x)
    b = LayerRun(d, "a2", torch.float32, 1, w=deq, x=x)
    assert not b.impl.w8a8_prolog
    oa, _, _ = a.step([0], [16])
    ob, _, _ = b.step([0], [16])
    assert (oa - ob).abs().max() <= 0.05 * ob.abs().max()
    assert not torch.equal(oa, ob)


def small_kw(ratio=1, **dkw):
    d = dims(ratio, **dkw)
    base = dict(hidden_size=d.hidden, num_heads=d.N, head_dim=d.D, rope_dim=d.R, q_lora_rank=d.q_lora, window=d.W,
                o_groups=d.G, o_lora_rank=d.o_lora, compress_ratio=ratio, index_n_heads=d.n_idx,
                index_head_dim=d.Di, index_topk=d.K)
    return d, base


def test_w8a8_prolog_bad_weights_named():
    d, kw = small_kw()
    w = ref.quantise_prolog(ref.make_dsa_weights(d, torch.bfloat16, torch.Generator().manual_seed(1)))
    part = {k: v for k, v in w.items() if k != "wkv_scale"}
    with pytest.raises(ValueError, match="wq_a_scale, wq_b_scale and wkv_scale together, got wq_a_scale wq_b_scale"):
        aar.dsa.Impl(part, **kw)
    with pytest.raises(ValueError, match=r"weight wq_b is BFloat16, expected Char \(int8\)"):
        aar.dsa.Impl({**w, "wq_b": w["wq_b"].to(torch.bfloat16)}, **kw)
    with pytest.raises(ValueError, match=r"weight wkv_scale must have shape \(64\)"):
        aar.dsa.Impl({**w, "wkv_scale": w["wkv_scale"].unsqueeze(1)}, **kw)
    with pytest.raises(ValueError, match="weight wq_a_scale is BFloat16, expected Float"):
        aar.dsa.Impl({**w, "wq_a_scale": w["wq_a_scale"].to(torch.bfloat16)}, **kw)
    # the activation dtype is wo_b's: the other float weights must follow it
    with pytest.raises(ValueError, match="weight q_norm is Float, expected BFloat16"):
        aar.dsa.Impl({**w, "q_norm": w["q_norm"].float()}, **kw)
    assert aar.dsa.Impl(w, **kw).w8a8_prolog


@pytest.mark.parametrize("ratio", [1, 4], ids=["swa", "c4"])
def test_w8a8_prolog_on_the_a5_fp8_row_plan(ratio):
    # The A5 fp8-row plan (docs/design/dsa.md §5.4): the prolog's int8 matmuls give the bf16 kv rows that
    # kv_compress_epilog quantises to the 640-byte fp8 rows, as a float layer's. Checked with test_dsa_a5.py's
    # machinery, whose references take the W8A8 weights (the float64 reference quantises x and qr as §5.4): the
    # output against the float64 layer over the decoded fp8 rows (the bf16 arithmetic tolerance of that file) and
    # against the unquantised-cache reference within the measured fp8 effect; the rows bit-exact against the MXFP8
    # model of the A2 plan's bf16 rows of the same W8A8 layer (the same prolog code); the C4 selection against the
    # fp8 indexer scores.
    import test_dsa_a5 as a5t
    d = a5t.dims(ratio)
    g = torch.Generator().manual_seed(11)
    w = ref.quantise_prolog(ref.make_dsa_weights(d, torch.bfloat16, g))
    x = [torch.randn(400, d.hidden, generator=g, dtype=F64).to(torch.bfloat16) for _ in range(3)]
    a5 = a5t.Run(d, "a5", 3, w=w, x=x)
    a2 = a5t.Run(d, "a2", 3, w=w, x=x)
    assert a5.impl.w8a8_prolog and a2.impl.w8a8_prolog
    for reqs, qlens in a5t.PLANS[ratio][:4]:
        out5, qsl, S = a5.step(reqs, qlens)
        out2, _, _ = a2.step(reqs, qlens)
        assert torch.isfinite(out5).all()
        if ratio == 4:
            a5t.check_topk(a5, reqs, qlens, qsl, S)
        a5t.check_step(a5, a2, reqs, qlens, out5, out2, qsl, S)
        for b in reqs:
            a5t.check_caches(a5, a2, b)


# ----------------------------------------------------------------------------------------------------------------
# checkpoint loading (docs/design/dsa.md §7): ModelSlim's W8A8-dynamic names, int8 weight + weight_scale (out, 1)
# + weight_offset (out, 1) zeros.

# field -> (DeepSeek's published name, transformers' name)
NAMES = {"wq_a": ("wq_a.weight", "q_a_proj.weight"), "q_norm": ("q_norm.weight", "q_a_norm.weight"),
         "wq_b": ("wq_b.weight", "q_b_proj.weight"), "wkv": ("wkv.weight", "kv_proj.weight"),
         "kv_norm": ("kv_norm.weight", "kv_norm.weight"), "attn_sink": ("attn_sink", "sinks"),
         "wo_b": ("wo_b.weight", "o_b_proj.weight"),
         "cmp_wkv": ("compressor.wkv.weight", "compressor.kv_proj.weight"),
         "cmp_wgate": ("compressor.wgate.weight", "compressor.gate_proj.weight"),
         "cmp_ape": ("compressor.ape", "compressor.position_bias"),
         "cmp_norm": ("compressor.norm.weight", "compressor.kv_norm.weight"),
         "idx_wq_b": ("indexer.wq_b.weight", "compressor.indexer.q_b_proj.weight"),
         "idx_weights_proj": ("indexer.weights_proj.weight", "compressor.indexer.scorer.weights_proj.weight"),
         "idx_cmp_wkv": ("indexer.compressor.wkv.weight", "compressor.indexer.kv_proj.weight"),
         "idx_cmp_wgate": ("indexer.compressor.wgate.weight", "compressor.indexer.gate_proj.weight"),
         "idx_cmp_ape": ("indexer.compressor.ape", "compressor.indexer.position_bias"),
         "idx_cmp_norm": ("indexer.compressor.norm.weight", "compressor.indexer.kv_norm.weight")}
PRE = "layers.3.attn."


def w8a8_state(d, w, hf=False, scale_dtype=torch.float32):
    """A checkpoint of the layer's weights w (quantise_prolog's) under DeepSeek's published names or transformers',
    the prolog's scales and zero offsets stored (out, 1)."""
    n = 1 if hf else 0
    st = {PRE + names[n]: w[k] for k, names in NAMES.items() if k in w}
    G, O = d.G, d.o_lora
    st[PRE + ("o_a_proj.weight" if hf else "wo_a.weight")] = w["wo_a"].transpose(1, 2).reshape(G * O, -1).contiguous()
    for k in ("wq_a", "wq_b", "wkv"):
        base = PRE + NAMES[k][n][: -len("weight")]
        st[base + "weight_scale"] = w[k + "_scale"].unsqueeze(1).to(scale_dtype)
        st[base + "weight_offset"] = torch.zeros(w[k].shape[0], 1)
    return st


def load_kw(d):
    return dict(hidden_size=d.hidden, num_heads=d.N, head_dim=d.D, q_lora_rank=d.q_lora, compress_ratio=d.ratio,
                index_n_heads=d.n_idx, index_head_dim=d.Di, o_groups=d.G, o_lora_rank=d.o_lora)


@pytest.mark.parametrize("hf", [False, True])
def test_w8a8_checkpoint_loads_and_runs(hf):
    d = dims(4)
    w, x = quantised_inputs(d, torch.float32, 1, 16, seed=5)
    st = w8a8_state(d, w, hf=hf)
    before = {k: v.clone() for k, v in st.items()}
    got = aar.dsa.weights_from_checkpoint(st, PRE, **load_kw(d))
    for k in ("wq_a", "wq_b", "wkv"):
        assert got[k].dtype == torch.int8 and torch.equal(got[k], w[k])
        assert got[k + "_scale"].dtype == torch.float32 and got[k + "_scale"].shape == (w[k].shape[0],)
        assert torch.equal(got[k + "_scale"], w[k + "_scale"])
    assert torch.equal(got["wo_a"], w["wo_a"])
    assert all(torch.equal(st[k], before[k]) for k in st)  # the caller's tensors are not written
    a = LayerRun(d, "a2", torch.float32, 1, w=got, x=x)
    b = LayerRun(d, "a2", torch.float32, 1, w=w, x=x)
    assert a.impl.w8a8_prolog
    oa, qsl, S = a.step([0], [12])
    ob, _, _ = b.step([0], [12])
    assert torch.equal(oa, ob)
    check(a, [0], [12], oa, qsl, S)


def test_w8a8_checkpoint_scales_of_another_dtype_and_flat_shape():
    # bf16-stored scales are read as float32; (out) scales are as good as (out, 1).
    d = dims(1)
    w = ref.quantise_prolog(ref.make_dsa_weights(d, torch.bfloat16, torch.Generator().manual_seed(4)))
    st = w8a8_state(d, w, scale_dtype=torch.bfloat16)
    st[PRE + "wkv.weight_scale"] = st[PRE + "wkv.weight_scale"].squeeze(1)
    del st[PRE + "wkv.weight_offset"]
    got = aar.dsa.weights_from_checkpoint(st, PRE, **load_kw(d))
    for k in ("wq_a", "wq_b", "wkv"):
        assert got[k + "_scale"].dtype == torch.float32
        assert torch.equal(got[k + "_scale"], w[k + "_scale"].to(torch.bfloat16).float())
    assert got["q_norm"].dtype == torch.bfloat16  # the activation dtype is wo_b's


def test_w8a8_checkpoint_problems_named():
    d = dims(1)
    w = ref.quantise_prolog(ref.make_dsa_weights(d, torch.bfloat16, torch.Generator().manual_seed(4)))
    full = w8a8_state(d, w)
    kw = load_kw(d)
    missing = {k: v for k, v in full.items() if k != PRE + "wkv.weight_scale"}
    with pytest.raises(ValueError, match=r"missing: 'layers\.3\.attn\.wkv\.weight_scale'"):
        aar.dsa.weights_from_checkpoint(missing, PRE, **kw)
    offset = {**full, PRE + "wq_b.weight_offset": torch.ones(d.N * d.D, 1)}
    with pytest.raises(NotImplementedError, match=r"'layers\.3\.attn\.wq_b\.weight_offset' holds non-zero zero points"):
        aar.dsa.weights_from_checkpoint(offset, PRE, **kw)
    float_b = {**full, PRE + "wq_b.weight": torch.zeros(d.N * d.D, d.q_lora, dtype=torch.bfloat16)}
    with pytest.raises(ValueError, match=r"'layers\.3\.attn\.wq_b\.weight' is BFloat16 .* expected int8"):
        aar.dsa.weights_from_checkpoint(float_b, PRE, **kw)
    no_scales = {k: v for k, v in full.items() if not k.endswith(("weight_scale", "weight_offset"))}
    with pytest.raises(ValueError, match=r"'layers\.3\.attn\.wq_a\.weight' is Char, expected bfloat16"):
        aar.dsa.weights_from_checkpoint(no_scales, PRE, **kw)
    # the other linears stay unquantised: a scale there is refused by key
    wo_b_scaled = {**full, PRE + "wo_b.weight_scale": torch.ones(d.hidden, 1)}
    with pytest.raises(NotImplementedError, match=r"'layers\.3\.attn\.wo_b\.weight_scale' is a quantisation scale"):
        aar.dsa.weights_from_checkpoint(wo_b_scaled, PRE, **kw)
