// The step vocabulary every builder shares (docs/design/core.md §1, §2): what the
// scheduler hands the runtime for one step, and the counts every metadata
// reports. Torch-free, so the plan functions take it too: a builder's inputs
// and a plan function's inputs both extend StepInput, and a build passes the
// caller's step to the plan without copying it field by field.
//
// Lengths carry their convention in their name: query_start_loc holds
// cumulative query ends with a leading 0 ([0, 2, 5, 9]); seq_lens per-request
// KV lengths ([2, 3, 4]).
#pragma once

#include <cstdint>
#include <optional>

#include "ascend_attn_rt/plan/attention_state.h"
#include "ascend_attn_rt/plan/span.h"

namespace aar::plan {

struct StepInput {
  CSpan<int32_t> query_start_loc;  // B+1: cumulative query ends, leading 0
  CSpan<int32_t> seq_lens;         // B: per-request KV lengths (context + new tokens)
  CSpan<int32_t> block_table;      // B x block_table_stride, row-major, host (the scheduler's block ids)
  int32_t block_table_stride = 0;
  // Tokens the layers receive (>= query_start_loc[B], graph padding included);
  // 0 = query_start_loc[B].
  int32_t num_input_tokens = 0;
  // Given by the engine, or derived from the lengths when absent.
  std::optional<AttentionState> attn_state;
  CSpan<int32_t> num_spec_tokens;  // optional, B: draft tokens scheduled per request
  CSpan<uint8_t> is_prefilling;    // optional, B: still prefilling its prompt (nonzero = true)
  // Optional, B: each request's identity, for state kept per request across
  // steps (distinct within the batch; never a hash that can collide, see
  // plan/request_keys.h). Read only by the builders that keep such state.
  CSpan<uint64_t> req_ids;
};

// The counts of one step, one meaning each, in every backend's metadata.
struct StepCounts {
  int32_t num_reqs = 0;           // real (scheduled) requests B
  int32_t num_kernel_reqs = 0;    // requests the kernels see: B + graph-padding dummies (>= num_reqs)
  int32_t num_actual_tokens = 0;  // real tokens: query_start_loc[B]
  int32_t num_input_tokens = 0;   // tokens the layers receive (>= num_actual_tokens)
  int32_t num_decodes = 0;        // leading requests of at most decode_threshold tokens
  int32_t num_decode_tokens = 0;
  int32_t num_prefills = 0;       // the rest
  int32_t num_prefill_tokens = 0;
  int32_t max_query_len = 0;
  int32_t max_seq_len = 0;
};

}  // namespace aar::plan
