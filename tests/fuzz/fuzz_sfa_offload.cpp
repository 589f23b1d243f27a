// The SFA KV-offload step (plan/sfa_offload_plan.h): check_sfa_offload_step's split and its
// decode-first order rule, then write_sfa_offload_step's per-request and per-token arrays
// against a naive model (and with a corrupted split, which must be rejected untouched).
#include "ascend_attn_rt/sfa/plan/sfa_offload_plan.h"
#include "fuzz_util.h"

using namespace aar;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Bytes in(data, size);
  fuzz::Batch b = fuzz::make_batch(in, 8, 12, 100);
  fuzz::current_batch() = &b;
  const int32_t B = b.B();
  std::vector<uint64_t> ids(B + (in.u8() % 16 == 0 ? 1 : 0));
  // Mostly distinct ids, sometimes a small range where repeats are likely.
  const bool narrow_ids = in.u8() % 8 == 0;
  for (auto& v : ids) v = narrow_ids ? in.range(0, 3) : (uint64_t{in.u32()} << 32 | in.u32());
  plan::SfaOffloadInputs oi;
  oi.query_start_loc = b.qsl;
  oi.seq_lens = b.seq_lens;
  oi.req_ids = ids;
  oi.decode_consumer = in.flag();
  oi.decode_threshold = in.range(1, 3);
  std::vector<uint8_t> pre;
  const bool give_flags = in.u8() % 16 == 0 ? oi.decode_consumer : !oi.decode_consumer;
  if (give_flags) {
    for (int32_t r = 0; r < B; ++r) pre.push_back(in.u8() % 3 == 0);
    if (in.u8() % 16 == 0) pre.push_back(0);
  }
  oi.is_prefilling = pre;

  plan::SplitResult split;
  fuzz::Snapshot none;
  const bool ok = fuzz::accepted([&] { split = plan::check_sfa_offload_step(oi); }, none);
  bool mono = b.qsl[0] == 0;
  for (int32_t r = 0; r < B; ++r) mono = mono && b.qsl[r + 1] >= b.qsl[r];
  const bool flags_ok = oi.decode_consumer ? pre.empty() : pre.size() == size_t(B);
  // Naive decode rule and the order rule: a decode (0 < q <= threshold, not prefilling unless a
  // decode consumer) after the first non-decode is refused.
  auto is_decode = [&](int32_t r) {
    const int32_t q = b.qsl[r + 1] - b.qsl[r];
    return q > 0 && q <= oi.decode_threshold && (oi.decode_consumer || !pre[r]);
  };
  bool distinct = true;
  for (size_t i = 0; i < ids.size(); ++i)
    for (size_t j = 0; j < i; ++j) distinct = distinct && ids[i] != ids[j];
  if (!mono || !flags_ok || ids.size() != size_t(B) || !distinct) {
    FUZZ_CHECK(!ok);
    return 0;
  }
  if (ok) {
    const int32_t nd = split.num_decodes;
    FUZZ_CHECK(nd >= 0 && nd <= B && split.num_prefills == B - nd);
    FUZZ_CHECK(split.num_decode_tokens == b.qsl[nd]);
    for (int32_t r = nd; r < B; ++r) FUZZ_CHECK(!is_decode(r));
  } else {
    // Refused only for the order: some decode follows a non-decode.
    bool seen_prefill = false, late_decode = false;
    for (int32_t r = 0; r < B; ++r) {
      const int32_t q = b.qsl[r + 1] - b.qsl[r];
      const bool short_dec = q <= oi.decode_threshold && (oi.decode_consumer || !pre[r]);
      if (!short_dec) seen_prefill = true;
      else if (seen_prefill && is_decode(r)) late_decode = true;
    }
    FUZZ_CHECK(late_decode);
    return 0;
  }
  // write_sfa_offload_step needs plan_sfa_step's check too: seq_lens >= query lengths.
  for (int32_t r = 0; r < B; ++r)
    if (b.seq_lens[r] < b.qsl[r + 1] - b.qsl[r]) return 0;
  const int32_t real = b.qsl.back();
  const int32_t T = real + (in.u8() % 16 == 0 ? -1 : in.range(0, 4));
  plan::SplitResult sp = split;
  const uint8_t corrupt = in.u8() % 16;
  if (corrupt == 0) {
    sp.num_decodes = in.maybe_bad(sp.num_decodes);
    sp.num_prefills = static_cast<int32_t>(std::clamp<int64_t>(int64_t{B} - sp.num_decodes, INT32_MIN, INT32_MAX));
  }
  if (corrupt == 1) sp.num_decode_tokens = in.maybe_bad(sp.num_decode_tokens);
  if (corrupt == 2) sp.num_prefills = in.maybe_bad(sp.num_prefills);
  const int32_t nd = split.num_decodes, ndt = split.num_decode_tokens, np = B - nd;
  auto sz = [&](int64_t n) { return fuzz::room(in.u8() % 16 == 0 ? n - 1 : n); };
  auto rid = fuzz::canary<uint64_t>(sz(B), 9);
  auto ttr = fuzz::canary<int32_t>(sz(std::max(T, 0)), -9);
  auto pcq = fuzz::canary<int32_t>(sz(np), -9), dsl = fuzz::canary<int32_t>(sz(ndt), -9);
  auto dsp = fuzz::canary<int32_t>(sz(ndt), -9);
  auto dri = fuzz::canary<uint64_t>(sz(ndt), 9);
  fuzz::Snapshot s;
  s.add(rid), s.add(ttr), s.add(pcq), s.add(dsl), s.add(dsp), s.add(dri);
  const bool wok =
      fuzz::accepted([&] { plan::write_sfa_offload_step(oi, sp, T, {rid, ttr, pcq, dri, dsl, dsp}); }, s);
  const bool room = rid.size() >= size_t(B) && T >= real && ttr.size() >= size_t(T) && pcq.size() >= size_t(np) &&
                    dsl.size() >= size_t(ndt) && dsp.size() >= size_t(ndt) && dri.size() >= size_t(ndt);
  const bool split_same = sp == split;
  if (split_same) FUZZ_CHECK(wok == room);
  if (!wok) return 0;
  FUZZ_CHECK(split_same);  // a split that does not describe the batch is refused
  for (int32_t r = 0; r < B; ++r) FUZZ_CHECK(rid[r] == ids[r]);
  for (int32_t r = 0; r < B; ++r)
    for (int32_t t = b.qsl[r]; t < b.qsl[r + 1]; ++t) FUZZ_CHECK(ttr[t] == r);
  for (int32_t t = real; t < T; ++t) FUZZ_CHECK(ttr[t] == -1);
  for (int32_t i = 0; i < np; ++i) FUZZ_CHECK(pcq[i] == b.qsl[nd + i + 1] - b.qsl[nd]);
  for (int32_t r = 0; r < nd; ++r) {
    const int32_t q = b.qsl[r + 1] - b.qsl[r];
    for (int32_t t = b.qsl[r]; t < b.qsl[r + 1]; ++t) {
      FUZZ_CHECK(dri[t] == ids[r] && dsl[t] == b.seq_lens[r]);
      FUZZ_CHECK(dsp[t] == std::max(b.seq_lens[r] - q, 0));
    }
  }
  return 0;
}
