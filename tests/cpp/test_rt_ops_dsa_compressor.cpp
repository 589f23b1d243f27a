// The DSA compressor operators (issue 12) through their typed wrappers
// (ascend_attn_rt/ops/dsa_compressor.h): the CPU twin on CPU tensors by
// default, the no-compute provider on request, results against small cases
// whose answers are known in closed form (the float64 references over many
// configurations live in tests/python/test_dsa_compressor_ops.py), and the
// wrappers' own argument checks.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>

#include "ascend_attn_rt/errors.h"
#include "ascend_attn_rt/ops/dsa_compressor.h"
#include "test_rt_ops_util.h"

namespace ops = aar::ops;
using namespace aar_test;

namespace {

at::Tensor i32(const std::vector<int64_t>& v) {
  std::vector<int32_t> w(v.begin(), v.end());
  return at::tensor(w, at::kInt);
}

// A compressor case whose rows are known: kv_t = v for every token (x_t = [1 | noise],
// W_kv = [v | 0]), so every softmax-weighted sum is v whatever the scores, and the
// row is v / rms(v) * norm_weight (cos 1, sin 0: the rope is the identity).
struct ConstCase {
  int64_t d = 8, h = 5, r = 4, coff = 2;
  at::Tensor v = at::arange(1, 9, at::kFloat);
  ops::CompressorArgs args(int64_t tokens, const at::Tensor& state) const {
    ops::CompressorArgs a;
    a.x = at::randn({tokens, h});
    a.x.select(1, 0).fill_(1.0);
    a.wkv = at::zeros({coff * d, h});
    for (int64_t k = 0; k < coff; ++k) a.wkv.narrow(0, k * d, d).select(1, 0).copy_(v);
    a.wgate = at::randn({coff * d, h});
    a.state_cache = state;
    a.ape = at::randn({r, coff * d});
    a.norm_weight = at::full({d}, 2.0f);
    const int64_t rows = std::min(tokens, tokens / r + 1);
    a.rope_cos = at::ones({rows, 1, 1, 4});
    a.rope_sin = at::zeros({rows, 1, 1, 4});
    a.state_block_table = i32({3, 0, 1}).view({1, 3});
    a.cu_seqlens = i32({0, tokens});
    a.start_pos = i32({0});
    a.rope_head_dim = 4;
    a.cmp_ratio = r;
    a.coff = coff;
    a.norm_eps = 0.0;
    return a;
  }
  at::Tensor row() const { return v / std::sqrt(v.pow(2).mean().item<double>()) * 2.0; }
};

}  // namespace

TEST(RtOpsDsaCompressor, CompressorThroughTheWrapperOnCpu) {
  const ConstCase k;
  at::Tensor state = at::zeros({4, 4, 2 * k.coff * k.d});
  const at::Tensor out = ops::compressor(k.args(10, state));
  ASSERT_EQ(out.sizes(), (at::IntArrayRef{3, 8}));  // min(10, 10 // 4 + 1)
  EXPECT_TRUE(at::allclose(out[0], k.row(), 1e-5, 1e-5));
  EXPECT_TRUE(at::allclose(out[1], k.row(), 1e-5, 1e-5));
  EXPECT_EQ(at::count_nonzero(out[2]).item<int64_t>(), 0);  // padding
  // Position p at block table[p // 4], row p % 4: positions 0..9 -> blocks 3, 0, 1; block 2 untouched.
  EXPECT_TRUE(at::allclose(state[3][1].narrow(0, 0, 8), k.v));
  EXPECT_TRUE(at::allclose(state[1][1].narrow(0, 8, 8), k.v));
  EXPECT_EQ(at::count_nonzero(state[2]).item<int64_t>(), 0);
  EXPECT_EQ(at::count_nonzero(state[1][2]).item<int64_t>(), 0);  // position 10 not processed
}

TEST(RtOpsDsaCompressor, NoComputeProviderShapesOnly) {
  const ConstCase k;
  at::Tensor state = at::zeros({4, 4, 2 * k.coff * k.d});
  const at::Tensor out = ops::compressor(k.args(10, state), ops::Provider::NoCompute);
  EXPECT_EQ(out.sizes(), (at::IntArrayRef{3, 8}));
  EXPECT_EQ(at::count_nonzero(state).item<int64_t>(), 0);
  ops::CompressorMetadataArgs m;
  m.rope_cos = at::randn({64, 4});
  m.rope_sin = at::randn({64, 4});
  m.cu_seqlens = i32({0, 8});
  m.start_pos = i32({0});
  m.kv_block_table = i32({1}).view({1, 1});
  m.num_reqs_actual = 1;
  {
    ops::ProviderOverride po(ops::Provider::NoCompute);
    auto [c, s, sl] = ops::compressor_metadata(m, 5);
    EXPECT_EQ(c.sizes(), (at::IntArrayRef{5, 1, 1, 4}));
    EXPECT_EQ(sl.sizes(), (at::IntArrayRef{5, 2}));
  }
}

