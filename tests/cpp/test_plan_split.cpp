#include <vector>

#include "ascend_attn_rt/plan/split.h"
#include "test_plan_util.h"

using namespace aar::plan;
using aar_test::lens_to_qsl;

namespace {

struct Args {
  std::vector<int32_t> qsl;
  int32_t num_actual_tokens = -1;  // -1: qsl.back()
  int32_t max_query_len = -1;      // -1: computed from qsl
  int32_t threshold = 1;
  bool require_uniform = false;
  bool treat = true;
  std::vector<uint8_t> is_prefilling;
};

SplitResult run(const Args& a) {
  SplitInputs in;
  in.query_start_loc = a.qsl;
  in.num_actual_tokens = a.num_actual_tokens >= 0 ? a.num_actual_tokens : (a.qsl.empty() ? 0 : a.qsl.back());
  int32_t mq = 0;
  for (std::size_t i = 0; i + 1 < a.qsl.size(); ++i) mq = std::max(mq, a.qsl[i + 1] - a.qsl[i]);
  in.max_query_len = a.max_query_len >= 0 ? a.max_query_len : mq;
  in.decode_threshold = a.threshold;
  in.require_uniform = a.require_uniform;
  in.treat_short_extends_as_decodes = a.treat;
  in.is_prefilling = a.is_prefilling;
  return split_decodes_and_prefills(in);
}

SplitResult R(int32_t d, int32_t p, int32_t dt, int32_t pt) { return SplitResult{d, p, dt, pt}; }

}  // namespace

TEST(PlanSplit, UpstreamPcpVector) {
  // docs/design/gqa.md §2.2: qsl=[0,1,5], max_q=4, threshold 1, is_prefilling=[T,T], treat=false -> (0,2,0,5)
  Args a;
  a.qsl = {0, 1, 5};
  a.max_query_len = 4;
  a.treat = false;
  a.is_prefilling = {1, 1};
  EXPECT_EQ(run(a), R(0, 2, 0, 5));
  // Same batch with short extends treated as decodes: request 0 decodes.
  a.treat = true;
  EXPECT_EQ(run(a), R(1, 1, 1, 4));
}

TEST(PlanSplit, EmptyBatch) {
  Args a;
  EXPECT_EQ(run(a), R(0, 0, 0, 0));
  a.qsl = {0};
  EXPECT_EQ(run(a), R(0, 0, 0, 0));
  a.treat = false;  // is_prefilling is not needed for an empty batch
  EXPECT_EQ(run(a), R(0, 0, 0, 0));
}

TEST(PlanSplit, SingleRequest) {
  Args a;
  a.qsl = {0, 1};
  EXPECT_EQ(run(a), R(1, 0, 1, 0));
  a.qsl = {0, 7};
  EXPECT_EQ(run(a), R(0, 1, 0, 7));
}

TEST(PlanSplit, AllDecodeAndAllPrefill) {
  Args a;
  a.qsl = lens_to_qsl({1, 1, 1, 1});
  EXPECT_EQ(run(a), R(4, 0, 4, 0));
  a.qsl = lens_to_qsl({4, 4, 4});
  a.threshold = 4;  // spec decode: 1 + 3 draft tokens
  EXPECT_EQ(run(a), R(3, 0, 12, 0));
  a.qsl = lens_to_qsl({9, 3, 17});
  a.threshold = 1;
  EXPECT_EQ(run(a), R(0, 3, 0, 29));
}

TEST(PlanSplit, MixedBatch) {
  Args a;
  a.qsl = lens_to_qsl({1, 1, 10, 5});
  EXPECT_EQ(run(a), R(2, 2, 2, 15));
  a.qsl = lens_to_qsl({2, 3, 1, 10});
  a.threshold = 3;
  EXPECT_EQ(run(a), R(3, 1, 6, 10));
}

TEST(PlanSplit, FirstRequestPrefillShortcut) {
  // Step 7: a prefill in front makes everything a prefill, even decodes behind it.
  Args a;
  a.qsl = lens_to_qsl({5, 1, 1});
  EXPECT_EQ(run(a), R(0, 3, 0, 7));
  // ... and is_prefilling is not consulted there.
  a.treat = false;
  a.is_prefilling = {0, 0, 0};
  EXPECT_EQ(run(a), R(0, 3, 0, 7));
}

TEST(PlanSplit, FastPathTrustsMaxQueryLen) {
  // Step 5 uses the given max_query_len as-is (upstream behaviour).
  Args a;
  a.qsl = lens_to_qsl({1, 5});
  a.max_query_len = 1;
  EXPECT_EQ(run(a), R(2, 0, 6, 0));
}

