// Length conventions. Names carry the convention:
//   *_start_loc : exclusive prefix sums with a leading 0   ([0,2,5,9])
//   *_ends      : cumulative ends, no leading 0            ([2,5,9])
//   *_lens      : per-request lengths                       ([2,3,4])
//
// Thread safety: functions without shared state over caller buffers: any number of
// threads at once, each with its own output buffers.
#pragma once

#include <cstdint>

#include "ascend_attn_rt/plan/span.h"

namespace aar::plan {

// Checks qsl[0] == 0 and non-decreasing; names `arg` in the error.
void validate_start_loc(CSpan<int32_t> start_loc, const char* arg);

// ends[i] = start_loc[i+1]; ends.size() == start_loc.size()-1.
void start_loc_to_ends(CSpan<int32_t> start_loc, Span<int64_t> ends_out);
// lens[i] = start_loc[i+1]-start_loc[i].
void start_loc_to_lens(CSpan<int32_t> start_loc, Span<int32_t> lens_out);
// ends[i] = sum(lens[0..i]); validates lens >= 0.
void lens_to_ends(CSpan<int32_t> lens, Span<int64_t> ends_out);

// FIA batch padding (docs/design/gqa.md §2.5).
struct FiaPadding {
  int32_t num_reqs = 0;        // B_fia: requests the kernel sees (incl. dummy)
  int32_t num_tokens = 0;      // T the kernel sees == last cumulative query end
  bool added_dummy = false;
};

// Given the real batch (query_start_loc of B+1 entries, seq_lens of B) and the
// padded token count T_pad >= qsl[B], writes
//   q_ends_out[0..B_fia)   cumulative query ends (int64, as the kernel takes them)
//   kv_lens_out[0..B_fia)  per-request KV lengths (int64); dummy requests get
//                          `dummy_kv_len` (1 by default, as upstream pads)
// When T_pad > qsl[B], one dummy request [qsl[B], T_pad) is appended (docs/design/gqa.md §2.5,
// mixed case); both outputs need room for B+1 entries. Returns the padding.
FiaPadding pad_for_fia(CSpan<int32_t> query_start_loc, CSpan<int32_t> seq_lens, int32_t padded_tokens,
                       Span<int64_t> q_ends_out, Span<int64_t> kv_lens_out, int32_t dummy_kv_len = 1);

}  // namespace aar::plan
