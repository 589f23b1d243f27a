// The per-step host pieces of the GQA PCP backend (docs/design/cp.md §6, §6.3, §6.4,
// §6.5) that pcp_split.h / pcp_segments.h / dcp_layout.h do not already give:
// which requests a PCP step splits and the local request rows a model-runner-v2 rank hands to the
// ordinary GQA metadata builder.
//
// Decisions where upstream is silent:
//  * Split rule. PCP keeps no speculative decode (the decode threshold is 1):
//    a request is split (a prefill) when it has more than one new token or is
//    flagged still-prefilling; the first split request splits the batch, every
//    request after it is split too (docs/design/cp.md §3.2's first-flag rule), so the batch
//    must come decodes first, as the GQA builder's reorder leaves it.
//  * A request with 0 new tokens before the first split one is a decode with
//    nothing to compute (it contributes no row).
//
// Thread safety: functions without shared state over caller buffers: any number of
// threads at once, each with its own output buffers.
#pragma once

#include <cstdint>

#include "ascend_attn_rt/cp/plan/pcp_segments.h"
#include "ascend_attn_rt/plan/slot_mapping.h"
#include "ascend_attn_rt/plan/span.h"

namespace aar::plan {

// flags_out[i] = 1 iff request i is split (see above); returns the number of
// leading unsplit requests (the decodes). is_prefilling may be empty (no
// request flagged). Validates query_start_loc and the sizes first.
int32_t pcp_split_flags(CSpan<int32_t> query_start_loc, CSpan<uint8_t> is_prefilling, Span<uint8_t> flags_out);

// A model-runner-v2 rank's local batch (docs/design/cp.md §6.5): one request row per segment
// (pcp_rank_segments order, so replicated decodes first, pure prefills last),
// row k with query length seg.num_tokens, seq_len = seg.start_pos +
// seg.num_tokens (its KV, already written for every token before it), the
// block-table row of seg.req, and is_prefilling = the request's split flag.
struct PcpLocalBatchBuffers {
  Span<int32_t> query_start_loc;  // >= rows + 1
  Span<int32_t> seq_lens;         // >= rows
  Span<int32_t> block_table;      // >= rows * block_table_stride
  Span<uint8_t> is_prefilling;    // >= rows
  Span<PcpSegment> segments;      // scratch, >= max(1, 2 N)
};
// in.is_prefilling must be the split flags. block_table has N rows of
// block_table_stride. Returns the number of rows (>= 1: the dummy segment of a
// rank without tokens). Validates every capacity before writing.
int32_t pcp_local_batch(const PcpSegmentInputs& in, int32_t rank, CSpan<int32_t> block_table,
                        int32_t block_table_stride, const PcpLocalBatchBuffers& out);

}  // namespace aar::plan
