// CPU twin of vllm-ascend's _C_ascend::batch_matmul_transpose
// (docs/design/sfa.md §4.4, docs/design/ops.md §4.6): c[t, n] = a[t, n] @ b[n] for a (T, N, L), b (N, L, V), written into
// c (T, N, V) in place (any strides), accumulated in fp32. format_mode and
// quant_mode other than None are rejected by name.
#include <torch/library.h>

#include "../op_signatures.h"
#include "attention_reference.h"

namespace aar::ops::cpu {
namespace {

constexpr const char* kBatchMatmulTransposeOp = "_C_ascend::batch_matmul_transpose";

void batch_matmul_transpose(const at::Tensor& tensor_a, const at::Tensor& tensor_b, const at::Tensor& tensor_c,
                            std::optional<c10::string_view> format_mode, std::optional<c10::string_view> quant_mode) {
  if (format_mode.has_value()) {
    throw_not_supported(kBatchMatmulTransposeOp, ": not supported by the CPU twin: format_mode=\"", *format_mode, "\" (pass None)");
  }
  if (quant_mode.has_value()) {
    throw_not_supported(kBatchMatmulTransposeOp, ": not supported by the CPU twin: quant_mode=\"", *quant_mode, "\" (pass None)");
  }
  const at::Tensor &a = tensor_a, &b = tensor_b, &c = tensor_c;
  AAR_CHECK_ARG(a.dim() == 3, kBatchMatmulTransposeOp, ": tensor_a must be (T, N, L), got ", a.sizes());
  const int64_t t = a.size(0), n = a.size(1), l = a.size(2);
  AAR_CHECK_ARG(b.dim() == 3 && b.size(0) == n && b.size(1) == l, kBatchMatmulTransposeOp, ": tensor_b must be (N=", n, ", L=", l,
                ", V), got ", b.sizes());
  const int64_t v = b.size(2);
  AAR_CHECK_ARG(c.dim() == 3 && c.size(0) == t && c.size(1) == n && c.size(2) == v, kBatchMatmulTransposeOp, ": tensor_c must be (T=", t,
                ", N=", n, ", V=", v, "), got ", c.sizes());
  AAR_CHECK_ARG(is_float_dtype(a.scalar_type()) && b.scalar_type() == a.scalar_type() &&
                    c.scalar_type() == a.scalar_type(),
                kBatchMatmulTransposeOp, ": tensor_a, tensor_b and tensor_c must share a float dtype, got ", a.scalar_type(), ", ",
                b.scalar_type(), " and ", c.scalar_type());
  for (const at::Tensor* x : {&a, &b, &c}) {
    AAR_CHECK_ARG(x->device().is_cpu(), kBatchMatmulTransposeOp, ": the CPU twin needs CPU tensors, got one on ", x->device());
  }
  const at::Tensor r = at::bmm(a.transpose(0, 1).to(at::kFloat), b.to(at::kFloat));  // (N, T, V)
  c.copy_(r.transpose(0, 1));
}

}  // namespace
}  // namespace aar::ops::cpu

TORCH_LIBRARY_IMPL(ascend_cpu_va, CPU, m) {
  m.impl("batch_matmul_transpose", TORCH_FN(aar::ops::cpu::batch_matmul_transpose));
}
