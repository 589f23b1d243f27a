// MRV2 PCP segment partition (docs/design/cp.md §6.2, §6.5, §9): upstream's
// [A B G] / [C D E F] example, and random batches checked against what the
// partition must guarantee.
#include <algorithm>
#include <random>
#include <vector>

#include "ascend_attn_rt/cp/plan/pcp_segments.h"
#include "test_plan_util.h"

using namespace aar::plan;
using aar_test::lens_to_qsl;

namespace {

struct Batch {
  std::vector<int32_t> qsl, computed;
  std::vector<uint8_t> prefilling;
  int32_t wp = 2;
  PcpSegmentInputs in() const { return {qsl, computed, prefilling, wp}; }
};

std::vector<PcpSegment> segments(const Batch& b, int32_t rank) {
  std::vector<PcpSegment> s(std::max<std::size_t>(1, 2 * b.computed.size()));
  s.resize(pcp_rank_segments(b.in(), rank, s));
  return s;
}

struct Gather {
  std::vector<int32_t> restore, padded;
  std::vector<uint8_t> mask;
};

Gather gather(const Batch& b) {
  const int32_t p = pcp_padded_local_tokens(b.in());
  Gather g;
  g.restore.assign(b.qsl.back(), -1);
  g.padded.assign(p * b.wp, -1);
  g.mask.assign(p * b.wp, 9);
  pcp_segment_gather_indices(b.in(), g.restore, g.padded, g.mask);
  return g;
}

}  // namespace

TEST(PlanPcpSegments, UpstreamExampleWithContext) {
  // q = 7 (A..G), Wp = 2, 10 tokens of context: rank 0 [A B | G], rank 1 [C D | E F].
  const Batch b{{0, 7}, {10}, {1}, 2};
  const auto r0 = segments(b, 0), r1 = segments(b, 1);
  ASSERT_EQ(r0.size(), 2u);
  ASSERT_EQ(r1.size(), 2u);
  EXPECT_EQ(r0[0].token_begin, 0);
  EXPECT_EQ(r0[0].num_tokens, 2);
  EXPECT_EQ(r0[0].start_pos, 10);
  EXPECT_EQ(r0[1].token_begin, 6);
  EXPECT_EQ(r0[1].num_tokens, 1);
  EXPECT_EQ(r0[1].start_pos, 16);
  EXPECT_EQ(r0[1].local_begin, 2);
  EXPECT_EQ(r1[0].token_begin, 2);
  EXPECT_EQ(r1[1].token_begin, 4);
  EXPECT_EQ(r1[1].start_pos, 14);
  EXPECT_EQ(pcp_padded_local_tokens(b.in()), 4);
  const Gather g = gather(b);
  EXPECT_EQ(g.restore, (std::vector<int32_t>{0, 1, 4, 5, 6, 7, 2}));
  EXPECT_EQ(g.padded, (std::vector<int32_t>{0, 1, 6, 0, 2, 3, 4, 5}));
  EXPECT_EQ(g.mask, (std::vector<uint8_t>{1, 1, 1, 0, 1, 1, 1, 1}));
}

TEST(PlanPcpSegments, FreshPrefillHeadChunkMovesLast) {
  // The same tokens without context: [A B] starts at position 0, a pure prefill.
  const Batch b{{0, 7}, {0}, {1}, 2};
  const auto r0 = segments(b, 0);
  ASSERT_EQ(r0.size(), 2u);
  EXPECT_EQ(r0[0].token_begin, 6);  // G
  EXPECT_EQ(r0[0].start_pos, 6);
  EXPECT_EQ(r0[1].token_begin, 0);  // A B
  EXPECT_EQ(r0[1].local_begin, 1);
  EXPECT_EQ(gather(b).restore, (std::vector<int32_t>{1, 2, 4, 5, 6, 7, 0}));
}

TEST(PlanPcpSegments, DecodesReplicatedAndDummySegment) {
  // A decode (2 tokens, spec decode), a prefill of 3 with Wp = 3 (chunk 1: ranks
  // 0, 1, 2 get chunks {0,5}, {1,4}, {2,3} clipped to [0,3)).
  const Batch b{lens_to_qsl({2, 3}), {9, 0}, {0, 1}, 3};
  const auto r0 = segments(b, 0), r1 = segments(b, 1), r2 = segments(b, 2);
  ASSERT_EQ(r0.size(), 2u);  // decode, then the pure-prefill chunk 0
  EXPECT_EQ(r0[0].req, 0);
  EXPECT_EQ(r0[0].num_tokens, 2);
  EXPECT_EQ(r0[0].start_pos, 9);
  EXPECT_EQ(r0[1].token_begin, 2);
  ASSERT_EQ(r1.size(), 2u);
  EXPECT_EQ(r1[1].token_begin, 3);
  ASSERT_EQ(r2.size(), 2u);
  EXPECT_EQ(r2[1].token_begin, 4);
  const Gather g = gather(b);
  // P = 3; decode rows are written from rank 0 only.
  EXPECT_EQ(g.mask, (std::vector<uint8_t>{1, 1, 1, 0, 0, 1, 0, 0, 1}));
  EXPECT_EQ(g.restore, (std::vector<int32_t>{0, 1, 2, 5, 8}));
  // Wp = 4, one prefill of 2 tokens: ranks 2 and 3 get nothing -> a dummy row.
  const Batch c{{0, 2}, {5}, {1}, 4};
  const auto d = segments(c, 3);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].req, 0);
  EXPECT_EQ(d[0].num_tokens, 0);
  EXPECT_EQ(d[0].start_pos, 5);
}

