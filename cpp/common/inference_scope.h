#pragma once
// Internal: the runtime's inference-mode scope (ops/inference_mode.h), under the name
// the backends use.
#include "../ops/inference_scope.h"

namespace aar::detail {

using InferenceScope = ops::detail::InferenceScope;

}  // namespace aar::detail
