"""torch_npu's MX-fp8 operators, the A5 o_proj of the DeepSeek-V4 attention (docs/design/dsa.md §5.2, §4.1), through
the dispatcher: the CPU twins (``torch.ops.ascend_cpu``) of ``npu_dynamic_mx_quant`` and
``npu_transpose_quant_batchmatmul`` against the float64 model in ``_mx_reference.py`` (written from the torch_npu
2.14.0 docs and the OCP MX format, no torch fp8 casts), their refusals by name, and the no-compute kernels
(``torch.ops.ascend_noop``) for shapes.

Through the dispatcher, bad input arrives as ValueError naming the argument and value; the combinations the twins
do not implement as RuntimeError saying "not supported by the CPU twin" and naming the argument.

Tolerances: the quantiser is exact (bit-equal elements and scale bytes); the batched matmul's products of decoded
values are exact in float32, its float32 sums and the final bf16 / fp16 rounding are allowed: one ulp of the output
dtype of the float64 result plus k 2^-24 of the sum of |terms| (any summation order)."""

import pytest
import torch

import ascend_attn_rt  # noqa: F401  (registers the namespaces)
import _mx_reference as mx

CPU = torch.ops.ascend_cpu
NOOP = torch.ops.ascend_noop
F64 = torch.float64
FP8 = torch.float8_e4m3fn
E8M0 = torch.float8_e8m0fnu
E4M3 = 24  # torch.float8_e4m3fn as the ScalarType value torch passes to an `int` dtype argument
BF16, FP16 = 15, 5


@pytest.fixture(autouse=True)
def _inference():
    with torch.inference_mode():
        yield


def varied(shape, g, dtype):
    """Values over many binades per block, with zero blocks, exact powers of two, saturating maxima
    (1.9 * 2^k scales to 486 under the OCP rule) and tiny ones."""
    x = torch.randn(*shape, generator=g, dtype=F64) * torch.pow(2.0, torch.randint(-12, 12, shape, generator=g))
    flat = x.view(-1)
    n = flat.numel()
    flat[: min(32, n)] = 0.0                     # a zero block
    flat[32:40] = torch.tensor([1.0, -2.0, 4.0, 0.5, 0.25, -1.0, 8.0, 16.0], dtype=F64)[: max(0, min(8, n - 32))]
    if n > 70:
        flat[64] = 1.9 * 2.0 ** 5                # a block whose max saturates
        flat[65] = 1.8 * 2.0 ** 5
        flat[66] = -1.76 * 2.0 ** 5              # scaled to -450.56: saturates too
    if n > 100:
        flat[96:128] = torch.randn(32, generator=g, dtype=F64) * 2.0 ** -20  # a block of tiny values
    return x.to(dtype)


def check_quant(x, y, s, block=32, scale_alg=0, max_low_bound=0.0):
    q, e = mx.quantize(x.to(F64), block, scale_alg, max_low_bound)
    assert y.dtype == FP8 and y.shape == x.shape
    assert s.dtype == torch.uint8
    want_s = mx.scale_bytes(e)
    assert s.shape == want_s.shape, (s.shape, want_s.shape)
    assert torch.equal(s, want_s)
    yv = y.to(F64)
    both_nan = torch.isnan(yv) & torch.isnan(q)
    assert torch.equal(torch.where(both_nan, 0.0, yv), torch.where(both_nan, 0.0, q))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("shape", [(5, 2, 512), (3, 96), (7, 4, 160), (2, 64)])
@pytest.mark.parametrize("scale_alg", [0, 1])
def test_dynamic_mx_quant_matches_the_model(dtype, shape, scale_alg):
    g = torch.Generator().manual_seed(sum(shape) * 7 + scale_alg + dtype.itemsize)
    x = varied(shape, g, dtype)
    y, s = CPU.npu_dynamic_mx_quant(x, dst_type=E4M3, scale_alg=scale_alg)
    check_quant(x, y, s, scale_alg=scale_alg)
    # torch_npu's own float8_e4m3fn code (292, named in the doc) is the same target
    y2, s2 = CPU.npu_dynamic_mx_quant(x, dst_type=292, scale_alg=scale_alg)
    assert torch.equal(y.view(torch.uint8), y2.view(torch.uint8)) and torch.equal(s, s2)


