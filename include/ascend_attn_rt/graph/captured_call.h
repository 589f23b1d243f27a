// One captured call, type-erased: what the graph layer knows of the work a
// backend recorded. Each backend implements its own calls next to its code (a
// fused-attention call whose host lists an update refreshes, a paged KV write, a
// closure over a layer's stable buffers, ...); GraphParams keeps them per bucket
// and drives them through this interface only.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <exception>
#include <functional>
#include <vector>

#include "ascend_attn_rt/graph/step_params.h"

namespace aar::graph {

// One update (or update_draft) of a bucket: calls that share per-step work
// (e.g. a workspace sized by the step's lengths) redo it once per pass and step.
struct UpdatePass {
  uint64_t id = 0;  // distinct for every update of the store
  // The bucket's previous update pass when no replay consumed it: it failed part way (any provider), or
  // it completed and the CPU provider has not replayed the bucket since. 0 otherwise: a device provider
  // cannot see replays, and an engine replays each completed update once (docs/design/graph.md §1.6).
  // Host state an update publishes for the replay's host callbacks replaces that pass's instead of
  // queueing behind it.
  uint64_t unreplayed = 0;
};

// What a call reads and writes, for introspection (tests, GraphParams.calls /
// captured_lists / call_addresses in Python); unset where the call has none.
struct CallInfo {
  std::vector<int64_t> q_ends, kv_lens;  // the host lists a replay passes
  const void* input = nullptr;           // the query (a KV write: the key)
  const void* output = nullptr;          // the output (a KV write: the key cache)
  const void* lse = nullptr;
  const void* table = nullptr;           // the block table (a KV write: the slot mapping)
};

class CapturedCall {
 public:
  // `kind` names the call in errors and introspection ("fia", "kv_write", ...),
  // a string with static storage. `layer_index` orders the bucket's calls (capture
  // order when equal or unset, -1); `group` is the KV-cache group whose step
  // parameters refresh it.
  CapturedCall(const char* kind, int64_t layer_index, int32_t group, bool has_params)
      : kind_(kind), layer_index_(layer_index), group_(group), has_params_(has_params) {}
  virtual ~CapturedCall() = default;
  CapturedCall(const CapturedCall&) = delete;
  CapturedCall& operator=(const CapturedCall&) = delete;

  const char* kind() const { return kind_; }
  int64_t layer_index() const { return layer_index_; }
  int32_t group() const { return group_; }
  // True when the captured task bakes in host parameters that each step changes:
  // the store brackets it in a task group at capture, refreshes it at every
  // update and, on the NPU, re-issues it into its task. False for work that reads
  // only stable addresses (the device graph replays it as captured).
  bool has_params() const { return has_params_; }
  // True for a host callback (HostCallbackCall): host work between the device
  // kernels, launched on the captured stream as a host function on the NPU
  // (GraphProvider::launch_host_func) and run in order by a CPU replay.
  virtual bool runs_on_host() const { return false; }
  // True when the call must be refreshed from the step before every replay:
  // the calls with host parameters, and host callbacks that read per-step host
  // inputs. A bucket holding one needs an update before each replay.
  virtual bool needs_step() const { return has_params_; }

  // Throws (InvalidArgument naming the mismatch) when `step` does not fit what
  // the call was captured for in bucket `bucket`. Changes nothing. Every call's
  // check runs before any call is refreshed.
  virtual void check(const StepParams& step, int64_t bucket) const {
    (void)step;
    (void)bucket;
  }
  // What GraphParams::update calls: check() with the update pass the refresh will get (a host
  // callback's check needs it, docs/design/graph.md §1.6).
  virtual void check_update(const StepParams& step, int64_t bucket, const UpdatePass& pass) const {
    (void)pass;
    check(step, bucket);
  }
  // Takes the step's host parameters (has_params() calls only). Either completes
  // or throws having changed nothing.
  virtual void refresh(const StepParams& step, const UpdatePass& pass) {
    (void)step;
    (void)pass;
  }
  // Puts back the parameters the last refresh replaced: called when the re-issue
  // that followed it failed, so that the call keeps the previous step whole.
  virtual void revert() noexcept {}
  // Runs the call with its current parameters: at capture on the NPU (into the
  // open task group), at update on the NPU (into its task), at a CPU replay.
  virtual void launch() = 0;
  virtual CallInfo info() const { return {}; }

