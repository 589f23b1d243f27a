// One SFA PCP rank's rows (docs/design/sparse_cp.md §11, plan_sparse_pcp_rows) against brute-force
// definitions written here: a prefill of q tokens is padded to 2 Wp c and cut into 2 Wp chunks of c,
// chunk k going to rank k (head) or 2 Wp - 1 - k (tail); decodes go to every rank. The indexer
// requests are checked by what they mean: every real row's causal limit is its own position, every pad
// row sees no key. Also one rejected call per check, each leaving every buffer as it was.
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

struct Rows {
  std::vector<int32_t> token, pos, gather, gcum, icum, iseq, ireq;
  SparsePcpSizes sizes;
};

Rows plan(const std::vector<int32_t>& qsl, const std::vector<int32_t>& seq, int32_t nd, int32_t wp, int32_t rp) {
  SparsePcpInputs in{qsl, seq, nd, wp, rp};
  const SparsePcpSizes s = sparse_pcp_sizes(in);
  Rows r;
  r.token.assign(s.local_tokens, kSentinel);
  r.pos.assign(s.local_tokens, kSentinel);
  r.gather.assign(qsl.back(), kSentinel);
  r.gcum.assign(static_cast<std::size_t>(wp) * seq.size(), kSentinel);
  r.icum.assign(s.indexer_reqs, kSentinel);
  r.iseq.assign(s.indexer_reqs, kSentinel);
  r.ireq.assign(s.indexer_reqs, kSentinel);
  r.sizes = plan_sparse_pcp_rows(in, SparsePcpBuffers{r.token, r.pos, r.gather, r.gcum, r.icum, r.iseq, r.ireq});
  return r;
}

// The brute-force rows of rank rp: (global token or -1, position) of every local row, and the request of each.
struct Def {
  std::vector<int32_t> token, pos, req, in_req_pos;  // in_req_pos: the new-token index p (pads: >= q)
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
        d.in_req_pos.push_back(i);
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
        d.in_req_pos.push_back(p);
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
  std::vector<Rows> rows;
  for (int32_t rp = 0; rp < wp; ++rp) {
    defs.push_back(definition(qsl, seq, nd, wp, rp));
    rows.push_back(plan(qsl, seq, nd, wp, rp));
  }
  const int32_t tl = rows[0].sizes.local_tokens;
  for (int32_t rp = 0; rp < wp; ++rp) {
    const Def& d = defs[rp];
    const Rows& r = rows[rp];
    SCOPED_TRACE(::testing::Message() << "wp=" << wp << " rank=" << rp);
    ASSERT_EQ(r.sizes.local_tokens, static_cast<int32_t>(d.token.size()));  // the same on every rank
    EXPECT_EQ(r.sizes.local_tokens, tl);
    EXPECT_EQ(r.sizes.num_decode_tokens, qsl[nd]);
    EXPECT_EQ(r.token, d.token);
    EXPECT_EQ(r.pos, d.pos);
    // The gather index: the same on every rank, and row gather[t] of the rank-major gather is token t.
    EXPECT_EQ(r.gather, rows[0].gather);
    for (int32_t t = 0; t < qsl.back(); ++t) {
      const int32_t g = r.gather[t], j = g / tl;
      ASSERT_TRUE(g >= 0 && j < wp) << t;
      EXPECT_EQ(defs[j].token[g % tl], t) << t;
    }
    // The gathered row groups: (rank j, request b) -> j * T_loc + the rows of requests <= b.
    for (int32_t j = 0; j < wp; ++j) {
      for (std::size_t b = 0; b < seq.size(); ++b) {
        const auto n = std::count_if(d.req.begin(), d.req.end(), [&](int32_t x) { return x <= static_cast<int32_t>(b); });
        EXPECT_EQ(r.gcum[j * seq.size() + b], j * tl + n) << j << " " << b;
      }
    }
    // The indexer requests cover the local rows in order; a real row at position x sees exactly the
    // keys [0, x] (bottom-right causal: kv - q_req + i + 1), a pad row none; the block-table row is its request.
    ASSERT_EQ(r.icum.empty() ? 0 : r.icum.back(), tl);
    int32_t begin = 0;
    for (std::size_t k = 0; k < r.icum.size(); ++k) {
      const int32_t end = r.icum[k], nq = end - begin;
      EXPECT_GT(nq, 0) << "no empty request";
      for (int32_t i = 0; i < nq; ++i) {
        const int32_t row = begin + i;
        EXPECT_EQ(r.ireq[k], d.req[row]);
        const int32_t visible = std::max(r.iseq[k] - nq + i + 1, 0);
        if (d.token[row] >= 0) {
          EXPECT_EQ(visible, d.pos[row] + 1) << "row " << row;
          EXPECT_LE(r.iseq[k], seq[d.req[row]]);
        } else {
          EXPECT_EQ(r.iseq[k], 0) << "pad row " << row;
        }
      }
      begin = end;
    }
  }
  // Every prefill token on exactly one rank, every decode token on all.
  for (int32_t t = 0; t < qsl.back(); ++t) {
    int32_t copies = 0;
    for (const Def& d : defs) copies += static_cast<int32_t>(std::count(d.token.begin(), d.token.end(), t));
    EXPECT_EQ(copies, t < qsl[nd] ? wp : 1) << t;
  }
}

}  // namespace

