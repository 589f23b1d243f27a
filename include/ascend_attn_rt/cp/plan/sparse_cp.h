// Host planning of context parallel for the sparse families (docs/design/sparse_cp.md):
// the DCP "replicated indexer" views of SFA (§2), the remap of a replicated-view top-k
// selection to one DCP rank's local positions (§3), the token shard of DSA-CP, shared
// by SFA and DSA (§4), and the rows of one SFA PCP rank (§11). Torch-free, caller-owned buffers, no allocation; every function
// validates all of its input before its first write (a rejected call writes nothing) and
// every check is rank-independent.
//
// Thread safety: functions without shared state over caller buffers.
#pragma once

#include <cstdint>

#include "ascend_attn_rt/cp/plan/dcp_layout.h"
#include "ascend_attn_rt/plan/span.h"

namespace aar::plan {

// ---- §2: the replicated indexer views (SFA DCP) ----
// The indexer cache is replicated on every DCP rank and holds num_blocks * W blocks: local
// block lb of rank r is replicated block lb * W + r. Replicated column j of a request (the
// global positions [j*bs, (j+1)*bs)) is rank (j mod W)'s local column floor(j / W):
//   rep[b][j] = local_table[b][floor(j / W)] * W + (j mod W)
// for j < ceil(seq_lens[b] / bs); every other entry of the row (and every entry of a row with
// seq_len 0) is 0. The kernel block equals the KV block here (upstream's bpp = 1).
struct DcpReplicatedInputs {
  CSpan<int32_t> block_table;       // rows x block_table_stride, the group's (local) block table
  int32_t block_table_stride = 0;
  CSpan<int32_t> seq_lens;          // rows: global KV lengths (>= 0)
  int32_t world = 1;                // W in [1, kMaxCpMergePartitions]
  int32_t block_size = 128;         // bs > 0
  int32_t num_blocks = 0;           // local blocks per rank: every local id read is in [0, num_blocks)
};
// out: rows x out_stride, out_stride >= block_table_stride * W; every entry of the rows x out_stride
// is written (nothing past it). Checks: W, bs, num_blocks >= 0 with num_blocks * W <= INT32_MAX
// (the replicated ids are int32), the strides, the table's size, seq_lens >= 0, the local column
// floor(j / W) < block_table_stride and its id in range for every j read, room in out.
void dcp_replicated_block_table(const DcpReplicatedInputs& in, Span<int32_t> out, int32_t out_stride);

// The replicated slot of every token: token t of request b (query_start_loc cumulative from
// 0, B + 1 entries) at position p = seq_lens[b] - q_b + i has slot
// rep[b][floor(p / bs)] * bs + p mod bs; entries [qsl[B], out.size()) are -1.
// rep is the table above (rows x rep_stride). Checks query_start_loc (B + 1 entries, from 0,
// non-decreasing), q_b <= seq_lens[b], the column in range and its id >= 0 for every token,
// bs > 0, room in out.
void dcp_replicated_slot_mapping(CSpan<int32_t> query_start_loc, CSpan<int32_t> seq_lens, CSpan<int32_t> rep,
                                 int32_t rep_stride, int32_t block_size, Span<int64_t> out);

// ---- §3: the top-k remap (SFA DCP) ----
// topk: rows x K row-major, global positions of the replicated view, negative = invalid.
// out[row] = the entries x >= 0 with dcp_owner(x, W, I) == shard.rank, as
// dcp_local_index(x, W, I), in their top-k order, then -1 up to K (a stable compaction).
// out may be topk itself (in place); any other overlap of the two is rejected. Only the first
// topk.size() entries of out are written. Checks K > 0, topk.size() a multiple of K, room in out,
// the shard (world >= 1, 0 <= rank < world, interleave >= 1; no bound on W: nothing walks the
// ranks). Exact integer arithmetic (upstream computes in float32, exact below 2^24). W = 1 is the
// identity on the valid entries but still compacts (upstream skips the remap then).
void remap_sparse_indices(CSpan<int32_t> topk, int32_t K, const DcpShard& shard, Span<int32_t> out);

// ---- §4: the DSA-CP token shard (SFA and DSA) ----
// The flattened token stream split evenly over W ranks: T_pad = roundup(num_input_tokens, W),
// tpr = T_pad / W, rank r owns [r*tpr, r*tpr + tpr) of it.
struct TokenShard {
  int32_t num_actual_tokens = 0;  // qsl[B]
  int32_t num_tokens_pad = 0;     // T_pad
  int32_t tokens_per_rank = 0;    // tpr
  int32_t local_start = 0;        // r * tpr
  int32_t local_end = 0;          // max(local_start, min(local_start + tpr, num_actual_tokens))
  int32_t local_end_with_pad = 0; // local_start + tpr
  int32_t num_local_tokens = 0;   // local_end - local_start: real tokens of this rank
};
struct TokenShardInputs {
  CSpan<int32_t> query_start_loc;  // B + 1, cumulative from 0
  CSpan<int32_t> seq_lens;         // B: KV lengths (context + new), >= 0; below q_b for a graph
                                   // padding request (tokens without KV), which is accepted
  int32_t num_input_tokens = 0;    // >= qsl[B] (graph padding; 0 is not "qsl[B]" here), and
                                   // roundup(num_input_tokens, W) <= INT32_MAX
  int32_t world = 1;               // W >= 1
  int32_t rank = 0;                // in [0, W)
};
struct TokenShardBuffers {
  // B entries each: per request b with [gs, ge) = [qsl[b], qsl[b+1]) and
  // ls = max(gs, local_start), le = min(ge, local_end_with_pad), n = le - ls:
  //   local_cum_query_lens[b] = sum over b' <= b of max(n_b', 0)   (cumulative ENDS)
  //   local_seq_lens[b]       = n > 0 ? max(seq_lens[b] - (ge - le), 0) : 0
  Span<int32_t> local_cum_query_lens;
  Span<int32_t> local_seq_lens;
  // Optional (local_slot_mapping empty: slot_mapping is not read, nothing written): the local
  // slice of the step's slot mapping padded with -1 to T_pad:
  // local_slot_mapping[i] = slot_mapping[local_start + i] (or -1 past its size), exactly tpr
  // entries written; local_slot_mapping needs room for tpr, slot_mapping at least qsl[B] entries.
  CSpan<int64_t> slot_mapping;
  Span<int64_t> local_slot_mapping;
};
// Writes the first B entries of the two length buffers (room checked), and the slots above.
TokenShard plan_token_shard(const TokenShardInputs& in, const TokenShardBuffers& buf);

// ---- §11: one PCP rank's rows of a global SFA step ----
// The DualChunkSwap split of docs/design/cp.md §6.1 (cp/plan/pcp_split.h): the first num_decodes
// requests are computed by every PCP rank; prefill b (q_b new tokens, c_b = ceil(q_b / (2 Wp))) gives
// rank rp its chunks rp (head) and 2 Wp - 1 - rp (tail), c_b rows each, positions q_b and later being
// pads. Local rows: the decode tokens, then per prefill its head chunk and its tail chunk. Every rank
// has the same T_loc rows and the same row count per request.
struct SparsePcpInputs {
  CSpan<int32_t> query_start_loc;  // B + 1, cumulative from 0: the global step
  CSpan<int32_t> seq_lens;         // B: context + new tokens, >= the query length
  int32_t num_decodes = 0;         // in [0, B]
  int32_t pcp_size = 1;            // Wp in [1, kMaxCpMergePartitions]
  int32_t pcp_rank = 0;            // in [0, Wp)
};
struct SparsePcpSizes {
  int32_t num_decode_tokens = 0;  // Td = qsl[num_decodes]
  int32_t local_tokens = 0;       // T_loc
  int32_t indexer_reqs = 0;       // entries of the indexer lists of this rank
};
// Validates the inputs (the checks of plan_sparse_pcp_rows but the buffers) and returns the sizes.
SparsePcpSizes sparse_pcp_sizes(const SparsePcpInputs& in);
struct SparsePcpBuffers {
  // T_loc each: the global token of every local row (-1 for a pad) and its position in its request
  // (context + chunk position: the RoPE row; a pad takes its request's last position).
  Span<int32_t> local_token_index;
  Span<int32_t> positions;
  // qsl[B]: the row of every global token in the rank-major all-gather of the ranks' local rows
  // (Wp * T_loc rows): a decode token its rank-0 copy (row t), a prefill token its chunk's rank's row.
  Span<int32_t> gather_index;
  // Wp * B: cumulative row ends of the gathered buffer grouped by (rank j, request b), j-major:
  // j * T_loc + (rows of requests 0..b in a rank's local order).
  Span<int32_t> gathered_cum_query_lens;
  // indexer_reqs each: the lightning indexer's requests over this rank's rows (bottom-right causal,
  // sparse_mode 3), in local row order. A decode request is (q_b, S_b); a chunk starting at position
  // p0 with n real rows is (n, S_b - q_b + p0 + n), so that its row i sees the keys up to its own
  // position; its pads, when any, a request of their own with KV length 0 (nothing selected). Empty
  // parts are left out. indexer_req: the global request of each (its block-table row).
  Span<int32_t> indexer_cum_query_lens;
  Span<int32_t> indexer_seq_lens;
  Span<int32_t> indexer_req;
};
// Validates everything (sparse_pcp_sizes and every capacity) before the first write; returns the sizes.
SparsePcpSizes plan_sparse_pcp_rows(const SparsePcpInputs& in, const SparsePcpBuffers& out);

// ---- §13: one DSA PCP rank's step (DeepSeek-V4) ----
// The rows and segments of plan_sparse_pcp_rows (§11), with the SAS attention's lengths beside the
// indexer's. Every PCP rank keeps complete caches (every rank writes every token's SWA, compressor-state
// and indexer rows from the gathered hidden states, at the global step's slots); a rank attends its local
// rows only, each segment (a decode request, or a head / tail chunk's real rows, or its pads) a request
// of the sparse attention with bottom-right causality:
//   indexer (QLI) KV length: rows.indexer_seq_lens (a chunk: ctx + p0 + n; pads 0: nothing selected)
//   SAS KV length: the same for real segments; n for a pad segment of n rows (the request's first n
//     positions, which exist since n <= c <= q <= S_b: the SAS kernel needs KV >= query rows; the pads'
//     outputs are discarded).
struct DsaPcpBuffers {
  SparsePcpBuffers rows;           // plan_sparse_pcp_rows' lists (indexer_* are the segments)
  Span<int32_t> sas_seq_lens;      // segments: the SAS KV length of each
  Span<int32_t> sas_cu_seqlens_kv; // segments + 1: [0, cumsum(sas_seq_lens)]
};
struct DsaPcpPlan {
  SparsePcpSizes sizes;
  int32_t max_seqlen_q = 0;           // the longest segment (rows)
  int32_t max_seqlen_kv = 0;          // max of sas_seq_lens
  int32_t max_indexer_seqlen_kv = 0;  // max of rows.indexer_seq_lens
};
// Validates everything (sparse_pcp_sizes and every capacity) before the first write.
DsaPcpPlan plan_dsa_pcp_step(const SparsePcpInputs& in, const DsaPcpBuffers& out);

// ---- §12.5: the compressed-row list of a captured DSA DCP step ----
// A DSA DCP layer of compress ratio r > 4 (C128) lists every compressed row below a query row's
// limit floor((p + 1) / r). A captured decode bucket fixes the list's width once, whatever the
// replayed steps' lengths: every position a step builder accepts is below its RoPE table's
// `rope_positions` rows P, so floor(P / r) entries hold every limit; at least one (an all -1 row
// when no row is complete). Checks P >= 1 and r >= 2.
int64_t dsa_dcp_captured_cmp_width(int64_t rope_positions, int32_t ratio);

}  // namespace aar::plan
