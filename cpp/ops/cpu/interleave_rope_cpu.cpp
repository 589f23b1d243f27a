// CPU twin of npu_interleave_rope (docs/design/mla.md §1.3): u = [x0, x2, ..., x1, x3, ...],
// y = u*cos + rotate_half(u)*sin, computed in fp32 and cast to x's dtype. The
// NPU kernel requires D = 64; the twin takes any even D (small test shapes).
#include <torch/library.h>

#include "../op_signatures.h"
#include "attention_reference.h"

namespace aar::ops::cpu {

at::Tensor rope_half_split(const at::Tensor& u, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t d = u.size(-1);
  const at::Tensor uf = u.to(at::kFloat);
  const at::Tensor rot = at::cat({uf.narrow(-1, d / 2, d / 2).neg(), uf.narrow(-1, 0, d / 2)}, -1);
  return uf * cos.to(at::kFloat) + rot * sin.to(at::kFloat);
}

at::Tensor deinterleave(const at::Tensor& x) {
  const int64_t d = x.size(-1);
  return at::cat({x.slice(-1, 0, d, 2), x.slice(-1, 1, d, 2)}, -1);
}

namespace {

constexpr const char* kInterleaveRopeOp = "npu_interleave_rope";

at::Tensor interleave_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  AAR_CHECK_ARG(is_float_dtype(x.scalar_type()), kInterleaveRopeOp, ": x must be float16/bfloat16/float32, got ", x.scalar_type());
  AAR_CHECK_ARG(x.dim() == 4, kInterleaveRopeOp, ": x must be (B, N, S, D), got ", x.sizes());
  const int64_t b = x.size(0), s = x.size(2), d = x.size(3);
  AAR_CHECK_ARG(d % 2 == 0, kInterleaveRopeOp, ": the last dim of x must be even, got ", d);
  for (const at::Tensor* t : {&cos, &sin}) {
    const char* name = t == &cos ? "cos" : "sin";
    AAR_CHECK_ARG(t->dim() == 4 && t->size(0) == b && t->size(1) == 1 && (t->size(2) == s || t->size(2) == 1) &&
                      t->size(3) == d,
                  kInterleaveRopeOp, ": ", name, " must be (B=", b, ", 1, S=", s, " or 1, D=", d, "), got ", t->sizes());
  }
  return rope_half_split(deinterleave(x), cos, sin).to(x.scalar_type());
}

}  // namespace
}  // namespace aar::ops::cpu

TORCH_LIBRARY_IMPL(ascend_cpu, CPU, m) {
  m.impl("npu_interleave_rope", TORCH_FN(aar::ops::cpu::interleave_rope));
}
