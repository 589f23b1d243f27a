// The DeepSeek-V4 (DSA) operators (issue 12) through their typed wrappers: the
// provider follows the tensors' device (CPU twin, or the no-compute kernels on
// meta tensors) or an explicit / process-wide override; small cases checked
// against values computed here by hand (the twins' maths is tested in
// tests/python/test_dsa_ops.py against float64 references).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>

#include "ascend_attn_rt/errors.h"
#include "ascend_attn_rt/ops/dsa_inplace_ops.h"
#include "ascend_attn_rt/ops/lightning_indexer.h"
#include "ascend_attn_rt/ops/out_variants.h"
#include "ascend_attn_rt/ops/provider.h"
#include "ascend_attn_rt/ops/sparse_attn_sharedkv.h"

namespace ops = aar::ops;

namespace {

at::Tensor i32(std::vector<int32_t> v) { return at::tensor(v, at::kInt); }

// One request, S = 3, one query row (p = 2), window left 1: keys at positions 1 and 2.
ops::SparseAttnSharedKvArgs tiny(at::Tensor& cache) {
  cache = at::zeros({2, 2, 1, 2});  // block size 2; the table maps positions 0-1 -> block 1, 2 -> block 0
  cache[1][0][0] = at::tensor({9.0f, 9.0f});  // position 0: outside the window
  cache[1][1][0] = at::tensor({1.0f, 0.0f});  // position 1
  cache[0][0][0] = at::tensor({0.0f, 1.0f});  // position 2
  ops::SparseAttnSharedKvArgs a;
  a.q = at::tensor({1.0f, 0.0f}).view({1, 1, 2});
  a.ori_kv = cache;
  a.ori_block_table = i32({1, 0}).view({1, 2});
  a.cu_seqlens_q = i32({0, 1});
  a.seqused_kv = i32({3});
  a.softmax_scale = 1.0;
  a.ori_win_left = 1;
  a.cmp_ratio = 1;
  a.return_softmax_lse = true;
  return a;
}

TEST(RtOpsDsa, SharedKvAttentionThroughTheWrapper) {
  at::Tensor cache;
  ops::SparseAttnSharedKvArgs a = tiny(cache);
  // logits (1, 0); out = (e * [1, 0] + 1 * [0, 1]) / (e + 1); lse = log(e + 1).
  const double e = std::exp(1.0);
  auto [out, lse] = ops::sparse_attn_sharedkv(a);
  ASSERT_EQ(out.sizes(), at::IntArrayRef({1, 1, 2}));
  EXPECT_NEAR(out[0][0][0].item<float>(), e / (e + 1), 1e-6);
  EXPECT_NEAR(out[0][0][1].item<float>(), 1 / (e + 1), 1e-6);
  EXPECT_NEAR(lse[0][0].item<float>(), std::log(e + 1), 1e-6);
  // A sink of 0 adds e^0 = 1 to the denominator only.
  a.sinks = at::zeros({1});
  std::tie(out, lse) = ops::sparse_attn_sharedkv(a);
  EXPECT_NEAR(out[0][0][0].item<float>(), e / (e + 2), 1e-6);
  EXPECT_NEAR(lse[0][0].item<float>(), std::log(e + 2), 1e-6);
  // Errors name the argument.
  a.softmax_scale = 0;
  try {
    ops::sparse_attn_sharedkv(a);
    FAIL() << "softmax_scale=0 accepted";
  } catch (const std::exception& ex) {
    EXPECT_NE(std::string(ex.what()).find("softmax_scale"), std::string::npos) << ex.what();
  }
}

TEST(RtOpsDsa, NoComputeProviderOnMetaTensorsAndByOverride) {
  at::Tensor cache;
  ops::SparseAttnSharedKvArgs a = tiny(cache);
  auto [out, lse] = ops::sparse_attn_sharedkv(a, ops::Provider::NoCompute);
  EXPECT_EQ(out.sizes(), a.q.sizes());
  EXPECT_EQ(lse.sizes(), at::IntArrayRef({1, 1}));
  ops::SparseAttnSharedKvArgs m = a;
  m.q = at::empty({5, 8, 512}, at::TensorOptions().dtype(at::kBFloat16).device(at::kMeta));
  m.ori_kv = at::empty({4, 128, 1, 512}, m.q.options());
  m.return_softmax_lse = false;
  std::tie(out, lse) = ops::sparse_attn_sharedkv(m);  // Auto: meta -> no compute
  EXPECT_TRUE(out.is_meta());
  EXPECT_EQ(out.sizes(), at::IntArrayRef({5, 8, 512}));
  EXPECT_EQ(lse.numel(), 0);
}

TEST(RtOpsDsa, MetadataProviderFromItsLengthsOrTheOverride) {
  ops::SparseAttnSharedKvMetadataArgs md;
  md.num_heads_q = 8;
  md.batch_size = 1;
  md.cmp_ratio = 1;
  md.has_cmp_kv = false;
  // No tensor and no override: refused (no device to pick a provider from).
  EXPECT_THROW(ops::sparse_attn_sharedkv_metadata(md), aar::InvalidArgument);
  const at::Tensor cpu = ops::sparse_attn_sharedkv_metadata(md, ops::Provider::Cpu);
  EXPECT_EQ(cpu.sizes(), at::IntArrayRef({1024}));
  EXPECT_EQ(cpu.scalar_type(), at::kInt);
  EXPECT_EQ(cpu[2].item<int32_t>(), 8);  // num_heads_q in the (documented, opaque) blob
  md.seqused_kv = i32({5});
  md.cu_seqlens_q = i32({0, 2});
  const at::Tensor auto_cpu = ops::sparse_attn_sharedkv_metadata(md);
  EXPECT_TRUE(auto_cpu.device().is_cpu());
  EXPECT_FALSE(at::equal(auto_cpu, cpu));  // follows the lengths
  {
    ops::ProviderOverride o(ops::Provider::NoCompute);
    EXPECT_EQ(ops::sparse_attn_sharedkv_metadata(md).sizes(), at::IntArrayRef({1024}));
  }
}

// The metadata blobs' out-forms (what the DSA builders fill their
// address-stable buffers with): the operator's blob lands in `out`; a wrong
// destination is refused by name with nothing written; the no-compute
// provider writes nothing (as every out-form's copy).
TEST(RtOpsDsa, MetadataOutFormsCopyTheBlobIntoTheStableBuffer) {
  ops::SparseAttnSharedKvMetadataArgs md;
  md.num_heads_q = 8;
  md.cu_seqlens_q = i32({0, 2});
  md.seqused_kv = i32({5});
  md.batch_size = 1;
  md.max_seqlen_q = 2;
  md.max_seqlen_kv = 5;
  md.cmp_ratio = 4;
  ops::KvQuantSparseAttnSharedKvMetadataArgs kq;
  kq.base = md;
  kq.kv_quant_mode = 1;
  kq.tile_size = 64;
  kq.rope_head_dim = 64;
  const auto cmp = ops::flash_mla_cmp_length_tensors(*md.seqused_kv, 4);
  const ops::SparseFlashMlaMetadataArgs fm = ops::to_sparse_flash_mla_metadata_args(md, cmp);
  ops::VllmQuantLightningIndexerMetadataArgs li;
  li.actual_seq_lengths_query = i32({2});
  li.actual_seq_lengths_key = i32({5});
  li.batch_size = 1;
  li.cmp_ratio = 4;
  struct Form {
    const char* name;
    std::function<at::Tensor()> op;
    std::function<void(const at::Tensor&)> out;
  };
  const Form forms[] = {
      {"sparse_attn_sharedkv_metadata_out", [&] { return ops::sparse_attn_sharedkv_metadata(md); },
       [&](const at::Tensor& o) { ops::sparse_attn_sharedkv_metadata_out(md, o); }},
      {"kv_quant_sparse_attn_sharedkv_metadata_out", [&] { return ops::kv_quant_sparse_attn_sharedkv_metadata(kq); },
       [&](const at::Tensor& o) { ops::kv_quant_sparse_attn_sharedkv_metadata_out(kq, o); }},
      {"sparse_flash_mla_metadata_out", [&] { return ops::sparse_flash_mla_metadata(fm); },
       [&](const at::Tensor& o) { ops::sparse_flash_mla_metadata_out(fm, o); }},
      {"vllm_quant_lightning_indexer_metadata_out", [&] { return ops::vllm_quant_lightning_indexer_metadata(li); },
       [&](const at::Tensor& o) { ops::vllm_quant_lightning_indexer_metadata_out(li, o); }},
  };
  for (const Form& f : forms) {
    SCOPED_TRACE(f.name);
    const at::Tensor want = f.op();
    ASSERT_EQ(want.sizes(), at::IntArrayRef({1024}));
    ASSERT_GT(want.abs().sum().item<int64_t>(), 0);  // a blob that differs from the sentinel fill
    at::Tensor out = at::full({1024}, -7, at::kInt);
    const void* addr = out.data_ptr();
    f.out(out);
    EXPECT_TRUE(at::equal(out, want));
    EXPECT_EQ(out.data_ptr(), addr);
    for (const at::Tensor& bad : {at::full({1023}, -7, at::kInt), at::full({1024}, -7, at::kLong)}) {
      try {
        f.out(bad);
        ADD_FAILURE() << "accepted a destination of " << bad.sizes() << " " << bad.scalar_type();
      } catch (const aar::InvalidArgument& e) {
        EXPECT_NE(std::string(e.what()).find(std::string(f.name) + ": out must be [1024] Int"), std::string::npos)
            << e.what();
      }
      EXPECT_TRUE(bad.eq(-7).all().item<bool>());
    }
    // The blob's copy runs under the no-compute provider too (a build's benchmark times it as on the
    // device): the destination takes the no-compute operator's bytes, at its own address.
    at::Tensor landed = at::full({1024}, -7, at::kInt);
    const void* landed_addr = landed.data_ptr();
    at::Tensor nc;
    {
      ops::ProviderOverride o(ops::Provider::NoCompute);
      nc = f.op().clone();
      f.out(landed);
    }
    EXPECT_TRUE(at::equal(landed, nc));
    EXPECT_EQ(landed.data_ptr(), landed_addr);
  }
}

TEST(RtOpsDsa, ScatterV2AndPartialRopeThroughTheWrappers) {
  at::Tensor cache = at::zeros({2, 3, 1, 2});
  const at::Tensor idx = i32({1, 2, -1, 2, 0, 0}).view({3, 2});
  const at::Tensor upd = at::arange(1, 7, at::kFloat).view({3, 2});  // the (N, D) form
  ops::scatter_nd_update_v2(cache, idx, upd);
  EXPECT_EQ(cache[1][2][0][0].item<float>(), 1.0f);
  EXPECT_EQ(cache[0][0][0][1].item<float>(), 6.0f);
  EXPECT_EQ(cache.sum().item<float>(), 1 + 2 + 5 + 6);  // (-1, 2) skipped
  // Rotating (1, 0) by 90 degrees on the pair at [2, 4) of x = (5, 5, 1, 0) gives (0, 1).
  at::Tensor x = at::tensor({5.0f, 5.0f, 1.0f, 0.0f}).view({1, 4});
  ops::inplace_partial_rotary_mul(x, at::zeros({1, 2}), at::ones({1, 2}), "interleave", {2, 4});
  EXPECT_TRUE(at::equal(x, at::tensor({5.0f, 5.0f, 0.0f, 1.0f}).view({1, 4})));
  EXPECT_THROW(ops::inplace_partial_rotary_mul(x, at::zeros({1, 2}), at::ones({1, 2}), "interleave", {3, 4}),
               aar::InvalidArgument);
  // No compute: nothing written.
  ops::scatter_nd_update_v2(cache, idx, upd * 9, ops::Provider::NoCompute);
  EXPECT_EQ(cache.sum().item<float>(), 14.0f);
}

}  // namespace

