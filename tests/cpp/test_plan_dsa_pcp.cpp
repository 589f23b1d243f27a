// One DSA PCP rank's step (docs/design/sparse_cp.md §13, plan_dsa_pcp_step) against brute-force definitions
// written here. Tokens: a prefill of q tokens is padded to 2 Wp c and cut into 2 Wp chunks of c, chunk k going
// to rank k (head) or 2 Wp - 1 - k (tail); decodes go to every rank. Cache writes: the gathered rows restored
// to the global step (every global token once, a decode from rank 0's copy: the row every rank writes at the
// global step's slot). Segments, by what they mean for the attention: every real row sees exactly the keys
// [0, its position] of its request (bottom-right causal over the segment's SAS and QLI lengths), every pad row
// no indexer key and SAS keys inside its request; the block-table row of a segment is its request.
#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "ascend_attn_rt/cp/plan/sparse_cp.h"
#include "test_plan_util.h"

using namespace aar::plan;
using aar_test::lens_to_qsl;

namespace {

constexpr int32_t kSentinel = 0x5A5A5A5A;

struct Step {
  std::vector<int32_t> token, pos, gather, gcum, qcum, iseq, req, sas, sascu;
  DsaPcpPlan plan;
};

Step plan(const std::vector<int32_t>& qsl, const std::vector<int32_t>& seq, int32_t nd, int32_t wp, int32_t rp) {
  SparsePcpInputs in{qsl, seq, nd, wp, rp};
  const SparsePcpSizes s = sparse_pcp_sizes(in);
  Step r;
  r.token.assign(s.local_tokens, kSentinel);
  r.pos.assign(s.local_tokens, kSentinel);
  r.gather.assign(qsl.back(), kSentinel);
  r.gcum.assign(static_cast<std::size_t>(wp) * seq.size(), kSentinel);
  r.qcum.assign(s.indexer_reqs, kSentinel);
  r.iseq.assign(s.indexer_reqs, kSentinel);
  r.req.assign(s.indexer_reqs, kSentinel);
  r.sas.assign(s.indexer_reqs, kSentinel);
  r.sascu.assign(s.indexer_reqs + 1, kSentinel);
  DsaPcpBuffers b{SparsePcpBuffers{r.token, r.pos, r.gather, r.gcum, r.qcum, r.iseq, r.req}, r.sas, r.sascu};
  r.plan = plan_dsa_pcp_step(in, b);
  return r;
}

struct Def {
  std::vector<int32_t> token, pos, req;
};
Def definition(const std::vector<int32_t>& qsl, const std::vector<int32_t>& seq, int32_t nd, int32_t wp, int32_t rp) {
  Def d;
  for (std::size_t b = 0; b + 1 < qsl.size(); ++b) {
    const int32_t q = qsl[b + 1] - qsl[b], ctx = seq[b] - q;
    if (static_cast<int32_t>(b) < nd) {
      for (int32_t i = 0; i < q; ++i) {
        d.token.push_back(qsl[b] + i);
        d.pos.push_back(ctx + i);
        d.req.push_back(static_cast<int32_t>(b));
      }
      continue;
    }
    int32_t c = 0;
    while (2 * wp * c < q) ++c;
    for (const int32_t k : {rp, 2 * wp - 1 - rp}) {
      for (int32_t p = k * c; p < (k + 1) * c; ++p) {
        d.token.push_back(p < q ? qsl[b] + p : -1);
        d.pos.push_back(ctx + std::min(p, q - 1));
        d.req.push_back(static_cast<int32_t>(b));
      }
    }
  }
  return d;
}

void check_batch(const std::vector<int32_t>& qlens, const std::vector<int32_t>& ctx, int32_t nd, int32_t wp) {
  const std::vector<int32_t> qsl = lens_to_qsl(qlens);
  std::vector<int32_t> seq(qlens.size());
  for (std::size_t b = 0; b < qlens.size(); ++b) seq[b] = ctx[b] + qlens[b];
  std::vector<Def> defs;
  std::vector<Step> steps;
  for (int32_t rp = 0; rp < wp; ++rp) {
    defs.push_back(definition(qsl, seq, nd, wp, rp));
    steps.push_back(plan(qsl, seq, nd, wp, rp));
  }
  const int32_t tl = steps[0].plan.sizes.local_tokens;
  // The cache writes: the rank-major gather of every rank's local rows (its token ids) restored with the
  // gather index is the global step, token t at row t, a decode from rank 0's copy; the same on every rank.
  std::vector<int32_t> gathered;
  for (const Def& d : defs) gathered.insert(gathered.end(), d.token.begin(), d.token.end());
  for (int32_t rp = 0; rp < wp; ++rp) {
    SCOPED_TRACE(::testing::Message() << "wp=" << wp << " rank=" << rp);
    const Def& d = defs[rp];
    const Step& r = steps[rp];
    ASSERT_EQ(r.plan.sizes.local_tokens, static_cast<int32_t>(d.token.size()));
    EXPECT_EQ(r.plan.sizes.local_tokens, tl);
    EXPECT_EQ(r.token, d.token);
    EXPECT_EQ(r.pos, d.pos);
    EXPECT_EQ(r.gather, steps[0].gather);
    for (int32_t t = 0; t < qsl.back(); ++t) {
      ASSERT_GE(r.gather[t], 0);
      ASSERT_LT(r.gather[t], static_cast<int32_t>(gathered.size()));
      EXPECT_EQ(gathered[r.gather[t]], t) << t;
      if (t < qsl[nd]) {
        EXPECT_LT(r.gather[t], tl) << "a decode token's rank-0 copy";
      }
    }
    // Segments tile the local rows in order.
    ASSERT_EQ(r.qcum.empty() ? 0 : r.qcum.back(), tl);
    ASSERT_EQ(r.sascu.size(), r.qcum.size() + 1);
    EXPECT_EQ(r.sascu[0], 0);
    int32_t begin = 0, mq = 0, mkv = 0, mikv = 0;
    for (std::size_t k = 0; k < r.qcum.size(); ++k) {
      const int32_t end = r.qcum[k], nq = end - begin;
      EXPECT_GT(nq, 0);
      EXPECT_EQ(r.sascu[k + 1], r.sascu[k] + r.sas[k]);
      mq = std::max(mq, nq);
      mkv = std::max(mkv, r.sas[k]);
      mikv = std::max(mikv, r.iseq[k]);
      // SAS needs KV >= its query rows, inside the request.
      EXPECT_GE(r.sas[k], nq);
      EXPECT_LE(r.sas[k], seq[r.req[k]]);
      for (int32_t i = 0; i < nq; ++i) {
        const int32_t row = begin + i;
        EXPECT_EQ(r.req[k], d.req[row]);
        const int32_t sas_visible = r.sas[k] - nq + i + 1;
        const int32_t idx_visible = std::max(r.iseq[k] - nq + i + 1, 0);
        if (d.token[row] >= 0) {
          EXPECT_EQ(sas_visible, d.pos[row] + 1) << "row " << row;
          EXPECT_EQ(idx_visible, d.pos[row] + 1) << "row " << row;
        } else {
          EXPECT_EQ(r.iseq[k], 0) << "pad row " << row;
          EXPECT_GE(sas_visible, 1) << "pad row " << row;
          // a pad segment is pads only
          for (int32_t j = 0; j < nq; ++j) EXPECT_EQ(d.token[begin + j], -1);
        }
      }
      begin = end;
    }
    EXPECT_EQ(r.plan.max_seqlen_q, mq);
    EXPECT_EQ(r.plan.max_seqlen_kv, mkv);
    EXPECT_EQ(r.plan.max_indexer_seqlen_kv, mikv);
  }
  // Every prefill token attended by exactly one rank, every decode token by all.
  for (int32_t t = 0; t < qsl.back(); ++t) {
    int32_t copies = 0;
    for (const Def& d : defs) copies += static_cast<int32_t>(std::count(d.token.begin(), d.token.end(), t));
    EXPECT_EQ(copies, t < qsl[nd] ? wp : 1) << t;
  }
}

}  // namespace

