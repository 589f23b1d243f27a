// C ABI of graph mode: the parameter store over a recording (CPU), hook (NPU)
// or no-op provider; capture, per-step update from GQA or MLA metadata, replay.
#include <string>
#include <vector>

#include "ascend_attn_rt/gqa/graph.h"
#include "ascend_attn_rt/gqa/metadata.h"
#include "ascend_attn_rt/graph/graph_params.h"
#include "ascend_attn_rt/mla/graph.h"
#include "internal.h"

using aar::capi::guarded;
namespace capi = aar::capi;
namespace graph = aar::graph;

namespace {

graph::GraphHooks c_hooks(const aar_graph_hooks_t& h) {
  graph::GraphHooks g;
  void* u = h.user;
  if (h.create_event) g.create_event = [f = h.create_event, u] { return f(u); };
  if (h.event_wait_and_reset) g.event_wait_and_reset = [f = h.event_wait_and_reset, u](graph::Handle e) { f(u, e); };
  if (h.task_group_begin) g.task_group_begin = [f = h.task_group_begin, u] { f(u); };
  if (h.task_group_end) g.task_group_end = [f = h.task_group_end, u] { return f(u); };
  if (h.task_update_begin) g.task_update_begin = [f = h.task_update_begin, u](graph::Handle t) { f(u, t); };
  if (h.task_update_end) g.task_update_end = [f = h.task_update_end, u] { f(u); };
  if (h.event_record) g.event_record = [f = h.event_record, u](graph::Handle e) { f(u, e); };
  if (h.release) g.release = [f = h.release, u](graph::Handle e, graph::Handle t) { f(u, e, t); };
  return g;
}

std::vector<graph::StepParams> gqa_params(const aar_gqa_metadata_t* const* mds, size_t n, const char* name) {
  AAR_CHECK_ARG(mds != nullptr && n > 0, name, " must be a non-empty array, got ", mds ? "length 0" : "NULL");
  std::vector<graph::StepParams> out;
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    AAR_CHECK_ARG(mds[i] != nullptr, name, "[", i, "] is NULL");
    if (!capi::has_tag(mds[i], capi::Kind::GqaMetadata)) {
      capi::check_tag(mds[i], capi::Kind::GqaMetadata, (name + ("[" + std::to_string(i) + "]")).c_str());
    }
    out.push_back(aar::gqa::graph_step_params(*mds[i]->md));
  }
  return out;
}

}  // namespace

extern "C" {

void aar_graph_hooks_init(aar_graph_hooks_t* h) {
  if (h == nullptr) return;
  *h = aar_graph_hooks_t{};
  h->struct_size = sizeof(*h);
}

aar_status_t aar_graph_params_create(const char* provider, const aar_graph_hooks_t* hooks, int32_t use_max_workspace,
                                     aar_graph_params_t** out) {
  return guarded("aar_graph_params_create", [&] {
    capi::check_not_null(provider, "provider");
    capi::check_not_null(out, "out");
    const std::string p(provider);
    const auto policy = capi::flag(use_max_workspace, "use_max_workspace") ? graph::WorkspacePolicy::MaxOverLayers
                                                                           : graph::WorkspacePolicy::FirstWins;
    std::shared_ptr<graph::GraphProvider> gp;
    if (p == "hooks") {
      capi::check_struct(hooks, "hooks", "aar_graph_hooks_init");
      gp = std::make_shared<graph::HookGraphProvider>(c_hooks(*hooks));
    } else if (p == "recording" || p == "noop") {
      AAR_CHECK_ARG(hooks == nullptr, "hooks must be NULL for the '", p, "' provider (they are used by 'hooks' only)");
      if (p == "recording") {
        gp = std::make_shared<graph::RecordingGraphProvider>();
      } else {
        gp = std::make_shared<graph::HookGraphProvider>(graph::GraphHooks{});
      }
    } else {
      aar::throw_invalid("provider must be 'recording' (CPU), 'hooks' (NPU) or 'noop', got '", p, "'");
    }
    auto params = std::make_unique<graph::GraphParams>(gp, policy);
    aar_graph_params* h = capi::make<aar_graph_params>();
    h->g = params.release();
    *out = h;
  });
}

void aar_graph_params_destroy(aar_graph_params_t* g) {
  capi::destroy("aar_graph_params_destroy", g, "graph", [](aar_graph_params* h) {
    try {
      if (h->g->capturing()) h->g->abort_capture();
    } catch (...) {
      // Destroy never fails: a capture that cannot be aborted is dropped with the store.
    }
    delete h->g;
  });
}

aar_status_t aar_graph_begin_capture(aar_graph_params_t* g, int64_t num_tokens) {
  return guarded("aar_graph_begin_capture", [&] {
    graph::GraphParams& params = *capi::checked(g, "graph")->g;
    params.begin_capture(num_tokens);
  });
}

aar_status_t aar_graph_end_capture(aar_graph_params_t* g) {
  return guarded("aar_graph_end_capture", [&] {
    graph::GraphParams& params = *capi::checked(g, "graph")->g;
    params.end_capture();
  });
}

aar_status_t aar_graph_abort_capture(aar_graph_params_t* g) {
  return guarded("aar_graph_abort_capture", [&] {
    graph::GraphParams& params = *capi::checked(g, "graph")->g;
    params.abort_capture();
  });
}

aar_status_t aar_graph_update_gqa(aar_graph_params_t* g, int64_t num_tokens, const aar_gqa_metadata_t* const* groups,
                                  size_t num_groups) {
  return guarded("aar_graph_update_gqa", [&] {
    graph::GraphParams& params = *capi::checked(g, "graph")->g;
    params.update(num_tokens, gqa_params(groups, num_groups, "groups"));
  });
}

aar_status_t aar_graph_update_draft_gqa(aar_graph_params_t* g, int64_t num_tokens,
                                        const aar_gqa_metadata_t* const* per_call, size_t num_calls) {
  return guarded("aar_graph_update_draft_gqa", [&] {
    graph::GraphParams& params = *capi::checked(g, "graph")->g;
    params.update_draft(num_tokens, gqa_params(per_call, num_calls, "per_call"));
  });
}

aar_status_t aar_graph_update_mla(aar_graph_params_t* g, int64_t num_tokens, const aar_mla_metadata_t* md) {
  return guarded("aar_graph_update_mla", [&] {
    graph::GraphParams& params = *capi::checked(g, "graph")->g;
    const aar::mla::Metadata& m = *capi::unwrap(md, "metadata");
    params.update(num_tokens, std::vector<graph::StepParams>{aar::mla::graph_step_params(m)});
  });
}

aar_status_t aar_graph_replay(aar_graph_params_t* g, int64_t num_tokens) {
  return guarded("aar_graph_replay", [&] {
    graph::GraphParams& params = *capi::checked(g, "graph")->g;
    params.replay(num_tokens);
  });
}

aar_status_t aar_graph_has(const aar_graph_params_t* g, int64_t num_tokens, int32_t* out) {
  return guarded("aar_graph_has", [&] {
    graph::GraphParams& params = *capi::checked(g, "graph")->g;
    capi::check_not_null(out, "out");
    *out = params.has(num_tokens) ? 1 : 0;
  });
}

aar_status_t aar_graph_release(aar_graph_params_t* g, int64_t num_tokens) {
  return guarded("aar_graph_release", [&] {
    graph::GraphParams& params = *capi::checked(g, "graph")->g;
    params.release(num_tokens);
  });
}

}  // extern "C"
