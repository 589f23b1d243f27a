// split_decodes_and_prefills (docs/design/gqa.md §2.2): the counts partition the batch at one boundary,
// the decode side holds only short requests, and the token counts follow query_start_loc.
#include "ascend_attn_rt/plan/split.h"
#include "fuzz_util.h"

using namespace aar;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Bytes in(data, size);
  fuzz::Batch b = fuzz::make_batch(in);
  fuzz::current_batch() = &b;
  const int32_t B = b.B();
  std::vector<uint8_t> pre;
  if (in.flag()) for (int32_t i = 0; i < B; ++i) pre.push_back(in.flag());
  plan::SplitInputs si;
  si.query_start_loc = b.qsl;
  si.num_actual_tokens = in.flag() ? b.qsl.back() : fuzz::input_tokens(in, b.qsl.back());
  int64_t maxq = 0;
  bool mono = true;
  for (int32_t r = 0; r < B; ++r) {
    mono &= b.qsl[r + 1] >= b.qsl[r];
    if (mono) maxq = std::max<int64_t>(maxq, int64_t{b.qsl[r + 1]} - b.qsl[r]);
  }
  si.max_query_len = static_cast<int32_t>(std::min<int64_t>(maxq, INT32_MAX));
  si.decode_threshold = in.range(1, 4);
  si.require_uniform = in.u8() % 4 == 0;
  si.treat_short_extends_as_decodes = in.flag();
  si.is_prefilling = pre;
  plan::SplitResult r{};
  fuzz::Snapshot snap;
  const bool ok = fuzz::accepted([&] { r = plan::split_decodes_and_prefills(si); }, snap);
  if (!mono || si.num_actual_tokens < 0) FUZZ_CHECK(!ok);
  if (!ok) return 0;
  FUZZ_CHECK(r.num_decodes >= 0 && r.num_prefills >= 0 && r.num_decodes + r.num_prefills == B);
  FUZZ_CHECK(r.num_decode_tokens + r.num_prefill_tokens == (B ? si.num_actual_tokens : 0));
  if (r.num_prefills > 0 && r.num_decodes > 0) FUZZ_CHECK(r.num_decode_tokens == b.qsl[r.num_decodes]);
  for (int32_t i = 0; i < r.num_decodes && !si.require_uniform; ++i)
    FUZZ_CHECK(b.qsl[i + 1] - b.qsl[i] <= si.decode_threshold);
  // The first prefill (when the decodes are not all of the batch) is not a short decode.
  if (r.num_decodes < B && r.num_decodes > 0 && !si.require_uniform) {
    const int32_t i = r.num_decodes;
    const bool long_q = b.qsl[i + 1] - b.qsl[i] > si.decode_threshold;
    const bool prefilling = !si.treat_short_extends_as_decodes && static_cast<size_t>(i) < pre.size() && pre[i];
    FUZZ_CHECK(long_q || prefilling);
  }
  return 0;
}
