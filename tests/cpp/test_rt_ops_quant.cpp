// The quantisation and scatter operators of the sparse paths (issue 10)
// through their wrappers, against references written here:
// npu_scatter_nd_update_ (negative and out-of-range rows skipped, last write
// wins, strided views, any dtype), npu_dynamic_quant (values, round half to
// even, scale shapes, float8_e4m3fn), npu_dynamic_block_quant (per 128-column
// tile, partial tiles, scale shapes) and _C_ascend batch_matmul_transpose.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>

#include "ascend_attn_rt/errors.h"
#include "ascend_attn_rt/ops/batch_matmul_transpose.h"
#include "ascend_attn_rt/ops/quant.h"
#include "test_rt_ops_util.h"

namespace ops = aar::ops;
using namespace aar_test;

namespace {

at::Tensor i64(const std::vector<int64_t>& v) { return at::tensor(v, at::kLong); }

}  // namespace

// ---------------------------------------------------------------- scatter_nd_update_

TEST(RtOpsQuant, ScatterNdUpdateSkipsNegativeAndOutOfRangeRows) {
  at::manual_seed(1);
  const at::Tensor base = at::randn({6, 4});
  at::Tensor self = base.clone();
  const at::Tensor upd = at::randn({5, 4});
  // Rows: 2, -1 (dropped), 7 (out of range, dropped), 0, 2 again (the later row wins).
  at::Tensor& r = ops::scatter_nd_update_(self, i64({2, -1, 7, 0, 2}).view({5, 1}), upd);
  EXPECT_TRUE(r.is_same(self));
  at::Tensor want = base.clone();
  want[0].copy_(upd[3]);
  want[2].copy_(upd[4]);
  EXPECT_TRUE(at::equal(self, want));
}

TEST(RtOpsQuant, ScatterNdUpdateTwoDimIndicesUseTheLinearIndex) {
  // self (nb=3, bs=4, D=2) addressed by (block, offset): the A2/A3 encoding of
  // slot -1 is (-1, bs-1), linear index -1, dropped; (3, 0) is linear 12 = out of range.
  const at::Tensor base = at::arange(24, at::kFloat).view({3, 4, 2});
  at::Tensor self = base.clone();
  // (0, 5): offset beyond bs but linear index 5 in range: written at (1, 1), as a flattening kernel does.
  const at::Tensor idx = i64({1, 2, -1, 3, 2, 3, 3, 0, 0, 0, 0, 5}).view({6, 2});
  const at::Tensor upd = -at::arange(1, 13, at::kFloat).view({6, 2});
  ops::scatter_nd_update_(self, idx, upd);
  at::Tensor want = base.clone();
  want[1][2].copy_(upd[0]);
  want[2][3].copy_(upd[2]);
  want[0][0].copy_(upd[4]);
  want[1][1].copy_(upd[5]);
  EXPECT_TRUE(at::equal(self, want));
}

TEST(RtOpsQuant, ScatterNdUpdateAnyDtypeAndStridedViews) {
  // int8 rows (the C8 caches), int32 indices.
  at::Tensor c8 = at::zeros({4, 6}, at::kChar);
  ops::scatter_nd_update_(c8, at::tensor(std::vector<int32_t>{3, 1}, at::kInt).view({2, 1}),
                          at::full({2, 6}, 7, at::kChar));
  EXPECT_EQ(c8.sum().item<int64_t>(), 2 * 6 * 7);
  EXPECT_EQ(c8[3][0].item<int8_t>(), 7);
  EXPECT_EQ(c8[0][0].item<int8_t>(), 0);
  // bool
  at::Tensor b = at::zeros({3, 2}, at::kBool);
  ops::scatter_nd_update_(b, i64({1}).view({1, 1}), at::ones({1, 2}, at::kBool));
  EXPECT_EQ(b.sum().item<int64_t>(), 2);
  // A non-contiguous view (every other row of a transposed buffer) is written in place.
  at::Tensor buf = at::zeros({4, 10});
  at::Tensor view = buf.t().narrow(0, 1, 8).slice(0, 0, 8, 2);  // (4, 4), strides (2, 10)
  ASSERT_FALSE(view.is_contiguous());
  ops::scatter_nd_update_(view, i64({2, 0}).view({2, 1}), at::ones({2, 4}) * 3);
  EXPECT_EQ(buf.sum().item<float>(), 2 * 4 * 3);
  EXPECT_TRUE(at::all(view[2] == 3).item<bool>());
  EXPECT_TRUE(at::all(buf.t()[5] == 3).item<bool>());  // view row 2 = buf column 1 + 2*2
}

