// Length-convention conversions and FIA batch padding (docs/design/gqa.md §2.5).
#include "ascend_attn_rt/plan/seq_lens.h"

#include "ascend_attn_rt/errors.h"
#include "internal.h"

namespace aar::plan {

void validate_start_loc(CSpan<int32_t> start_loc, const char* arg) {
  AAR_CHECK_ARG(!start_loc.empty(), arg, " must have at least one entry (got an empty span)");
  AAR_CHECK_ARG(start_loc[0] == 0, arg, "[0]=", start_loc[0], " must be 0");
  // Branch-free scan (vectorises); the offender is located only on failure.
  int bad = 0;
  for (std::size_t i = 1; i < start_loc.size(); ++i) bad |= start_loc[i] < start_loc[i - 1];
  if (!bad) return;
  for (std::size_t i = 1; i < start_loc.size(); ++i) {
    AAR_CHECK_ARG(start_loc[i] >= start_loc[i - 1], arg, " must be non-decreasing: ", arg, "[", i,
                  "]=", start_loc[i], " < ", arg, "[", i - 1, "]=", start_loc[i - 1]);
  }
}

void start_loc_to_ends(CSpan<int32_t> start_loc, Span<int64_t> ends_out) {
  validate_start_loc(start_loc, "start_loc");
  const std::size_t n = start_loc.size() - 1;
  AAR_CHECK_ARG(ends_out.size() >= n, "ends_out has room for ", ends_out.size(), " entries, needs ", n);
  for (std::size_t i = 0; i < n; ++i) ends_out[i] = start_loc[i + 1];
}

void start_loc_to_lens(CSpan<int32_t> start_loc, Span<int32_t> lens_out) {
  validate_start_loc(start_loc, "start_loc");
  const std::size_t n = start_loc.size() - 1;
  AAR_CHECK_ARG(lens_out.size() >= n, "lens_out has room for ", lens_out.size(), " entries, needs ", n);
  for (std::size_t i = 0; i < n; ++i) lens_out[i] = start_loc[i + 1] - start_loc[i];
}

void lens_to_ends(CSpan<int32_t> lens, Span<int64_t> ends_out) {
  AAR_CHECK_ARG(ends_out.size() >= lens.size(), "ends_out has room for ", ends_out.size(), " entries, needs ",
                lens.size());
  for (std::size_t i = 0; i < lens.size(); ++i) {
    AAR_CHECK_ARG(lens[i] >= 0, "lens[", i, "]=", lens[i], " is negative");
  }
  int64_t acc = 0;
  for (std::size_t i = 0; i < lens.size(); ++i) {
    acc += lens[i];
    ends_out[i] = acc;
  }
}

namespace detail {
FiaPadding write_fia_padding(CSpan<int32_t> query_start_loc, CSpan<int32_t> seq_lens, int32_t padded_tokens,
                             Span<int64_t> q_ends_out, Span<int64_t> kv_lens_out, int32_t dummy_kv_len) {
  const std::size_t b = seq_lens.size();
  for (std::size_t i = 0; i < b; ++i) {
    q_ends_out[i] = query_start_loc[i + 1];
    kv_lens_out[i] = seq_lens[i];
  }
  FiaPadding pad;
  pad.num_reqs = static_cast<int32_t>(b);
  pad.num_tokens = query_start_loc[b];
  if (padded_tokens > query_start_loc[b]) {
    q_ends_out[b] = padded_tokens;
    kv_lens_out[b] = dummy_kv_len;
    pad.num_reqs += 1;
    pad.num_tokens = padded_tokens;
    pad.added_dummy = true;
  }
  return pad;
}
}  // namespace detail

FiaPadding pad_for_fia(CSpan<int32_t> query_start_loc, CSpan<int32_t> seq_lens, int32_t padded_tokens,
                       Span<int64_t> q_ends_out, Span<int64_t> kv_lens_out, int32_t dummy_kv_len) {
  const std::size_t b = seq_lens.size();
  AAR_CHECK_ARG(query_start_loc.size() == b + 1, "query_start_loc has ", query_start_loc.size(),
                " entries, expected seq_lens.size()+1 = ", b + 1);
  validate_start_loc(query_start_loc, "query_start_loc");
  for (std::size_t i = 0; i < b; ++i) {
    AAR_CHECK_ARG(seq_lens[i] >= 0, "seq_lens[", i, "]=", seq_lens[i], " is negative");
  }
  AAR_CHECK_ARG(padded_tokens >= query_start_loc[b], "padded_tokens=", padded_tokens,
                " is smaller than query_start_loc[", b, "]=", query_start_loc[b]);
  AAR_CHECK_ARG(dummy_kv_len >= 0, "dummy_kv_len=", dummy_kv_len, " is negative");
  const std::size_t need = b + (padded_tokens > query_start_loc[b] ? 1 : 0);
  AAR_CHECK_ARG(q_ends_out.size() >= need, "q_ends_out has room for ", q_ends_out.size(), " entries, needs ",
                need);
  AAR_CHECK_ARG(kv_lens_out.size() >= need, "kv_lens_out has room for ", kv_lens_out.size(),
                " entries, needs ", need);
  return detail::write_fia_padding(query_start_loc, seq_lens, padded_tokens, q_ends_out, kv_lens_out,
                                   dummy_kv_len);
}

}  // namespace aar::plan
