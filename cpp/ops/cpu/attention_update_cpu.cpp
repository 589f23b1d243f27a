// CPU twin of npu_attention_update (docs/design/cp.md §7.1, docs/design/ops.md §4.8): the merge of
// N partial attention results by their log-sum-exp,
//   lmax = max_i lse_i,  lse = lmax + ln sum_i exp(lse_i - lmax),  out = sum_i out_i exp(lse_i - lse),
// computed by plan::merge_attention_partials in fp32 (double inside the
// exponentials) over contiguous fp32 copies of the partials; out has
// local_out's dtype. Empty partials (docs/design/cp.md §7.3): an lse of -inf (or +inf / NaN,
// normalised to -inf) contributes nothing and its output is never read, so a
// NaN there cannot leak; a row whose partials are all empty gives out 0 and
// lse -inf, never NaN. update_type 1 also returns the merged lse (float32,
// (M)); 0 returns an empty float32 tensor in its place (the documentation says
// lse_out is valid only for 1). Limits, refused by name: attention_update_check.h.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <vector>

#include "../attention_update_check.h"
#include "ascend_attn_rt/cp/plan/lse_merge.h"

namespace aar::ops::cpu {
namespace {

constexpr const char* kAttentionUpdateOp = "npu_attention_update";

std::tuple<at::Tensor, at::Tensor> attention_update(at::TensorList lse, at::TensorList local_out,
                                                    int64_t update_type) {
  detail::check_attention_update_args(lse, local_out, update_type, kAttentionUpdateOp);
  const size_t n = lse.size();
  const int64_t m = lse[0].size(0);
  const int64_t d = local_out[0].size(1);
  std::vector<at::Tensor> keep;
  keep.reserve(2 * n);
  std::vector<plan::CSpan<float>> outs(n), lses(n);
  for (size_t i = 0; i < n; ++i) {
    keep.push_back(local_out[i].to(at::kFloat).contiguous());
    outs[i] = plan::CSpan<float>(keep.back().const_data_ptr<float>(), static_cast<size_t>(m * d));
    keep.push_back(lse[i].contiguous());
    lses[i] = plan::CSpan<float>(keep.back().const_data_ptr<float>(), static_cast<size_t>(m));
  }
  const auto f32 = lse[0].options().dtype(at::kFloat);
  at::Tensor out = at::empty({m, d}, f32);
  at::Tensor lse_out = at::empty({update_type == 1 ? m : 0}, f32);
  plan::merge_attention_partials(plan::CSpan<plan::CSpan<float>>(outs.data(), n),
                                 plan::CSpan<plan::CSpan<float>>(lses.data(), n), m, d,
                                 plan::Span<float>(out.data_ptr<float>(), static_cast<size_t>(m * d)),
                                 update_type == 1 ? plan::Span<float>(lse_out.data_ptr<float>(), static_cast<size_t>(m))
                                                  : plan::Span<float>());
  return {out.to(local_out[0].scalar_type()), lse_out};
}

}  // namespace
}  // namespace aar::ops::cpu

TORCH_LIBRARY_IMPL(ascend_cpu, CPU, m) {
  m.impl("npu_attention_update", TORCH_FN(aar::ops::cpu::attention_update));
}
