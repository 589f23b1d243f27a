// Private to the CP plan translation units (not installed, not part of the contract): the DCP
// placement formulas of dcp_layout.h without their checks, and the checks themselves, so every
// function that takes a DcpShard (dcp_layout.cpp, sparse_cp.cpp) rejects a bad one with the same
// words and then runs the formulas unchecked in its loops (docs/design/cp.md §2.1, §2.2).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "ascend_attn_rt/cp/plan/dcp_layout.h"
#include "ascend_attn_rt/errors.h"
#include "ascend_attn_rt/plan/span.h"

namespace aar::plan::detail::dcp {

inline void check_world_interleave(int32_t world, int32_t interleave) {
  AAR_CHECK_ARG(world >= 1, "world=", world, " must be >= 1");
  AAR_CHECK_ARG(interleave >= 1, "interleave=", interleave, " must be >= 1");
}

inline void check_shard(const DcpShard& s) {
  check_world_interleave(s.world, s.interleave);
  AAR_CHECK_ARG(s.rank >= 0 && s.rank < s.world, "rank=", s.rank, " is out of range [0, world=", s.world, ")");
}

inline void check_lens_nonneg(CSpan<int32_t> lens, const char* name) {
  for (std::size_t i = 0; i < lens.size(); ++i) {
    AAR_CHECK_ARG(lens[i] >= 0, name, "[", i, "]=", lens[i], " is negative");
  }
}

// Unchecked formulas (x, len >= 0 and the shard validated by the callers).
inline int64_t local_len(int64_t len, int64_t world, int64_t interleave, int64_t rank) {
  const int64_t base = len / (world * interleave) * interleave;
  const int64_t rem = len - base * world;
  return base + std::clamp<int64_t>(rem - rank * interleave, 0, interleave);
}

inline int64_t local_index(int64_t x, int64_t world, int64_t interleave) {
  return x / (world * interleave) * interleave + x % interleave;
}

inline int64_t owner(int64_t x, int64_t world, int64_t interleave) { return x / interleave % world; }

}  // namespace aar::plan::detail::dcp
