// npu_rotary_mul (torch_npu): rotary position embedding with the rotation
// angles given per element,
//   'half':       x_new = cat(-x2, x1) of the halves (x1, x2)
//   'interleave': x_new = (-x1, x0, -x3, x2, ...) on the pairs (x0, x1), ...
//   out = r1 * x + r2 * x_new
// The SFA indexer rotates the first qk_rope_head_dim dims of its heads with it
// (docs/design/sparse.md §2: neox halves, or pairs for GLM-MoE-DSA).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/string_view.h>

#include "ascend_attn_rt/ops/provider.h"

namespace aar::ops {

// x 4-D (BSND / BNSD / SBND), D even; r1/r2 4-D, broadcastable to x (e.g.
// (1, S, 1, D) for BSND). The optional rotate matrix of torch_npu is not used
// by the runtime (the CPU twin rejects it by name).
at::Tensor rotary_mul(const at::Tensor& x, const at::Tensor& r1, const at::Tensor& r2,
                      c10::string_view rotary_mode = "half", Provider pv = Provider::Auto);

}  // namespace aar::ops
