// Private helpers shared by the plan-layer translation units. Not installed and
// not part of the public contract: the public functions split into a validating
// half and an unchecked writing half, so build_step can validate the whole step
// once and then write without re-checking (and without allocating).
#pragma once

#include <cstddef>
#include <optional>
#include <cstdint>

#include "ascend_attn_rt/plan/attention_state.h"
#include "ascend_attn_rt/plan/seq_lens.h"
#include "ascend_attn_rt/plan/slot_mapping.h"
#include "ascend_attn_rt/plan/span.h"

namespace aar::plan::detail {

// docs/design/gqa.md §2.1 rows 1-5 and the post-rule, from the three per-batch flags
// (all computed == 0, all scheduled == 1, all scheduled - spec == 1).
inline AttentionState state_from_flags(bool empty, bool all_fresh, bool all_sched_one, bool all_valid_one,
                                       SpecMethod method, bool chunked_prefill_enabled) {
  if (empty) return AttentionState::DecodeOnly;
  AttentionState st;
  if (all_fresh) {
    st = AttentionState::PrefillNoCache;
  } else if (all_sched_one) {
    st = method == SpecMethod::Mtp ? AttentionState::SpecDecoding : AttentionState::DecodeOnly;
  } else if (all_valid_one) {
    st = method != SpecMethod::None ? AttentionState::SpecDecoding : AttentionState::ChunkedPrefill;
  } else if (chunked_prefill_enabled) {
    st = AttentionState::ChunkedPrefill;
  } else {
    st = AttentionState::PrefillCacheHit;
  }
  // Post-rule: only MTP keeps SpecDecoding in the metadata.
  if (st == AttentionState::SpecDecoding && method != SpecMethod::Mtp) st = AttentionState::ChunkedPrefill;
  return st;
}

// An engine-given state is taken as given, except PrefillNoCache on a batch with cached
// tokens: that state attends over the new tokens alone (no cache read), so it would
// silently drop the context (docs/design/gqa.md §2.1). Throws naming the first request
// with cached tokens.
[[noreturn]] void refuse_prefill_no_cache(CSpan<int32_t> query_start_loc, CSpan<int32_t> seq_lens);
inline AttentionState resolve_state(const std::optional<AttentionState>& given, bool empty, bool all_fresh,
                                    bool all_sched_one, bool all_valid_one, SpecMethod method,
                                    bool chunked_prefill_enabled, CSpan<int32_t> query_start_loc,
                                    CSpan<int32_t> seq_lens) {
  if (!given.has_value()) {
    return state_from_flags(empty, all_fresh, all_sched_one, all_valid_one, method, chunked_prefill_enabled);
  }
  if (*given == AttentionState::PrefillNoCache && !all_fresh) refuse_prefill_no_cache(query_start_loc, seq_lens);
  return *given;
}

void validate_spec_method(SpecMethod m);

// The batch-level checks every step planner makes before its per-request pass
// (plan::build_step, plan::plan_mla_step): query_start_loc against seq_lens,
// num_input_tokens, block size / stride / cache size, decode threshold, the
// optional per-request spans, spec method and state. Returns qsl[B] and the
// token count the layers see.
struct StepTokens {
  int32_t real = 0;   // query_start_loc[B]
  int32_t input = 0;  // num_input_tokens, or real when 0
};
StepTokens check_step_batch(CSpan<int32_t> query_start_loc, std::size_t num_reqs, int32_t num_input_tokens,
                            int32_t block_size, int32_t block_table_stride, int32_t num_blocks,
                            int32_t decode_threshold, std::size_t num_spec_tokens, SpecMethod spec_method,
                            const std::optional<AttentionState>& state);
// The same for a planner's inputs (plan::StepInputs, SfaStepInputs, MlaStepInputs, ...): the
// one call every planner makes, with its fields in the same places.
template <typename In>
StepTokens check_step_batch(const In& in) {
  return check_step_batch(in.query_start_loc, in.seq_lens.size(), in.num_input_tokens, in.block_size,
                          in.block_table_stride, in.num_blocks, in.decode_threshold, in.num_spec_tokens.size(),
                          in.spec_method, in.attn_state);
}

// The sizes compute_slot_mapping checks (batch, block geometry, table and
// output capacity), before its per-request block-range checks; shared with the
// DCP slot mapping, whose per-request column rule differs.
void validate_slot_mapping_sizes(const SlotMappingInputs& in, std::size_t slots_capacity);
// Everything compute_slot_mapping checks, with the output capacity given.
void validate_slot_mapping(const SlotMappingInputs& in, std::size_t slots_capacity);
// Unchecked: slots of the real tokens, then kPadSlot up to slots_out.size().
void write_slot_mapping(const SlotMappingInputs& in, Span<int32_t> slots_out);

// Unchecked half of pad_for_fia (inputs validated by the caller).
FiaPadding write_fia_padding(CSpan<int32_t> query_start_loc, CSpan<int32_t> seq_lens, int32_t padded_tokens,
                             Span<int64_t> q_ends_out, Span<int64_t> kv_lens_out, int32_t dummy_kv_len);

}  // namespace aar::plan::detail
