// Attention state selection (spec gqa.md 2.1).
#include "ascend_attn_rt/plan/attention_state.h"

#include "ascend_attn_rt/errors.h"
#include "internal.h"

namespace aar::plan {

const char* to_string(AttentionState s) {
  switch (s) {
    case AttentionState::PrefillNoCache: return "PrefillNoCache";
    case AttentionState::PrefillCacheHit: return "PrefillCacheHit";
    case AttentionState::DecodeOnly: return "DecodeOnly";
    case AttentionState::ChunkedPrefill: return "ChunkedPrefill";
    case AttentionState::SpecDecoding: return "SpecDecoding";
  }
  return "Unknown";
}

namespace detail {
void validate_spec_method(SpecMethod m) {
  const auto v = static_cast<int32_t>(m);
  AAR_CHECK_ARG(v >= 0 && v <= 2, "spec_method=", v, " is not a SpecMethod (None=0, Mtp=1, Other=2)");
}
}  // namespace detail

AttentionState select_attention_state(const StateInputs& in) {
  const std::size_t n = in.num_scheduled_tokens.size();
  AAR_CHECK_ARG(in.num_computed_tokens.size() == n, "num_computed_tokens has ", in.num_computed_tokens.size(),
                " entries but num_scheduled_tokens has ", n);
  AAR_CHECK_ARG(in.num_spec_tokens.empty() || in.num_spec_tokens.size() == n, "num_spec_tokens has ",
                in.num_spec_tokens.size(), " entries, expected 0 or ", n, " (one per request)");
  detail::validate_spec_method(in.spec_method);
  for (std::size_t i = 0; i < n; ++i) {
    AAR_CHECK_ARG(in.num_computed_tokens[i] >= 0, "num_computed_tokens[", i, "]=", in.num_computed_tokens[i],
                  " is negative");
    AAR_CHECK_ARG(in.num_scheduled_tokens[i] >= 0, "num_scheduled_tokens[", i, "]=",
                  in.num_scheduled_tokens[i], " is negative");
    if (!in.num_spec_tokens.empty()) {
      const int32_t sp = in.num_spec_tokens[i];
      AAR_CHECK_ARG(sp >= 0 && sp <= in.num_scheduled_tokens[i], "num_spec_tokens[", i, "]=", sp,
                    " is out of range [0, num_scheduled_tokens[", i, "]=", in.num_scheduled_tokens[i], "]");
    }
  }
  const bool has_spec = !in.num_spec_tokens.empty();
  return detail::select_state_rule(
      n, [&](std::size_t i) { return in.num_computed_tokens[i]; },
      [&](std::size_t i) { return in.num_scheduled_tokens[i]; },
      [&](std::size_t i) { return has_spec ? in.num_spec_tokens[i] : 0; }, in.spec_method,
      in.chunked_prefill_enabled);
}

}  // namespace aar::plan
