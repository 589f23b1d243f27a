// Internal: one SFA layer's KV-offload state and its two data movements
// (docs/design/sfa.md §6; the design is in include/ascend_attn_rt/sfa/offload.h):
// the commit of a step's new rows into the host pool, and the resident decode
// path (top-k to the host, mask, the layer's ResidentLru, the misses' copies,
// sparse attention over the resident buffers).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "ascend_attn_rt/build_stamp.h"
#include "ascend_attn_rt/graph/captured_call.h"
#include "ascend_attn_rt/ops/sparse_flash_attention.h"
#include "ascend_attn_rt/sfa/plan/resident_lru.h"
#include "ascend_attn_rt/sfa/host_pool.h"
#include "ascend_attn_rt/sfa/metadata.h"
#include "ascend_attn_rt/sfa/offload.h"

namespace aar::detail {
class ExclusiveUse;  // cpp/common/exclusive_use.h
}

namespace aar::graph {
class GraphParams;
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
  // The last resident step's decision (docs/design/sfa.md §6.8): the masked top-k it read is `masked`,
  // its slots `slots_host`, its copies `misses`; the layer whose LRU made it, that LRU's versions
  // before and after, and its other inputs (K is the workspace's). A later layer whose inputs are
  // equal repeats it.
  struct Decision {
    bool valid = false;
    uint64_t layer = 0;  // OffloadLayer::id()
    int64_t pool_layer = -1;
    std::weak_ptr<const plan::ResidentLru> lru;
    uint64_t before = 0, after = 0;
    int64_t rows = 0;
    std::vector<uint64_t> req_ids;
    std::vector<int32_t> stable_prefix;
    plan::ResidentStepStats stats;
  } decision;
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

// The host inputs of one update that the offloaded layers' host callbacks read (docs/design/sfa.md §6.7):
// copies of the builder's lists, owned by the bucket, so that the builder may build the next step
// while this one's callbacks are still to run.
struct OffloadStepSnapshot {
  uint64_t seq = 0;   // the update's place in the ring (replays read the snapshots in this order)
  uint64_t pass = 0;  // the update pass that wrote it
  int64_t num_decode_tokens = 0, num_actual_tokens = 0;
  std::vector<uint64_t> decode_req_ids;
  std::vector<int32_t> decode_seq_lens, decode_stable_prefix;
  std::vector<int32_t> token_to_req;  // of the decode rows
  std::vector<int32_t> block_table;   // the decode rows' requests x the blocks their lengths reach
  at::Tensor slot_mapping;            // host int64 (bucket tokens); the first num_actual_tokens are the step's
  OffloadMetadata view;               // the lists above as the callback reads them
  // The offloaded layers of the bucket whose callback has not read it yet (0: the slot is free).
  std::atomic<int32_t> readers_left{0};
};

// A bucket's ring of snapshots (docs/design/sfa.md §6.7): every update takes one (once per update pass,
// whatever the number of offloaded layers), the host callbacks of the replays read them in update order
// (all layers of a replay the same one), the last layer's callback frees it. An update that would
// overwrite a snapshot a pending replay still reads is refused by its check.
//
// Thread safety: take / check_free on the updating thread (one at a time per store), acquire / release
// on the thread that runs the callbacks (a device runtime's callback thread; one replay at a time).
class OffloadStepRing {
 public:
  static constexpr int kSlots = 3;
  explicit OffloadStepRing(int64_t bucket_tokens);
  // At capture: one more offloaded layer whose callback reads each snapshot.
  void add_reader() { ++readers_; }
  int32_t readers() const { return readers_; }
  // The update's check: throws InvalidArgument naming the bucket when every slot is still pending.
  void check_free(int64_t bucket, const graph::UpdatePass& pass) const;
  // The update's refresh: copies the step's host lists (a no-op for the pass's later layers).
  void take(const Metadata& md, const graph::UpdatePass& pass);
  // A callback: the snapshot its replay reads (throws when no update is left for it); release() after.
  const OffloadStepSnapshot& acquire(int64_t bucket) const;
  void release();
  uint64_t published() const { return published_.load(std::memory_order_acquire); }
  // Updates taken whose callbacks have not all run.
  int64_t pending() const;

