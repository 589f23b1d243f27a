// Internal (plan layer): the per-request validating pass and the token writers
// shared by the step planners that stage an int64 slot mapping and token
// positions (plan::plan_mla_step, plan::plan_sfa_step), and the block-table row
// copy every planner makes (plan::build_step too).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "ascend_attn_rt/errors.h"
#include "ascend_attn_rt/plan/span.h"
#include "block_scan.h"

namespace aar::plan::detail {

// Rows whose last needed block id the scan stashes (see block_ids_in_range):
// the one-token slot writer below reads them instead of gathering.
inline constexpr std::size_t kStashRows = 1024;

struct RequestScan {
  // Inputs of the attention-state rule (docs/design/gqa.md §2.1).
  bool all_fresh = true;      // every seq_len == query length
  bool all_sched_one = true;  // every query length == 1
  bool all_valid_one = true;  // every query length - num_spec == 1
  int32_t max_query_len = 0;
  int32_t max_seq_len = 0;
  std::size_t num_last = 0;   // rows with a stashed last block id
};

// One branch-free pass over the requests (it vectorises): seq_len >= query
// length, 0 <= num_spec <= query length (spec may be null), blocks needed
// within the input stride, the state-rule flags and the maxima; then the block
// ids each request reads must lie in [0, num_blocks) (block_ids_in_range),
// stashing the last needed id of the first min(b, kStashRows) rows in
// last_ids. On any violation the exact checks, in request order, name the
// first offender. With rope_positions > 0 every seq_len must be at most that
// (a token's position is < seq_len). Writes nothing but last_ids.
// block_lens (null: seqs) are the tokens each request keeps in its block-table
// row: under DCP a rank's local length, not the sequence length; last_ids then
// refer to those lengths.
inline RequestScan scan_requests(CSpan<int32_t> qsl, const int32_t* seqs, std::size_t b, const int32_t* spec,
                                 const int32_t* table, std::size_t in_stride, int32_t block_size, int32_t num_blocks,
                                 int64_t rope_positions, int32_t* last_ids, const int32_t* block_lens = nullptr) {
  const BlockCount blocks(block_size);
  const int32_t* blens = block_lens != nullptr ? block_lens : seqs;
  const uint32_t stride_u = static_cast<uint32_t>(in_stride);
  uint32_t bad = 0, not_fresh = 0, not_one = 0, not_valid_one = 0;
  int32_t max_q = 0, max_seq = 0, max_blen = 0;
  for (std::size_t r = 0; r < b; ++r) {
    const int32_t q = qsl[r + 1] - qsl[r], seq = seqs[r];
    const int32_t sp = spec != nullptr ? spec[r] : 0;
    bad |= static_cast<uint32_t>(seq < q) | static_cast<uint32_t>(sp < 0) | static_cast<uint32_t>(sp > q) |
           static_cast<uint32_t>(blocks(blens[r]) > stride_u);
    max_blen = std::max(max_blen, blens[r]);
    not_fresh |= static_cast<uint32_t>(seq != q);
    not_one |= static_cast<uint32_t>(q != 1);
    not_valid_one |= static_cast<uint32_t>(q - sp != 1);
    max_q = std::max(max_q, q);
    max_seq = std::max(max_seq, seq);
  }
  RequestScan s;
  s.num_last = std::min(b, kStashRows);
  if (!bad) {
    bad = !block_ids_in_range(table, in_stride, blens, b, blocks, blocks(max_blen), num_blocks, last_ids, s.num_last);
  }
  if (bad) {
    for (std::size_t r = 0; r < b; ++r) {
      const int32_t q = qsl[r + 1] - qsl[r], seq = seqs[r];
      AAR_CHECK_ARG(seq >= q, "seq_lens[", r, "]=", seq, " is smaller than its query length ", q);
      if (spec != nullptr) {
        AAR_CHECK_ARG(spec[r] >= 0 && spec[r] <= q, "num_spec_tokens[", r, "]=", spec[r],
                      " is out of range [0, query length ", q, "]");
      }
      const int64_t nblk = blocks(blens[r]);
      AAR_CHECK_ARG(nblk <= static_cast<int64_t>(in_stride), "seq_lens[", r, "]=", seq, " needs ", nblk,
                    " blocks", block_lens != nullptr ? " (for its DCP shard)" : "",
                    " but block_table_stride=", in_stride, " (block_size=", block_size, ")");
      check_row_block_ids(table + r * in_stride, nblk, r, num_blocks);
    }
  }
  if (rope_positions > 0 && max_seq > rope_positions) {
    for (std::size_t r = 0; r < b; ++r) {
      AAR_CHECK_ARG(seqs[r] <= rope_positions, "seq_lens[", r, "]=", seqs[r], " exceeds the RoPE table length ",
                    rope_positions);
    }
  }
  s.all_fresh = !not_fresh;
  s.all_sched_one = !not_one;
  s.all_valid_one = !not_valid_one;
  s.max_query_len = max_q;
  s.max_seq_len = max_seq;
  return s;
}

// The caller's b rows of in_stride ids into the staged rows of out_stride
// (columns past in_stride zeroed). Unchecked.
inline void copy_block_table_rows(const int32_t* src, std::size_t b, std::size_t in_stride, int32_t* dst,
                                  std::size_t out_stride) {
  if (in_stride == out_stride) {
    std::copy(src, src + b * in_stride, dst);
    return;
  }
  for (std::size_t r = 0; r < b; ++r) {
    const int32_t* s = src + r * in_stride;
    int32_t* d = dst + r * out_stride;
    std::copy(s, s + in_stride, d);
    std::fill(d + in_stride, d + out_stride, 0);
  }
}

// A batch of one-token requests (the steady-state decode step): token r is
// request r at position seq_len - 1, in the last block the request reads. The
// first num_last rows use the block ids the scan stashed, so that loop has no
// gather and vectorises. Unchecked (inputs validated by scan_requests).
inline void write_one_token_slots(const int32_t* seqs, std::size_t b, const int32_t* table, std::size_t in_stride,
                                  int32_t block_size, const int32_t* last_ids, std::size_t num_last, int64_t* slots,
                                  int32_t* pos) {
  const BlockCount blocks(block_size);
  const int32_t bs = block_size;
  if (blocks.pow2) {
    const int shift = blocks.shift;
    const int32_t mask = bs - 1;
    for (std::size_t r = 0; r < num_last; ++r) {
      pos[r] = seqs[r] - 1;
      slots[r] = (static_cast<int64_t>(last_ids[r]) << shift) + ((seqs[r] - 1) & mask);
    }
    for (std::size_t r = num_last; r < b; ++r) {
      const int32_t p = seqs[r] - 1;
      pos[r] = p;
      slots[r] = (static_cast<int64_t>(table[r * in_stride + (p >> shift)]) << shift) + (p & mask);
    }
  } else {
    for (std::size_t r = 0; r < b; ++r) {
      const int32_t p = seqs[r] - 1;
      pos[r] = p;
      slots[r] = static_cast<int64_t>(table[r * in_stride + p / bs]) * bs + p % bs;
    }
  }
}

// Every real token's slot (int64) and position, request by request: token t of
// request r sits at position seq_len - query_len + (t - qsl[r]); positions
// advance one by one, so each block's tokens are one run of consecutive slots
// (a branch-free loop the compiler vectorises), and the next block's id is read
// only when a token lands there. pos_out(r) gives where request r's positions go.
// Unchecked.
template <typename PosOut>
inline void write_token_slots(CSpan<int32_t> qsl, const int32_t* seqs, std::size_t b, const int32_t* table,
                              std::size_t in_stride, int32_t block_size, int64_t* slots, PosOut pos_out) {
  const BlockCount blocks(block_size);
  const int32_t bs = block_size;
  for (std::size_t r = 0; r < b; ++r) {
    const int32_t begin = qsl[r], end = qsl[r + 1];
    if (begin == end) continue;
    const int32_t pos0 = seqs[r] - (end - begin);
    const int32_t* row = table + r * in_stride;
    int32_t blk = blocks.pow2 ? (pos0 >> blocks.shift) : pos0 / bs;
    int32_t off = pos0 - blk * bs;
    int32_t* pos = pos_out(r);
    int32_t t = begin;
    for (;;) {
      const int32_t run = std::min(end - t, bs - off);
      const int64_t first = static_cast<int64_t>(row[blk]) * bs + off;
      const int32_t p0 = pos0 + (t - begin);
      int64_t* __restrict s = slots + t;
      int32_t* __restrict p = pos + (t - begin);
      for (int32_t i = 0; i < run; ++i) {
        s[i] = first + i;
        p[i] = p0 + i;
      }
      t += run;
      if (t == end) break;
      off = 0;
      ++blk;
    }
  }
}

}  // namespace aar::plan::detail
