// DCP token placement with the interleave size I (docs/design/cp.md §2.1, §2.2, §3.1, §3.4,
// §3.3; docs/design/mla.md §6.1): which CP rank stores which token of a request, the per-rank
// KV lengths (get_dcp_local_seq_lens), the local slot mapping of a step's tokens,
// the interleave-aware causal mask of speculative decode, and the chunked-context
// token filter of the DCP prefill.
//
// The shard is (W, r, I): W ranks share one block table; the token at global
// position x (0-based in its request) lives on
//   owner(x)       = floor(x / I) mod W
//   local_index(x) = floor(x / (W*I)) * I + (x mod I)   (its index in the owner's local sequence)
// A rank's local sequence is the positions it owns in increasing order, packed
// from 0, so a paged kernel reads it with the request's block table and
// kv_len = local_len(L, r). For legacy PCP x DCP the same formulas hold with
// W = Wp*Wd and r = rp*Wd + rd (plan::CpRankPlace::kv_shard_size / kv_shard_rank).
//
// Every validation is rank-independent: all ranks of a group accept or reject
// the same batch, so a rejection can never leave ranks waiting in a collective.
//
// Thread safety: functions without shared state over caller buffers: any number of
// threads at once, each with its own output buffers.
#pragma once

#include <cstdint>

#include "ascend_attn_rt/plan/slot_mapping.h"
#include "ascend_attn_rt/plan/span.h"

