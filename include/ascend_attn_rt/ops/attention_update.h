// npu_attention_update (docs/design/ops.md §4.8): LSE-weighted merge of up to 16
// partial attention results.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>

#include <tuple>

#include "ascend_attn_rt/ops/provider.h"

namespace aar::ops {

// lse[i] fp32 (M), local_out[i] (M, d). Returns (out (M, d), lse_out): lse_out
// is the merged LSE for update_type 1 and an empty tensor for 0.
std::tuple<at::Tensor, at::Tensor> attention_update(at::TensorList lse, at::TensorList local_out,
                                                    int64_t update_type, Provider pv = Provider::Auto);

namespace detail {
// The same call without the per-call argument checks, for a caller whose partials are views of
// buffers it laid out and checked against the same limits once (cp::DcpWorkspace: the merge inputs of
// one exchange shape are fixed views, checked when the workspace was made).
std::tuple<at::Tensor, at::Tensor> attention_update_prechecked(at::TensorList lse, at::TensorList local_out,
                                                               int64_t update_type);
}  // namespace detail

}  // namespace aar::ops
