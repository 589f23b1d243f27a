#include <algorithm>
#include <deque>
#include <random>
#include <vector>

#include "ascend_attn_rt/plan/split.h"
#include "test_plan_util.h"

using namespace aar::plan;

namespace {

// Request inputs that land in a given region with threshold 1.
struct Req {
  int32_t sched, computed;
  uint8_t prefilling;
};
Req make_req(int region) {
  switch (region) {
    case 0: return {1, 5, 0};  // decode
    case 1: return {1, 5, 1};  // short extend
    case 2: return {8, 5, 0};  // long extend
    default: return {3, 0, 0};  // fresh prefill
  }
}

struct Result {
  std::vector<int32_t> perm, swaps;
  int32_t n = 0;
};

Result run_reorder(const std::vector<int>& regions) {
  std::vector<int32_t> sched, comp;
  std::vector<uint8_t> pre;
  for (int r : regions) {
    Req q = make_req(r);
    sched.push_back(q.sched);
    comp.push_back(q.computed);
    pre.push_back(q.prefilling);
  }
  Result res;
  res.perm.assign(regions.size(), -7);
  res.swaps.assign(2 * regions.size(), -7);
  res.n = reorder_decode_first(sched, comp, pre, 1, res.perm, res.swaps);
  return res;
}

// Checks every documented property except minimality.
void check_reorder(const std::vector<int>& regions, const Result& res) {
  const std::size_t b = regions.size();
  ASSERT_EQ(res.perm.size(), b);
  // perm is a permutation.
  std::vector<int32_t> sorted = res.perm;
  std::sort(sorted.begin(), sorted.end());
  for (std::size_t i = 0; i < b; ++i) ASSERT_EQ(sorted[i], static_cast<int32_t>(i));
  // Regions in order.
  for (std::size_t i = 1; i < b; ++i) ASSERT_LE(regions[res.perm[i - 1]], regions[res.perm[i]]);
  // Swaps applied to the identity give perm.
  ASSERT_GE(res.n, 0);
  ASSERT_LE(static_cast<std::size_t>(res.n), b);
  std::vector<int32_t> cur(b);
  for (std::size_t i = 0; i < b; ++i) cur[i] = static_cast<int32_t>(i);
  for (int32_t k = 0; k < res.n; ++k) {
    const int32_t x = res.swaps[2 * k], y = res.swaps[2 * k + 1];
    ASSERT_TRUE(x >= 0 && y >= 0 && x < static_cast<int32_t>(b) && y < static_cast<int32_t>(b));
    ASSERT_NE(x, y);
    std::swap(cur[x], cur[y]);
  }
  ASSERT_EQ(cur, res.perm);
  // Requests already inside their target region never move.
  std::vector<int> target = regions;
  std::sort(target.begin(), target.end());
  for (std::size_t i = 0; i < b; ++i) {
    if (regions[i] == target[i]) {
      ASSERT_EQ(res.perm[i], static_cast<int32_t>(i)) << "position " << i;
    }
  }
  // Swaps never touch a position whose request was already in place.
  for (int32_t k = 0; k < 2 * res.n; ++k) ASSERT_NE(regions[res.swaps[k]], target[res.swaps[k]]);
}

}  // namespace

TEST(PlanReorder, ClassifyRequest) {
  EXPECT_EQ(classify_request(1, 10, false, 1), ReorderRegion::Decode);
  EXPECT_EQ(classify_request(1, 10, true, 1), ReorderRegion::ShortExtend);
  EXPECT_EQ(classify_request(2, 10, false, 1), ReorderRegion::LongExtend);
  EXPECT_EQ(classify_request(2, 10, true, 1), ReorderRegion::LongExtend);
  EXPECT_EQ(classify_request(4, 10, false, 4), ReorderRegion::Decode);
  EXPECT_EQ(classify_request(1, 0, false, 1), ReorderRegion::FreshPrefill);
  EXPECT_EQ(classify_request(100, 0, true, 1), ReorderRegion::FreshPrefill);
}

TEST(PlanReorder, AlreadyOrderedDoesNotMove) {
  for (const auto& regions : std::vector<std::vector<int>>{{}, {0}, {3}, {0, 0, 1, 2, 2, 3}, {1, 1, 3, 3}}) {
    Result res = run_reorder(regions);
    EXPECT_EQ(res.n, 0);
    for (std::size_t i = 0; i < regions.size(); ++i) EXPECT_EQ(res.perm[i], static_cast<int32_t>(i));
    // swaps_out untouched past the swaps written (none here).
    for (int32_t v : res.swaps) EXPECT_EQ(v, -7);
  }
}

TEST(PlanReorder, SmallCases) {
  Result res = run_reorder({3, 0});
  EXPECT_EQ(res.n, 1);
  EXPECT_EQ(res.perm, (std::vector<int32_t>{1, 0}));
  // A 3-cycle needs 2 swaps; the decode at position 0 stays.
  res = run_reorder({0, 2, 3, 1});
  check_reorder({0, 2, 3, 1}, res);
  EXPECT_EQ(res.n, 2);
  EXPECT_EQ(res.perm[0], 0);
  // A 4-cycle needs 3 swaps.
  res = run_reorder({1, 2, 3, 0});
  check_reorder({1, 2, 3, 0}, res);
  EXPECT_EQ(res.n, 3);
}

