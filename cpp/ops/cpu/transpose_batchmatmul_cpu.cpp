// CPU twin of npu_transpose_batchmatmul: y = permute(bmm(permute(input, perm_x1),
// permute(weight, perm_x2)), perm_y), accumulated in fp32 and cast to the
// input dtype. bias / scale (quantized output) and batch_split_factor != 1 are
// rejected.
#include <torch/library.h>

#include "../op_signatures.h"
#include "attention_reference.h"

namespace aar::ops::cpu {
namespace {

constexpr const char* kTransposeBatchmatmulOp = "npu_transpose_batchmatmul";

at::Tensor permuted(const at::Tensor& t, at::OptionalIntArrayRef perm, const char* name) {
  if (!perm.has_value()) return t;
  AAR_CHECK_ARG(perm->size() == 3, kTransposeBatchmatmulOp, ": ", name, " must have 3 entries, got ", perm->size());
  std::vector<bool> seen(3, false);
  for (int64_t p : *perm) {
    AAR_CHECK_ARG(p >= 0 && p < 3 && !seen[p], kTransposeBatchmatmulOp, ": ", name, "=", *perm, " is not a permutation of (0, 1, 2)");
    seen[p] = true;
  }
  return t.permute(*perm);
}

at::Tensor transpose_batchmatmul(const at::Tensor& input, const at::Tensor& weight, sig::OptT bias, sig::OptT scale,
                                 at::OptionalIntArrayRef perm_x1, at::OptionalIntArrayRef perm_x2,
                                 at::OptionalIntArrayRef perm_y, sig::OptInt batch_split_factor) {
  reject_tensor(kTransposeBatchmatmulOp, bias, "bias");
  reject_tensor(kTransposeBatchmatmulOp, scale, "scale");
  if (batch_split_factor.has_value() && *batch_split_factor != 1) {
    throw_not_supported(kTransposeBatchmatmulOp, ": not supported by the CPU twin: batch_split_factor=", *batch_split_factor);
  }
  AAR_CHECK_ARG(input.dim() == 3 && weight.dim() == 3, kTransposeBatchmatmulOp, ": input and weight must be 3-D, got ", input.sizes(),
                " and ", weight.sizes());
  AAR_CHECK_ARG(input.scalar_type() == weight.scalar_type() && is_float_dtype(input.scalar_type()), kTransposeBatchmatmulOp,
                ": input and weight must share a float dtype, got ", input.scalar_type(), " and ",
                weight.scalar_type());
  const at::Tensor x = permuted(input, perm_x1, "perm_x1");
  const at::Tensor w = permuted(weight, perm_x2, "perm_x2");
  AAR_CHECK_ARG(x.size(0) == w.size(0) && x.size(2) == w.size(1), kTransposeBatchmatmulOp, ": permuted input ", x.sizes(),
                " and weight ", w.sizes(), " are not (B, M, K) x (B, K, N)");
  const at::Tensor y = at::bmm(x.to(at::kFloat), w.to(at::kFloat)).to(input.scalar_type());
  return permuted(y, perm_y, "perm_y").contiguous();
}

}  // namespace
}  // namespace aar::ops::cpu

TORCH_LIBRARY_IMPL(ascend_cpu, CPU, m) {
  m.impl("npu_transpose_batchmatmul", TORCH_FN(aar::ops::cpu::transpose_batchmatmul));
}