def test_dynamic_mx_quant_rules_on_chosen_blocks():
    # One block per row: amax 1.9 * 2^5 -> OCP e = 5 - 8 = -3 (x / 2^-3 = 486.4 saturates to 448);
    # ceil rule: 448 * 2^e >= 60.8 -> e = -2 (60.8 / 0.25 = 243.2 -> 240, no saturation).
    x = torch.zeros(3, 32, dtype=torch.float32)
    x[0, 0], x[0, 1] = 1.9 * 32, 1.0
    x[1, 0] = 1.0  # an exact power of two: OCP e = -8, ceil e = -8 (448 * 2^-9 = 0.875 < 1)
    y0, s0 = CPU.npu_dynamic_mx_quant(x, dst_type=E4M3)
    y1, s1 = CPU.npu_dynamic_mx_quant(x, dst_type=E4M3, scale_alg=1)
    assert s0[:, 0, 0].tolist() == [127 - 3, 127 - 8, 0] and s0[:, 0, 1].tolist() == [0, 0, 0]  # row 2: zero block
    assert s1[:, 0, 0].tolist() == [127 - 2, 127 - 8, 0]
    assert y0[0, 0].item() == 448.0 and y0[0, 1].item() == 8.0 and y0[1, 0].item() == 256.0
    assert y1[0, 0].item() == 240.0 and y1[1, 0].item() == 256.0
    assert torch.count_nonzero(y0[2].float()) == 0
    # the dequantised block: 448 * 2^-3 = 56 for 60.8 (the saturation's error), 240 * 2^-2 = 60 under the ceil rule
    # max_low_bound (scale_alg 1): amax = max(amax, bound)
    _, s2 = CPU.npu_dynamic_mx_quant(x, dst_type=E4M3, scale_alg=1, max_low_bound=448.0 * 4)
    assert s2[:, 0, 0].tolist() == [127 + 2] * 3


def test_dynamic_mx_quant_block_sizes_and_padding():
    g = torch.Generator().manual_seed(5)
    x = varied((4, 200), g, torch.bfloat16)  # 200 / 64 -> 4 blocks (the last short), 2 pairs
    y, s = CPU.npu_dynamic_mx_quant(x, dst_type=E4M3, block_size=64)
    assert s.shape == (4, 2, 2)
    check_quant(x, y, s, block=64)
    y, s = CPU.npu_dynamic_mx_quant(x, dst_type=E4M3)  # 200 / 32 -> 7 blocks: 4 pairs, the last byte a 0 pad
    assert s.shape == (4, 4, 2) and torch.count_nonzero(s[:, 3, 1]) == 0
    check_quant(x, y, s)


def test_dynamic_mx_quant_non_finite_blocks():
    x = torch.ones(2, 64, dtype=torch.bfloat16)
    x[0, 3] = float("nan")
    x[1, 40] = float("inf")
    y, s = CPU.npu_dynamic_mx_quant(x, dst_type=E4M3)
    assert s[0, 0].tolist() == [255, 127 - 8] and s[1, 0].tolist() == [127 - 8, 255]
    assert torch.isnan(y[0, :32].float()).all() and torch.isnan(y[1, 32:].float()).all()
    assert (y[0, 32:].float() == 256).all() and (y[1, :32].float() == 256).all()


