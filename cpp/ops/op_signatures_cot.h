// Internal: the typed signatures of CANN's cann_ops_transformer operators
// (SparseFlashMla, docs/design/dsa.md §4.2), in the style of op_signatures.h.
#pragma once

#include "op_signatures.h"

namespace aar::ops::sig {

// ---- CANN cann_ops_transformer::sparse_flash_mla (+ _metadata): SparseFlashMla,
// the A5 + bf16-cache DeepSeek-V4 attention (docs/design/dsa.md §4.2).
#define AAR_SMLA_TENSOR_PARAMS                                                                          \
  sig::OptT ori_kv, sig::OptT cmp_kv, sig::OptT ori_sparse_indices, sig::OptT cmp_sparse_indices,        \
      sig::OptT ori_block_table, sig::OptT cmp_block_table, sig::OptT cu_seqlens_q,                      \
      sig::OptT cu_seqlens_ori_kv, sig::OptT cu_seqlens_cmp_kv, sig::OptT seqused_q,                     \
      sig::OptT seqused_ori_kv, sig::OptT seqused_cmp_kv, sig::OptT cmp_residual_kv,                     \
      sig::OptT ori_topk_length, sig::OptT cmp_topk_length, sig::OptT sinks, sig::OptT metadata
#define AAR_SPARSE_FLASH_MLA_PARAMS                                                                      \
  const at::Tensor &q, AAR_SMLA_TENSOR_PARAMS, double softmax_scale, int64_t cmp_ratio,                 \
      int64_t ori_mask_mode, int64_t cmp_mask_mode, int64_t ori_win_left, int64_t ori_win_right,         \
      sig::Str layout_q, sig::Str layout_kv, int64_t topk_value_mode, bool return_softmax_lse
using SparseFlashMla = SasResult(AAR_SPARSE_FLASH_MLA_PARAMS);
using OptI = std::optional<int64_t>;
using OptS = std::optional<c10::string_view>;
using OptB = std::optional<bool>;
#define AAR_SPARSE_FLASH_MLA_METADATA_PARAMS                                                                \
  int64_t num_heads_q, int64_t num_heads_kv, int64_t head_dim, sig::OptT cu_seqlens_q,                     \
      sig::OptT cu_seqlens_ori_kv, sig::OptT cu_seqlens_cmp_kv, sig::OptT seqused_q,                         \
      sig::OptT seqused_ori_kv, sig::OptT seqused_cmp_kv, sig::OptT cmp_residual_kv,                         \
      sig::OptT ori_topk_length, sig::OptT cmp_topk_length, sig::OptI batch_size, sig::OptI max_seqlen_q,  \
      sig::OptI max_seqlen_ori_kv, sig::OptI max_seqlen_cmp_kv, sig::OptI ori_topk, sig::OptI cmp_topk,    \
      sig::OptI cmp_ratio, sig::OptI ori_mask_mode, sig::OptI cmp_mask_mode, sig::OptI ori_win_left,       \
      sig::OptI ori_win_right, sig::OptS layout_q, sig::OptS layout_kv, sig::OptB has_ori_kv,              \
      sig::OptB has_cmp_kv
using SparseFlashMlaMetadata = at::Tensor(AAR_SPARSE_FLASH_MLA_METADATA_PARAMS);

}  // namespace aar::ops::sig
