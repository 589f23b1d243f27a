// CPU twin of vllm-ascend's inplace_partial_rotary_mul (ascend_cpu_va; semantics in
// include/ascend_attn_rt/ops/dsa_inplace_ops.h): RoPE on x[..., a:b] in fp32 ("interleave" /
// "half"). Every check precedes the first write.
#include <torch/library.h>

#include "../op_signatures.h"
#include "attention_reference.h"

namespace aar::ops::cpu {
namespace {

constexpr const char* kInplaceRopeOp = "_C_ascend::inplace_partial_rotary_mul";

void inplace_partial_rotary_mul(at::Tensor& x, const at::Tensor& r1, const at::Tensor& r2,
                                c10::string_view rotary_mode, at::IntArrayRef partial_slice) {
  const bool interleave = rotary_mode == "interleave";
  if (!interleave && rotary_mode != "half") {
    throw_invalid(kInplaceRopeOp, ": rotary_mode must be \"interleave\" or \"half\", got \"", rotary_mode, "\"");
  }
  AAR_CHECK_ARG(is_float_dtype(x.scalar_type()), kInplaceRopeOp, ": x must be float32/float16/bfloat16, got ",
                x.scalar_type());
  AAR_CHECK_ARG(x.dim() >= 1, kInplaceRopeOp, ": x must have at least one dim, got ", x.sizes());
  AAR_CHECK_ARG(partial_slice.size() == 2, kInplaceRopeOp, ": partial_slice must be [begin, end], got ", partial_slice);
  const int64_t a = partial_slice[0], b = partial_slice[1], d = x.size(-1);
  AAR_CHECK_ARG(a >= 0 && a < b && b <= d, kInplaceRopeOp, ": partial_slice=", partial_slice,
                " must satisfy 0 <= begin < end <= x.size(-1)=", d);
  const int64_t w = b - a;
  AAR_CHECK_ARG(w % 2 == 0, kInplaceRopeOp, ": the rotated width end - begin must be even, got ", w);
  at::Tensor slice = x.narrow(-1, a, w);
  for (const at::Tensor* t : {&r1, &r2}) {
    const char* name = t == &r1 ? "r1" : "r2";
    AAR_CHECK_ARG(is_float_dtype(t->scalar_type()), kInplaceRopeOp, ": ", name, " must be float32/float16/bfloat16, got ",
                  t->scalar_type());
    AAR_CHECK_ARG(t->dim() >= 1 && t->dim() <= x.dim() && t->size(-1) == w, kInplaceRopeOp, ": ", name,
                  " must have last dim end - begin = ", w, " and at most x.dim()=", x.dim(), " dims, got ",
                  t->sizes());
    for (int64_t i = 1; i <= t->dim(); ++i) {
      AAR_CHECK_ARG(t->size(-i) == 1 || t->size(-i) == slice.size(-i), kInplaceRopeOp, ": ", name, " ", t->sizes(),
                    " does not broadcast to x[..., ", a, ":", b, "] of shape ", slice.sizes());
    }
    AAR_CHECK_ARG(t->device() == x.device(), kInplaceRopeOp, ": ", name, " must be on x's device ", x.device(), ", got ",
                  t->device());
  }
  AAR_CHECK_ARG(x.device().is_cpu(), kInplaceRopeOp, ": the CPU twin needs x on the CPU, got ", x.device());
  const at::Tensor xf = slice.to(at::kFloat);
  at::Tensor rot;
  if (interleave) {
    std::vector<int64_t> pair_shape(xf.sizes().begin(), xf.sizes().end() - 1);
    pair_shape.push_back(w / 2);
    pair_shape.push_back(2);
    const at::Tensor pairs = xf.reshape(pair_shape);
    rot = at::stack({pairs.select(-1, 1).neg(), pairs.select(-1, 0)}, -1).reshape(xf.sizes());
  } else {
    rot = at::cat({xf.narrow(-1, w / 2, w / 2).neg(), xf.narrow(-1, 0, w / 2)}, -1);
  }
  slice.copy_(xf * r1.to(at::kFloat) + rot * r2.to(at::kFloat));
}

}  // namespace
}  // namespace aar::ops::cpu

TORCH_LIBRARY_IMPL(ascend_cpu_va, CPU, m) {
  m.impl("inplace_partial_rotary_mul", TORCH_FN(aar::ops::cpu::inplace_partial_rotary_mul));
}
