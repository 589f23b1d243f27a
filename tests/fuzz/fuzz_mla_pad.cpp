// The MLA graph-padding helpers (docs/design/mla.md §3.5): interp_round_half_even (numpy's
// round(linspace(a, b, n + 1)[1:])) against an exact rational model (within one of it: numpy
// computes in doubles; the last value exactly b; non-decreasing when b >= a), and
// pad_actual_q_disable_mode / pad_actual_q_enable_mode against the rules of docs/design/mla.md written here
// (the copy of actual_q, then the interpolated or referenced tail); rejections name the
// argument and leave the output untouched.
#include <cmath>

#include "ascend_attn_rt/mla/plan/mla_plan.h"
#include "fuzz_util.h"

using namespace aar;

namespace {

int64_t wide(fuzz::Bytes& in) {
  switch (in.u8() % 8) {
    case 0: return static_cast<int64_t>(static_cast<uint64_t>(in.u32()) << 32 | in.u32());  // anything
    case 1: return (int64_t{1} << 52) + in.range(-2, 2);                                  // the bound
    case 2: return -(int64_t{1} << 52) + in.range(-2, 2);
    default: return in.range(-50, 400);
  }
}

bool in_exact(int64_t v) { return v >= -(int64_t{1} << 52) && v <= (int64_t{1} << 52); }

// |got - (a + i (b - a) / n)| <= 1 + a few ulps of the larger end, in exact arithmetic (__int128):
// numpy's doubles round the step and the product (an ulp is 1 at 2^52).
bool near_exact(int64_t a, int64_t b, int32_t n, int32_t i, int64_t got) {
  const __int128 num = static_cast<__int128>(a) * n + static_cast<__int128>(i) * (static_cast<__int128>(b) - a);
  const int64_t mag = std::max(a < 0 ? -a : a, b < 0 ? -b : b);
  const __int128 slack = static_cast<__int128>(1 + (mag >> 49)) * n;
  const __int128 d = static_cast<__int128>(got) * n - num;
  return d <= slack && d >= -slack;
}

void check_interp(fuzz::Bytes& in) {
  const int64_t a = wide(in), b = wide(in);
  const int32_t n = in.u8() % 16 == 0 ? in.maybe_bad(3) : in.range(0, 300);
  const size_t room = in.u8() % 8 == 0 ? static_cast<size_t>(in.range(0, 300)) : static_cast<size_t>(std::max(0, n));
  auto out = fuzz::canary<int64_t>(std::min<size_t>(room, 1 << 12), -9);
  fuzz::Snapshot snap;
  snap.add(out);
  const bool ok = fuzz::accepted([&] { plan::interp_round_half_even(a, b, n, out); }, snap);
  const bool valid = n >= 0 && out.size() >= static_cast<size_t>(n) && in_exact(a) && in_exact(b);
  FUZZ_CHECK(ok == valid);
  if (!ok || n == 0) return;
  FUZZ_CHECK(out[n - 1] == b);
  for (int32_t i = 1; i <= n; ++i) {
    FUZZ_CHECK(near_exact(a, b, n, i, out[i - 1]));
    if (i > 1 && b >= a) FUZZ_CHECK(out[i - 1] >= out[i - 2]);
    if (i > 1 && b <= a) FUZZ_CHECK(out[i - 1] <= out[i - 2]);
  }
  for (size_t i = n; i < out.size(); ++i) FUZZ_CHECK(out[i] == -9);
  // Small exact cases: the value itself, half to even (upstream's examples: 5.75 -> 6, 6.5 -> 6).
  if (std::llabs(a) < (1 << 20) && std::llabs(b) < (1 << 20) && (n & (n - 1)) == 0) {
    for (int32_t i = 1; i <= n; ++i) {
      const int64_t num = a * n + int64_t{i} * (b - a);  // exact, n a power of two: the double is exact too
      const int64_t fl = num >= 0 ? num / n : -((-num + n - 1) / n);
      const int64_t rem = num - fl * n;  // in [0, n)
      int64_t want = fl;
      if (2 * rem > n || (2 * rem == n && (fl & 1))) want = fl + 1;
      FUZZ_CHECK(out[i - 1] == want);
    }
  }
}

std::vector<int64_t> cumulative(fuzz::Bytes& in, size_t n) {
  std::vector<int64_t> v;
  int64_t x = 0;
  for (size_t i = 0; i < n; ++i) {
    if (in.u8() % 16 == 0) x = wide(in);  // a jump anywhere (not cumulative any more: a bad input)
    else x = x > INT64_MAX - 4 ? x : x + in.range(0, 4);
    v.push_back(x);
  }
  return v;
}

void check_disable(fuzz::Bytes& in) {
  const auto q = cumulative(in, in.range(0, 8));
  const int32_t num_reqs = in.u8() % 16 == 0 ? in.maybe_bad(4) : in.range(0, 8);
  const int32_t gps = in.u8() % 16 == 0 ? in.maybe_bad(20) : in.range(0, 40);
  const int64_t pad = std::max<int64_t>(0, int64_t{gps} - num_reqs);
  const size_t need = q.size() + static_cast<size_t>(pad);
  const size_t room = in.u8() % 8 == 0 ? static_cast<size_t>(in.range(0, 48)) : fuzz::room(static_cast<int64_t>(need));
  auto out = fuzz::canary<int64_t>(room, -9);
  fuzz::Snapshot snap;
  snap.add(out);
  int32_t len = -1;
  const bool ok = fuzz::accepted([&] { len = plan::pad_actual_q_disable_mode(q, num_reqs, gps, out); }, snap);
  const bool valid = !q.empty() && num_reqs >= 0 && out.size() >= need &&
                     (pad == 0 || (q.back() <= gps && q.back() >= -(int64_t{1} << 52)));
  FUZZ_CHECK(ok == valid);
  if (!ok) return;
  FUZZ_CHECK(static_cast<size_t>(len) == need);
  for (size_t i = 0; i < q.size(); ++i) FUZZ_CHECK(out[i] == q[i]);
  if (pad > 0) {
    std::vector<int64_t> tail(static_cast<size_t>(pad));
    plan::interp_round_half_even(q.back(), gps, static_cast<int32_t>(pad), tail);
    for (int64_t i = 0; i < pad; ++i) FUZZ_CHECK(out[q.size() + i] == tail[i]);
    FUZZ_CHECK(out[need - 1] == gps);
  }
}

void check_enable(fuzz::Bytes& in) {
  const auto q = cumulative(in, in.range(0, 8));
  const auto ref = cumulative(in, in.range(0, 16));
  const int32_t num_reqs = in.u8() % 16 == 0 ? in.maybe_bad(3) : in.range(0, 10);
  const int32_t req_pad = in.u8() % 16 == 0 ? in.maybe_bad(2) : in.range(0, 8);
  const size_t need = q.size() + static_cast<size_t>(std::max(0, req_pad));
  const size_t room = in.u8() % 8 == 0 ? static_cast<size_t>(in.range(0, 24)) : fuzz::room(static_cast<int64_t>(need));
  auto out = fuzz::canary<int64_t>(room, -9);
  fuzz::Snapshot snap;
  snap.add(out);
  int32_t len = -1;
  const bool ok = fuzz::accepted([&] { len = plan::pad_actual_q_enable_mode(q, num_reqs, req_pad, ref, out); }, snap);
  bool valid = !q.empty() && req_pad >= 0 && num_reqs >= 0 && out.size() >= need;
  bool interp = false;
  if (valid && req_pad > 0) {
    const size_t nr = static_cast<size_t>(num_reqs);
    valid = ref.size() >= nr + req_pad;
    interp = ref.size() > nr && static_cast<__int128>(ref[nr]) - q.back() > 16;
    if (valid && interp) {
      valid = in_exact(q.back()) && in_exact(ref[nr + req_pad - 1]);
    }
  }
  FUZZ_CHECK(ok == valid);
  if (!ok) return;
  FUZZ_CHECK(static_cast<size_t>(len) == need);
  for (size_t i = 0; i < q.size(); ++i) FUZZ_CHECK(out[i] == q[i]);
  if (req_pad == 0) return;
  const size_t nr = static_cast<size_t>(num_reqs);
  if (interp) {
    std::vector<int64_t> tail(static_cast<size_t>(req_pad));
    plan::interp_round_half_even(q.back(), ref[nr + req_pad - 1], req_pad, tail);
    for (int32_t i = 0; i < req_pad; ++i) FUZZ_CHECK(out[q.size() + i] == tail[i]);
  } else {
    for (int32_t i = 0; i < req_pad; ++i) FUZZ_CHECK(out[q.size() + i] == ref[nr + i]);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Bytes in(data, size);
  switch (in.u8() % 3) {
    case 0: check_interp(in); break;
    case 1: check_disable(in); break;
    default: check_enable(in); break;
  }
  return 0;
}