TEST(PlanPcpSegments, RandomBatchesPartitionTheTokens) {
  std::mt19937 rng(31);
  for (int trial = 0; trial < 300; ++trial) {
    Batch b;
    b.wp = 1 + static_cast<int32_t>(rng() % 4);
    const int n = 1 + static_cast<int>(rng() % 6);
    std::vector<int32_t> q(n);
    for (int i = 0; i < n; ++i) {
      b.prefilling.push_back(rng() % 2);
      q[i] = b.prefilling[i] ? static_cast<int32_t>(rng() % 30) : 1 + static_cast<int32_t>(rng() % 3);
      b.computed.push_back(rng() % 3 == 0 ? 0 : static_cast<int32_t>(rng() % 50));
    }
    b.qsl = lens_to_qsl(q);
    const int32_t p = pcp_padded_local_tokens(b.in());
    std::vector<int32_t> writes(b.qsl.back(), 0), copies(b.qsl.back(), 0);
    int32_t max_tokens = 0;
    for (int32_t r = 0; r < b.wp; ++r) {
      const auto segs = segments(b, r);
      int32_t local = 0;
      bool seen_pure = false;
      for (const PcpSegment& s : segs) {
        ASSERT_EQ(s.local_begin, local);
        local += s.num_tokens;
        if (s.num_tokens == 0) continue;  // the dummy
        const int32_t req_begin = b.qsl[s.req];
        ASSERT_EQ(s.start_pos, b.computed[s.req] + s.token_begin - req_begin);
        ASSERT_LE(s.token_begin + s.num_tokens, b.qsl[s.req + 1]);
        const bool pure = b.prefilling[s.req] && s.start_pos == 0;
        ASSERT_FALSE(seen_pure && !pure) << "pure prefills must come last";
        seen_pure = seen_pure || pure;
        for (int32_t k = 0; k < s.num_tokens; ++k) {
          ++copies[s.token_begin + k];
          if (b.prefilling[s.req] || r == 0) ++writes[s.token_begin + k];
        }
        if (!b.prefilling[s.req]) {
          ASSERT_EQ(s.num_tokens, b.qsl[s.req + 1] - req_begin);
        }
      }
      max_tokens = std::max(max_tokens, local);
    }
    ASSERT_EQ(p, max_tokens);
    for (int i = 0; i < n; ++i) {
      for (int32_t t = b.qsl[i]; t < b.qsl[i + 1]; ++t) {
        ASSERT_EQ(writes[t], 1);                               // every token's KV written once
        ASSERT_EQ(copies[t], b.prefilling[i] ? 1 : b.wp);      // split once, decodes on every rank
      }
    }
    const Gather g = gather(b);
    for (int32_t t = 0; t < b.qsl.back(); ++t) {
      ASSERT_EQ(g.padded[g.restore[t]], t);  // global = gathered[restore]
      ASSERT_EQ(g.mask[g.restore[t]], 1);
    }
    int32_t masked = 0;
    for (uint8_t m : g.mask) masked += m;
    ASSERT_EQ(masked, b.qsl.back());
    // Expanded slots: the masked rows carry their token's slot, all others -1.
    std::vector<int32_t> tok(b.qsl.back());
    for (int32_t t = 0; t < b.qsl.back(); ++t) tok[t] = 1000 + t;
    std::vector<int32_t> slots(p * b.wp, 5);
    pcp_expanded_slot_mapping(b.in(), tok, slots);
    for (std::size_t row = 0; row < slots.size(); ++row) {
      ASSERT_EQ(slots[row], g.mask[row] ? 1000 + g.padded[row] : -1);
    }
  }
}

TEST(PlanPcpSegments, Errors) {
  const Batch good{{0, 7}, {10}, {1}, 2};
  std::vector<PcpSegment> one(1);
  EXPECT_INVALID(pcp_rank_segments(good.in(), 0, one), "segments_out has room for 1 entries, needs 2");
  std::vector<PcpSegment> two(2);
  EXPECT_INVALID(pcp_rank_segments(good.in(), 2, two), "rank=2 is out of range [0, pcp_size=2)");
  EXPECT_INVALID(pcp_padded_local_tokens({good.qsl, good.computed, good.prefilling, 0}), "pcp_size=0");
  const std::vector<int32_t> neg = {-1};
  EXPECT_INVALID(pcp_padded_local_tokens({good.qsl, neg, good.prefilling, 2}), "num_computed_tokens[0]=-1");
  const std::vector<uint8_t> none;
  EXPECT_INVALID(pcp_padded_local_tokens({good.qsl, good.computed, none, 2}), "is_prefilling has 0 entries");
  const std::vector<int32_t> bad_qsl = {0, 7, 3};
  EXPECT_INVALID(pcp_padded_local_tokens({bad_qsl, good.computed, good.prefilling, 2}), "query_start_loc has 3 entries");
  std::vector<int32_t> r(7, 3), pg(7, 3);
  std::vector<uint8_t> m(8, 3);
  EXPECT_INVALID(pcp_segment_gather_indices(good.in(), r, pg, m), "padded_gather_out has room for 7 entries, needs 8");
  EXPECT_EQ(r, std::vector<int32_t>(7, 3));
  std::vector<int32_t> s(8, 3);
  EXPECT_INVALID(pcp_expanded_slot_mapping(good.in(), std::vector<int32_t>(6, 0), s), "token_slots has 6 entries");
  EXPECT_EQ(s, std::vector<int32_t>(8, 3));
}
