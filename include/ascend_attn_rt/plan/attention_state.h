// Attention state of a batch (docs/design/gqa.md §2.1).
//
// Thread safety: functions without shared state over caller buffers: any number of
// threads at once, each with its own output buffers.
#pragma once

#include <cstdint>

#include "ascend_attn_rt/plan/span.h"

namespace aar::plan {

enum class AttentionState : int32_t {
  PrefillNoCache = 0,
  PrefillCacheHit = 1,
  DecodeOnly = 2,
  ChunkedPrefill = 3,
  SpecDecoding = 4,
};

const char* to_string(AttentionState s);

enum class SpecMethod : int32_t { None = 0, Mtp = 1, Other = 2 };

struct StateInputs {
  // Per scheduled request: tokens already in the cache.
  CSpan<int32_t> num_computed_tokens;
  // Per scheduled request: tokens scheduled this step, including draft tokens.
  CSpan<int32_t> num_scheduled_tokens;
  // Per scheduled request: draft (speculative) tokens among the scheduled ones.
  // Empty span = no speculative tokens scheduled this step.
  CSpan<int32_t> num_spec_tokens;
  SpecMethod spec_method = SpecMethod::None;  // None = no speculative config
  bool chunked_prefill_enabled = true;
};

// Model runner v1 rule (docs/design/gqa.md §2.1), including the post-rule that rewrites
// SpecDecoding to ChunkedPrefill when the speculative method is not MTP.
// An empty batch is DecodeOnly (nothing to attend). Throws InvalidArgument on
// mismatched lengths or negative counts.
AttentionState select_attention_state(const StateInputs& in);

}  // namespace aar::plan
