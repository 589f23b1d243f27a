// Internal: the SFA layer's sparse flash attention call (docs/design/sparse.md §5,
// docs/design/sfa.md §4.1, unquantised latent caches), shared by the device-cache path
// (sfa::Impl) and the KV-offload paths (the prefill part on the device cache,
// the resident decode path on the resident buffers, cpp/sfa/offload_layer.h), and the DCP shard's
// call with its LSE (sfa::SparseAttention under DCP, docs/design/sparse_cp.md §5).
#pragma once

#include <ATen/ATen.h>

#include <optional>

#include "ascend_attn_rt/ops/dense.h"
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
inline void sparse_attention_args(ops::SparseFlashAttentionArgs& a, const SparseAttentionInputs& in) {
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
  a.return_softmax_lse = false;
}

inline at::Tensor sparse_attention(ops::SparseFlashAttentionArgs& a, const SparseAttentionInputs& in) {
  sparse_attention_args(a, in);
  return std::get<0>(ops::sparse_flash_attention(a, ops::OpLibrary::VllmAscend));
}

// The DCP shard's call (docs/design/sparse_cp.md §3, §5): the same operator over this rank's shard
// with its LSE. `topk` holds local indices (remapped, valid entries first), `seq_lens` the local
// KV lengths and `block_table` the local blocks; sparse_mode 0, since the indexer already applied
// causality in global positions. Returns the (T, H, L) partial; lse_out (T, H, 1) fp32 receives
// max + log(sum) (-inf for an empty selection).
inline at::Tensor sparse_attention_lse(ops::SparseFlashAttentionArgs& a, const SparseAttentionInputs& in,
                                       const at::Tensor& lse_out) {
  sparse_attention_args(a, in);
  a.sparse_mode = 0;
  a.return_softmax_lse = true;
  const auto [o, mx, sm] = ops::sparse_flash_attention(a, ops::OpLibrary::VllmAscend);
  const int64_t T = in.qn.size(0);
  at::Tensor lse = lse_out;
  if (!ops::dense::no_compute()) at::add_out(lse, mx.view({T, -1, 1}), sm.view({T, -1, 1}).log());
  return o;
}

}  // namespace aar::sfa::detail
