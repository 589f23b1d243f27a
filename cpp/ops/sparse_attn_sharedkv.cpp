// Typed wrappers for the DeepSeek-V4 (DSA) shared-KV sparse attention operators of vllm-ascend's
// _C_ascend (issue 12): plain and A5 kv-quant, each with its metadata operator. Validation is the
// provider's.
#include "ascend_attn_rt/ops/sparse_attn_sharedkv.h"

#include "op_handle.h"
#include "op_signatures.h"

namespace aar::ops {

namespace {

detail::OpHandle<sig::SparseAttnSharedKv> g_sas("npu_sparse_attn_sharedkv", "", OpLibrary::VllmAscend);
detail::OpHandle<sig::SparseAttnSharedKvMetadata> g_sas_md("npu_sparse_attn_sharedkv_metadata", "",
                                                           OpLibrary::VllmAscend);
detail::OpHandle<sig::KvQuantSparseAttnSharedKv> g_kvq_sas("npu_kv_quant_sparse_attn_sharedkv", "",
                                                          OpLibrary::VllmAscend);
detail::OpHandle<sig::KvQuantSparseAttnSharedKvMetadata> g_kvq_sas_md("npu_kv_quant_sparse_attn_sharedkv_metadata",
                                                                      "", OpLibrary::VllmAscend);

// The metadata operator has no required tensor: the provider comes from the
// first length tensor given, else from `pv` or the process-wide override.
Provider pick_metadata_provider(Provider pv, const SparseAttnSharedKvMetadataArgs& a) {
  if (pv != Provider::Auto) return pv;
  for (const auto* t : {&a.cu_seqlens_q, &a.seqused_kv, &a.cu_seqlens_ori_kv, &a.cu_seqlens_cmp_kv, &a.seqused_q}) {
    if (t->has_value() && (*t)->defined()) return resolve_provider(**t);
  }
  return resolve_provider(at::Tensor());  // the override, or an error naming the missing tensor
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> sparse_attn_sharedkv(const SparseAttnSharedKvArgs& a, Provider pv) {
  const Provider p = detail::pick_provider(pv, a.q);
  const auto& op = g_sas.get(p);
  detail::DispatchGuard guard(p);
  return op.call(a.q, a.ori_kv, a.cmp_kv, a.ori_sparse_indices, a.cmp_sparse_indices, a.ori_block_table,
                 a.cmp_block_table, a.cu_seqlens_q, a.cu_seqlens_ori_kv, a.cu_seqlens_cmp_kv, a.seqused_q,
                 a.seqused_kv, a.sinks, a.metadata, a.softmax_scale, a.cmp_ratio, a.ori_mask_mode, a.cmp_mask_mode,
                 a.ori_win_left, a.ori_win_right, a.layout_q, a.layout_kv, a.return_softmax_lse);
}

at::Tensor sparse_attn_sharedkv_metadata(const SparseAttnSharedKvMetadataArgs& a, Provider pv) {
  const Provider p = pick_metadata_provider(pv, a);
  const auto& op = g_sas_md.get(p);
  detail::DispatchGuard guard(p);
  return op.call(a.num_heads_q, a.num_heads_kv, a.head_dim, a.cu_seqlens_q, a.cu_seqlens_ori_kv,
                 a.cu_seqlens_cmp_kv, a.seqused_q, a.seqused_kv, a.batch_size, a.max_seqlen_q, a.max_seqlen_kv,
                 a.ori_topk, a.cmp_topk, a.cmp_ratio, a.ori_mask_mode, a.cmp_mask_mode, a.ori_win_left,
                 a.ori_win_right, a.layout_q, a.layout_kv, a.has_ori_kv, a.has_cmp_kv, a.device);
}

std::tuple<at::Tensor, at::Tensor> kv_quant_sparse_attn_sharedkv(const KvQuantSparseAttnSharedKvArgs& k,
                                                                 Provider pv) {
  const SparseAttnSharedKvArgs& a = k.base;
  const Provider p = detail::pick_provider(pv, a.q);
  const auto& op = g_kvq_sas.get(p);
  detail::DispatchGuard guard(p);
  return op.call(a.q, k.kv_quant_mode, a.ori_kv, a.cmp_kv, a.ori_sparse_indices, a.cmp_sparse_indices,
                 a.ori_block_table, a.cmp_block_table, a.cu_seqlens_q, a.cu_seqlens_ori_kv, a.cu_seqlens_cmp_kv,
                 a.seqused_q, a.seqused_kv, a.sinks, a.metadata, k.tile_size, k.rope_head_dim, a.softmax_scale,
                 a.cmp_ratio, a.ori_mask_mode, a.cmp_mask_mode, a.ori_win_left, a.ori_win_right, a.layout_q,
                 a.layout_kv, a.return_softmax_lse);
}

at::Tensor kv_quant_sparse_attn_sharedkv_metadata(const KvQuantSparseAttnSharedKvMetadataArgs& k, Provider pv) {
  const SparseAttnSharedKvMetadataArgs& a = k.base;
  const Provider p = pick_metadata_provider(pv, a);
  const auto& op = g_kvq_sas_md.get(p);
  detail::DispatchGuard guard(p);
  return op.call(a.num_heads_q, a.num_heads_kv, a.head_dim, k.kv_quant_mode, a.cu_seqlens_q, a.cu_seqlens_ori_kv,
                 a.cu_seqlens_cmp_kv, a.seqused_q, a.seqused_kv, a.batch_size, a.max_seqlen_q, a.max_seqlen_kv,
                 a.ori_topk, a.cmp_topk, k.tile_size, k.rope_head_dim, a.cmp_ratio, a.ori_mask_mode,
                 a.cmp_mask_mode, a.ori_win_left, a.ori_win_right, a.layout_q, a.layout_kv, a.has_ori_kv,
                 a.has_cmp_kv, a.device);
}

}  // namespace aar::ops