namespace aar::plan {

struct DcpShard {
  int32_t world = 1;       // W >= 1
  int32_t rank = 0;        // r in [0, W)
  int32_t interleave = 1;  // I >= 1
};

// The scalar formulas above (x >= 0, W >= 1, I >= 1; InvalidArgument otherwise).
int32_t dcp_owner(int64_t x, int32_t world, int32_t interleave);
int64_t dcp_local_index(int64_t x, int32_t world, int32_t interleave);
// docs/design/cp.md §2.2: base = floor(L/(W*I))*I, rem = L - base*W, local_len = base + clamp(rem - r*I, 0, I).
// Equals #{x < L : owner(x) = r}; non-increasing in r; sums to L over r.
int64_t dcp_local_len(int64_t len, int32_t world, int32_t interleave, int32_t rank);

// The virtual-block form of docs/design/cp.md §2.1 (the scheduler's view, a virtual block
// spans B*W positions): vb = x div (B*W), o = x mod (B*W),
// owner = (o div I) mod W, local_offset = (o div (W*I))*I + (o mod I), and the
// slot on the owner is block_table[vb]*B + local_offset. Needs B % I == 0, which
// is what makes it agree with the local form.
struct DcpVirtualPosition {
  int64_t virtual_block = 0;
  int32_t owner = 0;
  int32_t local_offset = 0;
};
DcpVirtualPosition dcp_virtual_position(int64_t x, int32_t block_size, int32_t world, int32_t interleave);

// get_dcp_local_seq_lens: out is row-major [N, W], out[i*W + k] = local_len(seq_lens[i], k).
// (A 2-D input [a, b] is the same call on its a*b entries, giving [a, b, W].)
void dcp_local_seq_lens(CSpan<int32_t> seq_lens, int32_t world, int32_t interleave, Span<int32_t> out);
// One rank's column: out[i] = local_len(seq_lens[i], shard.rank).
void dcp_local_seq_lens_of_rank(CSpan<int32_t> seq_lens, const DcpShard& shard, Span<int32_t> out);

// num_computed_tokens_of_dcp (docs/design/cp.md §3.1), row-major [N, W], for a batch ordered
// decodes first: decode rows count this step's tokens too (their KV is written
// before attention, ctx = seq_len), prefill rows only the cached context
// (ctx = seq_len - query_len). seq_lens = context + new tokens per request.
void dcp_context_lens(CSpan<int32_t> query_start_loc, CSpan<int32_t> seq_lens, int32_t num_decodes,
                      int32_t world, int32_t interleave, Span<int32_t> out);

// The local slot mapping of a step on one rank (docs/design/cp.md §2.1): token t of request b
// at position pos (as in plan::compute_slot_mapping) gets, when owner(pos) ==
// shard.rank, slot = block_table[b][li / B] * B + li % B with li =
// local_index(pos); every other token gets kPadSlot (-1): the rank computes K/V
// for all tokens but writes only those it owns. Entries [qsl[B], size) get
// kPadSlot. Returns the number of tokens this rank writes.
//
// The local form needs no relation between B and I, so it also serves a kernel
// block size Bk < B: pass Bk and the table of logical ids phys*(B/Bk)+j, which
// gives the same slot (docs/design/cp.md §2.1). Checks are those of compute_slot_mapping,
// with the block-table columns that *any* rank of the group references
// (ceil(seq_len / (B*W)) columns suffice when B % I == 0), and world <=
// kMaxCpMergePartitions (16, cp_groups.h: a KV shard never spans more ranks;
// the column check walks every rank).
int32_t compute_dcp_slot_mapping(const SlotMappingInputs& in, const DcpShard& shard, Span<int32_t> slots_out);

// Every block id a paged kernel reads under the (world, interleave) sharding:
// rank 0 holds the most tokens of each request, local_len(seq_len, W, I, 0),
// so each row needs ceil(that / block_size) columns, all of them block ids in
// [0, num_blocks). compute_dcp_slot_mapping checks only the columns written
// this step; this covers the cached context too, the same on every rank.
// Used by the DCP and the sharded PCP step plans.
void check_dcp_block_table(const SlotMappingInputs& in, int32_t world, int32_t interleave);

// The causal mask of a multi-token (speculative) decode under DCP (docs/design/cp.md §3.3,
// docs/design/mla.md §6.1), bool as uint8, 1 = masked, row-major [num_reqs, max_query_len,
// max_kv_len]. For request b with n = query_lens[b] new tokens, L = seq_lens[b],
// h = L - n and k_len = local_len(L, r): query j < n at global position p = h + j
// may see local key k iff k <= upper_j = local_len(p + 1, r) - 1, the last local
// key at or before p. So masked[b][j][k] = (j < n) && (k < k_len) && (k > upper_j).
// Every other entry is 0 (the kernel never reads past k_len or n); the function
// writes all num_reqs * max_query_len * max_kv_len entries, so no prior zeroing
// is needed.
//
// Quirk (docs/design/cp.md §3.3): upstream leaves a row with upper_j = -1 (this rank
// holds no key at or before p, but k_len > 0, e.g. I=1, W=4, h=1, rank 3)
// fully *unmasked*, so the query attends to this rank's future keys. We mask the
// whole row (the partial then has LSE -inf and drops out of the merge);
// reproduce_upstream_unmasked_rows = true restores the upstream rows for parity
// tests only.
struct DcpMtpMaskInputs {
  CSpan<int32_t> seq_lens;    // L per decode request (history + new tokens)
  CSpan<int32_t> query_lens;  // n per decode request, 0 <= n <= max_query_len, n <= L
  DcpShard shard;
  int32_t max_query_len = 0;  // mask dim 1 (decode_threshold)
  int32_t max_kv_len = 0;     // mask dim 2 (max_model_len); >= local_len(L, 0) for every request
  bool reproduce_upstream_unmasked_rows = false;
};
void build_dcp_mtp_mask(const DcpMtpMaskInputs& in, Span<uint8_t> mask_out);

// chunk_seq_mask_filtered_indices (docs/design/cp.md §3.4): the prefill-local token indices of
// the prefill requests with cached context (global context_lens[i] > 0), in
// order; for q = [2,1,3] and context [5,0,9]: [0,1,3,4,5]. These are the rows
// whose context partial exists, so the chunk merge never sees an all -inf row.
// Returns the count; out needs room for sum(query_lens) entries.
int32_t chunked_context_token_indices(CSpan<int32_t> query_lens, CSpan<int32_t> context_lens, Span<int32_t> out);

}  // namespace aar::plan
