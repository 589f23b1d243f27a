// Internal (plan layer): the block-table checks and the vectorised block-id
// scans shared by plan::build_step and plan::plan_mla_step.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "ascend_attn_rt/errors.h"
#include "ascend_attn_rt/plan/span.h"

namespace aar::plan::detail {

// The caller's block table against the planner's staging rows: enough entries
// for num_reqs rows of in_stride, a staging stride at least as wide, and, when
// the caller passes the staging buffer itself (zero copy; two empty spans are
// not that), the same stride. Returns whether it is zero copy.
inline bool check_block_table_args(CSpan<int32_t> block_table, std::size_t num_reqs, int32_t in_stride,
                                   const int32_t* staged, int32_t staged_stride) {
  const std::size_t need = num_reqs * static_cast<std::size_t>(in_stride);
  AAR_CHECK_ARG(block_table.size() >= need, "block_table has ", block_table.size(),
                " entries, fewer than num_reqs*block_table_stride = ", num_reqs, "*", in_stride, " = ", need);
  AAR_CHECK_ARG(staged_stride >= in_stride, "buffers.block_table_stride=", staged_stride,
                " is smaller than block_table_stride=", in_stride);
  const bool zero_copy = block_table.data() != nullptr && block_table.data() == staged;
  AAR_CHECK_ARG(!zero_copy || staged_stride == in_stride,
                "block_table is the staged buffer (zero copy) but block_table_stride=", in_stride,
                " differs from buffers.block_table_stride=", staged_stride);
  return zero_copy;
}

// The exact check of one row's needed ids (row r, n ids): names the first one
// out of [0, num_blocks). The fast scans below only say whether one exists.
inline void check_row_block_ids(const int32_t* row, int64_t n, std::size_t r, int32_t num_blocks) {
  for (int64_t c = 0; c < n; ++c) {
    AAR_CHECK_ARG(row[c] >= 0 && row[c] < num_blocks, "block_table[", r, "][", c, "]=", row[c],
                  " is out of range [0, ", num_blocks, ")");
  }
}

// Block-table entries a request reads: ceil(seq_len / block_size). Unsigned so
// that a negative seq_len (rejected by the seq_len >= query length rule) cannot
// overflow; exact for every seq_len in [0, INT32_MAX].
struct BlockCount {
  uint32_t bs_minus_1 = 0, bs = 1;
  int shift = 0;
  bool pow2 = true;
  explicit BlockCount(int32_t block_size) : bs_minus_1(static_cast<uint32_t>(block_size) - 1),
                                            bs(static_cast<uint32_t>(block_size)),
                                            pow2((block_size & (block_size - 1)) == 0) {
    while (pow2 && (1u << shift) < bs) ++shift;
  }
  uint32_t operator()(int32_t seq) const {
    const uint32_t s = static_cast<uint32_t>(seq) + bs_minus_1;
    return pow2 ? s >> shift : s / bs;
  }
};

// Four int32 lanes in the compiler's generic vector type (GCC and Clang lower
// it to SSE2 on x86-64 and NEON on aarch64). The block-id scan below is written
// with it because neither compiler vectorises a variable-length inner loop per
// row without reducing its accumulator at the end of every row.
using I32x4 = int32_t __attribute__((vector_size(16)));

inline I32x4 load_i32x4(const int32_t* p) {
  I32x4 v;
  std::memcpy(&v, p, sizeof v);  // unaligned load
  return v;
}

// Lane masks for the first k of 8 ids, k = 0..8.
alignas(16) inline constexpr int32_t kFirstLanes[9][8] = {
    {0, 0, 0, 0, 0, 0, 0, 0},         {-1, 0, 0, 0, 0, 0, 0, 0},       {-1, -1, 0, 0, 0, 0, 0, 0},
    {-1, -1, -1, 0, 0, 0, 0, 0},      {-1, -1, -1, -1, 0, 0, 0, 0},    {-1, -1, -1, -1, -1, 0, 0, 0},
    {-1, -1, -1, -1, -1, -1, 0, 0},   {-1, -1, -1, -1, -1, -1, -1, 0}, {-1, -1, -1, -1, -1, -1, -1, -1}};


// Accumulates f over the first blocks(seqs[r]) ids of every row, eight ids at
// a time; ids past a row's end are stale and masked to 0 (f(0) must be 0 in
// every lane that counts). The callers have checked that every count fits in
// the stride. The last needed id of row r goes to last_ids[r] for r < num_last
// while the row is in cache (the block of a decode token at seq_len - 1).
template <typename Chunk, typename Scalar>
inline I32x4 scan_block_ids(const int32_t* table, std::size_t stride, const int32_t* seqs, std::size_t b,
                     const BlockCount& blocks, uint32_t max_count, int32_t* last_ids, std::size_t num_last,
                     Chunk chunk, Scalar scalar) {
  const int32_t st = static_cast<int32_t>(stride);
  I32x4 acc = {};
  if (max_count <= 8 && st >= 8) {
    for (std::size_t r = 0; r < b; ++r) {
      const int32_t* row = table + r * stride;
      const int32_t n = static_cast<int32_t>(blocks(seqs[r]));
      const int32_t* mask = kFirstLanes[n];
      acc |= (load_i32x4(mask) & chunk(row)) | (load_i32x4(mask + 4) & chunk(row + 4));
      if (r < num_last) last_ids[r] = row[std::max(n, 1) - 1];
    }
  } else {
    for (std::size_t r = 0; r < b; ++r) {
      const int32_t* row = table + r * stride;
      const int32_t n = static_cast<int32_t>(blocks(seqs[r]));
      int32_t c = 0;
      for (; c + 8 <= n; c += 8) acc |= chunk(row + c) | chunk(row + c + 4);
      if (r < num_last) last_ids[r] = row[std::max(n, 1) - 1];
      if (c == n) continue;
      if (c + 8 <= st) {
        const int32_t* mask = kFirstLanes[n - c];
        acc |= (load_i32x4(mask) & chunk(row + c)) | (load_i32x4(mask + 4) & chunk(row + c + 4));
      } else {
        for (; c < n; ++c) acc[0] |= scalar(row[c]);
      }
    }
  }
  return acc;
}

// Bitwise OR of n ids, four accumulators so the chains overlap. Every id is at
// most the OR (unsigned), so OR < num_blocks proves all of them in range.
inline uint32_t or_of_ids(const int32_t* p, std::size_t n) {
  I32x4 a0 = {}, a1 = {}, a2 = {}, a3 = {};
  std::size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    a0 |= load_i32x4(p + i);
    a1 |= load_i32x4(p + i + 4);
    a2 |= load_i32x4(p + i + 8);
    a3 |= load_i32x4(p + i + 12);
  }
  const I32x4 a = (a0 | a1) | (a2 | a3);
  int32_t s = a[0] | a[1] | a[2] | a[3];
  for (; i < n; ++i) s |= p[i];
  return static_cast<uint32_t>(s);
}

