#include "ascend_attn_rt/core/step.h"

#include <sstream>

#include "../common/builder_checks.h"
#include "ascend_attn_rt/errors.h"

namespace aar::core {

void check_capacities(const Capacities& c) {
  AAR_CHECK_ARG(c.max_num_reqs > 0, "max_num_reqs must be positive, got ", c.max_num_reqs);
  AAR_CHECK_ARG(c.max_num_tokens > 0, "max_num_tokens must be positive, got ", c.max_num_tokens);
  // Staging regions are sized from these: the bounds every builder takes (builder_checks.h).
  AAR_CHECK_ARG(c.max_num_reqs <= internal::kMaxBuilderReqs, "max_num_reqs=", c.max_num_reqs, " exceeds ",
                internal::kMaxBuilderReqs);
  AAR_CHECK_ARG(c.max_num_tokens <= internal::kMaxBuilderTokens, "max_num_tokens=", c.max_num_tokens, " exceeds ",
                internal::kMaxBuilderTokens);
  AAR_CHECK_ARG(c.num_speculative_tokens >= 0 && c.num_speculative_tokens <= 15,
                "num_speculative_tokens must be in [0, 15] (decode threshold 1 + n <= 16, the FIA TND limit), got ",
                c.num_speculative_tokens);
}

void check_geometry(const BlockGeometry& g, const int32_t* sizes, int n) {
  AAR_CHECK_ARG(g.max_blocks_per_req > 0, "max_blocks_per_req must be positive, got ", g.max_blocks_per_req);
  bool ok = n == 0 ? g.block_size > 0 : false;
  std::ostringstream list;
  for (int i = 0; i < n; ++i) {
    ok = ok || sizes[i] == g.block_size;
    list << (i ? ", " : "") << sizes[i];
  }
  AAR_CHECK_ARG(ok, "block_size ", g.block_size, " is not supported",
                n > 0 ? " (supported: " + list.str() + ")" : std::string(" (must be positive)"));
  AAR_CHECK_ARG(g.num_blocks > 0, "num_blocks must be positive, got ", g.num_blocks);
}

void check_staging(const StagingConfig& s) {
  AAR_CHECK_ARG(s.staging_buffers >= 1 && s.staging_buffers <= 4, "staging_buffers must be in [1, 4], got ",
                s.staging_buffers);
}

void check_step_fits(const StepInput& in, const Capacities& c, int32_t max_blocks_per_req, int64_t reqs_capacity) {
  const int64_t cap = reqs_capacity >= 0 ? reqs_capacity : c.max_num_reqs;
  AAR_CHECK_ARG(static_cast<int64_t>(in.seq_lens.size()) <= cap, "num_reqs=", in.seq_lens.size(),
                " (seq_lens entries) exceeds the builder's ",
                reqs_capacity >= 0 ? "request capacity " : "max_num_reqs=", cap);
  const int64_t tokens = in.num_input_tokens > 0 ? in.num_input_tokens
                                                 : (in.query_start_loc.empty() ? 0 : in.query_start_loc.back());
  AAR_CHECK_ARG(tokens <= c.max_num_tokens, "num_tokens=", tokens,
                " (query_start_loc[-1] or num_input_tokens) exceeds the builder's max_num_tokens=", c.max_num_tokens);
  if (max_blocks_per_req >= 0) {
    AAR_CHECK_ARG(in.block_table_stride <= max_blocks_per_req, "block_table has ", in.block_table_stride,
                  " columns, more than the builder's max_blocks_per_req=", max_blocks_per_req);
  }
}

void refuse_unread(const StepInput& in, uint32_t unread, const char* who) {
  const auto given = [&](uint32_t f, bool is_given, const char* name) {
    AAR_CHECK_ARG(!((unread & f) && is_given), name, " was given, but ", who, " does not read it");
  };
  given(kAttnState, in.attn_state.has_value(), "attn_state");
  given(kNumSpecTokens, !in.num_spec_tokens.empty(), "num_spec_tokens");
  given(kIsPrefilling, !in.is_prefilling.empty(), "is_prefilling");
  given(kReqIds, !in.req_ids.empty(), "req_ids");
  given(kBlockTable, !in.block_table.empty() || in.block_table_stride != 0, "block_table");
  given(kNumInputTokens, in.num_input_tokens != 0, "num_input_tokens");
}

}  // namespace aar::core
