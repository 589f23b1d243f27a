// PCP token split of the sharded (legacy model-runner v1) design, DualChunkSwap with
// padding: each rank's local tokens, the restore permutation of the all-gathered
// buffer, the unpad mask, the padded-global slot mapping, the context path's
// permutations and the head/tail index lists. Batches decode-first; caller-owned
// buffers; every function validates before writing. Design: docs/design/cp.md §6.1,
// §6.3, §6.4.
#pragma once

#include <cstdint>

#include "ascend_attn_rt/plan/span.h"

namespace aar::plan {

struct PcpSplitInputs {
  CSpan<int32_t> query_lens;  // new tokens per request (>= 0), decodes first
  int32_t num_decodes = 0;    // the first num_decodes requests are decodes
  int32_t pcp_size = 1;       // Wp in [1, kMaxCpMergePartitions]
};

struct PcpSplitSizes {
  int32_t num_reqs = 0;
  int32_t num_decode_tokens = 0;     // Td, sum of q over decodes
  int32_t local_tokens = 0;          // T_loc, the same on every rank
  int32_t local_prefill_tokens = 0;  // T_loc - Td
  int32_t padded_global_tokens = 0;  // Wp * T_loc
  int32_t scheduled_tokens = 0;      // sum of q over all requests
};

// Validates the inputs (query_lens >= 0, 0 <= num_decodes <= N, 1 <= pcp_size <=
// kMaxCpMergePartitions (16: the sharded KV spans Wp * Wd <= 16 ranks, cp_groups.h),
// sizes within int32) and returns the buffer sizes. Every function below makes
// the same checks before writing.
PcpSplitSizes pcp_split_sizes(const PcpSplitInputs& in);

// Rank `rank`'s local tokens: local_lens_out[i] (N entries) = q_i for decodes,
// 2 c_i for prefills; positions_out (T_loc entries) = the position within its
// request of every local token, in local order (positions >= q_i are pads).
// Upstream docstring: q = [1,5,8], 1 decode, Wp = 2: local_lens [1,4,4];
// rank 0 positions [0 | 0,1,6,7 | 0,1,6,7], rank 1 [0 | 2,3,4,5 | 2,3,4,5].
void pcp_local_tokens(const PcpSplitInputs& in, int32_t rank, Span<int32_t> local_lens_out,
                      Span<int32_t> positions_out);

// Pads per request in the padded-global layout: (Wp-1)*q for decodes (the extra
// copies), P - q for prefills. Docstring example: [1,3,0].
void pcp_pad_counts(const PcpSplitInputs& in, Span<int32_t> pads_out);

// restore_idx (padded_global_tokens entries): padded_global = G[restore_idx],
// with G the rank-major all-gather of the ranks' local buffers. The docstring
// example gives [0,9,1,2,10,11,12,13,3,4,5,6,14,15,16,17,7,8].
void pcp_restore_index(const PcpSplitInputs& in, Span<int32_t> restore_out);

// unpad_mask (padded_global_tokens entries, 1 = real token): prefill positions
// < q, and rank 0's copy (the first of each group of Wp) of every decode token.
void pcp_unpad_mask(const PcpSplitInputs& in, Span<uint8_t> mask_out);

// The slot mapping in padded-global order (docs/design/cp.md §6.3): token_slots holds one slot
// per scheduled token in batch order (sum(query_lens) entries, computed from the
// pre-split global positions, e.g. by compute_dcp_slot_mapping with W = Wp*Wd,
// r = rp*Wd + rd); real padded-global entries get their token's slot, pads and
// the extra decode copies kPadSlot (-1). The decode slots thus sit at stride Wp
// in the first Wp*Td entries.
void pcp_padded_slot_mapping(const PcpSplitInputs& in, CSpan<int32_t> token_slots, Span<int32_t> slots_out);

// The context path's prefill-only permutations (docs/design/cp.md §6.4), over
// Wp * local_prefill_tokens rows. G' is the rank-major all-gather of the ranks'
// local prefill tokens; X_pg is the padded-global prefill region.
//   recover_out (cp_kv_recover_idx_for_chunk): X_pg = G'[recover]
//   inverse_out (kv_inverse_idx_for_chunk):    G'-order rows = X_pg[inverse]
// Equal to argsort(argsort(restore_idx[Wp*Td:])) and argsort(restore_idx[Wp*Td:]).
void pcp_chunk_restore_index(const PcpSplitInputs& in, Span<int32_t> recover_out, Span<int32_t> inverse_out);

// Head/tail attention lists of one rank (docs/design/cp.md §6.4), over the prefill requests
// only: q indices are into the rank's local prefill query (query[Td:]), KV
// indices into the restored padded-global prefill K/V (full[Wp*Td:]).
struct PcpHeadTailCounts {
  int32_t num_prefills = 0;
  int32_t chunk_tokens = 0;        // sum c_i: q_head/q_tail/kv_*_mask entries each
  int32_t head_nomask_tokens = 0;  // sum rank * c_i
  int32_t tail_nomask_tokens = 0;  // sum (2 Wp - 1 - rank) * c_i
};
PcpHeadTailCounts pcp_head_tail_counts(const PcpSplitInputs& in, int32_t rank);

struct PcpHeadTailBuffers {
  Span<int32_t> q_head_idx;          // chunk_tokens
  Span<int32_t> q_tail_idx;          // chunk_tokens
  Span<int32_t> kv_head_nomask_idx;  // head_nomask_tokens: earlier chunks of the request (non-causal)
  Span<int32_t> kv_head_mask_idx;    // chunk_tokens: the head chunk itself (causal diagonal block)
  Span<int32_t> kv_tail_nomask_idx;  // tail_nomask_tokens
  Span<int32_t> kv_tail_mask_idx;    // chunk_tokens
  Span<int32_t> q_full_idx;          // 2*chunk_tokens: concat(head out, tail out)[q_full_idx] = local order
  // Cumulative ends (no leading 0), num_prefills entries each:
  Span<int64_t> mask_seq_ends;         // attn_mask_seqlens: cumsum c_i (q and mask-KV lengths)
  Span<int64_t> head_nomask_kv_ends;   // head_attn_nomask_seqlens: cumsum rank * c_i
  Span<int64_t> tail_nomask_kv_ends;   // tail_attn_nomask_seqlens: cumsum (2 Wp - 1 - rank) * c_i
};
// Validates every capacity first, then fills the lists; returns the counts.
// Example (Wp=2, one prefill with q=8, c=2): rank 0 q_head [0,1], head nomask
// [], head mask [0,1], q_tail [2,3], tail nomask [0..5], tail mask [6,7];
// rank 1 head nomask [0,1], head mask [2,3], tail nomask [0..3], tail mask [4,5].
PcpHeadTailCounts pcp_head_tail_indices(const PcpSplitInputs& in, int32_t rank, const PcpHeadTailBuffers& out);

}  // namespace aar::plan