TEST(RtOpsDsaCompressor, MetadataSpecExampleInBothFormats) {
  // docs/design/ops.md §4.6: C4, start 508, q 8, table [10, 11], storage block size 128 -> (10, 127), (11, 0).
  ops::CompressorMetadataArgs m;
  m.rope_cos = at::arange(4096 * 2, at::kFloat).view({4096, 2});
  m.rope_sin = -m.rope_cos;
  m.cu_seqlens = i32({0, 8});
  m.start_pos = i32({508});
  m.kv_block_table = at::tensor(std::vector<int32_t>{10, 11}, at::kInt).view({1, 2});
  m.kv_block_size = 128;
  m.compress_ratio = 4;
  m.num_reqs_actual = 1;
  auto [c, s, sl] = ops::compressor_metadata(m, 3);
  EXPECT_TRUE(at::equal(sl, at::tensor(std::vector<int32_t>{10, 127, 11, 0, -1, 127}, at::kInt).view({3, 2})));
  EXPECT_TRUE(at::equal(c[0].flatten(), m.rope_cos[127 * 4]));
  EXPECT_TRUE(at::equal(s[1].flatten(), m.rope_sin[128 * 4]));
  EXPECT_TRUE(at::equal(c[2].flatten(), at::ones({2})));
  m.slot_mapping_format = ops::CompressedSlotFormat::Flat;
  at::Tensor oc = at::empty({3, 1, 1, 2}), os = at::empty({3, 1, 1, 2}), osl = at::empty({3}, at::kInt);
  ops::compressor_metadata_out(m, oc, os, osl);
  EXPECT_TRUE(at::equal(osl, at::tensor(std::vector<int32_t>{10 * 128 + 127, 11 * 128, -1}, at::kInt)));
  EXPECT_TRUE(at::equal(oc, c));
}

TEST(RtOpsDsaCompressor, EpilogsThroughTheWrappers) {
  // kv_compress_epilog: a row of 1.0 nope (amax 1 -> e = ceil(log2(1/448)) = -8, fp8 1 * 2^8 = 256) and a
  // bf16 rope copied verbatim; slot -1 skipped.
  ops::KvCompressEpilogArgs k;
  k.kv_compress_cache = at::zeros({4, 1, 640}, at::kByte);
  k.x = at::ones({2, 512}, at::kBFloat16);
  k.x.narrow(1, 448, 64).fill_(-3.5);
  k.slot_mapping = i32({2, -1});
  ops::kv_compress_epilog(k);
  const at::Tensor row = k.kv_compress_cache[2][0];
  EXPECT_EQ(row[576].item<uint8_t>(), 127 - 8);
  EXPECT_EQ(row.narrow(0, 0, 448).view(at::kFloat8_e4m3fn).to(at::kFloat)[0].item<float>(), 256.0f);
  EXPECT_TRUE(at::equal(row.narrow(0, 448, 128).view(at::kBFloat16), k.x[0].narrow(0, 448, 64)));
  EXPECT_EQ(at::count_nonzero(k.kv_compress_cache[0]).item<int64_t>(), 0);
  // indexer_compress_epilog_v2: scale = amax / 448, k at page offset row * Di, scale at bs * Di + row * 4.
  ops::IndexerCompressEpilogArgs ix;
  ix.indexer_compress_cache = at::zeros({2, 4, 1, 132}, at::kByte);
  ix.x = at::full({1, 128}, 0.5f);
  ix.x[0][3] = -7.0f;
  ix.slot_mapping = i32({6});
  ops::indexer_compress_epilog_v2(ix);
  const at::Tensor page = ix.indexer_compress_cache[1].flatten();
  EXPECT_FLOAT_EQ(page.narrow(0, 4 * 128 + 2 * 4, 4).view(at::kFloat).item<float>(), 7.0f / 448.0f);
  EXPECT_EQ(page.narrow(0, 2 * 128, 128).view(at::kFloat8_e4m3fn).to(at::kFloat)[3].item<float>(), -448.0f);
  EXPECT_EQ(at::count_nonzero(ix.indexer_compress_cache[0]).item<int64_t>(), 0);
}

TEST(RtOpsDsaCompressor, BadInputIsRejectedByName) {
  const ConstCase k;
  at::Tensor state = at::zeros({4, 4, 2 * k.coff * k.d});
  ops::CompressorArgs a = k.args(10, state);
  a.state_block_table = i32({3, 0, 9}).view({1, 3});
  expect_throw_with<aar::InvalidArgument>([&] { ops::compressor(a); }, "state_block_table");
  EXPECT_EQ(at::count_nonzero(state).item<int64_t>(), 0);
  a = k.args(10, state);
  a.rotary_mode = 1;
  expect_throw_with<aar::NotSupported>([&] { ops::compressor(a); }, "rotary_mode");
  ops::CompressorMetadataArgs m;
  m.rope_cos = at::zeros({8, 4});
  m.rope_sin = at::zeros({8, 4});
  m.cu_seqlens = i32({0, 1});
  m.start_pos = i32({0});
  m.kv_block_table = i32({0}).view({1, 1});
  m.slot_mapping_format = static_cast<ops::CompressedSlotFormat>(3);
  expect_throw_with<aar::InvalidArgument>([&] { ops::compressor_metadata(m, 1); }, "slot_mapping_format");
}
