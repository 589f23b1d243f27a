// Sparse flash attention over top-k selected tokens, MLA-absorbed latent layout
// (docs/design/sparse.md §5, docs/design/sfa.md §5, docs/design/ops.md §4.6): npu_sparse_flash_attention and
// npu_kv_quant_sparse_flash_attention, from torch_npu (OpLibrary::TorchNpu) or
// from vllm-ascend's _C_ascend (OpLibrary::VllmAscend); the schemas differ.
//
// For query token t (request b, row i), threshold Th = S_b (sparse_mode 0) or
// S_b - q_b + i + 1 (sparse_mode 3); the first min(K, ceil(Th / sparse_block_size))
// entries of sparse_indices[t, 0, :] are scanned, the scan stops at the first -1,
// entries with idx * sparse_block_size >= Th are skipped, duplicates count twice.
// logits = scale * (q_nope . k_nope + q_rope . k_rope), V = the 512-wide latent.
// An empty selection gives a 0 output row.
//
// Lengths are DEVICE tensors here (int32): actual_seq_lengths_query are
// cumulative query ends, actual_seq_lengths_kv per-request KV lengths.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/string_view.h>

#include <cstdint>
#include <limits>
#include <optional>
#include <tuple>

#include "ascend_attn_rt/ops/provider.h"

namespace aar::ops {

struct SparseFlashAttentionArgs {
  at::Tensor query;                 // (T, N, 512) ql_nope
  at::Tensor key;                   // (nb, bs, 1, 512) latent cache
  std::optional<at::Tensor> value;  // = key when unset
  at::Tensor sparse_indices;        // (T, 1, K) int32
  double scale_value = 1.0;
  std::optional<at::Tensor> block_table, actual_seq_lengths_query, actual_seq_lengths_kv, query_rope, key_rope;
  int64_t sparse_block_size = 1;
  c10::string_view layout_query = "TND", layout_kv = "PA_BSND";
  int64_t sparse_mode = 3;
  int64_t pre_tokens = std::numeric_limits<int64_t>::max(), next_tokens = std::numeric_limits<int64_t>::max();
  int64_t attention_mode = 2;
  bool return_softmax_lse = false;
  std::optional<at::Tensor> sinks;  // torch_npu only (NotSupported for VllmAscend when set)
};

// Returns (attention_out (T, N, 512) in the query dtype, softmax_max (1, T, N)
// fp32, softmax_sum (1, T, N) fp32); the last two are empty tensors when
// return_softmax_lse is false. lse = softmax_max + log(softmax_sum); a row with
// an empty selection has softmax_max -inf and softmax_sum 0 (lse -inf).
std::tuple<at::Tensor, at::Tensor, at::Tensor> sparse_flash_attention(const SparseFlashAttentionArgs& a, OpLibrary lib,
                                                                      Provider pv = Provider::Auto);

struct KvQuantSparseFlashAttentionArgs {
  at::Tensor query;       // (T, N, 576) = [ql_nope | q_pe], fp16/bf16
  at::Tensor key, value;  // packed (nb, bs, 1, 656) int8 rows (sfa_c8_rows.h); usually the same tensor
  at::Tensor sparse_indices;
  double scale_value = 1.0;
  int64_t key_quant_mode = 2, value_quant_mode = 2;
  std::optional<at::Tensor> key_dequant_scale, value_dequant_scale, block_table, actual_seq_lengths_query,
      actual_seq_lengths_kv;
  int64_t sparse_block_size = 1;
  c10::string_view layout_query = "TND", layout_kv = "PA_BSND";
  int64_t sparse_mode = 3;
  int64_t pre_tokens = std::numeric_limits<int64_t>::max(), next_tokens = std::numeric_limits<int64_t>::max();
  int64_t attention_mode = 2;
  int64_t quant_scale_repo_mode = 1, tile_size = 128, rope_head_dim = 64;
  bool return_softmax_lse = false;  // VllmAscend only: torch_npu's returns one tensor -> NotSupported when asked
  std::optional<int64_t> key_dtype, value_dtype;  // torch_npu only (NotSupported for VllmAscend when set)
};

// As sparse_flash_attention, over packed int8 rows. With OpLibrary::TorchNpu the
// operator returns the output only: softmax_max / softmax_sum are then
// undefined tensors (and return_softmax_lse raises NotSupported).
std::tuple<at::Tensor, at::Tensor, at::Tensor> kv_quant_sparse_flash_attention(
    const KvQuantSparseFlashAttentionArgs& a, OpLibrary lib, Provider pv = Provider::Auto);

}  // namespace aar::ops
