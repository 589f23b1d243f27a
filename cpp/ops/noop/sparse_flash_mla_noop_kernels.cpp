// No-compute kernels of CANN's SparseFlashMla operators (ascend_noop_cot):
// correctly shaped outputs from the per-thread cache (output_cache.h), no
// arithmetic. Registered for the CPU and the Meta dispatch keys.
#include <torch/library.h>

#include <array>

#include "../op_signatures_cot.h"
#include "ascend_attn_rt/errors.h"
#include "output_cache.h"

namespace aar::ops::noop {

namespace {

// out: q's shape and dtype; softmax_lse: 0-dim fp32 unless asked, else
// (1, T, N1) for TND / (B, 1, S, N1) for BSND (one KV head).
sig::SasResult sparse_flash_mla(AAR_SPARSE_FLASH_MLA_PARAMS) {
  AAR_CHECK_ARG(q.dim() == 3 || q.dim() == 4, "ascend_noop sparse_flash_mla: q must be 3-D (TND) or 4-D (BSND), got ",
                q.sizes());
  const at::Tensor out = cached(q.sizes(), q.scalar_type(), q.device());
  if (!return_softmax_lse) return {out, cached(c10::IntArrayRef(), at::kFloat, q.device())};
  if (q.dim() == 3) {
    const std::array<int64_t, 3> s{1, q.size(0), q.size(1)};
    return {out, cached(c10::IntArrayRef(s.data(), 3), at::kFloat, q.device())};
  }
  const std::array<int64_t, 4> s{q.size(0), 1, q.size(1), q.size(2)};
  return {out, cached(c10::IntArrayRef(s.data(), 4), at::kFloat, q.device())};
}

at::Tensor sparse_flash_mla_metadata(AAR_SPARSE_FLASH_MLA_METADATA_PARAMS) {
  c10::Device dev(c10::kCPU);
  for (const auto* t : {&cu_seqlens_q, &seqused_ori_kv, &seqused_cmp_kv, &cmp_residual_kv, &cu_seqlens_ori_kv,
                        &cu_seqlens_cmp_kv, &seqused_q}) {
    if (t->has_value() && (*t)->defined()) {
      dev = (*t)->device();
      break;
    }
  }
  static const std::array<int64_t, 1> s{1024};
  return cached(c10::IntArrayRef(s.data(), 1), at::kInt, dev);
}

void register_smla(torch::Library& m) {
  m.impl("sparse_flash_mla", TORCH_FN(sparse_flash_mla));
  m.impl("sparse_flash_mla_metadata", TORCH_FN(sparse_flash_mla_metadata));
}

}  // namespace
}  // namespace aar::ops::noop

TORCH_LIBRARY_IMPL(ascend_noop_cot, CPU, m) { aar::ops::noop::register_smla(m); }
TORCH_LIBRARY_IMPL(ascend_noop_cot, Meta, m) { aar::ops::noop::register_smla(m); }
TORCH_LIBRARY_IMPL(ascend_noop_cot, CompositeExplicitAutograd, m) {
  m.impl("sparse_flash_mla_metadata", TORCH_FN(aar::ops::noop::sparse_flash_mla_metadata));
}
