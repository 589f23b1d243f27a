// CPU twin of npu_quant_matmul, the two forms the runtime uses.
// W8A8 (A2/A3, the documented table):
//   y = (x1 @ x2 + bias) * scale [* pertoken_scale per row]
// x1 (..., k) int8, x2 (k, n) int8, bias int32 (n) added to the exact integer
// accumulator, scale float32/bfloat16 (n) or (1), pertoken_scale float32 (m) with
// m the rows of x1; output_dtype float16 / bfloat16 (and float32, a CPU-twin
// extension for fp32 test models). The accumulator is exact (computed in
// float64), the scaling in float64, one rounding to the output dtype.
// MX fp8 (A5; the schema's scale_dtype / pertoken_scale_dtype / group_sizes,
// which torch_npu 2.14's doc of this operator does not describe: the twin takes
// the MX layout the same wheel documents for npu_transpose_quant_batchmatmul
// and the MC2 matmuls, docs/design/ops.md "MX mode of npu_quant_matmul"):
//   y[m, n] = sum_k x1[m, k] s1[m, k / 32] x2[k, n] s2[k / 32, n]
// x1 (..., k) and x2 (k, n) float8_e4m3fn, pertoken_scale (m, ceil(k / 64), 2)
// (x1's scales) and scale (ceil(k / 64), n, 2) (x2's) float8_e8m0fnu, one
// scale per 32 k-values paired in the trailing dim (block j at [j / 2, j % 2]),
// k a multiple of 32, group_sizes [0|1, 0|1, 32], scale_dtype /
// pertoken_scale_dtype None or float8_e8m0fnu (its ScalarType value),
// output_dtype bfloat16 / float16. Decoded products are exact in float32, the
// sums float32 (the device's order is unknown), one rounding to the output.
// Rejected by name: int64 (npu_trans_quant_param) scales, offset, int8/int32
// outputs, int4 (int32-packed) inputs, float biases, y_scale, x1_dtype /
// x2_dtype, a bias in MX mode.
#include <torch/library.h>

#include "../op_signatures.h"
#include "attention_reference.h"
#include "mx_codec.h"

