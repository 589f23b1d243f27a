// CANN's SparseFlashMla (cann_ops_transformer::sparse_flash_mla and its tiling-metadata
// operator), the attention of the DeepSeek-V4 A5 + bf16-cache plan: the shared-KV
// semantics of sparse_attn_sharedkv.h with layout PA_BBND and seqused_ori_kv /
// seqused_cmp_kv / cmp_residual_kv, plus the adapter from the sharedkv arguments.
// Design: docs/design/dsa.md §1.4, §4.2.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/string_view.h>

#include <cstdint>
#include <optional>
#include <tuple>

#include "ascend_attn_rt/ops/provider.h"
#include "ascend_attn_rt/ops/sparse_attn_sharedkv.h"

namespace aar::ops {

struct SparseFlashMlaArgs {
  at::Tensor q;                                  // (T, N1, D) "TND" or (B, S, N1, D) "BSND"
  std::optional<at::Tensor> ori_kv, cmp_kv;      // (block_num, block_size, 1, D) "PA_BBND"
  std::optional<at::Tensor> ori_sparse_indices;  // (T, 1, K) int32 physical slots, -1 = none
  std::optional<at::Tensor> cmp_sparse_indices;  // (T, 1, K) int32 compressed-row ids (C4), -1 = none
  std::optional<at::Tensor> ori_block_table, cmp_block_table;  // (B, cols) int32
  std::optional<at::Tensor> cu_seqlens_q;        // (B + 1) int32, "TND"
  std::optional<at::Tensor> cu_seqlens_ori_kv, cu_seqlens_cmp_kv;  // layout_kv "TND" only; unread under PA_BBND
  std::optional<at::Tensor> seqused_q;           // NotSupported by the CPU twin
  std::optional<at::Tensor> seqused_ori_kv;      // (B) int32 raw lengths S_b (required with PA_BBND)
  std::optional<at::Tensor> seqused_cmp_kv;      // (B) int32 S_b / cmp_ratio
  std::optional<at::Tensor> cmp_residual_kv;     // (B) int32 S_b % cmp_ratio (required with cmp_kv, cmp_ratio > 1)
  std::optional<at::Tensor> ori_topk_length, cmp_topk_length;  // reserved: must stay unset
  std::optional<at::Tensor> sinks;               // (N1) fp32
  std::optional<at::Tensor> metadata;            // (1024) int32 from sparse_flash_mla_metadata
  double softmax_scale = 0.0;                    // must be set (> 0); DSV4: 512^-0.5
  int64_t cmp_ratio = 1;                         // 1 without cmp_kv; >= 2 with it
  int64_t ori_mask_mode = 4, cmp_mask_mode = 3;
  int64_t ori_win_left = 127, ori_win_right = 0;
  c10::string_view layout_q = "TND", layout_kv = "PA_BBND";
  int64_t topk_value_mode = 1;
  bool return_softmax_lse = false;
};

std::tuple<at::Tensor, at::Tensor> sparse_flash_mla(const SparseFlashMlaArgs& a, Provider pv = Provider::Auto);

// Every scalar is optional in the schema; unset values take the NPU wrapper's
// defaults (0 for sizes and top-k, cmp_ratio 1, mask modes 0, windows -1,
// layouts "BSND", has_* true), which the CPU twin then validates like any value.
struct SparseFlashMlaMetadataArgs {
  int64_t num_heads_q = 0, num_heads_kv = 1, head_dim = 512;
  std::optional<at::Tensor> cu_seqlens_q, cu_seqlens_ori_kv, cu_seqlens_cmp_kv, seqused_q, seqused_ori_kv,
      seqused_cmp_kv, cmp_residual_kv, ori_topk_length, cmp_topk_length;
  std::optional<int64_t> batch_size, max_seqlen_q, max_seqlen_ori_kv, max_seqlen_cmp_kv, ori_topk, cmp_topk,
      cmp_ratio, ori_mask_mode, cmp_mask_mode, ori_win_left, ori_win_right;
  std::optional<c10::string_view> layout_q, layout_kv;
  std::optional<bool> has_ori_kv, has_cmp_kv;
};

// The (1024,) int32 tiling blob sparse_flash_mla reads. Provider: the first
// length tensor given (cu_seqlens_q, seqused_ori_kv, seqused_cmp_kv,
// cmp_residual_kv, cu_seqlens_ori_kv, cu_seqlens_cmp_kv, seqused_q), else `pv`
// or the process-wide override. The CPU twin's blob is deterministic but opaque.
at::Tensor sparse_flash_mla_metadata(const SparseFlashMlaMetadataArgs& a, Provider pv = Provider::Auto);

// ---- the SparseFlashMla adapter (docs/design/dsa.md §4.2)

// The derived compressed lengths of a compressed layer, on seqused_kv's device
// (int32, no host sync): (seqused_kv / cmp_ratio, seqused_kv % cmp_ratio).
// seqused_kv must be a 1-D int32 tensor; cmp_ratio >= 2. Lengths are
// non-negative by contract (the builder's seq_lens), so floor and truncation
// agree. The host twin is dsa::flash_mla_cmp_lengths (dsa/plan/dsa_kv_plan.h), which the
// builder uses when it stages lengths itself.
struct FlashMlaCmpLengthTensors {
  at::Tensor seqused_cmp_kv, cmp_residual_kv;
};
FlashMlaCmpLengthTensors flash_mla_cmp_length_tensors(const at::Tensor& seqused_kv, int64_t cmp_ratio);

// The attention call: every sharedkv argument carried over, except
//   seqused_kv        -> seqused_ori_kv (renamed)
//   cmp_ratio 0       -> 1 (SparseFlashMla's SWA value; 0 is illegal there)
//   layout_kv         -> "PA_BBND" ("PA_ND" or "PA_BBND" accepted: the same
//                        paged bytes; anything else is InvalidArgument)
// and, when cmp_kv is given and cmp_ratio > 1, seqused_cmp_kv / cmp_residual_kv
// from `cmp` (required then: InvalidArgument naming them if undefined; ignored
// otherwise).
SparseFlashMlaArgs to_sparse_flash_mla_args(const SparseAttnSharedKvArgs& a,
                                            const std::optional<FlashMlaCmpLengthTensors>& cmp = std::nullopt);

// The metadata call: seqused_kv -> seqused_ori_kv, max_seqlen_kv ->
// max_seqlen_ori_kv, layout_kv -> "PA_BBND" as above; `device` dropped; with
// has_cmp_kv and cmp_ratio > 1 also seqused_cmp_kv / cmp_residual_kv from
// `cmp` (required then) and max_seqlen_cmp_kv = max_seqlen_kv / cmp_ratio.
// Every other value is passed explicitly (none left to the wrapper's defaults).
SparseFlashMlaMetadataArgs to_sparse_flash_mla_metadata_args(
    const SparseAttnSharedKvMetadataArgs& a, const std::optional<FlashMlaCmpLengthTensors>& cmp = std::nullopt);

}  // namespace aar::ops