// True when every block id a kernel reads lies in [0, num_blocks). With a
// power-of-two num_blocks the test is one OR per four ids (an id is below a
// power of two iff the OR of all ids is); otherwise ids are compared (signed
// compare of sign-flipped values: SSE2 has no unsigned one). A false result
// only sends the caller to the exact check. num_blocks >= 0 (the callers check
// it first: with a negative one the compare form can answer true).
inline bool block_ids_in_range(const int32_t* table, std::size_t stride, const int32_t* seqs, std::size_t b,
                        const BlockCount& blocks, uint32_t max_count, int32_t num_blocks, int32_t* last_ids,
                        std::size_t num_last) {
  if (num_blocks == 0 || stride == 0) return max_count == 0;
  if ((num_blocks & (num_blocks - 1)) == 0) {
    const I32x4 acc = scan_block_ids(
        table, stride, seqs, b, blocks, max_count, last_ids, num_last, [](const int32_t* p) { return load_i32x4(p); },
        [](int32_t id) { return id; });
    return static_cast<uint32_t>(acc[0] | acc[1] | acc[2] | acc[3]) < static_cast<uint32_t>(num_blocks);
  }
  const I32x4 flip = I32x4{} + INT32_MIN;
  const I32x4 limit = I32x4{} + ((num_blocks ^ INT32_MIN) - 1);
  const I32x4 acc = scan_block_ids(
      table, stride, seqs, b, blocks, max_count, last_ids, num_last,
      [&](const int32_t* p) { return (load_i32x4(p) ^ flip) > limit; },
      [&](int32_t id) { return -static_cast<int32_t>(static_cast<uint32_t>(id) >= static_cast<uint32_t>(num_blocks)); });
  return (acc[0] | acc[1] | acc[2] | acc[3]) == 0;
}

}  // namespace aar::plan::detail
