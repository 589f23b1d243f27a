// select_attention_state (docs/design/gqa.md §2.1) against the decision table written out row by row.
#include "ascend_attn_rt/plan/attention_state.h"
#include "fuzz_util.h"

using namespace aar;
using plan::AttentionState;

namespace {
AttentionState naive(const std::vector<int32_t>& comp, const std::vector<int32_t>& sched,
                     const std::vector<int32_t>& spec, plan::SpecMethod m, bool chunked) {
  if (sched.empty()) return AttentionState::DecodeOnly;
  bool fresh = true, one = true, valid_one = true;
  for (size_t i = 0; i < sched.size(); ++i) {
    fresh &= comp[i] == 0;
    one &= sched[i] == 1;
    valid_one &= sched[i] - (spec.empty() ? 0 : spec[i]) == 1;
  }
  AttentionState s;
  if (fresh) s = AttentionState::PrefillNoCache;
  else if (one) s = m == plan::SpecMethod::Mtp ? AttentionState::SpecDecoding : AttentionState::DecodeOnly;
  else if (valid_one) s = m != plan::SpecMethod::None ? AttentionState::SpecDecoding : AttentionState::ChunkedPrefill;
  else s = chunked ? AttentionState::ChunkedPrefill : AttentionState::PrefillCacheHit;
  if (s == AttentionState::SpecDecoding && m != plan::SpecMethod::Mtp) s = AttentionState::ChunkedPrefill;
  return s;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Bytes in(data, size);
  const int32_t n = in.range(0, 8);
  std::vector<int32_t> comp(n), sched(n), spec;
  const bool with_spec = in.flag();
  for (int32_t i = 0; i < n; ++i) {
    comp[i] = in.flag() ? 0 : in.range(-1, 50);
    sched[i] = in.range(-1, 4);
    if (with_spec) spec.push_back(in.range(-1, 4));
  }
  if (in.u8() % 8 == 0 && n) comp.pop_back();  // length mismatch
  const int32_t m = in.range(-1, 3);
  const bool chunked = in.flag();
  plan::StateInputs si{comp, sched, spec, static_cast<plan::SpecMethod>(m), chunked};
  bool valid = comp.size() == sched.size() && m >= 0 && m <= 2;
  for (size_t i = 0; valid && i < sched.size(); ++i) {
    valid = comp[i] >= 0 && sched[i] >= 0 && (spec.empty() || (spec[i] >= 0 && spec[i] <= sched[i]));
  }
  AttentionState got{};
  fuzz::Snapshot snap;
  const bool ok = fuzz::accepted([&] { got = plan::select_attention_state(si); }, snap);
  FUZZ_CHECK(ok == valid);
  if (ok) FUZZ_CHECK(got == naive(comp, sched, spec, static_cast<plan::SpecMethod>(m), chunked));
  return 0;
}