TEST(PlanDsaPcp, ShortRequestAndDecode) {
  // A decode (q 1, S 10) and a 1-token prefill at Wp = 2 (shorter than the group: c = 1, rank 0 holds its
  // token and one pad chunk, rank 1 two pad chunks).
  const std::vector<int32_t> qsl = {0, 1, 3}, seq = {10, 6};
  const Step r0 = plan(qsl, seq, 1, 2, 0), r1 = plan(qsl, seq, 1, 2, 1);
  EXPECT_EQ(r0.token, (std::vector<int32_t>{0, 1, -1}));  // c = 1: chunks 0 (p 0) and 3 (p 3: pad)
  // qlens 2: c = 1; rank 0 chunks 0 and 3 -> [p0, pad], rank 1 chunks 1 and 2 -> [p1, pad]
  EXPECT_EQ(r0.qcum, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(r0.iseq, (std::vector<int32_t>{10, 5, 0}));
  EXPECT_EQ(r0.sas, (std::vector<int32_t>{10, 5, 1}));
  EXPECT_EQ(r0.sascu, (std::vector<int32_t>{0, 10, 15, 16}));
  EXPECT_EQ(r1.token, (std::vector<int32_t>{0, 2, -1}));
  EXPECT_EQ(r1.iseq, (std::vector<int32_t>{10, 6, 0}));
  EXPECT_EQ(r1.sas, (std::vector<int32_t>{10, 6, 1}));
  // token 2 (p 1) sits at rank 1's row 1 of the gather: 3 + 1
  EXPECT_EQ(r0.gather, (std::vector<int32_t>{0, 1, 4}));
  check_batch({1, 2}, {9, 4}, 1, 2);
  check_batch({1}, {0}, 0, 2);  // a 1-token fresh prefill: rank 1 holds pads only
}

TEST(PlanDsaPcp, RandomBatchesAgainstDefinition) {
  std::mt19937 rng(29);
  for (int trial = 0; trial < 300; ++trial) {
    const int32_t wp = 1 + static_cast<int32_t>(rng() % 5);
    const int32_t n = 1 + static_cast<int32_t>(rng() % 6);
    const int32_t nd = static_cast<int32_t>(rng() % (n + 1));
    std::vector<int32_t> q(n), ctx(n);
    for (int32_t b = 0; b < n; ++b) {
      q[b] = b < nd ? 1 + static_cast<int32_t>(rng() % 3) : 1 + static_cast<int32_t>(rng() % 20);
      ctx[b] = static_cast<int32_t>(rng() % 30);
    }
    check_batch(q, ctx, nd, wp);
  }
}

TEST(PlanDsaPcp, RejectionsWriteNothing) {
  const std::vector<int32_t> qsl = {0, 1, 6}, seq = {4, 7};
  std::vector<std::vector<int32_t>> v(9, std::vector<int32_t>(32, kSentinel));
  auto bufs = [&](std::size_t nsas, std::size_t ncu) {
    return DsaPcpBuffers{SparsePcpBuffers{v[0], v[1], v[2], v[3], v[4], v[5], v[6]},
                         Span<int32_t>(v[7].data(), nsas), Span<int32_t>(v[8].data(), ncu)};
  };
  auto untouched = [&] {
    for (const auto& x : v) EXPECT_EQ(x, std::vector<int32_t>(32, kSentinel));
  };
  EXPECT_INVALID(plan_dsa_pcp_step({qsl, seq, 1, 2, 2}, bufs(32, 32)), "pcp_rank=2 is out of range [0, pcp_size=2)");
  // rank 0: the decode, then req 1 (q 5, c 2): head [p0 p1] real, tail chunk 3 [p6 p7] pads: 3 segments
  EXPECT_INVALID(plan_dsa_pcp_step({qsl, seq, 1, 2, 0}, bufs(2, 32)), "sas_seq_lens has room for 2 entries, needs 3");
  EXPECT_INVALID(plan_dsa_pcp_step({qsl, seq, 1, 2, 0}, bufs(32, 3)), "sas_cu_seqlens_kv has room for 3 entries, needs 4");
  const std::vector<int32_t> big = {4, 1 << 30};
  EXPECT_INVALID(plan_dsa_pcp_step({qsl, big, 1, 2, 0}, bufs(32, 32)), "past the int32 range of sas_cu_seqlens_kv");
  untouched();
}
