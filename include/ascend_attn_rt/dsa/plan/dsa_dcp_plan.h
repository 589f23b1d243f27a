// The per-row index lists of a DSA DCP step (docs/design/sparse_cp.md §12.2 step 3), planned once
// per step by the group builders instead of per layer: for every query row, the physical SWA slots
// of the window positions this DCP rank owns, and the compressed-row limit. Torch-free.
#pragma once

#include <cstdint>

#include "ascend_attn_rt/cp/plan/dcp_layout.h"  // plan::DcpShard
#include "ascend_attn_rt/plan/span.h"

namespace aar::dsa {

// The step's query rows: row t of request b (query_start_loc[b] <= t < query_start_loc[b + 1]) is at
// position p = start_pos[b] + t - query_start_loc[b]. Rows at or past query_start_loc[num_reqs] belong
// to no request.
struct DsaDcpRows {
  plan::CSpan<int32_t> query_start_loc;  // num_reqs + 1, non-decreasing, from 0
  plan::CSpan<int32_t> start_pos;        // num_reqs, >= 0
  int32_t num_reqs = 0;                  // every request the kernel sees (graph padding included)
  int64_t num_rows = 0;                  // rows listed (T)
  plan::DcpShard shard;
};

// Row t's window [p - win_left, p] (positions >= 0) restricted to the positions this rank owns, as
// physical slots of its local table, in position order, then -1 up to win_left + 1 entries; -1 only
// for a row of no request. The owned positions of a window are consecutive local indices
// [local_len(max(p - win_left, 0)), local_len(p + 1)) (docs/design/cp.md §2.2), so this equals the DCP top-k
// remap (sparse_cp.md §3) of the window followed by the table lookup blk * sbs + li % sbs, with
// blk = block_table[b * stride + li / sbs]. `out` holds num_rows * (win_left + 1) words.
// InvalidArgument (before the first write) on inconsistent spans, a bad shard, win_left < 0,
// storage_block_size < 1, or a local column outside [0, block_table_stride).
void plan_dsa_dcp_window_slots(const DsaDcpRows& rows, plan::CSpan<int32_t> block_table,
                               int64_t block_table_stride, int64_t storage_block_size, int32_t win_left,
                               plan::Span<int32_t> out);

// Row t's compressed-row limit floor((p + 1) / ratio) (global: the rows below it are the ones the row
// may read); 0 for a row of no request. `out` holds num_rows words. InvalidArgument on inconsistent
// spans or ratio < 2.
void plan_dsa_dcp_cmp_limits(const DsaDcpRows& rows, int32_t ratio, plan::Span<int32_t> out);

}  // namespace aar::dsa
