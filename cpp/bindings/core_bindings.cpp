// aar.backends(): the registered backends' declared facts (core/backend.h).
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "ascend_attn_rt/core/backend.h"
#include "common.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace aar::bindings {
namespace {

nb::dict facts_dict(const core::BackendFacts& f) {
  nb::dict d;
  d["id"] = f.id;
  d["name"] = f.name;
  d["block_sizes"] = f.block_sizes;
  nb::list dtypes;
  for (c10::ScalarType t : f.dtypes) dtypes.append(std::string(c10::toString(t)));
  d["dtypes"] = dtypes;
  d["kv_caches"] = f.kv_caches;
  nb::list states;
  for (int s = 0; s <= 4; ++s) {
    const auto st = static_cast<plan::AttentionState>(s);
    if (core::has_state(f.capturable, st)) states.append(std::string(plan::to_string(st)));
  }
  d["capturable"] = states;
  d["draft_lanes"] = f.draft_lanes;
  d["context_parallel"] = f.context_parallel;
  d["builder"] = f.builder;
  return d;
}

void bind_core(nb::module_& m) {
  m.def(
      "backends",
      [] {
        nb::list out;
        for (const core::BackendFacts& f : core::registered_backends()) out.append(facts_dict(f));
        return out;
      },
      "The registered backends' declared facts (core/backend.h): id, name, block_sizes, dtypes, kv_caches, "
      "capturable (attention states build_for_graph_capture takes), draft_lanes, context_parallel.");
  m.def(
      "backend_facts", [](const std::string& id) { return facts_dict(core::backend_facts(id)); }, "id"_a,
      "One registered backend's facts; ValueError naming the registered ids for an unknown one.");
}

const BindingRegistrar kRegisterCore(/*order=*/5, &bind_core);

}  // namespace
}  // namespace aar::bindings
