// vllm-ascend's _C_ascend batch_matmul_transpose (docs/design/sfa.md §4.4, the SFA V
// up-projection): c[t, n] = a[t, n] @ b[n], written into c.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/string_view.h>

#include <optional>

#include "ascend_attn_rt/ops/provider.h"

namespace aar::ops {

// a (T, N, L), b (N, L, V), c (T, N, V) written in place (fp32 accumulation,
// stored in c's dtype = a's). format_mode / quant_mode other than None are
// NotSupported by the CPU twin.
void batch_matmul_transpose(const at::Tensor& a, const at::Tensor& b, at::Tensor& c,
                            std::optional<c10::string_view> format_mode = std::nullopt,
                            std::optional<c10::string_view> quant_mode = std::nullopt, Provider pv = Provider::Auto);

}  // namespace aar::ops
