// SparseFlashMla (docs/design/dsa.md §4.2) through its typed wrappers, and the
// sharedkv -> SparseFlashMla adapter: the renames, the derived compressed
// lengths against brute-force values, the dropped arguments, and the same
// output as the sharedkv twin on the same paged cache. The twins' maths is
// checked in tests/python/test_dsa_flashmla.py against a float64 reference.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "ascend_attn_rt/errors.h"
#include "ascend_attn_rt/ops/sparse_attn_sharedkv.h"
#include "ascend_attn_rt/ops/sparse_flash_mla.h"

namespace ops = aar::ops;

namespace {

at::Tensor i32(std::vector<int32_t> v) { return at::tensor(v, at::kInt); }

template <class F>
void expect_error_naming(F&& f, const std::string& what) {
  try {
    f();
    FAIL() << "no error, expected one naming " << what;
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
  }
}

// Two requests (S = 9, 6), block size 4, ratio 4: a C128-style layer (all visible compressed rows).
ops::SparseAttnSharedKvArgs compressed_case() {
  at::manual_seed(3);
  ops::SparseAttnSharedKvArgs a;
  a.q = at::randn({3, 2, 8}).to(at::kBFloat16);
  a.ori_kv = at::randn({5, 4, 1, 8}).to(at::kBFloat16);
  a.cmp_kv = at::randn({3, 2, 1, 8}).to(at::kBFloat16);
  a.ori_block_table = i32({3, 0, 4, 1, 2, 0}).view({2, 3});
  a.cmp_block_table = i32({2, 1}).view({2, 1});
  a.cu_seqlens_q = i32({0, 2, 3});
  a.seqused_kv = i32({9, 6});
  a.sinks = at::zeros({2});
  a.softmax_scale = 0.3;
  a.cmp_ratio = 4;
  a.ori_win_left = 3;
  a.layout_kv = "PA_ND";
  return a;
}

}  // namespace

TEST(RtOpsSparseFlashMla, CmpLengthTensorsMatchBruteForce) {
  const std::vector<int32_t> S = {0, 1, 3, 4, 5, 127, 128, 129, 1000};
  for (int64_t r : {2, 4, 128}) {
    const auto c = ops::flash_mla_cmp_length_tensors(i32(S), r);
    ASSERT_EQ(c.seqused_cmp_kv.scalar_type(), at::kInt);
    for (size_t b = 0; b < S.size(); ++b) {
      int64_t full = 0;  // whole groups of r raw tokens, counted one by one
      while ((full + 1) * r <= S[b]) ++full;
      EXPECT_EQ(c.seqused_cmp_kv[b].item<int32_t>(), full) << "r=" << r << " S=" << S[b];
      EXPECT_EQ(c.cmp_residual_kv[b].item<int32_t>(), S[b] - full * r);
    }
  }
  expect_error_naming([] { ops::flash_mla_cmp_length_tensors(i32({4}), 1); }, "cmp_ratio");
  expect_error_naming([] { ops::flash_mla_cmp_length_tensors(at::tensor({4L}), 4); }, "seqused_kv");
}

TEST(RtOpsSparseFlashMla, AdapterRenamesDerivesAndMatchesTheSharedKvTwin) {
  ops::SparseAttnSharedKvArgs a = compressed_case();
  const auto cmp = ops::flash_mla_cmp_length_tensors(*a.seqused_kv, a.cmp_ratio);
  const ops::SparseFlashMlaArgs f = ops::to_sparse_flash_mla_args(a, cmp);
  EXPECT_EQ(f.layout_kv, "PA_BBND");
  EXPECT_TRUE(f.seqused_ori_kv->equal(*a.seqused_kv));
  EXPECT_TRUE(f.seqused_cmp_kv->equal(i32({2, 1})));
  EXPECT_TRUE(f.cmp_residual_kv->equal(i32({1, 2})));
  EXPECT_EQ(f.cmp_ratio, 4);
  auto [o1, l1] = ops::sparse_flash_mla(f);
  auto [o2, l2] = ops::sparse_attn_sharedkv(a);
  EXPECT_TRUE(o1.equal(o2));
  EXPECT_EQ(l1.dim(), 0);  // the placeholder without return_softmax_lse
  // A compressed layer without the derived lengths is refused by name.
  expect_error_naming([&] { ops::to_sparse_flash_mla_args(a); }, "cmp_residual_kv");
  ops::SparseAttnSharedKvArgs bad = a;
  bad.layout_kv = "BSND";
  expect_error_naming([&] { ops::to_sparse_flash_mla_args(bad, cmp); }, "layout_kv=\"BSND\"");
  // SWA layer: cmp_ratio 0 -> 1, no compressed lengths.
  ops::SparseAttnSharedKvArgs swa = a;
  swa.cmp_kv.reset();
  swa.cmp_block_table.reset();
  swa.cmp_ratio = 0;
  const ops::SparseFlashMlaArgs fs = ops::to_sparse_flash_mla_args(swa);
  EXPECT_EQ(fs.cmp_ratio, 1);
  EXPECT_FALSE(fs.seqused_cmp_kv.has_value());
  swa.cmp_ratio = 1;
  EXPECT_TRUE(std::get<0>(ops::sparse_flash_mla(fs)).equal(std::get<0>(ops::sparse_attn_sharedkv(swa))));
}

TEST(RtOpsSparseFlashMla, MetadataAdapterRenamesDropsAndDerivesMax) {
  ops::SparseAttnSharedKvMetadataArgs m;
  m.num_heads_q = 2;
  m.cu_seqlens_q = i32({0, 2, 3});
  m.seqused_kv = i32({9, 6});
  m.batch_size = 2;
  m.max_seqlen_q = 2;
  m.max_seqlen_kv = 9;
  m.cmp_ratio = 4;
  m.layout_kv = "PA_ND";
  m.device = "npu";  // dropped: SparseFlashMla has no device argument
  const auto cmp = ops::flash_mla_cmp_length_tensors(*m.seqused_kv, 4);
  const ops::SparseFlashMlaMetadataArgs f = ops::to_sparse_flash_mla_metadata_args(m, cmp);
  EXPECT_EQ(f.max_seqlen_ori_kv, 9);
  EXPECT_EQ(f.max_seqlen_cmp_kv, 2);  // 9 // 4
  EXPECT_EQ(*f.layout_kv, "PA_BBND");
  EXPECT_TRUE(f.seqused_ori_kv->equal(i32({9, 6})));
  const at::Tensor blob = ops::sparse_flash_mla_metadata(f);
  ASSERT_EQ(blob.numel(), 1024);
  EXPECT_EQ(blob[7].item<int32_t>(), 9);
  EXPECT_EQ(blob[8].item<int32_t>(), 2);
  EXPECT_EQ(blob[19].item<int32_t>(), 15);
  EXPECT_EQ(blob[20].item<int32_t>(), 3);
  // No-compute provider: shapes only.
  EXPECT_EQ(ops::sparse_flash_mla_metadata(f, ops::Provider::NoCompute).numel(), 1024);
}
