// FIA v1 / v2 CPU twins (through the public wrappers) against the float64
// reference: causal prefill with cached context, decode, sliding band, mode 0,
// dense vs paged KV, GQA 1/4/8, block sizes 16/128, fp32/bf16/fp16, sinks, lse.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>

#include "ascend_attn_rt/errors.h"
#include "ascend_attn_rt/ops/fused_infer_attention.h"
#include "test_rt_ops_util.h"

namespace ops = aar::ops;
using namespace aar_test;

namespace {

struct FiaCase {
  std::string name;
  int mode = 3;
  int64_t pre = kIntMax, next = kIntMax;
  int64_t n = 8, nkv = 2, d = 64;
  int64_t bs = 128;
  at::ScalarType dtype = at::kFloat;
  bool paged = true;
  std::vector<int64_t> q_lens, kv_lens;  // per request
  bool v2 = false, sinks = false, lse = false;
  int cache_rank = 3;  // paged: 3 (nb, bs, Nkv*D), 4 (nb, Nkv, bs, D), 5 NZ
};

struct FiaData {
  std::vector<at::Tensor> qs, ks, vs;
  at::Tensor query, key, value, mask;
  std::optional<at::Tensor> block_table;
  std::vector<int64_t> q_cum, kv_arg;
  std::vector<double> sink;
  at::Tensor sink_t;
};

at::Tensor to_cache_rank(const at::Tensor& c4 /*(nb, bs, Nkv, D)*/, int rank) {
  const int64_t nb = c4.size(0), bs = c4.size(1), nkv = c4.size(2), d = c4.size(3);
  if (rank == 3) return c4.reshape({nb, bs, nkv * d});
  if (rank == 4) return c4.permute({0, 2, 1, 3}).contiguous();
  const int64_t c = 32 / c4.element_size();
  return c4.reshape({nb, bs, nkv, d / c, c}).permute({0, 2, 3, 1, 4}).contiguous();
}

FiaData make_data(const FiaCase& c, uint64_t seed) {
  at::manual_seed(seed);
  FiaData f;
  for (size_t b = 0; b < c.q_lens.size(); ++b) {
    f.qs.push_back(at::randn({c.q_lens[b], c.n, c.d}).to(c.dtype));
    f.ks.push_back(at::randn({c.kv_lens[b], c.nkv, c.d}).to(c.dtype));
    f.vs.push_back(at::randn({c.kv_lens[b], c.nkv, c.d}).to(c.dtype));
  }
  f.query = at::cat(f.qs, 0);
  f.q_cum = cumsum(c.q_lens);
  if (c.paged) {
    PagedKv p = make_paged(f.ks, f.vs, c.bs, static_cast<uint32_t>(seed));
    f.key = to_cache_rank(p.key_cache, c.cache_rank);
    f.value = to_cache_rank(p.value_cache, c.cache_rank);
    f.block_table = p.block_table;
    f.kv_arg = c.kv_lens;  // per-request lengths with a block table
  } else {
    f.key = at::cat(f.ks, 0);
    f.value = at::cat(f.vs, 0);
    f.kv_arg = cumsum(c.kv_lens);  // cumulative ends for dense TND
  }
  if (c.mode != 0) f.mask = at::triu(at::ones({2048, 2048}, at::kBool), 1);
  if (c.sinks) {
    f.sink_t = at::randn({c.n}) * 2;
    for (int64_t h = 0; h < c.n; ++h) f.sink.push_back(f.sink_t[h].item<double>());
  }
  return f;
}

std::tuple<at::Tensor, at::Tensor> call_fia(const FiaCase& c, const FiaData& f, double scale) {
  std::optional<at::Tensor> mask;
  if (f.mask.defined()) mask = f.mask;
  if (!c.v2) {
    ops::FiaTensors t{f.query, f.key, f.value};
    t.atten_mask = mask;
    t.block_table = f.block_table;
    ops::FiaParams p;
    p.actual_seq_lengths = f.q_cum;
    p.actual_seq_lengths_kv = f.kv_arg;
    p.num_heads = c.n;
    p.num_key_value_heads = c.nkv;
    p.scale = scale;
    p.pre_tokens = c.pre;
    p.next_tokens = c.next;
    p.sparse_mode = c.mode;
    p.block_size = c.paged ? c.bs : 0;
    p.softmax_lse_flag = c.lse;
    return ops::fused_infer_attention_score(t, p);
  }
  ops::FiaV2Tensors t{f.query, f.key, f.value};
  t.atten_mask = mask;
  t.block_table = f.block_table;
  if (c.sinks) t.learnable_sink = f.sink_t;
  ops::FiaV2Params p;
  p.actual_seq_qlen = f.q_cum;
  p.actual_seq_kvlen = f.kv_arg;
  p.num_query_heads = c.n;
  p.num_key_value_heads = c.nkv;
  p.softmax_scale = scale;
  p.pre_tokens = c.pre;
  p.next_tokens = c.next;
  p.sparse_mode = c.mode;
  p.block_size = c.paged ? c.bs : 0;
  p.return_softmax_lse = c.lse;
  return ops::fused_infer_attention_score_v2(t, p);
}

void check_case(const FiaCase& c) {
  SCOPED_TRACE(c.name);
  const FiaData f = make_data(c, 1234);
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.d));
  auto [out, lse] = call_fia(c, f, scale);
  ASSERT_EQ(out.scalar_type(), c.dtype);
  ASSERT_EQ(out.sizes(), f.query.sizes());
  if (c.lse) {
    ASSERT_EQ(lse.sizes(), (c10::IntArrayRef{f.query.size(0), c.n, 1}));
    ASSERT_EQ(lse.scalar_type(), at::kFloat);
  } else {
    ASSERT_EQ(lse.numel(), 1);
  }
  int64_t row = 0;
  for (size_t b = 0; b < c.q_lens.size(); ++b) {
    const RefResult r = ref_attention(f.qs[b], f.ks[b], f.vs[b], c.mode, c.pre, c.next, scale, f.sink);
    const std::string what = c.name + " request " + std::to_string(b);
    expect_close(out.narrow(0, row, c.q_lens[b]), r.out, tol_for(c.dtype), what + " out");
    if (c.lse) expect_close(lse.narrow(0, row, c.q_lens[b]).squeeze(-1), r.lse, 1e-5, what + " lse");
    row += c.q_lens[b];
  }
}

