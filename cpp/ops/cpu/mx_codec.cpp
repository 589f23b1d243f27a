// The MX fp8 codec of the CPU twins (mx_codec.h).
#include "mx_codec.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace aar::ops::cpu::mx {

int64_t exponent_ceil(double amax) {
  if (!std::isfinite(amax)) return kNaNExponent;
  if (!(amax > 0)) return kE8m0Min;
  int64_t e = static_cast<int64_t>(std::ceil(std::log2(amax / kE4m3Max)));
  // log2 may be off by one ulp at exact powers of two: settle e exactly.
  while (e < kE8m0Max && std::ldexp(kE4m3Max, static_cast<int>(e)) < amax) ++e;
  while (e > kE8m0Min && std::ldexp(kE4m3Max, static_cast<int>(e - 1)) >= amax) --e;
  return std::max(kE8m0Min, std::min(kE8m0Max, e));
}

int64_t exponent_ocp(double amax) {
  if (!std::isfinite(amax)) return kNaNExponent;
  if (!(amax > 0)) return kE8m0Min;
  int exp2 = 0;
  (void)std::frexp(amax, &exp2);  // amax = m 2^exp2, m in [0.5, 1): floor(log2(amax)) = exp2 - 1, exactly
  return std::max(kE8m0Min, std::min(kE8m0Max, static_cast<int64_t>(exp2 - 1) - kE4m3Emax));
}

at::Tensor e8m0_to_float(const at::Tensor& scale_bytes) {
  const at::Tensor b = scale_bytes.view(at::kByte).to(at::kFloat);
  const at::Tensor s = at::exp2(b - static_cast<double>(kE8m0Bias));
  return at::where(b == static_cast<double>(kE8m0NaN), at::full({}, std::numeric_limits<float>::quiet_NaN()), s);
}

at::Tensor quantize_e4m3(const at::Tensor& x, const at::Tensor& e) {
  const at::Tensor ed = e.to(at::kDouble).unsqueeze(-1);
  // x / 2^e is exact in float32 (a power of two; |e| <= 127 keeps it normal
  // for the block's large elements); the e4m3 cast rounds to nearest even.
  // c10's float8_e4m3fn conversion maps values >= 480 to NaN, hence the clamp.
  at::Tensor y = (x / at::exp2(ed).to(at::kFloat)).clamp_(-kE4m3Max, kE4m3Max);
  const at::Tensor nan_block = (e == kNaNExponent).unsqueeze(-1);
  y = at::where(nan_block, at::full({}, std::numeric_limits<float>::quiet_NaN()), y);
  return y.to(at::kFloat8_e4m3fn);
}

}  // namespace aar::ops::cpu::mx
