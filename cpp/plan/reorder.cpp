// Decode-first batch reorder (docs/design/gqa.md §2.3) with the minimal number of swaps.
//
// Each request has a target region (its class); a position is misplaced when
// the request sitting there belongs to another region. Let M[b][a] be the number
// of positions in region b holding a request of class a (a != b). Sorting with
// swaps costs (misplaced - number of cycles) for the best decomposition of this
// balanced multigraph into cycles, so the cycles must be as many (as short) as
// possible:
//   * 2-cycles first (an exchange argument shows taking all of them is optimal);
//   * then 3-cycles: after the 2-cycles every pair of regions has edges in one
//     direction only, and an oriented graph on 4 vertices has at most 2 directed
//     triangles, which share one edge, so greedy in any order reaches the
//     maximum packing;
//   * what is left is balanced and triangle-free: 4-cycles only.
// A cycle of length L is resolved with L-1 swaps through one pivot position.
// Correctly placed requests are never touched. No allocation: per (region,
// class) a monotone cursor finds the next misplaced position, which is valid
// because positions only ever turn from misplaced into placed.
#include <algorithm>
#include <cstdint>

#include "ascend_attn_rt/errors.h"
#include "ascend_attn_rt/plan/split.h"

namespace aar::plan {

ReorderRegion classify_request(int32_t num_scheduled, int32_t num_computed, bool is_prefilling,
                               int32_t decode_threshold) {
  if (num_computed == 0) return ReorderRegion::FreshPrefill;
  if (num_scheduled <= decode_threshold) {
    return is_prefilling ? ReorderRegion::ShortExtend : ReorderRegion::Decode;
  }
  return ReorderRegion::LongExtend;
}

namespace {
constexpr int kRegions = 4;
}

int32_t reorder_decode_first(CSpan<int32_t> num_scheduled, CSpan<int32_t> num_computed,
                             CSpan<uint8_t> is_prefilling, int32_t decode_threshold, Span<int32_t> perm_out,
                             Span<int32_t> swaps_out) {
  const std::size_t b = num_scheduled.size();
  AAR_CHECK_ARG(decode_threshold >= 1 && decode_threshold <= 16, "decode_threshold=", decode_threshold,
                " is out of range [1, 16]");
  AAR_CHECK_ARG(num_computed.size() == b, "num_computed has ", num_computed.size(),
                " entries but num_scheduled has ", b);
  AAR_CHECK_ARG(is_prefilling.empty() || is_prefilling.size() == b, "is_prefilling has ", is_prefilling.size(),
                " entries, expected 0 (all false) or ", b);
  AAR_CHECK_ARG(perm_out.size() == b, "perm_out has ", perm_out.size(), " entries, expected ", b);
  AAR_CHECK_ARG(swaps_out.size() >= 2 * b, "swaps_out has room for ", swaps_out.size(),
                " entries, needs at least 2*B = ", 2 * b);
  AAR_CHECK_ARG(b <= static_cast<std::size_t>(INT32_MAX / 2), "batch of ", b, " requests is too large");
  for (std::size_t i = 0; i < b; ++i) {
    AAR_CHECK_ARG(num_scheduled[i] >= 0, "num_scheduled[", i, "]=", num_scheduled[i], " is negative");
    AAR_CHECK_ARG(num_computed[i] >= 0, "num_computed[", i, "]=", num_computed[i], " is negative");
  }

  const auto n = static_cast<int32_t>(b);
  auto cls = [&](int32_t req) {
    const bool pre = !is_prefilling.empty() && is_prefilling[req] != 0;
    return static_cast<int>(classify_request(num_scheduled[req], num_computed[req], pre, decode_threshold));
  };

  int32_t count[kRegions] = {0, 0, 0, 0};
  for (int32_t i = 0; i < n; ++i) {
    perm_out[i] = i;
    ++count[cls(i)];
  }
  int32_t start[kRegions + 1] = {0, 0, 0, 0, 0};
  for (int r = 0; r < kRegions; ++r) start[r + 1] = start[r] + count[r];

  int32_t m[kRegions][kRegions] = {};
  int32_t cursor[kRegions][kRegions];
  for (int r = 0; r < kRegions; ++r) {
    for (int a = 0; a < kRegions; ++a) cursor[r][a] = start[r];
    for (int32_t p = start[r]; p < start[r + 1]; ++p) {
      const int a = cls(p);
      if (a != r) ++m[r][a];
    }
  }

  int32_t num_swaps = 0;
  // Next position in region r holding a request of class a (m[r][a] > 0).
  auto take = [&](int r, int a) {
    int32_t& c = cursor[r][a];
    while (cls(perm_out[c]) != a) ++c;
    return c;
  };
  // Resolves the cycle regions[0] -> regions[1] -> ... -> regions[len-1] -> regions[0],
  // where "x -> y" is a position in region x holding a request of class y.
  auto resolve = [&](const int* regions, int len) {
    int32_t pos[kRegions];
    for (int j = 0; j < len; ++j) {
      const int from = regions[j];
      const int to = regions[(j + 1) % len];
      pos[j] = take(from, to);
      --m[from][to];
    }
    for (int j = 1; j < len; ++j) {
      std::swap(perm_out[pos[0]], perm_out[pos[j]]);
      swaps_out[2 * num_swaps] = std::min(pos[0], pos[j]);
      swaps_out[2 * num_swaps + 1] = std::max(pos[0], pos[j]);
      ++num_swaps;
    }
  };
  auto resolve_all = [&](const int* regions, int len) {
    int32_t times = m[regions[0]][regions[1 % len]];
    for (int j = 1; j < len; ++j) times = std::min(times, m[regions[j]][regions[(j + 1) % len]]);
    for (int32_t t = 0; t < times; ++t) resolve(regions, len);
  };

  // 2-cycles.
  for (int a = 0; a < kRegions; ++a) {
    for (int c = a + 1; c < kRegions; ++c) {
      const int cyc[2] = {a, c};
      resolve_all(cyc, 2);
    }
  }
  // 3-cycles, both orientations of each triple.
  for (int a = 0; a < kRegions; ++a) {
    for (int c = a + 1; c < kRegions; ++c) {
      for (int d = c + 1; d < kRegions; ++d) {
        const int fwd[3] = {a, c, d};
        const int bwd[3] = {a, d, c};
        resolve_all(fwd, 3);
        resolve_all(bwd, 3);
      }
    }
  }
  // 4-cycles: the six directed Hamiltonian cycles through region 0.
  int rest[3] = {1, 2, 3};
  do {
    const int cyc[4] = {0, rest[0], rest[1], rest[2]};
    resolve_all(cyc, 4);
  } while (std::next_permutation(rest, rest + 3));

  return num_swaps;
}

}  // namespace aar::plan