 private:
  bool supersedes(const graph::UpdatePass& pass) const;
  std::array<OffloadStepSnapshot, kSlots> slots_;
  std::atomic<uint64_t> published_{0};  // snapshots published: the next one's seq
  std::atomic<uint64_t> read_{0};       // the seq the next replay's callbacks read
  uint64_t last_pass_ = 0;              // the pass of the newest snapshot (seq published_ - 1)
  int32_t readers_ = 0;
};

// One captured bucket of an offloaded layer (docs/design/sfa.md §6.6): what the
// recorded calls share. Made at capture; every tensor the host callback reads or
// writes is allocated here, at an address stable for the bucket's life.
struct OffloadGraphStep {
  int64_t rows = 0;             // the bucket's kernel tokens: resident rows [0, rows), dummies get slot -1
  int64_t K = 0;
  int64_t num_kernel_reqs = 0;  // the captured step's (graph padding included)
  int32_t draft_index = -1;
  const void* block_table = nullptr;  // the captured metadata's buffers (an update must bring the same lane's)
  const void* slot_mapping = nullptr;
  // Device -> host staging the recorded kernels fill before the callback: the step's new latent and rope
  // rows and the top-k. On the CPU the host tensors are the device ones; on a device they are page-locked
  // twins the captured copies write.
  at::Tensor k_stage, v_stage, topk_stage;                   // (rows, L), (rows, R), (rows, K) int32
  at::Tensor k_stage_host, v_stage_host, topk_stage_host;
  std::shared_ptr<OffloadWorkspace> ws;
  // The queries between the first recorded call and the last (the latent core's workspace views).
  at::Tensor qn, qr;
  // The step's host inputs, per update (docs/design/sfa.md §6.7): shared by the bucket's offloaded layers.
  std::shared_ptr<OffloadStepRing> ring;
  // The last update's build (a CPU replay's device work reads the builder's buffers: it must be current).
  bool has_step = false;
  BuildStamp stamp;
};

class OffloadLayer {
 public:
  // layer_index: the layer's ImplConfig::layer_index (pool_layer's default).
  // dims: kv_lora_rank L and qk_rope_head_dim R; device: the layer's.
  // repeats_decisions: the layer reads its top-k from the TopkBuffer (no indexer of its own): a resident
  // step on the selection the previous offloaded layer decided on repeats that decision (docs/design/sfa.md §6.8).
  OffloadLayer(const OffloadConfig& cfg, int64_t layer_index, int64_t L, int64_t R, c10::Device device,
               bool repeats_decisions);

  const OffloadConfig& config() const { return cfg_; }
  int64_t resident_rows() const { return rows_; }
  int64_t pool_layer() const { return pool_layer_; }
  const HostKvPool& pool() const { return *cfg_.pool; }
  const at::Tensor& buffer_k() const { return buf_k_; }  // (rows, capacity, 1, L)
  const at::Tensor& buffer_v() const { return buf_v_; }  // (rows, capacity, 1, R)
  const plan::ResidentLru& lru() const { return *lru_; }
  // Process-unique (a decision names the layer that made it).
  uint64_t id() const { return id_; }
  // The token slot `slot` of resident row `row` holds (-1: empty): the layer's LRU, or the LRU whose
  // decisions it repeats (-1 everywhere when it is out of step with it: its next step copies all back).
  int32_t resident_token(int32_t row, int32_t slot) const;
  // Forgets every resident row (the layer's LRU, and the LRU it repeated).
  void reset_resident();
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

