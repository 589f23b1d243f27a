// No-compute kernels of vllm-ascend's DeepSeek-V4 (DSA) shared-KV attention
// operators (ascend_noop_va, issue 12): correctly shaped outputs from the
// per-thread cache (output_cache.h), no arithmetic; in-place operators do
// nothing. Registered for the CPU and the Meta dispatch keys.
#include <torch/library.h>

#include <array>

#include "../op_signatures.h"
#include "ascend_attn_rt/errors.h"
#include "output_cache.h"

namespace aar::ops::noop {

namespace {

// out: q's shape and dtype; softmax_lse: q's shape minus the last dim, fp32, when asked, else empty.
sig::SasResult sparse_attn_sharedkv(AAR_SPARSE_ATTN_SHAREDKV_PARAMS) {
  AAR_CHECK_ARG(q.dim() == 3 || q.dim() == 4, "ascend_noop npu_sparse_attn_sharedkv: q must be 3-D (TND) or 4-D ",
                "(BSND), got ", q.sizes());
  const at::Tensor out = cached(q.sizes(), q.scalar_type(), q.device());
  if (!return_softmax_lse) {
    static const std::array<int64_t, 1> z{0};
    return {out, cached(c10::IntArrayRef(z.data(), 1), at::kFloat, q.device())};
  }
  return {out, cached(q.sizes().slice(0, q.dim() - 1), at::kFloat, q.device())};
}

sig::SasResult kv_quant_sparse_attn_sharedkv(AAR_KV_QUANT_SPARSE_ATTN_SHAREDKV_PARAMS) {
  return sparse_attn_sharedkv(q, AAR_SAS_TENSOR_ARGS, softmax_scale, AAR_SAS_MODE_ARGS);
}

// (1024,) int32 on the device of the first length tensor given (CPU if none).

at::Tensor sparse_attn_sharedkv_metadata(AAR_SPARSE_ATTN_SHAREDKV_METADATA_PARAMS) {
  c10::Device dev(c10::kCPU);
  for (const auto* t : {&cu_seqlens_q, &seqused_kv, &cu_seqlens_ori_kv, &cu_seqlens_cmp_kv, &seqused_q}) {
    if (t->has_value() && (*t)->defined()) {
      dev = (*t)->device();
      break;
    }
  }
  static const std::array<int64_t, 1> s{1024};
  return cached(c10::IntArrayRef(s.data(), 1), at::kInt, dev);
}

at::Tensor kv_quant_sparse_attn_sharedkv_metadata(AAR_KV_QUANT_SPARSE_ATTN_SHAREDKV_METADATA_PARAMS) {
  return sparse_attn_sharedkv_metadata(AAR_SPARSE_ATTN_SHAREDKV_METADATA_ARGS);
}


void scatter_nd_update_v2(at::Tensor& var, const at::Tensor& indices, const at::Tensor& update) {}

// (int8 codes of x's shape, fp32 scales of x.shape[:-1])
std::tuple<at::Tensor, at::Tensor> rms_norm_dynamic_quant(AAR_RMS_NORM_DYNAMIC_QUANT_PARAMS) {
  AAR_CHECK_ARG(x.dim() >= 1, "ascend_noop npu_rms_norm_dynamic_quant: x must have dims, got ", x.sizes());
  return {cached(x.sizes(), at::kChar, x.device()), cached(x.sizes().slice(0, x.dim() - 1), at::kFloat, x.device())};
}

void inplace_partial_rotary_mul(at::Tensor& x, const at::Tensor& r1, const at::Tensor& r2,
                                c10::string_view rotary_mode, at::IntArrayRef partial_slice) {}

void register_dsa(torch::Library& m) {
  m.impl("npu_sparse_attn_sharedkv", TORCH_FN(sparse_attn_sharedkv));
  m.impl("npu_kv_quant_sparse_attn_sharedkv", TORCH_FN(kv_quant_sparse_attn_sharedkv));
  m.impl("npu_sparse_attn_sharedkv_metadata", TORCH_FN(sparse_attn_sharedkv_metadata));
  m.impl("npu_kv_quant_sparse_attn_sharedkv_metadata", TORCH_FN(kv_quant_sparse_attn_sharedkv_metadata));
  m.impl("npu_scatter_nd_update_v2", TORCH_FN(scatter_nd_update_v2));
  m.impl("inplace_partial_rotary_mul", TORCH_FN(inplace_partial_rotary_mul));
  m.impl("npu_rms_norm_dynamic_quant", TORCH_FN(rms_norm_dynamic_quant));
}

}  // namespace
}  // namespace aar::ops::noop

TORCH_LIBRARY_IMPL(ascend_noop_va, CPU, m) { aar::ops::noop::register_dsa(m); }
TORCH_LIBRARY_IMPL(ascend_noop_va, Meta, m) { aar::ops::noop::register_dsa(m); }
// The metadata operators may get no tensor at all: the dispatcher then runs the
// CompositeExplicitAutograd kernel (the same function).
TORCH_LIBRARY_IMPL(ascend_noop_va, CompositeExplicitAutograd, m) {
  m.impl("npu_sparse_attn_sharedkv_metadata", TORCH_FN(aar::ops::noop::sparse_attn_sharedkv_metadata));
  m.impl("npu_kv_quant_sparse_attn_sharedkv_metadata",
         TORCH_FN(aar::ops::noop::kv_quant_sparse_attn_sharedkv_metadata));
}
