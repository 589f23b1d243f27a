// MLA PCP rows (plan/mla_pcp_plan.h, docs/design/cp.md §11): the upstream docstring batch, and
// random batches simulated end to end: every rank's local rows, the all-gather of their
// prefill rows restored to the padded-global order, the slots written there, against
// definitions written here from the words of docs/design/cp.md §6.1 / §6.3.
#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include "ascend_attn_rt/mla/plan/mla_pcp_plan.h"
#include "test_plan_util.h"

using namespace aar::plan;

namespace {

struct Batch {
  std::vector<int32_t> qsl, seq;
  int32_t nd = 0;
  std::vector<int64_t> slots;  // one per scheduled token
};

struct Rows {
  MlaPcpSizes sz;
  std::vector<int64_t> slot_mapping, q_ends, padded;
  std::vector<int32_t> positions, restore, token_index;
  std::vector<int32_t> qh, qt, hn, hm, tn, tm, qf;
  std::vector<int64_t> me, he, te;
  // scratch
  std::vector<int32_t> qlens, llens, pos, token_rows, inverse;
};

MlaPcpInputs inputs(const Batch& b, int32_t wp, int32_t rank) {
  MlaPcpInputs in;
  in.query_start_loc = b.qsl;
  in.seq_lens = b.seq;
  in.num_decodes = b.nd;
  in.pcp_size = wp;
  in.pcp_rank = rank;
  in.token_slots = b.slots;
  return in;
}

// Buffers of the exact sizes (filled with -7: an untouched entry stays -7).
MlaPcpBuffers buffers(Rows& r, const Batch& b, const MlaPcpSizes& sz, int32_t wp) {
  const std::size_t n = b.seq.size(), tl = sz.split.local_tokens, tpl = sz.split.local_prefill_tokens;
  const std::size_t g = sz.split.padded_global_tokens, ck = sz.head_tail.chunk_tokens;
  r.slot_mapping.assign(tl, -7);
  r.q_ends.assign(n - b.nd, -7);
  r.padded.assign(g, -7);
  r.positions.assign(tpl, -7);
  r.restore.assign(wp * tpl, -7);
  r.token_index.assign(tl, -7);
  r.qh.assign(ck, -7);
  r.qt.assign(ck, -7);
  r.hn.assign(sz.head_tail.head_nomask_tokens, -7);
  r.hm.assign(ck, -7);
  r.tn.assign(sz.head_tail.tail_nomask_tokens, -7);
  r.tm.assign(ck, -7);
  r.qf.assign(2 * ck, -7);
  r.me.assign(n - b.nd, -7);
  r.he.assign(n - b.nd, -7);
  r.te.assign(n - b.nd, -7);
  r.qlens.assign(n, 0);
  r.llens.assign(n, 0);
  r.pos.assign(tl, 0);
  r.token_rows.assign(b.qsl.back() + g, 0);
  r.inverse.assign(wp * tpl, 0);
  MlaPcpBuffers o;
  o.slot_mapping = r.slot_mapping;
  o.prefill_positions = r.positions;
  o.prefill_q_ends = r.q_ends;
  o.padded_slot_mapping = r.padded;
  o.prefill_restore_idx = r.restore;
  o.head_tail = {r.qh, r.qt, r.hn, r.hm, r.tn, r.tm, r.qf, r.me, r.he, r.te};
  o.local_token_index = r.token_index;
  o.query_lens = r.qlens;
  o.local_lens = r.llens;
  o.positions = r.pos;
  o.token_rows = r.token_rows;
  o.restore_inverse = r.inverse;
  return o;
}

Rows plan_rows(const Batch& b, int32_t wp, int32_t rank) {
  Rows r;
  std::vector<int32_t> scratch(b.seq.size());
  r.sz = mla_pcp_sizes(inputs(b, wp, rank), scratch);
  const MlaPcpSizes got = plan_mla_pcp_rows(inputs(b, wp, rank), buffers(r, b, r.sz, wp));
  EXPECT_EQ(got.split.local_tokens, r.sz.split.local_tokens);
  return r;
}

int32_t chunk(int32_t q, int32_t wp) { return (q + 2 * wp - 1) / (2 * wp); }

Batch random_batch(std::mt19937& rng) {
  Batch b;
  const int32_t n = 1 + static_cast<int32_t>(rng() % 5);
  b.nd = static_cast<int32_t>(rng() % (n + 1));
  b.qsl = {0};
  for (int32_t i = 0; i < n; ++i) {
    const int32_t q = i < b.nd ? 1 : 1 + static_cast<int32_t>(rng() % 19);
    const int32_t ctx = static_cast<int32_t>(rng() % 3 == 0 ? 0 : rng() % 40);
    b.qsl.push_back(b.qsl.back() + q);
    b.seq.push_back(ctx + q);
  }
  // Distinct slots, some -1 (tokens another KV rank owns).
  for (int32_t t = 0; t < b.qsl.back(); ++t) b.slots.push_back(rng() % 4 == 0 ? -1 : 1000 + 3 * t);
  return b;
}

}  // namespace

