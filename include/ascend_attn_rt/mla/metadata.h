// Per-step MLA metadata (docs/design/mla.md §2). Owned by the MetadataBuilder
// that produced it and valid until its next build: tensors are views of
// persistent buffers, length lists point into builder storage; `stamp`
// identifies the build (build_stamp.h).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>

#include <cstdint>
#include <vector>

#include "ascend_attn_rt/build_stamp.h"
#include "ascend_attn_rt/core/step.h"
#include "ascend_attn_rt/plan/attention_state.h"

namespace aar::mla {

// Context of the prefills with cached tokens, in chunks (docs/design/mla.md §2.2 / §3.4).
struct ChunkedContext {
  int32_t num_chunks = 0;
  int32_t chunk_size = 0;
  at::Tensor cu_seq_lens;     // device int32 (C, NP+1), exclusive prefix sums
  at::Tensor starts;          // device int32 (C, NP), token offset of the chunk in each context
  at::Tensor chunk_seq_lens;  // device int32 (C, NP), per-request tokens in chunk c
  c10::IntArrayRef seq_tot;       // C: gathered tokens per chunk
  c10::IntArrayRef max_seq_lens;  // C
  std::vector<c10::IntArrayRef> kv_ends;  // C x NP cumulative chunk_seq_lens (FIA actual_seq_lengths_kv)
  // DCP or PCP (docs/design/mla.md §6.1 / §6.3, over all Wp * Wd KV ranks with PCP; undefined /
  // empty without): the global fields above
  // stay global, `starts` holds the local starts c * local_chunk_size.
  int32_t local_chunk_size = 0;
  at::Tensor padded_chunk_seq_lens;  // device int32 (C, NP): local tokens every rank gathers per request
  c10::IntArrayRef local_seq_tot;    // C: rows each rank gathers in chunk c (sum of the padded lengths)
  // device int64: the rows of chunk c's all-gathered (W * local_seq_tot[c])
  // buffer holding real tokens, request by request, at [reorg_offsets[c], reorg_offsets[c+1]).
  at::Tensor reorg_index;
  c10::IntArrayRef reorg_offsets;    // C + 1
};

// Decode context parallel (docs/design/mla.md §6): this build's shard of the KV cache (with
// PCP, the DCP group's part of it: the shard spans the Wp * Wd ranks, see PcpInfo).
struct DcpInfo {
  int32_t world_size = 1;
  int32_t rank = 0;
  int32_t interleave = 1;
};

// Prefill context parallel (docs/design/cp.md §11; world_size 1: none). The step's counts stay
// the global batch's (the same on every rank, StepCounts); this rank's hidden states / output
// are num_local_tokens rows: the num_decode_tokens decode tokens (every PCP rank computes
// them), then the head and tail chunks of every prefill (num_local_prefill_tokens rows,
// padding rows included; MetadataBuilder::pcp_local_token_index() says which global token each
// row is). The KV is sharded over the Wp * Wd PCP x DCP ranks (rank rp * Wd + rd).
struct PcpInfo {
  int32_t world_size = 1;                // Wp
  int32_t rank = 0;                      // rp
  int32_t num_local_tokens = 0;          // rows of hidden_states / output
  int32_t num_local_prefill_tokens = 0;  // the prefill rows among them (2 c_i per prefill)
  // device int64 (Wp * num_local_tokens): the slots of the padded-global order (-1 for pads,
  // for tokens other KV ranks own and for decode copies but the first: the decode region keeps
  // every Wp-th entry); the layer writes its prefill region after the PCP gather.
  at::Tensor padded_slot_mapping;
  // device int32 (Wp * num_local_prefill_tokens): the restored (padded-global) prefill rows are
  // the PCP all-gather of the ranks' local prefill rows at these indices.
  at::Tensor prefill_restore_idx;
  // device int32, docs/design/cp.md §6.4's lists: local prefill query rows of the head and tail
  // chunks (chunk_tokens each), the restored prefill key rows each attends without a mask
  // (the earlier chunks) and with the causal mask (its own chunk), and q_full_idx
  // (2 chunk_tokens: concat(head, tail)[q_full_idx] is the local order).
  at::Tensor q_head_idx, q_tail_idx, kv_head_nomask_idx, kv_head_mask_idx, kv_tail_nomask_idx, kv_tail_mask_idx,
      q_full_idx;
  // Cumulative per prefill (no leading 0): the chunk lengths c_i (query and causal key lengths),
  // the head's and the tail's unmasked key lengths (rp c_i, (2 Wp - 1 - rp) c_i).
  c10::IntArrayRef mask_seq_ends, head_nomask_kv_ends, tail_nomask_kv_ends;
  int32_t chunk_tokens = 0, head_nomask_tokens = 0, tail_nomask_tokens = 0;
};

struct DecodeMetadata {
  // What the decode kernels see: num_decodes / num_decode_tokens, or, with graph
  // decode padding, the padded bucket (dummy requests with no KV after the real ones).
  int32_t num_kernel_reqs = 0;
  int32_t num_kernel_tokens = 0;
  at::Tensor block_table;                 // device int32 (num_kernel_reqs, max_blocks)
  // per-request KV lengths (FIA actual_seq_kvlen), num_kernel_reqs; under DCP
  // this rank's local lengths (upstream's cp_seq_len)
  c10::IntArrayRef seq_lens_list;
  c10::IntArrayRef actual_seq_lengths_q;  // cumulative decode query ends, num_kernel_reqs
  at::Tensor cos, sin;                    // device (num_kernel_tokens, R)
  int32_t max_seq_len = 0;
};

struct PrefillMetadata {
  at::Tensor block_table;                 // device int32 (num_prefills, max_blocks): rows num_decodes..
  // cumulative prefill query ends, rebased to 0 (PCP: of the local prefill rows, 2 c_i each)
  c10::IntArrayRef actual_seq_lengths_q;
  at::Tensor cos, sin;                    // device (num_prefill_tokens, R) (PCP: num_local_prefill_tokens)
  int32_t max_query_len = 0;              // PCP: the largest local prefill length
  int32_t max_seq_len = 0;
  ChunkedContext chunked;                 // num_chunks == 0: no cached context
};

// The step's counts (core::StepCounts: num_reqs the scheduled requests,
// num_kernel_reqs those plus graph decode padding's dummy requests; the split
// counts are the real decodes and prefills, the padded decode is
// DecodeMetadata::num_kernel_*) and the MLA metadata.
struct Metadata : core::StepCounts {
  plan::AttentionState attn_state = plan::AttentionState::ChunkedPrefill;
  int32_t block_size = 0;
  int32_t num_blocks = 0;
  bool speculative = false;        // the builder has a speculative config (decode layout TND_NTD)
  DcpInfo dcp;                     // world_size 1: no DCP; else slot_mapping holds local slots
  PcpInfo pcp;                     // world_size 1: no PCP
  int32_t draft_step = -1;         // BuildInputs::draft_step of this build (-1: a normal step)

  at::Tensor query_start_loc;  // device int32 (num_reqs + 1)
  // device int64 (num_input_tokens), -1 past num_actual_tokens; PCP: pcp.num_local_tokens
  // entries, the decode rows' own slots and -1 on the prefill rows (written after the gather)
  at::Tensor slot_mapping;
  at::Tensor attn_mask;        // device int8 (2048, 2048), 1 strictly above the diagonal
  DecodeMetadata decode;       // valid when num_decodes > 0
  PrefillMetadata prefill;     // valid when num_prefills > 0
  BuildStamp stamp;            // the build (a stale copy is rejected)
};

}  // namespace aar::mla
