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
#include <optional>

#include "ascend_attn_rt/detail/tensor_binding.h"
#include "ascend_attn_rt/ops/lightning_indexer.h"
#include "ascend_attn_rt/ops/sparse_flash_attention.h"
#include "ascend_attn_rt/plan/workspace.h"
#include "ascend_attn_rt/sfa/metadata.h"
#include "ascend_attn_rt/sparse/topk_buffer.h"

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
  // Metadata of a context-parallel builder (DCP / PCP / DSA-CP) is refused by name.
  at::Tensor run(const at::Tensor& k, const at::Tensor& q, const at::Tensor& weights, const at::Tensor& index_cache,
                 const Metadata& md, const at::Tensor& topk_out);
  // The same into the model's TopkBuffer (index_topk == topk, max_num_tokens >= T).
  at::Tensor run(const at::Tensor& k, const at::Tensor& q, const at::Tensor& weights, const at::Tensor& index_cache,
                 const Metadata& md, TopkBuffer& topk_out);

 private:
  IndexerStepConfig cfg_;
  ops::LightningIndexerArgs args_;
  ::aar::detail::TensorBinding cache_src_, slots_src_;
  at::Tensor cache4_, rows_, slots2_;
};

// One per sparse MLA layer (it keeps the operator's arguments between steps). Thread safety: one
// thread at a time.
class SparseAttention {
 public:
  // scale: the softmax scale (> 0, finite; the model's, e.g. DeepSeek-V3.2's YaRN-scaled one).
  explicit SparseAttention(double scale);
  double scale() const { return scale_; }

  // Over the metadata's tk kernel tokens:
  //   ql_nope  (T, N, L) absorbed query, q_pe (T, N, R), T >= tk, any strides, in the caches' dtype;
  //   topk     (>= tk, K) or (>= tk, 1, K) int32: per token request-local positions, -1 ends a row;
  //   nope_cache (num_blocks, block_size, 1, L), rope_cache (.., R): contiguous (the two views of
  //            vLLM's cache mla::LatentAttention::split_kv_cache gives), float16 / bfloat16 / float32.
  // Sparse flash attention (docs/design/sfa.md §4.1's fixed arguments). Returns out (T, N, L): the
  // given `out` (contiguous, the query's dtype) or a new tensor; rows past tk are zero.
  // Metadata of a context-parallel builder (DCP / PCP / DSA-CP) is refused by name.
  at::Tensor run(const at::Tensor& ql_nope, const at::Tensor& q_pe, const at::Tensor& topk,
                 const at::Tensor& nope_cache, const at::Tensor& rope_cache, const Metadata& md,
                 const std::optional<at::Tensor>& out = std::nullopt);

 private:
  double scale_;
  ops::SparseFlashAttentionArgs args_;
};

}  // namespace aar::sfa
