// PCP batch partition of model-runner v2 (docs/design/cp.md §6.2, §6.5): KV
// replicated on every PCP rank, queries split without padding into per-rank
// "segments" (local request rows), and the gather/restore indices and the
// expanded slot mapping of the replicated KV write.
//
// For a request still prefilling with q new tokens, chunk = ceil(q / (2 Wp));
// rank rp takes chunk indices rp and 2 Wp - 1 - rp, each clipped to [0, q), an
// empty chunk dropped; every kept chunk is a segment with start_pos =
// num_computed + chunk_index * chunk. Any other request (a decode, with any
// number of tokens) is replicated: one segment of all its tokens on every
// rank. Segments are then stably reordered so that pure prefills (prefilling
// and start_pos == 0) come last, the order the attention backends expect. A
// rank without segments gets one 0-token dummy segment of request 0. Every
// rank pads its token count to P = max over ranks of local tokens, so the
// all-gather has equal splits (Wp * P rows, rank-major).
//
// Upstream's example, q = 7 (tokens A..G), Wp = 2, chunk 2: rank 0 gets chunks
// 0 and 3 ([A B], [G]), rank 1 chunks 1 and 2 ([C D], [E F]). With context
// (num_computed > 0) rank 0's rows are [A B | G]; for a fresh prefill [A B] is
// a pure prefill and moves last: [G | A B].
//
// Thread safety: functions without shared state over caller buffers: any number of
// threads at once, each with its own output buffers.
#pragma once

#include <cstdint>

#include "ascend_attn_rt/plan/span.h"

namespace aar::plan {

struct PcpSegmentInputs {
  CSpan<int32_t> query_start_loc;      // N+1 exclusive prefix sums (the global batch)
  CSpan<int32_t> num_computed_tokens;  // N
  CSpan<uint8_t> is_prefilling;        // N, nonzero = still inside the prompt (split); else replicated
  int32_t pcp_size = 1;                // Wp in [1, 65536] (the bound keeps 2 Wp and the per-rank passes small)
};

struct PcpSegment {
  int32_t req = 0;          // global batch request index
  int32_t token_begin = 0;  // first token in the global batch (query_start_loc units)
  int32_t num_tokens = 0;
  int32_t local_begin = 0;  // first row in the rank's local batch
  int32_t start_pos = 0;    // model position of the first token: num_computed + offset in the request
};

// The largest local token count over the ranks (the padded local length P).
// Validates the inputs (the checks every function here makes).
int32_t pcp_padded_local_tokens(const PcpSegmentInputs& in);

// Rank `rank`'s segments in local order into segments_out, which needs room for
// max(1, 2 * N) entries. Returns the count (>= 1: the dummy when nothing else).
int32_t pcp_rank_segments(const PcpSegmentInputs& in, int32_t rank, Span<PcpSegment> segments_out);

// The indices of the gathered buffer (Wp * P rows, rank-major, rank r's local
// row i at r * P + i):
//   hidden_restore_out [T = qsl[N]]: global token t's row in the gathered
//     buffer (rank 0's copy for replicated requests): global = gathered[restore];
//   padded_gather_out  [Wp * P]: the global token of every gathered row (0 for
//     padding): padded_gathered = global[padded_gather];
//   kv_write_mask_out  [Wp * P]: 1 for the rows whose KV is written (every
//     split row, and rank 0's copy of replicated rows), 0 for pads and the
//     other copies.
// Upstream's example (q = 7 with context, Wp = 2): restore [0,1,4,5,6,7,2],
// padded_gather [0,1,6,0,2,3,4,5], mask [1,1,1,0,1,1,1,1].
void pcp_segment_gather_indices(const PcpSegmentInputs& in, Span<int32_t> hidden_restore_out,
                                Span<int32_t> padded_gather_out, Span<uint8_t> kv_write_mask_out);

// The expanded slot mapping of docs/design/cp.md §6.5 (Wp * P entries, rank-major): entry
// (rank, i) is the slot (token_slots[t], one per global token) of rank's i-th
// local token, kPadSlot (-1) for padding and for replicated copies on ranks != 0.
void pcp_expanded_slot_mapping(const PcpSegmentInputs& in, CSpan<int32_t> token_slots, Span<int32_t> slots_out);

}  // namespace aar::plan