TEST(RtOpsQuant, ScatterNdUpdateRejectsBadInputBeforeWriting) {
  at::Tensor self = at::zeros({4, 3});
  expect_throw_with<aar::InvalidArgument>(
      [&] { ops::scatter_nd_update_(self, i64({0, 1}).view({2, 1}), at::ones({2, 4})); }, "updates");
  expect_throw_with<aar::InvalidArgument>(
      [&] { ops::scatter_nd_update_(self, i64({0, 1}).view({2, 1}), at::ones({2, 3}, at::kDouble)); }, "updates");
  expect_throw_with<aar::InvalidArgument>(
      [&] { ops::scatter_nd_update_(self, at::zeros({2, 1}), at::ones({2, 3})); }, "indices");
  expect_throw_with<aar::InvalidArgument>(
      [&] { ops::scatter_nd_update_(self, i64({0, 1, 2}).view({1, 3}), at::ones({1})); }, "indices");
  EXPECT_EQ(self.abs().sum().item<float>(), 0.0f);
}

// ---------------------------------------------------------------- dynamic_quant

TEST(RtOpsQuant, DynamicQuantValuesRoundHalfToEvenAndScaleShape) {
  // Row 0: amax 127 -> scale 1, so q = round-half-even(x): 0.5 -> 0, 1.5 -> 2, 2.5 -> 2, -2.5 -> -2.
  // Row 1: all zero -> scale 0, q 0.
  const at::Tensor x = at::tensor(std::vector<float>{127, 0.5, 1.5, 2.5, -2.5, -0.5, 3.5, -127,  //
                                                     0, 0, 0, 0, 0, 0, 0, 0},
                                  at::kFloat)
                           .view({2, 8});
  ops::DynamicQuantArgs a;
  a.input = x;
  const auto [q, scale] = ops::dynamic_quant(a);
  ASSERT_EQ(q.scalar_type(), at::kChar);
  ASSERT_EQ(scale.scalar_type(), at::kFloat);
  EXPECT_EQ(scale.sizes(), (c10::IntArrayRef{2}));
  EXPECT_TRUE(at::equal(q[0], at::tensor(std::vector<int8_t>{127, 0, 2, 2, -2, 0, 4, -127}, at::kChar)));
  EXPECT_TRUE(at::equal(q[1], at::zeros({8}, at::kChar)));
  EXPECT_EQ(scale[0].item<float>(), 1.0f);
  EXPECT_EQ(scale[1].item<float>(), 0.0f);
}

TEST(RtOpsQuant, DynamicQuantMatchesReferenceOnRandomRows) {
  at::manual_seed(2);
  for (const auto dtype : {at::kFloat, at::kHalf, at::kBFloat16}) {
    const at::Tensor x = (at::randn({3, 5, 64}) * 3).to(dtype);
    ops::DynamicQuantArgs a;
    a.input = x;
    const auto [q, scale] = ops::dynamic_quant(a);
    ASSERT_EQ(q.sizes(), x.sizes());
    ASSERT_EQ(scale.sizes(), (c10::IntArrayRef{3, 5}));  // input.shape[:-1]
    const at::Tensor xf = x.to(at::kFloat).view({15, 64}).contiguous();
    for (int64_t r = 0; r < 15; ++r) {
      float amax = 0;
      for (int64_t d = 0; d < 64; ++d) amax = std::max(amax, std::fabs(xf[r][d].item<float>()));
      const float s = amax / 127.0f;
      EXPECT_EQ(scale.view({15})[r].item<float>(), s);
      for (int64_t d = 0; d < 64; ++d) {
        const float want = std::nearbyint(xf[r][d].item<float>() / s);
        EXPECT_EQ(q.view({15, 64})[r][d].item<int8_t>(), static_cast<int8_t>(want)) << r << "," << d;
      }
    }
  }
}

