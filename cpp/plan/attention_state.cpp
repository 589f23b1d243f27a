// Attention state selection (docs/design/gqa.md §2.1).
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
  const int32_t* const computed = in.num_computed_tokens.data();
  const int32_t* const sched = in.num_scheduled_tokens.data();
  const int32_t* const spec = in.num_spec_tokens.data();
  const bool has_spec = !in.num_spec_tokens.empty();
  // Branch-free passes (they vectorise: every step builder calls this once
  // per step over all its requests); the per-element checks below run only
  // when a pass has found a bad value, and name the first one.
  int32_t neg = 0;
  for (std::size_t i = 0; i < n; ++i) neg |= computed[i] | sched[i];
  if (has_spec) {
    for (std::size_t i = 0; i < n; ++i) {
      // sched - spec < 0 <=> spec > sched (both checked >= 0 by the sign bits).
      neg |= spec[i] | static_cast<int32_t>(static_cast<uint32_t>(sched[i]) - static_cast<uint32_t>(spec[i]));
    }
  }
  if (neg < 0) {
    for (std::size_t i = 0; i < n; ++i) {
      AAR_CHECK_ARG(computed[i] >= 0, "num_computed_tokens[", i, "]=", computed[i], " is negative");
      AAR_CHECK_ARG(sched[i] >= 0, "num_scheduled_tokens[", i, "]=", sched[i], " is negative");
      if (has_spec) {
        AAR_CHECK_ARG(spec[i] >= 0 && spec[i] <= sched[i], "num_spec_tokens[", i, "]=", spec[i],
                      " is out of range [0, num_scheduled_tokens[", i, "]=", sched[i], "]");
      }
    }
  }
  // docs/design/gqa.md §2.1's three flags (detail::state_from_flags), as OR-reductions over
  // the validated values: all computed == 0, all scheduled == 1, all
  // scheduled - spec == 1.
  int32_t any_computed = 0, sched_not_one = 0, valid_not_one = 0;
  for (std::size_t i = 0; i < n; ++i) {
    any_computed |= computed[i];
    sched_not_one |= sched[i] ^ 1;
  }
  if (has_spec) {
    for (std::size_t i = 0; i < n; ++i) valid_not_one |= (sched[i] - spec[i]) ^ 1;
  } else {
    valid_not_one = sched_not_one;
  }
  return detail::state_from_flags(n == 0, any_computed == 0, sched_not_one == 0, valid_not_one == 0,
                                  in.spec_method, in.chunked_prefill_enabled);
}

}  // namespace aar::plan
