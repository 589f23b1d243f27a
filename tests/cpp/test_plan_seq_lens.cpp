#include <vector>

#include "ascend_attn_rt/plan/seq_lens.h"
#include "test_plan_util.h"

using namespace aar::plan;

TEST(PlanSeqLens, ValidateStartLoc) {
  std::vector<int32_t> ok = {0, 0, 3, 3, 9};
  validate_start_loc(ok, "qsl");
  std::vector<int32_t> zero = {0};
  validate_start_loc(zero, "qsl");
  std::vector<int32_t> empty;
  EXPECT_INVALID(validate_start_loc(empty, "my_arg"), "my_arg must have at least one entry");
  std::vector<int32_t> nz = {2, 3};
  EXPECT_INVALID(validate_start_loc(nz, "my_arg"), "my_arg[0]=2 must be 0");
  std::vector<int32_t> dec = {0, 2, 7, 5};
  EXPECT_INVALID(validate_start_loc(dec, "query_start_loc"),
                 "query_start_loc must be non-decreasing: query_start_loc[3]=5 < query_start_loc[2]=7");
}

TEST(PlanSeqLens, Conversions) {
  std::vector<int32_t> qsl = {0, 2, 5, 9};
  std::vector<int64_t> ends(3, -1);
  start_loc_to_ends(qsl, ends);
  EXPECT_EQ(ends, (std::vector<int64_t>{2, 5, 9}));
  std::vector<int32_t> lens(3, -1);
  start_loc_to_lens(qsl, lens);
  EXPECT_EQ(lens, (std::vector<int32_t>{2, 3, 4}));
  std::vector<int64_t> ends2(3, -1);
  lens_to_ends(lens, ends2);
  EXPECT_EQ(ends2, ends);

  // Empty batch.
  std::vector<int32_t> q0 = {0};
  std::vector<int64_t> none;
  start_loc_to_ends(q0, none);
  lens_to_ends({}, none);

  std::vector<int64_t> small(2, -1);
  EXPECT_INVALID(start_loc_to_ends(qsl, small), "ends_out");
  std::vector<int32_t> small32(2, -1);
  EXPECT_INVALID(start_loc_to_lens(qsl, small32), "lens_out");
  std::vector<int32_t> bad = {0, 4, 3};
  EXPECT_INVALID(start_loc_to_lens(bad, lens), "start_loc must be non-decreasing");
  std::vector<int32_t> neg = {2, -1, 3};
  std::vector<int64_t> out(3, -7);
  EXPECT_INVALID(lens_to_ends(neg, out), "lens[1]=-1");
  for (int64_t v : out) EXPECT_EQ(v, -7);
  EXPECT_INVALID(lens_to_ends(lens, small), "ends_out");
}

TEST(PlanSeqLens, PadForFiaNoDummy) {
  std::vector<int32_t> qsl = {0, 2, 5}, seq = {10, 20};
  std::vector<int64_t> q_ends(2, -1), kv(2, -1);  // exactly B entries suffice without a dummy
  FiaPadding p = pad_for_fia(qsl, seq, 5, q_ends, kv);
  EXPECT_EQ(p.num_reqs, 2);
  EXPECT_EQ(p.num_tokens, 5);
  EXPECT_FALSE(p.added_dummy);
  EXPECT_EQ(q_ends, (std::vector<int64_t>{2, 5}));
  EXPECT_EQ(kv, (std::vector<int64_t>{10, 20}));
}

TEST(PlanSeqLens, PadForFiaMixedCaseAddsOneDummy) {
  // docs/design/gqa.md §2.5 mixed case: qsl[B] < T_pad -> one dummy request ending at T_pad, kv len 1.
  std::vector<int32_t> qsl = {0, 2, 5}, seq = {10, 20};
  std::vector<int64_t> q_ends(4, -1), kv(4, -1);
  FiaPadding p = pad_for_fia(qsl, seq, 8, q_ends, kv);
  EXPECT_EQ(p.num_reqs, 3);
  EXPECT_EQ(p.num_tokens, 8);
  EXPECT_TRUE(p.added_dummy);
  EXPECT_EQ(q_ends, (std::vector<int64_t>{2, 5, 8, -1}));
  EXPECT_EQ(kv, (std::vector<int64_t>{10, 20, 1, -1}));
  // The runner's own convention (dummy kv len 0).
  pad_for_fia(qsl, seq, 8, q_ends, kv, 0);
  EXPECT_EQ(kv[2], 0);
}

TEST(PlanSeqLens, PadForFiaEmptyBatch) {
  std::vector<int32_t> qsl = {0}, seq;
  std::vector<int64_t> q_ends(1, -1), kv(1, -1);
  FiaPadding p = pad_for_fia(qsl, seq, 0, q_ends, kv);
  EXPECT_EQ(p.num_reqs, 0);
  EXPECT_EQ(p.num_tokens, 0);
  EXPECT_EQ(q_ends[0], -1);
  p = pad_for_fia(qsl, seq, 4, q_ends, kv);
  EXPECT_EQ(p.num_reqs, 1);
  EXPECT_EQ(p.num_tokens, 4);
  EXPECT_EQ(q_ends[0], 4);
  EXPECT_EQ(kv[0], 1);
}

TEST(PlanSeqLens, PadForFiaErrors) {
  std::vector<int32_t> qsl = {0, 2, 5}, seq = {10, 20};
  std::vector<int64_t> q_ends(3, -9), kv(3, -9), two(2, -9);
  EXPECT_INVALID(pad_for_fia(qsl, seq, 4, q_ends, kv), "padded_tokens=4 is smaller than query_start_loc[2]=5");
  EXPECT_INVALID(pad_for_fia(qsl, seq, 8, two, kv), "q_ends_out");
  EXPECT_INVALID(pad_for_fia(qsl, seq, 8, q_ends, two), "kv_lens_out");
  std::vector<int32_t> short_seq = {10};
  EXPECT_INVALID(pad_for_fia(qsl, short_seq, 8, q_ends, kv), "query_start_loc has 3 entries");
  std::vector<int32_t> neg_seq = {10, -1};
  EXPECT_INVALID(pad_for_fia(qsl, neg_seq, 8, q_ends, kv), "seq_lens[1]=-1");
  std::vector<int32_t> bad_qsl = {0, 6, 5};
  EXPECT_INVALID(pad_for_fia(bad_qsl, seq, 8, q_ends, kv), "query_start_loc must be non-decreasing");
  EXPECT_INVALID(pad_for_fia(qsl, seq, 8, q_ends, kv, -1), "dummy_kv_len=-1");
  for (int64_t v : q_ends) EXPECT_EQ(v, -9);
  for (int64_t v : kv) EXPECT_EQ(v, -9);
  for (int64_t v : two) EXPECT_EQ(v, -9);
}
