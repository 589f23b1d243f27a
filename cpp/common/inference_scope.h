// Internal: a c10::InferenceMode scope that is taken only when the calling
// thread is not in inference mode already. Engines run their steps under
// inference mode, where a nested guard only rewrites the same thread-local
// state (two TLS round trips and the dispatch-key update, about 350
// instructions on this machine's libtorch); the check is one TLS read.
// Inside inference mode the autograd keys are already excluded, so the ops
// run in the scope behave the same either way.
#pragma once

#include <c10/core/InferenceMode.h>

#include <optional>

namespace aar::detail {

class InferenceScope {
 public:
  InferenceScope() {
    if (!c10::InferenceMode::is_enabled()) guard_.emplace();
  }
  InferenceScope(const InferenceScope&) = delete;
  InferenceScope& operator=(const InferenceScope&) = delete;

 private:
  std::optional<c10::InferenceMode> guard_;
};

}  // namespace aar::detail
