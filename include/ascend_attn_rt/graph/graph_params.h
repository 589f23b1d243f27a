// The graph parameter store and the per-step update (spec gqa.md 7.1-7.8).
//
// A GraphParams instance belongs to one model (the main model, or a draft
// model). Per captured token count ("bucket") it keeps, for every attention call
// captured in that bucket, its event, task handle and parameter record, plus the
// bucket's workspaces. update() refreshes every recorded call from the step's
// metadata in layer order, entirely in C++: one pass, no per-layer metadata work
// (the host lists were computed once by MetadataBuilder::build).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "ascend_attn_rt/build_stamp.h"
#include "ascend_attn_rt/gqa/metadata.h"
#include "ascend_attn_rt/graph/provider.h"
#include "ascend_attn_rt/ops/fused_infer_attention.h"
#include "ascend_attn_rt/ops/paged_attention.h"

namespace aar::detail {
class ExclusiveUse;  // cpp/common/exclusive_use.h
}

namespace aar::graph {

enum class WorkspacePolicy : int32_t {
  FirstWins = 0,      // default: the first workspace computed for a bucket is kept (spec 7.5)
  MaxOverLayers = 1,  // layer-aware models: keep the largest candidate by bytes
};

enum class CallKind : int32_t {
  KvWrite = 0,         // paged KV-cache write (slot mapping at a stable address)
  Fia = 1,
  FiaV2 = 2,
  PagedAttention = 3,
  Prepare = 4,         // other captured work without host parameters (e.g. C8 quantise + NZ write)
};
const char* to_string(CallKind k);

struct StepParams;

// One captured operator call. Tensors are held strongly until the bucket (or the
// whole store) is released.
struct CapturedCall {
  CallKind kind = CallKind::Fia;
  int64_t layer_index = -1;   // ordering key (capture order when equal / unset)
  int32_t group = 0;          // KV-cache group: which metadata refreshes it
  bool paged = true;          // KV read through a block table (per-request KV lengths)
  // False for BNSD decode calls (one query row per request, no query-length
  // list): an update refreshes only the KV lengths and the block table.
  bool refresh_q_lens = true;
  Handle event = nullptr;
  Handle task = nullptr;
  // Fia / FiaV2
  ops::FiaTensors fia;
  ops::FiaParams fia_params;   // scalars; lists are refreshed from metadata
  ops::FiaV2Tensors fia2;
  ops::FiaV2Params fia2_params;
  at::Tensor out, lse;
  // PagedAttention
  ops::PagedAttentionArgs pa;
  // KvWrite (no host parameters: slot mapping lives at a stable address)
  at::Tensor key, value, key_cache, value_cache, slot_mapping;
  bool reshape_and_cache = false;
  // Prepare
  std::function<void()> prepare;
  // Optional, Prepare calls that read per-step values at captured addresses
  // (DSA): checks at update that the step (groups[group]) fits what was
  // captured for bucket `num_tokens`; throws naming the mismatch.
  std::function<void(const StepParams& step, int64_t num_tokens)> fits;
};

// What an update refreshes, per KV-cache group: the step's host lists and the
// device tensors they index. step_params(gqa::Metadata) makes one; backends
// with their own metadata (MLA decode) make theirs.
struct StepParams {
  at::Tensor block_tables;       // device int32 (num_reqs, max_blocks)
  at::Tensor seq_lens;           // host int32 (num_reqs): paged attention's context_lens
  c10::IntArrayRef q_ends;       // cumulative query ends (num_reqs)
  c10::IntArrayRef kv_lens;      // per-request KV lengths (num_reqs)
  int64_t num_reqs = 0;          // requests the kernels see (incl. padding dummies)
  int64_t num_real_reqs = 0;
  int64_t num_kernel_tokens = 0; // query rows attended (q_ends.back())
  int64_t num_input_tokens = 0;  // rows the layers see (>= num_kernel_tokens); 0: not given (DSA sets it)
  BuildStamp stamp;              // the build the lists belong to (stale ones are rejected)
};
StepParams step_params(const gqa::Metadata& md);

struct Bucket {
  std::vector<CapturedCall> calls;  // layer order after end_capture
  at::Tensor fia_workspace;         // shared by the bucket's fused calls
  at::Tensor pa_workspace;          // paged attention keeps its own (upstream shares one slot)
  int64_t num_query_rows = 0;       // captured kernel token count (FIA) / requests (PA)
  bool updated = false;              // the last update completed and was not replayed since
  // Shared workspaces the captured calls use: a CPU replay enters each (one
  // thread at a time; another thread's forward or replay is refused by name).
  std::vector<std::shared_ptr<detail::ExclusiveUse>> exclusive;
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

  // Capture: while a capture is open on this thread, AttentionImpl::forward
  // records its calls here instead of running them eagerly. A bucket is
  // captured once; capturing it again is an error (release it first).
  void begin_capture(int64_t num_tokens);
  void end_capture();
  // Drops the bucket being captured (a capture that failed half way).
  void abort_capture();
  bool capturing() const { return capturing_ >= 0; }
  int64_t capturing_bucket() const { return capturing_; }

  // Per step, before (NPU) or instead of (CPU) the device replay: refresh every
  // call of the bucket from the step's metadata. `groups[g]` is the metadata of
  // KV-cache group g (one entry serves a single-group model).
  //
  // Failure contract (tests/python/test_fault_injection.py, graph sweep). Every
  // check runs before the first hook: a rejected step leaves the bucket exactly as
  // it was. Past the checks an operator call can still fail (the paged-attention
  // workspace query; on the NPU provider the re-issue of each call). Then the
  // error propagates, the calls before the failing one hold the new step's lists
  // and block table, the failing call and every later one keep the previous
  // update's (the device task of the failing call was not updated either), and
  // the bucket is marked not updated: replay() refuses it until an update
  // completes. An engine must not replay the device graph after a failed update
  // (the calls whose events were not recorded would block it); the next update
  // with good metadata rewrites every call. update never writes a KV cache (KV
  // writes are captured kernels, run by the replay).
  void update(int64_t num_tokens, const std::vector<StepParams>& groups);
  void update(int64_t num_tokens, const gqa::Metadata& md) { update(num_tokens, std::vector<StepParams>{step_params(md)}); }
  // Draft model: per-(draft step, layer) metadata flattened in capture order and
  // cycled (or truncated) over the recorded calls (spec 7.8). Each entry must be
  // the latest build of its builder (a builder rewrites its lists at every
  // build): build each draft step's metadata with its own builder.
  void update_draft(int64_t num_tokens, const std::vector<StepParams>& per_call);

  // CPU provider: run the bucket's recorded calls in order (the last update
  // must have completed, and a replay consumes it: the next replay needs the next
  // update, even when this one fails part way). NPU provider: nothing to do here
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

  // Used by the backends' capture paths.
  Bucket& open_bucket();
  void capture_call(CapturedCall&& call);
  const at::Tensor& fia_workspace_for(const CapturedCall& call);
  const at::Tensor& pa_workspace_for(const CapturedCall& call);

  // The store a capture is open on, for this thread (nullptr outside capture).
  static GraphParams* current();

 private:
  Bucket& mutable_bucket(int64_t num_tokens);
  void refresh(CapturedCall& c, const StepParams& sp, Bucket& b, at::Tensor& pa_ws, bool& pa_ws_ready);
  void launch(CapturedCall& c, const Bucket& b);

  std::shared_ptr<GraphProvider> provider_;
  WorkspacePolicy policy_;
  std::map<int64_t, Bucket> buckets_;
  int64_t capturing_ = -1;
};

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
