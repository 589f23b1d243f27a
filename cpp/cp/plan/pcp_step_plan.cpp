// GQA PCP per-step host pieces (docs/design/cp.md §6, §6.3, §6.5).
#include "ascend_attn_rt/cp/plan/pcp_step_plan.h"

#include <algorithm>

#include "ascend_attn_rt/errors.h"
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
