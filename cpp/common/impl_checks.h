#pragma once
// Private to cpp/: checks the layers (impls) share. At construction: a NaN or infinite softmax scale
// or norm epsilon is accepted by every kernel and turns every output into NaN, so it is refused
// before any forward, with the argument's name; head counts and sizes are bounded. In forward,
// before the first write: memory shared between the output, the inputs, the caches and the top-k
// buffer (docs/design/core.md §5), and the output a forward without metadata zeroes.
#include <ATen/core/Tensor.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

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

// `a` and `b` must not share memory (byte_span.h: views of one storage, or two tensors over the same
// bytes): refused naming both, with `why`, before anything is written.
inline void check_apart(const at::Tensor& a, const char* a_name, const at::Tensor& b, const char* b_name,
                        const char* why) {
  detail::ByteSpan sa, sb;
  if (!detail::spans_overlap(a, b, sa, sb)) [[likely]] return;
  throw_invalid(a_name, " and ", b_name, " share memory (their bytes [0, ", sa.last - sa.first, ") and [",
                static_cast<int64_t>(sb.first - sa.first), ", ", static_cast<int64_t>(sb.last - sa.first),
                ") from the first's start overlap): ", why);
}

// Why a layer's caches must not share memory: the second write would overwrite the first.
inline constexpr const char* kCachesApartWhy = "a layer's caches must be separate tensors or disjoint views";

// A layer's output must not share memory with an input it reads (the kernels read the input while
// they write the output, in no promised order).
inline void check_output_disjoint(const at::Tensor& output, const at::Tensor& input, const char* input_name) {
  check_apart(output, "output", input, input_name, "the output must be a tensor of its own");
}

// check_output_disjoint for several inputs, the output's storage range read once.
class OutputApart {
 public:
  explicit OutputApart(const at::Tensor& output) : out_(output), range_(detail::storage_range(output)) {}
  void check(const at::Tensor& input, const char* input_name) const {
    if (detail::ranges_meet(range_, detail::storage_range(input))) [[unlikely]] {
      check_output_disjoint(out_, input, input_name);
    }
  }

 private:
  const at::Tensor& out_;
  detail::MemRange range_;
};

// The tensors of a layer's cache tuple (`name` "kv_cache"), and the layer's output, must not share
// memory: each pair is checked (a tuple holds at most seven), named as "kv_cache[i]". Pairs of
// entries whose bits are both set in `may_share` are not compared: caches of different KV-cache
// groups, which vLLM's allocator may place in one tensor (their block ids never meet), and views
// interleaved in one page by design (docs/design/core.md §5). Entries whose bits are clear in `used`
// are placeholders the layer neither reads nor writes, and are not compared at all. With a model's
// `topk_buffer` (the sparse layers' TopkBuffer, which later layers read), the buffer must be apart
// from the output, the hidden states and every used entry.
struct TupleApart {
  const char* name = "kv_cache";
  uint32_t may_share = 0;
  uint32_t used = ~0u;
  const at::Tensor* topk_buffer = nullptr;
  const at::Tensor* hidden = nullptr;
  const char* hidden_name = "hidden_states";
};

inline void check_tuple_disjoint(const std::vector<at::Tensor>& kv, const at::Tensor& output, const TupleApart& o) {
  // Storage ranges first, each read once, no names: names are made only for a pair whose storages meet.
  constexpr size_t kMax = 8;
  std::array<detail::MemRange, kMax> r{};
  const size_t n = std::min(kv.size(), kMax);
  const detail::MemRange ro = detail::storage_range(output);
  const detail::MemRange rt = o.topk_buffer != nullptr ? detail::storage_range(*o.topk_buffer) : detail::MemRange{};
  constexpr const char* kTopkWhy = "the top-k buffer holds the selection later layers read";
  auto entry = [&](size_t i) { return std::string(o.name) + "[" + std::to_string(i) + "]"; };
  if (o.topk_buffer != nullptr) {
    if (detail::ranges_meet(rt, ro)) [[unlikely]] check_apart(*o.topk_buffer, "the top-k buffer", output, "output", kTopkWhy);
    if (o.hidden != nullptr && detail::ranges_meet(rt, detail::storage_range(*o.hidden))) [[unlikely]] {
      check_apart(*o.topk_buffer, "the top-k buffer", *o.hidden, o.hidden_name, kTopkWhy);
    }
  }
  for (size_t i = 0; i < n; ++i) {
    if (!(o.used >> i & 1u)) continue;
    r[i] = detail::storage_range(kv[i]);
    if (detail::ranges_meet(ro, r[i])) [[unlikely]] check_output_disjoint(output, kv[i], entry(i).c_str());
    if (detail::ranges_meet(rt, r[i])) [[unlikely]] {
      check_apart(*o.topk_buffer, "the top-k buffer", kv[i], entry(i).c_str(), kTopkWhy);
    }
    for (size_t j = 0; j < i; ++j) {
      if (!(o.used >> j & 1u) || ((o.may_share >> i & 1u) && (o.may_share >> j & 1u))) continue;
      if (detail::ranges_meet(r[j], r[i])) [[unlikely]] {
        check_apart(kv[j], entry(j).c_str(), kv[i], entry(i).c_str(), kCachesApartWhy);
      }
    }
  }
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

// The bound on a layer's head counts, head sizes and model dims (hidden size, LoRA ranks, top-k):
// far above what any attention kernel takes (FIA's head dims stop at 512), so that the products of
// them and of tokens a layer forms never overflow int64.
inline constexpr int64_t kMaxModelDim = 1 << 16;
inline bool dim_in_range(int64_t v) { return v > 0 && v <= kMaxModelDim; }

// The head layout of a GQA-family layer (GQA, C8, GQA DCP), checked and completed in place:
// num_heads and head_size in [1, 2^16], num_kv_heads 0 meaning num_heads, num_heads a multiple of
// num_kv_heads, a finite scale where 0 becomes 1/sqrt(head_size).
template <typename Config>
void resolve_head_layout(Config& c) {
  AAR_CHECK_ARG(dim_in_range(c.num_heads), "num_heads must be in [1, ", kMaxModelDim, "], got ", c.num_heads);
  AAR_CHECK_ARG(dim_in_range(c.head_size), "head_size must be in [1, ", kMaxModelDim, "], got ", c.head_size);
  if (c.num_kv_heads == 0) c.num_kv_heads = c.num_heads;
  AAR_CHECK_ARG(c.num_kv_heads > 0, "num_kv_heads must be positive, got ", c.num_kv_heads);
  AAR_CHECK_ARG(c.num_heads % c.num_kv_heads == 0, "num_heads=", c.num_heads,
                " is not divisible by num_kv_heads=", c.num_kv_heads);
  check_softmax_scale(c.scale);
  if (c.scale == 0.0) c.scale = 1.0 / std::sqrt(static_cast<double>(c.head_size));
}

}  // namespace aar::internal
