"""Float64 model of MX (OCP microscaling) fp8, written from the torch_npu 2.14.0 documentation of
npu_dynamic_mx_quant / npu_transpose_quant_batchmatmul and the OCP MX v1.0 format, independently of the runtime's
CPU twins (no torch fp8 casts: the e4m3 rounding is computed here).

- A block of 32 values (along the last axis) shares a scale 2^e, stored as the e8m0 byte e + 127 (255: NaN).
- scale_alg 0 (OCP): e = floor(log2(amax)) - 8 (8 = e4m3's emax), clamped to [-127, 127]; amax 0 -> -127.
  scale_alg 1: the smallest e with 448 * 2^e >= amax (then nothing saturates).
- element = e4m3(x / 2^e): round to nearest, ties to even, on e4m3's grid (3 mantissa bits, normals from 2^-6,
  subnormal step 2^-9), saturated to +-448.
- Scale tensors pair consecutive blocks: (..., K) -> (..., ceil(K / 32) rounded up to even / 2, 2), block j at
  [..., j // 2, j % 2]; a pad block's byte is 0.
"""
import math

import torch

F64 = torch.float64
E4M3_MAX = 448.0


def e4m3_round(v):
    """float64 tensor -> float64 values on the e4m3 grid: round half to even, saturate to +-448."""
    v = v.to(F64)
    a = v.abs()
    # the grid step at |v|: 2^(floor(log2 |v|) - 3) for normals (|v| >= 2^-6), 2^-9 below
    m, ex = torch.frexp(torch.where(a > 0, a, torch.ones_like(a)))  # a = m 2^ex, m in [0.5, 1)
    step = torch.pow(2.0, (ex - 1 - 3).to(F64))
    step = torch.where(a < 2.0 ** -6, torch.full_like(step, 2.0 ** -9), step)
    q = torch.round(v / step) * step  # torch.round: half to even; v / step is exact (power of two)
    q = torch.clamp(q, -E4M3_MAX, E4M3_MAX)
    return torch.where(torch.isnan(v), v, q)


def exponent_ocp(amax):
    """float64 block amax -> int64 OCP shared exponents (NaN / inf -> 128, the NaN byte)."""
    a = amax.to(F64)
    _, ex = torch.frexp(torch.where(a > 0, a, torch.ones_like(a)))
    e = torch.clamp(ex.to(torch.int64) - 1 - 8, -127, 127)
    e = torch.where(a > 0, e, torch.full_like(e, -127))
    return torch.where(torch.isfinite(a), e, torch.full_like(e, 128))


def exponent_ceil(amax):
    """float64 block amax -> int64: the smallest e with 448 * 2^e >= amax, clamped; 0 -> -127; NaN / inf -> 128."""
    a = amax.to(F64)
    out = torch.empty(a.shape, dtype=torch.int64)
    flat, res = a.reshape(-1).tolist(), []
    for x in flat:
        if not math.isfinite(x):
            res.append(128)
            continue
        if x <= 0:
            res.append(-127)
            continue
        e = max(-127, math.floor(math.log2(x / E4M3_MAX)) - 2)  # a start below the answer, then exact steps
        while e < 127 and math.ldexp(E4M3_MAX, e) < x:
            e += 1
        res.append(e)
    out.view(-1)[:] = torch.tensor(res, dtype=torch.int64)
    return out


def quantize(x, block=32, scale_alg=0, max_low_bound=0.0):
    """MX-quantise x (..., K) along K: returns (elements float64 (..., K) on the e4m3 grid, exponents int64
    (..., ceil(K / block)))."""
    x = x.to(F64)
    K = x.shape[-1]
    nb = -(-K // block)
    xp = torch.nn.functional.pad(x, (0, nb * block - K)).reshape(*x.shape[:-1], nb, block)
    amax = xp.abs().amax(-1)
    amax = torch.where(torch.isnan(xp).any(-1), torch.full_like(amax, float("nan")), amax)
    if scale_alg == 0:
        e = exponent_ocp(amax)
    else:
        e = exponent_ceil(torch.maximum(amax, torch.full_like(amax, max_low_bound)))
    q = e4m3_round(xp / torch.pow(2.0, e.to(F64))[..., None])
    q = torch.where((e == 128)[..., None], torch.full_like(q, float("nan")), q)
    return q.reshape(*x.shape[:-1], nb * block)[..., :K], e


def scale_bytes(e):
    """int64 exponents (..., nb) -> uint8 (..., ceil(nb / 2), 2) e8m0 bytes (pad byte 0)."""
    b = (e + 127).to(torch.uint8)
    if b.shape[-1] % 2:
        b = torch.nn.functional.pad(b, (0, 1))
    return b.reshape(*b.shape[:-1], b.shape[-1] // 2, 2)


def decode(elements, e, block=32):
    """(elements (..., K) float64, exponents (..., nb)) -> the float64 values elements * 2^e."""
    s = torch.pow(2.0, e.to(F64)).repeat_interleave(block, -1)[..., : elements.shape[-1]]
    s = torch.where(e.repeat_interleave(block, -1)[..., : elements.shape[-1]] == 128, float("nan"), s)
    return elements.to(F64) * s


def round_trip(x, block=32, scale_alg=0):
    """x -> its MX-fp8 value model (float64)."""
    q, e = quantize(x, block, scale_alg)
    return decode(q, e, block)


def quantize_weight_kn(w):
    """An (G, k, n) weight MX-quantised along k (the o_proj's wo_a, npu_transpose_quant_batchmatmul's x2 with
    perm_x2 (0, 1, 2)): returns (fp8 tensor (G, k, n), float8_e8m0fnu scales (G, k / 64, n, 2), float64 decoded
    (G, k, n))."""
    wt = w.to(F64).transpose(1, 2)  # (G, n, k): quantise along the last axis
    q, e = quantize(wt)
    deq = decode(q, e).transpose(1, 2).contiguous()
    fp8 = q.transpose(1, 2).contiguous().to(torch.float8_e4m3fn)  # exact: q is on the e4m3 grid
    sb = scale_bytes(e)  # (G, n, k / 64, 2)
    return fp8, sb.permute(0, 2, 1, 3).contiguous().view(torch.float8_e8m0fnu), deq