 private:
  const char* kind_;
  int64_t layer_index_;
  int32_t group_;
  bool has_params_;
};

// Work without host parameters, recorded as a closure over stable buffers (a
// layer's projections and cache writes, a collective, a whole sparse layer);
// `check`, when given, checks at each update that the step fits the capture.
class ClosureCall final : public CapturedCall {
 public:
  using Run = std::function<void()>;
  using Check = std::function<void(const StepParams& step, int64_t bucket)>;
  ClosureCall(int64_t layer_index, int32_t group, Run run, Check check = {})
      : CapturedCall("prepare", layer_index, group, /*has_params=*/false),
        run_(std::move(run)),
        check_(std::move(check)) {}
  void check(const StepParams& step, int64_t bucket) const override {
    if (check_) check_(step, bucket);
  }
  void launch() override { run_(); }

 private:
  Run run_;
  Check check_;
};

// Host work recorded between device kernels (docs/design/graph.md §1.5): on the
// NPU a host function launched on the captured stream (the stream waits for it
// at every replay; it must not enqueue work on the captured stream itself); on
// the CPU provider it runs in order at replay (or, in the recording provider's
// deferred mode, when the test drains the queue: §1.6). `refresh`, when given,
// takes the step's host inputs at each update (no device task is touched:
// nothing is baked into the graph) and makes the bucket need an update before
// every replay; `check` runs at each update before anything is refreshed. Both
// get the update pass: calls of one bucket that share per-update host state (a
// snapshot of the step's host lists every callback of the replay reads) take it
// once per pass (docs/design/graph.md §1.6).
//
// An exception thrown by `run` propagates from a CPU replay; on the NPU (a host
// function cannot throw into the stream) it is kept and rethrown by the next
// update's check (once), so the engine learns of it before the next replay.
class HostCallbackCall final : public CapturedCall {
 public:
  using Run = std::function<void()>;
  using Check = std::function<void(const StepParams& step, int64_t bucket, const UpdatePass& pass)>;
  using Refresh = std::function<void(const StepParams& step, const UpdatePass& pass)>;
  HostCallbackCall(int64_t layer_index, int32_t group, Run run, Check check = {}, Refresh refresh = {})
      : CapturedCall("host_callback", layer_index, group, /*has_params=*/false),
        run_(std::move(run)),
        check_(std::move(check)),
        refresh_(std::move(refresh)) {}
  bool runs_on_host() const override { return true; }
  bool needs_step() const override { return static_cast<bool>(refresh_); }
  void check(const StepParams& step, int64_t bucket) const override { check_update(step, bucket, UpdatePass{}); }
  void check_update(const StepParams& step, int64_t bucket, const UpdatePass& pass) const override {
    if (error_) {
      const std::exception_ptr e = error_;
      error_ = nullptr;  // raised once; the update after it proceeds
      std::rethrow_exception(e);
    }
    if (check_) check_(step, bucket, pass);
  }
  void refresh(const StepParams& step, const UpdatePass& pass) override {
    if (refresh_) refresh_(step, pass);
  }
  void launch() override { run_(); }
  // The NPU trampoline: runs the callback and keeps its error (see above).
  static void run_host(void* self) noexcept {
    auto* c = static_cast<HostCallbackCall*>(self);
    try {
      c->run_();
    } catch (...) {
      c->error_ = std::current_exception();
    }
  }

 private:
  Run run_;
  Check check_;
  Refresh refresh_;
  mutable std::exception_ptr error_;
};

}  // namespace aar::graph