FiaCase mk(std::string name, int mode, int64_t n, int64_t nkv, int64_t bs, at::ScalarType dt, bool paged,
           std::vector<int64_t> q, std::vector<int64_t> kv) {
  FiaCase c;
  c.name = std::move(name);
  c.mode = mode;
  c.n = n;
  c.nkv = nkv;
  c.bs = bs;
  c.dtype = dt;
  c.paged = paged;
  c.q_lens = std::move(q);
  c.kv_lens = std::move(kv);
  return c;
}

}  // namespace

TEST(RtOpsFia, CausalPrefillWithCachedContextPagedGqa4Bs128Fp32) {
  check_case(mk("prefill_ctx", 3, 8, 2, 128, at::kFloat, true, {3, 1, 7}, {10, 1, 200}));
}

TEST(RtOpsFia, CausalPrefillBs16Gqa8Bf16) {
  check_case(mk("prefill_bs16", 3, 16, 2, 16, at::kBFloat16, true, {5, 17}, {40, 17}));
}

TEST(RtOpsFia, DecodePagedGqa8Bs16Bf16) {
  check_case(mk("decode_gqa8", 3, 16, 2, 16, at::kBFloat16, true, {1, 1, 1, 1}, {5, 33, 16, 1}));
}

TEST(RtOpsFia, DecodePagedGqa1Bs128Fp16) {
  check_case(mk("decode_gqa1", 3, 4, 4, 128, at::kHalf, true, {1, 1}, {130, 7}));
}

TEST(RtOpsFia, DecodePagedGqa4Fp32) {
  check_case(mk("decode_gqa4", 3, 8, 2, 16, at::kFloat, true, {1, 1, 1}, {1, 100, 48}));
}

TEST(RtOpsFia, SlidingBandMode4PagedFp32) {
  FiaCase c = mk("band_fp32", 4, 4, 1, 16, at::kFloat, true, {5, 1, 3}, {20, 9, 3});
  c.pre = 4;
  c.next = 0;
  check_case(c);
}

TEST(RtOpsFia, SlidingBandMode4PagedBf16Gqa8Bs128) {
  FiaCase c = mk("band_bf16", 4, 8, 1, 128, at::kBFloat16, true, {40, 1}, {300, 50});
  c.pre = 16;
  c.next = 0;
  check_case(c);
}

TEST(RtOpsFia, SlidingBandMode4WithNextTokensDense) {
  FiaCase c = mk("band_next", 4, 4, 2, 0, at::kFloat, false, {6, 4}, {6, 9});
  c.pre = 2;
  c.next = 1;
  check_case(c);
}

