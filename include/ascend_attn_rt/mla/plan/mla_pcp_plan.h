// MLA prefill context parallel, the sharded (legacy model-runner v1) design: one PCP rank's
// rows of a global MLA step (docs/design/cp.md §11, §6.1, §6.3, §6.4). plan_mla_step plans the
// global step with the KV sharded over the W = Wp * Wd PCP x DCP ranks (its DcpShard is
// (W, rp * Wd + rd, I)): split, decode rows, local KV lengths, context chunks. This turns its
// per-token outputs into the rank's local rows, with the pcp_split.h functions: the decodes
// (replicated on every PCP rank) then the head and tail chunk of every prefill.
//
// Decisions:
//  * The layer gathers only the prefill rows' latent and rope keys over PCP (the decodes write
//    their own rows through the local slot mapping, every PCP rank computing them alike), so the
//    restore index covers the prefill region only (pcp_chunk_restore_index's recover_out) and
//    the local slot mapping is -1 on every prefill row: those are written after the gather
//    through the padded-global slot mapping, whose decode region keeps every Wp-th entry
//    (rank 0's copy) and -1 elsewhere.
//  * A pad row (position >= q in its request) takes the RoPE row of the request's last token:
//    its key is never cached (slot -1) and never attended by a real query.
//
// Thread safety: functions without shared state over caller buffers: any number of
// threads at once, each with its own output buffers.
#pragma once

#include <cstdint>

#include "ascend_attn_rt/cp/plan/pcp_split.h"
#include "ascend_attn_rt/plan/span.h"

namespace aar::plan {

struct MlaPcpInputs {
  CSpan<int32_t> query_start_loc;  // the global step (N + 1 entries, from 0), decodes first
  CSpan<int32_t> seq_lens;         // N: cached context + new tokens
  int32_t num_decodes = 0;         // plan_mla_step's split: the first num_decodes requests
  int32_t pcp_size = 1;            // Wp
  int32_t pcp_rank = 0;            // rp
  // One slot per scheduled token (query_start_loc[N] entries) on this rank's KV shard:
  // plan_mla_step's slot mapping under the PCP x DCP shard, -1 where another rank owns it.
  CSpan<int64_t> token_slots;
};

struct MlaPcpSizes {
  PcpSplitSizes split;                // local_tokens T_loc (= Td + local prefill rows), padded_global_tokens
  PcpHeadTailCounts head_tail;        // this rank's head/tail list sizes
  int32_t prefill_max_query_len = 0;  // the largest local prefill length 2 c_i
};

// Validates the inputs (query_start_loc from 0 and non-decreasing, seq_lens >= query lengths,
// num_decodes and the PCP place in range, token_slots of query_start_loc[N] entries) and returns
// the sizes. `query_lens` is scratch of >= N entries.
MlaPcpSizes mla_pcp_sizes(const MlaPcpInputs& in, Span<int32_t> query_lens);

struct MlaPcpBuffers {
  Span<int64_t> slot_mapping;         // >= T_loc: decode rows their token's slot, prefill rows -1
  Span<int32_t> prefill_positions;    // >= T_loc - Td: every local prefill row's position in its request
                                      // (context + chunk position; pads: the request's last position)
  Span<int64_t> prefill_q_ends;       // >= num_prefills: cumulative local prefill lengths (2 c_i)
  Span<int64_t> padded_slot_mapping;  // >= Wp * T_loc: the slots in the padded-global order (-1 for pads,
                                      // for tokens other ranks own and for decode copies but the first)
  Span<int32_t> prefill_restore_idx;  // >= Wp * (T_loc - Td): restored prefill rows = gathered[idx]
  PcpHeadTailBuffers head_tail;       // sized by MlaPcpSizes::head_tail
  Span<int32_t> local_token_index;    // >= T_loc: the global token of every local row, -1 for pads
  // Scratch.
  Span<int32_t> query_lens;           // >= N
  Span<int32_t> local_lens;           // >= N
  Span<int32_t> positions;            // >= T_loc
  Span<int32_t> token_rows;           // >= query_start_loc[N] + Wp * T_loc
  Span<int32_t> restore_inverse;      // >= Wp * (T_loc - Td)
};

// Validates everything (mla_pcp_sizes and every capacity) before the first write, then fills
// the buffers; returns the sizes.
MlaPcpSizes plan_mla_pcp_rows(const MlaPcpInputs& in, const MlaPcpBuffers& out);
// The same with `sizes` = mla_pcp_sizes(in, out.query_lens) already computed by the caller for these
// inputs (and out.query_lens holding that call's query lengths): the inputs are not validated again,
// the capacities are.
MlaPcpSizes plan_mla_pcp_rows(const MlaPcpInputs& in, const MlaPcpSizes& sizes, const MlaPcpBuffers& out);

}  // namespace aar::plan
