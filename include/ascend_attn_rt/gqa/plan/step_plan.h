// One step's host planning, composed from the pure functions of the plan layer:
// validation, attention state, decode/prefill split, FIA padding, slot mapping,
// staging of query_start_loc / seq_lens / block table. Writes only into the
// caller-owned buffers; allocates nothing.
//
// Thread safety: functions without shared state over caller buffers: any number of
// threads at once, each with its own output buffers.
#pragma once

#include <cstdint>

#include "ascend_attn_rt/plan/attention_state.h"
#include "ascend_attn_rt/plan/seq_lens.h"
#include "ascend_attn_rt/plan/span.h"
#include "ascend_attn_rt/plan/split.h"
#include "ascend_attn_rt/plan/step_input.h"

namespace aar::plan {

// The step (plan/step_input.h; num_input_tokens beyond qsl[B]: the extra tokens
// get slot -1 and, when FIA padding applies, form one dummy request; attn_state
// absent: derived with select_attention_state from computed = seq_len -
// query_len and scheduled = query_len) and what the GQA plan adds.
struct StepInputs : StepInput {
  int32_t block_size = 128;
  int32_t num_blocks = 0;          // KV-cache blocks, for range checks
  int32_t decode_threshold = 1;
  bool treat_short_extends_as_decodes = true;
  SpecMethod spec_method = SpecMethod::None;
  bool chunked_prefill_enabled = true;
  // Pad the batch with a dummy request for the fused kernel when
  // num_input_tokens > qsl[B] (docs/design/gqa.md §2.5). When false, the padded tokens are
  // simply not attended (the kernel sees qsl[B] tokens).
  bool pad_fia_batch = true;
  // Uniform decode padding (docs/design/gqa.md §2.5, uniform case): when > 0 and every real
  // request has exactly this many query tokens and the padding is a multiple of
  // it, the padding becomes (num_input_tokens - qsl[B]) / uniform_decode_len
  // dummy requests of that length (KV length = that length, block 0), instead of
  // one dummy. Graph buckets for paged attention / BNSD decode need this: they
  // take one row per request. Buffers then need room for num_input_tokens
  // requests.
  int32_t uniform_decode_len = 0;
};

struct StepBuffers {
  Span<int32_t> query_start_loc;  // >= B+2
  Span<int32_t> seq_lens;         // >= B+1 (per-request KV lengths, int32 for PA)
  Span<int32_t> slot_mapping;     // >= num_input_tokens
  Span<int32_t> block_table;      // >= (B+1) * stride
  int32_t block_table_stride = 0; // columns of the staged table (>= input stride)
  Span<int64_t> q_ends;           // >= B+1, cumulative query ends for the kernels
  Span<int64_t> kv_lens;          // >= B+1, per-request KV lengths for the kernels
};

struct StepPlan {
  AttentionState state = AttentionState::ChunkedPrefill;
  SplitResult split;
  FiaPadding fia;              // num_reqs (B_fia) / num_tokens (kernel T)
  int32_t num_reqs = 0;        // real requests B
  int32_t num_actual_tokens = 0;
  int32_t num_input_tokens = 0;
  int32_t max_query_len = 0;
  int32_t max_seq_len = 0;
  // 1 + the index of the last request with cached context (seq_len >
  // query_len); 0 when every request is new.
  int32_t context_end = 0;
};

// Validates everything first (errors name the argument and value), then writes.
// If inputs.block_table.data() == buffers.block_table.data() the table is taken
// as already staged (zero copy) and only the dummy row is written.
StepPlan build_step(const StepInputs& in, const StepBuffers& buf);

}  // namespace aar::plan
