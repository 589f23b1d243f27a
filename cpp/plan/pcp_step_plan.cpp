// GQA PCP per-step host pieces (spec cp.md 1.3, 1.4, 3.6).
#include "ascend_attn_rt/plan/pcp_step_plan.h"

#include <algorithm>

#include "ascend_attn_rt/errors.h"
#include "ascend_attn_rt/plan/dcp_layout.h"
#include "ascend_attn_rt/plan/seq_lens.h"

namespace aar::plan {

int32_t pcp_split_flags(CSpan<int32_t> qsl, CSpan<uint8_t> is_prefilling, Span<uint8_t> flags_out) {
  AAR_CHECK_ARG(!qsl.empty(), "query_start_loc must have at least one entry");
  const std::size_t n = qsl.size() - 1;
  validate_start_loc(qsl, "query_start_loc");
  AAR_CHECK_ARG(is_prefilling.empty() || is_prefilling.size() == n, "is_prefilling has ", is_prefilling.size(),
                " entries, expected ", n, " (one per request)");
  AAR_CHECK_ARG(flags_out.size() >= n, "flags_out has room for ", flags_out.size(), " entries, needs ", n);
  std::size_t first = n;
  for (std::size_t i = 0; i < n && first == n; ++i) {
    const bool prefilling = !is_prefilling.empty() && is_prefilling[i] != 0;
    if (qsl[i + 1] - qsl[i] > 1 || prefilling) first = i;
  }
  for (std::size_t i = 0; i < n; ++i) flags_out[i] = i >= first ? 1 : 0;
  return static_cast<int32_t>(first);
}

void check_sharded_block_table(const SlotMappingInputs& in, int32_t kv_world, int32_t interleave) {
  AAR_CHECK_ARG(kv_world >= 1, "kv_world=", kv_world, " must be >= 1");
  AAR_CHECK_ARG(interleave >= 1, "interleave=", interleave, " must be >= 1");
  AAR_CHECK_ARG(in.block_size > 0, "block_size=", in.block_size, " must be positive");
  const std::size_t n = in.seq_lens.size();
  const std::size_t stride = static_cast<std::size_t>(std::max(in.block_table_stride, 0));
  AAR_CHECK_ARG(in.block_table_stride >= 0 && in.block_table.size() >= n * stride,
                "block_table has ", in.block_table.size(), " entries, needs ", n, " rows of ", in.block_table_stride);
  for (std::size_t r = 0; r < n; ++r) {
    const int64_t seq = in.seq_lens[r];
    AAR_CHECK_ARG(seq >= 0, "seq_lens[", r, "]=", seq, " is negative");
    const int64_t most = dcp_local_len(seq, kv_world, interleave, 0);
    const int64_t cols = (most + in.block_size - 1) / in.block_size;
    AAR_CHECK_ARG(cols <= in.block_table_stride, "seq_lens[", r, "]=", seq, " needs ", cols,
                  " block-table columns on KV rank 0 of ", kv_world, " (block_size=", in.block_size,
                  ", interleave=", interleave, ") but block_table has ", in.block_table_stride);
    const int32_t* row = in.block_table.data() + r * in.block_table_stride;
    for (int64_t c = 0; c < cols; ++c) {
      AAR_CHECK_ARG(row[c] >= 0 && row[c] < in.num_blocks, "block_table[", r, "][", c, "]=", row[c],
                    " is out of range [0, ", in.num_blocks, ")");
    }
  }
}

int32_t pcp_local_batch(const PcpSegmentInputs& in, int32_t rank, CSpan<int32_t> block_table,
                        int32_t stride, const PcpLocalBatchBuffers& out) {
  const std::size_t n = in.num_computed_tokens.size();
  AAR_CHECK_ARG(stride >= 0 && block_table.size() >= n * static_cast<std::size_t>(stride), "block_table has ",
                block_table.size(), " entries, needs ", n, " rows of ", stride);
  AAR_CHECK_ARG(out.segments.size() >= std::max<std::size_t>(1, 2 * n), "segments scratch has room for ",
                out.segments.size(), ", needs ", std::max<std::size_t>(1, 2 * n));
  // Validates the inputs and the rank; the count is known only after this.
  const int32_t rows = pcp_rank_segments(in, rank, out.segments);
  const std::size_t k = static_cast<std::size_t>(rows);
  AAR_CHECK_ARG(out.query_start_loc.size() >= k + 1 && out.seq_lens.size() >= k && out.is_prefilling.size() >= k &&
                    out.block_table.size() >= k * static_cast<std::size_t>(stride),
                "local batch buffers too small for ", rows, " rows");
  out.query_start_loc[0] = 0;
  for (std::size_t i = 0; i < k; ++i) {
    const PcpSegment& s = out.segments[i];
    out.query_start_loc[i + 1] = s.local_begin + s.num_tokens;
    out.seq_lens[i] = s.start_pos + s.num_tokens;
    out.is_prefilling[i] = n > 0 ? in.is_prefilling[s.req] : 0;
    if (n > 0) {
      std::copy_n(block_table.data() + static_cast<std::size_t>(s.req) * stride, stride,
                  out.block_table.data() + i * stride);
    } else {
      std::fill_n(out.block_table.data() + i * stride, stride, 0);  // the dummy of an empty batch
    }
  }
  return rows;
}

}  // namespace aar::plan
