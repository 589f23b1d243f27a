#include <string>
#include <vector>

#include "ascend_attn_rt/plan/attention_state.h"
#include "test_plan_util.h"

using namespace aar::plan;

namespace {

AttentionState sel(const std::vector<int32_t>& computed, const std::vector<int32_t>& sched,
                   const std::vector<int32_t>& spec = {}, SpecMethod m = SpecMethod::None, bool chunked = true) {
  StateInputs in;
  in.num_computed_tokens = computed;
  in.num_scheduled_tokens = sched;
  in.num_spec_tokens = spec;
  in.spec_method = m;
  in.chunked_prefill_enabled = chunked;
  return select_attention_state(in);
}

}  // namespace

TEST(PlanState, EnumValuesMatchSpec) {
  EXPECT_EQ(static_cast<int>(AttentionState::PrefillNoCache), 0);
  EXPECT_EQ(static_cast<int>(AttentionState::PrefillCacheHit), 1);
  EXPECT_EQ(static_cast<int>(AttentionState::DecodeOnly), 2);
  EXPECT_EQ(static_cast<int>(AttentionState::ChunkedPrefill), 3);
  EXPECT_EQ(static_cast<int>(AttentionState::SpecDecoding), 4);
  EXPECT_STREQ(to_string(AttentionState::PrefillCacheHit), "PrefillCacheHit");
  EXPECT_STREQ(to_string(AttentionState::SpecDecoding), "SpecDecoding");
  EXPECT_STREQ(to_string(static_cast<AttentionState>(42)), "Unknown");
}

TEST(PlanState, EmptyBatchIsDecodeOnly) {
  EXPECT_EQ(sel({}, {}), AttentionState::DecodeOnly);
  EXPECT_EQ(sel({}, {}, {}, SpecMethod::Mtp, false), AttentionState::DecodeOnly);
}

TEST(PlanState, Row1AllFreshIsPrefillNoCache) {
  EXPECT_EQ(sel({0, 0}, {5, 7}), AttentionState::PrefillNoCache);
  // Row 1 wins over row 2 (all scheduled == 1) and over MTP.
  EXPECT_EQ(sel({0, 0}, {1, 1}, {}, SpecMethod::Mtp), AttentionState::PrefillNoCache);
  // A prefix-cache hit has computed > 0, so it is not PrefillNoCache.
  EXPECT_EQ(sel({0, 16}, {5, 7}, {}, SpecMethod::None, false), AttentionState::PrefillCacheHit);
}

TEST(PlanState, Row2AllOneScheduled) {
  EXPECT_EQ(sel({3, 9}, {1, 1}), AttentionState::DecodeOnly);
  EXPECT_EQ(sel({3, 9}, {1, 1}, {}, SpecMethod::Mtp), AttentionState::SpecDecoding);
  EXPECT_EQ(sel({3, 9}, {1, 1}, {}, SpecMethod::Other), AttentionState::DecodeOnly);
  EXPECT_EQ(sel({3, 0}, {1, 1}), AttentionState::DecodeOnly);  // one fresh is not "all fresh"
}

TEST(PlanState, Row3AllValidOneAndPostRule) {
  // 3 scheduled of which 2 are drafts: valid == 1.
  EXPECT_EQ(sel({5, 6}, {3, 3}, {2, 2}, SpecMethod::Mtp), AttentionState::SpecDecoding);
  // Non-MTP speculative method: SpecDecoding rewritten to ChunkedPrefill (post-rule).
  EXPECT_EQ(sel({5, 6}, {3, 3}, {2, 2}, SpecMethod::Other), AttentionState::ChunkedPrefill);
  EXPECT_EQ(sel({5, 6}, {3, 3}, {2, 2}, SpecMethod::Other, false), AttentionState::ChunkedPrefill);
  // No speculative config: row 3 gives ChunkedPrefill even with chunked prefill disabled.
  EXPECT_EQ(sel({5, 6}, {3, 3}, {2, 2}, SpecMethod::None, false), AttentionState::ChunkedPrefill);
}

TEST(PlanState, Rows4And5) {
  EXPECT_EQ(sel({5, 6}, {1, 4}), AttentionState::ChunkedPrefill);
  EXPECT_EQ(sel({5, 6}, {1, 4}, {}, SpecMethod::None, false), AttentionState::PrefillCacheHit);
  EXPECT_EQ(sel({5, 6}, {3, 4}, {2, 2}, SpecMethod::Mtp, false), AttentionState::PrefillCacheHit);
  EXPECT_EQ(sel({5, 6}, {3, 4}, {2, 2}, SpecMethod::Mtp, true), AttentionState::ChunkedPrefill);
}

TEST(PlanState, Errors) {
  EXPECT_INVALID(sel({1}, {1, 1}), "num_computed_tokens");
  EXPECT_INVALID(sel({1, 1}, {1, 1}, {0}), "num_spec_tokens");
  EXPECT_INVALID(sel({1, -2}, {1, 1}), "num_computed_tokens[1]=-2");
  EXPECT_INVALID(sel({1, 2}, {1, -1}), "num_scheduled_tokens[1]=-1");
  EXPECT_INVALID(sel({1, 2}, {1, 2}, {0, 3}), "num_spec_tokens[1]=3");
  EXPECT_INVALID(sel({1, 2}, {1, 2}, {-1, 0}), "num_spec_tokens[0]=-1");
  EXPECT_INVALID(sel({1}, {1}, {}, static_cast<SpecMethod>(7)), "spec_method=7");
}
