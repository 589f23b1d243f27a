// SFA KV-offload planning (docs/design/sfa.md §6, docs/design/sparse.md §8): the split with
// treat_short_extends_as_decodes = is_decode_consumer (the upstream test's
// 1-token boundary step), the per-request / per-token arrays against hand
// vectors, the decode-first order and every bad input rejected by name, and
// mask_invalid_topk against build_valid_topk_mask.
#include <random>
#include <vector>

#include <string_view>

#include "ascend_attn_rt/plan/request_keys.h"
#include "ascend_attn_rt/sfa/plan/sfa_offload_plan.h"
#include "ascend_attn_rt/sfa/plan/sfa_plan.h"
#include "test_plan_util.h"

using namespace aar::plan;

namespace {

struct Case {
  std::vector<int32_t> qsl, seq;
  std::vector<uint64_t> ids;
  std::vector<uint8_t> prefilling;
  int32_t thr = 1;
  bool consumer = false;

  SfaOffloadInputs inputs() const {
    SfaOffloadInputs in;
    in.query_start_loc = qsl;
    in.seq_lens = seq;
    in.req_ids = ids;
    in.is_prefilling = prefilling;
    in.decode_threshold = thr;
    in.decode_consumer = consumer;
    return in;
  }
};

struct Out {
  std::vector<int32_t> ttr, pcql, dseq, dstable;
  std::vector<uint64_t> rid, dids;
  explicit Out(std::size_t n) : rid(n, 7), ttr(n, -7), pcql(n, -7), dseq(n, -7), dstable(n, -7), dids(n, 7) {}
  SfaOffloadBuffers buffers() {
    SfaOffloadBuffers b;
    b.req_ids = rid;
    b.token_to_req = ttr;
    b.prefill_cum_query_lens = pcql;
    b.decode_req_ids = dids;
    b.decode_seq_lens = dseq;
    b.decode_stable_prefix = dstable;
    return b;
  }
};

}  // namespace

TEST(SfaOffloadPlan, OneTokenBoundaryStepIsADecodeOnlyOnADecodeConsumer) {
  // Upstream test_sfa_kv_offload: a request still prefilling that schedules its
  // last prompt token (query length 1) is a decode on a PD decode consumer and
  // a prefill elsewhere; a multi-token step stays a prefill.
  Case c{{0, 1, 2}, {9, 4}, {11, 22}, {0, 1}, 1, false};
  EXPECT_EQ(check_sfa_offload_step(c.inputs()), (SplitResult{1, 1, 1, 1}));
  c.consumer = true;
  c.prefilling.clear();
  EXPECT_EQ(check_sfa_offload_step(c.inputs()), (SplitResult{2, 0, 2, 0}));
  Case m{{0, 1, 4}, {9, 4}, {11, 22}, {}, 1, true};
  EXPECT_EQ(check_sfa_offload_step(m.inputs()), (SplitResult{1, 1, 1, 3}));
}

TEST(SfaOffloadPlan, ArraysOfAMixedSpeculativeBatch) {
  // Two speculative decodes (2 tokens each, threshold 2) then two prefills, 2 padding tokens.
  Case c{{0, 2, 4, 9, 12}, {10, 2, 5, 20}, {0xdeadbeefu, 5, 6, 7}, {0, 0, 1, 1}, 2, false};
  const SplitResult s = check_sfa_offload_step(c.inputs());
  EXPECT_EQ(s, (SplitResult{2, 2, 4, 8}));
  Out o(16);
  write_sfa_offload_step(c.inputs(), s, 14, o.buffers());
  EXPECT_EQ(std::vector<uint64_t>(o.rid.begin(), o.rid.begin() + 4), (std::vector<uint64_t>{0xdeadbeefu, 5, 6, 7}));
  EXPECT_EQ(std::vector<int32_t>(o.ttr.begin(), o.ttr.begin() + 15),
            (std::vector<int32_t>{0, 0, 1, 1, 2, 2, 2, 2, 2, 3, 3, 3, -1, -1, -7}));
  EXPECT_EQ(std::vector<int32_t>(o.pcql.begin(), o.pcql.begin() + 3), (std::vector<int32_t>{5, 8, -7}));
  EXPECT_EQ(std::vector<uint64_t>(o.dids.begin(), o.dids.begin() + 5),
            (std::vector<uint64_t>{0xdeadbeefu, 0xdeadbeefu, 5, 5, 7}));
  EXPECT_EQ(std::vector<int32_t>(o.dseq.begin(), o.dseq.begin() + 5), (std::vector<int32_t>{10, 10, 2, 2, -7}));
  // stable prefix max(S - q, 0): 8 for (10, 2), 0 for (2, 2).
  EXPECT_EQ(std::vector<int32_t>(o.dstable.begin(), o.dstable.begin() + 5), (std::vector<int32_t>{8, 8, 0, 0, -7}));
}

