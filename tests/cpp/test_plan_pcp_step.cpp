// GQA PCP per-step pieces (plan/pcp_step_plan.h): the split rule, the block
// table check of a KV cache sharded over W ranks against brute-force
// ownership counts, and the MRV2 local batch on upstream's q = 7 example.
#include <algorithm>
#include <random>
#include <vector>

#include "ascend_attn_rt/errors.h"
#include "ascend_attn_rt/cp/plan/dcp_layout.h"
#include "ascend_attn_rt/cp/plan/pcp_step_plan.h"
#include "test_plan_util.h"

using namespace aar::plan;
using aar_test::lens_to_qsl;

namespace {

std::vector<uint8_t> flags(const std::vector<int32_t>& qsl, const std::vector<uint8_t>& pref, int32_t* nd) {
  std::vector<uint8_t> f(qsl.size() - 1, 9);
  *nd = pcp_split_flags(qsl, pref, f);
  return f;
}

}  // namespace

TEST(PcpStepPlan, SplitFlagsFirstFlagSplitsTheBatch) {
  int32_t nd = -1;
  EXPECT_EQ(flags(lens_to_qsl({1, 1, 5, 1}), {}, &nd), (std::vector<uint8_t>{0, 0, 1, 1}));
  EXPECT_EQ(nd, 2);
  // A one-token request still inside its prompt is split.
  EXPECT_EQ(flags(lens_to_qsl({1, 1, 1}), {0, 1, 0}, &nd), (std::vector<uint8_t>{0, 1, 1}));
  EXPECT_EQ(nd, 1);
  EXPECT_EQ(flags(lens_to_qsl({1, 0, 1}), {}, &nd), (std::vector<uint8_t>{0, 0, 0}));
  EXPECT_EQ(nd, 3);
  EXPECT_EQ(flags(lens_to_qsl({}), {}, &nd), (std::vector<uint8_t>{}));
  EXPECT_EQ(nd, 0);
  std::vector<uint8_t> f(3);
  EXPECT_THROW(pcp_split_flags(lens_to_qsl({1, 2, 3}), std::vector<uint8_t>{1}, f), aar::InvalidArgument);
  std::vector<uint8_t> small(1);
  EXPECT_THROW(pcp_split_flags(lens_to_qsl({1, 2}), {}, small), aar::InvalidArgument);
}

TEST(DcpBlockTableCheck, NeedsRankZerosColumns) {
  std::mt19937 rng(7);
  for (int32_t w : {1, 2, 3, 4, 6}) {
    for (int32_t bs : {4, 16}) {
      for (int32_t il : {1, 2, bs}) {
        for (int it = 0; it < 20; ++it) {
          const int32_t len = static_cast<int32_t>(rng() % 300);
          // Brute force: the most tokens any rank owns.
          std::vector<int32_t> owned(w, 0);
          for (int32_t x = 0; x < len; ++x) ++owned[(x / il) % w];
          const int32_t most = *std::max_element(owned.begin(), owned.end());
          const int32_t cols = (most + bs - 1) / bs;
          std::vector<int32_t> qsl{0, 0}, seq{len};
          std::vector<int32_t> table(std::max(cols, 1), 3);
          SlotMappingInputs in{qsl, seq, table, static_cast<int32_t>(table.size()), bs, 8};
          EXPECT_NO_THROW(check_dcp_block_table(in, w, il)) << w << " " << bs << " " << il << " " << len;
          if (cols > 0) {
            SlotMappingInputs fewer{qsl, seq, table, cols - 1, bs, 8};
            EXPECT_THROW(check_dcp_block_table(fewer, w, il), aar::InvalidArgument);
            table[cols - 1] = 8;  // out of range [0, 8)
            EXPECT_THROW(check_dcp_block_table(in, w, il), aar::InvalidArgument);
          }
        }
      }
    }
  }
}

TEST(PcpStepPlan, LocalBatchOfUpstreamExample) {
  // q = 7 (tokens A..G) with 5 cached tokens, Wp = 2: rank 0 rows [A B | G], rank 1 [C D | E F].
  const std::vector<int32_t> qsl{0, 7}, computed{5}, table{11, 12, 13};
  const std::vector<uint8_t> split{1};
  PcpSegmentInputs in{qsl, computed, split, 2};
  std::vector<int32_t> lq(4, -1), ls(3, -1), lt(9, -1);
  std::vector<uint8_t> lp(3, 9);
  std::vector<PcpSegment> seg(2);
  PcpLocalBatchBuffers out{lq, ls, lt, lp, seg};
  ASSERT_EQ(pcp_local_batch(in, 0, table, 3, out), 2);
  EXPECT_EQ(std::vector<int32_t>(lq.begin(), lq.begin() + 3), (std::vector<int32_t>{0, 2, 3}));
  EXPECT_EQ(std::vector<int32_t>(ls.begin(), ls.begin() + 2), (std::vector<int32_t>{7, 12}));
  EXPECT_EQ(std::vector<int32_t>(lt.begin(), lt.begin() + 6), (std::vector<int32_t>{11, 12, 13, 11, 12, 13}));
  EXPECT_EQ(lp[0], 1);
  ASSERT_EQ(pcp_local_batch(in, 1, table, 3, out), 2);
  EXPECT_EQ(std::vector<int32_t>(lq.begin(), lq.begin() + 3), (std::vector<int32_t>{0, 2, 4}));
  EXPECT_EQ(std::vector<int32_t>(ls.begin(), ls.begin() + 2), (std::vector<int32_t>{9, 11}));

  // A fresh prefill: rank 0's [A B] (start 0) is a pure prefill and moves last.
  const std::vector<int32_t> fresh{0};
  PcpSegmentInputs in0{qsl, fresh, split, 2};
  ASSERT_EQ(pcp_local_batch(in0, 0, table, 3, out), 2);
  EXPECT_EQ(std::vector<int32_t>(lq.begin(), lq.begin() + 3), (std::vector<int32_t>{0, 1, 3}));
  EXPECT_EQ(std::vector<int32_t>(ls.begin(), ls.begin() + 2), (std::vector<int32_t>{7, 2}));

  // A rank with nothing gets one 0-token row of request 0.
  const std::vector<int32_t> q1{0, 1}, c1{4};
  PcpSegmentInputs one{q1, c1, split, 2};
  ASSERT_EQ(pcp_local_batch(one, 1, table, 3, out), 1);
  EXPECT_EQ(lq[1], 0);
  EXPECT_EQ(ls[0], 4);

  // Capacities are checked before anything is written.
  std::vector<int32_t> tiny(1, -7);
  PcpLocalBatchBuffers bad{tiny, ls, lt, lp, seg};
  EXPECT_THROW(pcp_local_batch(in, 0, table, 3, bad), aar::InvalidArgument);
  EXPECT_EQ(tiny[0], -7);
}
