// Flat KV-cache slot of every scheduled token (docs/design/gqa.md §2.4).
//
// Thread safety: functions without shared state over caller buffers: any number of
// threads at once, each with its own output buffers.
#pragma once

#include <cstdint>

#include "ascend_attn_rt/plan/span.h"

namespace aar::plan {

inline constexpr int32_t kPadSlot = -1;

struct SlotMappingInputs {
  CSpan<int32_t> query_start_loc;      // B+1 exclusive prefix sums
  CSpan<int32_t> seq_lens;             // B, context + new tokens per request
  CSpan<int32_t> block_table;          // row-major, B rows of `block_table_stride`
  int32_t block_table_stride = 0;      // columns per row (max blocks per request)
  int32_t block_size = 0;
  int32_t num_blocks = 0;              // cache size, for range checks
};

// Token t of request r (t in [qsl[r], qsl[r+1])) sits at absolute position
// pos = seq_lens[r] - (qsl[r+1]-qsl[r]) + (t - qsl[r]) and gets
// slot = block_table[r][pos / bs] * bs + pos % bs. Entries
// [qsl[B], slots_out.size()) are filled with kPadSlot (-1).
// Validates before writing anything: monotonic qsl, seq_len >= query_len,
// pos / bs < stride, 0 <= block id < num_blocks, slots_out large enough.
void compute_slot_mapping(const SlotMappingInputs& in, Span<int32_t> slots_out);

}  // namespace aar::plan