TEST(SfaOffloadPlan, PurePrefillRebasesNothing) {
  Case c{{0, 3, 7}, {3, 9}, {1, 2}, {}, 1, true};
  const SplitResult s = check_sfa_offload_step(c.inputs());
  EXPECT_EQ(s, (SplitResult{0, 2, 0, 7}));
  Out o(8);
  write_sfa_offload_step(c.inputs(), s, 7, o.buffers());
  EXPECT_EQ(std::vector<int32_t>(o.pcql.begin(), o.pcql.begin() + 2), (std::vector<int32_t>{3, 7}));
  EXPECT_EQ(o.dseq[0], -7);  // no decode token
}

TEST(SfaOffloadPlan, EmptyBatch) {
  Case c{{0}, {}, {}, {}, 1, true};
  EXPECT_EQ(check_sfa_offload_step(c.inputs()), SplitResult{});
  Out o(4);
  write_sfa_offload_step(c.inputs(), SplitResult{}, 2, o.buffers());
  EXPECT_EQ(o.ttr[0], -1);
  EXPECT_EQ(o.ttr[1], -1);
  EXPECT_EQ(o.ttr[2], -7);
}

TEST(SfaOffloadPlan, BadInputIsRejectedByName) {
  Case ok{{0, 1, 4}, {9, 4}, {11, 22}, {0, 1}, 1, false};
  Case c = ok;
  c.ids = {11};
  EXPECT_INVALID(check_sfa_offload_step(c.inputs()), "req_ids has 1 entries");
  c = ok;
  c.prefilling = {0};
  EXPECT_INVALID(check_sfa_offload_step(c.inputs()), "is_prefilling has 1 entries");
  c = ok;
  c.consumer = true;
  EXPECT_INVALID(check_sfa_offload_step(c.inputs()), "is_prefilling was given");
  c = ok;
  c.qsl = {0, 3, 2};
  EXPECT_INVALID(check_sfa_offload_step(c.inputs()), "query_start_loc");
  c = ok;
  c.qsl = {0, 1};
  EXPECT_INVALID(check_sfa_offload_step(c.inputs()), "query_start_loc has 2 entries");
  // Decode after a prefill: consumer (any short request), non-consumer (not prefilling).
  Case order{{0, 5, 6}, {9, 4}, {1, 2}, {}, 1, true};
  EXPECT_INVALID(check_sfa_offload_step(order.inputs()), "request 1 (query length 1) is a decode after the first");
  order.consumer = false;
  order.prefilling = {1, 0};
  EXPECT_INVALID(check_sfa_offload_step(order.inputs()), "decode-first");
  order.prefilling = {1, 1};  // a short extend still prefilling: a prefill, accepted
  EXPECT_EQ(check_sfa_offload_step(order.inputs()), (SplitResult{0, 2, 0, 6}));
  // Room.
  const SplitResult s = check_sfa_offload_step(ok.inputs());
  Out o(8);
  SfaOffloadBuffers b = o.buffers();
  b.token_to_req = Span<int32_t>(o.ttr.data(), 3);
  EXPECT_INVALID(write_sfa_offload_step(ok.inputs(), s, 4, b), "buffers.token_to_req");
  EXPECT_EQ(o.ttr[0], -7);
  EXPECT_INVALID(write_sfa_offload_step(ok.inputs(), s, 3, o.buffers()), "num_tokens=3");
}

TEST(SfaOffloadPlan, MaskInvalidTopkIsWhereOfTheMask) {
  const std::vector<int32_t> topk = {0, 5, -1, 7, 3, 9, 2, -1, 4};
  const std::vector<int32_t> thr = {6, 3, 0};
  std::vector<uint8_t> mask(9);
  build_valid_topk_mask(topk, 3, thr, mask);
  std::vector<int32_t> out(9, -7);
  mask_invalid_topk(topk, 3, thr, out);
  for (std::size_t i = 0; i < 9; ++i) EXPECT_EQ(out[i], mask[i] ? topk[i] : -1) << i;
  EXPECT_EQ(out, (std::vector<int32_t>{0, 5, -1, -1, -1, -1, -1, -1, -1}));
  std::vector<int32_t> in_place = topk;
  mask_invalid_topk(in_place, 3, thr, in_place);
  EXPECT_EQ(in_place, out);
  std::vector<int32_t> small(8);
  EXPECT_INVALID(mask_invalid_topk(topk, 3, thr, small), "out has room for 8");
  const std::vector<int32_t> negative = {6, -1, 0};
  EXPECT_INVALID(mask_invalid_topk(topk, 3, negative, out), "thresholds_per_row[1]=-1");
  EXPECT_INVALID(mask_invalid_topk(topk, 4, thr, out), "not a multiple of K=4");
}

