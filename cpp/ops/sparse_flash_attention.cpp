// Typed wrappers for sparse flash attention (issue 10), plain and KV-quant, from torch_npu
// (namespace `npu`) or from vllm-ascend (`_C_ascend`), whose schemas differ. Arguments a library's
// schema does not have are rejected here by name when set; everything else is the provider's to
// validate.
#include "ascend_attn_rt/ops/sparse_flash_attention.h"

#include "library_select.h"
#include "op_handle.h"
#include "op_signatures.h"

namespace aar::ops {

namespace {

detail::OpHandle<sig::SparseFlashAttentionNpu> g_sfa_npu("npu_sparse_flash_attention", "", OpLibrary::TorchNpu);
detail::OpHandle<sig::SparseFlashAttentionVa> g_sfa_va("npu_sparse_flash_attention", "", OpLibrary::VllmAscend);
detail::OpHandle<sig::KvQuantSparseFlashAttentionNpu> g_kvq_npu("npu_kv_quant_sparse_flash_attention", "",
                                                                OpLibrary::TorchNpu);
detail::OpHandle<sig::KvQuantSparseFlashAttentionVa> g_kvq_va("npu_kv_quant_sparse_flash_attention", "",
                                                              OpLibrary::VllmAscend);

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor> sparse_flash_attention(const SparseFlashAttentionArgs& a, OpLibrary lib,
                                                                      Provider pv) {
  constexpr const char* kWhat = "sparse_flash_attention";
  const bool va = detail::is_vllm_ascend(kWhat, lib);
  const Provider p = detail::pick_provider(pv, a.query);
  if (va) {
    detail::reject_for_va(kWhat, a.sinks.has_value(), "sinks", "npu_sparse_flash_attention");
    const auto& op = g_sfa_va.get(p);
    detail::DispatchGuard guard(p);
    return op.call(a.query, a.key, a.value.has_value() ? *a.value : a.key, a.sparse_indices, a.scale_value,
                   a.block_table, a.actual_seq_lengths_query, a.actual_seq_lengths_kv, a.query_rope, a.key_rope,
                   a.sparse_block_size, a.layout_query, a.layout_kv, a.sparse_mode, a.pre_tokens, a.next_tokens,
                   a.attention_mode, a.return_softmax_lse);
  }
  const auto& op = g_sfa_npu.get(p);
  detail::DispatchGuard guard(p);
  return op.call(a.query, a.key, a.value, a.sparse_indices, a.scale_value, a.block_table,
                 a.actual_seq_lengths_query, a.actual_seq_lengths_kv, a.query_rope, a.key_rope, a.sparse_block_size,
                 a.layout_query, a.layout_kv, a.sparse_mode, a.pre_tokens, a.next_tokens, a.attention_mode,
                 a.return_softmax_lse, a.sinks);
}

#define AAR_KVQ_CALL_ARGS(a)                                                                                 \
  a.query, a.key, a.value, a.sparse_indices, a.scale_value, a.key_quant_mode, a.value_quant_mode,           \
      a.key_dequant_scale, a.value_dequant_scale, a.block_table, a.actual_seq_lengths_query,                \
      a.actual_seq_lengths_kv, a.sparse_block_size, a.layout_query, a.layout_kv, a.sparse_mode, a.pre_tokens, \
      a.next_tokens, a.attention_mode, a.quant_scale_repo_mode, a.tile_size, a.rope_head_dim

std::tuple<at::Tensor, at::Tensor, at::Tensor> kv_quant_sparse_flash_attention(
    const KvQuantSparseFlashAttentionArgs& a, OpLibrary lib, Provider pv) {
  constexpr const char* kWhat = "kv_quant_sparse_flash_attention";
  const bool va = detail::is_vllm_ascend(kWhat, lib);
  const Provider p = detail::pick_provider(pv, a.query);
  if (va) {
    detail::reject_for_va(kWhat, a.key_dtype.has_value(), "key_dtype", "npu_kv_quant_sparse_flash_attention");
    detail::reject_for_va(kWhat, a.value_dtype.has_value(), "value_dtype", "npu_kv_quant_sparse_flash_attention");
    const auto& op = g_kvq_va.get(p);
    detail::DispatchGuard guard(p);
    return op.call(AAR_KVQ_CALL_ARGS(a), a.return_softmax_lse);
  }
  if (a.return_softmax_lse) {
    throw_not_supported(kWhat, ": return_softmax_lse=true with OpLibrary::TorchNpu: torch_npu's ",
                        "npu_kv_quant_sparse_flash_attention returns the attention output only (use ",
                        "OpLibrary::VllmAscend for softmax_max / softmax_sum)");
  }
  const auto& op = g_kvq_npu.get(p);
  detail::DispatchGuard guard(p);
  return {op.call(AAR_KVQ_CALL_ARGS(a), a.key_dtype, a.value_dtype), at::Tensor(), at::Tensor()};
}

#undef AAR_KVQ_CALL_ARGS

}  // namespace aar::ops
