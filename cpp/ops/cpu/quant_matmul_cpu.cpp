// CPU twin of npu_quant_matmul, the W8A8 forms the runtime uses:
//   y = (x1 @ x2 + bias) * scale [* pertoken_scale per row]
// x1 (..., k) int8, x2 (k, n) int8, bias int32 (n) added to the exact integer
// accumulator, scale float32/bfloat16 (n) or (1), pertoken_scale float32 (m) with
// m the rows of x1; output_dtype float16 / bfloat16 (and float32, a CPU-twin
// extension for fp32 test models). The accumulator is exact (computed in
// float64), the scaling in float64, one rounding to the output dtype.
// Rejected by name: int64 (npu_trans_quant_param) scales, offset, int8/int32
// outputs, int4 (int32-packed) inputs, float biases, group_sizes, y_scale and
// the explicit dtype arguments.
#include <torch/library.h>

#include "../op_signatures.h"
#include "attention_reference.h"

namespace aar::ops::cpu {
namespace {

constexpr const char* kQuantMatmulOp = "npu_quant_matmul";

at::Tensor quant_matmul(AAR_QUANT_MATMUL_PARAMS) {
  reject_tensor(kQuantMatmulOp, offset, "offset");
  reject_tensor(kQuantMatmulOp, y_scale, "y_scale");
  reject_opt_int(kQuantMatmulOp, x1_dtype, "x1_dtype");
  reject_opt_int(kQuantMatmulOp, x2_dtype, "x2_dtype");
  reject_opt_int(kQuantMatmulOp, pertoken_scale_dtype, "pertoken_scale_dtype");
  reject_opt_int(kQuantMatmulOp, scale_dtype, "scale_dtype");
  if (group_sizes.has_value()) throw_not_supported(kQuantMatmulOp, ": not supported by the CPU twin: group_sizes (pass None)");
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
