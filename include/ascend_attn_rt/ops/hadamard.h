// The Hadamard rotation of the quantised indexers (docs/design/sparse.md §3) as
// tensors; the construction is the plan layer's (ascend_attn_rt/plan/hadamard.h).
//  * SFA LI C8: k_li @ (H128 / sqrt(128)) and q_li @ (H128 / sqrt(128)), in the
//    model dtype, after RoPE and before npu_dynamic_quant.
//  * DSV4 rotate_activation: zero-pad to plan::hadamard_size(d), @ H (unnormalised),
//    times d^-0.5 with the original d, crop: hadamard_matrix(hadamard_size(d), 1.0, ...).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstdint>

namespace aar::ops {

// scale * H_n, (n, n) in `dtype` on `device`; n a power of two (else
// InvalidArgument naming n). Made once per layer: a constant operand.
at::Tensor hadamard_matrix(int64_t n, double scale, at::ScalarType dtype, c10::Device device);

// x (..., n) @ h for a Sylvester matrix h (n, n) (symmetric, so x @ h = x h^T:
// a dense::linear, covered by the no-compute provider). Returns x's dtype.
at::Tensor hadamard_rotate(const at::Tensor& x, const at::Tensor& h);

}  // namespace aar::ops
