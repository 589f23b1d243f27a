// The resident-slot LRU of the SFA KV-offload decode path (docs/design/sfa.md §6.3
// (a)-(g), decisions in resident_lru.h): hand-checked steps (hits,
// misses, eviction order, resets, invalidation, invalid entries, a full
// buffer, repeated tokens, rows that come and go), every bad call rejected by
// name with nothing changed, and random runs against a std::map / std::list
// model of the same rules, on one thread and on several (rows split into
// chunks), which must give the same outputs as one.
#include <algorithm>
#include <cstdint>
#include <deque>
#include <list>
#include <map>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "ascend_attn_rt/sfa/plan/resident_lru.h"
#include "test_plan_util.h"

using namespace aar::plan;

// Found by argument-dependent lookup from std::equal / vector ==.
namespace aar::plan {
bool operator==(const ResidentMiss& a, const ResidentMiss& b) {
  return a.row == b.row && a.token == b.token && a.slot == b.slot;
}
}  // namespace aar::plan

namespace {

std::string to_string(const std::vector<ResidentMiss>& v) {
  std::string s;
  for (const auto& m : v) s += "(" + std::to_string(m.row) + "," + std::to_string(m.token) + "," + std::to_string(m.slot) + ")";
  return s;
}

// One step's inputs and outputs, outputs pre-filled with sentinels so every write shows.
struct Step {
  std::vector<int32_t> topk, sp, current;
  std::vector<uint64_t> req;
  std::vector<ResidentMiss> misses_buf;
  int32_t K = 0;
  ResidentStepStats stats;
  std::vector<ResidentMiss> misses;  // the written ones

  Step(int32_t k, std::vector<int32_t> t, std::vector<uint64_t> r, std::vector<int32_t> s)
      : topk(std::move(t)), sp(std::move(s)), req(std::move(r)), K(k) {}

  ResidentStepStats run(ResidentLru& lru) {
    current.assign(topk.size(), -7);
    misses_buf.assign(topk.size(), ResidentMiss{-7, -7, -7});
    ResidentStepInputs in;
    in.topk = topk;
    in.K = K;
    in.req_ids = req;
    in.stable_prefix = sp;
    stats = lru.step(in, ResidentStepOutputs{current, misses_buf});
    misses.assign(misses_buf.begin(), misses_buf.begin() + stats.misses);
    return stats;
  }
};

// A one-row step with a stable prefix that covers everything.
Step one_row(int32_t K, std::vector<int32_t> topk, uint64_t req = 1, int32_t sp = 1 << 30) {
  return Step(K, std::move(topk), {req}, {sp});
}

std::vector<int32_t> tokens_of(const ResidentLru& lru, int32_t row) {
  std::vector<int32_t> t(lru.capacity());
  for (int32_t s = 0; s < lru.capacity(); ++s) t[s] = lru.token_at(row, s);
  return t;
}

// ---------------------------------------------------------------- reference model
// The rules of resident_lru.h with standard containers, written for clarity:
// a std::map token -> slot, a std::deque of empty slots, a std::list of the
// resident slots from least to most recent.
class RefLru {
 public:
  RefLru(int32_t max_rows, int32_t capacity) : cap_(capacity), rows_(max_rows) {}

  ResidentStepStats step(const std::vector<int32_t>& topk, int32_t K, const std::vector<uint64_t>& req,
                         const std::vector<int32_t>& sp, std::vector<int32_t>& current,
                         std::vector<ResidentMiss>& misses) {
    ResidentStepStats st;
    current.assign(topk.size(), -1);
    misses.clear();
    for (std::size_t r = 0; r < req.size(); ++r) {
      Row& row = rows_[r];
      if (!row.known || row.req != req[r]) {
        row.known = true;
        row.req = req[r];
        row.s2t.assign(cap_, -1);
        row.empty.clear();
        for (int32_t s = 0; s < cap_; ++s) row.empty.push_back(s);
        row.lru.clear();
        row.where.clear();
        row.slot_of.clear();
        ++st.resets;
      }
      for (int32_t s = 0; s < cap_; ++s) {
        if (row.s2t[s] >= sp[r]) {
          row.slot_of.erase(row.s2t[s]);
          row.s2t[s] = -1;
          row.lru.erase(row.where.at(s));
          row.where.erase(s);
          row.empty.push_back(s);
          ++st.invalidated;
        }
      }
      std::vector<int32_t> distinct;
      std::set<int32_t> seen;
      for (int32_t p = 0; p < K; ++p) {
        const int32_t t = topk[r * K + p];
        if (t < 0) continue;
        if (!seen.insert(t).second) {
          ++st.duplicates;
        } else {
          distinct.push_back(t);
        }
      }
      std::vector<int32_t> hits, miss_tokens;
      for (int32_t t : distinct) (row.slot_of.count(t) ? hits : miss_tokens).push_back(t);
      std::set<int32_t> hit_slots;
      for (int32_t t : hits) hit_slots.insert(row.slot_of[t]);
      std::vector<int32_t> assigned;
      for (int32_t t : miss_tokens) {
        int32_t s;
        if (!row.empty.empty()) {
          s = row.empty.front();
          row.empty.pop_front();
        } else {
          auto it = row.lru.begin();
          while (hit_slots.count(*it)) ++it;
          s = *it;
          row.lru.erase(it);
          row.where.erase(s);
          row.slot_of.erase(row.s2t[s]);
        }
        row.s2t[s] = t;
        row.slot_of[t] = s;
        assigned.push_back(s);
        misses.push_back(ResidentMiss{static_cast<int32_t>(r), t, s});
      }
      for (int32_t s : hit_slots) {
        row.lru.erase(row.where.at(s));
        row.where.erase(s);
      }
      const auto append = [&row](int32_t s) { row.where[s] = row.lru.insert(row.lru.end(), s); };
      for (auto it = assigned.rbegin(); it != assigned.rend(); ++it) append(*it);
      for (auto it = hits.rbegin(); it != hits.rend(); ++it) append(row.slot_of[*it]);
      for (int32_t p = 0; p < K; ++p) {
        const int32_t t = topk[r * K + p];
        current[r * K + p] = t < 0 ? -1 : row.slot_of.at(t);
      }
      st.hits += static_cast<int64_t>(hits.size());
    }
    st.misses = static_cast<int64_t>(misses.size());
    return st;
  }

  int32_t token_at(int32_t row, int32_t slot) const {
    return rows_[row].known ? rows_[row].s2t[slot] : -1;
  }