TEST(PlanSplit, RequireUniform) {
  Args a;
  a.threshold = 4;
  a.require_uniform = true;
  a.qsl = lens_to_qsl({4, 4, 4, 4});
  EXPECT_EQ(run(a), R(4, 0, 16, 0));
  // Zero-length entries do not break uniformity.
  a.qsl = lens_to_qsl({4, 0, 4});
  EXPECT_EQ(run(a), R(3, 0, 8, 0));
  // A different (even shorter) length starts the prefills.
  a.qsl = lens_to_qsl({4, 4, 2, 4});
  EXPECT_EQ(run(a), R(2, 2, 8, 6));
  // With a zero-length entry and a non-uniform one, the zero-length entry is a prefill.
  a.qsl = lens_to_qsl({4, 0, 3});
  EXPECT_EQ(run(a), R(1, 2, 4, 3));
  // threshold <= 1 keeps the fast path even with require_uniform.
  a.threshold = 1;
  a.qsl = lens_to_qsl({1, 1, 0});
  EXPECT_EQ(run(a), R(3, 0, 2, 0));
  // First request longer than the threshold: all prefill.
  a.threshold = 2;
  a.qsl = lens_to_qsl({3, 3});
  EXPECT_EQ(run(a), R(0, 2, 0, 6));
}

TEST(PlanSplit, ShortExtendsAsPrefills) {
  Args a;
  a.qsl = lens_to_qsl({1, 1, 1});
  a.treat = false;
  a.is_prefilling = {0, 1, 0};
  EXPECT_EQ(run(a), R(1, 2, 1, 2));
  // Shorter is_prefilling: right-padded with false.
  a.is_prefilling = {0};
  EXPECT_EQ(run(a), R(3, 0, 3, 0));
  // Longer is_prefilling: truncated.
  a.is_prefilling = {0, 0, 0, 1, 1};
  EXPECT_EQ(run(a), R(3, 0, 3, 0));
  // treat=true: short extends are decodes, is_prefilling ignored.
  a.treat = true;
  a.is_prefilling = {1, 1, 1};
  EXPECT_EQ(run(a), R(3, 0, 3, 0));
  // Short extend followed by a long one.
  a.treat = false;
  a.threshold = 2;
  a.qsl = lens_to_qsl({2, 2, 9});
  a.is_prefilling = {0, 1, 1};
  EXPECT_EQ(run(a), R(1, 2, 2, 11));
}

TEST(PlanSplit, NumActualTokensDiffersFromQsl) {
  // Upstream fixture: qsl=[0,2,5,9] with 15 tokens.
  Args a;
  a.qsl = {0, 2, 5, 9};
  a.num_actual_tokens = 15;
  EXPECT_EQ(run(a), R(0, 3, 0, 15));
  a.qsl = {0, 1, 1, 5};
  EXPECT_EQ(run(a), R(2, 1, 1, 14));
  // Padded qsl with a dummy request: num_prefill_tokens uses the unpadded count
  // and the dummy is counted as a prefill (docs/design/gqa.md §2.5).
  a.qsl = {0, 1, 2, 8};
  a.num_actual_tokens = 2;
  EXPECT_EQ(run(a), R(2, 1, 2, 0));
}

TEST(PlanSplit, MaxBatch) {
  Args a;
  a.qsl = lens_to_qsl(std::vector<int32_t>(1024, 1));
  EXPECT_EQ(run(a), R(1024, 0, 1024, 0));
  std::vector<int32_t> lens(1024, 1);
  for (int i = 1000; i < 1024; ++i) lens[i] = 2048;
  a.qsl = lens_to_qsl(lens);
  EXPECT_EQ(run(a), R(1000, 24, 1000, 24 * 2048));
}

TEST(PlanSplit, Errors) {
  Args a;
  a.qsl = {0, 1, 7, 5};
  EXPECT_INVALID(run(a), "query_start_loc must be non-decreasing: query_start_loc[3]=5 < query_start_loc[2]=7");
  a.qsl = {1, 2};
  EXPECT_INVALID(run(a), "query_start_loc[0]=1");
  {
    SplitInputs in;
    std::vector<int32_t> q = {0, 1};
    in.query_start_loc = q;
    in.num_actual_tokens = -3;
    EXPECT_INVALID(split_decodes_and_prefills(in), "num_actual_tokens=-3");
  }
  a = Args{};
  a.qsl = lens_to_qsl({1, 1});
  a.treat = false;
  EXPECT_INVALID(run(a), "is_prefilling");
  a = Args{};
  a.qsl = lens_to_qsl({1, 4});
  a.num_actual_tokens = 0;
  EXPECT_INVALID(run(a), "num_actual_tokens=0");
}