  // Graph capture (docs/design/sfa.md §6.6). capture_state: checks the captured step (decode-only, its
  // kernel tokens fit the resident rows) and makes the bucket's state. stage: the recorded device work
  // before the callback (k (rows, L), v (rows, R), topk (>= rows, 1, K) into the staging).
  // check_step / take_step: an update's checks and refresh. host_step: the callback (commit, mask, LRU,
  // misses' copies, the slots). attend_resident: the recorded attention after it.
  // The bucket's snapshot ring (docs/design/sfa.md §6.7) is g's host state of the bucket being captured.
  std::shared_ptr<OffloadGraphStep> capture_state(graph::GraphParams& g, const Metadata& md, int64_t rows, int64_t K);
  void stage(OffloadGraphStep& gs, const at::Tensor& k, const at::Tensor& v, const at::Tensor& topk) const;
  void check_step(const OffloadGraphStep& gs, const Metadata& md, int64_t bucket, const graph::UpdatePass& pass) const;
  static void take_step(OffloadGraphStep& gs, const Metadata& md, const graph::UpdatePass& pass);
  void host_step(OffloadGraphStep& gs);
  at::Tensor attend_resident(OffloadGraphStep& gs, double scale);

 private:
  // pool[slots[i]] = rows[i], i < n (k, v host or device rows; slots host int64).
  void commit_rows(const at::Tensor& k, const at::Tensor& v, const at::Tensor& slots, int64_t n);
  // Steps 2-3 of docs/design/sfa.md §6.3 and the misses' copies for the first `rows` rows of the host
  // top-k `tp` (rows x K): the slots into w.slots_host, the stats. Resets the LRU if a copy fails.
  void resident_step(OffloadWorkspace& w, const int32_t* tp, int64_t rows, int64_t K, const OffloadMetadata& o,
                     int64_t block_size);
  // Copies the n entries of `m` host -> device through the hooks (index tensors: host int64, >= n).
  void onload(const OffloadMetadata& o, int64_t block_size, const plan::ResidentMiss* m, int64_t n,
              const at::Tensor& src_index, const at::Tensor& dst_index);
  // docs/design/sfa.md §6.8: repeats w.decision (made by another layer's LRU on equal inputs) on this
  // layer's buffers; false (nothing done) when it cannot (that LRU is gone or has changed since).
  bool repeat_decision(OffloadWorkspace& w, int64_t rows, const OffloadMetadata& o, int64_t block_size);
  // The resident step's statistics: the LRU's (st), the copies made, who decided, a resync.
  void set_step_stats(int64_t rows, const plan::ResidentStepStats& st, int64_t copies, int64_t decided_by,
                      bool resynced);

  OffloadConfig cfg_;
  std::shared_ptr<OffloadCopyHooks> hooks_;
  int64_t pool_layer_ = 0, rows_ = 0, L_ = 0, R_ = 0;
  c10::Device device_;
  at::Tensor buf_k_, buf_v_;            // resident buffers
  at::Tensor pages_k_, pages_v_;        // as (rows * ppr, bs, 1, D)
  at::Tensor rows_k_, rows_v_;          // as (rows * capacity, D)
  uint64_t id_ = 0;
  std::shared_ptr<plan::ResidentLru> lru_;
  // The LRU whose decisions the buffers follow instead of lru_'s (layer 0: none) and the version of it
  // they hold; lru_ is then stale (reset before its next step).
  struct Mirror {
    uint64_t layer = 0, version = 0;
    std::weak_ptr<const plan::ResidentLru> lru;
  } mirror_;
  bool own_stale_ = false;
  bool repeats_ = false;
  std::vector<plan::ResidentMiss> resync_;   // a resync's copies
  at::Tensor resync_src_, resync_dst_;        // and their indices (host int64, grown on demand)
  std::shared_ptr<OffloadWorkspace> ws_;  // made at the first step (K known then)
  ops::SparseFlashAttentionArgs args_;
  OffloadStepStats stats_;
};

}  // namespace aar::sfa::detail