TEST(PlanSparsePcp, DocstringBatch) {
  // q = [1, 5, 8], one decode, Wp = 2 (docs/design/cp.md §6.1): rank 0 positions [0 | 0,1,6,7 | 0,1,6,7].
  const std::vector<int32_t> qsl = {0, 1, 6, 14}, seq = {10, 5, 12};
  const Rows r0 = plan(qsl, seq, 1, 2, 0);
  EXPECT_EQ(r0.sizes.local_tokens, 9);
  EXPECT_EQ(r0.token, (std::vector<int32_t>{0, 1, 2, -1, -1, 6, 7, 12, 13}));
  EXPECT_EQ(r0.pos, (std::vector<int32_t>{9, 0, 1, 4, 4, 4, 5, 10, 11}));
  // decode (1, 10); req 1: head [0,1] (2, 2), tail chunk 3 = pads (2, 0); req 2: head (2, 6), tail (2, 12)
  EXPECT_EQ(r0.icum, (std::vector<int32_t>{1, 3, 5, 7, 9}));
  EXPECT_EQ(r0.iseq, (std::vector<int32_t>{10, 2, 0, 6, 12}));
  EXPECT_EQ(r0.ireq, (std::vector<int32_t>{0, 1, 1, 2, 2}));
  EXPECT_EQ(r0.gcum, (std::vector<int32_t>{1, 5, 9, 10, 14, 18}));
  // token 4 (req 1, p = 3): chunk 1, rank 1's head: 9 + 1 + 1 = 11
  // req 1 (c = 2): p 0,1 rank 0's head, 2,3 rank 1's head, 4 rank 1's tail; req 2 likewise, 6,7 rank 0's tail
  EXPECT_EQ(r0.gather, (std::vector<int32_t>{0, 1, 2, 10, 11, 12, 5, 6, 14, 15, 16, 17, 7, 8}));
  check_batch({1, 5, 8}, {9, 0, 4}, 1, 2);
}

TEST(PlanSparsePcp, RandomBatchesAgainstDefinition) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 300; ++trial) {
    const int32_t wp = 1 + static_cast<int32_t>(rng() % 5);
    const int32_t n = 1 + static_cast<int32_t>(rng() % 6);
    const int32_t nd = static_cast<int32_t>(rng() % (n + 1));
    std::vector<int32_t> q(n), ctx(n);
    for (int32_t b = 0; b < n; ++b) {
      q[b] = b < nd ? 1 + static_cast<int32_t>(rng() % 2) : static_cast<int32_t>(rng() % 20);
      ctx[b] = static_cast<int32_t>(rng() % 30);
    }
    check_batch(q, ctx, nd, wp);
  }
}

TEST(PlanSparsePcp, RejectionsWriteNothing) {
  const std::vector<int32_t> qsl = {0, 1, 6}, seq = {4, 7};
  std::vector<int32_t> a(32, kSentinel), b(32, kSentinel), c(32, kSentinel), d(32, kSentinel), e(32, kSentinel),
      f(32, kSentinel), g(32, kSentinel);
  auto bufs = [&](std::size_t na) {
    return SparsePcpBuffers{Span<int32_t>(a.data(), na), b, c, d, e, f, g};
  };
  auto untouched = [&] {
    for (const auto* v : {&a, &b, &c, &d, &e, &f, &g}) EXPECT_EQ(*v, std::vector<int32_t>(32, kSentinel));
  };
  EXPECT_INVALID(plan_sparse_pcp_rows({qsl, seq, 1, 0, 0}, bufs(32)), "pcp_size=0 must be in [1, 16]");
  EXPECT_INVALID(plan_sparse_pcp_rows({qsl, seq, 1, 17, 0}, bufs(32)), "pcp_size=17 must be in [1, 16]");
  EXPECT_INVALID(plan_sparse_pcp_rows({qsl, seq, 1, 2, 2}, bufs(32)), "pcp_rank=2 is out of range [0, pcp_size=2)");
  EXPECT_INVALID(plan_sparse_pcp_rows({qsl, seq, 3, 2, 0}, bufs(32)), "num_decodes=3 is out of range [0, num_reqs=2]");
  const std::vector<int32_t> short_seq = {4, 3};
  EXPECT_INVALID(plan_sparse_pcp_rows({qsl, short_seq, 1, 2, 0}, bufs(32)), "seq_lens[1]=3 is smaller than its query length 5");
  const std::vector<int32_t> bad_qsl = {0, 2, 1};
  EXPECT_INVALID(plan_sparse_pcp_rows({bad_qsl, seq, 1, 2, 0}, bufs(32)), "query_start_loc must be non-decreasing");
  // T_loc = 1 + 2 * 2 = 5 rows
  EXPECT_INVALID(plan_sparse_pcp_rows({qsl, seq, 1, 2, 0}, bufs(4)), "local_token_index has room for 4 entries, needs 5");
  untouched();
}
