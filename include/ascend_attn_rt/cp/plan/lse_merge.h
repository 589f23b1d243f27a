// Merging attention partials by their log-sum-exp (docs/design/cp.md §7): the maths of
// the DCP/PCP output exchange and of context-chunk merges, over plain
// float/double arrays (the torch op wrapper and npu_attention_update sit on
// top of this in ops/).
//
// A partial i over key set K_i carries, per row (token, head), the normalised
// output O_i [D] and lse_i = ln sum_{j in K_i} exp(s q.k_j) (natural log, scale
// included). For disjoint key sets the union is
//   m = max_i lse_i,   lse = m + ln sum_i exp(lse_i - m),   O = sum_i exp(lse_i - lse) O_i.
//
// Empty partials (docs/design/cp.md §7.3): an lse of -inf marks a partial with no keys (a
// rank without local tokens for that row); +inf and NaN lse are normalised to
// -inf first (upstream FlashAttention-style empty rows). Such a partial
// contributes nothing and its output is never read, so a NaN output there
// cannot leak. A row whose partials are all empty merges to O = 0 and
// lse = -inf, never NaN, so callers need not filter rows (docs/design/cp.md §7.3). Any
// number of partials is accepted (0 gives every row O = 0, lse = -inf); the
// 16-partial limit is npu_attention_update's, checked where that op is called.
//
// The sum runs over the partials in the order given; a different order changes
// only floating-point rounding (the merge is permutation invariant).
//
// Thread safety: functions without shared state over caller buffers: any number of
// threads at once, each with its own output buffers.
#pragma once

#include <cstdint>

#include "ascend_attn_rt/plan/span.h"

namespace aar::plan {

// List form (the npu_attention_update layout): outs[i] is partial i's [rows, D]
// row-major output, lses[i] its [rows] LSE. out gets [rows, D]; lse_out gets
// [rows], or is empty when the merged LSE is not wanted (update_type 0).
// out and lse_out must not overlap any input. Validates every size first.
void merge_attention_partials(CSpan<CSpan<float>> outs, CSpan<CSpan<float>> lses, int64_t rows, int64_t head_dim,
                              Span<float> out, Span<float> lse_out);
void merge_attention_partials(CSpan<CSpan<double>> outs, CSpan<CSpan<double>> lses, int64_t rows,
                              int64_t head_dim, Span<double> out, Span<double> lse_out);

// Stacked form (the _update_out_and_lse layout): outs is [num_parts, rows, D],
// lses [num_parts, rows], both row-major.
void merge_attention_partials_stacked(CSpan<float> outs, CSpan<float> lses, int32_t num_parts, int64_t rows,
                                      int64_t head_dim, Span<float> out, Span<float> lse_out);
void merge_attention_partials_stacked(CSpan<double> outs, CSpan<double> lses, int32_t num_parts, int64_t rows,
                                      int64_t head_dim, Span<double> out, Span<double> lse_out);

}  // namespace aar::plan
