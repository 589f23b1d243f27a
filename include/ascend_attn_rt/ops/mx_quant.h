// torch_npu's MX (OCP microscaling) fp8 operators, the A5 o_proj of the
// DeepSeek-V4 attention (docs/design/dsa.md §5.2, §4.1 "o_proj: MX-fp8 quant
// bmm"): npu_dynamic_mx_quant and npu_transpose_quant_batchmatmul.
//
// MX block: 32 consecutive values along one axis share a scale 2^(b - 127)
// stored as one float8_e8m0fnu byte b (255 is NaN); the elements are
// float8_e4m3fn. Scale tensors pair consecutive blocks in a trailing dim of 2:
// a (..., K) input has (..., ceil(K / 32) rounded up to even / 2, 2) scales,
// block j at [..., j / 2, j % 2] (torch_npu 2.14.0 _op_plugin_docs.py).
//
// dtype arguments are at::ScalarType values, as torch passes a torch.dtype to
// these `int` parameters (float8_e4m3fn 24, bfloat16 15, float16 5);
// npu_dynamic_mx_quant's doc also names torch_npu's own codes (291 e5m2, 292
// e4m3fn, 296 / 297 the fp4 pairs).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/OptionalArrayRef.h>
#include <c10/util/string_view.h>

#include <cstdint>
#include <optional>
#include <tuple>

#include "ascend_attn_rt/ops/provider.h"

namespace aar::ops {

// npu_dynamic_mx_quant: per block of block_size values along `axis`, the
// shared scale (scale_alg 0, the OCP MX rule: 2^(floor(log2(amax)) - 8),
// elements saturated to +-448; scale_alg 1, the "CuBALS" rule: the smallest
// 2^e >= amax / 448), then y = RNE(x / scale) in dst_type. Returns (y (the
// input's shape, float8_e4m3fn), mxscale (uint8: the e8m0 bytes; view as
// float8_e8m0fnu), shape as above). The schema's defaults are kept (dst_type
// 296 is fp4); the DSA o_proj passes dst_type = float8_e4m3fn.
// The CPU twin implements: fp16 / bf16 / fp32 input, the last axis, dst_type
// float8_e4m3fn (24 or 292), round_mode "rint", block_size a multiple of 32 up
// to 1024 (32 for fp32 input), scale_alg 0 or 1 (None = 0), dst_type_max 0,
// max_low_bound >= 0 (only with scale_alg 1: amax = max(amax, bound)).
// Refused by name: other axes (their scales interleave row pairs), fp4 /
// e5m2 dst_types.
struct DynamicMxQuantArgs {
  at::Tensor input;
  int64_t axis = -1;
  c10::string_view round_mode = "rint";
  int64_t dst_type = 296;
  int64_t block_size = 32;
  std::optional<int64_t> scale_alg = 0;
  double dst_type_max = 0.0;
  double max_low_bound = 0.0;
};
std::tuple<at::Tensor, at::Tensor> dynamic_mx_quant(const DynamicMxQuantArgs& a, Provider pv = Provider::Auto);

// npu_transpose_quant_batchmatmul (torch_npu doc: out = ((x1^T1 @ x2^T2 +
// bias) * x2_scale * x1_scale)^Ty): in MX mode, x1 (m, b, k) and x2 (b, k, n)
// (perm_x2 (0, 1, 2)) or (b, n, k) (perm_x2 (0, 2, 1)), both float8_e4m3fn,
// k a multiple of 64; x1_scale (m, b, k / 64, 2) and x2_scale (b, k / 64, n,
// 2) (or (b, n, k / 64, 2)) float8_e8m0fnu, one scale per 32 k-values; then
//   out[m, b, n] = sum_k x1[m, b, k] s1[m, b, k / 32] x2[b, k, n] s2[b, k / 32, n]
// in `dtype` (bfloat16 or float16), perm_x1 = perm_y = (1, 0, 2).
// group_sizes (group_m, group_n, group_k) is required in MX mode: one of
// (0|1, 0|1, 32) (0 = inferred from the shapes, which gives 1).
// The CPU twin implements MX mode (fp32 accumulation); refused by name: bias
// (unsupported on the device too), the per-channel fp32-scale mode ("K-C"),
// batch_split_factor != 1, x1_dtype / x2_dtype other than float8_e4m3fn.
struct TransposeQuantBatchMatmulArgs {
  at::Tensor x1, x2;
  int64_t dtype = 0;                       // an at::ScalarType value: bfloat16 (15) or float16 (5)
  std::optional<at::Tensor> bias, x1_scale, x2_scale;
  at::OptionalIntArrayRef group_sizes;     // the lists are views: the caller's storage outlives the call
  at::OptionalIntArrayRef perm_x1, perm_x2, perm_y;
  std::optional<int64_t> batch_split_factor = 1;
  std::optional<int64_t> x1_dtype, x2_dtype;
};
at::Tensor transpose_quant_batchmatmul(const TransposeQuantBatchMatmulArgs& a, Provider pv = Provider::Auto);

}  // namespace aar::ops
