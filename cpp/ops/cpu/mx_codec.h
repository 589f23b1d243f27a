// Internal: the one MX (OCP microscaling) fp8 codec of the CPU twins. A block
// of values shares an e8m0 scale byte b, the power of two 2^(b - 127) (byte
// 255 is NaN); the elements are fp8 e4m3 (max normal 448, emax 8). Used by
// kv_compress_epilog (the A5 640-byte KV rows, its ceil rule), the shared-KV
// attention's row decoder, npu_dynamic_mx_quant (both rules) and
// npu_transpose_quant_batchmatmul (decoding).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>

namespace aar::ops::cpu::mx {

constexpr double kE4m3Max = 448.0;    // the largest finite float8_e4m3fn
constexpr int64_t kE4m3Emax = 8;      // exponent of 448's leading bit (OCP "emax_elem")
constexpr int64_t kE8m0Bias = 127;
constexpr int64_t kE8m0Min = -127;    // byte 0
constexpr int64_t kE8m0Max = 127;     // byte 254 (255 is NaN)
constexpr uint8_t kE8m0NaN = 255;
constexpr int64_t kNaNExponent = kE8m0NaN - kE8m0Bias;  // 128: what a block with a NaN / inf gets

// The "ceil" rule (kv_compress_epilog's round_scale, npu_dynamic_mx_quant's
// scale_alg 1): the smallest e with 448 * 2^e >= amax, clamped to [-127, 127];
// amax 0 (or below every scale) gives -127, a NaN / inf amax kNaNExponent.
// Then |x / 2^e| <= 448: no element saturates.
int64_t exponent_ceil(double amax);

// The OCP MX v1.0 rule (npu_dynamic_mx_quant's scale_alg 0): floor(log2(amax))
// - emax_elem, clamped to [-127, 127]; amax 0 gives -127, a NaN / inf amax
// kNaNExponent. The block's largest
// element scales into [256, 512): above 448 it saturates (quantize_e4m3).
int64_t exponent_ocp(double amax);

// Scale bytes (any one-byte dtype: uint8 or float8_e8m0fnu, any shape) as
// float32 2^(b - 127), NaN for 255.
at::Tensor e8m0_to_float(const at::Tensor& scale_bytes);

// Per-block fp8: x (..., blocks, block) float32, e (..., blocks) int64
// exponents -> float8_e4m3fn (x's shape) = RNE(x / 2^e) saturated to +-448;
// a block with e == kNaNExponent (the NaN scale byte) becomes NaN.
at::Tensor quantize_e4m3(const at::Tensor& x, const at::Tensor& e);

}  // namespace aar::ops::cpu::mx