TEST(PlanReorder, MinimalSwapsAgainstBruteForce) {
  // Exhaustive over every arrangement of the 4 regions for B <= 7. The minimal
  // swap count to sort an arrangement is its BFS distance from the sorted
  // arrangement with the same multiset (swaps are involutions).
  for (int b = 0; b <= 7; ++b) {
    int total = 1;
    for (int i = 0; i < b; ++i) total *= 4;
    std::vector<int> pow4(b + 1, 1);
    for (int i = 1; i <= b; ++i) pow4[i] = pow4[i - 1] * 4;
    auto digit = [&](int code, int i) { return (code / pow4[i]) % 4; };
    std::vector<int> dist(total, -1);
    std::deque<int> queue;
    for (int code = 0; code < total; ++code) {
      bool sorted = true;
      for (int i = 1; i < b && sorted; ++i) sorted = digit(code, i - 1) <= digit(code, i);
      if (sorted) {
        dist[code] = 0;
        queue.push_back(code);
      }
    }
    while (!queue.empty()) {
      const int code = queue.front();
      queue.pop_front();
      for (int i = 0; i < b; ++i) {
        for (int j = i + 1; j < b; ++j) {
          const int di = digit(code, i), dj = digit(code, j);
          if (di == dj) continue;
          const int next = code + (dj - di) * pow4[i] + (di - dj) * pow4[j];
          if (dist[next] < 0) {
            dist[next] = dist[code] + 1;
            queue.push_back(next);
          }
        }
      }
    }
    for (int code = 0; code < total; ++code) {
      std::vector<int> regions(b);
      for (int i = 0; i < b; ++i) regions[i] = digit(code, i);
      Result res = run_reorder(regions);
      ASSERT_NO_FATAL_FAILURE(check_reorder(regions, res));
      ASSERT_EQ(res.n, dist[code]) << "B=" << b << " code=" << code;
    }
  }
}

TEST(PlanReorder, LargeRandomBatch) {
  std::mt19937 rng(1234);
  for (int trial = 0; trial < 20; ++trial) {
    const int b = 1024;
    std::vector<int> regions(b);
    for (int& r : regions) r = static_cast<int>(rng() % 4);
    Result res = run_reorder(regions);
    ASSERT_NO_FATAL_FAILURE(check_reorder(regions, res));
    // Lower bound: each swap fixes at most 2 misplaced requests.
    std::vector<int> target = regions;
    std::sort(target.begin(), target.end());
    int misplaced = 0;
    for (int i = 0; i < b; ++i) misplaced += regions[i] != target[i];
    EXPECT_GE(res.n * 2, misplaced);
    EXPECT_LT(res.n, misplaced + (misplaced == 0 ? 1 : 0));
  }
}

TEST(PlanReorder, IsPrefillingOptionalAndThreshold) {
  // Empty is_prefilling = all false; threshold moves the decode boundary.
  std::vector<int32_t> sched = {4, 1, 3}, comp = {2, 2, 2}, perm(3), swaps(6);
  EXPECT_EQ(reorder_decode_first(sched, comp, {}, 1, perm, swaps), 1);
  EXPECT_EQ(perm, (std::vector<int32_t>{1, 0, 2}));
  EXPECT_EQ(reorder_decode_first(sched, comp, {}, 4, perm, swaps), 0);
  EXPECT_EQ(perm, (std::vector<int32_t>{0, 1, 2}));
}

TEST(PlanReorder, Errors) {
  std::vector<int32_t> sched = {1, 1}, comp = {1, 1}, perm(2, -7), swaps(4, -7);
  std::vector<uint8_t> pre = {0, 0};
  std::vector<int32_t> short_comp = {1};
  EXPECT_INVALID(reorder_decode_first(sched, short_comp, pre, 1, perm, swaps), "num_computed");
  std::vector<uint8_t> bad_pre = {0};
  EXPECT_INVALID(reorder_decode_first(sched, comp, bad_pre, 1, perm, swaps), "is_prefilling");
  std::vector<int32_t> small_perm(1), small_swaps(3);
  EXPECT_INVALID(reorder_decode_first(sched, comp, pre, 1, small_perm, swaps), "perm_out");
  EXPECT_INVALID(reorder_decode_first(sched, comp, pre, 0, perm, swaps), "decode_threshold=0 is out of range [1, 16]");
  EXPECT_INVALID(reorder_decode_first(sched, comp, pre, -1, perm, swaps), "decode_threshold=-1");
  EXPECT_INVALID(reorder_decode_first(sched, comp, pre, 1, perm, small_swaps), "swaps_out");
  std::vector<int32_t> neg = {1, -1};
  EXPECT_INVALID(reorder_decode_first(neg, comp, pre, 1, perm, swaps), "num_scheduled[1]=-1");
  EXPECT_INVALID(reorder_decode_first(sched, neg, pre, 1, perm, swaps), "num_computed[1]=-1");
  for (int32_t v : perm) EXPECT_EQ(v, -7);
  for (int32_t v : swaps) EXPECT_EQ(v, -7);
}
