// The SFA layer's two operator steps for engines that compute their own projections (vLLM's
// sparse MLA layer and its indexer op, docs/design/sfa.md §4.5, docs/design/vllm_sparse.md §2): the
// indexer step (key write, lightning indexer, top-k rows) and the sparse attention over the top-k
// rows, on the sfa::Metadata of the runtime's builder. The operators are the ones sfa::Impl calls
// (through the same shared calls), picked by the provider (npu / CPU twin / no-compute).
// Every argument is checked (shapes, dtypes, devices, the metadata against the caches) before
// anything is written. Inside a graph capture each run takes a DecodeOnly / SpecDecoding batch of
// the bucket's kernel tokens and is recorded as one prepare call (docs/design/sfa.md §4.5).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <optional>

#include "ascend_attn_rt/detail/tensor_binding.h"
#include "ascend_attn_rt/ops/lightning_indexer.h"
#include "ascend_attn_rt/ops/sparse_flash_attention.h"
#include "ascend_attn_rt/plan/workspace.h"
#include "ascend_attn_rt/sfa/metadata.h"
#include "ascend_attn_rt/sparse/topk_buffer.h"

namespace aar::cp {
class Comm;
class DcpWorkspace;
}  // namespace aar::cp

namespace aar::sfa {

struct IndexerStepConfig {
  int64_t topk = 2048;         // index_topk K (sparse_count)
  bool glm_moe_dsa = false;    // with device_kind: the indexer's library (docs/design/sfa.md §4.3)
  plan::DeviceKind device_kind = plan::DeviceKind::A2;
};

// One per indexer layer (it keeps the operator's arguments between steps, so a steady-state call
// assigns nothing new). Thread safety: one thread at a time.
class IndexerStep {
 public:
  explicit IndexerStep(const IndexerStepConfig& cfg);
  const IndexerStepConfig& config() const { return cfg_; }

  // Over the metadata's tk kernel tokens (its last cumulative query end), rows past tk ignored:
  //   k        (T, D) indexer key rows (RoPE applied) in the cache's dtype, T >= tk;
  //   q        (T, n_head, D) in the cache's dtype or float8_e4m3fn (converted exactly);
  //   weights  (T, n_head) float16 / bfloat16 / float32, rounded to the cache's dtype;
  //   index_cache  (num_blocks, block_size, D) or (num_blocks, block_size, 1, D), contiguous,
  //            float16 / bfloat16 / float32 (unquantised: LI C8 is refused by dtype);
  //   topk_out (rows >= T, cols >= topk) int32: the engine's buffer.
  // Writes k[:tk] at the metadata's slots, runs the lightning indexer (sparse_count topk, mode 3,
  // the metadata's lengths and block table) and writes its rows into topk_out[:tk, :topk]
  // (request-local positions by descending score, then -1); topk_out[:tk, topk:] and
  // topk_out[tk:T] get -1. Returns topk_out[:tk, :topk] as (tk, 1, topk).
  // DCP metadata (docs/design/sparse_cp.md §2, §5): the indexer cache is replicated on every rank
  // (num_blocks * dcp_world_size blocks); k[:tk] is written at the replicated slots and the indexer
  // reads the replicated block table with the global lengths, so topk_out holds the single-rank rows
  // (request-local global positions). No collective. PCP / DSA-CP metadata is refused by name.
  at::Tensor run(const at::Tensor& k, const at::Tensor& q, const at::Tensor& weights, const at::Tensor& index_cache,
                 const Metadata& md, const at::Tensor& topk_out);
  // The same into the model's TopkBuffer (index_topk == topk, max_num_tokens >= T).
  at::Tensor run(const at::Tensor& k, const at::Tensor& q, const at::Tensor& weights, const at::Tensor& index_cache,
                 const Metadata& md, TopkBuffer& topk_out);

 private:
  IndexerStepConfig cfg_;
  // Held weakly by the graph buckets that recorded calls reaching this object (graph::note_layer_life):
  // update / replay of such a bucket refuse it by name once the object is gone.
  std::shared_ptr<const int> life_ = std::make_shared<const int>(0);
  ops::LightningIndexerArgs args_;
  ::aar::detail::TensorBinding cache_src_, slots_src_;
  at::Tensor cache4_, rows_, slots2_;
};

struct SparseAttentionConfig {
  double scale = 0.0;             // the softmax scale (> 0, finite; the model's, e.g. DeepSeek-V3.2's YaRN-scaled one)
  cp::Comm* dcp_comm = nullptr;   // the DCP group, for metadata built with dcp_world_size > 1 (not owned)
  int64_t workspace_group = 0;    // the shared DCP workspace's group (layers of one group run in turn)
};

// One per sparse MLA layer (it keeps the operator's arguments between steps). Thread safety: one
// thread at a time.
class SparseAttention {
 public:
  explicit SparseAttention(double scale);
  explicit SparseAttention(const SparseAttentionConfig& cfg);
  ~SparseAttention();
  double scale() const { return cfg_.scale; }
  const SparseAttentionConfig& config() const { return cfg_; }

  // Over the metadata's tk kernel tokens:
  //   ql_nope  (T, N, L) absorbed query, q_pe (T, N, R), T >= tk, any strides, in the caches' dtype;
  //   topk     (>= tk, K) or (>= tk, 1, K) int32: per token request-local positions, -1 ends a row;
  //   nope_cache (num_blocks, block_size, 1, L), rope_cache (.., R): contiguous (the two views of
  //            vLLM's cache mla::LatentAttention::split_kv_cache gives), float16 / bfloat16 / float32.
  // Sparse flash attention (docs/design/sfa.md §4.1's fixed arguments). Returns out (T, N, L): the
  // given `out` (contiguous, the query's dtype) or a new tensor; rows past tk are zero.
  // DCP metadata (docs/design/sparse_cp.md §5; the layer's dcp_comm must be the metadata's group and
  // rank): topk holds global positions (IndexerStep's rows); [ql_nope | q_pe] is gathered along the
  // heads over the group, the rows remapped to this rank's local positions, the W * N heads attend
  // the rank's shard (local blocks and lengths) with their LSE, and the partials are exchanged and
  // merged into this rank's N heads (two collectives, every rank in the same order; none when tk = 0,
  // which every rank of the step sees alike). Inside a capture one recorded call whose replay issues
  // them. kv_lora_rank must be a multiple of 8 in [8, 512] (the merge operator). PCP / DSA-CP metadata
  // is refused by name.
  at::Tensor run(const at::Tensor& ql_nope, const at::Tensor& q_pe, const at::Tensor& topk,
                 const at::Tensor& nope_cache, const at::Tensor& rope_cache, const Metadata& md,
                 const std::optional<at::Tensor>& out = std::nullopt);

 private:
  at::Tensor run_dcp(const at::Tensor& qn, const at::Tensor& qr, const at::Tensor& topk, const at::Tensor& nope,
                     const at::Tensor& rope, const Metadata& md, const at::Tensor& res, int64_t tk);
  SparseAttentionConfig cfg_;
  // Held weakly by the graph buckets that recorded calls reaching this object (graph::note_layer_life):
  // update / replay of such a bucket refuse it by name once the object is gone.
  std::shared_ptr<const int> life_ = std::make_shared<const int>(0);
  ops::SparseFlashAttentionArgs args_, dcp_args_;
  std::shared_ptr<cp::DcpWorkspace> dcp_ws_;
};

}  // namespace aar::sfa
