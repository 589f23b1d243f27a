// Sylvester Hadamard matrices (docs/design/sparse.md §3).
#include "ascend_attn_rt/plan/hadamard.h"

#include "ascend_attn_rt/errors.h"

namespace aar::plan {

int64_t hadamard_size(int64_t d) {
  AAR_CHECK_ARG(d >= 1 && d <= (int64_t{1} << 30), "hadamard_size: d must be in [1, 2^30], got ", d);
  int64_t n = 1;
  while (n < d) n <<= 1;
  return n;
}

void fill_hadamard(int64_t n, double scale, Span<float> out) {
  AAR_CHECK_ARG(is_power_of_two(n) && n <= (int64_t{1} << 15), "fill_hadamard: n must be a power of two in [1, ",
                int64_t{1} << 15, "] (Sylvester's construction), got ", n);
  const std::size_t nn = static_cast<std::size_t>(n) * static_cast<std::size_t>(n);
  AAR_CHECK_ARG(out.size() >= nn, "fill_hadamard: out has room for ", out.size(), " entries, needs n*n=", nn);
  const float pos = static_cast<float>(scale), neg = -pos;
  for (uint64_t i = 0; i < static_cast<uint64_t>(n); ++i) {
    float* row = out.data() + i * static_cast<uint64_t>(n);
    for (uint64_t j = 0; j < static_cast<uint64_t>(n); ++j) row[j] = hadamard_sign(i, j) > 0 ? pos : neg;
  }
}

}  // namespace aar::plan
