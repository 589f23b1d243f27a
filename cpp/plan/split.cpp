// Decode/prefill split (docs/design/gqa.md §2.2), without the DCP override (step 1) and
// the PD recompute-scheduler rule (step 4): those belong to the callers.
#include "ascend_attn_rt/plan/split.h"

#include "ascend_attn_rt/errors.h"
#include "ascend_attn_rt/plan/seq_lens.h"

namespace aar::plan {

SplitResult split_decodes_and_prefills(const SplitInputs& in) {
  const CSpan<int32_t> qsl = in.query_start_loc;
  if (!qsl.empty()) validate_start_loc(qsl, "query_start_loc");
  AAR_CHECK_ARG(in.num_actual_tokens >= 0, "num_actual_tokens=", in.num_actual_tokens, " is negative");

  // Step 2: empty batch.
  if (qsl.size() <= 1) return {};
  const auto n = static_cast<int32_t>(qsl.size() - 1);
  const int32_t t_act = in.num_actual_tokens;
  const int32_t thr = in.decode_threshold;
  const SplitResult all_decode{n, 0, t_act, 0};

  // Step 5: fast path (is_prefilling is deliberately not consulted here).
  if (in.max_query_len <= thr && (!in.require_uniform || thr <= 1) && in.treat_short_extends_as_decodes) {
    return all_decode;
  }

  auto q_len = [&](int32_t i) { return qsl[i + 1] - qsl[i]; };
  const int32_t q0 = q_len(0);

  // Step 7: "first request is a prefill => everything is a prefill".
  if (q0 > thr) return {0, n, 0, t_act};

  // Step 8.
  if (in.require_uniform) {
    bool uniform = true;
    for (int32_t i = 0; i < n && uniform; ++i) uniform = q_len(i) == q0 || q_len(i) == 0;
    if (uniform) return all_decode;
  }

  // Step 9: short extends count as prefills; is_prefilling is right-padded with
  // false / truncated to n.
  const bool use_prefilling = !in.treat_short_extends_as_decodes;
  AAR_CHECK_ARG(!use_prefilling || !in.is_prefilling.empty(),
                "is_prefilling is required when treat_short_extends_as_decodes is false (got an empty span)");

  int32_t first = -1;
  for (int32_t i = 0; i < n; ++i) {
    bool is_prefill = in.require_uniform ? q_len(i) != q0 : q_len(i) > thr;
    if (use_prefilling && static_cast<std::size_t>(i) < in.is_prefilling.size()) {
      is_prefill = is_prefill || in.is_prefilling[i] != 0;
    }
    if (is_prefill) {
      first = i;
      break;
    }
  }
  // Step 10.
  if (first < 0) return all_decode;
  // Step 11.
  AAR_CHECK_ARG(t_act >= qsl[first], "num_actual_tokens=", t_act, " is smaller than query_start_loc[", first,
                "]=", qsl[first], " (start of the first prefill)");
  return {first, n - first, qsl[first], t_act - qsl[first]};
}

}  // namespace aar::plan
