// CPU twin of npu_attention_update (spec mla.md 6.5): lmax = max_i lse_i,
// LSE = lmax + ln sum_i exp(lse_i - lmax), out = sum_i out_i * exp(lse_i - LSE),
// computed in fp32; output dtype = local_out[0]'s. Rows whose partitions are all
// empty (every lse_i = -inf) get out 0 and LSE -inf. update_type 1 also returns
// LSE, 0 returns an empty tensor.
#include <torch/library.h>

#include <limits>

#include "../op_signatures.h"
#include "attention_reference.h"

namespace aar::ops::cpu {
namespace {

constexpr const char* kOp = "npu_attention_update";

std::tuple<at::Tensor, at::Tensor> attention_update(at::TensorList lse, at::TensorList local_out,
                                                    int64_t update_type) {
  if (update_type != 0 && update_type != 1) {
    throw_not_supported(kOp, ": not supported: update_type=", update_type, " (only 0 and 1)");
  }
  const size_t n = lse.size();
  AAR_CHECK_ARG(n >= 1 && n <= 16, kOp, ": lse must hold 1..16 partial results, got ", n);
  AAR_CHECK_ARG(local_out.size() == n, kOp, ": local_out has ", local_out.size(), " entries but lse has ", n);
  const int64_t m = lse[0].numel();
  AAR_CHECK_ARG(local_out[0].dim() == 2 && local_out[0].size(0) == m, kOp, ": local_out[0] must be (M=", m,
                ", d), got ", local_out[0].sizes());
  const int64_t d = local_out[0].size(1);
  AAR_CHECK_ARG(d >= 8 && d <= 512 && d % 8 == 0, kOp, ": head_dim d=", d, " must be a multiple of 8 in [8, 512]");
  for (size_t i = 0; i < n; ++i) {
    AAR_CHECK_ARG(lse[i].scalar_type() == at::kFloat && lse[i].dim() == 1 && lse[i].size(0) == m, kOp, ": lse[", i,
                  "] must be float32 (M=", m, "), got ", lse[i].scalar_type(), " ", lse[i].sizes());
    AAR_CHECK_ARG(local_out[i].dim() == 2 && local_out[i].size(0) == m && local_out[i].size(1) == d &&
                      local_out[i].scalar_type() == local_out[0].scalar_type(),
                  kOp, ": local_out[", i, "] must be (M=", m, ", d=", d, ") of dtype ", local_out[0].scalar_type(),
                  ", got ", local_out[i].scalar_type(), " ", local_out[i].sizes());
    AAR_CHECK_ARG(is_float_dtype(local_out[i].scalar_type()), kOp, ": local_out must be float32/float16/bfloat16");
  }
  const at::Tensor l = at::stack(lse, 0);  // (n, M)
  at::Tensor lmax = std::get<0>(l.max(0));
  const at::Tensor finite = at::isfinite(lmax);
  const at::Tensor safe_max = at::where(finite, lmax, at::zeros_like(lmax));
  const at::Tensor total = at::log(at::exp(l - safe_max).sum(0)) + safe_max;  // -inf when all empty
  at::Tensor w = at::exp(l - total);                                           // (n, M)
  w = at::where(finite.unsqueeze(0), w, at::zeros_like(w));
  at::Tensor out = at::zeros({m, d}, local_out[0].options().dtype(at::kFloat));
  for (size_t i = 0; i < n; ++i) out += local_out[i].to(at::kFloat) * w[i].unsqueeze(1);
  at::Tensor lse_out = update_type == 1 ? total : at::empty({0}, lse[0].options());
  return {out.to(local_out[0].scalar_type()), lse_out};
}

}  // namespace
}  // namespace aar::ops::cpu

TORCH_LIBRARY_IMPL(ascend_cpu, CPU, m) {
  m.impl("npu_attention_update", TORCH_FN(aar::ops::cpu::attention_update));
}
