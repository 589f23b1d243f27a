// The graph parameter store and the per-step update.
//
// A GraphParams instance belongs to one model (the main model, or a draft
// model). Per captured token count ("bucket") it keeps every call the backends
// recorded in that bucket (graph/captured_call.h: type-erased, each backend
// brings its own), their events and task handles, and the workspaces the calls
// share. update() refreshes every call that takes host parameters from the
// step's parameters in layer order, entirely in C++: one pass, no per-layer
// metadata work (the host lists were computed once by the builder's build).
// The store knows no backend and no operator.
#pragma once

#include <ATen/core/Tensor.h>

#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "ascend_attn_rt/graph/captured_call.h"
#include "ascend_attn_rt/graph/provider.h"
#include "ascend_attn_rt/graph/step_params.h"

namespace aar::detail {
class ExclusiveUse;  // cpp/common/exclusive_use.h
}

namespace aar::graph {

enum class WorkspacePolicy : int32_t {
  FirstWins = 0,      // default: the first workspace computed for a bucket is kept
  MaxOverLayers = 1,  // layer-aware models: keep the largest candidate by bytes
};

// A tensor the calls of one bucket share by name (a kernel's workspace): its
// calls read `tensor` when they launch. Capture offers candidates
// (GraphParams::offer_workspace); a call whose workspace depends on the step
// replaces it when it refreshes, once per update pass and step (`pass`, `step`).
struct SharedWorkspace {
  std::string name;
  std::optional<at::Tensor> tensor;  // as the kernels take it (no per-launch wrapping)
  uint64_t pass = 0;
  const StepParams* step = nullptr;
};

// A recorded call and the provider handles the store gave it (event and task
// group: calls with host parameters only).
struct RecordedCall {
  std::unique_ptr<CapturedCall> call;
  Handle event = nullptr;
  Handle task = nullptr;
};

struct Bucket {
  std::vector<RecordedCall> calls;  // layer order after end_capture
  // Stable addresses: calls keep pointers to their slots.
  std::vector<std::unique_ptr<SharedWorkspace>> workspaces;
  bool updated = false;  // the last update completed and was not replayed since
  // Shared workspaces the captured calls use: a CPU replay enters each (one
  // thread at a time; another thread's forward or replay is refused by name).
  std::vector<std::shared_ptr<detail::ExclusiveUse>> exclusive;
  // The layers whose recorded calls reach the layer object itself (closures over it): the
  // bucket holds a weak reference to each one's life token, and update / replay refuse the
  // bucket, naming the layer, once one is gone (docs/design/graph.md §4.6), instead of running a
  // call on a destroyed layer.
  struct Owner {
    std::weak_ptr<const void> life;
    const void* key = nullptr;
    std::string what;
  };
  std::vector<Owner> owners;
  // Host state the bucket's calls share (a snapshot ring of the step's host lists the
  // host callbacks read, docs/design/graph.md §1.6), by name (GraphParams::host_state).
  std::vector<std::pair<std::string, std::shared_ptr<void>>> host_state;
  // The metadata builders whose buffers the captured calls read, per KV-cache group
  // (GraphParams::note_metadata): update() takes each group's step from that builder only
  // (docs/design/graph.md §1.2). Held strongly so that the counter's address stays unique.
  struct Source {
    int32_t group = 0;
    std::shared_ptr<const std::atomic<uint64_t>> live;
  };
  std::vector<Source> sources;
  // The last update pass no replay consumed (UpdatePass::unreplayed), 0 when none.
  uint64_t unreplayed_pass = 0;
  // Work a deferred replay queued (RecordingGraphProvider) refuses to run once the bucket is gone.
  std::shared_ptr<const void> alive = std::make_shared<int>(0);

  // The shared workspace `name` (nullopt when the bucket has none).
  std::optional<at::Tensor> workspace(const char* name) const;
};

// Thread safety: one thread at a time per store: its capture, update, replay and
// release calls must not overlap, but may come from different threads one after another
// (an engine captures on its loading thread and steps on another; a mutex, a queue or a
// join between them is enough). The open capture is per thread: forwards on other threads
// are not recorded, current() is null there. Stores share nothing. (tests/cpp/test_concurrency.cpp)
class GraphParams {
 public:
  explicit GraphParams(std::shared_ptr<GraphProvider> provider,
                       WorkspacePolicy policy = WorkspacePolicy::FirstWins);
  ~GraphParams();
  GraphParams(const GraphParams&) = delete;
  GraphParams& operator=(const GraphParams&) = delete;

  // Capture: while a capture is open on this thread, the backends' forwards
  // record their calls here instead of running them eagerly. A bucket is
  // captured once; capturing it again is an error (release it first).
  void begin_capture(int64_t num_tokens);
  void end_capture();
  // Drops the bucket being captured (a capture that failed half way).
  void abort_capture();
  bool capturing() const { return capturing_ >= 0; }
  int64_t capturing_bucket() const { return capturing_; }

