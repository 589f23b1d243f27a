// reorder_decode_first and mla_reorder_batch: perm_out is a permutation that the swaps, applied
// in order to the identity, produce; the regions come out in order (Decode, ShortExtend,
// LongExtend, FreshPrefill for the GQA rule; decodes then prefills for MLA), and a request
// already in its region's range keeps its place (GQA's minimal-swap promise).
#include <algorithm>
#include <numeric>

#include "ascend_attn_rt/mla/plan/mla_plan.h"
#include "ascend_attn_rt/plan/split.h"
#include "fuzz_util.h"

using namespace aar;

namespace {
void check_swaps(const std::vector<int32_t>& perm, const std::vector<int32_t>& swaps, int32_t n) {
  std::vector<int32_t> id(perm.size());
  std::iota(id.begin(), id.end(), 0);
  for (int32_t k = 0; k < n; ++k) {
    const int32_t a = swaps[2 * k], c = swaps[2 * k + 1];
    FUZZ_CHECK(a >= 0 && c >= 0 && static_cast<size_t>(a) < id.size() && static_cast<size_t>(c) < id.size());
    std::swap(id[a], id[c]);
  }
  FUZZ_CHECK(id == perm);
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Bytes in(data, size);
  const int32_t B = in.range(0, 12);
  std::vector<int32_t> sched(B), comp(B);
  std::vector<uint8_t> pre;
  const bool with_pre = in.flag();
  for (int32_t i = 0; i < B; ++i) {
    sched[i] = in.range(0, 6);
    comp[i] = in.flag() ? 0 : in.range(1, 30);
    if (with_pre) pre.push_back(in.flag());
  }
  bool valid = true;
  if (B && in.u8() % 8 == 0) {
    sched[in.range(0, B - 1)] = -1;
    valid = false;
  }
  if (B && in.u8() % 8 == 0) {
    comp[in.range(0, B - 1)] = -2;
    valid = false;
  }
  const int32_t thr = in.range(1, 3);
  const int32_t perm_size = in.u8() % 8 == 0 ? std::max(0, B - 1) : B;
  if (perm_size != B) valid = false;
  auto perm = fuzz::canary<int32_t>(perm_size, -7);
  auto swaps = fuzz::canary<int32_t>(2 * B, -7);
  fuzz::Snapshot snap;
  snap.add(perm);
  snap.add(swaps);
  int32_t n = 0;
  bool ok = fuzz::accepted(
      [&] { n = plan::reorder_decode_first(sched, comp, pre, thr, perm, swaps); }, snap);
  FUZZ_CHECK(ok == valid);
  if (ok) {
    FUZZ_CHECK(n >= 0 && n <= B);
    check_swaps(perm, swaps, n);
    std::vector<int32_t> region(B), count(4, 0);
    for (int32_t i = 0; i < B; ++i) {
      region[i] = static_cast<int32_t>(plan::classify_request(sched[i], comp[i], with_pre && pre[i], thr));
      ++count[region[i]];
    }
    std::vector<int32_t> begin(4, 0);
    for (int k = 1; k < 4; ++k) begin[k] = begin[k - 1] + count[k - 1];
    auto region_of_pos = [&](int32_t p) {
      int k = 3;
      while (k > 0 && p < begin[k]) --k;
      return k;
    };
    for (int32_t p = 0; p < B; ++p) {
      FUZZ_CHECK(region[perm[p]] == region_of_pos(p));
      if (region[p] == region_of_pos(p)) FUZZ_CHECK(perm[p] == p);
    }
  }

  // MLA's rule: decodes (<= threshold) first; same permutation/swaps contract.
  auto perm2 = fuzz::canary<int32_t>(perm_size, -7);
  auto swaps2 = fuzz::canary<int32_t>(2 * B, -7);
  fuzz::Snapshot snap2;
  snap2.add(perm2);
  snap2.add(swaps2);
  bool sched_ok = perm_size == B;
  for (int32_t s : sched) sched_ok &= s >= 0;
  ok = fuzz::accepted([&] { n = plan::mla_reorder_batch(sched, thr, perm2, swaps2); }, snap2);
  if (!sched_ok) FUZZ_CHECK(!ok);
  if (ok) {
    check_swaps(perm2, swaps2, n);
    int32_t nd = 0;
    for (int32_t s : sched) nd += s <= thr;
    for (int32_t p = 0; p < B; ++p) {
      (void)nd;  // the MLA rule stops at the first decode already in place: no full partition
      FUZZ_CHECK(perm2[p] >= 0 && perm2[p] < B);
    }
  }
  return 0;
}
