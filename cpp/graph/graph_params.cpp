#include "ascend_attn_rt/graph/graph_params.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <string>

#include "../common/builder_checks.h"
#include "../common/inference_scope.h"
#include "../common/open_capture.h"
#include "ascend_attn_rt/errors.h"
#include "exclusive_scope.h"

namespace aar::graph {

namespace {
thread_local GraphParams* tl_current = nullptr;

void set_current(GraphParams* g, int64_t bucket) {
  tl_current = g;
  detail::set_open_capture_bucket(bucket);
}

int64_t nbytes(const std::optional<at::Tensor>& t) {
  return t.has_value() && t->defined() ? t->numel() * t->element_size() : -1;
}

// A bucket whose calls take no host parameters (SFA, DSA: they read the builders' stable
// buffers) is ready to replay once captured and stays ready after a replay that completes. A
// replay that fails part way still consumes it, so the engine's next update (which re-checks
// the step) must come first.
// A host callback that reads per-step host inputs (needs_step) makes its bucket need an update before
// every replay too.
bool has_params(const Bucket& b) {
  return std::any_of(b.calls.begin(), b.calls.end(), [](const RecordedCall& r) { return r.call->needs_step(); });
}
}  // namespace

std::optional<at::Tensor> Bucket::workspace(const char* name) const {
  for (const auto& w : workspaces) {
    if (w->name == name) return w->tensor;
  }
  return std::nullopt;
}

GraphParams::GraphParams(std::shared_ptr<GraphProvider> provider, WorkspacePolicy policy)
    : provider_(std::move(provider)), policy_(policy) {
  AAR_CHECK_ARG(provider_ != nullptr, "provider must not be null");
}

GraphParams::~GraphParams() {
  if (tl_current == this) set_current(nullptr, -1);
  try {
    release_all();
  } catch (...) {
  }
}

GraphParams* GraphParams::current() { return tl_current; }

void refuse_if_capturing(const char* what) { detail::refuse_if_capturing(what); }

void GraphParams::begin_capture(int64_t n) {
  // No builder takes more than kMaxBuilderTokens tokens, so no step could fill a larger bucket.
  AAR_CHECK_ARG(n > 0 && n <= internal::kMaxBuilderTokens, "num_tokens must be in [1, ", internal::kMaxBuilderTokens,
                "] (the builders' max_num_tokens bound), got ", n);
  AAR_CHECK_ARG(!capturing(), "a capture of bucket ", capturing_, " is already open on this graph");
  AAR_CHECK_ARG(tl_current == nullptr, "another graph capture is already open on this thread");
  AAR_CHECK_ARG(!has(n), "bucket ", n, " is already captured; release it before capturing it again");
  buckets_.emplace(n, Bucket{});
  capturing_ = n;
  set_current(this, n);
}

void GraphParams::abort_capture() {
  if (!capturing()) return;
  const int64_t n = capturing_;
  capturing_ = -1;
  set_current(nullptr, -1);
  release(n);
}

void GraphParams::end_capture() {
  AAR_CHECK_ARG(capturing(), "end_capture without an open capture");
  Bucket& b = buckets_.at(capturing_);
  // Updates run in layer order so the replay, which waits on each call's event
  // in graph order, can proceed as early as possible.
  const bool all_indexed = std::all_of(b.calls.begin(), b.calls.end(),
                                       [](const RecordedCall& r) { return r.call->layer_index() >= 0; });
  if (all_indexed) {
    std::stable_sort(b.calls.begin(), b.calls.end(), [](const RecordedCall& x, const RecordedCall& y) {
      return x.call->layer_index() < y.call->layer_index();
    });
  }
  b.updated = !has_params(b);
  capturing_ = -1;
  set_current(nullptr, -1);
}

Bucket& GraphParams::open_bucket() {
  AAR_CHECK_ARG(capturing(), "no capture is open");
  return buckets_.at(capturing_);
}

const Bucket& GraphParams::bucket(int64_t n) const {
  auto it = buckets_.find(n);
  if (it == buckets_.end()) {
    std::string have;
    for (const auto& [k, v] : buckets_) have += (have.empty() ? "" : ", ") + std::to_string(k);
    throw_invalid("no graph is captured for num_tokens=", n, " (captured buckets: [", have, "])");
  }
  return it->second;
}

Bucket& GraphParams::mutable_bucket(int64_t n) {
  bucket(n);  // throws, naming the captured buckets, when n is not one of them
  return buckets_.at(n);
}

std::vector<int64_t> GraphParams::buckets() const {
  std::vector<int64_t> out;
  for (const auto& [k, v] : buckets_) out.push_back(k);
  return out;
}

SharedWorkspace& GraphParams::shared_workspace(const char* name) {
  Bucket& b = open_bucket();
  for (auto& w : b.workspaces) {
    if (w->name == name) return *w;
  }
  b.workspaces.push_back(std::make_unique<SharedWorkspace>());
  b.workspaces.back()->name = name;
  return *b.workspaces.back();
}

void GraphParams::offer_workspace(SharedWorkspace& ws, const std::function<at::Tensor()>& query) {
  if (policy_ == WorkspacePolicy::FirstWins && nbytes(ws.tensor) >= 0) return;
  std::optional<at::Tensor> cand = query();
  if (nbytes(ws.tensor) < 0 || nbytes(cand) > nbytes(ws.tensor)) ws.tensor = std::move(cand);
}

void GraphParams::note_exclusive_use(const std::shared_ptr<detail::ExclusiveUse>& use) {
  auto& ex = open_bucket().exclusive;
  for (const auto& u : ex) {
    if (u == use) return;
  }
  ex.push_back(use);
}

std::shared_ptr<void> GraphParams::host_state(const std::string& name,
                                              const std::function<std::shared_ptr<void>()>& make) {
  auto& states = open_bucket().host_state;
  for (const auto& [k, v] : states) {
    if (k == name) return v;
  }
  std::shared_ptr<void> made = make();
  AAR_CHECK_ARG(made != nullptr, "host_state: the state \"", name, "\" made for the bucket is null");
  states.emplace_back(name, made);
  return made;
}

void GraphParams::note_owner(const std::shared_ptr<const void>& life, std::string what) {
  AAR_CHECK_ARG(life != nullptr, "note_owner: the life token must not be null");
  auto& owners = open_bucket().owners;
  for (const auto& o : owners) {
    if (o.key == life.get()) return;
  }
  owners.push_back(Bucket::Owner{life, life.get(), std::move(what)});
}

void GraphParams::note_metadata(int32_t group, const BuildStamp& stamp) {
  if (stamp.live == nullptr) return;
  auto& sources = open_bucket().sources;
  for (const auto& s : sources) {
    if (s.group == group && s.live == stamp.live) return;
  }
  sources.push_back(Bucket::Source{group, stamp.live});
}

namespace {

// docs/design/graph.md §1.2: the captured calls read the buffers of the builder whose metadata the
// capture used; a step from another builder would leave them reading that builder's last build.
void check_sources(const Bucket& b, int64_t n, const std::vector<StepParams>& groups) {
  for (const Bucket::Source& s : b.sources) {
    if (s.group < 0 || static_cast<size_t>(s.group) >= groups.size()) continue;  // the calls' check names it
    size_t builders = 0;
    for (const Bucket::Source& o : b.sources) builders += o.group == s.group ? 1 : 0;
    AAR_CHECK_ARG(builders == 1, "update of bucket ", n, ": its KV-cache group ", s.group, " was captured with the "
                  "metadata of ", builders, " builders, and update takes one metadata per group (a draft model's "
                  "per-step builders: update_draft)");
    const StepParams& sp = groups[s.group];
    AAR_CHECK_ARG(sp.stamp.live == nullptr || sp.stamp.live == s.live, "update of bucket ", n, ": metadata[",
                  s.group, "] comes from another metadata builder than the one bucket ", n, " was captured with; "
                  "the captured calls read that builder's buffers (slot mapping, block table, lengths), so update "
                  "the bucket with that builder's latest build");
  }
}

}  // namespace

void GraphParams::check_owners(const Bucket& b, int64_t n, const char* op) {
  for (const auto& o : b.owners) {
    AAR_CHECK_ARG(!o.life.expired(), op, " of bucket ", n, ": the bucket recorded calls of ", o.what,
                  ", which has been destroyed; release the bucket (GraphParams.release) before dropping a layer "
                  "it captured, or capture it again with the new layer");
  }
}

void note_layer_life(const std::shared_ptr<const void>& life, const char* what, int64_t layer_index) {
  GraphParams* g = GraphParams::current();
  if (g == nullptr || !g->capturing()) return;
  g->note_owner(life, layer_index >= 0 ? std::string(what) + " (layer " + std::to_string(layer_index) + ")"
                                       : std::string(what));
}

void GraphParams::capture_call(std::unique_ptr<CapturedCall> call) {
  AAR_CHECK_ARG(call != nullptr, "capture_call: the call must not be null");
  Bucket& b = open_bucket();
  const bool run_now = !provider_->replays_recorded_calls();
  RecordedCall r{std::move(call)};
  if (r.call->runs_on_host()) {
    // Device graphs: a host function on the captured stream, run by every replay (the call lives, at a
    // stable address, until the bucket is released). The CPU provider runs it in order at replay.
    auto* host = dynamic_cast<HostCallbackCall*>(r.call.get());
    AAR_CHECK_ARG(host != nullptr, "capture_call: a call that runs on the host must be a HostCallbackCall");
    if (run_now) provider_->launch_host_func(&HostCallbackCall::run_host, host);
    b.calls.push_back(std::move(r));
    return;
  }
  if (!r.call->has_params()) {
    // The device graph captures it as it is; the CPU provider keeps it to replay it.
    if (run_now) r.call->launch();
    b.calls.push_back(std::move(r));
    return;
  }
  r.event = provider_->create_event();
  try {
    provider_->event_wait_and_reset(r.event);
    provider_->task_group_begin();
    try {
      if (run_now) r.call->launch();
    } catch (...) {
      provider_->release(nullptr, provider_->task_group_end());
      throw;
    }
    r.task = provider_->task_group_end();
  } catch (...) {
    provider_->release(r.event, nullptr);
    throw;
  }
  b.calls.push_back(std::move(r));
}

void GraphParams::refresh_one(RecordedCall& r, const StepParams& sp, const UpdatePass& pass, bool relaunch) {
  CapturedCall& c = *r.call;
  c.refresh(sp, pass);  // all or nothing
  try {
    provider_->task_update_begin(r.task);
    if (relaunch) {
      try {
        c.launch();
      } catch (...) {
        provider_->task_update_end();  // the task update is closed on any error
        throw;
      }
    }
    provider_->task_update_end();
  } catch (...) {
    // The device task was not updated: the call keeps the previous step whole.
    c.revert();
    throw;
  }
  provider_->event_record(r.event);
}

void GraphParams::update(int64_t n, const std::vector<StepParams>& groups) {
  AAR_CHECK_ARG(!capturing(), "update while a capture is open");
  AAR_CHECK_ARG(!groups.empty(), "update needs the metadata of at least one KV-cache group");
  Bucket& b = mutable_bucket(n);
  check_owners(b, n, "update");
  // Validate everything before the first hook: a rejected update leaves the
  // graph as it was.
  for (size_t g = 0; g < groups.size(); ++g) {
    if (!groups[g].stamp.current()) check_current(groups[g].stamp, ("metadata[" + std::to_string(g) + "]").c_str());
  }
  // The pass the refreshes will get, known to the checks (a host callback's refuses an update that
  // would overwrite host state a pending replay still reads: docs/design/graph.md §1.6).
  const UpdatePass pass{passes_ + 1, b.unreplayed_pass};
  for (const RecordedCall& r : b.calls) {
    const CapturedCall& c = *r.call;
    AAR_CHECK_ARG(c.group() >= 0 && static_cast<size_t>(c.group()) < groups.size(), "a call of layer ",
                  c.layer_index(), " belongs to KV-cache group ", c.group(), " but ", groups.size(),
                  " group metadata were given");
    c.check_update(groups[c.group()], n, pass);
  }
  check_sources(b, n, groups);  // after the calls' own checks, which name the finer mismatches
  // The re-issues are operator calls: one inference-mode scope for all of them.
  aar::detail::InferenceScope inference;
  ++passes_;
  const bool relaunch = !provider_->replays_recorded_calls();
  // From here an operator call (a workspace query, an NPU re-issue) may fail: the bucket counts
  // as not updated until the loop completes (replay refuses it), and the failing call keeps the
  // previous step's parameters (see the header).
  b.updated = false;
  b.unreplayed_pass = pass.id;  // until a replay consumes it (a failed update: until the next update)
  for (RecordedCall& r : b.calls) {
    if (r.call->has_params()) {
      refresh_one(r, groups[r.call->group()], pass, relaunch);
    } else if (r.call->needs_step()) {
      r.call->refresh(groups[r.call->group()], pass);  // a host callback's inputs: no device task to update
    }
  }
  b.updated = true;
  // A device provider cannot see the replay: the engine replays each completed update once.
  if (relaunch) b.unreplayed_pass = 0;
}

void GraphParams::update_draft(int64_t n, const std::vector<StepParams>& per_call) {
  AAR_CHECK_ARG(!capturing(), "update_draft while a capture is open");
  AAR_CHECK_ARG(!per_call.empty(), "update_draft needs at least one metadata");
  Bucket& b = mutable_bucket(n);
  check_owners(b, n, "update_draft");
  // Validate everything before the first hook (as update does).
  for (size_t k = 0; k < per_call.size(); ++k) {
    if (!per_call[k].stamp.current()) check_current(per_call[k].stamp, ("metadata[" + std::to_string(k) + "]").c_str());
    const auto& live = per_call[k].stamp.live;
    AAR_CHECK_ARG(live == nullptr || b.sources.empty() ||
                      std::any_of(b.sources.begin(), b.sources.end(),
                                  [&](const Bucket::Source& s) { return s.live == live; }),
                  "update_draft of bucket ", n, ": metadata[", k, "] comes from a metadata builder none of whose "
                  "metadata bucket ", n, " was captured with; the captured calls read their builders' buffers, so "
                  "update with the latest builds of the builders the capture used");
  }
  for (const RecordedCall& r : b.calls) {
    if (r.call->needs_step() && !r.call->has_params()) {
      throw_not_supported("update_draft of bucket ", n, ": layer ", r.call->layer_index(), " recorded a ",
                          r.call->kind(), " that takes the step's host inputs, which the per-call draft lists do "
                          "not carry (a draft model with SFA KV offload is not supported); use update");
    }
  }
  size_t i = 0;
  for (const RecordedCall& r : b.calls) {
    if (r.call->has_params()) r.call->check(per_call[i++ % per_call.size()], n);
  }
  aar::detail::InferenceScope inference;
  const UpdatePass pass{++passes_, b.unreplayed_pass};
  const bool relaunch = !provider_->replays_recorded_calls();
  b.updated = false;  // as update(): not updated until every call went through
  b.unreplayed_pass = pass.id;
  i = 0;
  for (RecordedCall& r : b.calls) {
    if (r.call->has_params()) refresh_one(r, per_call[i++ % per_call.size()], pass, relaunch);
  }
  b.updated = true;
  if (relaunch) b.unreplayed_pass = 0;
}

namespace {
thread_local ForwardScope* tl_forward = nullptr;
}  // namespace

ForwardScope::ForwardScope() noexcept : prev_(tl_forward) { tl_forward = this; }

ForwardScope::~ForwardScope() {
  while (n_ > 0) {
    --n_;
    held_[n_]->leave();
    held_[n_].reset();
  }
  tl_forward = prev_;
}

void ForwardScope::hold(const std::shared_ptr<detail::ExclusiveUse>& use) {
  for (std::size_t i = 0; i < n_; ++i) {
    if (held_[i] == use) return;
  }
  AAR_CHECK_ARG(n_ < kMax, "ForwardScope: more than ", kMax, " shared workspaces in one forward");
  use->enter();
  held_[n_++] = use;
  try {
    // Inside an open capture on this thread the bucket's replays enter it too.
    GraphParams* g = GraphParams::current();
    if (g != nullptr && g->capturing()) g->note_exclusive_use(use);
  } catch (...) {
    --n_;
    held_[n_]->leave();
    held_[n_].reset();
    throw;
  }
}

void use_in_forward(const std::shared_ptr<detail::ExclusiveUse>& use) {
  if (tl_forward != nullptr) tl_forward->hold(use);
}

void GraphParams::replay(int64_t n) {
  AAR_CHECK_ARG(provider_->replays_recorded_calls(), "replay(): the '", provider_->name(),
                "' graph provider replays on the device; call the device graph's replay instead");
  auto* rec = dynamic_cast<RecordingGraphProvider*>(provider_.get());
  Bucket& b = mutable_bucket(n);
  check_owners(b, n, "replay");
  // The last update must have completed: one that failed part way leaves every call's event
  // recorded by an earlier, unreplayed update looking fresh, with a mix of two steps' lists.
  AAR_CHECK_ARG(b.updated, "replay of bucket ", n, " before update: the last update did not complete (or the "
                "bucket was replayed since); update it with the step's metadata first");
  for (size_t i = 0; i < b.calls.size(); ++i) {
    const RecordedCall& r = b.calls[i];
    if (r.event != nullptr && rec != nullptr) {
      AAR_CHECK_ARG(rec->event_recorded(r.event), "replay of bucket ", n, " before update: call ", i, " (",
                    r.call->kind(), ", layer ", r.call->layer_index(),
                    ") has no recorded update since the last replay");
    }
  }
  // The shared workspaces the calls write, entered for the whole replay (before
  // anything runs: another thread inside one refuses this replay, unchanged).
  std::vector<detail::ExclusiveUse*> entered;
  entered.reserve(b.exclusive.size());
  struct Leave {
    std::vector<detail::ExclusiveUse*>& e;
    ~Leave() {
      while (!e.empty()) {
        e.back()->leave();
        e.pop_back();
      }
    }
  } leave{entered};
  for (const auto& u : b.exclusive) {
    u->enter();
    entered.push_back(u.get());
  }
  // The recorded work is inference work (buffers made during capture are
  // inference tensors when the forward ran under InferenceMode).
  aar::detail::InferenceScope inference;
  b.updated = false;  // a replay consumes the update, whether or not it completes
  // The recording provider's deferred mode (docs/design/graph.md §1.6): from the first host callback
  // on (from the first call while earlier work is queued) the calls go to its queue, in order.
  bool queue = rec != nullptr && rec->defers_host_callbacks() && rec->deferred() > 0;
  const bool defer = rec != nullptr && rec->defers_host_callbacks();
  for (RecordedCall& r : b.calls) {
    if (defer && !queue && r.call->runs_on_host()) queue = true;
    if (queue) {
      rec->defer([alive = std::weak_ptr<const void>(b.alive), exclusive = b.exclusive, owners = b.owners,
                  c = r.call.get(), kind = r.call->kind(), n]() {
        AAR_CHECK_ARG(!alive.expired(), "deferred replay work of bucket ", n, " (a queued ", kind,
                      "): the bucket was released before the queue ran");
        for (const auto& o : owners) {
          AAR_CHECK_ARG(!o.life.expired(), "deferred replay work of bucket ", n, " (a queued ", kind, "): ", o.what,
                        " was destroyed before the queue ran");
        }
        std::vector<detail::ExclusiveUse*> in;
        in.reserve(exclusive.size());
        struct Out {
          std::vector<detail::ExclusiveUse*>& e;
          ~Out() {
            while (!e.empty()) {
              e.back()->leave();
              e.pop_back();
            }
          }
        } out{in};
        for (const auto& u : exclusive) {
          u->enter();
          in.push_back(u.get());
        }
        aar::detail::InferenceScope scope;
        c->launch();
      });
    } else {
      r.call->launch();
    }
    if (r.event != nullptr && rec != nullptr) rec->reset_event(r.event);
  }
  // Host state the update published counts as read only once every call ran (or was queued): after a
  // replay that failed part way the next update replaces it (UpdatePass::unreplayed).
  b.unreplayed_pass = 0;
  b.updated = !has_params(b);  // see has_params()
}

void GraphParams::release(int64_t n) {
  AAR_CHECK_ARG(n >= 0, "release: bucket ", n, " is not a token count (buckets are num_tokens >= 0)");
  AAR_CHECK_ARG(capturing_ != n, "cannot release bucket ", n, " while it is being captured");
  auto it = buckets_.find(n);
  if (it == buckets_.end()) return;
  for (RecordedCall& r : it->second.calls) {
    if (r.event != nullptr || r.task != nullptr) provider_->release(r.event, r.task);
  }
  buckets_.erase(it);
}

void GraphParams::release_all() {
  std::vector<int64_t> keys = buckets();
  for (int64_t k : keys) {
    if (k != capturing_) release(k);
  }
}

}  // namespace aar::graph
