// Typed wrappers for CANN's cann_ops_transformer::sparse_flash_mla and
// sparse_flash_mla_metadata (SparseFlashMla, docs/design/dsa.md §4.2), and the
// sharedkv -> SparseFlashMla argument adapter. Validation of the operator
// arguments is the provider's; the adapter validates what it derives.
#include <ATen/ATen.h>

#include "ascend_attn_rt/errors.h"
#include "ascend_attn_rt/ops/cann_ops_library.h"
#include "ascend_attn_rt/ops/sparse_flash_mla.h"
#include "op_handle.h"
#include "op_signatures_cot.h"

namespace aar::ops {

namespace {

detail::OpHandle<sig::SparseFlashMla> g_smla("sparse_flash_mla", "", kCannOpsTransformer);
detail::OpHandle<sig::SparseFlashMlaMetadata> g_smla_md("sparse_flash_mla_metadata", "",
                                                        kCannOpsTransformer);

Provider pick_metadata_provider(Provider pv, const SparseFlashMlaMetadataArgs& a) {
  if (pv != Provider::Auto) return pv;
  for (const auto* t : {&a.cu_seqlens_q, &a.seqused_ori_kv, &a.seqused_cmp_kv, &a.cmp_residual_kv,
                        &a.cu_seqlens_ori_kv, &a.cu_seqlens_cmp_kv, &a.seqused_q}) {
    if (t->has_value() && (*t)->defined()) return resolve_provider(**t);
  }
  return resolve_provider(at::Tensor());
}

c10::string_view paged_layout(c10::string_view layout_kv, const char* who) {
  AAR_CHECK_ARG(layout_kv == "PA_ND" || layout_kv == "PA_BBND", who, ": layout_kv=\"", layout_kv,
                "\" has no SparseFlashMla equivalent (the adapter maps the paged \"PA_ND\" / \"PA_BBND\" caches to "
                "\"PA_BBND\")");
  return "PA_BBND";
}

const FlashMlaCmpLengthTensors& need_cmp(const std::optional<FlashMlaCmpLengthTensors>& cmp, int64_t ratio,
                                         const char* who) {
  AAR_CHECK_ARG(cmp.has_value() && cmp->seqused_cmp_kv.defined() && cmp->cmp_residual_kv.defined(), who,
                ": a compressed layer (cmp_ratio=", ratio,
                ") needs seqused_cmp_kv and cmp_residual_kv (see flash_mla_cmp_length_tensors)");
  return *cmp;
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> sparse_flash_mla(const SparseFlashMlaArgs& a, Provider pv) {
  const Provider p = detail::pick_provider(pv, a.q);
  const auto& op = g_smla.get(p);
  detail::DispatchGuard guard(p);
  return op.call(a.q, a.ori_kv, a.cmp_kv, a.ori_sparse_indices, a.cmp_sparse_indices, a.ori_block_table,
                 a.cmp_block_table, a.cu_seqlens_q, a.cu_seqlens_ori_kv, a.cu_seqlens_cmp_kv, a.seqused_q,
                 a.seqused_ori_kv, a.seqused_cmp_kv, a.cmp_residual_kv, a.ori_topk_length, a.cmp_topk_length,
                 a.sinks, a.metadata, a.softmax_scale, a.cmp_ratio, a.ori_mask_mode, a.cmp_mask_mode,
                 a.ori_win_left, a.ori_win_right, a.layout_q, a.layout_kv, a.topk_value_mode,
                 a.return_softmax_lse);
}

at::Tensor sparse_flash_mla_metadata(const SparseFlashMlaMetadataArgs& a, Provider pv) {
  const Provider p = pick_metadata_provider(pv, a);
  const auto& op = g_smla_md.get(p);
  detail::DispatchGuard guard(p);
  return op.call(a.num_heads_q, a.num_heads_kv, a.head_dim, a.cu_seqlens_q, a.cu_seqlens_ori_kv,
                 a.cu_seqlens_cmp_kv, a.seqused_q, a.seqused_ori_kv, a.seqused_cmp_kv, a.cmp_residual_kv,
                 a.ori_topk_length, a.cmp_topk_length, a.batch_size, a.max_seqlen_q, a.max_seqlen_ori_kv,
                 a.max_seqlen_cmp_kv, a.ori_topk, a.cmp_topk, a.cmp_ratio, a.ori_mask_mode, a.cmp_mask_mode,
                 a.ori_win_left, a.ori_win_right, a.layout_q, a.layout_kv, a.has_ori_kv, a.has_cmp_kv);
}

FlashMlaCmpLengthTensors flash_mla_cmp_length_tensors(const at::Tensor& seqused_kv, int64_t cmp_ratio) {
  AAR_CHECK_ARG(cmp_ratio >= 2, "flash_mla_cmp_length_tensors: cmp_ratio must be >= 2 (a compressed layer), got ",
                cmp_ratio);
  AAR_CHECK_ARG(seqused_kv.defined() && seqused_kv.dim() == 1 && seqused_kv.scalar_type() == at::kInt,
                "flash_mla_cmp_length_tensors: seqused_kv must be a 1-D int32 tensor, got ",
                seqused_kv.defined() ? seqused_kv.toString() : std::string("an undefined tensor"));
  FlashMlaCmpLengthTensors out;
  out.seqused_cmp_kv = at::div(seqused_kv, cmp_ratio, "floor");
  out.cmp_residual_kv = at::remainder(seqused_kv, cmp_ratio);
  return out;
}

SparseFlashMlaArgs to_sparse_flash_mla_args(const SparseAttnSharedKvArgs& a,
                                            const std::optional<FlashMlaCmpLengthTensors>& cmp) {
  const char* who = "to_sparse_flash_mla_args";
  SparseFlashMlaArgs o;
  o.layout_kv = paged_layout(a.layout_kv, who);
  o.q = a.q;
  o.ori_kv = a.ori_kv;
  o.cmp_kv = a.cmp_kv;
  o.ori_sparse_indices = a.ori_sparse_indices;
  o.cmp_sparse_indices = a.cmp_sparse_indices;
  o.ori_block_table = a.ori_block_table;
  o.cmp_block_table = a.cmp_block_table;
  o.cu_seqlens_q = a.cu_seqlens_q;
  o.cu_seqlens_ori_kv = a.cu_seqlens_ori_kv;
  o.cu_seqlens_cmp_kv = a.cu_seqlens_cmp_kv;
  o.seqused_q = a.seqused_q;
  o.seqused_ori_kv = a.seqused_kv;
  o.sinks = a.sinks;
  o.metadata = a.metadata;
  o.softmax_scale = a.softmax_scale;
  o.cmp_ratio = a.cmp_ratio == 0 ? 1 : a.cmp_ratio;
  o.ori_mask_mode = a.ori_mask_mode;
  o.cmp_mask_mode = a.cmp_mask_mode;
  o.ori_win_left = a.ori_win_left;
  o.ori_win_right = a.ori_win_right;
  o.layout_q = a.layout_q;
  o.return_softmax_lse = a.return_softmax_lse;
  const bool compressed = a.cmp_kv.has_value() && a.cmp_kv->defined() && a.cmp_ratio > 1;
  if (compressed) {
    const FlashMlaCmpLengthTensors& c = need_cmp(cmp, a.cmp_ratio, who);
    o.seqused_cmp_kv = c.seqused_cmp_kv;
    o.cmp_residual_kv = c.cmp_residual_kv;
  }
  return o;
}

SparseFlashMlaMetadataArgs to_sparse_flash_mla_metadata_args(const SparseAttnSharedKvMetadataArgs& a,
                                                             const std::optional<FlashMlaCmpLengthTensors>& cmp) {
  const char* who = "to_sparse_flash_mla_metadata_args";
  SparseFlashMlaMetadataArgs o;
  o.layout_kv = paged_layout(a.layout_kv, who);
  o.num_heads_q = a.num_heads_q;
  o.num_heads_kv = a.num_heads_kv;
  o.head_dim = a.head_dim;
  o.cu_seqlens_q = a.cu_seqlens_q;
  o.cu_seqlens_ori_kv = a.cu_seqlens_ori_kv;
  o.cu_seqlens_cmp_kv = a.cu_seqlens_cmp_kv;
  o.seqused_q = a.seqused_q;
  o.seqused_ori_kv = a.seqused_kv;
  o.batch_size = a.batch_size;
  o.max_seqlen_q = a.max_seqlen_q;
  o.max_seqlen_ori_kv = a.max_seqlen_kv;
  o.ori_topk = a.ori_topk;
  o.cmp_topk = a.cmp_topk;
  o.cmp_ratio = a.cmp_ratio == 0 ? 1 : a.cmp_ratio;
  o.ori_mask_mode = a.ori_mask_mode;
  o.cmp_mask_mode = a.cmp_mask_mode;
  o.ori_win_left = a.ori_win_left;
  o.ori_win_right = a.ori_win_right;
  o.layout_q = a.layout_q;
  o.has_ori_kv = a.has_ori_kv;
  o.has_cmp_kv = a.has_cmp_kv;
  if (a.has_cmp_kv && a.cmp_ratio > 1) {
    AAR_CHECK_ARG(a.max_seqlen_kv >= 0, who, ": max_seqlen_kv must be >= 0, got ", a.max_seqlen_kv);
    const FlashMlaCmpLengthTensors& c = need_cmp(cmp, a.cmp_ratio, who);
    o.seqused_cmp_kv = c.seqused_cmp_kv;
    o.cmp_residual_kv = c.cmp_residual_kv;
    o.max_seqlen_cmp_kv = a.max_seqlen_kv / a.cmp_ratio;
  }
  return o;
}

}  // namespace aar::ops
