// Decode/prefill split and the decode-first batch reorder (docs/design/gqa.md §2.2, §2.3).
//
// Thread safety: functions without shared state over caller buffers: any number of
// threads at once, each with its own output buffers.
#pragma once

#include <cstdint>

#include "ascend_attn_rt/plan/span.h"

namespace aar::plan {

struct SplitResult {
  int32_t num_decodes = 0;
  int32_t num_prefills = 0;
  int32_t num_decode_tokens = 0;
  int32_t num_prefill_tokens = 0;
  bool operator==(const SplitResult& o) const {
    return num_decodes == o.num_decodes && num_prefills == o.num_prefills &&
           num_decode_tokens == o.num_decode_tokens && num_prefill_tokens == o.num_prefill_tokens;
  }
};

struct SplitInputs {
  // Exclusive prefix sums of query lengths, B+1 entries ("query_start_loc").
  CSpan<int32_t> query_start_loc;
  int32_t num_actual_tokens = 0;  // unpadded scheduled tokens
  int32_t max_query_len = 0;
  int32_t decode_threshold = 1;
  bool require_uniform = false;
  bool treat_short_extends_as_decodes = true;
  // Per request, "still prefilling its prompt" (computed < prompt length).
  // Required (non-empty) when treat_short_extends_as_decodes is false; may be
  // shorter than B (right-padded with false) or longer (truncated).
  CSpan<uint8_t> is_prefilling;
};

// Assumes decode-first order (see reorder_decode_first). Follows docs/design/gqa.md §2.2 step by
// step, fast paths included. Throws InvalidArgument on a non-monotonic
// query_start_loc or when is_prefilling is needed but missing.
SplitResult split_decodes_and_prefills(const SplitInputs& in);

// Region of a request in the decode-first order.
enum class ReorderRegion : int32_t { Decode = 0, ShortExtend = 1, LongExtend = 2, FreshPrefill = 3 };

// Region rule: num_computed == 0 -> FreshPrefill; else scheduled <= threshold ->
// Decode if not prefilling else ShortExtend; else LongExtend.
ReorderRegion classify_request(int32_t num_scheduled, int32_t num_computed, bool is_prefilling,
                               int32_t decode_threshold);

// Computes the decode-first reorder of a persistent batch with the minimal number
// of swaps. Writes `perm_out[i]` = old index of the request that ends at new
// position i (perm_out.size() == B) and the swaps, in order, as pairs
// (swaps_out[2k], swaps_out[2k+1]); swaps_out needs room for 2*B entries.
// Returns the number of swaps. Applying the swaps in order to the identity
// yields perm_out. Requests already in their region never move.
int32_t reorder_decode_first(CSpan<int32_t> num_scheduled, CSpan<int32_t> num_computed,
                             CSpan<uint8_t> is_prefilling, int32_t decode_threshold,
                             Span<int32_t> perm_out, Span<int32_t> swaps_out);

}  // namespace aar::plan
