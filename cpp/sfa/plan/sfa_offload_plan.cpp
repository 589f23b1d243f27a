// Host planning of the SFA KV-offload builder (docs/design/sfa.md §6).
#include "ascend_attn_rt/sfa/plan/sfa_offload_plan.h"

#include <algorithm>

#include "ascend_attn_rt/errors.h"
#include "ascend_attn_rt/plan/request_keys.h"
#include "ascend_attn_rt/plan/seq_lens.h"

namespace aar::plan {

SplitResult check_sfa_offload_step(const SfaOffloadInputs& in) {
  const std::size_t b = in.seq_lens.size();
  const CSpan<int32_t> qsl = in.query_start_loc;
  AAR_CHECK_ARG(qsl.size() == b + 1, "query_start_loc has ", qsl.size(), " entries, expected num_reqs + 1 = ",
                b + 1);
  validate_start_loc(qsl, "query_start_loc");
  AAR_CHECK_ARG(in.req_ids.size() == b, "req_ids has ", in.req_ids.size(),
                " entries, expected one per request (", b, "): the KV-offload builder keys its resident-slot LRU "
                "rows by them (docs/design/sfa.md §6)");
  check_distinct_request_ids(in.req_ids, "req_ids");
  if (in.decode_consumer) {
    AAR_CHECK_ARG(in.is_prefilling.empty(), "is_prefilling was given to a KV-offload builder configured as a "
                  "decode consumer: its split treats short extends as decodes and never reads the flags (docs/design/sfa.md §6)");
  } else {
    AAR_CHECK_ARG(in.is_prefilling.size() == b, "is_prefilling has ", in.is_prefilling.size(),
                  " entries, expected one per request (", b, "): a KV-offload builder that is not a decode consumer "
                  "splits with treat_short_extends_as_decodes=False, which needs them (docs/design/sfa.md §6)");
  }
  if (b == 0) return {};
  const int32_t thr = in.decode_threshold;
  int32_t max_q = 0;
  for (std::size_t r = 0; r < b; ++r) max_q = std::max(max_q, qsl[r + 1] - qsl[r]);
  SplitInputs si;
  si.query_start_loc = qsl;
  si.num_actual_tokens = qsl[b];
  si.max_query_len = max_q;
  si.decode_threshold = thr;
  si.treat_short_extends_as_decodes = in.decode_consumer;
  si.is_prefilling = in.is_prefilling;
  const SplitResult split = split_decodes_and_prefills(si);
  // The order (see the header): nothing after the leading decodes may be a decode.
  for (std::size_t r = static_cast<std::size_t>(split.num_decodes); r < b; ++r) {
    const int32_t q = qsl[r + 1] - qsl[r];
    const bool decode = q > 0 && q <= thr && (in.decode_consumer || in.is_prefilling[r] == 0);
    AAR_CHECK_ARG(!decode, "request ", r, " (query length ", q, ") is a decode after the first prefill (request ",
                  split.num_decodes, "): the KV-offload path needs the batch decode-first (reorder it with "
                  "reorder_batch_threshold = decode_threshold ", thr, ", plan::reorder_decode_first); decode-only "
                  "steps keep their rows in the host pool only, so a decode attending on the device cache would "
                  "read rows it never received");
  }
  return split;
}

void write_sfa_offload_step(const SfaOffloadInputs& in, const SplitResult& split, int32_t num_tokens,
                            const SfaOffloadBuffers& buf) {
  const std::size_t b = in.seq_lens.size();
  const CSpan<int32_t> qsl = in.query_start_loc;
  const int32_t t_real = b == 0 ? 0 : qsl[b];
  AAR_CHECK_ARG(num_tokens >= t_real, "num_tokens=", num_tokens, " is smaller than the step's ", t_real, " tokens");
  const auto room = [](std::size_t have, std::size_t need, const char* name) {
    AAR_CHECK_ARG(have >= need, name, " has room for ", have, " entries, needs ", need);
  };
  // The split is an argument of its own: it must be the one check_sfa_offload_step gives for
  // this batch before it is used as indices. Comparing token counts alone is not enough
  // (fuzz_sfa_offload: num_decodes = -1 with num_prefills = B + 1 read query_start_loc out of
  // bounds; a leading zero-token request moved between the decodes and the prefills kept every
  // count and changed prefill_cum_query_lens).
  const SplitResult expect = check_sfa_offload_step(in);
  AAR_CHECK_ARG(split == expect, "split (", split.num_decodes, " decodes / ", split.num_decode_tokens, " tokens, ",
                split.num_prefills, " prefills) does not describe the ", b, "-request batch (its split is ",
                expect.num_decodes, " / ", expect.num_decode_tokens, " / ", expect.num_prefills, ")");
  const std::size_t nd = static_cast<std::size_t>(split.num_decodes);
  const std::size_t np = static_cast<std::size_t>(split.num_prefills);
  const std::size_t ndt = static_cast<std::size_t>(split.num_decode_tokens);
  room(buf.req_ids.size(), b, "buffers.req_ids");
  room(buf.token_to_req.size(), static_cast<std::size_t>(num_tokens), "buffers.token_to_req");
  room(buf.prefill_cum_query_lens.size(), np, "buffers.prefill_cum_query_lens");
  room(buf.decode_req_ids.size(), ndt, "buffers.decode_req_ids");
  room(buf.decode_seq_lens.size(), ndt, "buffers.decode_seq_lens");
  room(buf.decode_stable_prefix.size(), ndt, "buffers.decode_stable_prefix");
  AAR_CHECK_ARG(nd + np == b || b == 0, "split of ", nd, " decodes + ", np, " prefills does not cover the ", b,
                " requests");

  for (std::size_t r = 0; r < b; ++r) buf.req_ids[r] = in.req_ids[r];
  int32_t* ttr = buf.token_to_req.data();
  for (std::size_t r = 0; r < b; ++r) std::fill(ttr + qsl[r], ttr + qsl[r + 1], static_cast<int32_t>(r));
  std::fill(ttr + t_real, ttr + num_tokens, -1);
  const int32_t base = qsl[nd];
  for (std::size_t i = 0; i < np; ++i) buf.prefill_cum_query_lens[i] = qsl[nd + i + 1] - base;
  for (std::size_t r = 0; r < nd; ++r) {
    const int32_t q = qsl[r + 1] - qsl[r], s = in.seq_lens[r];
    const int32_t stable = static_cast<int32_t>(std::max<int64_t>(int64_t{s} - q, 0));
    for (int32_t t = qsl[r]; t < qsl[r + 1]; ++t) {
      buf.decode_req_ids[t] = in.req_ids[r];
      buf.decode_seq_lens[t] = s;
      buf.decode_stable_prefix[t] = stable;
    }
  }
}

}  // namespace aar::plan
