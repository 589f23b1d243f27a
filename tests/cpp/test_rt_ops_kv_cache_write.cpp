// npu_scatter_pa_kv_cache ("Norm" and "PA_NZ") and _npu_reshape_and_cache twins.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "ascend_attn_rt/errors.h"
#include "ascend_attn_rt/ops/kv_cache_write.h"
#include "test_rt_ops_util.h"

namespace ops = aar::ops;
using namespace aar_test;

namespace {

// Expected ND caches computed with plain per-token loops.
void expect_nd_written(const at::Tensor& before, const at::Tensor& after, const at::Tensor& src,
                       const std::vector<int64_t>& slots) {
  at::Tensor want = before.clone();
  const int64_t bs = before.size(1);
  for (size_t t = 0; t < slots.size(); ++t) {
    if (slots[t] < 0) continue;
    want[slots[t] / bs][slots[t] % bs].copy_(src[t]);
  }
  EXPECT_TRUE(at::equal(after, want));
}

}  // namespace

TEST(RtOpsKvCacheWrite, ScatterNormSkipsNegativeSlots) {
  for (auto dt : {at::kFloat, at::kBFloat16}) {
    at::manual_seed(1);
    const int64_t nb = 6, bs = 16, nkv = 2, d = 8;
    at::Tensor kc = at::randn({nb, bs, nkv, d}).to(dt), vc = at::randn({nb, bs, nkv, d}).to(dt);
    const at::Tensor kc0 = kc.clone(), vc0 = vc.clone();
    const std::vector<int64_t> slots{0, -1, 17, 95, -1, 40};
    const at::Tensor key = at::randn({6, nkv, d}).to(dt), value = at::randn({6, nkv, d}).to(dt);
    for (auto sdt : {at::kInt, at::kLong}) {
      at::Tensor k = kc0.clone(), v = vc0.clone();
      ops::scatter_pa_kv_cache(key, value, k, v, at::tensor(slots, at::kLong).to(sdt), "Norm");
      expect_nd_written(kc0, k, key, slots);
      expect_nd_written(vc0, v, value, slots);
    }
  }
}

TEST(RtOpsKvCacheWrite, ScatterRejectsOutOfRangeSlotWithoutWriting) {
  const int64_t nb = 2, bs = 16;
  at::Tensor kc = at::randn({nb, bs, 2, 8}), vc = at::randn({nb, bs, 2, 8});
  const at::Tensor kc0 = kc.clone(), vc0 = vc.clone();
  const at::Tensor key = at::randn({3, 2, 8}), value = at::randn({3, 2, 8});
  // The valid slots 0 and 1 come first: a half-written cache would show.
  const at::Tensor slots = at::tensor(std::vector<int64_t>{0, 1, 32}, at::kInt);
  expect_throw_with<aar::InvalidArgument>([&] { ops::scatter_pa_kv_cache(key, value, kc, vc, slots, "Norm"); },
                                          "slot_mapping[2]=32");
  EXPECT_TRUE(at::equal(kc, kc0));
  EXPECT_TRUE(at::equal(vc, vc0));
  expect_throw_with<aar::InvalidArgument>([&] { ops::reshape_and_cache(key, value, kc, vc, slots); },
                                          "slot_indices[2]=32");
  EXPECT_TRUE(at::equal(kc, kc0));
  EXPECT_TRUE(at::equal(vc, vc0));
}

TEST(RtOpsKvCacheWrite, ScatterRejectsDtypeAndShapeMismatch) {
  at::Tensor kc = at::zeros({2, 16, 2, 8}), vc = at::zeros({2, 16, 2, 8});
  const at::Tensor slots = at::tensor(std::vector<int64_t>{0}, at::kInt);
  expect_throw_with<aar::InvalidArgument>(
      [&] { ops::scatter_pa_kv_cache(at::zeros({1, 2, 8}, at::kHalf), at::zeros({1, 2, 8}), kc, vc, slots, "Norm"); },
      "key dtype");
  expect_throw_with<aar::InvalidArgument>(
      [&] { ops::scatter_pa_kv_cache(at::zeros({1, 4, 8}), at::zeros({1, 2, 8}), kc, vc, slots, "Norm"); },
      "per-slot shape");
  expect_throw_with<aar::InvalidArgument>(
      [&] { ops::scatter_pa_kv_cache(at::zeros({2, 2, 8}), at::zeros({2, 2, 8}), kc, vc, slots, "Norm"); },
      "one row per");
  expect_throw_with<aar::NotSupported>(
      [&] { ops::scatter_pa_kv_cache(at::zeros({1, 2, 8}), at::zeros({1, 2, 8}), kc, vc, slots, "Weird"); },
      "cache_mode=\"Weird\"");
}

TEST(RtOpsKvCacheWrite, ScatterPaNzFiveDimCache) {
  for (auto dt : {at::kHalf, at::kChar}) {
    at::manual_seed(2);
    const int64_t nb = 3, bs = 16, nkv = 2, d = 64;
    const int64_t c = dt == at::kChar ? 32 : 16;
    auto rnd = [&](c10::IntArrayRef shape) {
      return dt == at::kChar ? at::randint(-100, 100, shape, at::kChar) : at::randn(shape).to(dt);
    };
    at::Tensor kc = rnd({nb, nkv, d / c, bs, c}), vc = rnd({nb, nkv, d / c, bs, c});
    const at::Tensor kc0 = kc.clone();
    const std::vector<int64_t> slots{5, -1, 47, 16};
    const at::Tensor key = rnd({4, nkv, d}), value = rnd({4, nkv, d});
    ops::scatter_pa_kv_cache(key, value, kc, vc, at::tensor(slots, at::kInt), "PA_NZ");
    // cache5[s / bs, h, d / c, s % bs, d % c] = key[t, h, d]
    at::Tensor want = kc0.clone();
    for (size_t t = 0; t < slots.size(); ++t) {
      if (slots[t] < 0) continue;
      for (int64_t h = 0; h < nkv; ++h)
        for (int64_t x = 0; x < d; ++x)
          want[slots[t] / bs][h][x / c][slots[t] % bs][x % c] = key[t][h][x];
    }
    EXPECT_TRUE(at::equal(kc, want)) << dt;
    EXPECT_TRUE(at::equal(vc.permute({0, 3, 1, 2, 4}).reshape({nb * bs, nkv, d})[47], value[2])) << dt;
  }
}


TEST(RtOpsKvCacheWrite, ReshapeAndCacheMatchesNorm) {
  at::manual_seed(3);
  at::Tensor kc = at::randn({4, 128, 1, 16}, at::kFloat), vc = at::randn({4, 128, 1, 16});
  const at::Tensor kc0 = kc.clone(), vc0 = vc.clone();
  const std::vector<int64_t> slots{511, 0, -1, 128};
  const at::Tensor key = at::randn({4, 1, 16}), value = at::randn({4, 1, 16});
  ops::reshape_and_cache(key, value, kc, vc, at::tensor(slots, at::kInt));
  expect_nd_written(kc0, kc, key, slots);
  expect_nd_written(vc0, vc, value, slots);
}
