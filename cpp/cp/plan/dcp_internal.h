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
#include "ascend_attn_rt/plan/slot_mapping.h"
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

// Division of a uint32 by a divisor fixed for a whole pass (the shard's W * I, I, the block size),
// by one multiply-high instead of a hardware divide (docs/design/cp.md §11.7): with
// m = floor((2^64 - 1) / d) + 1, floor(n / d) = (m * n) >> 64 for every 32-bit n and d >= 2
// (Lemire, Kaser and Kurz, "Faster remainder by direct computation", 2019); d == 1 is the identity.
struct FastDiv {
  explicit FastDiv(uint32_t d) : d_(d), m_(d > 1 ? ~uint64_t{0} / d + 1 : 0) {}
  uint32_t div(uint32_t n) const {
    return d_ == 1 ? n : static_cast<uint32_t>((static_cast<unsigned __int128>(m_) * n) >> 64);
  }
  uint32_t divisor() const { return d_; }

 private:
  uint32_t d_;
  uint64_t m_;
};

// local_len(len, world, interleave, rank) given q = len / (W * I) (computed once for every rank).
inline int64_t local_len_from(int64_t len, int64_t q, int64_t world, int64_t interleave, int64_t rank) {
  const int64_t base = q * interleave, rem = len - q * world * interleave;
  return base + std::clamp<int64_t>(rem - rank * interleave, 0, interleave);
}

// local_len(len, world, interleave, rank) and local_len(len, ..., 0) from one division by W * I
// (fd_wi); len >= 0 and the shard validated. Returns {this rank's, rank 0's}.
struct LocalLens {
  int64_t mine, first;
};
inline LocalLens local_lens_fast(int64_t len, const FastDiv& fd_wi, int64_t world, int64_t interleave,
                                 int64_t rank) {
  const int64_t q = fd_wi.div(static_cast<uint32_t>(len));
  const int64_t rem = len - q * world * interleave, base = q * interleave;
  return {base + std::clamp<int64_t>(rem - rank * interleave, 0, interleave), base + std::min(rem, interleave)};
}

// The DCP placement of docs/design/cp.md §2.1 in 32-bit arithmetic (positions and lengths are
// int32), with shifts when the interleave, the world and the block size are powers of two (the
// usual case: a division per token was most of the DCP build's cost).
// (Shared by the SFA and MLA step plans.)
struct DcpMath {
  uint32_t W, I, WI, bs, rank;
  bool pow2;
  int sI = 0, sW = 0, sWI = 0, sbs = 0;
  static bool is_pow2(uint32_t v) { return v != 0 && (v & (v - 1)) == 0; }
  static int log2u(uint32_t v) { return 31 - __builtin_clz(v); }
  DcpMath(const DcpShard& d, int32_t block_size)
      : W(static_cast<uint32_t>(std::max(d.world, 1))), I(static_cast<uint32_t>(std::max(d.interleave, 1))),
        WI(W * I), bs(static_cast<uint32_t>(std::max(block_size, 1))), rank(static_cast<uint32_t>(std::max(d.rank, 0))),
        pow2(is_pow2(W) && is_pow2(I) && is_pow2(bs)) {
    if (pow2) sI = log2u(I), sW = log2u(W), sWI = log2u(WI), sbs = log2u(bs);
  }
  // #{x < len : owner(x) == k}
  int32_t local_len(uint32_t len, uint32_t k) const {
    if (pow2) {
      // len mod WI - k I lies in (-W I, W I): 32-bit lanes, so the request loops vectorise.
      const int32_t rem = static_cast<int32_t>(len & (WI - 1)) - static_cast<int32_t>(k << sI);
      return static_cast<int32_t>(((len >> sWI) << sI) + static_cast<uint32_t>(std::clamp(rem, 0, int32_t(I))));
    }
    const uint32_t base = len / WI * I;
    const int64_t rem = static_cast<int64_t>(len) - static_cast<int64_t>(base) * W - static_cast<int64_t>(k) * I;
    return static_cast<int32_t>(base + static_cast<uint32_t>(std::clamp<int64_t>(rem, 0, I)));
  }
  // The rank owning position p, and p's index in its owner's local sequence (pow2 only).
  uint32_t owner(uint32_t p) const { return (p >> sI) & (W - 1); }
  uint32_t local_index(uint32_t p) const { return ((p >> sWI) << sI) | (p & (I - 1)); }
  // The local slot of position p on this rank, -1 when another rank owns it.
  int64_t local_slot(uint32_t p, const int32_t* row) const {
    if (pow2) {
      if (((p >> sI) & (W - 1)) != rank) return kPadSlot;
      const uint32_t li = ((p >> sWI) << sI) | (p & (I - 1));
      return (static_cast<int64_t>(row[li >> sbs]) << sbs) + (li & (bs - 1));
    }
    if (p / I % W != rank) return kPadSlot;
    const uint32_t li = p / WI * I + p % I;
    return static_cast<int64_t>(row[li / bs]) * bs + li % bs;
  }
};

}  // namespace aar::plan::detail::dcp
