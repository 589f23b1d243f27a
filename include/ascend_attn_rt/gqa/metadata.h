// Per-step attention metadata (spec gqa.md 3.2). Owned by the MetadataBuilder
// that produced it and valid until that builder's next build: every tensor is a
// view of a persistent buffer and the length lists point into builder storage.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>

#include <cstdint>
#include <optional>

#include "ascend_attn_rt/plan/attention_state.h"

namespace aar::gqa {

struct Metadata {
  plan::AttentionState attn_state = plan::AttentionState::ChunkedPrefill;
  int32_t num_reqs = 0;            // B_fia: requests the kernels see (incl. a dummy)
  int32_t num_real_reqs = 0;       // B: scheduled requests
  int32_t num_actual_tokens = 0;   // unpadded scheduled tokens (written to the cache)
  int32_t num_input_tokens = 0;    // tokens the layers receive (>= num_actual_tokens)
  int32_t num_kernel_tokens = 0;   // actual_seq_lengths_q.back(): query rows attended
  int32_t num_decodes = 0;
  int32_t num_prefills = 0;
  int32_t num_decode_tokens = 0;
  int32_t max_query_len = 0;
  int32_t max_seq_len = 0;
  int32_t block_size = 0;
  int32_t num_blocks = 0;          // KV-cache blocks the slots and block ids were checked against
  bool causal = true;
  bool is_pooling = false;

  at::Tensor query_start_loc;  // device int32 (num_reqs + 1)
  at::Tensor seq_lens;         // host int32 (num_reqs): per-request KV lengths
  at::Tensor block_tables;     // device int32 (num_reqs, max_blocks_per_req)
  at::Tensor slot_mapping;     // device int32 (num_input_tokens), -1 past num_actual_tokens
  std::optional<at::Tensor> attn_mask;  // device; None for non-causal

  c10::IntArrayRef actual_seq_lengths_q;  // cumulative query ends (num_reqs)
  c10::IntArrayRef seq_lens_list;         // per-request KV lengths (num_reqs)
};

}  // namespace aar::gqa