TEST(RtOpsFia, Mode0NonCausalDenseFp32) {
  check_case(mk("mode0_dense", 0, 4, 4, 0, at::kFloat, false, {3, 5}, {4, 6}));
}

TEST(RtOpsFia, Mode0NonCausalDenseBf16Gqa4) {
  check_case(mk("mode0_bf16", 0, 8, 2, 0, at::kBFloat16, false, {7, 2}, {7, 2}));
}

TEST(RtOpsFia, Mode0NonCausalPagedFp16) {
  check_case(mk("mode0_paged", 0, 8, 1, 16, at::kHalf, true, {3, 2}, {20, 2}));
}

TEST(RtOpsFia, CausalDenseKvPrefillNoCache) {
  check_case(mk("causal_dense", 3, 8, 2, 0, at::kFloat, false, {6, 9, 1}, {6, 9, 1}));
}

TEST(RtOpsFia, RowsWithoutAllowedKeysAreZeroAndLseMinusInf) {
  FiaCase c = mk("no_keys", 3, 4, 2, 0, at::kFloat, false, {4}, {2});
  c.lse = true;
  check_case(c);
  const FiaData f = make_data(c, 1234);
  auto [out, lse] = call_fia(c, f, 0.125);
  EXPECT_TRUE(at::all(out.narrow(0, 0, 2) == 0).item<bool>());
  EXPECT_TRUE(at::all(at::isneginf(lse.narrow(0, 0, 2))).item<bool>());
}

TEST(RtOpsFia, SoftmaxLseV1TndShape) {
  FiaCase c = mk("lse_v1", 3, 8, 2, 16, at::kFloat, true, {3, 1, 5}, {19, 1, 5});
  c.lse = true;
  check_case(c);
}

TEST(RtOpsFia, V2LearnableSinkCausalFp32WithLse) {
  FiaCase c = mk("v2_sink", 3, 8, 2, 16, at::kFloat, true, {3, 1, 6}, {30, 4, 6});
  c.v2 = true;
  c.sinks = true;
  c.lse = true;
  check_case(c);
}

TEST(RtOpsFia, V2LearnableSinkBandBf16) {
  FiaCase c = mk("v2_sink_band", 4, 8, 1, 128, at::kBFloat16, true, {4, 1}, {140, 10});
  c.v2 = true;
  c.sinks = true;
  c.pre = 8;
  c.next = 0;
  check_case(c);
}

TEST(RtOpsFia, V2WithoutSinkMatchesV1) {
  FiaCase c = mk("v2_plain", 3, 4, 4, 16, at::kFloat, true, {2, 3}, {7, 3});
  c.v2 = true;
  c.lse = true;
  check_case(c);
}

TEST(RtOpsFia, PagedCache4dBnbdLayout) {
  FiaCase c = mk("bnbd", 3, 8, 2, 16, at::kFloat, true, {2, 1}, {20, 33});
  c.cache_rank = 4;
  check_case(c);
}

TEST(RtOpsFia, PagedCache5dNzLayout) {
  FiaCase c = mk("nz", 3, 8, 2, 16, at::kHalf, true, {2, 1}, {20, 33});
  c.cache_rank = 5;
  check_case(c);
}

TEST(RtOpsFia, DenseAndPagedKvAgree) {
  FiaCase dense = mk("dense", 3, 8, 2, 0, at::kFloat, false, {3, 4}, {9, 4});
  FiaCase paged = dense;
  paged.paged = true;
  paged.bs = 16;
  const FiaData fd = make_data(dense, 77), fp = make_data(paged, 77);
  ASSERT_TRUE(at::equal(fd.query, fp.query));
  auto a = std::get<0>(call_fia(dense, fd, 0.1));
  auto b = std::get<0>(call_fia(paged, fp, 0.1));
  EXPECT_TRUE(at::allclose(a, b, 1e-6, 1e-6));
}

