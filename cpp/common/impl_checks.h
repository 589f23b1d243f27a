#pragma once
// Private to cpp/: checks every layer (impl) constructor shares. A NaN or infinite softmax scale or
// norm epsilon is accepted by every kernel and turns every output into NaN, so it is refused at
// construction, before any forward, with the argument's name.
#include <cmath>
#include <optional>

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

// vLLM's logits_soft_cap: None or 0 is no soft-cap; a positive cap is a feature the fused
// kernels lack (refused by name, `who` naming the backend); NaN or negative is an error.
inline void check_logits_soft_cap(const std::optional<double>& cap, const char* who) {
  if (!cap.has_value()) return;
  AAR_CHECK_ARG(std::isfinite(*cap) && *cap >= 0.0, "logits_soft_cap must be None, 0 (none) or positive, got ", *cap);
  if (*cap > 0.0) throw_not_supported("logits soft-cap (logits_soft_cap=", *cap, ") is not supported by ", who);
}

// The head layout of a GQA-family layer (GQA, C8, GQA DCP), checked and completed in place:
// positive num_heads and head_size, num_kv_heads 0 meaning num_heads, num_heads a multiple of
// num_kv_heads, a finite scale where 0 becomes 1/sqrt(head_size).
template <typename Config>
void resolve_head_layout(Config& c) {
  AAR_CHECK_ARG(c.num_heads > 0, "num_heads must be positive, got ", c.num_heads);
  AAR_CHECK_ARG(c.head_size > 0, "head_size must be positive, got ", c.head_size);
  if (c.num_kv_heads == 0) c.num_kv_heads = c.num_heads;
  AAR_CHECK_ARG(c.num_kv_heads > 0, "num_kv_heads must be positive, got ", c.num_kv_heads);
  AAR_CHECK_ARG(c.num_heads % c.num_kv_heads == 0, "num_heads=", c.num_heads,
                " is not divisible by num_kv_heads=", c.num_kv_heads);
  check_softmax_scale(c.scale);
  if (c.scale == 0.0) c.scale = 1.0 / std::sqrt(static_cast<double>(c.head_size));
}

}  // namespace aar::internal
