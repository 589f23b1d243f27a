// Flat KV-cache slot of every scheduled token (docs/design/gqa.md §2.4, no DCP/PCP).
#include "ascend_attn_rt/plan/slot_mapping.h"

#include <cstdint>

#include "ascend_attn_rt/errors.h"
#include "ascend_attn_rt/plan/seq_lens.h"
#include "internal.h"

namespace aar::plan {
namespace detail {

void validate_slot_mapping_sizes(const SlotMappingInputs& in, std::size_t slots_capacity) {
  const std::size_t b = in.seq_lens.size();
  AAR_CHECK_ARG(in.query_start_loc.size() == b + 1, "query_start_loc has ", in.query_start_loc.size(),
                " entries, expected seq_lens.size()+1 = ", b + 1);
  validate_start_loc(in.query_start_loc, "query_start_loc");
  AAR_CHECK_ARG(in.block_size > 0, "block_size=", in.block_size, " must be positive");
  AAR_CHECK_ARG(in.block_table_stride >= 0, "block_table_stride=", in.block_table_stride, " is negative");
  AAR_CHECK_ARG(in.num_blocks >= 0, "num_blocks=", in.num_blocks, " is negative");
  AAR_CHECK_ARG(static_cast<int64_t>(in.num_blocks) * in.block_size <= INT32_MAX, "num_blocks=", in.num_blocks,
                " x block_size=", in.block_size, " exceeds the int32 slot range");
  const std::size_t stride = static_cast<std::size_t>(in.block_table_stride);
  AAR_CHECK_ARG(in.block_table.size() >= b * stride, "block_table has ", in.block_table.size(),
                " entries, fewer than num_reqs*block_table_stride = ", b, "*", stride, " = ", b * stride);
  const int32_t total = in.query_start_loc[b];
  AAR_CHECK_ARG(slots_capacity >= static_cast<std::size_t>(total), "slots_out has room for ", slots_capacity,
                " entries, fewer than query_start_loc[", b, "]=", total);
}

void validate_slot_mapping(const SlotMappingInputs& in, std::size_t slots_capacity) {
  validate_slot_mapping_sizes(in, slots_capacity);
  const std::size_t b = in.seq_lens.size();
  const std::size_t stride = static_cast<std::size_t>(in.block_table_stride);
  const int64_t bs = in.block_size;
  for (std::size_t r = 0; r < b; ++r) {
    const int32_t q = in.query_start_loc[r + 1] - in.query_start_loc[r];
    const int32_t seq = in.seq_lens[r];
    AAR_CHECK_ARG(seq >= q, "seq_lens[", r, "]=", seq, " is smaller than its query length ", q);
    if (q == 0) continue;
    const int64_t first_blk = (static_cast<int64_t>(seq) - q) / bs;
    const int64_t last_blk = (static_cast<int64_t>(seq) - 1) / bs;
    AAR_CHECK_ARG(last_blk < in.block_table_stride, "seq_lens[", r, "]=", seq, " needs block index ", last_blk,
                  " but block_table_stride=", in.block_table_stride, " (block_size=", in.block_size, ")");
    const int32_t* row = in.block_table.data() + r * stride;
    for (int64_t c = first_blk; c <= last_blk; ++c) {
      AAR_CHECK_ARG(row[c] >= 0 && row[c] < in.num_blocks, "block_table[", r, "][", c, "]=", row[c],
                    " is out of range [0, ", in.num_blocks, ")");
    }
  }
}

void write_slot_mapping(const SlotMappingInputs& in, Span<int32_t> slots_out) {
  const std::size_t b = in.seq_lens.size();
  const int32_t bs = in.block_size;
  const std::size_t stride = static_cast<std::size_t>(in.block_table_stride);
  for (std::size_t r = 0; r < b; ++r) {
    const int32_t begin = in.query_start_loc[r];
    const int32_t end = in.query_start_loc[r + 1];
    const int32_t* row = in.block_table.data() + r * stride;
    int32_t pos = in.seq_lens[r] - (end - begin);
    for (int32_t t = begin; t < end; ++t, ++pos) {
      slots_out[t] = row[pos / bs] * bs + pos % bs;
    }
  }
  for (std::size_t t = static_cast<std::size_t>(in.query_start_loc[b]); t < slots_out.size(); ++t) {
    slots_out[t] = kPadSlot;
  }
}

}  // namespace detail

void compute_slot_mapping(const SlotMappingInputs& in, Span<int32_t> slots_out) {
  detail::validate_slot_mapping(in, slots_out.size());
  detail::write_slot_mapping(in, slots_out);
}

}  // namespace aar::plan
