// Regression tests for the defects the plan-layer fuzz targets (tests/fuzz/) found. Each test
// names its target; the crashing input is kept in tests/fuzz/corpus/<target>/ as well.
#include <vector>

#include <gtest/gtest.h>

#include "ascend_attn_rt/errors.h"
#include "ascend_attn_rt/plan/mla_plan.h"

using namespace aar::plan;

// fuzz_reorder: mla_reorder_batch wrote the identity into perm_out while it validated, so a
// negative num_scheduled after the first entry was rejected with perm_out half-written.
TEST(FuzzRegression, MlaReorderRejectsBeforeWritingPerm) {
  const std::vector<int32_t> sched = {1, 5, -1, 1};
  std::vector<int32_t> perm(4, -7), swaps(8, -7);
  EXPECT_THROW(mla_reorder_batch(sched, 1, perm, swaps), aar::InvalidArgument);
  EXPECT_EQ(perm, std::vector<int32_t>(4, -7));
  EXPECT_EQ(swaps, std::vector<int32_t>(8, -7));
}
