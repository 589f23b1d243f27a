// The in-place helpers of the DeepSeek-V4 (DSA) path, vllm-ascend's _C_ascend
// operators (docs/design/sparse.md §2, docs/design/dsa.md §1.1, §4.1, docs/design/ops.md §4.6, docs/design/sparse.md §7):
//   npu_scatter_nd_update_v2    the A2/A3 SWA / compressed KV-cache write by (block, offset)
//   inplace_partial_rotary_mul  RoPE on a slice of the last dim (DSV4 de-rotates the
//                               attention output with r2 = -sin)
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/string_view.h>

#include <cstdint>

#include "ascend_attn_rt/ops/provider.h"

namespace aar::ops {

// In place: var[indices[i, 0], ..., indices[i, k-1]] = update[i] for every row i
// of indices (..., k) (int32 or int64; DSV4: (N, 2) = (block, offset) into a
// (num_blocks, block_size, 1, D) cache). update is indices.shape[:-1] +
// var.shape[k:], or the same with var's size-1 trailing dims left out (e.g.
// (N, D) for that cache). A row with a negative component (block -1: the A2/A3
// encoding (-1, bs-1) of slot -1) or whose linear index into var's first k dims
// is outside [0, their element count) is skipped (docs/design/dsa.md §4.1: the kernel drops
// it). Rows that repeat an index: the last one wins. updates must have var's
// dtype; var may be any strided view; nothing is written when the call is refused.
void scatter_nd_update_v2(at::Tensor& var, const at::Tensor& indices, const at::Tensor& update,
                          Provider pv = Provider::Auto);

// In place on x[..., a:b] (partial_slice = {a, b}, 0 <= a < b <= x.size(-1),
// b - a even): y = x * r1 + rot(x) * r2 with
//   "interleave": rot on each pair (x0, x1) -> (-x1, x0) (DSV4)
//   "half":       rot(x1, x2) -> (-x2, x1) of the slice's halves
// r1 / r2 (fp32 tables in DSV4, already repeat-interleaved for "interleave")
// have last dim b - a and broadcast to x[..., a:b]. Computed in fp32, stored
// in x's dtype; the rest of x is untouched. Passing -sin as r2 inverts a
// rotation by sin.
void inplace_partial_rotary_mul(at::Tensor& x, const at::Tensor& r1, const at::Tensor& r2,
                                c10::string_view rotary_mode, c10::IntArrayRef partial_slice,
                                Provider pv = Provider::Auto);

}  // namespace aar::ops
