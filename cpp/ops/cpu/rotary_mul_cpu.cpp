// CPU twin of npu_rotary_mul (torch_npu docs): out = r1 * x + r2 * x_new with
// x_new = cat(-x2, x1) of the halves ('half') or (-x1, x0) on every pair
// ('interleave'), computed in fp32 and cast to x's dtype. The rotate matrix is
// rejected (the runtime never passes one).
#include <torch/library.h>

#include "../op_signatures.h"
#include "attention_reference.h"

namespace aar::ops::cpu {
namespace {

constexpr const char* kRotaryMulOp = "npu_rotary_mul";

at::Tensor rotary_mul(const at::Tensor& x, const at::Tensor& r1, const at::Tensor& r2, c10::string_view mode,
                      const std::optional<at::Tensor>& rotate) {
  reject_tensor(kRotaryMulOp, rotate, "rotate");
  AAR_CHECK_ARG(is_float_dtype(x.scalar_type()), kRotaryMulOp, ": self must be float16/bfloat16/float32, got ",
                x.scalar_type());
  AAR_CHECK_ARG(x.dim() == 4, kRotaryMulOp, ": self must be 4-D (BSND, BNSD or SBND), got ", x.sizes());
  const int64_t d = x.size(3);
  AAR_CHECK_ARG(d % 2 == 0, kRotaryMulOp, ": the last dim of self must be even, got ", d);
  for (const at::Tensor* t : {&r1, &r2}) {
    const char* name = t == &r1 ? "r1" : "r2";
    AAR_CHECK_ARG(t->dim() == 4 && t->size(3) == d, kRotaryMulOp, ": ", name, " must be 4-D with last dim ", d, ", got ",
                  t->sizes());
    for (int64_t i = 0; i < 3; ++i) {
      AAR_CHECK_ARG(t->size(i) == 1 || t->size(i) == x.size(i), kRotaryMulOp, ": ", name, " ", t->sizes(),
                    " does not broadcast to self ", x.sizes());
    }
  }
  const at::Tensor xf = x.to(at::kFloat);
  at::Tensor rot;
  if (mode == "half") {
    rot = at::cat({xf.narrow(-1, d / 2, d / 2).neg(), xf.narrow(-1, 0, d / 2)}, -1);
  } else if (mode == "interleave") {
    const at::Tensor pairs = xf.view({x.size(0), x.size(1), x.size(2), d / 2, 2});
    rot = at::stack({pairs.select(-1, 1).neg(), pairs.select(-1, 0)}, -1).view(x.sizes());
  } else {
    throw_invalid(kRotaryMulOp, ": rotary_mode must be 'half' or 'interleave', got '", mode, "'");
  }
  return (xf * r1.to(at::kFloat) + rot * r2.to(at::kFloat)).to(x.scalar_type());
}

}  // namespace
}  // namespace aar::ops::cpu

TORCH_LIBRARY_IMPL(ascend_cpu, CPU, m) { m.impl("npu_rotary_mul", TORCH_FN(aar::ops::cpu::rotary_mul)); }
