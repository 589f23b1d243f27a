// The SFA KV-offload variant's layer configuration (ImplConfig::offload) and the copy
// hooks: the main cache lives in a host pool (sfa/host_pool.h); decode steps attend
// over per-layer resident buffers holding each decode row's top-k tokens, steps with
// prefills need keep_device_kv_cache (eager only); decode-only buckets can be
// graph-captured (docs/design/sfa.md §6.6).
// Routing, resident path and checks: docs/design/sfa.md §6.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>

namespace aar::sfa {

class HostKvPool;

// How the offload path moves rows between the host pool and the device. The
// default makes tensor copies; an engine may batch differently (pinned staging,
// its own streams); a test counts bytes. Called on the forward's thread; in a
// captured bucket on a device, from the host callback at replay (torch_npu's
// report thread): the copies must be complete when a call returns, and must not
// go to the captured stream (docs/design/sfa.md §6.6).
class OffloadCopyHooks {
 public:
  virtual ~OffloadCopyHooks() = default;
  // Device -> host commit of a step's new rows (the pool's owner only):
  // pool_rows[slots[i]] = rows[i], i < n. pool_rows (num_blocks * block_size,
  // D) host; slots host int64 (n), every one a valid row; rows (n, D) on the
  // layer's device. Called once for K (D = kv_lora_rank), once for V.
  virtual void commit(const at::Tensor& pool_rows, const at::Tensor& slots, const at::Tensor& rows);
  // After the layer's commit and before its onload copies, on every process.
  // With several processes sharing the pool, the readers' copies must not
  // start before the owner's commit (upstream orders them with a dummy TP
  // broadcast): an engine with TP > 1 synchronises here. Default: nothing.
  virtual void before_onload() {}
  // Host -> device onload of a step's misses: dst_rows[dst_index[i]] =
  // src_rows[src_index[i]], i < n. src_rows the pool's (num_blocks *
  // block_size, D) rows (host); src_index, dst_index host int64 (n); dst_rows
  // the resident buffer as (rows * topk_buffer_size, D) on the device. Called
  // once for K, once for V, with n > 0 only. Bytes moved: n * D * 2.
  virtual void onload(const at::Tensor& dst_rows, const at::Tensor& dst_index, const at::Tensor& src_rows,
                      const at::Tensor& src_index);
};

// The default hooks (a shared stateless instance).
std::shared_ptr<OffloadCopyHooks> default_offload_copy_hooks();

struct OffloadConfig {
  // The host pool (required) and the layer of it this layer uses (-1: the
  // layer's ImplConfig::layer_index).
  std::shared_ptr<HostKvPool> pool;
  int64_t pool_layer = -1;
  // Resident slots per decode row (docs/design/sfa.md §6; default 4096): >= the layer's top-k
  // (index_topk) and a multiple of the block size.
  int64_t topk_buffer_size = 4096;
  // Keep the main cache on the device too (upstream's colocated / debug
  // mode): steps with prefills are possible only then.
  bool keep_device_kv_cache = false;
  // A PD decode consumer (kv consumer and not producer): short extends are
  // decodes (the builder's BuilderConfig::offload must say the same). Either
  // this or keep_device_kv_cache (docs/design/sfa.md §6).
  bool is_decode_consumer = false;
  // Resident rows: min(max_num_tokens, max_num_reqs * (1 + num_speculative_tokens)),
  // the builder's values.
  int32_t max_num_reqs = 256;
  int32_t max_num_tokens = 8192;
  int32_t num_speculative_tokens = 0;
  // Threads of the resident-slot LRU step (plan::ResidentLru, docs/design/sfa.md
  // §6.3): 1 the calling thread only (default); n > 1 up to n threads, its rows
  // split over a process-wide helper pool when every thread gets at least
  // plan::ResidentLru::kMinRowsPerThread rows; 0 the machine's hardware threads.
  // At most plan::ResidentLru::kMaxThreads. The decisions do not depend on it.
  int32_t lru_threads = 1;
  // Null: default_offload_copy_hooks(). Required on a process that attached
  // to the pool (not its owner): its before_onload must order the step's
  // copies after the owner's commit. A commit that throws between K and V
  // leaves those slots' K new and V old: replay the failed step.
  std::shared_ptr<OffloadCopyHooks> copy_hooks;
};

// rows = min(max_num_tokens, max_num_reqs * (1 + num_speculative_tokens)).
int64_t offload_resident_rows(int64_t max_num_tokens, int64_t max_num_reqs, int64_t num_speculative_tokens);

// What the last forward's offload path did (Impl::last_offload_stats).
struct OffloadStepStats {
  enum class Route : int32_t { None = 0, DecodeOnly = 1, WithPrefills = 2 };
  Route route = Route::None;
  int64_t decode_rows = 0;   // tokens through the resident path
  int64_t prefill_tokens = 0;  // tokens through sparse attention on the device cache
  int64_t hits = 0, misses = 0, resets = 0, invalidated = 0, duplicates = 0;  // the LRU's (plan::ResidentStepStats)
  int64_t onload_bytes = 0;  // host -> device: misses * (kv_lora_rank + qk_rope_head_dim) * 2
  int64_t commit_bytes = 0;  // device -> host (0 on a process that does not own the pool)
  // The pool layer of the offloaded layer whose LRU decided the resident step: this layer's own, or the
  // layer that ran just before on the same selection (an IndexCache layer reusing its top-k), whose
  // decision and copies this one repeated (docs/design/sfa.md §6.8). -1 without a resident step.
  int64_t decided_by = -1;
  // With a reused decision: this layer was not in step with that layer's LRU (its first reuse, or after a
  // reset on either side) and copied every resident token of it (counted in misses) instead of its misses.
  bool resynced = false;
};
const char* to_string(OffloadStepStats::Route r);

}  // namespace aar::sfa
