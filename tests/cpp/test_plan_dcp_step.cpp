// plan::build_dcp_step against brute-force ownership counting (docs/design/cp.md §2.1,
// §3.1-§3.3, §5): decode rows per token, prefill local context, the context row
// filter, the local slot mapping, and rank-independent rejection.
#include <gtest/gtest.h>

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "ascend_attn_rt/errors.h"
#include "ascend_attn_rt/cp/plan/dcp_step_plan.h"
#include "test_plan_util.h"

namespace aar::plan {
namespace {

int64_t owned_before(int64_t n, int32_t W, int32_t I, int32_t r) {
  int64_t c = 0;
  for (int64_t x = 0; x < n; ++x) c += (x / I) % W == r;
  return c;
}

struct Step {
  std::vector<int32_t> qsl, seq, bt;
  std::vector<uint8_t> prefilling;
  int32_t stride = 0;
  bool pd_recompute = false;
  // StepInput fields the DCP plan does not read (refused when given).
  std::optional<AttentionState> attn_state;
  std::vector<int32_t> num_spec_tokens;
  std::vector<uint64_t> req_ids;
  std::vector<int32_t> slots, dbt, pbt, idx;
  std::vector<int64_t> dq, dkv, pq, pctx;
  DcpStepPlan run(DcpShard s, int32_t threshold, int32_t bs = 4) {
    DcpStepInputs in;
    in.query_start_loc = CSpan<int32_t>(qsl.data(), qsl.size());
    in.seq_lens = CSpan<int32_t>(seq.data(), seq.size());
    in.block_table = CSpan<int32_t>(bt.data(), bt.size());
    in.block_table_stride = stride;
    in.block_size = bs;
    in.num_blocks = 64;
    in.decode_threshold = threshold;
    in.is_prefilling = CSpan<uint8_t>(prefilling.data(), prefilling.size());
    in.pd_recompute_scheduler = pd_recompute;
    in.shard = s;
    in.attn_state = attn_state;
    in.num_spec_tokens = CSpan<int32_t>(num_spec_tokens.data(), num_spec_tokens.size());
    in.req_ids = CSpan<uint64_t>(req_ids.data(), req_ids.size());
    const int32_t T = qsl.back();
    slots.assign(T, 7);
    dbt.assign(T * stride, 0);
    pbt.assign(seq.size() * stride, 0);
    idx.assign(T, -5);
    dq.assign(T, 0);
    dkv.assign(T, 0);
    pq.assign(seq.size(), 0);
    pctx.assign(seq.size(), 0);
    DcpStepBuffers b;
    b.slot_mapping = Span<int32_t>(slots.data(), slots.size());
    b.decode_block_table = Span<int32_t>(dbt.data(), dbt.size());
    b.decode_q_ends = Span<int64_t>(dq.data(), dq.size());
    b.decode_kv_lens = Span<int64_t>(dkv.data(), dkv.size());
    b.prefill_block_table = Span<int32_t>(pbt.data(), pbt.size());
    b.prefill_q_ends = Span<int64_t>(pq.data(), pq.size());
    b.prefill_context_lens = Span<int64_t>(pctx.data(), pctx.size());
    b.context_token_idx = Span<int32_t>(idx.data(), idx.size());
    b.out_stride = stride;
    return build_dcp_step(in, b);
  }
};

// decodes (q=1 and a speculative q=3), then an extend with context and a fresh prefill.
Step mixed() {
  Step s;
  s.qsl = {0, 1, 4, 5, 9, 12};
  s.seq = {1, 9, 6, 13, 3};
  s.prefilling = {0, 0, 0, 1, 1};
  s.stride = 4;
  for (int r = 0; r < 5; ++r)
    for (int c = 0; c < 4; ++c) s.bt.push_back(10 + 4 * r + c);
  return s;
}

TEST(PlanDcpStep, DecodeRowsPerTokenMatchBruteForce) {
  for (int32_t W : {1, 2, 4})
    for (int32_t I : {1, 2, 4})
      for (int32_t r = 0; r < W; ++r) {
        Step s = mixed();
        const DcpStepPlan p = s.run({W, r, I}, 4);
        ASSERT_EQ(p.split.num_decodes, 3);
        ASSERT_EQ(p.split.num_decode_tokens, 5);
        ASSERT_EQ(p.split.num_prefills, 2);
        // decode token t of request b at position p sees owned positions <= p
        const int32_t req_of[5] = {0, 1, 1, 1, 2};
        for (int t = 0; t < 5; ++t) {
          const int b = req_of[t];
          const int64_t pos = s.seq[b] - (s.qsl[b + 1] - s.qsl[b]) + (t - s.qsl[b]);
          EXPECT_EQ(s.dkv[t], owned_before(pos + 1, W, I, r)) << W << I << r << t;
          EXPECT_EQ(s.dq[t], t + 1);
          for (int c = 0; c < 4; ++c) EXPECT_EQ(s.dbt[t * 4 + c], s.bt[b * 4 + c]);
        }
        // prefills: local cached context, rebased query ends, the row filter
        EXPECT_EQ(s.pctx[0], owned_before(9, W, I, r));
        EXPECT_EQ(s.pctx[1], 0);
        EXPECT_EQ(s.pq[0], 4);
        EXPECT_EQ(s.pq[1], 7);
        EXPECT_TRUE(p.has_context);
        EXPECT_EQ(p.local_context_tokens, owned_before(9, W, I, r));
        ASSERT_EQ(p.num_context_rows, 4);
        for (int j = 0; j < 4; ++j) EXPECT_EQ(s.idx[j], j);
        // slots: owner writes local_index; everyone else -1
        int writes = 0;
        for (int b = 0; b < 5; ++b)
          for (int t = s.qsl[b]; t < s.qsl[b + 1]; ++t) {
            const int64_t pos = s.seq[b] - (s.qsl[b + 1] - s.qsl[b]) + (t - s.qsl[b]);
            if ((pos / I) % W == r) {
              const int64_t li = (pos / (W * I)) * I + pos % I;
              EXPECT_EQ(s.slots[t], s.bt[b * 4 + li / 4] * 4 + li % 4);
              ++writes;
            } else {
              EXPECT_EQ(s.slots[t], kPadSlot);
            }
          }
        EXPECT_EQ(p.num_local_writes, writes);
      }
}

TEST(PlanDcpStep, SpeculativeRowWithNoEarlierLocalKeyIsEmpty) {
  // docs/design/cp.md §3.3 quirk case: I=1, W=4, h=1, rank 3: the first query token (p=1)
  // has no local key at or before it on rank 3 -> length 0 (masked), not the
  // upstream's unmasked row.
  Step s;
  s.qsl = {0, 4};
  s.seq = {5};
  s.stride = 2;
  s.bt = {3, 4};
  const DcpStepPlan p = s.run({4, 3, 1}, 4);
  ASSERT_EQ(p.split.num_decodes, 1);
  EXPECT_EQ(s.dkv[0], 0);  // p=1
  EXPECT_EQ(s.dkv[1], 0);  // p=2
  EXPECT_EQ(s.dkv[2], 1);  // p=3 (owned)
  EXPECT_EQ(s.dkv[3], 1);  // p=4
}

TEST(PlanDcpStep, FreshPrefillsHaveNoContext) {
  Step s;
  s.qsl = {0, 5, 8};
  s.seq = {5, 3};
  s.prefilling = {1, 1};
  s.stride = 2;
  s.bt = {1, 2, 3, 4};
  const DcpStepPlan p = s.run({2, 1, 1}, 1);
  EXPECT_EQ(p.split.num_decodes, 0);
  EXPECT_FALSE(p.has_context);
  EXPECT_EQ(p.num_context_rows, 0);
}

TEST(PlanDcpStep, RejectionIsRankIndependentAndBeforeWrites) {
  for (int32_t r = 0; r < 2; ++r) {
    Step s = mixed();
    s.bt[4 * 3 + 0] = 999;  // out of range block id of request 3, column 0
    EXPECT_THROW(s.run({2, r, 1}, 4), InvalidArgument);
    for (int32_t v : s.slots) EXPECT_EQ(v, 7);
  }
  Step s = mixed();
  s.seq[1] = 2;  // seq_len < query_len
  EXPECT_THROW(s.run({2, 0, 1}, 4), InvalidArgument);
}

// The step fields the plan does not read are refused by name, before any write:
// accepted, a forced state or draft counts would be silently ignored.
TEST(PlanDcpStep, RefusesStepFieldsItDoesNotRead) {
  Step s = mixed();
  s.attn_state = AttentionState::DecodeOnly;
  EXPECT_INVALID(s.run({2, 0, 1}, 4), "attn_state was given, but the DCP step plan does not read it");
  for (int32_t v : s.slots) EXPECT_EQ(v, 7);
  s = mixed();
  s.num_spec_tokens = {0, 2, 0, 0, 0};
  EXPECT_INVALID(s.run({2, 1, 1}, 4), "num_spec_tokens was given (5 entries)");
  for (int32_t v : s.slots) EXPECT_EQ(v, 7);
  s = mixed();
  s.req_ids = {11, 12, 13, 14, 15};
  EXPECT_INVALID(s.run({2, 0, 2}, 4), "req_ids was given (5 entries)");
  for (int32_t v : s.slots) EXPECT_EQ(v, 7);
  s = mixed();
  s.run({2, 0, 1}, 4);  // the same step without them is accepted
}

// docs/design/cp.md §3.1 / §3.2: the P/D recompute scheduler classes a short request still in
// its prompt (the decode node recomputing the last prompt token:
// num_computed == prompt_len - 1) as a decode; without it that request splits
// the batch as a prefill.
TEST(PlanDcpStep, PdRecomputeSchedulerTreatsShortExtendsAsDecodes) {
  auto make = [](bool pd) {
    Step s;
    s.qsl = {0, 1, 2, 5};
    s.seq = {7, 8, 3};            // a decode, the recomputed last prompt token (7 computed), a fresh prompt
    s.prefilling = {0, 1, 1};
    s.stride = 4;
    s.pd_recompute = pd;
    for (int r = 0; r < 3; ++r)
      for (int c = 0; c < 4; ++c) s.bt.push_back(1 + 4 * r + c);
    return s;
  };
  for (int32_t r = 0; r < 2; ++r) {
    Step plain = make(false);
    const DcpStepPlan a = plain.run({2, r, 1}, 1, 4);
    EXPECT_EQ(a.split.num_decodes, 1);
    EXPECT_EQ(a.split.num_prefills, 2);
    EXPECT_TRUE(a.has_context);  // the recomputed request's 7 tokens are prefill context
    Step pd = make(true);
    const DcpStepPlan b = pd.run({2, r, 1}, 1, 4);
    EXPECT_EQ(b.split.num_decodes, 2);
    EXPECT_EQ(b.split.num_decode_tokens, 2);
    EXPECT_EQ(b.split.num_prefills, 1);
    EXPECT_FALSE(b.has_context);
    EXPECT_EQ(pd.dkv[0], owned_before(7, 2, 1, r));
    EXPECT_EQ(pd.dkv[1], owned_before(8, 2, 1, r));
    // The slot mapping does not depend on the split.
    EXPECT_EQ(pd.slots, plain.slots);
  }
}

TEST(PlanDcpStep, DraftStepLengthsAreBasePlusIndexPlusOne) {
  const std::vector<int32_t> qsl = {0, 1, 2, 3}, base = {5, 9, 0};
  std::vector<int32_t> out(3, -7);
  const CSpan<int32_t> same = draft_step_seq_lens(CSpan<int32_t>(qsl.data(), 4), CSpan<int32_t>(base.data(), 3),
                                                  -1, Span<int32_t>(out.data(), 3));
  EXPECT_EQ(same.data(), base.data());
  EXPECT_EQ(out, std::vector<int32_t>(3, -7));
  const CSpan<int32_t> d2 = draft_step_seq_lens(CSpan<int32_t>(qsl.data(), 4), CSpan<int32_t>(base.data(), 3), 2,
                                                Span<int32_t>(out.data(), 3));
  EXPECT_EQ(d2.data(), out.data());
  EXPECT_EQ(out, (std::vector<int32_t>{8, 12, 3}));
  // The decode rows of the drafted step: local_len(base + d + 1, r), brute force.
  for (int32_t W : {2, 4})
    for (int32_t I : {1, 2})
      for (int32_t r = 0; r < W; ++r) {
        Step s;
        s.qsl = qsl;
        s.seq = out;
        s.prefilling = {1, 1, 1};  // a draft step is all decodes: run with the recompute rule
        s.pd_recompute = true;
        s.stride = 4;
        for (int q = 0; q < 3; ++q)
          for (int c = 0; c < 4; ++c) s.bt.push_back(1 + 4 * q + c);
        const DcpStepPlan p = s.run({W, r, I}, 1, 4);
        ASSERT_EQ(p.split.num_decodes, 3);
        for (int q = 0; q < 3; ++q) EXPECT_EQ(s.dkv[q], owned_before(base[q] + 3, W, I, r)) << W << I << r << q;
      }
  // Rejected, naming the argument; nothing written.
  std::fill(out.begin(), out.end(), -7);
  const std::vector<int32_t> two_tokens = {0, 2, 3, 4};
  auto bad = [&](const std::vector<int32_t>& q, const std::vector<int32_t>& b, int32_t d, std::size_t room) {
    try {
      draft_step_seq_lens(CSpan<int32_t>(q.data(), q.size()), CSpan<int32_t>(b.data(), b.size()), d,
                          Span<int32_t>(out.data(), room));
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(bad(two_tokens, base, 0, 3).find("one query token per request: query_start_loc[1]=2"),
            std::string::npos);
  EXPECT_NE(bad(qsl, base, 16, 3).find("draft_step=16 is out of range"), std::string::npos);
  EXPECT_NE(bad(qsl, base, -2, 3).find("draft_step=-2 is out of range"), std::string::npos);
  EXPECT_NE(bad(qsl, {5, -1, 0}, 0, 3).find("seq_lens[1]=-1"), std::string::npos);
  EXPECT_NE(bad(qsl, base, 0, 2).find("draft_seq_lens has room for 2"), std::string::npos);
  EXPECT_NE(bad({0, 1}, base, 0, 3).find("query_start_loc has 2 entries"), std::string::npos);
  EXPECT_EQ(out, std::vector<int32_t>(3, -7));
}

}  // namespace
}  // namespace aar::plan
