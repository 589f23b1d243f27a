// CPU twin of npu_quantize, the form the W8A8-static linears use (div_mode=False,
// dtype torch.qint8, the last axis): y = saturate_int8(rint(x * scales +
// zero_points)), computed in fp32, rounding half to even; scales and
// zero_points are 1-D of size 1 or x.size(-1) (the activation's per-tensor
// scale expanded per channel, as vllm-ascend passes it). div_mode=True, the
// other output dtypes (quint8, int32, quint4x2) and axis -2 are rejected by name.
#include <torch/library.h>

#include "../op_signatures.h"
#include "attention_reference.h"

namespace aar::ops::cpu {
namespace {

constexpr const char* kQuantizeOp = "npu_quantize";

at::Tensor quantize(const at::Tensor& self, const at::Tensor& scales, sig::OptT zero_points, int64_t dtype,
                    int64_t axis, bool div_mode) {
  if (div_mode) {
    throw_not_supported(kQuantizeOp, ": not supported by the CPU twin: div_mode=True (only the multiplying form, "
                        "div_mode=False)");
  }
  if (dtype != static_cast<int64_t>(at::kQInt8)) {
    throw_not_supported(kQuantizeOp, ": not supported by the CPU twin: dtype=", dtype, " (only ",
                        static_cast<int64_t>(at::kQInt8), " = torch.qint8)");
  }
  AAR_CHECK_ARG(self.dim() >= 1, kQuantizeOp, ": self must have at least 1 dim, got a scalar");
  if (axis != -1 && axis != self.dim() - 1) {
    throw_not_supported(kQuantizeOp, ": not supported by the CPU twin: axis=", axis, " (only the last axis, -1)");
  }
  AAR_CHECK_ARG(is_float_dtype(self.scalar_type()), kQuantizeOp, ": self must be float16/bfloat16/float32, got ",
                self.scalar_type());
  const int64_t C = self.size(-1);
  auto check_vec = [&](const at::Tensor& t, const char* name) {
    AAR_CHECK_ARG(t.dim() == 1 && (t.size(0) == 1 || t.size(0) == C), kQuantizeOp, ": ", name,
                  " must be 1-D of size 1 or self.size(-1)=", C, ", got ", t.sizes());
    AAR_CHECK_ARG(is_float_dtype(t.scalar_type()), kQuantizeOp, ": ", name,
                  " must be float16/bfloat16/float32 (div_mode=False), got ", t.scalar_type());
  };
  check_vec(scales, "scales");
  at::Tensor y = self.to(at::kFloat) * scales.to(at::kFloat);
  if (zero_points.has_value() && zero_points->defined()) {
    check_vec(*zero_points, "zero_points");
    AAR_CHECK_ARG(zero_points->scalar_type() == scales.scalar_type(), kQuantizeOp,
                  ": zero_points must have the scales' dtype ", scales.scalar_type(), ", got ",
                  zero_points->scalar_type());
    y = y + zero_points->to(at::kFloat);
  }
  return y.round_().clamp_(-128, 127).to(at::kChar);
}

}  // namespace
}  // namespace aar::ops::cpu

TORCH_LIBRARY_IMPL(ascend_cpu, CPU, m) { m.impl("npu_quantize", TORCH_FN(aar::ops::cpu::quantize)); }
