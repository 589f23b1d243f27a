// npu_attention_update's argument limits, shared by the wrapper (so every
// provider, the NPU's included, refuses the same calls before any work) and by
// the CPU twin and the no-compute kernel (reached by name through the
// dispatcher too). The limits: the torch_npu 2.14.0 documentation
// (_op_plugin_docs.py: lse FLOAT (M), local_out FLOAT/FLOAT16/BFLOAT16 (M, D),
// lse_out valid for update_type 1) and the kernel's limits of docs/design/cp.md §7.1
//  (N in [1, 16] partials, D a multiple of 8 in [8, 512]). update_type
// other than 0 / 1 is refused as not supported (the documentation defines no
// other). Where the documentation is silent: every partial on one device, all
// local_out of one dtype, M may be 0; strides are not restricted (the twin
// reads through contiguous copies).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>

#include <cstdint>

#include "ascend_attn_rt/errors.h"

namespace aar::ops::detail {

constexpr int64_t kAttnUpdateMaxParts = 16;
constexpr int64_t kAttnUpdateMinDim = 8;
constexpr int64_t kAttnUpdateMaxDim = 512;

inline void check_attention_update_args(at::TensorList lse, at::TensorList local_out, int64_t update_type,
                                        const char* who) {
  if (update_type != 0 && update_type != 1) {
    throw_not_supported(who, ": not supported: update_type=", update_type,
                        " (0: merged out only, 1: merged out and lse)");
  }
  const int64_t n = static_cast<int64_t>(lse.size());
  AAR_CHECK_ARG(n >= 1 && n <= kAttnUpdateMaxParts, who, ": lse must hold 1..", kAttnUpdateMaxParts,
                " partial results, got ", n);
  AAR_CHECK_ARG(static_cast<int64_t>(local_out.size()) == n, who, ": local_out has ", local_out.size(),
                " entries but lse has ", n);
  AAR_CHECK_ARG(lse[0].defined() && lse[0].dim() == 1, who, ": lse[0] must be a 1-d (M) tensor, got ",
                lse[0].defined() ? lse[0].sizes() : c10::IntArrayRef{});
  const int64_t m = lse[0].size(0);
  AAR_CHECK_ARG(local_out[0].defined() && local_out[0].dim() == 2 && local_out[0].size(0) == m, who,
                ": local_out[0] must be (M=", m, ", D), got ",
                local_out[0].defined() ? local_out[0].sizes() : c10::IntArrayRef{});
  const int64_t d = local_out[0].size(1);
  AAR_CHECK_ARG(d >= kAttnUpdateMinDim && d <= kAttnUpdateMaxDim && d % 8 == 0, who, ": head_dim D=", d,
                " must be a multiple of 8 in [", kAttnUpdateMinDim, ", ", kAttnUpdateMaxDim, "]");
  const at::ScalarType ot = local_out[0].scalar_type();
  AAR_CHECK_ARG(ot == at::kFloat || ot == at::kHalf || ot == at::kBFloat16, who,
                ": local_out must be float32, float16 or bfloat16, got ", ot);
  const c10::Device dev = lse[0].device();
  for (int64_t i = 0; i < n; ++i) {
    const at::Tensor& l = lse[i];
    const at::Tensor& o = local_out[i];
    AAR_CHECK_ARG(l.defined() && l.scalar_type() == at::kFloat && l.dim() == 1 && l.size(0) == m, who, ": lse[", i,
                  "] must be float32 (M=", m, "), got ", l.defined() ? l.scalar_type() : at::ScalarType::Undefined,
                  " ", l.defined() ? l.sizes() : c10::IntArrayRef{});
    AAR_CHECK_ARG(o.defined() && o.dim() == 2 && o.size(0) == m && o.size(1) == d && o.scalar_type() == ot, who,
                  ": local_out[", i, "] must be (M=", m, ", D=", d, ") of dtype ", ot, ", got ",
                  o.defined() ? o.scalar_type() : at::ScalarType::Undefined, " ",
                  o.defined() ? o.sizes() : c10::IntArrayRef{});
    AAR_CHECK_ARG(l.device() == dev && o.device() == dev, who, ": lse[", i, "] and local_out[", i,
                  "] must be on lse[0]'s device ", dev, ", got ", l.device(), " and ", o.device());
  }
}

}  // namespace aar::ops::detail
