#pragma once
// Private to cpp/: checks every layer (impl) constructor shares. A NaN or infinite softmax scale or
// norm epsilon is accepted by every kernel and turns every output into NaN, so it is refused at
// construction, before any forward, with the argument's name.
#include <ATen/core/Tensor.h>

#include <cmath>
#include <cstdint>
#include <optional>

#include "ascend_attn_rt/errors.h"
#include "byte_span.h"

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

// A layer's output must not share memory with an input it reads (the kernels read the input while
// they write the output, in no promised order): refused by byte range within one storage, before
// anything is written.
inline void check_output_disjoint(const at::Tensor& output, const at::Tensor& input, const char* input_name) {
  detail::ByteSpan so, si;
  AAR_CHECK_ARG(!detail::spans_overlap(output, input, so, si), "output and ", input_name, " share memory (bytes [",
                so.first, ", ", so.last, ") and [", si.first, ", ", si.last, ") of one storage): the output must be a "
                "tensor of its own");
}

// A forward without metadata (vLLM's profiling run) zeroes the output, after the checks a forward
// makes of it against `like` (the query or the hidden states, named `like_name`): the same shape,
// dtype and device.
inline const at::Tensor& zero_profiling_output(const at::Tensor& output, const at::Tensor& like,
                                               const char* like_name) {
  AAR_CHECK_ARG(output.defined(), "output must be a tensor");
  AAR_CHECK_ARG(like.defined(), like_name, " must be a tensor");
  AAR_CHECK_ARG(output.sizes() == like.sizes() && output.scalar_type() == like.scalar_type() &&
                    output.device() == like.device(),
                "output must be a ", like.scalar_type(), " tensor of ", like_name, "'s shape ", like.sizes(), " on ",
                like.device(), ", got ", output.scalar_type(), " ", output.sizes(), " on ", output.device(),
                " (a forward without metadata, a profiling run, zeroes it)");
  output.zero_();
  return output;
}

// Bounds far above what any attention kernel takes (FIA's head dims stop at 512), so that the
// products of heads, head sizes and tokens a layer forms never overflow int64.
inline constexpr int64_t kMaxHeadCount = 1 << 16;
inline constexpr int64_t kMaxHeadSize = 1 << 16;

// The head layout of a GQA-family layer (GQA, C8, GQA DCP), checked and completed in place:
// num_heads and head_size in [1, 2^16], num_kv_heads 0 meaning num_heads, num_heads a multiple of
// num_kv_heads, a finite scale where 0 becomes 1/sqrt(head_size).
template <typename Config>
void resolve_head_layout(Config& c) {
  AAR_CHECK_ARG(c.num_heads > 0 && c.num_heads <= kMaxHeadCount, "num_heads must be in [1, ", kMaxHeadCount,
                "], got ", c.num_heads);
  AAR_CHECK_ARG(c.head_size > 0 && c.head_size <= kMaxHeadSize, "head_size must be in [1, ", kMaxHeadSize, "], got ",
                c.head_size);
  if (c.num_kv_heads == 0) c.num_kv_heads = c.num_heads;
  AAR_CHECK_ARG(c.num_kv_heads > 0, "num_kv_heads must be positive, got ", c.num_kv_heads);
  AAR_CHECK_ARG(c.num_heads % c.num_kv_heads == 0, "num_heads=", c.num_heads,
                " is not divisible by num_kv_heads=", c.num_kv_heads);
  check_softmax_scale(c.scale);
  if (c.scale == 0.0) c.scale = 1.0 / std::sqrt(static_cast<double>(c.head_size));
}

}  // namespace aar::internal
