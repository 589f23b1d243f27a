// One DCP step's host planning for the GQA backend: the split (short extends as
// prefills), this rank's local slot mapping, one decode row per decode token with its
// local KV length (the interleave-aware causal mask without a mask tensor), the
// prefills' local context and the context row filter. Caller-owned buffers, no
// allocation; every check is rank-independent. Design: docs/design/cp.md §3.
#pragma once

#include <cstdint>

#include "ascend_attn_rt/cp/plan/dcp_layout.h"
#include "ascend_attn_rt/plan/span.h"
#include "ascend_attn_rt/plan/split.h"
#include "ascend_attn_rt/plan/step_input.h"

namespace aar::plan {

// The step (plan/step_input.h: decode-first order, global seq_lens, the group's
// one block table; num_input_tokens beyond qsl[B]: slot -1, padding decode rows
// on decode-only steps; attn_state, num_spec_tokens and req_ids are not read:
// build_dcp_step refuses them by name when given) and what the DCP plan adds.
struct DcpStepInputs : StepInput {
  int32_t block_size = 128;
  int32_t num_blocks = 0;
  int32_t decode_threshold = 1;    // 1 + num_speculative_tokens, in [1, 16]
  bool pd_recompute_scheduler = false;  // docs/design/cp.md §3.1 / §3.2: short requests are decodes, is_prefilling unread
  DcpShard shard;
};

struct DcpStepBuffers {
  Span<int32_t> slot_mapping;         // >= num_input_tokens: local slots, -1 where not owned
  // Decode rows: >= decode_kernel_rows (see DcpStepPlan) entries.
  Span<int32_t> decode_block_table;   // x out_stride: the request's row per token
  Span<int64_t> decode_q_ends;        // 1, 2, ..., (one row per token)
  Span<int64_t> decode_kv_lens;       // local_len(p + 1, r) per token, 0 for padding rows
  Span<int32_t> prefill_block_table;  // >= num_prefills * out_stride
  Span<int64_t> prefill_q_ends;       // >= num_prefills: cumulative query ends from 0
  Span<int64_t> prefill_context_lens; // >= num_prefills: local_len(seq_len - q, r) per request
  Span<int32_t> context_token_idx;    // >= num_prefill_tokens: prefill rows of requests with context
  int32_t out_stride = 0;             // columns of the two block tables (>= block_table_stride)
};

struct DcpStepPlan {
  SplitResult split;
  // Decode rows written: num_decode_tokens, or, for a decode-only step padded
  // to num_input_tokens (a graph bucket), num_input_tokens: the rows past the
  // decode tokens are padding rows (KV length 0, block-table row 0).
  int32_t decode_kernel_rows = 0;
  int32_t num_reqs = 0;
  int32_t num_actual_tokens = 0;
  int32_t num_input_tokens = 0;
  int32_t max_query_len = 0;
  int32_t max_seq_len = 0;
  int32_t num_local_writes = 0;      // tokens this rank writes to its cache
  bool has_context = false;          // some prefill request has global cached context
  int64_t local_context_tokens = 0;  // sum of prefill_context_lens on this rank
  int32_t num_context_rows = 0;      // entries of context_token_idx
};

DcpStepPlan build_dcp_step(const DcpStepInputs& in, const DcpStepBuffers& buf);

// The decode rows alone (shared by the GQA step above and the MLA DCP step,
// plan/mla_plan.h): decode requests [0, num_decodes) of the batch
// (decode-first, qsl cumulative from 0), one row per token: row t = qsl[r] + j
// gets q_end t + 1, KV length local_len(seq_lens[r] - q + j + 1, rank) and
// request r's block-table row (zero-padded to out_stride); rows
// [qsl[num_decodes], rows) are padding rows (q_end t + 1, KV length 0, zero
// block-table row). The caller has checked the batch and the room.
void write_dcp_decode_rows(CSpan<int32_t> qsl, CSpan<int32_t> seq_lens, int32_t num_decodes,
                           CSpan<int32_t> block_table, int32_t block_table_stride, const DcpShard& shard, int32_t rows,
                           Span<int64_t> q_ends, Span<int64_t> kv_lens, Span<int32_t> table, int32_t out_stride);

// A draft-model (MTP proposer) step of draft index d (docs/design/cp.md §3.1
// draft_cp_seq_len / draft_base_seq_lens): every request has one query token,
// at position base + d, so its sequence length is base + d + 1 and, under
// DCP, its local KV length on rank r is local_len(base + d + 1, r) (the
// decode rows' KV lengths of a one-token step, upstream's draft_cp_seq_len).
// With draft_index == -1 returns base_seq_lens unchanged. Otherwise checks that
// query_start_loc is 0, 1, ..., B (one token per request, the draft step's
// shape), that 0 <= draft_index < 16 (at most 15 draft steps: decode_threshold <=
// 16) and that no length is negative or overflows, writes the lengths into
// out (>= B entries) and returns them. Writes nothing on a rejected input.
CSpan<int32_t> draft_step_seq_lens(CSpan<int32_t> query_start_loc, CSpan<int32_t> base_seq_lens,
                                   int32_t draft_index, Span<int32_t> out);

}  // namespace aar::plan