def test_dynamic_mx_quant_refusals_name_the_argument():
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="not supported by the CPU twin: .*dst_type=296"):
        CPU.npu_dynamic_mx_quant(x)  # the schema default is fp4
    with pytest.raises(RuntimeError, match="not supported by the CPU twin: .*float8_e5m2"):
        CPU.npu_dynamic_mx_quant(x, dst_type=23)
    with pytest.raises(ValueError, match="dst_type=7"):
        CPU.npu_dynamic_mx_quant(x, dst_type=7)
    with pytest.raises(RuntimeError, match="not supported by the CPU twin: .*axis=0"):
        CPU.npu_dynamic_mx_quant(x, axis=0, dst_type=E4M3)
    with pytest.raises(ValueError, match="axis=2"):
        CPU.npu_dynamic_mx_quant(x, axis=2, dst_type=E4M3)
    with pytest.raises(ValueError, match="round_mode"):
        CPU.npu_dynamic_mx_quant(x, round_mode="floor", dst_type=E4M3)
    with pytest.raises(ValueError, match="block_size=48"):
        CPU.npu_dynamic_mx_quant(x, dst_type=E4M3, block_size=48)
    with pytest.raises(ValueError, match="float32 input needs block_size 32"):
        CPU.npu_dynamic_mx_quant(x.float(), dst_type=E4M3, block_size=64)
    with pytest.raises(ValueError, match="scale_alg=2"):
        CPU.npu_dynamic_mx_quant(x, dst_type=E4M3, scale_alg=2)
    with pytest.raises(ValueError, match="dst_type_max"):
        CPU.npu_dynamic_mx_quant(x, dst_type=E4M3, dst_type_max=6.0)
    with pytest.raises(ValueError, match="max_low_bound"):
        CPU.npu_dynamic_mx_quant(x, dst_type=E4M3, max_low_bound=1.0)
    with pytest.raises(ValueError, match="input must be float16"):
        CPU.npu_dynamic_mx_quant(x.to(torch.int32), dst_type=E4M3)
    # None is the default scale_alg (0)
    y, s = CPU.npu_dynamic_mx_quant(x, dst_type=E4M3, scale_alg=None)
    check_quant(x, y, s)


# ------------------------------------------------------------------------------- npu_transpose_quant_batchmatmul


def random_mx(shape, g):
    """Random e4m3 codes (float64 values on the grid) of shape (..., k) and exponents (..., k / 32)."""
    v = mx.e4m3_round(torch.randn(*shape, generator=g, dtype=F64) * 100)
    e = torch.randint(-12, -3, (*shape[:-1], shape[-1] // 32), generator=g)  # keeps float16 results finite
    return v, e


def bmm_reference(x1v, e1, x2v_kn, e2_kn):
    """float64 out[m, b, n] = sum_k x1[m, b, k] 2^e1[m, b, k / 32] x2[b, k, n] 2^e2[b, k / 32, n], and sum |terms|."""
    a = mx.decode(x1v, e1)                                                   # (m, b, k)
    w = mx.decode(x2v_kn.transpose(1, 2), e2_kn.transpose(1, 2)).transpose(1, 2)  # (b, k, n)
    return torch.einsum("mbk,bkn->mbn", a, w), torch.einsum("mbk,bkn->mbn", a.abs(), w.abs())


def check_bmm(out, want, mag, dtype, k):
    """One ulp of the output dtype (its rounding of the float32 sum) plus k 2^-24 sum |terms|, the bound of a
    float32 sum of k exact products in any order."""
    ulp = 2.0 ** -8 if dtype == torch.bfloat16 else 2.0 ** -11
    tol = want.abs() * ulp + mag * k * 2.0 ** -24 + 1e-30
    assert bool(((out.to(F64) - want).abs() <= tol).all()), float(((out.to(F64) - want).abs() / tol).max())


@pytest.mark.parametrize("m,b,k,n", [(5, 2, 512, 16), (1, 8, 64, 8), (9, 3, 192, 24)])
@pytest.mark.parametrize("x2_nk", [False, True], ids=["x2_kn", "x2_nk"])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16])
def test_transpose_quant_batchmatmul_matches_float64(m, b, k, n, x2_nk, out_dtype):
    g = torch.Generator().manual_seed(m * 100 + k + n + int(x2_nk))
    x1v, e1 = random_mx((m, b, k), g)
    x2t, e2t = random_mx((b, n, k), g)  # generated along k, then laid out as the call wants
    want, mag = bmm_reference(x1v, e1, x2t.transpose(1, 2), e2t.transpose(1, 2))
    x1 = x1v.to(FP8)
    s1 = mx.scale_bytes(e1).view(E8M0)
    if x2_nk:
        x2, s2, perm2 = x2t.to(FP8), mx.scale_bytes(e2t).view(E8M0), [0, 2, 1]
    else:
        x2 = x2t.transpose(1, 2).contiguous().to(FP8)
        s2 = mx.scale_bytes(e2t).permute(0, 2, 1, 3).contiguous().view(E8M0)
        perm2 = [0, 1, 2]
    dt = BF16 if out_dtype == torch.bfloat16 else FP16
    for gs in ([0, 0, 32], [1, 1, 32], [0, 1, 32], [1, 0, 32]):
        out = CPU.npu_transpose_quant_batchmatmul(x1, x2, dt, x1_scale=s1, x2_scale=s2, group_sizes=gs,
                                                  perm_x1=[1, 0, 2], perm_x2=perm2, perm_y=[1, 0, 2])
        assert out.shape == (m, b, n) and out.dtype == out_dtype
        check_bmm(out, want, mag, out_dtype, k)
    out = CPU.npu_transpose_quant_batchmatmul(x1, x2, dt, x1_scale=s1, x2_scale=s2, group_sizes=[0, 0, 32],
                                              perm_x1=[1, 0, 2], perm_x2=perm2, perm_y=[1, 0, 2],
                                              batch_split_factor=1, x1_dtype=E4M3, x2_dtype=E4M3)
    check_bmm(out, want, mag, out_dtype, k)