 private:
  struct Row {
    bool known = false;
    uint64_t req = 0;
    std::vector<int32_t> s2t;
    std::deque<int32_t> empty;
    std::list<int32_t> lru;                                // resident slots, least recent first
    std::map<int32_t, std::list<int32_t>::iterator> where;  // slot -> its place in lru
    std::map<int32_t, int32_t> slot_of;                     // token -> slot
  };
  int32_t cap_;
  std::vector<Row> rows_;
};

void expect_stats(const ResidentStepStats& s, int64_t hits, int64_t misses, int64_t resets, int64_t invalidated,
                  int64_t duplicates = 0) {
  EXPECT_EQ(s.hits, hits);
  EXPECT_EQ(s.misses, misses);
  EXPECT_EQ(s.resets, resets);
  EXPECT_EQ(s.invalidated, invalidated);
  EXPECT_EQ(s.duplicates, duplicates);
}

}  // namespace

// ---------------------------------------------------------------- hand-checked steps

TEST(ResidentLru, MissesFillEmptySlotsInOrderThenHitsReuseThem) {
  ResidentLru lru(1, 8);
  Step a = one_row(4, {5, 3, 9, 1});
  expect_stats(a.run(lru), 0, 4, 1, 0);
  EXPECT_EQ(a.current, (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(a.misses, (std::vector<ResidentMiss>{{0, 5, 0}, {0, 3, 1}, {0, 9, 2}, {0, 1, 3}})) << to_string(a.misses);

  Step b = one_row(4, {3, 7, 5, -1});
  expect_stats(b.run(lru), 2, 1, 0, 0);
  EXPECT_EQ(b.current, (std::vector<int32_t>{1, 4, 0, -1}));
  EXPECT_EQ(b.misses, (std::vector<ResidentMiss>{{0, 7, 4}}));
  EXPECT_EQ(tokens_of(lru, 0), (std::vector<int32_t>{5, 3, 9, 1, 7, -1, -1, -1}));

  // The same top-k again: all hits, nothing to copy.
  Step c = one_row(4, {3, 7, 5, -1});
  expect_stats(c.run(lru), 3, 0, 0, 0);
  EXPECT_EQ(c.current, b.current);
  EXPECT_TRUE(c.misses.empty());
}

TEST(ResidentLru, EvictsLeastRecentNonHitsAcrossSteps) {
  // Capacity 4, K 2. Within a step, later top-k positions count as older.
  ResidentLru lru(1, 4);
  Step s1 = one_row(2, {10, 11});
  s1.run(lru);
  EXPECT_EQ(s1.current, (std::vector<int32_t>{0, 1}));  // order now: 1(11) 0(10)
  Step s2 = one_row(2, {12, 13});
  s2.run(lru);
  EXPECT_EQ(s2.current, (std::vector<int32_t>{2, 3}));  // order: 1(11) 0(10) 3(13) 2(12)
  // 10 hits; 14 evicts the least recent non-hit, slot 1 (token 11).
  Step s3 = one_row(2, {14, 10});
  expect_stats(s3.run(lru), 1, 1, 0, 0);
  EXPECT_EQ(s3.current, (std::vector<int32_t>{1, 0}));
  EXPECT_EQ(s3.misses, (std::vector<ResidentMiss>{{0, 14, 1}}));
  EXPECT_EQ(tokens_of(lru, 0), (std::vector<int32_t>{10, 14, 12, 13}));  // order: 3(13) 2(12) 1(14) 0(10)
  Step s4 = one_row(2, {15, 16});
  s4.run(lru);
  EXPECT_EQ(s4.current, (std::vector<int32_t>{3, 2}));  // order: 1(14) 0(10) 2(16) 3(15)
  EXPECT_EQ(s4.misses, (std::vector<ResidentMiss>{{0, 15, 3}, {0, 16, 2}}));
  Step s5 = one_row(2, {17, -1});
  s5.run(lru);
  EXPECT_EQ(s5.current, (std::vector<int32_t>{1, -1}));
  EXPECT_EQ(tokens_of(lru, 0), (std::vector<int32_t>{10, 17, 16, 15}));
  // Hits refresh their slots: 10 (the least recent) hits, so 16 and 15 go first.
  Step s6 = one_row(2, {10, 18});
  s6.run(lru);
  EXPECT_EQ(s6.current, (std::vector<int32_t>{0, 2}));
  Step s7 = one_row(2, {19, 20});
  s7.run(lru);
  EXPECT_EQ(s7.current, (std::vector<int32_t>{3, 1}));  // 15 (slot 3), then 17 (slot 1); 10 and 18 stay
  EXPECT_EQ(tokens_of(lru, 0), (std::vector<int32_t>{10, 20, 18, 19}));
}

TEST(ResidentLru, HitsAreOrderedByTopkPositionLaterPositionsOlder) {
  // The top-k comes sorted by descending score: among this step's hits, the
  // last position is the least recent. Upstream would keep the hits' previous
  // order (slot 2 evicted below); forward top-k order would evict slot 2 too.
  ResidentLru lru(1, 4);
  one_row(3, {1, 2, 3}).run(lru);  // slots 0, 1, 2; slot 3 stays empty
  Step b = one_row(3, {3, 2, 1});
  expect_stats(b.run(lru), 3, 0, 0, 0);
  Step c = one_row(3, {7, 8, -1});
  expect_stats(c.run(lru), 0, 2, 0, 0);
  EXPECT_EQ(c.current, (std::vector<int32_t>{3, 0, -1}));  // the empty slot, then token 1 (last in b)
  EXPECT_EQ(tokens_of(lru, 0), (std::vector<int32_t>{8, 2, 3, 7}));
}

TEST(ResidentLru, CapacityExactlyReachedAllMisses) {
  // K == capacity: every slot is used, and a disjoint top-k replaces them all,
  // least recent first: the last position of the previous step first.
  ResidentLru lru(1, 8);
  Step a = one_row(8, {0, 1, 2, 3, 4, 5, 6, 7});
  expect_stats(a.run(lru), 0, 8, 1, 0);
  EXPECT_EQ(a.current, (std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  Step b = one_row(8, {100, 101, 102, 103, 104, 105, 106, 107});
  expect_stats(b.run(lru), 0, 8, 0, 0);
  EXPECT_EQ(b.current, (std::vector<int32_t>{7, 6, 5, 4, 3, 2, 1, 0}));
  // Half hits at full capacity: the misses take exactly the non-hit slots.
  Step c = one_row(8, {200, 100, 201, 101, 202, 102, 203, 103});
  expect_stats(c.run(lru), 4, 4, 0, 0);
  EXPECT_EQ(c.current, (std::vector<int32_t>{0, 7, 1, 6, 2, 5, 3, 4}));
  for (int32_t s = 0; s < 8; ++s) EXPECT_GE(lru.token_at(0, s), 100);
}

TEST(ResidentLru, NewRequestIdResetsTheRow) {
  ResidentLru lru(2, 4);
  Step a(2, {1, 2, 3, 4}, {7, 8}, {100, 100});
  expect_stats(a.run(lru), 0, 4, 2, 0);  // first use of a row counts as a reset
  // Row 0 keeps request 7 (hits); row 1 now serves request 9: all misses from slot 0.
  Step b(2, {1, 2, 3, 4}, {7, 9}, {100, 100});
  expect_stats(b.run(lru), 2, 2, 1, 0);
  EXPECT_EQ(b.current, (std::vector<int32_t>{0, 1, 0, 1}));
  EXPECT_EQ(b.misses, (std::vector<ResidentMiss>{{1, 3, 0}, {1, 4, 1}}));
  // A different request with the same top-k in row 1 gets nothing from the old one.
  Step c(2, {1, 2, 4, 3}, {7, 10}, {100, 100});
  expect_stats(c.run(lru), 2, 2, 1, 0);
  EXPECT_EQ(c.misses, (std::vector<ResidentMiss>{{1, 4, 0}, {1, 3, 1}}));
  EXPECT_EQ(tokens_of(lru, 1), (std::vector<int32_t>{4, 3, -1, -1}));
}

TEST(ResidentLru, TokensPastTheStablePrefixAreInvalidatedAndEmptySlotsGoFirst) {
  ResidentLru lru(1, 4);
  Step a = one_row(4, {0, 1, 2, 3}, 1, 4);
  a.run(lru);
  // Stable prefix 2: tokens 2 and 3 (slots 2, 3) are dropped. Token 1 (slot 1)
  // is not in the top-k, but the emptied slots are used before evicting it.
  Step b = one_row(4, {0, 3, 7, -1}, 1, 2);
  expect_stats(b.run(lru), 1, 2, 0, 2);
  EXPECT_EQ(b.current, (std::vector<int32_t>{0, 2, 3, -1}));
  EXPECT_EQ(b.misses, (std::vector<ResidentMiss>{{0, 3, 2}, {0, 7, 3}}));
  EXPECT_EQ(tokens_of(lru, 0), (std::vector<int32_t>{0, 1, 3, 7}));
  // A speculative token is copied, then dropped when the prefix does not cover it.
  Step c = one_row(4, {0, 1, 3, 7}, 1, 8);
  expect_stats(c.run(lru), 4, 0, 0, 0);
  Step d = one_row(4, {0, 1, 3, 7}, 1, 6);
  expect_stats(d.run(lru), 3, 1, 0, 1);
  EXPECT_EQ(d.misses, (std::vector<ResidentMiss>{{0, 7, 3}}));
  // Never-used empty slots come before the ones emptied by invalidation.
  ResidentLru wide(1, 6);
  Step e = one_row(3, {10, 11, 12}, 1, 100);
  e.run(wide);
  Step f = one_row(3, {12, 13, 14}, 1, 12);  // 12 dropped (slot 2), empties now: 3, 4, 5, 2
  expect_stats(f.run(wide), 0, 3, 0, 1);
  EXPECT_EQ(f.current, (std::vector<int32_t>{3, 4, 5}));
  Step g = one_row(3, {20, 13, 14}, 1, 100);
  g.run(wide);
  EXPECT_EQ(g.current, (std::vector<int32_t>{2, 4, 5}));
}

TEST(ResidentLru, InvalidEntriesGetMinusOneAndCopyNothing) {
  ResidentLru lru(2, 4);
  Step a(3, {-1, -1, -1, 5, -3, -1}, {1, 2}, {10, 10});
  expect_stats(a.run(lru), 0, 1, 2, 0);
  EXPECT_EQ(a.current, (std::vector<int32_t>{-1, -1, -1, 0, -1, -1}));
  EXPECT_EQ(a.misses, (std::vector<ResidentMiss>{{1, 5, 0}}));
  EXPECT_EQ(tokens_of(lru, 0), (std::vector<int32_t>{-1, -1, -1, -1}));
}

TEST(ResidentLru, RepeatedTokensShareOneSlotAndOneCopy) {
  ResidentLru lru(1, 8);
  Step a = one_row(5, {5, 5, 7, 5, 7});
  expect_stats(a.run(lru), 0, 2, 1, 0, 3);
  EXPECT_EQ(a.current, (std::vector<int32_t>{0, 0, 1, 0, 1}));
  EXPECT_EQ(a.misses, (std::vector<ResidentMiss>{{0, 5, 0}, {0, 7, 1}}));
  Step b = one_row(5, {7, 7, 9, 9, 5});
  expect_stats(b.run(lru), 2, 1, 0, 0, 2);
  EXPECT_EQ(b.current, (std::vector<int32_t>{1, 1, 2, 2, 0}));
  EXPECT_EQ(tokens_of(lru, 0), (std::vector<int32_t>{5, 7, 9, -1, -1, -1, -1, -1}));
}

TEST(ResidentLru, MissListIsRowMajorInTopkOrder) {
  ResidentLru lru(3, 4);
  Step a(2, {8, 6, 4, 2, 9, 9}, {1, 2, 3}, {50, 50, 50});
  expect_stats(a.run(lru), 0, 5, 3, 0, 1);
  EXPECT_EQ(a.misses, (std::vector<ResidentMiss>{{0, 8, 0}, {0, 6, 1}, {1, 4, 0}, {1, 2, 1}, {2, 9, 0}}))
      << to_string(a.misses);
  Step b(2, {6, 1, 2, 3, 9, 40}, {1, 2, 3}, {50, 50, 50});
  expect_stats(b.run(lru), 3, 3, 0, 0);
  EXPECT_EQ(b.misses, (std::vector<ResidentMiss>{{0, 1, 2}, {1, 3, 2}, {2, 40, 1}})) << to_string(b.misses);
  EXPECT_EQ(b.current, (std::vector<int32_t>{1, 2, 1, 2, 0, 1}));
}

TEST(ResidentLru, RowsBeyondTheStepKeepTheirStateAndResume) {
  ResidentLru lru(3, 4);
  Step a(1, {10, 20, 30}, {1, 2, 3}, {99, 99, 99});
  a.run(lru);
  Step b(1, {11}, {1}, {99});  // one row: rows 1 and 2 untouched
  expect_stats(b.run(lru), 0, 1, 0, 0);
  EXPECT_EQ(lru.token_at(1, 0), 20);
  EXPECT_EQ(lru.token_at(2, 0), 30);
  Step c(1, {10, 20, 30}, {1, 2, 4}, {99, 99, 99});  // row 1 resumes, row 2 has a new request
  expect_stats(c.run(lru), 2, 1, 1, 0);
  EXPECT_EQ(c.current, (std::vector<int32_t>{0, 0, 0}));
  EXPECT_EQ(c.misses, (std::vector<ResidentMiss>{{2, 30, 0}}));
}

TEST(ResidentLru, ResetForgetsEveryRow) {
  ResidentLru lru(2, 4);
  Step a(2, {1, 2, 3, 4}, {1, 2}, {9, 9});
  a.run(lru);
  lru.reset();
  for (int32_t r = 0; r < 2; ++r) EXPECT_EQ(tokens_of(lru, r), (std::vector<int32_t>{-1, -1, -1, -1}));
  Step b(2, {1, 2, 3, 4}, {1, 2}, {9, 9});
  expect_stats(b.run(lru), 0, 4, 2, 0);
  EXPECT_EQ(b.misses, a.misses);
}

TEST(ResidentLru, ResetRowsForgetsOnlyThoseRows) {
  ResidentLru lru(3, 4);
  Step a(2, {1, 2, 3, 4, 5, 6}, {1, 2, 3}, {9, 9, 9});
  a.run(lru);
  lru.reset_rows(1, 99);  // clamped to max_rows
  lru.reset_rows(-5, 0);  // empty
  EXPECT_EQ(tokens_of(lru, 0), (std::vector<int32_t>{1, 2, -1, -1}));
  EXPECT_EQ(tokens_of(lru, 1), (std::vector<int32_t>{-1, -1, -1, -1}));
  EXPECT_EQ(tokens_of(lru, 2), (std::vector<int32_t>{-1, -1, -1, -1}));
  Step b(2, {1, 2, 3, 4, 5, 6}, {1, 2, 3}, {9, 9, 9});
  expect_stats(b.run(lru), 2, 4, 2, 0);  // row 0 hits, rows 1 and 2 start over
}

TEST(ResidentLru, ZeroRowsIsANoOp) {
  ResidentLru lru(2, 4);
  Step a(3, {}, {}, {});
  expect_stats(a.run(lru), 0, 0, 0, 0);
}

TEST(ResidentLru, LargeTokenValues) {
  ResidentLru lru(1, 4);
  const int32_t big = 2147483600;
  Step a = one_row(3, {big, big + 1, 0}, 1, 2147483647);
  a.run(lru);
  Step b = one_row(3, {big + 1, big + 7, 0}, 1, 2147483647);
  expect_stats(b.run(lru), 2, 1, 0, 0);
  EXPECT_EQ(b.current, (std::vector<int32_t>{1, 3, 2}));
}

// ---------------------------------------------------------------- rejected calls

TEST(ResidentLru, RejectedCallsChangeNothing) {
  // `lru` sees every bad call, `twin` none; both must then agree, and the
  // outputs of a rejected call must be untouched.
  ResidentLru lru(2, 4), twin(2, 4);
  Step warm(2, {1, 2, 3, 4}, {1, 2}, {3, 9});
  warm.run(lru);
  Step warm2 = warm;
  warm2.run(twin);

  const auto expect_rejected = [&](Step s, const char* what) {
    std::vector<int32_t> cur(s.current.empty() ? s.topk.size() : s.current.size(), -7);
    std::vector<ResidentMiss> mis(s.misses_buf.empty() ? s.topk.size() : s.misses_buf.size(), ResidentMiss{-7, -7, -7});
    const auto cur0 = cur;
    const auto mis0 = mis;
    ResidentStepInputs in;
    in.topk = s.topk;
    in.K = s.K;
    in.req_ids = s.req;
    in.stable_prefix = s.sp;
    EXPECT_INVALID(lru.step(in, ResidentStepOutputs{cur, mis}), what);
    EXPECT_EQ(cur, cur0) << what;
    EXPECT_TRUE(std::equal(mis.begin(), mis.end(), mis0.begin())) << what;
    for (int32_t r = 0; r < 2; ++r) EXPECT_EQ(tokens_of(lru, r), tokens_of(twin, r)) << what;
  };
  expect_rejected(Step(2, {1, 2, 3}, {1, 5}, {0, 0}), "topk has 3 entries");
  expect_rejected(Step(2, {1, 2, 3, 4}, {1, 5}, {0}), "stable_prefix has 1 entries");
  expect_rejected(Step(2, {1, 2, 3, 4}, {1, 5}, {0, -1}), "stable_prefix[1]=-1");
  expect_rejected(Step(5, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, {1, 5}, {0, 0}), "K=5 exceeds the resident capacity 4");
  expect_rejected(Step(0, {}, {1, 5}, {0, 0}), "K (index_topk) must be >= 1, got 0");
  expect_rejected(Step(1, {1, 2, 3}, {1, 5, 6}, {0, 0, 0}), "req_ids has 3 rows, more than max_rows=2");
  {
    Step s(2, {1, 2, 3, 4}, {1, 5}, {0, 0});
    s.current.assign(3, -7);
    expect_rejected(s, "current_slots has room for 3 entries");
  }
  {
    Step s(2, {1, 2, 3, 4}, {1, 5}, {0, 0});
    s.misses_buf.assign(2, ResidentMiss{-7, -7, -7});
    expect_rejected(s, "misses has room for 2 entries");
  }
  Step next(2, {4, 2, 3, 9}, {1, 2}, {9, 9});
  Step next2 = next;
  const auto st = next.run(lru);
  const auto st2 = next2.run(twin);
  EXPECT_EQ(next.current, next2.current);
  EXPECT_EQ(next.misses, next2.misses);
  EXPECT_EQ(st.hits, st2.hits);
  EXPECT_EQ(st.invalidated, st2.invalidated);
}

TEST(ResidentLru, ConstructorAndTokenAtCheckTheirArguments) {
  EXPECT_INVALID(ResidentLru(0, 4), "max_rows must be >= 1, got 0");
  EXPECT_INVALID(ResidentLru(1, 0), "capacity must be in [1, ");
  ResidentLru lru(2, 4);
  EXPECT_EQ(lru.max_rows(), 2);
  EXPECT_EQ(lru.capacity(), 4);
  EXPECT_INVALID(lru.token_at(2, 0), "token_at: row=2");
  EXPECT_INVALID(lru.token_at(0, 4), "token_at: slot=4");
  EXPECT_EQ(lru.token_at(1, 3), -1);
  EXPECT_GE(lru.threads(), 1);  // 0: the hardware threads
  EXPECT_INVALID(ResidentLru(1, 4, -1), "threads must be in [0, 64]");
  EXPECT_INVALID(ResidentLru(1, 4, ResidentLru::kMaxThreads + 1), "(0: the hardware threads), got 65");
  EXPECT_INVALID(lru.set_threads(-2), "got -2");
  EXPECT_GE(lru.threads(), 1);  // unchanged
  lru.set_threads(3);
  EXPECT_EQ(lru.threads(), 3);
  EXPECT_EQ(ResidentLru(1, 4, 5).threads(), 5);
}

// ---------------------------------------------------------------- against the model

namespace {

struct RandomRun {
  int32_t max_rows, capacity, K;
  int steps;
  uint32_t seed;
  int32_t context = 64;  // initial context beyond K: larger means fewer tokens come back
  int32_t threads = 1;   // the LRU's thread limit
};

// Random steps: each row's top-k mixes tokens of its previous top-k (hits),
// older tokens of a short context (hits or misses after eviction) and fresh
// ones, with repeats, invalid entries, request changes, stable prefixes that
// cut into the resident tokens, and a row count that varies.
ResidentStepStats run_against_model(const RandomRun& cfg) {
  ResidentStepStats total;
  std::mt19937 rng(cfg.seed);
  ResidentLru lru(cfg.max_rows, cfg.capacity, cfg.threads);
  RefLru ref(cfg.max_rows, cfg.capacity);
  const int32_t K = cfg.K;
  std::vector<uint64_t> req(cfg.max_rows);
  std::vector<int32_t> ctx(cfg.max_rows);
  std::vector<std::vector<int32_t>> prev(cfg.max_rows);
  uint64_t next_req = 1;
  for (auto& r : req) r = next_req++;
  for (auto& c : ctx) c = K + static_cast<int32_t>(rng() % static_cast<uint32_t>(cfg.context));
  const auto pick = [&](uint32_t n) { return static_cast<int32_t>(rng() % n); };
  for (int step = 0; step < cfg.steps; ++step) {
    const int32_t rows = step % 7 == 3 ? 1 + pick(cfg.max_rows) : cfg.max_rows;
    std::vector<int32_t> topk(static_cast<std::size_t>(rows) * K), sp(rows);
    std::vector<uint64_t> ids(req.begin(), req.begin() + rows);
    for (int32_t r = 0; r < rows; ++r) {
      if (pick(20) == 0) {  // a new request in this row
        ids[r] = req[r] = next_req++;
        ctx[r] = K + pick(static_cast<uint32_t>(cfg.context));
        prev[r].clear();
      }
      ctx[r] += 1 + pick(3);
      const int32_t mode = pick(10);
      std::vector<int32_t> row(K);
      for (int32_t p = 0; p < K; ++p) {
        const int32_t u = pick(100);
        if (!prev[r].empty() && u < (mode < 7 ? 80 : 30)) {
          row[p] = prev[r][pick(static_cast<uint32_t>(prev[r].size()))];
        } else if (u < 95) {
          row[p] = pick(static_cast<uint32_t>(ctx[r]));
        } else if (u < 98) {
          row[p] = -1;
        } else {
          row[p] = p > 0 ? row[pick(static_cast<uint32_t>(p))] : -1;  // a repeat
        }
      }
      // Mostly distinct tokens, as a real top-k: drop most repeats.
      if (mode != 9) {
        std::set<int32_t> seen;
        for (auto& t : row) {
          if (t >= 0 && !seen.insert(t).second && pick(4) != 0) t = -1;
        }
      }
      std::copy(row.begin(), row.end(), topk.begin() + static_cast<std::size_t>(r) * K);
      prev[r] = row;
      const int32_t s = pick(10);
      sp[r] = s < 6 ? ctx[r] : (s < 9 ? std::max(0, ctx[r] - 1 - pick(static_cast<uint32_t>(K))) : pick(8));
    }

    Step got(K, topk, ids, sp);
    const ResidentStepStats st = got.run(lru);
    std::vector<int32_t> ref_cur;
    std::vector<ResidentMiss> ref_misses;
    const ResidentStepStats rs = ref.step(topk, K, ids, sp, ref_cur, ref_misses);
    total.hits += st.hits;
    total.misses += st.misses;
    total.resets += st.resets;
    total.invalidated += st.invalidated;
    total.duplicates += st.duplicates;
    EXPECT_EQ(got.current, ref_cur) << "step " << step;
    if (got.current != ref_cur) return total;
    EXPECT_EQ(got.misses, ref_misses) << "step " << step << "\n got " << to_string(got.misses) << "\nwant "
                                      << to_string(ref_misses);
    EXPECT_EQ(st.hits, rs.hits) << "step " << step;
    EXPECT_EQ(st.misses, rs.misses) << "step " << step;
    EXPECT_EQ(st.resets, rs.resets) << "step " << step;
    EXPECT_EQ(st.invalidated, rs.invalidated) << "step " << step;
    EXPECT_EQ(st.duplicates, rs.duplicates) << "step " << step;
    bool same_tokens = true;
    for (int32_t r = 0; r < cfg.max_rows && same_tokens; ++r) {
      for (int32_t s = 0; s < cfg.capacity && same_tokens; ++s) same_tokens = lru.token_at(r, s) == ref.token_at(r, s);
    }
    EXPECT_TRUE(same_tokens) << "step " << step;
    if (::testing::Test::HasFailure()) return total;
    if (step == cfg.steps / 2) {
      lru.reset();
      ref = RefLru(cfg.max_rows, cfg.capacity);
    }
  }
  return total;
}

// Every rule was exercised (the runs are deterministic).
void expect_covered(const ResidentStepStats& t, bool duplicates = true) {
  EXPECT_GT(t.hits, 0);
  EXPECT_GT(t.misses, 0);
  EXPECT_GT(t.resets, 0);
  EXPECT_GT(t.invalidated, 0);
  if (duplicates) EXPECT_GT(t.duplicates, 0);
}

}  // namespace

TEST(ResidentLru, RandomStepsMatchTheModelSmall) {
  ResidentStepStats total;
  for (uint32_t seed = 1; seed <= 20 && !HasFailure(); ++seed) {
    const auto t = run_against_model(RandomRun{3, 8, 1 + static_cast<int32_t>(seed % 8), 200, seed});
    total.hits += t.hits;
    total.misses += t.misses;
    total.resets += t.resets;
    total.invalidated += t.invalidated;
    total.duplicates += t.duplicates;
  }
  expect_covered(total);
}

TEST(ResidentLru, RandomStepsMatchTheModelKEqualsCapacity) {
  for (uint32_t seed = 1; seed <= 10 && !HasFailure(); ++seed) {
    expect_covered(run_against_model(RandomRun{2, 16, 16, 200, 100 + seed}));
  }
}

TEST(ResidentLru, RandomStepsMatchTheModelMedium) {
  // Hundreds of steps on full rows: the recency queue is compacted many times.
  expect_covered(run_against_model(RandomRun{4, 256, 96, 400, 7, 400}));
}

TEST(ResidentLru, RandomStepsMatchTheModelWideIndices) {
  // Capacity above the 16-bit index limit: the 32-bit layout, with evictions.
  expect_covered(run_against_model(RandomRun{2, 16384, 4000, 14, 11, 60000}));
}

TEST(ResidentLru, RandomStepsMatchTheModelOnSeveralThreads) {
  // 64 rows: up to 8 threads of >= kMinRowsPerThread rows, 32 chunks; the steps
  // with fewer rows run on fewer threads or one. Every thread count gives the
  // model's outputs, misses in row-major top-k order included.
  static_assert(ResidentLru::kMinRowsPerThread <= 8, "64 rows must reach 8 threads");
  for (int32_t threads : {2, 3, 8}) {
    expect_covered(run_against_model(RandomRun{64, 32, 24, 60, 40u + static_cast<uint32_t>(threads), 48, threads}));
    if (HasFailure()) return;
  }
}

TEST(ResidentLru, OneAndSeveralThreadsGiveIdenticalOutputs) {
  // The benchmark's shape scaled down (K 256 into 512 slots, 96 rows, mostly
  // hits, a few positions past the stable prefix): the same steps through an
  // LRU on one thread and one on four, compared output for output and slot
  // for slot; a reset_rows in the middle of a chunk and a step over fewer rows.
  constexpr int32_t rows = 96, K = 256, cap = 512;
  ResidentLru one(rows, cap, 1), four(rows, cap, 4);
  std::mt19937 rng(5);
  std::vector<std::vector<int32_t>> prev(rows);
  std::vector<int32_t> fresh(rows, 0);
  std::vector<uint64_t> req(rows);
  for (int32_t r = 0; r < rows; ++r) req[r] = 1000 + r;
  int64_t misses = 0, hits = 0, invalidated = 0;
  for (int step = 0; step < 12; ++step) {
    const int32_t n = step == 7 ? 41 : rows;
    std::vector<int32_t> topk(static_cast<std::size_t>(n) * K), sp(n);
    for (int32_t r = 0; r < n; ++r) {
      // Every third row: its last 2 positions so far lie past the stable prefix.
      sp[r] = r % 3 == 0 ? std::max(0, fresh[r] - 2) : fresh[r];
      std::vector<int32_t> row = prev[r];
      std::shuffle(row.begin(), row.end(), rng);
      row.resize(std::min<std::size_t>(row.size(), K * 9 / 10));
      while (static_cast<int32_t>(row.size()) < K) row.push_back(fresh[r]++);
      std::shuffle(row.begin(), row.end(), rng);
      if (r % 5 == 0) row[static_cast<std::size_t>(r) % K] = -1;
      prev[r] = row;
      std::copy(row.begin(), row.end(), topk.begin() + static_cast<std::size_t>(r) * K);
    }
    std::vector<uint64_t> ids(req.begin(), req.begin() + n);
    Step a(K, topk, ids, sp), b(K, topk, ids, sp);
    const ResidentStepStats sa = a.run(one), sb = b.run(four);
    ASSERT_EQ(a.current, b.current) << "step " << step;
    ASSERT_EQ(a.misses, b.misses) << "step " << step;
    EXPECT_EQ(sa.hits, sb.hits);
    EXPECT_EQ(sa.misses, sb.misses);
    EXPECT_EQ(sa.resets, sb.resets);
    EXPECT_EQ(sa.invalidated, sb.invalidated);
    EXPECT_EQ(sa.duplicates, sb.duplicates);
    for (int32_t r = 0; r < rows; ++r) ASSERT_EQ(tokens_of(one, r), tokens_of(four, r)) << "step " << step;
    if (step > 0) {  // the first step fills the rows
      misses += sa.misses;
      hits += sa.hits;
      invalidated += sa.invalidated;
    }
    if (step == 5) {
      one.reset_rows(30, 50);
      four.reset_rows(30, 50);
    }
  }
  EXPECT_GT(hits, 5 * misses);  // mostly hits, as in steady decode
  EXPECT_GT(misses, 0);
  EXPECT_GT(invalidated, 0);
}

// ---------------------------------------------------------------- unchanged selections
// A row whose last step had K distinct valid hits and no miss skips the
// per-entry work when its next top-k is the same (docs/design/sfa.md §6.3):
// these steps must give exactly what the model gives, and every way the
// shortcut could be wrong (a new request, a reset, an invalidation, another
// K, repeats or invalid entries, misses in the last step) must not take it.

namespace {

// Runs the same steps through the LRU and the model and compares everything.
struct Twin {
  ResidentLru lru;
  RefLru ref;
  int32_t rows, cap;
  Twin(int32_t max_rows, int32_t capacity, int32_t threads = 1)
      : lru(max_rows, capacity, threads), ref(max_rows, capacity), rows(max_rows), cap(capacity) {}

  ResidentStepStats step(int32_t K, const std::vector<int32_t>& topk, const std::vector<uint64_t>& req,
                         const std::vector<int32_t>& sp, const char* what) {
    Step got(K, topk, req, sp);
    const ResidentStepStats st = got.run(lru);
    std::vector<int32_t> ref_cur;
    std::vector<ResidentMiss> ref_misses;
    const ResidentStepStats rs = ref.step(topk, K, req, sp, ref_cur, ref_misses);
    EXPECT_EQ(got.current, ref_cur) << what;
    EXPECT_EQ(got.misses, ref_misses) << what << "\n got " << to_string(got.misses) << "\nwant " << to_string(ref_misses);
    EXPECT_EQ(st.hits, rs.hits) << what;
    EXPECT_EQ(st.misses, rs.misses) << what;
    EXPECT_EQ(st.resets, rs.resets) << what;
    EXPECT_EQ(st.invalidated, rs.invalidated) << what;
    EXPECT_EQ(st.duplicates, rs.duplicates) << what;
    for (int32_t r = 0; r < rows; ++r) {
      for (int32_t s = 0; s < cap; ++s) EXPECT_EQ(lru.token_at(r, s), ref.token_at(r, s)) << what << " row " << r;
    }
    return st;
  }
  ResidentStepStats one(int32_t K, const std::vector<int32_t>& topk, const char* what, uint64_t req = 1,
                        int32_t sp = 1 << 30) {
    return step(K, topk, {req}, {sp}, what);
  }
};

}  // namespace

TEST(ResidentLru, UnchangedSelectionKeepsSlotsAndRecencyOrder) {
  Twin tw(1, 8);
  tw.one(4, {5, 3, 9, 1}, "fill");
  tw.one(4, {5, 3, 9, 1}, "first repeat (the last step had misses)");
  const auto st = tw.one(4, {5, 3, 9, 1}, "second repeat (clean)");
  expect_stats(st, 4, 0, 0, 0);
  tw.one(4, {5, 3, 9, 1}, "third repeat");
  // The recency order is the one the repeats left: new tokens fill the empty
  // slots, then evict from the last top-k position up.
  tw.one(4, {20, 21, 22, 23}, "four new (empty slots)");
  tw.one(4, {30, 31, 5, 32}, "three new: evict 1, 9, 3 in that order");
  tw.one(4, {30, 31, 5, 32}, "repeat after misses");
  tw.one(4, {30, 31, 5, 32}, "clean repeat");
  tw.one(4, {31, 30, 5, 32}, "same set, another order: not a repeat");
  tw.one(4, {40, 41, 42, 43}, "all new");
}

TEST(ResidentLru, UnchangedSelectionAfterANewRequestOrResetStartsOver) {
  Twin tw(2, 8);
  const std::vector<int32_t> topk = {1, 2, 3, 4, 5, 6};
  tw.step(3, topk, {7, 8}, {99, 99}, "fill");
  tw.step(3, topk, {7, 8}, {99, 99}, "repeat");
  tw.step(3, topk, {7, 8}, {99, 99}, "clean repeat");
  const auto st = tw.step(3, topk, {7, 9}, {99, 99}, "row 1: a new request, same top-k");
  expect_stats(st, 3, 3, 1, 0);
  tw.step(3, topk, {7, 9}, {99, 99}, "repeat");
  tw.step(3, topk, {7, 9}, {99, 99}, "clean repeat");
  // Row 0 reset (the model has no reset_rows; checked by hand): its same
  // top-k copies everything again, row 1 still takes the shortcut.
  tw.lru.reset_rows(0, 1);
  Step a(3, topk, {7, 9}, {99, 99});
  const auto sa = a.run(tw.lru);
  EXPECT_EQ(sa.resets, 1);
  EXPECT_EQ(sa.misses, 3);
  EXPECT_EQ(sa.hits, 3);
  EXPECT_EQ(a.misses, (std::vector<ResidentMiss>{{0, 1, 0}, {0, 2, 1}, {0, 3, 2}}));
  EXPECT_EQ(std::vector<int32_t>(a.current.begin() + 3, a.current.end()), (std::vector<int32_t>{0, 1, 2}));
  tw.lru.reset();
  Step b(3, topk, {7, 9}, {99, 99});
  const auto sb = b.run(tw.lru);
  expect_stats(sb, 0, 6, 2, 0);
}

TEST(ResidentLru, UnchangedSelectionWithTokensPastTheStablePrefixIsRecopied) {
  // MTP rows: the stable prefix cuts into the resident tokens, so an
  // unchanged selection still drops and copies them again.
  Twin tw(1, 8);
  tw.one(4, {0, 1, 2, 3}, "fill", 1, 4);
  tw.one(4, {0, 1, 2, 3}, "repeat", 1, 4);
  tw.one(4, {0, 1, 2, 3}, "clean repeat", 1, 4);
  const auto st = tw.one(4, {0, 1, 2, 3}, "the same top-k, stable prefix 2", 1, 2);
  expect_stats(st, 2, 2, 0, 2);
  tw.one(4, {0, 1, 2, 3}, "again, stable prefix 3", 1, 3);
  tw.one(4, {0, 1, 2, 3}, "again, stable prefix 4", 1, 4);
  tw.one(4, {0, 1, 2, 3}, "clean repeat", 1, 4);
  tw.one(4, {0, 1, 2, 3}, "clean repeat, stable prefix past everything", 1, 100);
}

TEST(ResidentLru, UnchangedSelectionWithRepeatsInvalidEntriesOrAnotherK) {
  Twin tw(1, 8);
  tw.one(4, {5, 5, 7, -1}, "repeat and invalid entry");
  tw.one(4, {5, 5, 7, -1}, "again");
  const auto st = tw.one(4, {5, 5, 7, -1}, "again (never clean)");
  expect_stats(st, 2, 0, 0, 0, 1);
  tw.one(4, {5, 6, 7, 8}, "four distinct");
  tw.one(4, {5, 6, 7, 8}, "clean");
  tw.one(3, {5, 6, 7}, "K 3: the prefix of the clean top-k");
  tw.one(3, {5, 6, 7}, "K 3 again");
  tw.one(3, {5, 6, 7}, "K 3 clean repeat");
  tw.one(4, {5, 6, 7, 9}, "K 4 again, one new");
}

TEST(ResidentLru, RandomStepsWithRepeatedSelectionsMatchTheModel) {
  // Rows that often repeat their last top-k exactly, sometimes with a stable
  // prefix that cuts into their tokens (MTP), a new request or a reset; on
  // one thread and on several (the helper pool).
  for (int32_t threads : {1, 3}) {
    constexpr int32_t rows = 24, cap = 16, K = 12;
    Twin tw(rows, cap, threads);
    std::mt19937 rng(77u + static_cast<uint32_t>(threads));
    const auto pick = [&](uint32_t n) { return static_cast<int32_t>(rng() % n); };
    std::vector<std::vector<int32_t>> prev(rows);
    std::vector<uint64_t> req(rows);
    std::vector<int32_t> ctx(rows, 2 * K);
    for (int32_t r = 0; r < rows; ++r) req[r] = 100 + r;
    int64_t repeated = 0;
    for (int step = 0; step < 300 && !HasFailure(); ++step) {
      std::vector<int32_t> topk(static_cast<std::size_t>(rows) * K), sp(rows);
      for (int32_t r = 0; r < rows; ++r) {
        const int32_t u = pick(20);
        if (u == 0) {
          req[r] = 1000 + static_cast<uint64_t>(step) * rows + r;
          prev[r].clear();
        }
        std::vector<int32_t> row;
        if (!prev[r].empty() && u < 14) {
          row = prev[r];  // the same selection
          ++repeated;
        } else {
          ctx[r] += pick(3);
          std::set<int32_t> used;
          for (int32_t p = 0; p < K; ++p) {
            int32_t t = pick(static_cast<uint32_t>(ctx[r]));
            while (!used.insert(t).second) t = pick(static_cast<uint32_t>(ctx[r]));
            row.push_back(t);
          }
          if (pick(10) == 0) row[static_cast<std::size_t>(pick(K))] = -1;
        }
        prev[r] = row;
        std::copy(row.begin(), row.end(), topk.begin() + static_cast<std::size_t>(r) * K);
        sp[r] = pick(6) == 0 ? std::max(0, ctx[r] - 1 - pick(4)) : ctx[r];  // MTP: the last positions past it
      }
      tw.step(K, topk, req, sp, "random step");
      if (step % 97 == 50) {
        tw.lru.reset();
        tw.ref = RefLru(rows, cap);
      }
    }
    EXPECT_GT(repeated, 1000);
  }
}

TEST(ResidentLru, ConcurrentStepsOnTwoLrusShareTheHelperPool) {
  // Two LRUs stepping at once from two threads, each asking for helpers: the
  // pool serves one step, the other runs on its caller; both must give the
  // outputs of a one-thread LRU.
  constexpr int32_t rows = 48, cap = 64, K = 32;
  std::vector<std::vector<int32_t>> seqs;
  std::mt19937 rng(9);
  for (int s = 0; s < 20; ++s) {
    std::vector<int32_t> topk(static_cast<std::size_t>(rows) * K);
    for (auto& t : topk) t = static_cast<int32_t>(rng() % 200);
    seqs.push_back(std::move(topk));
  }
  std::vector<uint64_t> req(rows, 5);
  std::vector<int32_t> sp(rows, 1 << 30);
  const auto run = [&](ResidentLru& lru, std::vector<std::vector<int32_t>>& cur, std::vector<std::vector<ResidentMiss>>& mis) {
    for (const auto& topk : seqs) {
      Step s(K, topk, req, sp);
      s.run(lru);
      cur.push_back(s.current);
      mis.push_back(s.misses);
    }
  };
  ResidentLru ref(rows, cap, 1), a(rows, cap, 2), b(rows, cap, 4);
  std::vector<std::vector<int32_t>> cr, ca, cb;
  std::vector<std::vector<ResidentMiss>> mr, ma, mb;
  run(ref, cr, mr);
  std::thread ta([&] { run(a, ca, ma); });
  std::thread tb([&] { run(b, cb, mb); });
  ta.join();
  tb.join();
  EXPECT_EQ(ca, cr);
  EXPECT_EQ(cb, cr);
  EXPECT_EQ(ma, mr);
  EXPECT_EQ(mb, mr);
}

TEST(ResidentLru, LongRunsWrapTheQueuePositionsAndStamps) {
  // Mostly misses, so eviction keeps up with the appended blocks and the ring
  // is never squeezed: queue positions pass 2^16 several times (16-bit stamps
  // are compared modulo 2^16), with hits, repeats, invalid entries and tokens
  // dropped past the stable prefix on the way.
  constexpr int32_t K = 4, cap = 8;
  Twin tw(1, cap);
  std::mt19937 rng(3);
  int32_t next = 0;
  std::vector<int32_t> prev;
  for (int step = 0; step < 50000 && !HasFailure(); ++step) {
    std::vector<int32_t> row;
    if (!prev.empty() && rng() % 4 == 0) row.push_back(prev[rng() % prev.size()]);
    while (static_cast<int32_t>(row.size()) < K) row.push_back(next++);
    if (rng() % 16 == 0) row[rng() % K] = -1;
    if (rng() % 32 == 0) row[1] = row[0];
    const int32_t sp = rng() % 8 == 0 ? std::max(0, next - 2) : next;
    tw.one(K, row, "long run", 1, sp);
    prev = row;
  }
}

TEST(ResidentLru, VersionMovesWithEveryChangeOfStateAndListResidentShowsIt) {
  ResidentLru lru(3, 8);
  uint64_t v = lru.version();
  Step a(2, {4, 9, 1, 6, 2, -1}, {11, 12, 13}, {100, 100, 100});
  a.run(lru);
  EXPECT_GT(lru.version(), v);
  v = lru.version();
  std::vector<ResidentMiss> listed;
  lru.list_resident(3, listed);
  // Row by row, slot by slot: every copy the step made, nothing else.
  EXPECT_EQ(listed, (std::vector<ResidentMiss>{{0, 4, 0}, {0, 9, 1}, {1, 1, 0}, {1, 6, 1}, {2, 2, 0}}))
      << to_string(listed);
  lru.list_resident(2, listed);
  EXPECT_EQ(listed.size(), 4u);
  lru.list_resident(99, listed);  // clamped to max_rows
  EXPECT_EQ(listed.size(), 5u);
  // A rejected step changes nothing, the version included.
  Step bad(2, {4, 9}, {11}, {-1});
  EXPECT_INVALID(bad.run(lru), "stable_prefix[0]=-1");
  EXPECT_EQ(lru.version(), v);
  lru.reset_rows(1, 2);
  EXPECT_GT(lru.version(), v);
  v = lru.version();
  lru.list_resident(3, listed);
  EXPECT_EQ(listed, (std::vector<ResidentMiss>{{0, 4, 0}, {0, 9, 1}, {2, 2, 0}})) << to_string(listed);
  lru.reset();
  EXPECT_GT(lru.version(), v);
  lru.list_resident(3, listed);
  EXPECT_TRUE(listed.empty());
  // An unchanged selection (no per-entry work, no change of state) still counts as a step.
  v = lru.version();
  Step c(2, {4, 9}, {11}, {100});
  c.run(lru);
  c.run(lru);
  c.run(lru);
  EXPECT_GT(lru.version(), v);
}
