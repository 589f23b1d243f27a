// Model-runner v2 PCP segment partition (docs/design/cp.md §6.2, §6.5).
#include "ascend_attn_rt/cp/plan/pcp_segments.h"

#include <algorithm>
#include <cstdint>

#include "ascend_attn_rt/errors.h"
#include "ascend_attn_rt/plan/seq_lens.h"
#include "ascend_attn_rt/plan/slot_mapping.h"

namespace aar::plan {
namespace {

// More PCP ranks than any deployment; keeps 2 * Wp in int32 and bounds the per-rank passes,
// which run even for an empty batch (fuzz_pcp_segments: 2 * INT32_MAX overflowed).
constexpr int32_t kMaxPcpSize = 1 << 16;

void validate(const PcpSegmentInputs& in) {
  AAR_CHECK_ARG(in.pcp_size >= 1, "pcp_size=", in.pcp_size, " must be >= 1");
  AAR_CHECK_ARG(in.pcp_size <= kMaxPcpSize, "pcp_size=", in.pcp_size, " exceeds ", kMaxPcpSize);
  const std::size_t n = in.num_computed_tokens.size();
  AAR_CHECK_ARG(in.query_start_loc.size() == n + 1, "query_start_loc has ", in.query_start_loc.size(),
                " entries, expected num_computed_tokens.size()+1 = ", n + 1);
  AAR_CHECK_ARG(in.is_prefilling.size() == n, "is_prefilling has ", in.is_prefilling.size(),
                " entries, num_computed_tokens has ", n);
  validate_start_loc(in.query_start_loc, "query_start_loc");
  for (std::size_t i = 0; i < n; ++i) {
    const int64_t c = in.num_computed_tokens[i];
    AAR_CHECK_ARG(c >= 0, "num_computed_tokens[", i, "]=", c, " is negative");
    const int64_t q = in.query_start_loc[i + 1] - in.query_start_loc[i];
    AAR_CHECK_ARG(c + q <= INT32_MAX, "num_computed_tokens[", i, "]=", c, " + query length ", q,
                  " exceeds int32");
  }
}

// Calls fn(segment) for rank's segments in local order (pure prefills last,
// both groups in batch order), without the dummy. Inputs validated.
template <typename Fn>
void for_each_segment(const PcpSegmentInputs& in, int32_t rank, Fn fn) {
  const int32_t chunks = 2 * in.pcp_size;
  int32_t local = 0;
  for (int pass = 0; pass < 2; ++pass) {
    const bool want_pure = pass == 1;
    for (std::size_t i = 0; i < in.num_computed_tokens.size(); ++i) {
      const int32_t begin = in.query_start_loc[i], q = in.query_start_loc[i + 1] - begin;
      if (q == 0) continue;
      const bool split = in.is_prefilling[i] != 0;
      // int64: q may be near INT32_MAX, and q + chunks - 1 or idx * size past it (fuzz_pcp_segments).
      const int64_t size = split ? (int64_t{q} + chunks - 1) / chunks : q;
      const int32_t idx[2] = {split ? rank : 0, chunks - 1 - rank};
      for (int k = 0; k < (split ? 2 : 1); ++k) {
        const int64_t off = idx[k] * size;
        if (off >= q) continue;
        // off < q: offset, len and start (computed + off < computed + q, validated) fit int32.
        const int32_t offset = static_cast<int32_t>(off);
        const int32_t len = static_cast<int32_t>(std::min<int64_t>(size, q - off));
        const int32_t start = in.num_computed_tokens[i] + offset;
        if ((split && start == 0) != want_pure) continue;
        fn(PcpSegment{static_cast<int32_t>(i), begin + offset, len, local, start});
        local += len;
      }
    }
  }
}

int32_t rank_tokens(const PcpSegmentInputs& in, int32_t rank) {
  int32_t total = 0;
  for_each_segment(in, rank, [&](const PcpSegment& s) { total += s.num_tokens; });
  return total;
}

int32_t padded_tokens(const PcpSegmentInputs& in) {
  int32_t p = 0;
  for (int32_t r = 0; r < in.pcp_size; ++r) p = std::max(p, rank_tokens(in, r));
  return p;
}

void check_room(std::size_t have, int64_t need, const char* name) {
  AAR_CHECK_ARG(have >= static_cast<uint64_t>(need), name, " has room for ", have, " entries, needs ", need);
}

int64_t gathered_rows(const PcpSegmentInputs& in, int32_t p) {
  const int64_t rows = static_cast<int64_t>(p) * in.pcp_size;
  AAR_CHECK_ARG(rows <= INT32_MAX, "the gathered buffer has ", rows, " rows (pcp_size=", in.pcp_size,
                "), beyond int32");
  return rows;
}

}  // namespace

int32_t pcp_padded_local_tokens(const PcpSegmentInputs& in) {
  validate(in);
  return padded_tokens(in);
}

int32_t pcp_rank_segments(const PcpSegmentInputs& in, int32_t rank, Span<PcpSegment> segments_out) {
  validate(in);
  AAR_CHECK_ARG(rank >= 0 && rank < in.pcp_size, "rank=", rank, " is out of range [0, pcp_size=", in.pcp_size,
                ")");
  const std::size_t n = in.num_computed_tokens.size();
  check_room(segments_out.size(), static_cast<int64_t>(std::max<std::size_t>(1, 2 * n)), "segments_out");
  int32_t count = 0;
  for_each_segment(in, rank, [&](const PcpSegment& s) { segments_out[count++] = s; });
  if (count == 0) {
    // Every rank runs the layer with at least one request row, even one of 0 tokens.
    segments_out[0] = PcpSegment{0, 0, 0, 0, n > 0 ? in.num_computed_tokens[0] : 0};
    count = 1;
  }
  return count;
}

void pcp_segment_gather_indices(const PcpSegmentInputs& in, Span<int32_t> hidden_restore_out,
                                Span<int32_t> padded_gather_out, Span<uint8_t> kv_write_mask_out) {
  validate(in);
  const int32_t p = padded_tokens(in);
  const int64_t rows = gathered_rows(in, p);
  const int32_t total = in.query_start_loc[in.query_start_loc.size() - 1];
  check_room(hidden_restore_out.size(), total, "hidden_restore_out");
  check_room(padded_gather_out.size(), rows, "padded_gather_out");
  check_room(kv_write_mask_out.size(), rows, "kv_write_mask_out");
  std::fill(padded_gather_out.begin(), padded_gather_out.begin() + rows, 0);
  std::fill(kv_write_mask_out.begin(), kv_write_mask_out.begin() + rows, uint8_t{0});
  for (int32_t r = 0; r < in.pcp_size; ++r) {
    for_each_segment(in, r, [&](const PcpSegment& s) {
      const bool write = in.is_prefilling[s.req] != 0 || r == 0;
      for (int32_t k = 0; k < s.num_tokens; ++k) {
        const int32_t row = r * p + s.local_begin + k;
        padded_gather_out[row] = s.token_begin + k;
        if (!write) continue;
        kv_write_mask_out[row] = 1;
        hidden_restore_out[s.token_begin + k] = row;
      }
    });
  }
}

void pcp_expanded_slot_mapping(const PcpSegmentInputs& in, CSpan<int32_t> token_slots, Span<int32_t> slots_out) {
  validate(in);
  const int32_t p = padded_tokens(in);
  const int64_t rows = gathered_rows(in, p);
  const int32_t total = in.query_start_loc[in.query_start_loc.size() - 1];
  AAR_CHECK_ARG(token_slots.size() == static_cast<std::size_t>(total), "token_slots has ", token_slots.size(),
                " entries, expected query_start_loc[N]=", total);
  check_room(slots_out.size(), rows, "slots_out");
  std::fill(slots_out.begin(), slots_out.begin() + rows, kPadSlot);
  for (int32_t r = 0; r < in.pcp_size; ++r) {
    for_each_segment(in, r, [&](const PcpSegment& s) {
      if (in.is_prefilling[s.req] == 0 && r != 0) return;
      for (int32_t k = 0; k < s.num_tokens; ++k) slots_out[r * p + s.local_begin + k] = token_slots[s.token_begin + k];
    });
  }
}

}  // namespace aar::plan
