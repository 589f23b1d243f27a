// Per-step SFA metadata (docs/design/sfa.md §3.1): what the lightning indexer, the
// sparse flash attention and the cache writes of every SFA layer (and of the
// indexer cache group, docs/design/sfa.md §2.3) read. Owned by the MetadataBuilder that produced
// it and valid until that builder's next build of the same kind (a main build,
// or a draft build of the same draft index: build_stamp.h): the tensors are
// views of the builder's persistent packed device buffer, the lists point into
// builder storage.
//
// Length conventions (docs/design/sparse.md §1): cum_query_lens are cumulative query ENDS (no
// leading 0: the kernels' actual_seq_lengths_query), seq_lens per-request KV
// LENGTHS (actual_seq_lengths_key); both int32 with num_kernel_reqs entries.
// query_start_loc is the B+1 exclusive prefix sum.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>

#include <cstdint>

#include "ascend_attn_rt/build_stamp.h"
#include "ascend_attn_rt/core/step.h"
#include "ascend_attn_rt/plan/attention_state.h"
#include "ascend_attn_rt/plan/span.h"

namespace aar::sfa {

// What the KV-offload builder adds (docs/design/sfa.md §3.1's req_ids_tensor / token_to_req,
// docs/design/sfa.md §6's split and rebased prefill lengths). `enabled` is false for a plain
// SFA builder's metadata (every other member empty).
struct OffloadMetadata {
  bool enabled = false;
  bool decode_consumer = false;         // the split's treat_short_extends_as_decodes
  at::Tensor req_ids;                   // device int64 (B): the request ids (bit patterns of the uint64 ids)
  at::Tensor token_to_req;              // device int32 (num_input_tokens): request of each token, -1 past the real ones
  at::Tensor prefill_cum_query_lens;    // device int32 (num_prefills): query ends of the prefills, rebased to 0
  at::Tensor prefill_seq_lens;          // device int32 (num_prefills): seq_lens[num_decodes:] (a view)
  at::Tensor prefill_block_table;       // device int32 (num_prefills, max_blocks_per_req): rows [num_decodes, B)
  at::Tensor slot_mapping_host;         // host int64 (num_actual_tokens): the commit's destination rows
  plan::CSpan<uint64_t> req_ids_host;   // (B)
  plan::CSpan<int32_t> token_to_req_host;  // (num_input_tokens)
  plan::CSpan<int32_t> block_table_host;   // (B x block_table_stride), row-major
  int32_t block_table_stride = 0;
  // Per decode token (num_decode_tokens): its request's id, seq_len (the top-k
  // mask threshold) and stable prefix max(S - q, 0) (the LRU's invalidation bound).
  plan::CSpan<uint64_t> decode_req_ids;
  plan::CSpan<int32_t> decode_seq_lens;
  plan::CSpan<int32_t> decode_stable_prefix;
};

// Decode context parallel with the replicated indexer (docs/design/sparse_cp.md §2, §5):
// world_size 1 (every tensor empty) without DCP. Under DCP the Metadata's block_table,
// slot_mapping and seq_lens are the main cache's (this rank's local blocks and slots, the
// GLOBAL lengths the indexer reads), and these are what the other kernels read.
struct DcpMetadata {
  int32_t world_size = 1;
  int32_t rank = 0;
  int32_t interleave = 1;
  at::Tensor seq_lens;              // device int32 (B_k): this rank's local KV lengths (sparse attention)
  at::Tensor indexer_block_table;   // device int32 (B_k, max_blocks_per_req * W): the replicated view
  at::Tensor indexer_slot_mapping;  // device int64 (num_input_tokens): the indexer cache's slots
  c10::IntArrayRef seq_lens_list;   // host copy of seq_lens
};

// DSA-CP token sharding (docs/design/sparse_cp.md §4, §7): world_size 1 (every tensor empty)
// without it. This rank computes every head for the tokens [local_start, local_start +
// tokens_per_rank) of the step padded to num_tokens_pad; the Metadata's other fields stay the
// whole step's (the cache writes of every token, the global lengths).
struct DsaCpMetadata {
  int32_t world_size = 1;
  int32_t rank = 0;
  int32_t num_tokens_pad = 0;    // T_pad = roundup(num_input_tokens, world_size)
  int32_t tokens_per_rank = 0;   // tpr = T_pad / world_size
  int32_t local_start = 0;       // rank * tpr
  int32_t local_end = 0;         // the end of this rank's real tokens (>= local_start)
  at::Tensor cum_query_lens;     // device int32 (B_k): this rank's cumulative query ends
  at::Tensor seq_lens;           // device int32 (B_k): the KV length this rank's last query of each request sees
  at::Tensor cos, sin;           // device (tpr, R): this rank's tokens' RoPE rows (position 0 in the padding)
  c10::IntArrayRef cum_query_lens_list, seq_lens_list;
};

// Prefill context parallel (docs/design/sparse_cp.md §11): world_size 1 (every tensor empty) without
// it. The Metadata's other fields are the GLOBAL step's, planned as under DCP with the main cache
// sharded over the W = Wp * Wd PCP x DCP ranks (dcp.world_size = W, dcp.rank = rp * Wd + rd: local
// slots, local lengths, the replicated indexer views); this rank computes its num_local_tokens rows
// (hidden_states / output). A decode-only step (num_prefills 0; §11.2) has the step's tokens as its rows and
// its layer reads the Metadata's lists: gather_index and the gathered_* lists are empty then.
struct PcpMetadata {
  int32_t world_size = 1;
  int32_t rank = 0;
  int32_t dcp_world_size = 1;       // Wd: the DCP group's part of the shard (PCP x DCP)
  int32_t dcp_rank = 0;
  int32_t num_local_tokens = 0;     // T_loc: the decode tokens, then every prefill's head and tail chunk
  int32_t num_indexer_reqs = 0;
  at::Tensor cos, sin;              // device (T_loc, R): the local rows' RoPE rows
  at::Tensor gather_index;          // device int64 (num_actual_tokens): each global token's row in the
                                    // rank-major all-gather of the ranks' local rows (Wp * T_loc)
  at::Tensor indexer_cum_query_lens;  // device int32 (num_indexer_reqs): the indexer's requests over the local rows
  at::Tensor indexer_seq_lens;        // device int32 (num_indexer_reqs)
  at::Tensor indexer_block_table;     // device int32 (num_indexer_reqs, max_blocks_per_req * Wp): replicated rows
  at::Tensor gathered_cum_query_lens; // device int32 (Wp * B): the gathered rows grouped by (rank, request)
  at::Tensor gathered_seq_lens;       // device int32 (Wp * B): this rank's local KV length of each group's request
  at::Tensor gathered_block_table;    // device int32 (Wp * B, max_blocks_per_req): the request's local row
  c10::IntArrayRef local_token_index_list;  // host (T_loc): the global token of each row, -1 for a pad
  c10::IntArrayRef indexer_cum_query_lens_list, indexer_seq_lens_list;
};

// The step's counts (core::StepCounts: num_reqs the real requests B,
// num_kernel_reqs B_k = B + graph padding dummies; the split counts are the
// split rule on the batch as given: informational for plain SFA, the offload
// path's routing (leading decodes -> resident path)) and the SFA metadata.
struct Metadata : core::StepCounts {
  plan::AttentionState attn_state = plan::AttentionState::ChunkedPrefill;
  int32_t block_size = 0, num_blocks = 0;
  bool speculative = false;        // the builder has a speculative config (num_speculative_tokens > 0)
  int32_t draft_index = -1;        // -1: a main build; d: build_for_drafting(..., d)
  at::Tensor cum_query_lens;   // device int32 (B_k): cumulative query ends  (actual_seq_lengths_query)
  at::Tensor seq_lens;         // device int32 (B_k): per-request KV lengths (actual_seq_lengths_key)
  at::Tensor block_table;      // device int32 (B_k, max_blocks_per_req); dummy rows are zeros
  at::Tensor slot_mapping;     // device int64 (num_input_tokens), -1 past num_actual_tokens
  at::Tensor cos, sin;         // device (num_input_tokens, R) in the tables' dtype (MLA half layout);
                               // rows past num_actual_tokens are position 0's
  at::Tensor query_start_loc;  // device int32 (B + 1)
  c10::IntArrayRef seq_lens_list;  // host copies of the two length lists (B_k), for tests/tracing
  c10::IntArrayRef cum_query_lens_list;
  OffloadMetadata offload;     // BuilderConfig::offload only
  DcpMetadata dcp;             // BuilderConfig::dcp_world_size > 1 only
  DsaCpMetadata dsa_cp;        // BuilderConfig::dsa_cp_world_size > 1 only
  PcpMetadata pcp;             // BuilderConfig::pcp_world_size > 1 only
  BuildStamp stamp;
};

}  // namespace aar::sfa