TEST(RtOpsFia, BnsdDecodePaged) {
  at::manual_seed(5);
  const int64_t B = 3, N = 8, Nkv = 2, D = 32, bs = 16;
  const std::vector<int64_t> kv{5, 40, 17};
  std::vector<at::Tensor> ks, vs;
  for (int64_t s : kv) {
    ks.push_back(at::randn({s, Nkv, D}));
    vs.push_back(at::randn({s, Nkv, D}));
  }
  PagedKv p = make_paged(ks, vs, bs, 9);
  const at::Tensor q = at::randn({B, N, 1, D});
  ops::FiaTensors t{q, p.key_cache.reshape({p.key_cache.size(0), bs, Nkv * D}),
                    p.value_cache.reshape({p.value_cache.size(0), bs, Nkv * D})};
  t.block_table = p.block_table;
  ops::FiaParams prm;
  prm.has_actual_seq_lengths = false;
  prm.actual_seq_lengths_kv = kv;
  prm.input_layout = "BNSD";
  prm.num_heads = N;
  prm.num_key_value_heads = Nkv;
  prm.scale = 0.2;
  prm.block_size = bs;
  prm.softmax_lse_flag = true;
  auto [out, lse] = ops::fused_infer_attention_score(t, prm);
  ASSERT_EQ(out.sizes(), q.sizes());
  ASSERT_EQ(lse.sizes(), (c10::IntArrayRef{B, N, 1, 1}));
  for (int64_t b = 0; b < B; ++b) {
    const RefResult r = ref_attention(q[b].permute({1, 0, 2}), ks[b], vs[b], 0, kIntMax, kIntMax, 0.2);
    expect_close(out[b].permute({1, 0, 2}), r.out, 1e-5, "bnsd out");
    expect_close(lse[b].permute({1, 0, 2}).squeeze(-1), r.lse, 1e-5, "bnsd lse");
  }
}

TEST(RtOpsFia, OutVariantsMatchFunctional) {
  for (bool v2 : {false, true}) {
    FiaCase c = mk("out", 3, 8, 2, 16, at::kBFloat16, true, {3, 1}, {20, 5});
    c.v2 = v2;
    c.sinks = v2;
    c.lse = true;
    const FiaData f = make_data(c, 3);
    auto [want, want_lse] = call_fia(c, f, 0.125);
    at::Tensor out = at::full_like(f.query, 7.0), lse = at::full({f.query.size(0), c.n, 1}, 7.0);
    std::optional<at::Tensor> ws;
    if (!v2) {
      ops::FiaTensors t{f.query, f.key, f.value};
      t.atten_mask = f.mask;
      t.block_table = f.block_table;
      ops::FiaParams p;
      p.actual_seq_lengths = f.q_cum;
      p.actual_seq_lengths_kv = f.kv_arg;
      p.num_heads = c.n;
      p.num_key_value_heads = c.nkv;
      p.scale = 0.125;
      p.sparse_mode = 3;
      p.block_size = c.bs;
      p.softmax_lse_flag = true;
      ws = ops::fused_infer_attention_score_get_max_workspace(t, p);
      ops::fused_infer_attention_score_out(t, p, ws, out, lse);
    } else {
      ops::FiaV2Tensors t{f.query, f.key, f.value};
      t.atten_mask = f.mask;
      t.block_table = f.block_table;
      t.learnable_sink = f.sink_t;
      ops::FiaV2Params p;
      p.actual_seq_qlen = f.q_cum;
      p.actual_seq_kvlen = f.kv_arg;
      p.num_query_heads = c.n;
      p.num_key_value_heads = c.nkv;
      p.softmax_scale = 0.125;
      p.sparse_mode = 3;
      p.block_size = c.bs;
      p.return_softmax_lse = true;
      ws = ops::fused_infer_attention_score_v2_get_max_workspace(t, p);
      ops::fused_infer_attention_score_v2_out(t, p, ws, out, lse);
    }
    EXPECT_TRUE(at::equal(out, want)) << "v2=" << v2;
    EXPECT_TRUE(at::equal(lse, want_lse)) << "v2=" << v2;
    ASSERT_TRUE(ws.has_value());
    EXPECT_EQ(ws->scalar_type(), at::kByte);
  }
}

TEST(RtOpsFia, MaxWorkspaceGrowsWithKvLength) {
  auto ws_for = [](std::vector<int64_t> kv) {
    FiaCase c = mk("ws", 3, 8, 2, 16, at::kFloat, true, std::vector<int64_t>(kv.size(), 1), kv);
    const FiaData f = make_data(c, 1);
    ops::FiaTensors t{f.query, f.key, f.value};
    t.atten_mask = f.mask;
    t.block_table = f.block_table;
    ops::FiaParams p;
    p.actual_seq_lengths = f.q_cum;
    p.actual_seq_lengths_kv = f.kv_arg;
    p.num_heads = 8;
    p.num_key_value_heads = 2;
    p.sparse_mode = 3;
    p.block_size = 16;
    return ops::fused_infer_attention_score_get_max_workspace(t, p);
  };
  const at::Tensor small = ws_for({4, 4}), big = ws_for({40, 100});
  EXPECT_GT(big.numel(), small.numel());
  EXPECT_TRUE(at::equal(ws_for({4, 4}), small));  // deterministic
}

