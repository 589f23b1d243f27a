// ResidentLru::step over several steps: every valid top-k entry's slot holds that token after
// the step, invalid entries get -1, hits + misses count the distinct valid tokens of each row,
// misses name free-or-evicted slots with their token; a rejected step changes neither the
// state nor the outputs.
#include <set>

#include "ascend_attn_rt/sfa/plan/resident_lru.h"
#include "fuzz_util.h"

using namespace aar;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Bytes in(data, size);
  const int32_t max_rows = in.range(1, 4), cap = in.range(1, 12);
  plan::ResidentLru lru(max_rows, cap);
  for (int step = 0; step < 6 && in.remaining(); ++step) {
    const int32_t rows = in.range(0, max_rows + (in.u8() % 16 == 0));
    const int32_t K = in.u8() % 16 == 0 ? cap + 1 : in.range(1, cap);
    std::vector<int32_t> topk(static_cast<size_t>(rows) * K), prefix(rows);
    std::vector<uint64_t> ids(rows);
    for (auto& t : topk) t = in.u8() % 6 == 0 ? -1 : in.range(0, 3 * cap);
    for (int32_t r = 0; r < rows; ++r) {
      ids[r] = in.range(0, 2);
      prefix[r] = in.u8() % 16 == 0 ? -1 : in.range(0, 4 * cap);
    }
    auto cur = fuzz::canary<int32_t>(topk.size(), -9);
    std::vector<plan::ResidentMiss> miss(topk.size(), {-9, -9, -9});
    // Snapshot the state through token_at.
    std::vector<int32_t> before;
    for (int32_t r = 0; r < max_rows; ++r)
      for (int32_t s = 0; s < cap; ++s) before.push_back(lru.token_at(r, s));
    fuzz::Snapshot snap;
    snap.add(cur);
    bool valid = rows <= max_rows && K <= cap;
    for (int32_t p : prefix) valid &= p >= 0;
    plan::ResidentStepStats st;
    const uint64_t version = lru.version();
    const bool ok = fuzz::accepted([&] { st = lru.step({topk, K, ids, prefix}, {cur, miss}); }, snap);
    FUZZ_CHECK(ok == valid);
    if (!ok) {
      std::vector<int32_t> after;
      for (int32_t r = 0; r < max_rows; ++r)
        for (int32_t s = 0; s < cap; ++s) after.push_back(lru.token_at(r, s));
      FUZZ_CHECK(after == before);
      FUZZ_CHECK(lru.version() == version);
      continue;
    }
    FUZZ_CHECK(lru.version() != version);
    // list_resident: exactly the slots token_at shows holding a token, row by row, slot by slot.
    std::vector<plan::ResidentMiss> listed, want;
    lru.list_resident(max_rows, listed);
    for (int32_t r = 0; r < max_rows; ++r)
      for (int32_t s = 0; s < cap; ++s)
        if (lru.token_at(r, s) >= 0) want.push_back({r, lru.token_at(r, s), s});
    FUZZ_CHECK(listed.size() == want.size());
    for (size_t i = 0; i < listed.size() && i < want.size(); ++i)
      FUZZ_CHECK(listed[i].row == want[i].row && listed[i].token == want[i].token && listed[i].slot == want[i].slot);
    int64_t distinct = 0;
    for (int32_t r = 0; r < rows; ++r) {
      std::set<int32_t> seen;
      for (int32_t j = 0; j < K; ++j) {
        const int32_t t = topk[static_cast<size_t>(r) * K + j];
        const int32_t s = cur[static_cast<size_t>(r) * K + j];
        if (t < 0) {
          FUZZ_CHECK(s == -1);
          continue;
        }
        seen.insert(t);
        FUZZ_CHECK(s >= 0 && s < cap && lru.token_at(r, s) == t);
      }
      distinct += static_cast<int64_t>(seen.size());
    }
    FUZZ_CHECK(st.hits + st.misses == distinct);
    for (int64_t m = 0; m < st.misses; ++m) {
      const auto& e = miss[m];
      FUZZ_CHECK(e.row >= 0 && e.row < rows && e.slot >= 0 && e.slot < cap && lru.token_at(e.row, e.slot) == e.token);
    }
  }
  return 0;
}