  // Per step, before (NPU) or instead of (CPU) the device replay: refresh every
  // call of the bucket from the step's parameters. `groups[g]` holds those of
  // KV-cache group g (one entry serves a single-group model).
  //
  // Failure contract (tests/python/test_fault_injection.py, graph sweep). Every
  // check runs before the first hook: a rejected step leaves the bucket exactly as
  // it was. Past the checks an operator call can still fail (a workspace query
  // that depends on the step; on the NPU provider the re-issue of each call).
  // Then the error propagates, the calls before the failing one hold the new
  // step's lists and block table, the failing call and every later one keep the
  // previous update's (the device task of the failing call was not updated
  // either), and the bucket is marked not updated: replay() refuses it until an
  // update completes. An engine must not replay the device graph after a failed
  // update (the calls whose events were not recorded would block it); the next
  // update with good parameters rewrites every call. update never writes a KV
  // cache (KV writes are captured kernels, run by the replay).
  void update(int64_t num_tokens, const std::vector<StepParams>& groups);
  // One metadata of any backend whose namespace provides
  // graph_step_params(metadata) (gqa::Metadata, mla::Metadata, ...).
  template <class Metadata,
            class = decltype(graph_step_params(std::declval<const Metadata&>()))>
  void update(int64_t num_tokens, const Metadata& md) {
    update(num_tokens, std::vector<StepParams>{graph_step_params(md)});
  }
  // Draft model: per-(draft step, layer) parameters flattened in capture order and
  // cycled (or truncated) over the calls with host parameters. Each entry must
  // come from the latest build of its builder (a builder rewrites its lists at
  // every build): build each draft step's metadata with its own builder.
  void update_draft(int64_t num_tokens, const std::vector<StepParams>& per_call);

  // CPU provider: run the bucket's recorded calls in order (the last update
  // must have completed, and a replay consumes it: the next replay needs the next
  // update, even when this one fails part way). In the recording provider's
  // deferred mode the calls from the first host callback on are queued instead
  // (provider.h; docs/design/graph.md §1.6). NPU provider: nothing to do here
  // (the device graph replays); calling it is an error. A failure in the middle
  // leaves the calls before it run (a KV write runs completely or not at all) and
  // the rest not; update + replay of the same step then redo it exactly.
  void replay(int64_t num_tokens);

  bool has(int64_t num_tokens) const { return buckets_.count(num_tokens) != 0; }
  const Bucket& bucket(int64_t num_tokens) const;
  std::vector<int64_t> buckets() const;
  // Drops a bucket: its records, events, tasks and workspaces are released.
  void release(int64_t num_tokens);
  void release_all();

  GraphProvider& provider() { return *provider_; }
  WorkspacePolicy policy() const { return policy_; }

  // Used by the backends' capture code. Records `call` in the bucket being
  // captured: a call with host parameters gets an event and a task group around
  // its launch; on the NPU provider the call is launched now (into the device
  // graph being captured), on the CPU provider it runs at replay.
  void capture_call(std::unique_ptr<CapturedCall> call);
  // The bucket being captured, its shared workspace `name` (empty at first).
  SharedWorkspace& shared_workspace(const char* name);
  // Offers the workspace `query` computes to `ws` by the store's policy; `query`
  // is not called when the policy keeps the workspace `ws` has.
  void offer_workspace(SharedWorkspace& ws, const std::function<at::Tensor()>& query);
  // The bucket being captured: its host state `name` (Bucket::host_state), made by `make`
  // the first time a call of the bucket asks for it.
  std::shared_ptr<void> host_state(const std::string& name, const std::function<std::shared_ptr<void>()>& make);
  // Records `use` in the bucket being captured: every CPU replay enters it.
  void note_exclusive_use(const std::shared_ptr<detail::ExclusiveUse>& use);
  // Ties the bucket being captured to a layer's life token (Bucket::owners); `what` names
  // the layer in the error update / update_draft / replay raise once the token is gone.
  void note_owner(const std::shared_ptr<const void>& life, std::string what);

  // Records that the calls of KV-cache group `group` being captured read the buffers of the
  // builder that made the metadata stamped `stamp` (its slot mapping, block table, lengths):
  // update() then refuses a step of that group from another builder. Metadata no builder made
  // (filled in by hand) records nothing.
  void note_metadata(int32_t group, const BuildStamp& stamp);

  // The store a capture is open on, for this thread (nullptr outside capture).
  static GraphParams* current();

 private:
  Bucket& open_bucket();
  Bucket& mutable_bucket(int64_t num_tokens);
  // Refreshes `r` from `step`, re-issues it between the provider's task-update
  // hooks (NPU) and records its event; on failure the call keeps its previous
  // parameters.
  void refresh_one(RecordedCall& r, const StepParams& step, const UpdatePass& pass, bool relaunch);
  // Throws InvalidArgument naming the first destroyed owner of bucket `n`; changes nothing.
  static void check_owners(const Bucket& b, int64_t n, const char* op);

  std::shared_ptr<GraphProvider> provider_;
  WorkspacePolicy policy_;
  std::map<int64_t, Bucket> buckets_;
  int64_t capturing_ = -1;
  uint64_t passes_ = 0;
};

// A layer whose captured calls reach the layer object calls this from its forward: inside an
// open capture on this thread it ties the bucket to `life` (GraphParams::note_owner), else
// nothing. `what` names the layer ("dsa.Impl", ...), `layer_index` its index (-1: none).
void note_layer_life(const std::shared_ptr<const void>& life, const char* what, int64_t layer_index);

// The capture policy every Impl follows: inside an open capture a forward call
// is recorded into it or refused; it never runs eagerly unrecorded. Throws
// NotSupported naming `what` (e.g. "the FA3 backend's forward") when a capture
// is open on this thread; returns otherwise.
void refuse_if_capturing(const char* what);

// RAII capture scope; a scope left by an exception drops the partial bucket.
//
// Thread safety: lives on the thread that captures (begin and end on the same thread).
class CaptureScope {
 public:
  CaptureScope(GraphParams& g, int64_t num_tokens) : g_(g), exceptions_(std::uncaught_exceptions()) {
    g_.begin_capture(num_tokens);
  }
  ~CaptureScope() {
    if (!g_.capturing()) return;
    if (std::uncaught_exceptions() > exceptions_) {
      g_.abort_capture();
    } else {
      g_.end_capture();
    }
  }
  CaptureScope(const CaptureScope&) = delete;
  CaptureScope& operator=(const CaptureScope&) = delete;

 private:
  GraphParams& g_;
  int exceptions_;
};

}  // namespace aar::graph