namespace aar::ops::cpu {
namespace {

constexpr const char* kQuantMatmulOp = "npu_quant_matmul";

constexpr int64_t kMxGroupK = 32;

// (..., ceil(k / 64), 2) e8m0 scales -> (..., k) float32, each block's scale repeated over its 32 k-values.
at::Tensor expand_mx_scales(const at::Tensor& s, int64_t k) {
  return mx::e8m0_to_float(s.contiguous()).flatten(-2).repeat_interleave(kMxGroupK, -1).narrow(-1, 0, k);
}

void check_e8m0_dtype_arg(const std::optional<int64_t>& t, const char* name) {
  if (t.has_value() && *t != static_cast<int64_t>(at::kFloat8_e8m0fnu)) {
    throw_not_supported(kQuantMatmulOp, ": not supported by the CPU twin: ", name, "=", *t, " (only None or float8_e8m0fnu = ",
                        static_cast<int64_t>(at::kFloat8_e8m0fnu), ", the MX mode's scales)");
  }
}

at::Tensor quant_matmul_mx(AAR_QUANT_MATMUL_PARAMS) {
  reject_tensor(kQuantMatmulOp, bias, "bias (in MX mode)");
  check_e8m0_dtype_arg(scale_dtype, "scale_dtype");
  check_e8m0_dtype_arg(pertoken_scale_dtype, "pertoken_scale_dtype");
  AAR_CHECK_ARG(x1.scalar_type() == at::kFloat8_e4m3fn && x2.scalar_type() == at::kFloat8_e4m3fn, kQuantMatmulOp,
                ": MX mode needs float8_e4m3fn x1 and x2, got ", x1.scalar_type(), " and ", x2.scalar_type());
  AAR_CHECK_ARG(output_dtype.has_value() && (*output_dtype == static_cast<int64_t>(at::kBFloat16) ||
                                             *output_dtype == static_cast<int64_t>(at::kHalf)),
                kQuantMatmulOp, ": MX mode needs output_dtype bfloat16 (", static_cast<int64_t>(at::kBFloat16),
                ") or float16 (", static_cast<int64_t>(at::kHalf), "), got ",
                output_dtype.has_value() ? std::to_string(*output_dtype) : std::string("None"));
  AAR_CHECK_ARG(x1.dim() >= 2 && x2.dim() == 2 && x1.size(-1) == x2.size(0), kQuantMatmulOp,
                ": x1 must be (..., k) and x2 (k, n) with the same k, got ", x1.sizes(), " and ", x2.sizes());
  const int64_t k = x2.size(0), n = x2.size(1), m = x1.numel() / k;
  AAR_CHECK_ARG(k > 0 && k % kMxGroupK == 0, kQuantMatmulOp, ": k=", k, " must be a positive multiple of 32 in MX mode");
  const int64_t pairs = (k / kMxGroupK + 1) / 2;
  AAR_CHECK_ARG(pertoken_scale.has_value() && pertoken_scale->defined(), kQuantMatmulOp,
                ": MX mode needs pertoken_scale (x1's e8m0 scales, (m, ceil(k / 64), 2))");
  const at::Tensor& s1 = *pertoken_scale;
  AAR_CHECK_ARG(scale.scalar_type() == at::kFloat8_e8m0fnu && s1.scalar_type() == at::kFloat8_e8m0fnu, kQuantMatmulOp,
                ": MX mode's scale and pertoken_scale must be float8_e8m0fnu (view npu_dynamic_mx_quant's uint8 scales as "
                "float8_e8m0fnu), got ", scale.scalar_type(), " and ", s1.scalar_type());
  AAR_CHECK_ARG(scale.sizes() == c10::IntArrayRef({pairs, n, 2}), kQuantMatmulOp, ": scale (x2's) must be (ceil(k / 64), n, 2) = (",
                pairs, ", ", n, ", 2), got ", scale.sizes());
  AAR_CHECK_ARG(s1.numel() == m * pairs * 2 && s1.size(-1) == 2 && s1.size(-2) == pairs, kQuantMatmulOp,
                ": pertoken_scale (x1's) must be (m, ceil(k / 64), 2) = (", m, ", ", pairs, ", 2), got ", s1.sizes());
  AAR_CHECK_ARG(group_sizes.has_value(), kQuantMatmulOp, ": MX mode needs group_sizes [0|1, 0|1, 32]");
  const std::vector<int64_t> gs(group_sizes->begin(), group_sizes->end());
  AAR_CHECK_ARG(gs.size() == 3 && (gs[0] == 0 || gs[0] == 1) && (gs[1] == 0 || gs[1] == 1) && gs[2] == kMxGroupK,
                kQuantMatmulOp, ": group_sizes=", c10::IntArrayRef(gs), " is not supported (only [0|1, 0|1, 32])");
  const at::Tensor a = x1.reshape({m, k}).to(at::kFloat) * expand_mx_scales(s1.reshape({m, pairs, 2}), k);
  const at::Tensor w = x2.to(at::kFloat) * expand_mx_scales(scale.permute({1, 0, 2}), k).t();  // (k, n)
  std::vector<int64_t> shape(x1.sizes().begin(), x1.sizes().end());
  shape.back() = n;
  return at::mm(a, w).to(static_cast<at::ScalarType>(*output_dtype)).reshape(shape);
}

at::Tensor quant_matmul(AAR_QUANT_MATMUL_PARAMS) {
  reject_tensor(kQuantMatmulOp, offset, "offset");
  reject_tensor(kQuantMatmulOp, y_scale, "y_scale");
  reject_opt_int(kQuantMatmulOp, x1_dtype, "x1_dtype");
  reject_opt_int(kQuantMatmulOp, x2_dtype, "x2_dtype");
  if (x1.scalar_type() == at::kFloat8_e4m3fn || scale.scalar_type() == at::kFloat8_e8m0fnu || scale_dtype.has_value() ||
      pertoken_scale_dtype.has_value()) {
    return quant_matmul_mx(x1, x2, scale, offset, pertoken_scale, bias, output_dtype, x1_dtype, x2_dtype,
                           pertoken_scale_dtype, scale_dtype, group_sizes, y_scale);
  }
  if (group_sizes.has_value()) {
    throw_not_supported(kQuantMatmulOp, ": not supported by the CPU twin: group_sizes in the int8 form (pass None; the MX "
                        "form takes [1, 1, 32])");
  }
  if (!output_dtype.has_value()) {
    throw_not_supported(kQuantMatmulOp, ": not supported by the CPU twin: output_dtype=None (an int8 output; only float16, "
                        "bfloat16 and float32)");
  }
  const auto out = static_cast<at::ScalarType>(*output_dtype);
  if (out != at::kHalf && out != at::kBFloat16 && out != at::kFloat) {
    throw_not_supported(kQuantMatmulOp, ": not supported by the CPU twin: output_dtype=", *output_dtype,
                        " (only float16, bfloat16 and float32)");
  }
  AAR_CHECK_ARG(x1.scalar_type() == at::kChar && x2.scalar_type() == at::kChar, kQuantMatmulOp,
                ": x1 and x2 must be int8 (int32-packed int4 is not supported by the CPU twin), got ",
                x1.scalar_type(), " and ", x2.scalar_type());
  AAR_CHECK_ARG(x1.dim() >= 2 && x2.dim() == 2 && x1.size(-1) == x2.size(0), kQuantMatmulOp,
                ": x1 must be (..., k) and x2 (k, n) with the same k, got ", x1.sizes(), " and ", x2.sizes());
  const int64_t n = x2.size(1);
  const int64_t m = x1.numel() / x1.size(-1);
  if (scale.scalar_type() == at::kLong) {
    throw_not_supported(kQuantMatmulOp, ": not supported by the CPU twin: an int64 scale (npu_trans_quant_param form; pass "
                        "float32)");
  }
  AAR_CHECK_ARG(scale.scalar_type() == at::kFloat || scale.scalar_type() == at::kBFloat16, kQuantMatmulOp,
                ": scale must be float32 or bfloat16, got ", scale.scalar_type());
  AAR_CHECK_ARG(scale.dim() == 1 && (scale.size(0) == 1 || scale.size(0) == n), kQuantMatmulOp,
                ": scale must be (n=", n, ") or (1), got ", scale.sizes());
  at::Tensor acc = at::matmul(x1.reshape({m, x1.size(-1)}).to(at::kDouble), x2.to(at::kDouble));
  if (bias.has_value() && bias->defined()) {
    AAR_CHECK_ARG(bias->scalar_type() == at::kInt, kQuantMatmulOp,
                  ": bias must be int32 (a float bias is not supported by the CPU twin), got ", bias->scalar_type());
    AAR_CHECK_ARG(bias->numel() == n && (bias->dim() == 1 || (bias->dim() == 2 && bias->size(0) == 1)), kQuantMatmulOp,
                  ": bias must be (n=", n, ") or (1, n), got ", bias->sizes());
    acc = acc + bias->reshape({n}).to(at::kDouble);
  }
  at::Tensor y = acc * scale.to(at::kDouble);
  if (pertoken_scale.has_value() && pertoken_scale->defined()) {
    AAR_CHECK_ARG(pertoken_scale->scalar_type() == at::kFloat && pertoken_scale->dim() == 1 &&
                      pertoken_scale->size(0) == m,
                  kQuantMatmulOp, ": pertoken_scale must be float32 (m=", m, "), got ", pertoken_scale->scalar_type(), " ",
                  pertoken_scale->sizes());
    y = y * pertoken_scale->to(at::kDouble).unsqueeze(1);
  }
  std::vector<int64_t> shape(x1.sizes().begin(), x1.sizes().end());
  shape.back() = n;
  return y.to(out).reshape(shape);
}

}  // namespace
}  // namespace aar::ops::cpu

TORCH_LIBRARY_IMPL(ascend_cpu, CPU, m) { m.impl("npu_quant_matmul", TORCH_FN(aar::ops::cpu::quant_matmul)); }
