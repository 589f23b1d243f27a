// SFA host planning (docs/design/sfa.md §3.1, §3.2, docs/design/sparse.md §8): one DeepSeek-V3.2 sparse
// attention step, and the valid-top-k mask of the KV-offload path.
//
// The SFA kernels (lightning indexer, sparse flash attention, docs/design/sfa.md §4.3 / §4.1)
// take the whole batch in one call, in any order (SFA needs no decode/prefill
// reorder, docs/design/sfa.md §2.1), with two length lists of different conventions
// (docs/design/sparse.md §1): actual_seq_lengths_query = cumulative query ENDS (no leading 0) and
// actual_seq_lengths_key = per-request KV LENGTHS. Both are int32, B_k entries.
//
// Thread safety: functions without shared state over caller buffers: any number of
// threads at once, each with its own output buffers.
#pragma once

#include <cstdint>

#include "ascend_attn_rt/cp/plan/dcp_layout.h"
#include "ascend_attn_rt/plan/attention_state.h"
#include "ascend_attn_rt/plan/span.h"
#include "ascend_attn_rt/plan/split.h"
#include "ascend_attn_rt/plan/step_input.h"

namespace aar::plan {

// The step (plan/step_input.h; attn_state absent: derived by
// plan::select_attention_state's rule) and what the SFA plan adds.
struct SfaStepInputs : StepInput {
  int32_t block_size = 128;        // SFA's kernel block (docs/design/sfa.md §2.1); any positive size is planned
  int32_t num_blocks = 0;          // KV-cache blocks, for range checks
  int32_t decode_threshold = 1;    // 1 + num_speculative_tokens, in [1, 16]
  SpecMethod spec_method = SpecMethod::None;
  bool chunked_prefill_enabled = true;  // state derivation only: the kernels read the whole context
  // Rows of the RoPE tables: every seq_len must be <= this (positions are
  // seq_len - query_len .. seq_len - 1). 0 = unchecked.
  int64_t rope_positions = 0;
  // Graph decode padding (the MLA "enable-pad" rule, docs/design/mla.md §3.5): a step
  // whose every request is a decode (query length <= decode_threshold) with
  // num_input_tokens > qsl[B] gets (num_input_tokens - qsl[B]) /
  // decode_threshold dummy requests of decode_threshold tokens, KV length 0,
  // block-table rows of zeros and positions 0, after the real ones: the
  // indexer then selects nothing for them (every top-k index -1) and sparse
  // attention gives zero rows. Padding that is not a multiple of
  // decode_threshold is rejected. A step with prefills is never padded: its
  // padding tokens get slot -1 and position 0, and the kernels see qsl[B]
  // tokens.
  bool pad_decode_batch = false;
  // SFA PCP (docs/design/sparse_cp.md §11.1): the rows of a step with prefills are the PCP head/tail split,
  // which pads nothing. pad_only_decode_buckets refuses num_input_tokens > qsl[B] unless the split has no
  // prefill (a decode-only step, padded to its bucket); capture_decode_only (build_for_graph_capture)
  // refuses any step whose split has a prefill. Both checked before the first write.
  bool pad_only_decode_buckets = false;
  bool capture_decode_only = false;
  // The decode/prefill split rule's inputs (docs/design/gqa.md §2.2; SfaStepPlan::split).
  // Plain SFA keeps the defaults (short extends count as decodes); the KV
  // offload builder passes treat_short_extends_as_decodes = is_decode_consumer
  // (docs/design/sfa.md §6) and, when that is false, the per-request "still prefilling its
  // prompt" flags (StepInput::is_prefilling, B entries, required then by the rule).
  bool treat_short_extends_as_decodes = true;
  // Decode context parallel with the replicated indexer (docs/design/sparse_cp.md §2, §5):
  // world > 1 plans this rank's step. The main (latent) cache is DCP-local: the block table
  // holds this rank's local blocks, slot_mapping gets the local slots (owner(pos) == rank,
  // -1 elsewhere), dcp_seq_lens the local KV lengths; the indexer cache is replicated, read
  // through replicated_block_table / replicated_slot_mapping with the global seq_lens.
  // The interleave must divide block_size. The split then counts a short extend as a prefill
  // (upstream's treat_short_extends_as_decodes=False under DCP; informational for SFA).
  DcpShard dcp;
};

// Caller-owned outputs. Required spans must have room for what the step
// writes; optional ones (marked) may be empty and are then not written.
struct SfaStepBuffers {
  Span<int32_t> query_start_loc;      // optional, >= B+1: a copy of the input
  Span<int32_t> cum_query_lens;       // >= B_k: cumulative query ends (actual_seq_lengths_query)
  Span<int32_t> seq_lens;             // >= B_k: per-request KV lengths (actual_seq_lengths_key)
  Span<int32_t> block_table;          // >= B_k * block_table_stride: the kernels' rows
  int32_t block_table_stride = 0;     // columns of the staged table (>= input stride)
  Span<int64_t> slot_mapping;         // >= num_input_tokens: -1 past qsl[B]
  Span<int32_t> positions;            // >= num_input_tokens: token positions (RoPE rows), 0 past qsl[B]
  Span<int64_t> cum_query_lens_list;  // optional, >= B_k: int64 host copy of cum_query_lens
  Span<int64_t> seq_lens_list;        // optional, >= B_k: int64 host copy of seq_lens
  // DCP only (SfaStepInputs::dcp.world > 1; must be empty otherwise):
  Span<int32_t> dcp_block_lens;           // >= B, scratch: rank 0's local lengths (the block-table columns read)
  Span<int32_t> dcp_seq_lens;             // >= B_k: this rank's local KV lengths, 0 for dummies
  Span<int64_t> dcp_seq_lens_list;        // optional, >= B_k: int64 host copy of dcp_seq_lens
  Span<int32_t> replicated_block_table;   // >= B_k * replicated_stride (cp/plan/sparse_cp.h), dummy rows 0
  int32_t replicated_stride = 0;          // >= block_table_stride * world
  Span<int64_t> replicated_slot_mapping;  // >= num_input_tokens: the indexer cache's slots, -1 past qsl[B]
  // Optional, >= B_k: the caller's record of replicated_block_table's contents. On entry, row r's
  // columns at and past replicated_extent[r] are known to be 0 (a value >= replicated_stride says
  // nothing is known); on return, each written row's entry is its written columns. A builder that
  // keeps one record per staging buffer then zeroes only the columns a longer earlier row left,
  // not the whole row tail every step. Empty: every row's tail is written.
  Span<int32_t> replicated_extent;
};

struct SfaStepPlan {
  AttentionState state = AttentionState::ChunkedPrefill;
  // Informational for plain SFA (upstream's SFA metadata leaves these 0; the
  // offload and DCP variants use them): the shared split rule (docs/design/gqa.md §2.2,
  // short extends as decodes unless SfaStepInputs says otherwise) on the
  // batch AS GIVEN. SFA does not reorder, and the rule
  // counts the leading decodes (a batch starting with a prefill is all
  // prefills), exactly what upstream's split_decodes_and_prefills returns for
  // that order.
  SplitResult split;
  int32_t num_reqs = 0;            // B
  int32_t num_kernel_reqs = 0;     // B_k = B + graph padding dummies
  int32_t num_actual_tokens = 0;   // qsl[B]
  int32_t num_input_tokens = 0;
  int32_t max_query_len = 0;       // over the real requests
  int32_t max_seq_len = 0;
  bool padded = false;             // graph decode padding added dummies
};

// Validates everything first (the batch checks plan::build_step makes, with
// the same messages; block ids each request reads; room in every buffer), then
// writes: a rejected call leaves every buffer untouched. Allocates nothing.
// If inputs.block_table.data() == buffers.block_table.data() the table is taken
// as already staged (zero copy; the strides must match) and only dummy rows are
// written.
SfaStepPlan plan_sfa_step(const SfaStepInputs& in, const SfaStepBuffers& buf);

// docs/design/sparse.md §8: out[i] = (topk[i] >= 0) && (topk[i] < thresholds_per_row[i / K])
// over a row-major (rows, K) top-k array (rows = topk.size() / K). The KV
// offload path uses it to drop padding and unwritten tail positions (the
// threshold is the request's seq_len). Validates before writing: K > 0,
// topk.size() a multiple of K, one non-negative threshold per row, room in out.
void build_valid_topk_mask(CSpan<int32_t> topk, int32_t K, CSpan<int32_t> thresholds_per_row, Span<uint8_t> out);

// The offload path's use of that mask in one pass (docs/design/sfa.md §6.3:
// where(build_valid_topk_mask(topk, thr), topk, -1)): out[i] = topk[i] where
// the mask holds, -1 elsewhere. Same validation (out needs topk.size()
// entries); out may be topk itself.
void mask_invalid_topk(CSpan<int32_t> topk, int32_t K, CSpan<int32_t> thresholds_per_row, Span<int32_t> out);

// Whether mask_invalid_topk(topk, K, thresholds_per_row) would write exactly
// `masked` (topk.size() entries): the offload path's test that a layer's
// selection is the one the previous layer's LRU decided on (docs/design/sfa.md
// §6.8). Stops at the first row that differs. Same validation.
bool masked_topk_equals(CSpan<int32_t> topk, int32_t K, CSpan<int32_t> thresholds_per_row, CSpan<int32_t> masked);

}  // namespace aar::plan
