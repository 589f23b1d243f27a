// The batch-level checks every step planner shares (plan/internal.h: check_step_batch).
#include <cstdint>

#include "ascend_attn_rt/errors.h"
#include "internal.h"

namespace aar::plan {

namespace detail {

StepTokens check_step_batch(CSpan<int32_t> qsl, std::size_t b, int32_t num_input_tokens, int32_t block_size,
                            int32_t block_table_stride, int32_t num_blocks, int32_t decode_threshold,
                            std::size_t num_spec_tokens, SpecMethod spec_method,
                            const std::optional<AttentionState>& state) {
  AAR_CHECK_ARG(qsl.size() == b + 1, "query_start_loc has ", qsl.size(), " entries, expected seq_lens.size()+1 = ",
                b + 1);
  AAR_CHECK_ARG(b <= static_cast<std::size_t>(INT32_MAX - 2), "batch of ", b, " requests is too large");
  validate_start_loc(qsl, "query_start_loc");
  StepTokens t;
  t.real = qsl[b];
  AAR_CHECK_ARG(num_input_tokens >= 0, "num_input_tokens=", num_input_tokens, " is negative");
  t.input = num_input_tokens == 0 ? t.real : num_input_tokens;
  AAR_CHECK_ARG(t.input >= t.real, "num_input_tokens=", num_input_tokens, " is smaller than query_start_loc[", b,
                "]=", t.real);
  AAR_CHECK_ARG(block_size > 0, "block_size=", block_size, " must be positive");
  AAR_CHECK_ARG(block_table_stride >= 0, "block_table_stride=", block_table_stride, " is negative");
  AAR_CHECK_ARG(num_blocks >= 0, "num_blocks=", num_blocks, " is negative");
  AAR_CHECK_ARG(static_cast<int64_t>(num_blocks) * block_size <= INT32_MAX, "num_blocks=", num_blocks,
                " x block_size=", block_size, " exceeds the int32 slot range");
  AAR_CHECK_ARG(decode_threshold >= 1 && decode_threshold <= 16, "decode_threshold=", decode_threshold,
                " is out of range [1, 16]");
  AAR_CHECK_ARG(num_spec_tokens == 0 || num_spec_tokens == b, "num_spec_tokens has ", num_spec_tokens,
                " entries, expected 0 or ", b);
  validate_spec_method(spec_method);
  if (state.has_value()) {
    const auto s = static_cast<int32_t>(*state);
    AAR_CHECK_ARG(s >= 0 && s <= 4, "state=", s, " is not an AttentionState");
  }
  return t;
}

void refuse_prefill_no_cache(CSpan<int32_t> qsl, CSpan<int32_t> seqs) {
  for (std::size_t i = 0; i < seqs.size(); ++i) {
    const int32_t q = qsl[i + 1] - qsl[i];
    AAR_CHECK_ARG(seqs[i] == q, "attn_state=PrefillNoCache was given, but request ", i, " has cached tokens (seq_lens[",
                  i, "]=", seqs[i], ", query length ", q, "): that state attends over the new tokens alone");
  }
  throw_invalid("attn_state=PrefillNoCache was given for a batch with cached tokens");
}

}  // namespace detail

}  // namespace aar::plan
