#include "ascend_attn_rt/core/backend.h"

#include <mutex>

#include "ascend_attn_rt/errors.h"

namespace aar::core {

namespace {
std::vector<BackendFacts>& registry() {
  static std::vector<BackendFacts> r;
  return r;
}
}  // namespace

const std::vector<BackendFacts>& registered_backends() { return registry(); }

const BackendFacts& backend_facts(const std::string& id) {
  std::string known;
  for (const BackendFacts& f : registry()) {
    if (f.id == id) return f;
    known += (known.empty() ? "" : ", ") + f.id;
  }
  AAR_CHECK_ARG(false, "no backend \"", id, "\" is registered (registered: ", known, ")");
  throw;  // unreachable
}

void check_capturable(const BackendFacts& facts, plan::AttentionState state, const char* who) {
  if (has_state(facts.capturable, state)) return;
  std::string can;
  for (int32_t i = 0; i <= static_cast<int32_t>(plan::AttentionState::SpecDecoding); ++i) {
    const auto s = static_cast<plan::AttentionState>(i);
    if (has_state(facts.capturable, s)) can += (can.empty() ? "" : ", ") + std::string(plan::to_string(s));
  }
  throw_not_supported(who, ": attention state ", plan::to_string(state), " cannot be captured by the ", facts.id,
                      " backend (", can.empty() ? std::string("it captures no state") : "only " + can, ")");
}

void check_draft_index(int32_t draft_index) {
  AAR_CHECK_ARG(draft_index >= 0, "draft_index must be >= 0, got ", draft_index);
}

BackendRegistrar::BackendRegistrar(BackendFacts (*facts)()) {
  BackendFacts f = facts();
  for (const BackendFacts& g : registry()) {
    AAR_CHECK_ARG(g.id != f.id, "backend \"", f.id, "\" is registered twice");
  }
  registry().push_back(std::move(f));
}

}  // namespace aar::core