TEST(RtOpsQuant, DynamicQuantFloat8E4m3) {
  at::manual_seed(4);
  const at::Tensor x = at::randn({4, 32});
  ops::DynamicQuantArgs a;
  a.input = x;
  a.dst_type = static_cast<int64_t>(at::kFloat8_e4m3fn);
  const auto [q, scale] = ops::dynamic_quant(a);
  ASSERT_EQ(q.scalar_type(), at::kFloat8_e4m3fn);
  const at::Tensor amax = x.abs().amax(-1);
  EXPECT_TRUE(at::allclose(scale, amax / 448.0f));
  const at::Tensor qf = q.to(at::kFloat);
  // The amax element maps to exactly +-448; every element is within e4m3's half-ulp (2^-4 relative).
  EXPECT_TRUE(at::allclose(qf.abs().amax(-1), at::full({4}, 448.0f)));
  const at::Tensor y = x / scale.unsqueeze(1);
  EXPECT_TRUE(at::all((qf - y).abs() <= y.abs() * (1.0 / 16) + 1e-3).item<bool>());
  a.dst_type_max = 448.0;
  EXPECT_NO_THROW(ops::dynamic_quant(a));
}

TEST(RtOpsQuant, DynamicQuantRejectsWhatTheTwinDoesNotImplement) {
  ops::DynamicQuantArgs a;
  a.input = at::randn({2, 16});
  auto run = [&](auto mutate) {
    ops::DynamicQuantArgs b = a;
    mutate(b);
    return [b] { ops::dynamic_quant(b); };
  };
  expect_throw_with<aar::NotSupported>(run([](auto& b) { b.smooth_scales = at::ones({16}); }), "smooth_scales");
  expect_throw_with<aar::NotSupported>(run([](auto& b) { b.group_index = at::ones({1}, at::kInt); }), "group_index");
  expect_throw_with<aar::NotSupported>(run([](auto& b) { b.dst_type = 16; }), "dst_type=16");
  expect_throw_with<aar::NotSupported>(run([](auto& b) { b.quant_mode = "pertensor"; }), "quant_mode");
  expect_throw_with<aar::NotSupported>(run([](auto& b) { b.dst_type_max = 100.0; }), "dst_type_max");
  expect_throw_with<aar::InvalidArgument>(run([](auto& b) { b.input = at::randn({16}); }), "input");
  expect_throw_with<aar::InvalidArgument>(run([](auto& b) { b.input = at::ones({2, 16}, at::kInt); }), "input");
  EXPECT_NO_THROW(run([](auto& b) { b.dst_type = 1; })());  // int8, spelled out
}

// ---------------------------------------------------------------- dynamic_block_quant

TEST(RtOpsQuant, DynamicBlockQuantPerTileWithPartialTiles) {
  at::manual_seed(6);
  for (const auto dtype : {at::kFloat, at::kBFloat16}) {
    at::Tensor x = (at::randn({3, 300}) * 2).to(dtype);
    x[1].narrow(0, 128, 128).zero_();  // an all-zero tile
    const auto [y, scale] = ops::dynamic_block_quant(x, 1, 128);
    ASSERT_EQ(y.scalar_type(), at::kChar);
    ASSERT_EQ(y.sizes(), x.sizes());
    ASSERT_EQ(scale.scalar_type(), at::kFloat);
    ASSERT_EQ(scale.sizes(), (c10::IntArrayRef{3, 3}));  // ceil(300 / 128) tiles per row
    const at::Tensor xf = x.to(at::kFloat).contiguous();
    for (int64_t r = 0; r < 3; ++r) {
      for (int64_t tile = 0; tile < 3; ++tile) {
        const int64_t c0 = tile * 128, c1 = std::min<int64_t>(c0 + 128, 300);
        float amax = 0;
        for (int64_t c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(xf[r][c].item<float>()));
        const float s = amax / 127.0f;
        EXPECT_EQ(scale[r][tile].item<float>(), s);
        for (int64_t c = c0; c < c1; ++c) {
          const float want = s == 0 ? 0.0f : std::nearbyint(xf[r][c].item<float>() / s);
          ASSERT_EQ(y[r][c].item<int8_t>(), static_cast<int8_t>(want)) << r << "," << c;
        }
      }
    }
  }
  // Round half to even inside a tile whose amax is 127 (scale 1).
  at::Tensor h = at::zeros({1, 128});
  h[0][0] = 127.0f;
  h[0][1] = 0.5f;
  h[0][2] = 1.5f;
  h[0][3] = 2.5f;
  h[0][4] = -2.5f;
  const at::Tensor yh = std::get<0>(ops::dynamic_block_quant(h, 1, 128));
  EXPECT_TRUE(at::equal(yh[0].narrow(0, 0, 5), at::tensor(std::vector<int8_t>{127, 0, 2, 2, -2}, at::kChar)));
  // 3-D, as the SFA C8 path calls it: (B, 1, 512) -> scale (B, 1, 4).
  const auto [y3, s3] = ops::dynamic_block_quant(at::randn({5, 1, 512}), 1, 128);
  EXPECT_EQ(y3.sizes(), (c10::IntArrayRef{5, 1, 512}));
  EXPECT_EQ(s3.sizes(), (c10::IntArrayRef{5, 1, 4}));
}

