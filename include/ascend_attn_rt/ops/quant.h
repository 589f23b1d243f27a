// Quantisation and in-place scatter operators of the sparse (SFA) paths, torch_npu's:
// npu_scatter_nd_update_, npu_dynamic_quant, npu_dynamic_block_quant.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/OptionalArrayRef.h>
#include <c10/util/string_view.h>

#include <cstdint>
#include <optional>
#include <tuple>

#include "ascend_attn_rt/ops/provider.h"

namespace aar::ops {

// In place: self[indices[i]] = updates[i] for each row i of indices (N, k)
// (int64 or int32), indexing the first k dims of self; updates is
// (N, self.shape[k:]...). A row whose linear index into self's first k dims is
// negative or out of range is skipped (docs/design/sparse.md §7: the upstream kernel
// drops negative ones; slot -1 and the (-1, bs-1) block/offset encoding land
// here). Later rows win over earlier rows with the same index. Any dtype.
at::Tensor& scatter_nd_update_(at::Tensor& self, const at::Tensor& indices, const at::Tensor& updates,
                               Provider pv = Provider::Auto);

struct DynamicQuantArgs {
  at::Tensor input;                                    // (..., H), at least 2-D
  std::optional<at::Tensor> smooth_scales, group_index;  // NotSupported by the CPU twin
  std::optional<int64_t> dst_type;                     // at::ScalarType value: None/int8, or float8_e4m3fn
  c10::string_view quant_mode = "pertoken";
  double dst_type_max = 0.0;                           // 0: the dtype's max (127 / 448)
};

// Per-row symmetric: scale = amax(|x|) / QMAX, q = round(x / scale) (half to
// even); returns (q (input shape, int8 or float8_e4m3fn), scale fp32
// (input.shape[:-1]): the dequant scale). An all-zero row gives scale 0, q 0.
std::tuple<at::Tensor, at::Tensor> dynamic_quant(const DynamicQuantArgs& a, Provider pv = Provider::Auto);

// Per (row_block_size x col_block_size) tile: scale = amax(|x|) / QMAX,
// y = x / scale in the destination type; returns (y (x's shape), scale fp32
// (x.shape[:-1] + (ceil(cols / col_block_size),))). dst_type 1: int8, QMAX 127,
// y = rint(x / scale); float8_e4m3fn (its ScalarType value, or torch_npu's 292;
// A5's SFA C8 rows): QMAX 448, y the nearest e4m3 value (ties to even). x 2-D
// or 3-D; the CPU twin implements row_block_size 1, col_block_size 128, those
// two dst_types, min_scale 0, round_mode "rint", dst_type_max 0 or QMAX
// (others: NotSupported by name).
std::tuple<at::Tensor, at::Tensor> dynamic_block_quant(const at::Tensor& x, int64_t row_block_size,
                                                       int64_t col_block_size, int64_t dst_type = 1,
                                                       double min_scale = 0.0, c10::string_view round_mode = "rint",
                                                       double dst_type_max = 0.0, Provider pv = Provider::Auto);

// npu_quantize: per-element y = x * scales + zero_points (div_mode=false) or
// x / scales + zero_points (div_mode=true), rounded half to even and saturated
// to the dtype; `dtype` is an at::ScalarType value (QInt8 (12): an int8 result).
// The runtime uses div_mode=false, axis=-1, per-channel (size 1 or x.size(-1))
// scales and zero points of x's dtype: the per-tensor asymmetric activation
// quantisation of a W8A8-static linear (x_q = round(x / input_scale) +
// input_offset with scales = 1 / input_scale).
at::Tensor quantize(const at::Tensor& x, const at::Tensor& scales, const std::optional<at::Tensor>& zero_points,
                    int64_t dtype, int64_t axis = 1, bool div_mode = true, Provider pv = Provider::Auto);

// npu_quant_matmul: y = (x1 @ x2 (+ bias, int32, in accumulator units)) * scale
// (* pertoken_scale per row), in output_dtype (an at::ScalarType value).
// x1 (m, k) int8, x2 (k, n) int8 (the weight transposed to (in, out), as the
// W8A8 linears hold it), scale fp32 (n) or (1), pertoken_scale fp32 (m).
// MX fp8 mode (A5, W8A8-MXFP8 linears; docs/design/ops.md): x1 (m, k) and x2
// (k, n) float8_e4m3fn (x2 the transposed view of the (n, k) weight),
// pertoken_scale (m, ceil(k / 64), 2) and scale (ceil(k / 64), n, 2)
// float8_e8m0fnu, scale_dtype = pertoken_scale_dtype = float8_e8m0fnu,
// group_sizes {1, 1, 32}: y[m, n] = sum_k x1 s1[m, k / 32] x2 s2[k / 32, n].
struct QuantMatmulArgs {
  at::Tensor x1, x2, scale;
  std::optional<at::Tensor> offset;  // int8 output only: not used by the runtime
  std::optional<at::Tensor> pertoken_scale, bias;
  std::optional<int64_t> output_dtype;
  std::optional<int64_t> pertoken_scale_dtype, scale_dtype;  // MX mode: float8_e8m0fnu's ScalarType value
  at::OptionalIntArrayRef group_sizes;  // MX mode; a view: the caller's storage outlives the call
};
at::Tensor quant_matmul(const QuantMatmulArgs& a, Provider pv = Provider::Auto);

// A W8A8-dynamic linear in two calls: the input quantised per token once (npu_dynamic_quant,
// int8), then npu_quant_matmul with a weight's int8 (in, out) and its float32 per-output-channel
// scale: y = (x_q @ weight_t) * scale[o] * x_scale[t], in out_dtype. One quantised input may feed
// several weights (the DSA prolog's wq_a and wkv).
struct W8A8DynamicInput {
  at::Tensor q;      // (m, k) int8
  at::Tensor scale;  // (m) float32: the dequant scale per token
};
W8A8DynamicInput quantize_per_token(const at::Tensor& x, Provider pv = Provider::Auto);

// vllm-ascend's npu_rms_norm_dynamic_quant (_C_ascend): the RMSNorm of each row of x (last dim H),
// y = x * rsqrt(mean(x^2) + epsilon) * gamma (+ beta), times smooth_scale when given, quantised per
// row as npu_dynamic_quant does (scale = amax|y| / 127, codes round(y / scale) half to even, int8).
// The normed row is not rounded to x's dtype first. gamma / beta / smooth_scale (H) float; x
// float, at least 2-D. Returns the codes (x's shape) and the fp32 dequant scales (x.shape[:-1])
// as a W8A8-dynamic input (the fused form of RMSNorm followed by quantize_per_token).
struct RmsNormDynamicQuantArgs {
  at::Tensor x, gamma;
  std::optional<at::Tensor> smooth_scale, beta;
  double epsilon = 1e-6;
};
W8A8DynamicInput rms_norm_dynamic_quant(const RmsNormDynamicQuantArgs& a, Provider pv = Provider::Auto);
at::Tensor w8a8_dynamic_matmul(const W8A8DynamicInput& x, const at::Tensor& weight_t, const at::Tensor& scale,
                               at::ScalarType out_dtype, Provider pv = Provider::Auto);

}  // namespace aar::ops
