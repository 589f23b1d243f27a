// Internal: the SFA layer's sparse flash attention call (docs/design/sparse.md §5,
// docs/design/sfa.md §4.1, unquantised latent caches), shared by the device-cache path
// (sfa::Impl) and the KV-offload paths (the prefill part on the device cache,
// the resident decode path on the resident buffers, cpp/sfa/offload_layer.h).
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

#include "ascend_attn_rt/ops/sparse_flash_attention.h"

namespace aar::sfa::detail {

// Assignments that skip the reference-count traffic when the tensor is already there.
inline void set(at::Tensor& dst, const at::Tensor& src) {
  if (!dst.is_same(src)) dst = src;
}
inline void set(std::optional<at::Tensor>& dst, const at::Tensor& src) {
  if (!dst.has_value() || !dst->is_same(src)) dst = src;
}

struct SparseAttentionInputs {
  const at::Tensor& qn;              // (T, H, L) ql_nope
  const at::Tensor& qr;              // (T, H, R) q_pe
  const at::Tensor& topk;            // (T, 1, K) int32 positions (or resident slots)
  const at::Tensor& key;             // (pages, bs, 1, L): the latent pages (key and value)
  const at::Tensor& key_rope;        // (pages, bs, 1, R)
  const at::Tensor& block_table;     // (B, cols) int32
  const at::Tensor& cum_query_lens;  // (B) int32 cumulative query ends
  const at::Tensor& seq_lens;        // (B) int32 KV lengths
  double scale;
};

// npu_sparse_flash_attention (vllm-ascend's) with docs/design/sfa.md §4.1's fixed arguments:
// sparse_block_size 1, TND / PA_BSND, sparse_mode 3, attention_mode 2.
// `args` persists between calls (a steady-state call assigns nothing new).
inline at::Tensor sparse_attention(ops::SparseFlashAttentionArgs& a, const SparseAttentionInputs& in) {
  set(a.query, in.qn);
  set(a.key, in.key);
  set(a.value, in.key);  // the latent is both key (with the rope part) and value
  set(a.sparse_indices, in.topk);
  a.scale_value = in.scale;
  set(a.block_table, in.block_table);
  set(a.actual_seq_lengths_query, in.cum_query_lens);
  set(a.actual_seq_lengths_kv, in.seq_lens);
  set(a.query_rope, in.qr);
  set(a.key_rope, in.key_rope);
  a.sparse_block_size = 1;
  a.layout_query = "TND";
  a.layout_kv = "PA_BSND";
  a.sparse_mode = 3;
  a.attention_mode = 2;
  return std::get<0>(ops::sparse_flash_attention(a, ops::OpLibrary::VllmAscend));
}

}  // namespace aar::sfa::detail