// ---------------------------------------------------------------- validation
namespace {

struct Base {
  FiaCase c = mk("base", 3, 8, 2, 16, at::kFloat, true, {3, 1}, {20, 5});
  FiaData f = make_data(c, 11);
  ops::FiaTensors t{f.query, f.key, f.value};
  ops::FiaParams p;
  Base() {
    t.atten_mask = f.mask;
    t.block_table = f.block_table;
    p.actual_seq_lengths = f.q_cum;
    p.actual_seq_lengths_kv = f.kv_arg;
    p.num_heads = 8;
    p.num_key_value_heads = 2;
    p.sparse_mode = 3;
    p.block_size = 16;
  }
  void run() { ops::fused_infer_attention_score(t, p); }
};

}  // namespace

TEST(RtOpsFiaValidation, BaseIsValid) {
  Base b;
  EXPECT_NO_THROW(b.run());
}

TEST(RtOpsFiaValidation, TokenCountMustEqualLastCumulativeEnd) {
  Base b;
  std::vector<int64_t> q{3, 3};
  b.p.actual_seq_lengths = q;
  expect_throw_with<aar::InvalidArgument>([&] { b.run(); }, "actual_seq_lengths");
}

TEST(RtOpsFiaValidation, NonMonotonicCumulativeLengths) {
  Base b;
  b.t.query = at::randn({4, 8, 64});
  std::vector<int64_t> bad{5, 4};
  b.p.actual_seq_lengths = bad;
  expect_throw_with<aar::InvalidArgument>([&] { b.run(); }, "cumulative");
}

TEST(RtOpsFiaValidation, BlockIdOutOfRange) {
  Base b;
  at::Tensor bt = b.f.block_table->clone();
  bt[1][0] = 1000;
  b.t.block_table = bt;
  expect_throw_with<aar::InvalidArgument>([&] { b.run(); }, "block_table[1, 0]=1000");
}

TEST(RtOpsFiaValidation, KvLengthExceedsBlockTableCapacity) {
  Base b;
  std::vector<int64_t> kv{20, 5000};
  b.p.actual_seq_lengths_kv = kv;
  expect_throw_with<aar::InvalidArgument>([&] { b.run(); }, "capacity");
}

TEST(RtOpsFiaValidation, BlockSizeMustMatchCache) {
  Base b;
  b.p.block_size = 128;
  expect_throw_with<aar::InvalidArgument>([&] { b.run(); }, "block_size=128");
}

TEST(RtOpsFiaValidation, KvHeadsMustDivideHeads) {
  Base b;
  b.p.num_key_value_heads = 3;
  expect_throw_with<aar::InvalidArgument>([&] { b.run(); }, "num_key_value_heads=3");
}

TEST(RtOpsFiaValidation, CausalNeedsCompressedMask) {
  Base b;
  b.t.atten_mask.reset();
  expect_throw_with<aar::InvalidArgument>([&] { b.run(); }, "atten_mask");
  Base b2;
  b2.t.atten_mask = at::ones({128, 128}, at::kBool);
  expect_throw_with<aar::InvalidArgument>([&] { b2.run(); }, "2048");
}

TEST(RtOpsFiaValidation, VllmFourDimCacheNeedsThreeDimView) {
  Base b;
  // (nb, bs, Nkv, D) is not the documented 4-D layout (nb, Nkv, bs, D).
  b.t.key = b.f.key.reshape({b.f.key.size(0), 16, 2, 64});
  b.t.value = b.f.value.reshape({b.f.value.size(0), 16, 2, 64});
  expect_throw_with<aar::InvalidArgument>([&] { b.run(); }, "3-D view");
}

TEST(RtOpsFiaValidation, KvDtypeMustMatchQuery) {
  Base b;
  b.t.key = b.f.key.to(at::kHalf);
  expect_throw_with<aar::InvalidArgument>([&] { b.run(); }, "key dtype");
}

TEST(RtOpsFiaValidation, PagedNeedsPerRequestKvLengthsForEveryRequest) {
  Base b;
  std::vector<int64_t> kv{20};
  b.p.actual_seq_lengths_kv = kv;
  expect_throw_with<aar::InvalidArgument>([&] { b.run(); }, "actual_seq_lengths_kv");
}
