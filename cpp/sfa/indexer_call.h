// Internal: the SFA layer's unquantised lightning indexer call and indexer-key write
// (docs/design/sfa.md §4.3), shared by sfa::Impl (which computes the indexer's projections
// itself) and sfa::IndexerStep (engines that compute them, docs/design/sfa.md §4.5).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <tuple>

#include "ascend_attn_rt/ops/lightning_indexer.h"
#include "ascend_attn_rt/ops/quant.h"
#include "ascend_attn_rt/plan/workspace.h"
#include "sparse_attention.h"

namespace aar::sfa::detail {

// docs/design/sfa.md §4.3's dispatch: glm_moe_dsa and A5 take torch_npu's indexer, the rest vllm-ascend's.
inline ops::OpLibrary indexer_library(bool glm_moe_dsa, plan::DeviceKind kind) {
  return glm_moe_dsa || kind == plan::DeviceKind::A5 ? ops::OpLibrary::TorchNpu : ops::OpLibrary::VllmAscend;
}

struct IndexerInputs {
  const at::Tensor& q;               // (T, n_head, D_i) in the cache's dtype
  const at::Tensor& key;             // (pages, bs, 1, D_i): the indexer cache
  const at::Tensor& weights;         // (T, n_head) in the cache's dtype
  const at::Tensor& cum_query_lens;  // (B) int32 cumulative query ends
  const at::Tensor& seq_lens;        // (B) int32 KV lengths
  const at::Tensor& block_table;     // (B, cols) int32
  int64_t topk;                      // sparse_count
  ops::OpLibrary lib;                // indexer_library(...)
};

// The lightning indexer (TND / PA_BSND, sparse_mode 3): the top-k rows (T, 1, topk) int32,
// request-local positions by descending score, then -1. `a` persists between calls (a
// steady-state call assigns nothing new).
inline at::Tensor lightning_indexer(ops::LightningIndexerArgs& a, const IndexerInputs& in) {
  set(a.query, in.q);
  set(a.key, in.key);
  set(a.weights, in.weights);
  set(a.actual_seq_lengths_query, in.cum_query_lens);
  set(a.actual_seq_lengths_key, in.seq_lens);
  set(a.block_table, in.block_table);
  a.layout_query = "TND";
  a.layout_key = "PA_BSND";
  a.sparse_count = in.topk;
  a.sparse_mode = 3;
  return std::get<0>(ops::lightning_indexer(a, in.lib));
}

// The indexer keys k (T, D_i) written into the cache's rows (pages * bs, D_i) at slots (T, 1)
// (a negative slot is skipped: the builder's -1 past the real tokens).
inline void write_indexer_keys(at::Tensor& rows, const at::Tensor& slots, const at::Tensor& k) {
  ops::scatter_nd_update_(rows, slots, k);
}

}  // namespace aar::sfa::detail
