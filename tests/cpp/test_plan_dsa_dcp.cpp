// The per-row lists of a DSA DCP step (docs/design/sparse_cp.md §12.2, dsa/plan/dsa_dcp_plan.h) against
// brute-force definitions written here: the window [p - win_left, p] of each query row remapped with the
// host form of the DCP top-k remap (remap_sparse_indices: owned positions as local indices, in order,
// then -1), each local index looked up in the rank's block table; the compressed-row limit
// floor((p + 1) / r). Rows past the requests: all -1 / 0.
#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "ascend_attn_rt/cp/plan/sparse_cp.h"
#include "ascend_attn_rt/dsa/plan/dsa_dcp_plan.h"
#include "test_plan_util.h"

using namespace aar::plan;
using aar::dsa::DsaDcpRows;
using aar::dsa::plan_dsa_dcp_cmp_limits;
using aar::dsa::plan_dsa_dcp_window_slots;

namespace {

constexpr int32_t kSentinel = 0x5A5A5A5A;

struct Case {
  std::vector<int32_t> qsl, start, table;
  int64_t rows = 0, stride = 0;
};

// Row t's request by the layer's old definition: #{b : qsl[b + 1] <= t}.
int32_t request_of(const Case& c, int64_t t) {
  int32_t b = 0;
  while (b + 1 < static_cast<int32_t>(c.qsl.size()) && c.qsl[b + 1] <= t) ++b;
  return b;
}

std::vector<int32_t> brute_window(const Case& c, const DcpShard& sh, int64_t sbs, int32_t wl) {
  const int64_t B = static_cast<int64_t>(c.start.size()), w = wl + 1;
  std::vector<int32_t> out(static_cast<size_t>(c.rows * w), -1);
  for (int64_t t = 0; t < c.rows; ++t) {
    if (t >= c.qsl[B]) continue;
    const int32_t b = request_of(c, t);
    const int64_t p = c.start[b] + t - c.qsl[b];
    std::vector<int32_t> cand(static_cast<size_t>(w)), li(static_cast<size_t>(w));
    for (int64_t j = 0; j < w; ++j) cand[j] = p - wl + j < 0 ? -1 : static_cast<int32_t>(p - wl + j);
    remap_sparse_indices(cand, static_cast<int32_t>(w), sh, li);
    for (int64_t j = 0; j < w; ++j) {
      if (li[j] < 0) continue;
      out[t * w + j] = static_cast<int32_t>(int64_t{c.table[b * c.stride + li[j] / sbs]} * sbs + li[j] % sbs);
    }
  }
  return out;
}

DsaDcpRows rows_of(const Case& c, const DcpShard& sh) {
  DsaDcpRows r;
  r.query_start_loc = c.qsl;
  r.start_pos = c.start;
  r.num_reqs = static_cast<int32_t>(c.start.size());
  r.num_rows = c.rows;
  r.shard = sh;
  return r;
}

Case random_case(std::mt19937& g, int64_t sbs, int32_t wl) {
  Case c;
  const int B = std::uniform_int_distribution<int>(1, 6)(g);
  c.qsl.push_back(0);
  int64_t maxpos = 1;
  for (int b = 0; b < B; ++b) {
    const int q = std::uniform_int_distribution<int>(0, 5)(g);  // empty requests too
    const int s0 = std::uniform_int_distribution<int>(0, 3 * wl + 40)(g);
    c.qsl.push_back(c.qsl.back() + q);
    c.start.push_back(s0);
    maxpos = std::max<int64_t>(maxpos, s0 + q);
  }
  c.rows = c.qsl.back() + std::uniform_int_distribution<int>(0, 3)(g);  // rows past the requests
  c.stride = (maxpos + sbs - 1) / sbs + 1;
  c.table.resize(static_cast<size_t>(B * c.stride));
  for (auto& x : c.table) x = std::uniform_int_distribution<int>(0, 99)(g);
  return c;
}

}  // namespace

TEST(PlanDsaDcp, WindowSlotsMatchTheRemapDefinition) {
  std::mt19937 g(28);
  for (int32_t W : {1, 2, 3, 4}) {
    for (int32_t I : {1, 2, 4}) {
      for (int32_t wl : {0, 3, 7, 127}) {
        for (int64_t sbs : {1, 4, 16}) {
          for (int it = 0; it < 6; ++it) {
            const Case c = random_case(g, sbs, wl);
            for (int32_t rk = 0; rk < W; ++rk) {
              const DcpShard sh{W, rk, I};
              std::vector<int32_t> out(static_cast<size_t>(c.rows * (wl + 1)) + 3, kSentinel);
              plan_dsa_dcp_window_slots(rows_of(c, sh), c.table, c.stride, sbs, wl, out);
              const std::vector<int32_t> want = brute_window(c, sh, sbs, wl);
              ASSERT_EQ(std::vector<int32_t>(out.begin(), out.begin() + static_cast<int64_t>(want.size())), want)
                  << "W " << W << " I " << I << " rank " << rk << " wl " << wl << " sbs " << sbs;
              for (size_t k = want.size(); k < out.size(); ++k) ASSERT_EQ(out[k], kSentinel);  // nothing past
            }
          }
        }
      }
    }
  }
}

TEST(PlanDsaDcp, CmpLimits) {
  const Case c{{0, 1, 1, 4}, {9, 0, 126}, {}, 6, 0};
  for (int32_t r : {4, 128}) {
    std::vector<int32_t> out(6, kSentinel);
    plan_dsa_dcp_cmp_limits(rows_of(c, DcpShard{2, 1, 1}), r, out);
    const std::vector<int32_t> want{10 / r, 127 / r, 128 / r, 129 / r, 0, 0};
    EXPECT_EQ(out, want) << "r " << r;
  }
}

TEST(PlanDsaDcp, RefusesBeforeWriting) {
  const Case c{{0, 2}, {300}, {1, 2}, 2, 2};
  std::vector<int32_t> out(2 * 8, kSentinel);
  // Position 301 on rank 0 of 2 (I 1) is local index 150: column 150 / 16 = 9 >= stride 2.
  EXPECT_INVALID(plan_dsa_dcp_window_slots(rows_of(c, DcpShard{2, 0, 1}), c.table, c.stride, 16, 7, out),
                 "block_table_stride is 2");
  EXPECT_TRUE(std::all_of(out.begin(), out.end(), [](int32_t x) { return x == kSentinel; }));
  EXPECT_INVALID(plan_dsa_dcp_window_slots(rows_of(c, DcpShard{2, 2, 1}), c.table, c.stride, 16, 7, out),
                 "is not a DCP shard");
  std::vector<int32_t> small(3);
  EXPECT_INVALID(plan_dsa_dcp_window_slots(rows_of(c, DcpShard{2, 0, 1}), c.table, c.stride, 512, 7, small),
                 "out holds 3 words");
  EXPECT_INVALID(plan_dsa_dcp_cmp_limits(rows_of(c, DcpShard{2, 0, 1}), 1, out), "ratio=1");
}