TEST(MlaPcpPlan, UpstreamDocstringBatch) {
  // q = [1, 5, 8], one decode, Wp = 2 (docs/design/cp.md §6.1); contexts 9, 0, 3.
  Batch b{{0, 1, 6, 14}, {10, 5, 11}, 1, {}};
  for (int32_t t = 0; t < 14; ++t) b.slots.push_back(100 + t);
  const Rows r0 = plan_rows(b, 2, 0), r1 = plan_rows(b, 2, 1);
  EXPECT_EQ(r0.sz.split.local_tokens, 9);
  EXPECT_EQ(r0.token_index, (std::vector<int32_t>{0, 1, 2, -1, -1, 6, 7, 12, 13}));
  EXPECT_EQ(r1.token_index, (std::vector<int32_t>{0, 3, 4, 5, -1, 8, 9, 10, 11}));
  // Positions: context + chunk position, pads at the request's last position.
  EXPECT_EQ(r0.positions, (std::vector<int32_t>{0, 1, 4, 4, 3, 4, 9, 10}));
  EXPECT_EQ(r1.positions, (std::vector<int32_t>{2, 3, 4, 4, 5, 6, 7, 8}));
  EXPECT_EQ(r0.q_ends, (std::vector<int64_t>{4, 8}));
  EXPECT_EQ(r0.sz.prefill_max_query_len, 4);
  // The decode keeps its slot; prefill rows are written after the gather.
  EXPECT_EQ(r0.slot_mapping, (std::vector<int64_t>{100, -1, -1, -1, -1, -1, -1, -1, -1}));
  // The decode region keeps every Wp-th entry: [100, -1], then the prefills' padded regions.
  const std::vector<int64_t> want{100, -1, 101, 102, 103, 104, 105, -1, -1, -1,
                                  106, 107, 108, 109, 110, 111, 112, 113};
  EXPECT_EQ(r0.padded, want);
  EXPECT_EQ(r1.padded, want);
}

