#pragma once
// Private to cpp/: the c10::InferenceMode scope of ops/inference_mode.h, taken only
// when the calling thread is not in inference mode already. Engines run their steps
// under inference mode, where a nested guard would only rewrite the same thread-local
// state (two TLS round trips and the dispatch-key update, about 350 instructions with
// this libtorch); the check is one TLS read. Inside inference mode the autograd keys
// are already excluded, so the operators behave the same either way.
#include <c10/core/InferenceMode.h>

#include <optional>

namespace aar::ops::detail {

void count_inference_mode_entry() noexcept;  // the testing counter (ops/inference_mode.h)

class InferenceScope {
 public:
  InferenceScope() {
    if (__builtin_expect(!c10::InferenceMode::is_enabled(), 0)) {
      guard_.emplace();
      count_inference_mode_entry();
    }
  }
  InferenceScope(const InferenceScope&) = delete;
  InferenceScope& operator=(const InferenceScope&) = delete;

 private:
  std::optional<c10::InferenceMode> guard_;
};

}  // namespace aar::ops::detail