def test_quant_then_bmm_is_the_mx_model_of_the_o_proj():
    """The o_proj's two calls (upstream's arguments) against the float64 MX model of o @ wo_a per group."""
    g = torch.Generator().manual_seed(11)
    T, G, k, n = 6, 4, 256, 32
    o = varied((T, G, k), g, torch.bfloat16)
    wo_a = (torch.randn(G, k, n, generator=g, dtype=F64) / 16).to(torch.bfloat16)
    w8, ws, wdeq = mx.quantize_weight_kn(wo_a)
    y, s = CPU.npu_dynamic_mx_quant(o, dst_type=E4M3)
    assert s.shape == (T, G, k // 64, 2)
    out = CPU.npu_transpose_quant_batchmatmul(y, w8, BF16, bias=None, group_sizes=[0, 0, 32], x1_scale=s.view(E8M0),
                                              x2_scale=ws, perm_x1=[1, 0, 2], perm_x2=[0, 1, 2], perm_y=[1, 0, 2])
    oq = mx.round_trip(o.to(F64))
    want = torch.einsum("tgk,gkn->tgn", oq, wdeq)
    mag = torch.einsum("tgk,gkn->tgn", oq.abs(), wdeq.abs())
    check_bmm(out, want, mag, torch.bfloat16, k)
    # the quantisation is real: the unquantised product is much further from the result than the MX model
    plain = torch.einsum("tgk,gkn->tgn", o.to(F64), wo_a.to(F64))
    assert float((plain - out.to(F64)).abs().max()) > 3 * float((out.to(F64) - want).abs().max())


def test_transpose_quant_batchmatmul_refusals_name_the_argument():
    g = torch.Generator().manual_seed(2)
    m, b, k, n = 3, 2, 128, 8
    x1v, e1 = random_mx((m, b, k), g)
    x2t, e2t = random_mx((b, n, k), g)
    x1, s1 = x1v.to(FP8), mx.scale_bytes(e1).view(E8M0)
    x2 = x2t.transpose(1, 2).contiguous().to(FP8)
    s2 = mx.scale_bytes(e2t).permute(0, 2, 1, 3).contiguous().view(E8M0)
    ok = dict(x1_scale=s1, x2_scale=s2, group_sizes=[0, 0, 32], perm_x1=[1, 0, 2], perm_x2=[0, 1, 2],
              perm_y=[1, 0, 2])

    def call(x1_=x1, x2_=x2, dt=BF16, **over):
        return CPU.npu_transpose_quant_batchmatmul(x1_, x2_, dt, **dict(ok, **over))

    call()
    with pytest.raises(RuntimeError, match="not supported by the CPU twin: .*bias"):
        call(bias=torch.zeros(n, dtype=torch.float32))
    with pytest.raises(RuntimeError, match="not supported by the CPU twin: .*K-C"):
        call(x1_scale=torch.ones(m), x2_scale=torch.ones(n))
    with pytest.raises(ValueError, match="float8_e8m0fnu"):
        call(x1_scale=s1.view(torch.uint8))
    with pytest.raises(ValueError, match="x1_scale and x2_scale must both be given"):
        call(x2_scale=None)
    with pytest.raises(RuntimeError, match="not supported by the CPU twin: .*batch_split_factor=2"):
        call(batch_split_factor=2)
    with pytest.raises(RuntimeError, match="not supported by the CPU twin: .*x1_dtype=23"):
        call(x1_dtype=23)
    with pytest.raises(ValueError, match="perm_x1"):
        call(perm_x1=[0, 1, 2])
    with pytest.raises(ValueError, match="perm_x1 must be given"):
        call(perm_x1=None)
    with pytest.raises(ValueError, match="perm_y"):
        call(perm_y=[0, 1, 2])
    with pytest.raises(ValueError, match="perm_x2"):
        call(perm_x2=[1, 0, 2])
    with pytest.raises(ValueError, match="group_sizes"):
        call(group_sizes=[0, 0, 64])
    with pytest.raises(ValueError, match="group_sizes must be given"):
        call(group_sizes=None)
    with pytest.raises(ValueError, match="dtype=6"):
        call(dt=6)
    with pytest.raises(ValueError, match="x2_scale must be"):
        call(x2_scale=s2[:, :1].contiguous())
    with pytest.raises(ValueError, match="x1_scale must be"):
        call(x1_scale=s1[:2].contiguous())
    with pytest.raises(ValueError, match="x2 "):
        call(x2_=x2[:, :64].contiguous())
    with pytest.raises(ValueError, match="float8_e4m3fn x1 and x2"):
        call(x1_=x1v.to(torch.bfloat16))
    # k must be a multiple of 64 in MX mode
    x1s, e1s = random_mx((m, b, 32), g)
    x2s, e2s = random_mx((b, n, 32), g)
    with pytest.raises(ValueError, match="k=32"):
        CPU.npu_transpose_quant_batchmatmul(x1s.to(FP8), x2s.transpose(1, 2).contiguous().to(FP8), BF16,
                                            x1_scale=torch.zeros(m, b, 0, 2, dtype=torch.uint8).view(E8M0),
                                            x2_scale=torch.zeros(b, 0, n, 2, dtype=torch.uint8).view(E8M0),
                                            group_sizes=[0, 0, 32], perm_x1=[1, 0, 2], perm_x2=[0, 1, 2],
                                            perm_y=[1, 0, 2])


# ------------------------------------------------------------------------------------------ no-compute kernels


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_noop_shapes(device):
    x = torch.empty(6, 4, 200, dtype=torch.bfloat16, device=device)
    y, s = NOOP.npu_dynamic_mx_quant(x, dst_type=E4M3)
    assert y.shape == (6, 4, 200) and y.dtype == FP8 and s.shape == (6, 4, 4, 2) and s.dtype == torch.uint8
    y, s = NOOP.npu_dynamic_mx_quant(x)  # fp4 default: two values per byte
    assert y.shape == (6, 4, 100) and y.dtype == torch.uint8
    x1 = torch.empty(6, 4, 128, dtype=FP8, device=device)
    x2 = torch.empty(4, 128, 16, dtype=FP8, device=device)
    out = NOOP.npu_transpose_quant_batchmatmul(x1, x2, BF16, perm_x1=[1, 0, 2], perm_x2=[0, 1, 2], perm_y=[1, 0, 2])
    assert out.shape == (6, 4, 16) and out.dtype == torch.bfloat16
    out = NOOP.npu_transpose_quant_batchmatmul(x1, x2.transpose(1, 2), FP16, perm_x1=[1, 0, 2], perm_x2=[0, 2, 1],
                                               perm_y=[1, 0, 2])
    assert out.shape == (6, 4, 16) and out.dtype == torch.float16


# ------------------------------------------------------------------- npu_quant_matmul, MX mode (A5 MXFP8 linears)


@pytest.mark.parametrize("k", [128, 96])  # 96: an odd block count, the last scale pair padded
@pytest.mark.parametrize("out", [BF16, FP16])
def test_quant_matmul_mx_mode(k, out):
    # x1 (m, k) fp8 with (m, ceil(k/64), 2) e8m0 scales from npu_dynamic_mx_quant, x2 (k, n) the transposed view
    # of an (n, k) MX weight with (ceil(k/64), n, 2) scales: y = sum_k decoded(x1) decoded(x2) (the float64 model),
    # within float32 summation plus one rounding of the output dtype.
    g = torch.Generator().manual_seed(k + out)
    m, n = 7, 40
    x = varied((m, k), g, torch.bfloat16)
    xq, xs = CPU.npu_dynamic_mx_quant(x, dst_type=E4M3)
    w = torch.randn(n, k, generator=g, dtype=F64)
    wq, we = mx.quantize(w)
    w8 = wq.to(FP8)
    sb = mx.scale_bytes(we)  # (n, ceil(k/64), 2)
    y = CPU.npu_quant_matmul(xq, w8.t(), sb.view(E8M0).transpose(0, 1), pertoken_scale=xs.view(E8M0),
                             scale_dtype=44, pertoken_scale_dtype=44, output_dtype=out, group_sizes=[1, 1, 32])
    assert y.dtype == (torch.bfloat16 if out == BF16 else torch.float16) and y.shape == (m, n)
    q, e = mx.quantize(x.to(F64))
    a, b = mx.decode(q, e), mx.decode(wq, we)
    want = a @ b.T
    ulp = 2.0 ** (-8 if out == BF16 else -11)
    bound = ulp * want.abs() + k * 2.0 ** -24 * (a.abs() @ b.abs().T) + 1e-30
    assert ((y.to(F64) - want).abs() <= bound).all()


def test_quant_matmul_mx_mode_refusals():
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    xq, xs = CPU.npu_dynamic_mx_quant(x, dst_type=E4M3)
    w8 = torch.randn(64, 8).to(FP8)
    s2 = torch.full((1, 8, 2), 127, dtype=torch.uint8).view(E8M0)
    args = dict(pertoken_scale=xs.view(E8M0), scale_dtype=44, pertoken_scale_dtype=44, output_dtype=BF16,
                group_sizes=[1, 1, 32])
    CPU.npu_quant_matmul(xq, w8, s2, **args)
    with pytest.raises(ValueError, match="float8_e8m0fnu"):
        CPU.npu_quant_matmul(xq, w8, s2, **{**args, "pertoken_scale": xs})
    with pytest.raises(ValueError, match=r"scale \(x2's\) must be"):
        CPU.npu_quant_matmul(xq, w8, s2[:, :4], **args)
    with pytest.raises(ValueError, match="group_sizes"):
        CPU.npu_quant_matmul(xq, w8, s2, **{**args, "group_sizes": [1, 1, 64]})
    with pytest.raises(RuntimeError, match="not supported by the CPU twin: scale_dtype=23"):
        CPU.npu_quant_matmul(xq, w8, s2, **{**args, "scale_dtype": 23})
    with pytest.raises(RuntimeError, match="bias"):
        CPU.npu_quant_matmul(xq, w8, s2, bias=torch.zeros(8), **args)
    with pytest.raises(ValueError, match="output_dtype"):
        CPU.npu_quant_matmul(xq, w8, s2, **{**args, "output_dtype": 6})
