// Sylvester Hadamard matrices (docs/design/sparse.md §3): the recursive definition,
// orthogonality, DSV4's padded size, bad input before any write.
#include <cmath>
#include <vector>

#include "ascend_attn_rt/plan/hadamard.h"
#include "test_plan_util.h"

using namespace aar::plan;

namespace {
// H_1 = [1], H_2n = [[H, H], [H, -H]]: the definition, independent of the bit formula.
std::vector<int> sylvester(int64_t n) {
  std::vector<int> h = {1};
  for (int64_t m = 1; m < n; m *= 2) {
    std::vector<int> g(4 * m * m);
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < m; ++j) {
        const int v = h[i * m + j];
        g[i * 2 * m + j] = v;
        g[i * 2 * m + j + m] = v;
        g[(i + m) * 2 * m + j] = v;
        g[(i + m) * 2 * m + j + m] = -v;
      }
    }
    h.swap(g);
  }
  return h;
}
}  // namespace

TEST(PlanHadamard, MatchesTheRecursiveConstruction) {
  for (int64_t n : {1, 2, 4, 8, 64, 128}) {
    std::vector<float> out(n * n, 99.f);
    fill_hadamard(n, 0.5, out);
    const std::vector<int> ref = sylvester(n);
    for (int64_t k = 0; k < n * n; ++k) ASSERT_EQ(out[k], 0.5f * ref[k]) << "n=" << n << " k=" << k;
  }
}

TEST(PlanHadamard, NormalisedIsOrthogonalAndSymmetric) {
  const int64_t n = 128;
  std::vector<float> h(n * n);
  fill_hadamard(n, 1.0 / std::sqrt(static_cast<double>(n)), h);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      ASSERT_EQ(h[i * n + j], h[j * n + i]);
      double dot = 0;
      for (int64_t k = 0; k < n; ++k) dot += static_cast<double>(h[i * n + k]) * h[j * n + k];
      ASSERT_NEAR(dot, i == j ? 1.0 : 0.0, 1e-6) << i << "," << j;
    }
  }
}

TEST(PlanHadamard, SizeAndBadInput) {
  EXPECT_EQ(hadamard_size(1), 1);
  EXPECT_EQ(hadamard_size(100), 128);
  EXPECT_EQ(hadamard_size(128), 128);
  EXPECT_EQ(hadamard_size(129), 256);
  EXPECT_TRUE(is_power_of_two(64));
  EXPECT_FALSE(is_power_of_two(96));
  EXPECT_FALSE(is_power_of_two(0));
  EXPECT_INVALID(hadamard_size(0), "d must be");
  std::vector<float> out(16, 7.f);
  EXPECT_INVALID(fill_hadamard(3, 1.0, out), "got 3");
  EXPECT_INVALID(fill_hadamard(8, 1.0, out), "needs n*n=64");
  for (float v : out) EXPECT_EQ(v, 7.f);  // nothing written
}
