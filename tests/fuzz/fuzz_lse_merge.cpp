// merge_attention_partials (fp32, stacked and span-of-spans forms) against a float64
// log-sum-exp merge written here; -inf partial LSEs (an empty part) are included.
#include <cmath>

#include "ascend_attn_rt/cp/plan/lse_merge.h"
#include "fuzz_util.h"

using namespace aar;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Bytes in(data, size);
  const int32_t parts = in.range(0, 5);
  const int32_t rows = in.range(0, 6), hd = in.range(1, 8);
  std::vector<float> outs(static_cast<size_t>(parts) * rows * hd), lses(static_cast<size_t>(parts) * rows);
  for (auto& v : outs) v = static_cast<float>(in.range(-1000, 1000)) / 100.f;
  for (auto& v : lses) v = in.u8() % 10 == 0 ? -INFINITY : static_cast<float>(in.range(-3000, 3000)) / 100.f;
  const int32_t bad = in.u8() % 10;  // 0: short out, 1: short lse_out, 2: hd 0
  auto out = fuzz::canary<float>(static_cast<size_t>(rows) * hd - (bad == 0 && rows ? 1 : 0), 7.f);
  auto lse = fuzz::canary<float>(rows - (bad == 1 && rows ? 1 : 0), 7.f);
  fuzz::Snapshot snap;
  snap.add(out), snap.add(lse);
  const int64_t head_dim = bad == 2 ? 0 : hd;
  const bool ok = fuzz::accepted(
      [&] { plan::merge_attention_partials_stacked(plan::CSpan<float>(outs), plan::CSpan<float>(lses), parts, rows, head_dim,
                                               plan::Span<float>(out), plan::Span<float>(lse)); }, snap);
  // lse_out may also be empty (the merged LSE not wanted): rows == 1 with bad == 1 is valid.
  FUZZ_CHECK(ok == !((bad == 0 && rows) || (bad == 1 && rows > 1) || bad == 2));
  if (!ok) return 0;
  const bool with_lse = !lse.empty();
  for (int32_t r = 0; r < rows; ++r) {
    double m = -INFINITY;
    for (int32_t p = 0; p < parts; ++p) m = std::max(m, static_cast<double>(lses[p * rows + r]));
    double z = 0;
    for (int32_t p = 0; p < parts; ++p) z += std::isinf(m) ? 0 : std::exp(lses[p * rows + r] - m);
    if (std::isinf(m)) {  // every part empty (or none): O = 0, lse = -inf, never NaN
      if (with_lse) FUZZ_CHECK(std::isinf(lse[r]) && lse[r] < 0);
      for (int32_t d = 0; d < hd; ++d) FUZZ_CHECK(out[static_cast<size_t>(r) * hd + d] == 0.f);
      continue;
    }
    const double L = m + std::log(z);
    if (with_lse) FUZZ_CHECK(std::fabs(lse[r] - L) <= 1e-4 * (1 + std::fabs(L)));
    for (int32_t d = 0; d < hd; ++d) {
      double acc = 0;
      for (int32_t p = 0; p < parts; ++p)
        acc += std::exp(lses[p * rows + r] - L) * outs[(static_cast<size_t>(p) * rows + r) * hd + d];
      FUZZ_CHECK(std::fabs(out[static_cast<size_t>(r) * hd + d] - acc) <= 1e-4 * (1 + std::fabs(acc)));
    }
  }
  // The span-of-spans form gives the same bytes.
  std::vector<plan::CSpan<float>> o, l;
  for (int32_t p = 0; p < parts; ++p) {
    o.emplace_back(outs.data() + static_cast<size_t>(p) * rows * hd, static_cast<size_t>(rows) * hd);
    l.emplace_back(lses.data() + static_cast<size_t>(p) * rows, rows);
  }
  auto out2 = fuzz::canary<float>(out.size(), 7.f), lse2 = fuzz::canary<float>(lse.size(), 7.f);
  fuzz::Snapshot s2;
  s2.add(out2), s2.add(lse2);
  FUZZ_CHECK(fuzz::accepted([&] { plan::merge_attention_partials(plan::CSpan<plan::CSpan<float>>(o), plan::CSpan<plan::CSpan<float>>(l), rows,
                                                              head_dim, plan::Span<float>(out2), plan::Span<float>(lse2)); }, s2));
  FUZZ_CHECK(out.empty() || std::memcmp(out.data(), out2.data(), out.size() * sizeof(float)) == 0);
  FUZZ_CHECK(lse.empty() || std::memcmp(lse.data(), lse2.data(), lse.size() * sizeof(float)) == 0);
  return 0;
}