TEST(RtOpsQuant, DynamicBlockQuantRejectsWhatTheTwinDoesNotImplement) {
  const at::Tensor x = at::randn({2, 256});
  expect_throw_with<aar::NotSupported>([&] { ops::dynamic_block_quant(x, 2, 128); }, "row_block_size=2");
  expect_throw_with<aar::NotSupported>([&] { ops::dynamic_block_quant(x, 1, 64); }, "col_block_size=64");
  expect_throw_with<aar::NotSupported>([&] { ops::dynamic_block_quant(x, 1, 128, 2); }, "dst_type=2");
  expect_throw_with<aar::NotSupported>([&] { ops::dynamic_block_quant(x, 1, 128, 1, 0.5); }, "min_scale");
  expect_throw_with<aar::NotSupported>([&] { ops::dynamic_block_quant(x, 1, 128, 1, 0.0, "round"); }, "round_mode");
  expect_throw_with<aar::NotSupported>([&] { ops::dynamic_block_quant(x, 1, 128, 1, 0.0, "rint", 448.0); },
                                       "dst_type_max");
  expect_throw_with<aar::InvalidArgument>([&] { ops::dynamic_block_quant(at::randn({256}), 1, 128); }, "x must be");
}

// ---------------------------------------------------------------- batch_matmul_transpose

TEST(RtOpsQuant, BatchMatmulTransposeMatchesFloat64AndWritesInPlace) {
  at::manual_seed(8);
  for (const auto dtype : {at::kFloat, at::kBFloat16}) {
    const at::Tensor a = at::randn({5, 3, 16}).to(dtype), b = at::randn({3, 16, 8}).to(dtype);
    // c is a non-contiguous view into a larger buffer.
    at::Tensor buf = at::zeros({5, 3, 20}, dtype);
    at::Tensor c = buf.narrow(2, 4, 8);
    ASSERT_FALSE(c.is_contiguous());
    ops::batch_matmul_transpose(a, b, c);
    at::Tensor want = at::zeros({5, 3, 8}, at::kDouble);
    for (int64_t t = 0; t < 5; ++t) {
      for (int64_t n = 0; n < 3; ++n) want[t][n] = at::matmul(a[t][n].to(at::kDouble), b[n].to(at::kDouble));
    }
    expect_close(c, want, tol_for(dtype), "batch_matmul_transpose");
    EXPECT_EQ(buf.narrow(2, 0, 4).abs().sum().item<float>(), 0.0f);  // nothing outside the view
  }
  const at::Tensor a = at::randn({2, 3, 4}), b = at::randn({3, 4, 5});
  at::Tensor c = at::zeros({2, 3, 5});
  expect_throw_with<aar::NotSupported>([&] { ops::batch_matmul_transpose(a, b, c, "NZ"); }, "format_mode");
  expect_throw_with<aar::NotSupported>([&] { ops::batch_matmul_transpose(a, b, c, std::nullopt, "w8a8"); },
                                       "quant_mode");
  at::Tensor bad = at::zeros({2, 3, 4});
  expect_throw_with<aar::InvalidArgument>([&] { ops::batch_matmul_transpose(a, b, bad); }, "tensor_c");
  expect_throw_with<aar::InvalidArgument>([&] { ops::batch_matmul_transpose(a, at::randn({3, 5, 5}), c); },
                                          "tensor_b");
}