TEST(MlaPcpPlan, RandomBatchesGatherRestoreAndSlots) {
  std::mt19937 rng(7);
  for (int iter = 0; iter < 300; ++iter) {
    const Batch b = random_batch(rng);
    const int32_t wp = 1 + static_cast<int32_t>(rng() % 4);
    const std::size_t n = b.seq.size();
    const int32_t td = b.qsl[b.nd];
    std::vector<Rows> ranks;
    for (int32_t r = 0; r < wp; ++r) ranks.push_back(plan_rows(b, wp, r));
    const int32_t tl = ranks[0].sz.split.local_tokens, tpl = tl - td;
    // Every rank: the decode rows are the decode tokens with their slots; prefill rows -1.
    std::vector<int32_t> seen(b.qsl.back(), 0);
    for (int32_t r = 0; r < wp; ++r) {
      const Rows& x = ranks[r];
      ASSERT_EQ(x.sz.split.local_tokens, tl);
      for (int32_t t = 0; t < tl; ++t) {
        EXPECT_EQ(x.slot_mapping[t], t < td ? b.slots[t] : -1);
        if (t < td) EXPECT_EQ(x.token_index[t], t);
        if (x.token_index[t] >= 0) ++seen[x.token_index[t]];
      }
    }
    // Decodes are computed by every rank, prefill tokens by exactly one.
    for (int32_t t = 0; t < b.qsl.back(); ++t) EXPECT_EQ(seen[t], t < td ? wp : 1) << "token " << t;
    // The rank-major gather of the ranks' prefill rows (their global tokens), restored.
    std::vector<int32_t> gathered;
    for (int32_t r = 0; r < wp; ++r) {
      gathered.insert(gathered.end(), ranks[r].token_index.begin() + td, ranks[r].token_index.end());
    }
    for (int32_t r = 0; r < wp; ++r) {
      const Rows& x = ranks[r];
      // The padded-global prefill region: request by request, 2 c Wp entries, position k < q
      // holding token qsl + k (pads beyond), with that token's slot.
      int64_t k0 = 0;
      int32_t row = td;
      for (std::size_t i = b.nd; i < n; ++i) {
        const int32_t q = b.qsl[i + 1] - b.qsl[i], c = chunk(q, wp), ctx = b.seq[i] - q;
        for (int32_t k = 0; k < 2 * c * wp; ++k) {
          const int32_t src = gathered[x.restore[k0 + k]];
          EXPECT_EQ(src, k < q ? b.qsl[i] + k : -1);
          EXPECT_EQ(x.padded[wp * td + k0 + k], k < q ? b.slots[b.qsl[i] + k] : -1);
        }
        k0 += 2 * c * wp;
        for (int32_t j = 0; j < 2 * c; ++j, ++row) {
          const int32_t t = x.token_index[row];
          EXPECT_EQ(x.positions[row - td], t >= 0 ? ctx + t - b.qsl[i] : ctx + q - 1);
        }
      }
      EXPECT_EQ(k0, static_cast<int64_t>(wp) * tpl);
      // The decode region: rank 0's copy of every decode token keeps its slot.
      for (int32_t k = 0; k < wp * td; ++k) EXPECT_EQ(x.padded[k], k % wp == 0 ? b.slots[k / wp] : -1);
      // The head/tail lists are pcp_head_tail_indices' own.
      std::vector<int32_t> qh(x.qh.size()), qt(x.qt.size()), hn(x.hn.size()), hm(x.hm.size()), tn(x.tn.size()),
          tm(x.tm.size()), qf(x.qf.size());
      std::vector<int64_t> me(x.me.size()), he(x.he.size()), te(x.te.size());
      std::vector<int32_t> qlens;
      for (std::size_t i = 0; i < n; ++i) qlens.push_back(b.qsl[i + 1] - b.qsl[i]);
      pcp_head_tail_indices({qlens, b.nd, wp}, r, {qh, qt, hn, hm, tn, tm, qf, me, he, te});
      EXPECT_EQ(x.qh, qh);
      EXPECT_EQ(x.hn, hn);
      EXPECT_EQ(x.tm, tm);
      EXPECT_EQ(x.qf, qf);
      EXPECT_EQ(x.te, te);
    }
  }
}