TEST(SfaOffloadPlan, MaskedTopkEqualsIsTheMaskCompared) {
  // Random rows against their own mask, and against that mask with one entry changed anywhere.
  std::mt19937 rng(3);
  for (int trial = 0; trial < 200; ++trial) {
    const int32_t K = 1 + static_cast<int32_t>(rng() % 9), rows = 1 + static_cast<int32_t>(rng() % 5);
    std::vector<int32_t> topk(static_cast<std::size_t>(rows * K)), thr(static_cast<std::size_t>(rows));
    for (int32_t& t : topk) t = static_cast<int32_t>(rng() % 24) - 4;
    for (int32_t& t : thr) t = static_cast<int32_t>(rng() % 20);
    std::vector<int32_t> masked(topk.size());
    mask_invalid_topk(topk, K, thr, masked);
    EXPECT_TRUE(masked_topk_equals(topk, K, thr, masked));
    const std::size_t at = rng() % masked.size();
    std::vector<int32_t> other = masked;
    other[at] = other[at] == -1 ? 0 : -1;
    EXPECT_FALSE(masked_topk_equals(topk, K, thr, other)) << trial << " at " << at;
  }
  // An entry masked either way compares equal: -5 and 9 (past the threshold 6) are both -1.
  const std::vector<int32_t> a = {-5, 2, 9}, b = {7, 2, -1}, thr = {6};
  std::vector<int32_t> ma(3);
  mask_invalid_topk(a, 3, thr, ma);
  EXPECT_TRUE(masked_topk_equals(b, 3, thr, ma));
  std::vector<int32_t> small(2);
  EXPECT_INVALID(masked_topk_equals(a, 3, thr, small), "out has room for 2");
  const std::vector<int32_t> negative = {-1};
  EXPECT_INVALID(masked_topk_equals(a, 3, negative, ma), "thresholds_per_row[0]=-1");
}

// ------------------------------------------------------------------ request identities
TEST(SfaOffloadPlan, ARepeatedRequestIdIsRefusedWithBothPositions) {
  Case c{{0, 1, 2, 3}, {9, 4, 7}, {11, 22, 11}, {}, 1, true};
  EXPECT_INVALID(check_sfa_offload_step(c.inputs()), "req_ids[2]=11 repeats req_ids[0]");
  c.ids = {11, 22, 0xffffffffffffffffULL};  // any 64-bit value is an identity
  EXPECT_EQ(check_sfa_offload_step(c.inputs()).num_decodes, 3);
}

TEST(RequestIds, DistinctCheckAgainstPairwiseComparison) {
  uint64_t state = 7;
  auto next = [&] { return (state = state * 6364136223846793005ULL + 1442695040888963407ULL) >> 33; };
  for (int trial = 0; trial < 300; ++trial) {
    const std::size_t n = next() % 70;
    std::vector<uint64_t> ids(n);
    for (auto& v : ids) v = trial % 3 == 0 ? next() % (n + 1) : (next() << 32 | next());
    bool distinct = true;
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t j = 0; j < i; ++j) distinct = distinct && ids[i] != ids[j];
    bool threw = false;
    try {
      check_distinct_request_ids(CSpan<uint64_t>(ids.data(), n), "req_ids");
    } catch (const aar::InvalidArgument&) {
      threw = true;
    }
    EXPECT_EQ(threw, !distinct) << "trial " << trial;
  }
}

TEST(RequestKeys, KeysAreStableWhilePresentAndNeverReused) {
  RequestKeys keys;
  std::vector<uint64_t> k(3, 0), seen;
  auto assign = [&](std::vector<std::string_view> ids) {
    keys.assign(CSpan<std::string_view>(ids.data(), ids.size()), Span<uint64_t>(k.data(), k.size()));
  };
  assign({"a", "b"});
  const uint64_t a = k[0], b = k[1];
  EXPECT_NE(a, b);
  assign({"b", "a"});
  EXPECT_EQ(k[0], b);
  EXPECT_EQ(k[1], a);
  assign({"b", "c"});  // "a" is forgotten
  EXPECT_EQ(k[0], b);
  const uint64_t c = k[1];
  EXPECT_TRUE(c != a && c != b);
  assign({"a"});  // back after a gap: a key never used before
  EXPECT_TRUE(k[0] != a && k[0] != b && k[0] != c);
  // A repeated id is refused and changes nothing.
  const std::vector<uint64_t> before = k;
  EXPECT_INVALID((assign({"x", "y", "x"})), "req_ids[2]=\"x\" repeats req_ids[0]");
  EXPECT_EQ(k, before);
  EXPECT_EQ(keys.size(), 1u);
  std::vector<std::string_view> ids{"a", "b"};
  EXPECT_INVALID(keys.assign(CSpan<std::string_view>(ids.data(), 2), Span<uint64_t>(k.data(), 1)), "room for 1");
}
