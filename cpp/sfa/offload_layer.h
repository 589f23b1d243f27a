// Internal: one SFA layer's KV-offload state and its two data movements
// (docs/design/sfa.md §6; the design is in include/ascend_attn_rt/sfa/offload.h):
// the commit of a step's new rows into the host pool, and the resident decode
// path (top-k to the host, mask, the layer's ResidentLru, the misses' copies,
// sparse attention over the resident buffers).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "ascend_attn_rt/ops/sparse_flash_attention.h"
#include "ascend_attn_rt/sfa/plan/resident_lru.h"
#include "ascend_attn_rt/sfa/host_pool.h"
#include "ascend_attn_rt/sfa/metadata.h"
#include "ascend_attn_rt/sfa/offload.h"

namespace aar::detail {
class ExclusiveUse;  // cpp/common/exclusive_use.h
}

namespace aar::sfa::detail {

// What the offload layers of one shape share: the host scratch of a step's
// planning (rows x K entries each) and the resident path's constant device
// metadata. One step at a time (the layers run in turn on one thread).
struct OffloadShape {
  int64_t rows = 0, K = 0, capacity = 0, block_size = 0;
  c10::Device device = c10::Device(c10::kCPU);
  bool operator==(const OffloadShape& o) const {
    return rows == o.rows && K == o.K && capacity == o.capacity && block_size == o.block_size && device == o.device;
  }
};

class OffloadWorkspace {
 public:
  explicit OffloadWorkspace(const OffloadShape& shape);
  static std::shared_ptr<OffloadWorkspace> shared(const OffloadShape& shape);
  const OffloadShape& shape() const { return shape_; }
  // Enters the workspace for the current forward (graph/exclusive_scope.h).
  void use();

  at::Tensor topk_host;   // host int32 (rows * K): the device top-k's copy (not used on the CPU)
  std::vector<int32_t> masked;              // rows * K
  at::Tensor slots_host;  // host int32 (rows * K): the LRU's current slots (the device buffer itself on the CPU)
  std::vector<plan::ResidentMiss> misses;   // rows * K
  at::Tensor src_index, dst_index;          // host int64 (rows * K)
  at::Tensor slots_device;                  // (rows, 1, K) int32: the resident path's sparse indices
  // Row t's pages [t * ppr, t * ppr + ppr), one query per row, KV length capacity.
  at::Tensor block_table, cum_query_lens, seq_lens;  // (rows, ppr), (rows), (rows) int32 on the device
  // Views of the first n rows, made once per n.
  struct RowViews {
    at::Tensor slots, block_table, cum_query_lens, seq_lens;
  };
  const RowViews& rows(int64_t n);

 private:
  OffloadShape shape_;
  std::shared_ptr<::aar::detail::ExclusiveUse> exclusive_;
  std::vector<RowViews> row_views_;
};

class OffloadLayer {
 public:
  // layer_index: the layer's ImplConfig::layer_index (pool_layer's default).
  // dims: kv_lora_rank L and qk_rope_head_dim R; device: the layer's.
  OffloadLayer(const OffloadConfig& cfg, int64_t layer_index, int64_t L, int64_t R, c10::Device device);

  const OffloadConfig& config() const { return cfg_; }
  int64_t resident_rows() const { return rows_; }
  int64_t pool_layer() const { return pool_layer_; }
  const HostKvPool& pool() const { return *cfg_.pool; }
  const at::Tensor& buffer_k() const { return buf_k_; }  // (rows, capacity, 1, L)
  const at::Tensor& buffer_v() const { return buf_v_; }  // (rows, capacity, 1, R)
  const plan::ResidentLru& lru() const { return lru_; }
  plan::ResidentLru& lru() { return lru_; }
  OffloadStepStats& stats() { return stats_; }
  const OffloadStepStats& stats() const { return stats_; }

  // The forward's checks that concern the offload (before anything is
  // written): the metadata's offload part and the consumer flag, the pool's
  // geometry against the metadata, the resident rows, the top-k width K.
  void check(const Metadata& md, int64_t K) const;

  // Commits the first n = md.num_actual_tokens rows (k (n, L), v (n, R), on
  // the device) into the pool at the step's slots; the pool's owner only.
  void commit(const at::Tensor& k, const at::Tensor& v, const Metadata& md);

  // The resident decode path for the md.num_decode_tokens leading tokens:
  // qn (rows, H, L), qr (rows, H, R), topk (rows, 1, K) positions. Returns the
  // latent output (rows, H, L). If anything fails after the LRU stepped, the
  // LRU is reset (its slots would no longer describe the buffers).
  at::Tensor attend(const at::Tensor& qn, const at::Tensor& qr, const at::Tensor& topk, const Metadata& md,
                    double scale);

 private:
  void onload(const Metadata& md, int64_t rows, int64_t n);

  OffloadConfig cfg_;
  std::shared_ptr<OffloadCopyHooks> hooks_;
  int64_t pool_layer_ = 0, rows_ = 0, L_ = 0, R_ = 0;
  c10::Device device_;
  at::Tensor buf_k_, buf_v_;            // resident buffers
  at::Tensor pages_k_, pages_v_;        // as (rows * ppr, bs, 1, D)
  at::Tensor rows_k_, rows_v_;          // as (rows * capacity, D)
  plan::ResidentLru lru_;
  std::shared_ptr<OffloadWorkspace> ws_;  // made at the first step (K known then)
  ops::SparseFlashAttentionArgs args_;
  OffloadStepStats stats_;
};

}  // namespace aar::sfa::detail
