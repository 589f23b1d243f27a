// Hadamard matrices as tensors (hadamard.h).
#include "ascend_attn_rt/ops/hadamard.h"

#include <ATen/ATen.h>

#include "ascend_attn_rt/errors.h"
#include "ascend_attn_rt/ops/dense.h"
#include "ascend_attn_rt/plan/hadamard.h"

namespace aar::ops {

at::Tensor hadamard_matrix(int64_t n, double scale, at::ScalarType dtype, c10::Device device) {
  AAR_CHECK_ARG(plan::is_power_of_two(n) && n <= 4096, "hadamard_matrix: n must be a power of two in [1, 4096] ",
                "(Sylvester's construction), got ", n);
  at::Tensor h = at::empty({n, n}, at::TensorOptions().dtype(at::kFloat));
  plan::fill_hadamard(n, scale, {h.data_ptr<float>(), static_cast<std::size_t>(n * n)});
  return h.to(device, dtype);
}

at::Tensor hadamard_rotate(const at::Tensor& x, const at::Tensor& h) {
  AAR_CHECK_ARG(h.dim() == 2 && h.size(0) == h.size(1), "hadamard_rotate: h must be a square matrix, got ",
                h.sizes());
  AAR_CHECK_ARG(x.dim() >= 1 && x.size(-1) == h.size(0), "hadamard_rotate: x must be (..., ", h.size(0),
                "), got ", x.sizes());
  return dense::linear(x, h);
}

}  // namespace aar::ops
