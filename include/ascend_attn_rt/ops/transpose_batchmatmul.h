// npu_transpose_batchmatmul (docs/design/ops.md §4.5): batched matmul with input /
// weight / output permutations (the MLA V up-projection).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>

#include <optional>

#include "ascend_attn_rt/ops/provider.h"

namespace aar::ops {

// y = permute(bmm(permute(input, perm_x1), permute(weight, perm_x2)), perm_y).
at::Tensor transpose_batchmatmul(const at::Tensor& input, const at::Tensor& weight,
                                 std::optional<c10::IntArrayRef> perm_x1, std::optional<c10::IntArrayRef> perm_x2,
                                 std::optional<c10::IntArrayRef> perm_y, Provider pv = Provider::Auto);

}  // namespace aar::ops
