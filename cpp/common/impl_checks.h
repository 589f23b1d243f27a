#pragma once
// Private to cpp/: checks every layer (impl) constructor shares. A NaN or infinite softmax scale or
// norm epsilon is accepted by every kernel and turns every output into NaN, so it is refused at
// construction, before any forward, with the argument's name.
#include <cmath>

#include "ascend_attn_rt/errors.h"

namespace aar::internal {

// The softmax scale of a layer: finite and >= 0, where 0 asks for the backend's default.
inline void check_softmax_scale(double scale, const char* name = "scale") {
  AAR_CHECK_ARG(std::isfinite(scale) && scale >= 0.0, name,
                " must be finite and >= 0 (0: the backend's default 1/sqrt(head dim)), got ", scale);
}

// An RMSNorm / LayerNorm epsilon: finite and >= 0.
inline void check_norm_eps(double eps, const char* name) {
  AAR_CHECK_ARG(std::isfinite(eps) && eps >= 0.0, name, " must be finite and >= 0, got ", eps);
}

}  // namespace aar::internal
