// Per-step SFA metadata (spec sparse.md 2.2): what the lightning indexer, the
// sparse flash attention and the cache writes of every SFA layer (and of the
// indexer cache group, spec 4) read. Owned by the MetadataBuilder that produced
// it and valid until that builder's next build of the same kind (a main build,
// or a draft build of the same draft index: build_stamp.h): the tensors are
// views of the builder's persistent packed device buffer, the lists point into
// builder storage.
//
// Length conventions (spec 11.1): cum_query_lens are cumulative query ENDS (no
// leading 0: the kernels' actual_seq_lengths_query), seq_lens per-request KV
// LENGTHS (actual_seq_lengths_key); both int32 with num_kernel_reqs entries.
// query_start_loc is the B+1 exclusive prefix sum.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>

#include <cstdint>

#include "ascend_attn_rt/build_stamp.h"
#include "ascend_attn_rt/plan/attention_state.h"

namespace aar::sfa {

struct Metadata {
  plan::AttentionState attn_state = plan::AttentionState::ChunkedPrefill;
  int32_t num_reqs = 0;            // real requests B
  int32_t num_kernel_reqs = 0;     // B_k = B + graph padding dummies
  int32_t num_actual_tokens = 0;   // real tokens
  int32_t num_input_tokens = 0;    // tokens the layers receive (>= num_actual_tokens)
  int32_t num_decodes = 0, num_decode_tokens = 0, num_prefills = 0;  // informational (split rule)
  int32_t max_query_len = 0, max_seq_len = 0;
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
  BuildStamp stamp;
};

}  // namespace aar::sfa
