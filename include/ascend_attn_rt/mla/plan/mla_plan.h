// MLA-specific host planning (docs/design/mla.md §3.2, §3.4, §3.5): the MLA
// decode-first reorder, prefill context chunking, and the graph-mode padding of
// the speculative-decode query lengths. The decode/prefill split is the shared
// plan::split_decodes_and_prefills (same rule; MLA passes
// treat_short_extends_as_decodes = true without DCP).
//
// Thread safety: functions without shared state over caller buffers: any number of
// threads at once, each with its own output buffers.
#pragma once

#include <cstdint>

#include "ascend_attn_rt/plan/span.h"
#include "ascend_attn_rt/plan/attention_state.h"
#include "ascend_attn_rt/cp/plan/dcp_layout.h"
#include "ascend_attn_rt/plan/split.h"
#include "ascend_attn_rt/plan/step_input.h"

namespace aar::plan {

// npu_attention_update merges at most 16 partial results: the new-token part
// plus at most 15 context chunks.
inline constexpr int32_t kMaxContextChunks = 15;

// docs/design/mla.md §3.2: requests with num_scheduled <= decode_threshold are decodes,
// the rest prefills (both ascending). For i = 1..min(#dec, #pre): if
// dec[#dec - i] >= #dec swap it with pre[k] (k = 0, 1, ... per swap), else stop.
// perm_out (B entries) gets the resulting order (old index at each new
// position), swaps_out (>= 2*B entries) the swaps as (low, high) pairs.
// Returns the number of swaps.
int32_t mla_reorder_batch(CSpan<int32_t> num_scheduled, int32_t decode_threshold, Span<int32_t> perm_out,
                          Span<int32_t> swaps_out);

struct ContextChunkInputs {
  // Per prefill request: cached context tokens (seq_len - query_len), NP entries.
  CSpan<int32_t> context_lens;
  int64_t workspace_tokens = 0;  // W (plan::chunked_prefill_workspace_size)
  int32_t block_size = 0;
  int32_t max_chunks = kMaxContextChunks;  // 1..15
};

// Row-major [C, NP] (or [C, NP+1]) outputs; sized for max_chunks rows.
struct ContextChunkBuffers {
  Span<int32_t> cu_seq_lens;     // >= max_chunks*(NP+1): exclusive prefix sums, column 0 = 0
  Span<int32_t> starts;          // >= max_chunks*NP: c * chunk_size
  Span<int32_t> chunk_seq_lens;  // >= max_chunks*NP: per-request tokens in chunk c
  Span<int64_t> kv_ends;         // >= max_chunks*NP: cumulative (inclusive) chunk_seq_lens[c]
  Span<int64_t> seq_tot;         // >= max_chunks: tokens gathered in chunk c
  Span<int64_t> max_seq_lens;    // >= max_chunks: max over requests of chunk_seq_lens[c]
  // DCP only (plan_mla_step with dcp.world > 1, docs/design/mla.md §6.1 / §6.3; `starts`
  // then holds the local starts c * local_chunk_size):
  Span<int32_t> padded_chunk_seq_lens;  // >= max_chunks*NP: local tokens every rank gathers (plen)
  Span<int64_t> local_seq_tot;          // >= max_chunks: sum over requests of plen[c]
  // Rows of the chunk's all-gathered [W * local_seq_tot[c]] buffer that hold real
  // context tokens, request by request (rank 0's tokens, then rank 1's, ...),
  // for chunk c at [reorg_offsets[c], reorg_offsets[c+1]); reorg_offsets[c+1] -
  // reorg_offsets[c] == seq_tot[c]. reorg_index needs sum(context_lens) entries.
  Span<int64_t> reorg_index;
  Span<int64_t> reorg_offsets;          // >= max_chunks + 1
};

struct ContextChunkPlan {
  int32_t num_chunks = 0;        // 0 when no prefill has context
  int32_t chunk_size = 0;        // tokens per request per chunk, a multiple of block_size
  int32_t num_with_context = 0;  // prefills with context > 0
  int32_t max_context = 0;
  // True when the workspace rule (docs/design/mla.md §3.4) would need more than max_chunks
  // chunks and the chunk size was raised to round_up(ceil(max_context /
  // max_chunks), block_size) instead; the per-chunk gather then exceeds W
  // tokens (W is only a token budget on Ascend, the gather buffers are sized
  // per chunk from seq_tot).
  bool bounded = false;
};

// docs/design/mla.md §3.4 with the chunk-count bound. Validates before writing.
ContextChunkPlan plan_context_chunks(const ContextChunkInputs& in, const ContextChunkBuffers& buf);

// round_half_even(linspace(a, b, n+1)[1:]) into out[0..n) (numpy semantics,
// docs/design/mla.md §3.5 `interp`); the last value is exactly b.
void interp_round_half_even(int64_t a, int64_t b, int32_t n, Span<int64_t> out);

// docs/design/mla.md §3.5, "disable-pad" mode (full-graph MTP with the padded drafter batch
// disabled): actual_q (cumulative decode query ends, nd entries) is extended
// by interp(actual_q.back(), graph_pad_size, graph_pad_size - num_reqs) (or by
// nothing when graph_pad_size <= num_reqs). Writes the result into out and
// returns its length. out needs room for nd + max(0, graph_pad_size - num_reqs).
int32_t pad_actual_q_disable_mode(CSpan<int64_t> actual_q, int32_t num_reqs, int32_t graph_pad_size,
                                  Span<int64_t> out);

// docs/design/mla.md §3.5 `pad_enable`: appends req_pad entries to actual_q: if req_pad != 0,
// ref.size() > num_reqs and ref[num_reqs] - actual_q.back() > 16, the interp
// from actual_q.back() to ref[num_reqs + req_pad - 1]; otherwise
// ref[num_reqs : num_reqs + req_pad]. Returns the result length.
int32_t pad_actual_q_enable_mode(CSpan<int64_t> actual_q, int32_t num_reqs, int32_t req_pad, CSpan<int64_t> ref,
                                 Span<int64_t> out);

// One MLA step (docs/design/mla.md §3.3-§3.5; graph padding: "enable-pad" mode only), in two branch-free
// validating passes (the per-request rules, then the block ids each request
// reads) and one writing pass: what plan::build_step
// does for MLA (attention state, decode/prefill split with short extends as
// decodes, staged query_start_loc and block table, FIA query ends and KV
// lengths, slot mapping) plus what MLA adds: the slot mapping as int64, decode
// and prefill token positions (for the RoPE gather), the prefill rows of the
// block table at their own fixed address, prefill query ends rebased to 0, and
// the context chunks (docs/design/mla.md §3.4). Tokens past query_start_loc[B] get slot -1;
// they are attended only with pad_decode_batch (as dummy decode requests with
// no KV), otherwise the kernels never see them.
// Everything that can fail is checked before the first write, so a rejected
// call leaves every buffer untouched. Allocates nothing.
// The step (plan/step_input.h; attn_state absent: derived from the lengths) and
// what the MLA plan adds.
struct MlaStepInputs : StepInput {
  int32_t block_size = 128;
  int32_t num_blocks = 0;          // KV-cache blocks, for range checks
  int32_t decode_threshold = 1;
  SpecMethod spec_method = SpecMethod::None;
  // Disabled: a prefill with cached context is rejected (its context would be lost).
  bool chunked_prefill_enabled = true;
  // Rows of the RoPE tables: every seq_len must be <= this (positions are
  // seq_len - query_len .. seq_len - 1). 0 = unchecked.
  int64_t rope_positions = 0;
  int64_t workspace_tokens = 0;  // W of docs/design/mla.md §3.4 (needed when a prefill has context)
  int32_t max_chunks = kMaxContextChunks;
  // Graph decode padding (docs/design/mla.md §3.5), for a decode-only step with
  // num_input_tokens > qsl[B] (steps with prefills are not padded). Dummy
  // requests get KV length 0, a block-table row of zeros, positions 0; the
  // decode kernels then see the whole padded bucket.
  //  "enable-pad" (pad_decode_batch): (num_input_tokens - qsl[B]) /
  //    decode_threshold dummies of decode_threshold tokens (the padding must be
  //    a multiple of it), query ends continuing uniformly.
  //  "disable-pad" (also pad_interpolated; full-graph MTP without a padded
  //    drafter batch): num_input_tokens - B dummies, so the kernels see
  //    num_input_tokens requests and tokens, with the query ends extended by
  //    pad_actual_q_disable_mode (round-half-even interpolation to
  //    num_input_tokens; a dummy may get 0 tokens).
  bool pad_decode_batch = false;
  bool pad_interpolated = false;
  // Refuse num_input_tokens > qsl[B] on a step with prefills (MLA PCP: only a decode-only step is
  // padded to a graph bucket; a step with prefills is eager and its rows are the PCP split's).
  bool pad_only_decode_buckets = false;
  // Decode context parallel (docs/design/mla.md §6, docs/design/cp.md §2.1): with dcp.world > 1 the
  // KV cache is sharded along the sequence over the group, and this is rank
  // dcp.rank's step:
  //  * the split treats short requests still prefilling as prefills (docs/design/mla.md §3.3:
  //    treat_short_extends_as_decodes = false, is_prefilling below);
  //  * the slot mapping holds this rank's local slots, -1 for the tokens other
  //    ranks own (every rank computes every token's K/V, writes its own);
  //  * kv_lens (FIA actual_seq_kvlen) are this rank's local lengths,
  //    local_len(seq_len, rank) (the new tokens included: decodes write first);
  //  * a request's block table needs ceil(local_len(seq_len, 0) / B) columns
  //    (rank 0 holds the most), not ceil(seq_len / B);
  //  * context chunks (docs/design/mla.md §6.1): the chunk size is rounded to B * W (upstream
  //    rounds to lcm(B, I * W), whose local starts c * chunk / W need not be
  //    block multiples (docs/design/mla.md §6.1); npu_gather_pa_kv_cache applies offsets at
  //    block granularity, so we round to B * W, a multiple of lcm(B, I*W) since
  //    I divides B). cu_seq_lens, chunk_seq_lens, kv_ends, seq_tot and
  //    max_seq_lens stay global; starts become local (c * chunk / W) and the
  //    DCP buffers of ContextChunkBuffers are filled.
  // Requires B % I == 0. Graph decode padding under DCP: dummies of local KV length 0.
  DcpShard dcp;
  // StepInput::is_prefilling is only read under DCP, where an empty span means
  // seq_len == query_len (no computed tokens).
  // The P/D recompute scheduler (docs/design/cp.md §3.1 / §3.2): under DCP the split
  // treats short extends as decodes and reads no is_prefilling, as without
  // DCP (a decode node recomputing a transferred request's last prompt token
  // runs it as a decode).
  bool pd_recompute_scheduler = false;
};

struct MlaStepBuffers {
  Span<int32_t> query_start_loc;      // >= B+1
  Span<int32_t> block_table;          // >= (B + dummies) * block_table_stride: all rows, decodes first
  int32_t block_table_stride = 0;     // columns of the staged tables (>= input stride)
  Span<int64_t> q_ends;               // >= B (+ dummies): cumulative query ends (FIA actual_seq_lengths_q)
  Span<int64_t> kv_lens;              // >= B (+ dummies): per-request KV lengths (FIA actual_seq_kvlen)
  Span<int64_t> slot_mapping;         // >= num_input_tokens: -1 past the real tokens
  Span<int32_t> decode_positions;     // >= num_decode_tokens (padded: num_input_tokens)
  Span<int32_t> prefill_positions;    // >= num_prefill_tokens
  Span<int32_t> prefill_block_table;  // >= NP * block_table_stride: rows num_decodes..
  Span<int64_t> prefill_q_ends;       // >= NP: cumulative prefill query ends, rebased to 0
  ContextChunkBuffers chunks;         // room for max_chunks rows when a prefill has context
  // DCP scratch, >= B entries each: rank 0's local lengths (the block-table
  // columns a request needs) and, with an empty is_prefilling, the derived flags.
  Span<int32_t> dcp_block_lens;
  Span<uint8_t> dcp_is_prefilling;
  // DCP with multi-token decodes (decode_threshold > 1, speculative decode):
  // one decode row per token, >= decode_kernel_tokens entries (x
  // block_table_stride for the table), written by plan::write_dcp_decode_rows
  // (dcp_step_plan.h): row t of decode request r has r's block-table row and
  // this rank's local length local_len(p_t + 1, rank) (p_t the token's
  // position), which is the interleave-aware causal mask of docs/design/cp.md §3.3 for
  // a one-query-row (BNSD) call, with upstream's quirk (a row with no local key
  // at or before its position attends everything, docs/design/cp.md §3.3) corrected: such a
  // row gets KV length 0. Graph padding rows get KV length 0.
  Span<int32_t> dcp_decode_block_table;
  Span<int64_t> dcp_decode_q_ends;
  Span<int64_t> dcp_decode_kv_lens;
};

struct MlaStepPlan {
  AttentionState state = AttentionState::ChunkedPrefill;
  SplitResult split;
  ContextChunkPlan chunks;  // num_chunks == 0: no prefill context
  int32_t num_reqs = 0;
  int32_t num_kernel_reqs = 0;  // num_reqs + graph decode padding's dummy requests
  int32_t num_actual_tokens = 0;
  int32_t num_input_tokens = 0;
  int32_t max_query_len = 0;
  int32_t max_seq_len = 0;
  int32_t decode_max_seq_len = 0;
  // What the decode kernels see: split.num_decodes / num_decode_tokens, or with
  // graph decode padding the padded request and token counts.
  int32_t decode_kernel_reqs = 0;
  int32_t decode_kernel_tokens = 0;
  // DCP with multi-token decodes: the decode rows are the dcp_decode_*
  // buffers, one per token (decode_kernel_reqs == decode_kernel_tokens).
  bool dcp_token_rows = false;
  int32_t prefill_max_query_len = 0;
  int32_t prefill_max_seq_len = 0;
  // DCP: tokens per request per chunk on each rank (chunks.chunk_size / W), 0 otherwise.
  int32_t local_chunk_size = 0;
};

// If inputs.block_table.data() == buffers.block_table.data() the table is taken
// as already staged (zero copy; the strides must then match).
MlaStepPlan plan_mla_step(const MlaStepInputs& in, const MlaStepBuffers& buf);

// Next power of two >= n (n itself when it is one); n in [1, 2^30].
int64_t next_power_of_two(int64_t n);

}  // namespace aar::plan
