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

BackendRegistrar::BackendRegistrar(BackendFacts (*facts)()) {
  BackendFacts f = facts();
  for (const BackendFacts& g : registry()) {
    AAR_CHECK_ARG(g.id != f.id, "backend \"", f.id, "\" is registered twice");
  }
  registry().push_back(std::move(f));
}

}  // namespace aar::core