// The out-forms a captured DSA layer's quantised paths use (docs/design/dsa.md §6): the MX-fp8 o_proj's
// quantise + quantised bmm, the W8A8-dynamic prolog's per-token quantise + npu_quant_matmul. Each lands
// the operator's own result in the caller's tensor at its address; a destination of another shape or
// dtype is refused by name with nothing written.
TEST(RtOpsDsa, QuantisedOutFormsLandTheOperatorsResult) {
  at::manual_seed(3);
  // MX: o (m, b, k) bf16 -> fp8 rows + e8m0 scale bytes, then (m, b, n) bf16 with an fp8 weight (b, k, n).
  const int64_t m = 3, b = 2, k = 64, n = 8;
  ops::DynamicMxQuantArgs q;
  q.input = at::randn({m, b, k}).to(at::kBFloat16);
  q.dst_type = static_cast<int64_t>(at::kFloat8_e4m3fn);
  const auto [y8, ys] = ops::dynamic_mx_quant(q);
  at::Tensor y_out = at::empty_like(y8), s_out = at::full_like(ys, 7);
  const void* addr = y_out.data_ptr();
  ops::dynamic_mx_quant_out(q, y_out, s_out);
  EXPECT_EQ(y_out.data_ptr(), addr);
  EXPECT_TRUE(at::equal(y_out.view(at::kByte), y8.view(at::kByte)));
  EXPECT_TRUE(at::equal(s_out, ys));
  at::Tensor bad_s = at::full({m, b, 2, 2}, 7, ys.options());  // the right shape is (m, b, k / 64, 2) = (m, b, 1, 2)
  EXPECT_THROW(ops::dynamic_mx_quant_out(q, y_out, bad_s), aar::InvalidArgument);
  EXPECT_TRUE(bad_s.eq(7).all().item<bool>());

  static constexpr int64_t kPerm102[] = {1, 0, 2};
  static constexpr int64_t kPerm012[] = {0, 1, 2};
  static constexpr int64_t kGroups[] = {0, 0, 32};
  ops::DynamicMxQuantArgs wq;
  wq.input = at::randn({b, n, k}).to(at::kBFloat16);
  wq.dst_type = static_cast<int64_t>(at::kFloat8_e4m3fn);
  const auto [w8_nk, ws_nk] = ops::dynamic_mx_quant(wq);  // quantised along k, then laid out as (b, k, n)
  ops::TransposeQuantBatchMatmulArgs t;
  t.x1 = y8;
  t.x1_scale = ys.view(at::kFloat8_e8m0fnu);
  t.x2 = w8_nk.transpose(1, 2).contiguous();
  t.x2_scale = ws_nk.permute({0, 2, 1, 3}).contiguous().view(at::kFloat8_e8m0fnu);
  t.dtype = static_cast<int64_t>(at::kBFloat16);
  t.group_sizes = c10::IntArrayRef(kGroups);
  t.perm_x1 = c10::IntArrayRef(kPerm102);
  t.perm_x2 = c10::IntArrayRef(kPerm012);
  t.perm_y = c10::IntArrayRef(kPerm102);
  const at::Tensor want = ops::transpose_quant_batchmatmul(t);
  ASSERT_EQ(want.sizes(), at::IntArrayRef({m, b, n}));
  at::Tensor prod = at::full({m, b, n}, 5.0, at::kBFloat16);
  addr = prod.data_ptr();
  ops::transpose_quant_batchmatmul_out(t, prod);
  EXPECT_EQ(prod.data_ptr(), addr);
  EXPECT_TRUE(at::equal(prod, want));
  at::Tensor bad_p = at::full({m, b, n}, 5.0, at::kFloat);
  try {
    ops::transpose_quant_batchmatmul_out(t, bad_p);
    ADD_FAILURE() << "accepted a float32 destination";
  } catch (const aar::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("transpose_quant_batchmatmul_out: out must be"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(bad_p.eq(5).all().item<bool>());

  // W8A8-dynamic: x (t, in) quantised per token, then the int8 product with a (in, out) int8 weight.
  const int64_t rows = 4, in = 16, out = 6;
  const at::Tensor x = at::randn({rows, in});
  const ops::W8A8DynamicInput fresh = ops::quantize_per_token(x);
  at::Tensor xq = at::empty({rows, in}, at::kChar), xs = at::empty({rows}, at::kFloat);
  const ops::W8A8DynamicInput landed = ops::quantize_per_token_out(x, xq, xs);
  EXPECT_TRUE(landed.q.is_same(xq) && landed.scale.is_same(xs));
  EXPECT_TRUE(at::equal(xq, fresh.q) && at::equal(xs, fresh.scale));
  const at::Tensor wt = at::randint(-127, 128, {in, out}, at::kChar);
  const at::Tensor sc = at::rand({out}) + 0.5;
  const at::Tensor y = ops::w8a8_dynamic_matmul(fresh, wt, sc, at::kFloat);
  at::Tensor y_dst = at::full({rows, out}, 3.0);
  addr = y_dst.data_ptr();
  ops::w8a8_dynamic_matmul_out(landed, wt, sc, y_dst);
  EXPECT_EQ(y_dst.data_ptr(), addr);
  EXPECT_TRUE(at::equal(y_dst, y));
  at::Tensor bad_y = at::full({rows, out + 1}, 3.0);
  try {
    ops::w8a8_dynamic_matmul_out(landed, wt, sc, bad_y);
    ADD_FAILURE() << "accepted a destination of the wrong width";
  } catch (const aar::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("quant_matmul_out: out must be"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(bad_y.eq(3).all().item<bool>());
}
