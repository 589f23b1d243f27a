#include "ascend_attn_rt/graph/graph_params.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <string>

#include "ascend_attn_rt/errors.h"
#include "ascend_attn_rt/ops/kv_cache_write.h"
#include "exclusive_scope.h"

namespace aar::graph {

namespace {
thread_local GraphParams* tl_current = nullptr;

int64_t nbytes(const at::Tensor& t) { return t.defined() ? t.numel() * t.element_size() : -1; }
}  // namespace

const char* to_string(CallKind k) {
  switch (k) {
    case CallKind::KvWrite: return "kv_write";
    case CallKind::Fia: return "fia";
    case CallKind::FiaV2: return "fia_v2";
    case CallKind::PagedAttention: return "paged_attention";
    case CallKind::Prepare: return "prepare";
  }
  return "unknown";
}

GraphParams::GraphParams(std::shared_ptr<GraphProvider> provider, WorkspacePolicy policy)
    : provider_(std::move(provider)), policy_(policy) {
  AAR_CHECK_ARG(provider_ != nullptr, "provider must not be null");
}

GraphParams::~GraphParams() {
  if (tl_current == this) tl_current = nullptr;
  try {
    release_all();
  } catch (...) {
  }
}

GraphParams* GraphParams::current() { return tl_current; }

void refuse_if_capturing(const char* what) {
  if (__builtin_expect(tl_current == nullptr, 1)) return;
  throw_not_supported(what, " cannot be captured in a graph (capture of bucket ", tl_current->capturing_bucket(),
                      " is open): it would run eagerly and its replay would leave the output stale");
}

namespace {
// A bucket whose calls are all prepare calls and KV writes (SFA, DSA: they read the builders'
// stable buffers) has no per-step parameters: it is ready to replay once captured and stays
// ready after a replay that completes. A replay that fails part way still consumes it, so the
// engine's next update (which re-checks the step) must come first.
bool has_params(const Bucket& b) {
  return std::any_of(b.calls.begin(), b.calls.end(),
                     [](const CapturedCall& c) { return c.kind != CallKind::KvWrite && c.kind != CallKind::Prepare; });
}
}  // namespace

void GraphParams::begin_capture(int64_t n) {
  AAR_CHECK_ARG(n > 0, "num_tokens must be positive, got ", n);
  AAR_CHECK_ARG(!capturing(), "a capture of bucket ", capturing_, " is already open on this graph");
  AAR_CHECK_ARG(tl_current == nullptr, "another graph capture is already open on this thread");
  AAR_CHECK_ARG(!has(n), "bucket ", n, " is already captured; release it before capturing it again");
  buckets_.emplace(n, Bucket{});
  capturing_ = n;
  tl_current = this;
}

void GraphParams::abort_capture() {
  if (!capturing()) return;
  const int64_t n = capturing_;
  capturing_ = -1;
  tl_current = nullptr;
  release(n);
}

void GraphParams::end_capture() {
  AAR_CHECK_ARG(capturing(), "end_capture without an open capture");
  Bucket& b = buckets_.at(capturing_);
  // Updates run in layer order so the replay, which waits on each call's event
  // in graph order, can proceed as early as possible (spec 7.6, 7.8).
  const bool all_indexed = std::all_of(b.calls.begin(), b.calls.end(),
                                       [](const CapturedCall& c) { return c.layer_index >= 0; });
  if (all_indexed) {
    std::stable_sort(b.calls.begin(), b.calls.end(), [](const CapturedCall& x, const CapturedCall& y) {
      return x.layer_index < y.layer_index;
    });
  }
  b.updated = !has_params(b);
  capturing_ = -1;
  tl_current = nullptr;
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

const at::Tensor& GraphParams::fia_workspace_for(const CapturedCall& c) {
  Bucket& b = open_bucket();
  if (policy_ == WorkspacePolicy::FirstWins && b.fia_workspace.defined()) return b.fia_workspace;
  at::Tensor cand = c.kind == CallKind::FiaV2 ? ops::fused_infer_attention_score_v2_get_max_workspace(c.fia2, c.fia2_params)
                                              : ops::fused_infer_attention_score_get_max_workspace(c.fia, c.fia_params);
  if (!b.fia_workspace.defined() || nbytes(cand) > nbytes(b.fia_workspace)) b.fia_workspace = cand;
  return b.fia_workspace;
}

const at::Tensor& GraphParams::pa_workspace_for(const CapturedCall& c) {
  Bucket& b = open_bucket();
  if (policy_ == WorkspacePolicy::FirstWins && b.pa_workspace.defined()) return b.pa_workspace;
  at::Tensor out = c.out;
  at::Tensor cand = ops::paged_attention_get_workspace(c.pa, out);
  if (!b.pa_workspace.defined() || nbytes(cand) > nbytes(b.pa_workspace)) b.pa_workspace = cand;
  return b.pa_workspace;
}

void GraphParams::launch(CapturedCall& c, const Bucket& b) {
  switch (c.kind) {
    case CallKind::KvWrite:
      if (c.reshape_and_cache) {
        ops::reshape_and_cache(c.key, c.value, c.key_cache, c.value_cache, c.slot_mapping);
      } else {
        ops::scatter_pa_kv_cache(c.key, c.value, c.key_cache, c.value_cache, c.slot_mapping, "Norm");
      }
      return;
    case CallKind::Fia:
      ops::fused_infer_attention_score_out(c.fia, c.fia_params, b.fia_workspace, c.out, c.lse);
      return;
    case CallKind::FiaV2:
      ops::fused_infer_attention_score_v2_out(c.fia2, c.fia2_params, b.fia_workspace, c.out, c.lse);
      return;
    case CallKind::PagedAttention:
      ops::paged_attention(c.pa, c.out, b.pa_workspace);
      return;
    case CallKind::Prepare:
      c.prepare();
      return;
  }
}

void GraphParams::capture_call(CapturedCall&& call) {
  Bucket& b = open_bucket();
  if (call.kind == CallKind::KvWrite || call.kind == CallKind::Prepare) {
    // No host parameters: the device graph captures it as a plain kernel; the
    // CPU provider keeps it to replay it.
    if (!provider_->replays_recorded_calls()) launch(call, b);
    b.calls.push_back(std::move(call));
    return;
  }
  if (call.kind == CallKind::PagedAttention) {
    pa_workspace_for(call);
  } else {
    fia_workspace_for(call);
  }
  const int64_t rows = call.kind == CallKind::PagedAttention ? call.pa.query.size(0)
                       : call.kind == CallKind::FiaV2         ? call.fia2.query.size(0)
                                                              : call.fia.query.size(0);
  if (b.num_query_rows == 0) b.num_query_rows = rows;
  call.event = provider_->create_event();
  provider_->event_wait_and_reset(call.event);
  provider_->task_group_begin();
  try {
    if (!provider_->replays_recorded_calls()) launch(call, b);
  } catch (...) {
    provider_->task_group_end();
    throw;
  }
  call.task = provider_->task_group_end();
  b.calls.push_back(std::move(call));
}

StepParams step_params(const gqa::Metadata& md) {
  StepParams sp;
  sp.block_tables = md.block_tables;
  sp.seq_lens = md.seq_lens;
  sp.q_ends = md.actual_seq_lengths_q;
  sp.kv_lens = md.seq_lens_list;
  sp.num_reqs = md.num_kernel_reqs;
  sp.num_real_reqs = md.num_reqs;
  sp.num_kernel_tokens = md.num_kernel_tokens;
  sp.stamp = md.stamp;
  return sp;
}

namespace {

int64_t query_rows(const CapturedCall& c) {
  switch (c.kind) {
    case CallKind::PagedAttention: return c.pa.query.sizes()[0];
    case CallKind::FiaV2: return c.fia2.query.sizes()[0];
    case CallKind::Fia: return c.fia.query.sizes()[0];
    default: return 0;
  }
}

// The step must match what the call was captured for: TND kernels need the
// last cumulative query length to equal the query's rows; one-row-per-request
// kernels (paged attention, BNSD decode) need one one-token request per row.
void check_fits(const CapturedCall& c, const StepParams& sp, int64_t n) {
  if (c.kind == CallKind::Prepare && c.fits) c.fits(sp, n);
  if (c.kind == CallKind::KvWrite || c.kind == CallKind::Prepare) return;
  const int64_t rows = query_rows(c);
  const bool per_request = c.kind == CallKind::PagedAttention || !c.refresh_q_lens;
  if (per_request) {
    AAR_CHECK_ARG(sp.num_reqs == rows && sp.num_kernel_tokens == sp.num_reqs, "the batch has ", sp.num_real_reqs,
                  " requests (", sp.num_reqs, " with padding, ", sp.num_kernel_tokens, " tokens) but graph bucket ", n,
                  " was captured for ", rows,
                  " one-token requests: pad it with one-token dummies (uniform_decode_padding)");
  } else {
    AAR_CHECK_ARG(sp.num_kernel_tokens == rows, "the batch has ", sp.num_kernel_tokens,
                  " kernel tokens but graph bucket ", n, " attends ", rows,
                  " rows: pad the batch to the bucket (num_input_tokens=", n, ")");
  }
  AAR_CHECK_ARG(static_cast<int64_t>(sp.kv_lens.size()) == sp.num_reqs &&
                    (!c.refresh_q_lens || static_cast<int64_t>(sp.q_ends.size()) == sp.num_reqs),
                "step parameters are inconsistent: ", sp.num_reqs, " requests but ", sp.kv_lens.size(),
                " KV lengths and ", sp.q_ends.size(), " query ends");
}

// One call's refresh inside an update: rewrite its host parameters (`refresh`), re-issue it
// between the provider's task-update hooks (`launch`, NPU only) and record its event. If the
// refresh or the launch throws, the call keeps the previous step's parameters (the device task
// was not updated either) and its event is not recorded.
template <typename Refresh, typename Launch>
void refresh_or_restore(CapturedCall& c, Bucket& b, GraphProvider& provider, bool relaunch, Refresh&& refresh,
                        Launch&& launch) {
  // The host parameters a refresh rewrites, kept until the call's update has gone through.
  const ops::FiaTensors fia = c.fia;
  const ops::FiaParams fia_params = c.fia_params;
  const ops::FiaV2Tensors fia2 = c.fia2;
  const ops::FiaV2Params fia2_params = c.fia2_params;
  const ops::PagedAttentionArgs pa = c.pa;
  const at::Tensor pa_workspace = b.pa_workspace;
  auto restore = [&] {
    c.fia = fia, c.fia_params = fia_params, c.fia2 = fia2, c.fia2_params = fia2_params, c.pa = pa;
    b.pa_workspace = pa_workspace;
  };
  try {
    refresh();
  } catch (...) {
    restore();
    throw;
  }
  provider.task_update_begin(c.task);
  if (relaunch) {
    try {
      launch();
    } catch (...) {
      provider.task_update_end();  // the task update is closed on any error
      restore();
      throw;
    }
  }
  provider.task_update_end();
  provider.event_record(c.event);
}

}  // namespace

void GraphParams::refresh(CapturedCall& c, const StepParams& sp, Bucket& b, at::Tensor& pa_ws, bool& pa_ws_ready) {
  switch (c.kind) {
    case CallKind::KvWrite:
    case CallKind::Prepare:
      return;
    case CallKind::Fia:
      if (c.refresh_q_lens) c.fia_params.actual_seq_lengths = sp.q_ends;
      if (c.paged) {
        c.fia.block_table = sp.block_tables;
        c.fia_params.actual_seq_lengths_kv = sp.kv_lens;
      } else {
        c.fia_params.actual_seq_lengths_kv = sp.q_ends;
      }
      return;
    case CallKind::FiaV2:
      if (c.refresh_q_lens) c.fia2_params.actual_seq_qlen = sp.q_ends;
      if (c.paged) {
        c.fia2.block_table = sp.block_tables;
        c.fia2_params.actual_seq_kvlen = sp.kv_lens;
      } else {
        c.fia2_params.actual_seq_kvlen = sp.q_ends;
      }
      return;
    case CallKind::PagedAttention:
      c.pa.block_table = sp.block_tables;
      c.pa.context_lens = sp.seq_lens;
      // The workspace depends on the step's context lengths (spec 9.4); one
      // query serves every paged-attention call of the step.
      if (!pa_ws_ready) {
        pa_ws = ops::paged_attention_get_workspace(c.pa, c.out);
        pa_ws_ready = true;
      }
      b.pa_workspace = pa_ws;
      return;
  }
}

void GraphParams::update(int64_t n, const std::vector<StepParams>& groups) {
  AAR_CHECK_ARG(!capturing(), "update while a capture is open");
  AAR_CHECK_ARG(!groups.empty(), "update needs the metadata of at least one KV-cache group");
  Bucket& b = mutable_bucket(n);
  // Validate everything before the first hook: a rejected update leaves the
  // graph as it was.
  for (size_t g = 0; g < groups.size(); ++g) {
    if (!groups[g].stamp.current()) check_current(groups[g].stamp, ("metadata[" + std::to_string(g) + "]").c_str());
  }
  for (const CapturedCall& c : b.calls) {
    AAR_CHECK_ARG(c.group >= 0 && static_cast<size_t>(c.group) < groups.size(), "a call of layer ",
                  c.layer_index, " belongs to KV-cache group ", c.group, " but ", groups.size(),
                  " group metadata were given");
    check_fits(c, groups[c.group], n);
  }
  at::Tensor pa_ws;
  bool pa_ws_ready = false;
  const bool relaunch = !provider_->replays_recorded_calls();
  // From here an operator call (the paged-attention workspace query, an NPU relaunch) may fail:
  // the bucket counts as not updated until the loop completes (replay refuses it), and a call
  // whose refresh fails keeps the previous step's parameters (see the header).
  b.updated = false;
  for (CapturedCall& c : b.calls) {
    if (c.kind == CallKind::KvWrite || c.kind == CallKind::Prepare) continue;
    refresh_or_restore(c, b, *provider_, relaunch, [&] { refresh(c, groups[c.group], b, pa_ws, pa_ws_ready); },
                       [&] { launch(c, b); });
  }
  b.updated = true;
}

void GraphParams::update_draft(int64_t n, const std::vector<StepParams>& per_call) {
  AAR_CHECK_ARG(!capturing(), "update_draft while a capture is open");
  AAR_CHECK_ARG(!per_call.empty(), "update_draft needs at least one metadata");
  Bucket& b = mutable_bucket(n);
  // Validate everything before the first hook (as update does).
  for (size_t k = 0; k < per_call.size(); ++k) {
    if (!per_call[k].stamp.current()) check_current(per_call[k].stamp, ("metadata[" + std::to_string(k) + "]").c_str());
  }
  size_t i = 0;
  for (const CapturedCall& c : b.calls) {
    if (c.kind == CallKind::KvWrite || c.kind == CallKind::Prepare) continue;
    check_fits(c, per_call[i++ % per_call.size()], n);
  }
  at::Tensor pa_ws;
  bool pa_ws_ready = false;
  const bool relaunch = !provider_->replays_recorded_calls();
  b.updated = false;  // as update(): not updated until every call went through
  i = 0;
  for (CapturedCall& c : b.calls) {
    if (c.kind == CallKind::KvWrite || c.kind == CallKind::Prepare) continue;
    const StepParams& md = per_call[i++ % per_call.size()];
    // Each draft step has its own lengths: the PA workspace follows the metadata.
    if (c.kind == CallKind::PagedAttention) pa_ws_ready = false;
    refresh_or_restore(c, b, *provider_, relaunch, [&] { refresh(c, md, b, pa_ws, pa_ws_ready); },
                       [&] { launch(c, b); });
  }
  b.updated = true;
}

namespace {
thread_local ForwardScope* tl_forward = nullptr;

// Records `use` in the bucket of the capture open on this thread (none: nothing).
void note_exclusive_use(const std::shared_ptr<detail::ExclusiveUse>& use) {
  GraphParams* g = GraphParams::current();
  if (g == nullptr || !g->capturing()) return;
  auto& ex = g->open_bucket().exclusive;
  for (const auto& u : ex) {
    if (u == use) return;
  }
  ex.push_back(use);
}
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
    note_exclusive_use(use);
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
  // The last update must have completed: one that failed part way leaves every call's event
  // recorded by an earlier, unreplayed update looking fresh, with a mix of two steps' lists.
  AAR_CHECK_ARG(b.updated, "replay of bucket ", n, " before update: the last update did not complete (or the "
                "bucket was replayed since); update it with the step's metadata first");
  for (size_t i = 0; i < b.calls.size(); ++i) {
    const CapturedCall& c = b.calls[i];
    if (c.event != nullptr && rec != nullptr) {
      AAR_CHECK_ARG(rec->event_recorded(c.event), "replay of bucket ", n, " before update: call ", i, " (",
                    to_string(c.kind), ", layer ", c.layer_index, ") has no recorded update since the last replay");
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
  c10::InferenceMode guard;
  b.updated = false;  // a replay consumes the update, whether or not it completes
  for (CapturedCall& c : b.calls) {
    launch(c, b);
    if (c.event != nullptr && rec != nullptr) rec->reset_event(c.event);
  }
  b.updated = !has_params(b);  // see has_params()
}

void GraphParams::release(int64_t n) {
  AAR_CHECK_ARG(capturing_ != n, "cannot release bucket ", n, " while it is being captured");
  auto it = buckets_.find(n);
  if (it == buckets_.end()) return;
  for (CapturedCall& c : it->second.calls) {
    if (c.event != nullptr || c.task != nullptr) provider_->release(c.event, c.task);
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