TEST(MlaPcpPlan, RejectsBadInputBeforeAnyWrite) {
  Batch b{{0, 1, 6}, {9, 5}, 1, {1, 2, 3, 4, 5, 6}};
  Rows r;
  std::vector<int32_t> scratch(2);
  const MlaPcpSizes sz = mla_pcp_sizes(inputs(b, 2, 0), scratch);
  auto untouched = [&] {
    return std::all_of(r.slot_mapping.begin(), r.slot_mapping.end(), [](int64_t v) { return v == -7; }) &&
           std::all_of(r.padded.begin(), r.padded.end(), [](int64_t v) { return v == -7; }) &&
           std::all_of(r.token_index.begin(), r.token_index.end(), [](int32_t v) { return v == -7; });
  };
  MlaPcpBuffers o = buffers(r, b, sz, 2);
  Batch bad = b;
  bad.seq = {9, 4};
  EXPECT_INVALID(plan_mla_pcp_rows(inputs(bad, 2, 0), o), "smaller than its query length");
  bad = b;
  bad.qsl = {0, 3, 2};
  bad.slots.resize(2);
  EXPECT_INVALID(plan_mla_pcp_rows(inputs(bad, 2, 0), o), "non-decreasing");
  bad = b;
  bad.slots.pop_back();
  EXPECT_INVALID(plan_mla_pcp_rows(inputs(bad, 2, 0), o), "token_slots");
  EXPECT_INVALID(plan_mla_pcp_rows(inputs(b, 2, 2), o), "rank=2");
  bad = b;
  bad.nd = 3;
  EXPECT_INVALID(plan_mla_pcp_rows(inputs(bad, 2, 0), o), "num_decodes");
  MlaPcpBuffers small = o;
  small.padded_slot_mapping = small.padded_slot_mapping.first(small.padded_slot_mapping.size() - 1);
  EXPECT_INVALID(plan_mla_pcp_rows(inputs(b, 2, 0), small), "padded_slot_mapping");
  small = o;
  small.head_tail.q_full_idx = small.head_tail.q_full_idx.first(1);
  EXPECT_INVALID(plan_mla_pcp_rows(inputs(b, 2, 0), small), "q_full_idx");
  EXPECT_TRUE(untouched());
  plan_mla_pcp_rows(inputs(b, 2, 0), o);
  EXPECT_FALSE(untouched());
}

TEST(MlaPcpPlan, DecodeOnlyStepsAgainstTheDefinition) {
  // docs/design/cp.md §11.7: a decode-only step skips the prefill lists' passes; its rows are the
  // decode tokens (their own slots), the padded-global mapping each token's slot at t * Wp and -1 in
  // the other Wp - 1 copies, every head/tail count 0; speculative decodes (q > 1) too.
  std::mt19937 rng(7);
  for (int it = 0; it < 200; ++it) {
    const int32_t wp = 1 + it % 4, n = 1 + static_cast<int32_t>(rng() % 9);
    Batch b;
    b.nd = n;
    b.qsl = {0};
    for (int32_t i = 0; i < n; ++i) {
      const int32_t q = 1 + static_cast<int32_t>(rng() % 3);
      b.qsl.push_back(b.qsl.back() + q);
      b.seq.push_back(q + static_cast<int32_t>(rng() % 50));
    }
    for (int32_t t = 0; t < b.qsl.back(); ++t) b.slots.push_back(rng() % 3 == 0 ? -1 : 500 + 7 * t);
    for (int32_t rank = 0; rank < wp; ++rank) {
      const Rows r = plan_rows(b, wp, rank);
      const int32_t td = b.qsl.back();
      ASSERT_EQ(r.sz.split.local_tokens, td);
      ASSERT_EQ(r.sz.split.padded_global_tokens, td * wp);
      EXPECT_EQ(r.sz.head_tail.num_prefills, 0);
      EXPECT_EQ(r.sz.head_tail.chunk_tokens, 0);
      EXPECT_EQ(r.sz.head_tail.head_nomask_tokens, 0);
      EXPECT_EQ(r.sz.head_tail.tail_nomask_tokens, 0);
      EXPECT_EQ(r.sz.prefill_max_query_len, 0);
      for (int32_t t = 0; t < td; ++t) {
        ASSERT_EQ(r.slot_mapping[t], b.slots[t]);
        ASSERT_EQ(r.token_index[t], t);
        for (int32_t k = 0; k < wp; ++k) ASSERT_EQ(r.padded[t * wp + k], k == 0 ? b.slots[t] : -1) << t << " " << k;
      }
    }
    // A bad rank is still refused by name on a decode-only step.
    std::vector<int32_t> scratch(b.seq.size());
    EXPECT_INVALID(mla_pcp_sizes(inputs(b, wp, wp), scratch), "out of range");
  }
}
