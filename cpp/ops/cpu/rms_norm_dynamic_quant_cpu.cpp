// CPU twin of vllm-ascend's npu_rms_norm_dynamic_quant (ascend_cpu_va; semantics in
// include/ascend_attn_rt/ops/quant.h): per row (last dim) of x, the RMSNorm
// y = x * rsqrt(mean(x^2) + epsilon) * gamma (+ beta), times smooth_scale when given, then the
// per-row symmetric int8 quantisation of npu_dynamic_quant (scale = amax|y| / 127,
// q = round(y / scale) half to even). Everything in fp32 from x's values: the normed row is
// never rounded to x's dtype before it is quantised (what the fusion saves over the
// RMSNorm -> npu_dynamic_quant sequence in bf16). An all-zero row gives scale 0 and codes 0.
#include <torch/library.h>

#include "../op_signatures.h"
#include "attention_reference.h"

namespace aar::ops::cpu {
namespace {

constexpr const char* kOp = "_C_ascend::npu_rms_norm_dynamic_quant";

// A per-channel vector of the row width (gamma, beta, smooth_scale), float.
void check_channel(const at::Tensor& t, const char* name, int64_t h) {
  AAR_CHECK_ARG(t.dim() == 1 && t.size(0) == h, kOp, ": ", name, " must have shape (", h, "), x's last dim, got ",
                t.sizes());
  AAR_CHECK_ARG(is_float_dtype(t.scalar_type()), kOp, ": ", name, " must be float16/bfloat16/float32, got ",
                t.scalar_type());
  AAR_CHECK_ARG(t.device().is_cpu(), kOp, ": the CPU twin needs ", name, " on the CPU, got ", t.device());
}

std::tuple<at::Tensor, at::Tensor> rms_norm_dynamic_quant(AAR_RMS_NORM_DYNAMIC_QUANT_PARAMS) {
  AAR_CHECK_ARG(x.dim() >= 2, kOp, ": x must have at least 2 dims (rows, hidden), got ", x.sizes());
  AAR_CHECK_ARG(is_float_dtype(x.scalar_type()), kOp, ": x must be float16/bfloat16/float32, got ", x.scalar_type());
  AAR_CHECK_ARG(x.device().is_cpu(), kOp, ": the CPU twin needs a CPU x, got ", x.device());
  AAR_CHECK_ARG(epsilon > 0, kOp, ": epsilon must be positive, got ", epsilon);
  const int64_t h = x.size(-1);
  check_channel(gamma, "gamma", h);
  if (beta.has_value()) check_channel(*beta, "beta", h);
  if (smooth_scale.has_value()) check_channel(*smooth_scale, "smooth_scale", h);
  const at::Tensor f = x.to(at::kFloat);
  at::Tensor y = f * at::rsqrt(f.pow(2).mean(-1, /*keepdim=*/true) + epsilon) * gamma.to(at::kFloat);
  if (beta.has_value()) y.add_(beta->to(at::kFloat));
  if (smooth_scale.has_value()) y.mul_(smooth_scale->to(at::kFloat));
  const at::Tensor scale = y.abs().amax(-1, /*keepdim=*/true).div_(127.0f);
  const at::Tensor safe = at::where(scale.eq(0), at::ones_like(scale), scale);  // zero rows: codes 0
  const at::Tensor q = (y / safe).round_().clamp_(-127, 127).to(at::kChar);
  return {q, scale.squeeze(-1)};
}

}  // namespace
}  // namespace aar::ops::cpu

TORCH_LIBRARY_IMPL(ascend_cpu_va, CPU, m) {
  m.impl("npu_rms_norm_dynamic_quant", TORCH_FN(aar::ops::cpu::rms_norm_dynamic_quant));
}
