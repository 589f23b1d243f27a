// npu_interleave_rope (docs/design/mla.md §1.3): RoPE on interleaved pairs, result in
// half-split ("de-interleaved") order.
#pragma once

#include <ATen/core/Tensor.h>

#include "ascend_attn_rt/ops/provider.h"

namespace aar::ops {

// x (B, N, S, D); cos/sin (B, 1, S or 1, D) with duplicated halves.
at::Tensor interleave_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                           Provider pv = Provider::Auto);

}  // namespace aar::ops
