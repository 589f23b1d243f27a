// The quantised MLA-family preprocess operators (issue 10) through their
// wrappers, against references written here (float64, from the operators'
// documented formulas, not from the twins): npu_quantize, npu_quant_matmul,
// npu_mla_prolog_v3 (W8A8 weight_quant_mode 2, query_norm_flag, the per-tile
// packed SFA C8 cache), npu_mla_prolog_v2 (FA-quant: int8 query and NZ latent
// cache), vllm-ascend's mla_preprocess (MLAPO: W8A8 static, krope_ctkv /
// nzcache, enable_inner_out), FIA v2's fully quantised MLA decode, the int8
// latent write of npu_kv_rmsnorm_rope_cache and npu_gather_pa_kv_cache over NZ
// caches; and every unimplemented mode rejected by name.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "ascend_attn_rt/errors.h"
#include "ascend_attn_rt/ops/fused_infer_attention.h"
#include "ascend_attn_rt/ops/gather_pa_kv_cache.h"
#include "ascend_attn_rt/ops/kv_rmsnorm_rope_cache.h"
#include "ascend_attn_rt/ops/mla_preprocess.h"
#include "ascend_attn_rt/ops/mla_prolog.h"
#include "ascend_attn_rt/ops/quant.h"
#include "ascend_attn_rt/ops/sfa_c8_rows.h"
#include "test_rt_ops_util.h"

namespace ops = aar::ops;
using namespace aar_test;

namespace {

constexpr auto F64 = at::kDouble;

at::Tensor d(const at::Tensor& t) { return t.to(F64); }

// Reference helpers, float64.
at::Tensor rms_ref(const at::Tensor& x, const at::Tensor& g, double eps) {
  const at::Tensor v = d(x);
  return v / at::sqrt((v * v).mean(-1, true) + eps) * d(g);
}

// rotate-half RoPE on the last dim: y = u cos + [-u2, u1] sin.
at::Tensor rope_ref(const at::Tensor& u, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t h = u.size(-1) / 2;
  const at::Tensor v = d(u);
  const at::Tensor rot = at::cat({-v.narrow(-1, h, h), v.narrow(-1, 0, h)}, -1);
  return v * d(cos) + rot * d(sin);
}

// Per-row symmetric int8 (npu_dynamic_quant's documented rule), float64.
std::pair<at::Tensor, at::Tensor> quant_rows_ref(const at::Tensor& x) {
  const at::Tensor v = d(x);
  const at::Tensor s = v.abs().amax(-1, true) / 127.0;
  return {at::round(v / s).clamp(-127, 127), s};
}

// ND (nb, bs, D) -> NZ (nb, 1, D/c, bs, c), written out element by element.
at::Tensor to_nz(const at::Tensor& nd, int64_t c) {
  const int64_t nb = nd.size(0), bs = nd.size(1), D = nd.size(2);
  at::Tensor z = at::empty({nb, 1, D / c, bs, c}, nd.options());
  for (int64_t b = 0; b < nb; ++b)
    for (int64_t s = 0; s < bs; ++s)
      for (int64_t k = 0; k < D; ++k) z[b][0][k / c][s][k % c] = nd[b][s][k];
  return z;
}

// The transdata NZ staging layout of an (R, C) weight, unsqueezed: (1, C'/32, R', 32),
// Z[cb, r, k] = A[r, 32 cb + k], zero padded (docs/design/mla.md §4.3).
at::Tensor staging_nz(const at::Tensor& a) {
  const int64_t R = a.size(0), C = a.size(1);
  const int64_t Rp = (R + 15) / 16 * 16, Cp = (C + 31) / 32 * 32;
  at::Tensor z = at::zeros({1, Cp / 32, Rp, 32}, a.options());
  for (int64_t cb = 0; cb < Cp / 32; ++cb)
    for (int64_t k = 0; k < 32 && cb * 32 + k < C; ++k) z[0][cb].narrow(0, 0, R).select(1, k).copy_(a.select(1, cb * 32 + k));
  return z;
}

at::Tensor rand_i8(std::initializer_list<int64_t> shape, int64_t lo = -100, int64_t hi = 100) {
  return at::randint(lo, hi, shape, at::kChar);
}

template <typename F>
void expect_not_supported(F f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "expected NotSupported naming " << needle;
  } catch (const aar::NotSupported& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

template <typename F>
void expect_invalid(F f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "expected InvalidArgument naming " << needle;
  } catch (const aar::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

}  // namespace

// ---------------------------------------------------------------- npu_quantize

TEST(RtOpsMlaQuant, QuantizeRoundsHalfToEvenAndSaturates) {
  const at::Tensor x = at::tensor({0.5f, 1.5f, 2.5f, -0.5f, -2.5f, 1000.f, -1000.f, 0.25f}).view({2, 4});
  const at::Tensor s = at::full({1}, 2.0f);  // multiplier
  const at::Tensor z = at::full({1}, 1.0f);
  const at::Tensor y = ops::quantize(x, s, z, static_cast<int64_t>(at::kQInt8), -1, false);
  ASSERT_EQ(y.scalar_type(), at::kChar);
  // x*2+1 = 2, 4, 6, 0, -4, 2001 -> 127, -1999 -> -128, 1.5 -> 2 (half to even)
  EXPECT_TRUE(at::equal(y, at::tensor({2, 4, 6, 0, -4, 127, -128, 2}, at::kChar).view({2, 4})));
}

TEST(RtOpsMlaQuant, QuantizePerChannelScales) {
  at::manual_seed(3);
  const at::Tensor x = at::randn({5, 8});
  const at::Tensor s = at::rand({8}) * 20 + 1, z = at::randint(-3, 3, {8}).to(at::kFloat);
  const at::Tensor y = ops::quantize(x, s, z, static_cast<int64_t>(at::kQInt8), -1, false);
  const at::Tensor want = at::round(d(x) * d(s) + d(z)).clamp(-128, 127);
  EXPECT_TRUE(at::equal(y.to(F64), want));
}

TEST(RtOpsMlaQuant, QuantizeRejectsWhatItDoesNotImplement) {
  const at::Tensor x = at::randn({2, 4}), s = at::ones({1});
  const int64_t qi8 = static_cast<int64_t>(at::kQInt8);
  expect_not_supported([&] { ops::quantize(x, s, std::nullopt, qi8, -1, true); }, "div_mode=True");
  expect_not_supported([&] { ops::quantize(x, s, std::nullopt, static_cast<int64_t>(at::kQUInt8), -1, false); },
                       "dtype=");
  expect_not_supported([&] { ops::quantize(x.view({2, 2, 2}), s, std::nullopt, qi8, -2, false); }, "axis=-2");
  expect_invalid([&] { ops::quantize(x, at::ones({3}), std::nullopt, qi8, -1, false); }, "scales");
}

// ---------------------------------------------------------------- npu_quant_matmul

TEST(RtOpsMlaQuant, QuantMatmulStaticBiasAndDynamicPertoken) {
  at::manual_seed(4);
  const at::Tensor x1 = rand_i8({6, 40}), x2 = rand_i8({40, 12});
  const at::Tensor scale = at::rand({12}) * 1e-3, bias = at::randint(-5000, 5000, {12}, at::kInt);
  const at::Tensor pts = at::rand({6}) * 1e-2 + 1e-3;
  // Reference: explicit sums.
  at::Tensor acc = at::zeros({6, 12}, F64);
  for (int64_t i = 0; i < 6; ++i)
    for (int64_t j = 0; j < 12; ++j) acc[i][j] = (d(x1[i]) * d(x2.select(1, j))).sum();
  ops::QuantMatmulArgs a{x1, x2, scale};
  a.bias = bias;
  a.output_dtype = static_cast<int64_t>(at::kFloat);
  expect_close(ops::quant_matmul(a), (acc + d(bias)) * d(scale), 1e-6, "static");
  ops::QuantMatmulArgs b{x1, x2, scale};
  b.pertoken_scale = pts;
  b.output_dtype = static_cast<int64_t>(at::kBFloat16);
  const at::Tensor y = ops::quant_matmul(b);
  ASSERT_EQ(y.scalar_type(), at::kBFloat16);
  expect_close(y, acc * d(scale) * d(pts).unsqueeze(1), 1e-2, "dynamic");
}

TEST(RtOpsMlaQuant, QuantMatmulRejectsWhatItDoesNotImplement) {
  const at::Tensor x1 = rand_i8({2, 8}), x2 = rand_i8({8, 4}), s = at::ones({4});
  ops::QuantMatmulArgs a{x1, x2, s};
  expect_not_supported([&] { ops::quant_matmul(a); }, "output_dtype=None");
  a.output_dtype = static_cast<int64_t>(at::kFloat);
  ops::QuantMatmulArgs b = a;
  b.scale = at::ones({4}, at::kLong);
  expect_not_supported([&] { ops::quant_matmul(b); }, "int64 scale");
  b = a;
  b.offset = at::ones({4});
  expect_not_supported([&] { ops::quant_matmul(b); }, "offset");
  b = a;
  b.bias = at::ones({4});
  expect_invalid([&] { ops::quant_matmul(b); }, "bias must be int32");
}

// ---------------------------------------------------------------- npu_mla_prolog_v3 / v2

namespace {

// One prolog problem (small dims; W8A8 weights with per-channel dequant scales).
struct Prolog {
  int64_t T = 5, He = 64, Hcq = 32, N = 2, D = 16, Dr = 8, Hckv = 32, nb = 4, bs = 8;
  at::Tensor x, xq, dsx;                   // activations, their per-token int8 form
  at::Tensor wdq, wuq, wuk, wdkv;          // int8 (float for the unquantised form)
  at::Tensor sdq, suq, sdkv;               // (1, n) dequant scales
  at::Tensor gcq, gckv, cos, sin, slots;
  double eps = 1e-6;

  void make(bool quant, uint64_t seed) {
    at::manual_seed(seed);
    x = at::randn({T, He});
    auto [q, s] = quant_rows_ref(x);
    xq = q.to(at::kChar);
    dsx = s.to(at::kFloat);
    if (quant) {
      wdq = rand_i8({He, Hcq});
      wuq = rand_i8({Hcq, N * (D + Dr)});
      wdkv = rand_i8({He, Hckv + Dr});
      sdq = at::rand({1, Hcq}) * 1e-3 + 1e-4;
      suq = at::rand({1, N * (D + Dr)}) * 1e-3 + 1e-4;
      sdkv = at::rand({1, Hckv + Dr}) * 1e-3 + 1e-4;
    } else {
      wdq = at::randn({He, Hcq}) / 8;
      wuq = at::randn({Hcq, N * (D + Dr)}) / 6;
      wdkv = at::randn({He, Hckv + Dr}) / 8;
    }
    wuk = at::randn({N, D, Hckv}) / 4;
    gcq = at::rand({Hcq}) + 0.5;
    gckv = at::rand({Hckv}) + 0.5;
    const at::Tensor ang = at::rand({T, Dr / 2}) * 6;
    cos = at::cat({ang.cos(), ang.cos()}, -1);
    sin = at::cat({ang.sin(), ang.sin()}, -1);
    slots = at::tensor({3, 17, -1, 30, 9}, at::kLong);
  }

  // Float64 reference (query, query_rope, c_kv, k_rope, c_q).
  struct Ref {
    at::Tensor query, query_rope, c_kv, k_rope, c_q;
  };
  Ref ref(bool quant) const {
    Ref r;
    at::Tensor cq_raw, ckr;
    if (quant) {
      cq_raw = at::matmul(d(xq) * d(dsx), d(wdq) * d(sdq));
      ckr = at::matmul(d(xq) * d(dsx), d(wdkv) * d(sdkv));
    } else {
      cq_raw = at::matmul(d(x), d(wdq));
      ckr = at::matmul(d(x), d(wdkv));
    }
    r.c_q = rms_ref(cq_raw, gcq, eps);
    at::Tensor q;
    if (quant) {
      auto [cqq, s] = quant_rows_ref(r.c_q);
      q = at::matmul(cqq * s, d(wuq) * d(suq));
    } else {
      q = at::matmul(r.c_q, d(wuq));
    }
    q = q.view({T, N, D + Dr});
    r.query = at::einsum("tnd,ndl->tnl", {q.narrow(-1, 0, D), d(wuk)});
    r.query_rope = rope_ref(q.narrow(-1, D, Dr), cos.unsqueeze(1), sin.unsqueeze(1));
    r.c_kv = rms_ref(ckr.narrow(-1, 0, Hckv), gckv, eps);
    r.k_rope = rope_ref(ckr.narrow(-1, Hckv, Dr), cos, sin);
    return r;
  }

  ops::MlaPrologArgs args(bool quant) const {
    ops::MlaPrologArgs a;
    a.token_x = quant ? xq : x;
    a.weight_dq = wdq;
    a.weight_uq_qr = wuq;
    a.weight_uk = wuk;
    a.weight_dkv_kr = wdkv;
    a.rmsnorm_gamma_cq = gcq;
    a.rmsnorm_gamma_ckv = gckv;
    a.rope_cos = cos;
    a.rope_sin = sin;
    a.cache_index = slots;
    a.rmsnorm_epsilon_cq = a.rmsnorm_epsilon_ckv = eps;
    if (quant) {
      a.dequant_scale_x = dsx.view({T, 1});
      a.dequant_scale_w_dq = sdq;
      a.dequant_scale_w_uq_qr = suq;
      a.dequant_scale_w_dkv_kr = sdkv;
    }
    return a;
  }
};

}  // namespace

TEST(RtOpsMlaQuant, PrologV3W8A8DynamicWithQueryNorm) {
  Prolog p;
  p.make(/*quant=*/true, 11);
  const auto r = p.ref(true);
  at::Tensor kv = at::randn({p.nb, p.bs, 1, p.Hckv}), kr = at::randn({p.nb, p.bs, 1, p.Dr});
  const at::Tensor kv0 = kv.clone(), kr0 = kr.clone();
  ops::MlaPrologArgs a = p.args(true);
  a.weight_quant_mode = 2;
  a.query_norm_flag = true;
  auto [query, query_rope, dsq, qnorm, dsqn] = ops::mla_prolog_v3(a, kv, kr);
  expect_close(query, r.query, 2e-3, "query");
  expect_close(query_rope, r.query_rope, 2e-3, "query_rope");
  // query_norm: c_q quantised per token, with its dequant scale (T, 1).
  ASSERT_EQ(qnorm.scalar_type(), at::kChar);
  ASSERT_EQ(dsqn.sizes(), (c10::IntArrayRef{p.T, 1}));
  // Per row: scale = amax / 127, and the int8 row dequantises to within scale / 2.
  expect_close(dsqn, r.c_q.abs().amax(-1, true) / 127.0, 1e-4, "dequant_scale_q_norm");
  EXPECT_LE(((d(qnorm) * d(dsqn) - r.c_q).abs() - d(dsqn) * 0.51).max().item<double>(), 1e-6);
  const auto sl = p.slots.accessor<int64_t, 1>();
  at::Tensor kv_want = kv0.clone(), kr_want = kr0.clone();
  for (int64_t t = 0; t < p.T; ++t) {
    if (sl[t] < 0) continue;
    kv_want[sl[t] / p.bs][sl[t] % p.bs][0].copy_(r.c_kv[t]);
    kr_want[sl[t] / p.bs][sl[t] % p.bs][0].copy_(r.k_rope[t]);
  }
  expect_close(kv, kv_want, 1e-4, "kv_cache");
  expect_close(kr, kr_want, 1e-4, "kr_cache");
}

TEST(RtOpsMlaQuant, PrologV3UnquantisedQueryNormIsCq) {
  Prolog p;
  p.make(/*quant=*/false, 12);
  const auto r = p.ref(false);
  at::Tensor kv = at::zeros({p.nb, p.bs, 1, p.Hckv}), kr = at::zeros({p.nb, p.bs, 1, p.Dr});
  ops::MlaPrologArgs a = p.args(false);
  a.query_norm_flag = true;
  auto out = ops::mla_prolog_v3(a, kv, kr);
  expect_close(std::get<0>(out), r.query, 1e-4, "query");
  expect_close(std::get<3>(out), r.c_q, 1e-5, "query_norm");
  a.query_norm_flag = false;
  EXPECT_EQ(std::get<3>(ops::mla_prolog_v3(a, kv, kr)).numel(), 1);  // reserved (1,) output
}

TEST(RtOpsMlaQuant, PrologV3PerTileWritesThePackedSfaC8Row) {
  Prolog p;
  p.Hckv = ops::kSfaC8NopeDim;
  p.Dr = ops::kSfaC8RopeDim;
  p.D = 16;
  p.make(/*quant=*/true, 13);
  p.wuk = p.wuk.to(at::kBFloat16);
  p.gcq = p.gcq.to(at::kBFloat16);
  p.gckv = p.gckv.to(at::kBFloat16);
  p.cos = p.cos.to(at::kBFloat16);
  p.sin = p.sin.to(at::kBFloat16);
  const auto r = p.ref(true);
  at::Tensor packed = rand_i8({p.nb, p.bs, 1, ops::kSfaC8RowBytes});
  const at::Tensor before = packed.clone();
  at::Tensor dummy = at::empty({0}, at::kBFloat16);
  ops::MlaPrologArgs a = p.args(true);
  a.weight_quant_mode = 2;
  a.kv_cache_quant_mode = 3;
  a.ckvkr_repo_mode = 1;
  a.quant_scale_repo_mode = 1;
  a.k_nope_clip_alpha = at::ones({1});
  ops::mla_prolog_v3(a, packed, dummy);
  const auto sl = p.slots.accessor<int64_t, 1>();
  const at::Tensor flat = packed.view({-1, ops::kSfaC8RowBytes}), flat0 = before.view({-1, ops::kSfaC8RowBytes});
  for (int64_t s = 0; s < flat.size(0); ++s) {
    bool written = false;
    for (int64_t t = 0; t < p.T; ++t) written |= sl[t] == s;
    if (!written) EXPECT_TRUE(at::equal(flat[s], flat0[s])) << "slot " << s << " written";
  }
  for (int64_t t = 0; t < p.T; ++t) {
    if (sl[t] < 0) continue;
    const auto u = ops::unpack_sfa_c8_rows(flat[sl[t]], at::kBFloat16);
    // Per 128-column tile: scale = amax / 127, |dequantised - c_kv| <= scale / 2 (+ bf16 input rounding).
    for (int64_t tile = 0; tile < 4; ++tile) {
      const at::Tensor c = r.c_kv[t].narrow(0, tile * 128, 128);
      const double sc = c.abs().max().item<double>() / 127.0;
      EXPECT_NEAR(u.scale[tile].item<double>(), sc, sc * 1e-2) << "tile " << tile;
      EXPECT_LE((d(u.k_nope.narrow(0, tile * 128, 128)) - c).abs().max().item<double>(), sc * 0.5 + 2e-2 * sc * 127);
    }
    expect_close(u.k_rope, r.k_rope[t], 2e-2, "packed k_rope");
  }
}

TEST(RtOpsMlaQuant, PrologV2FaQuantInt8QueryAndNzLatentCache) {
  Prolog p;
  p.make(/*quant=*/true, 14);
  const auto r = p.ref(true);
  const at::Tensor qs = at::full({1, p.Hckv}, 40.0f);  // quant multiplier: dequant scale 1/40
  at::Tensor kv = to_nz(rand_i8({p.nb, p.bs, p.Hckv}), 32);
  at::Tensor kr = to_nz(at::randn({p.nb, p.bs, p.Dr}), 8);
  const at::Tensor kv0 = kv.clone(), kr0 = kr.clone();
  ops::MlaPrologArgs a = p.args(true);
  a.quant_scale_ckv = qs;
  a.cache_mode = "PA_NZ";
  auto [query, query_rope, kv_out, kr_out, dsq] = ops::mla_prolog_v2(a, kv, kr);
  EXPECT_TRUE(kv_out.is_same(kv) && kr_out.is_same(kr));
  ASSERT_EQ(query.scalar_type(), at::kChar);
  ASSERT_EQ(dsq.sizes(), (c10::IntArrayRef{p.T, p.N, 1}));
  // Per (token, head): scale = amax(|query|) / 127 and the int8 query dequantises to within scale / 2.
  const at::Tensor sc = r.query.abs().amax(-1, true) / 127.0;
  expect_close(dsq, sc, 1e-3, "dequant_scale_q_nope");
  EXPECT_LE(((d(query) * d(dsq) - r.query).abs() - sc * 0.51).max().item<double>(), 1e-6);
  expect_close(query_rope, r.query_rope, 2e-3, "query_rope");
  const auto sl = p.slots.accessor<int64_t, 1>();
  at::Tensor kv_nd = kv0.permute({0, 3, 1, 2, 4}).reshape({p.nb, p.bs, p.Hckv}).clone();
  at::Tensor kr_nd = kr0.permute({0, 3, 1, 2, 4}).reshape({p.nb, p.bs, p.Dr}).clone();
  for (int64_t t = 0; t < p.T; ++t) {
    if (sl[t] < 0) continue;
    kv_nd[sl[t] / p.bs][sl[t] % p.bs].copy_(at::round(r.c_kv[t] * 40.0).clamp(-128, 127));
    kr_nd[sl[t] / p.bs][sl[t] % p.bs].copy_(r.k_rope[t]);
  }
  // c_kv * 40 rounds the same way unless it sits within float error of a .5: allow one step.
  EXPECT_LE((d(kv) - d(to_nz(kv_nd.to(at::kChar), 32))).abs().max().item<double>(), 1.0);
  EXPECT_GT((d(kv) == d(to_nz(kv_nd.to(at::kChar), 32))).to(F64).mean().item<double>(), 0.99);
  expect_close(kr, to_nz(kr_nd.to(at::kFloat), 8), 1e-4, "kr_cache (NZ)");
}

TEST(RtOpsMlaQuant, PrologRejectsWhatItDoesNotImplement) {
  Prolog p;
  p.make(/*quant=*/true, 15);
  at::Tensor kv = at::zeros({p.nb, p.bs, 1, p.Hckv}), kr = at::zeros({p.nb, p.bs, 1, p.Dr});
  ops::MlaPrologArgs a = p.args(true);
  for (int64_t m : {1, 3}) {
    a.weight_quant_mode = m;
    expect_not_supported([&] { ops::mla_prolog_v3(a, kv, kr); }, "weight_quant_mode=" + std::to_string(m));
  }
  a.weight_quant_mode = 2;
  for (int64_t m : {1, 2}) {
    a.kv_cache_quant_mode = m;
    expect_not_supported([&] { ops::mla_prolog_v3(a, kv, kr); }, "kv_cache_quant_mode=" + std::to_string(m));
  }
  a.kv_cache_quant_mode = 0;
  a.query_quant_mode = 1;
  expect_not_supported([&] { ops::mla_prolog_v3(a, kv, kr); }, "query_quant_mode");
  a.query_quant_mode = 0;
  a.quant_scale_ckv = at::ones({1, p.Hckv});
  expect_not_supported([&] { ops::mla_prolog_v3(a, kv, kr); }, "quant_scale_ckv");
  a.quant_scale_ckv.reset();
  a.dequant_scale_w_dq.reset();
  expect_invalid([&] { ops::mla_prolog_v3(a, kv, kr); }, "dequant_scale_w_dq is required");
  // v2: the unquantised form and an unquantised cache with quantised inputs.
  ops::MlaPrologArgs b = p.args(true);
  b.quant_scale_ckv = at::ones({1, p.Hckv});
  expect_not_supported([&] { ops::mla_prolog_v2(b, kv, kr); }, "kv_cache with the quantised inputs");
  ops::MlaPrologArgs c = p.args(false);
  c.token_x = p.x;
  expect_not_supported([&] { ops::mla_prolog_v2(c, kv.to(at::kChar), kr); }, "token_x");
  b.quant_scale_ckr = at::ones({1, p.Dr});
  expect_not_supported([&] { ops::mla_prolog_v2(b, kv.to(at::kChar), kr); }, "quant_scale_ckr");
}

// ---------------------------------------------------------------- mla_preprocess (MLAPO)

namespace {

struct Mlapo {
  int64_t T = 4, He = 64, Q = 32, L = 32, R = 8, H = 2, P = 16, nb = 3, bs = 8;
  at::Tensor x, w0, w1, s0, s1, b0, b1, g1, be1, g2, wuk, cos, sin, slots;
  at::Tensor qs0, qo0, qs1, qo1;

  void make(uint64_t seed) {
    at::manual_seed(seed);
    x = at::randn({T, He});
    w0 = rand_i8({L + R + Q, He}, -60, 60);  // (out, in): rows kv | q
    w1 = rand_i8({H * (P + R), Q}, -60, 60);
    s0 = at::rand({L + R + Q}) * 1e-3 + 1e-4;
    s1 = at::rand({H * (P + R)}) * 1e-3 + 1e-4;
    b0 = at::randint(-3000, 3000, {L + R + Q}, at::kInt);
    b1 = at::randint(-3000, 3000, {H * (P + R)}, at::kInt);
    g1 = at::rand({Q}) + 0.5;
    be1 = at::randn({Q}) / 10;
    g2 = at::rand({L}) + 0.5;
    wuk = at::randn({H, P, L}) / 4;
    const at::Tensor ang = at::rand({T, R / 2}) * 6;
    cos = at::cat({ang.cos(), ang.cos()}, -1);
    sin = at::cat({ang.sin(), ang.sin()}, -1);
    slots = at::tensor({5, -1, 12, 20}, at::kInt);
    qs0 = at::full({1}, 0.03f);
    qo0 = at::full({1}, 3, at::kChar);
    qs1 = at::full({1}, 0.025f);
    qo1 = at::full({1}, -2, at::kChar);
  }

  ops::MlaPreprocessArgs args() const {
    ops::MlaPreprocessArgs a;
    a.hidden_state = x;
    a.wdqkv = staging_nz(w0);
    a.descale0 = s0;
    a.gamma1 = g1;
    a.beta1 = be1;
    a.wuq = staging_nz(w1);
    a.descale1 = s1;
    a.gamma2 = g2;
    a.cos = cos;
    a.sin = sin;
    a.wuk = wuk;
    a.slotmapping = slots;
    a.quant_scale0 = qs0;
    a.quant_offset0 = qo0;
    a.bias0 = b0;
    a.quant_scale1 = qs1;
    a.quant_offset1 = qo1;
    a.bias1 = b1;
    a.ctkv_scale = at::ones({1});
    a.q_nope_scale = at::ones({H});
    a.enable_inner_out = true;
    return a;
  }
};

at::Tensor asym_quant_ref(const at::Tensor& x, double scale, double offset) {
  return at::round(d(x) / scale + offset).clamp(-128, 127);
}

}  // namespace

TEST(RtOpsMlaQuant, MlaPreprocessW8A8StaticKropeCtkv) {
  Mlapo m;
  m.make(21);
  // Reference (float64): down projection, norms, RoPE, up projection, absorption.
  const at::Tensor y = (at::matmul(asym_quant_ref(m.x, 0.03, 3), d(m.w0).t()) + d(m.b0)) * d(m.s0);
  const at::Tensor c_kv = rms_ref(y.narrow(1, 0, m.L), m.g2, 1e-6);
  const at::Tensor k_pe = rope_ref(y.narrow(1, m.L, m.R), m.cos, m.sin);
  const at::Tensor c_q = rms_ref(y.narrow(1, m.L + m.R, m.Q), m.g1, 1e-6) + d(m.be1);
  const at::Tensor q = ((at::matmul(asym_quant_ref(c_q, 0.025, -2), d(m.w1).t()) + d(m.b1)) * d(m.s1))
                           .view({m.T, m.H, m.P + m.R});
  const at::Tensor qn = at::einsum("thp,hpl->thl", {q.narrow(-1, 0, m.P), d(m.wuk)});
  const at::Tensor qr = rope_ref(q.narrow(-1, m.P, m.R), m.cos.unsqueeze(1), m.sin.unsqueeze(1));
  for (bool nz : {false, true}) {
    at::Tensor kv = at::randn({m.nb, m.bs, 1, m.L}), kr = at::randn({m.nb, m.bs, 1, m.R});
    at::Tensor kv_want = kv.clone(), kr_want = kr.clone();
    const auto sl = m.slots.accessor<int32_t, 1>();
    for (int64_t t = 0; t < m.T; ++t) {
      if (sl[t] < 0) continue;
      kv_want[sl[t] / m.bs][sl[t] % m.bs][0].copy_(c_kv[t]);
      kr_want[sl[t] / m.bs][sl[t] % m.bs][0].copy_(k_pe[t]);
    }
    if (nz) {
      kv = to_nz(kv.squeeze(2), 8);
      kr = to_nz(kr.squeeze(2), 8);
      kv_want = to_nz(kv_want.squeeze(2), 8);
      kr_want = to_nz(kr_want.squeeze(2), 8);
    }
    at::Tensor q0 = at::full({m.T, m.H, m.L}, NAN), q1 = at::full({m.T, m.H, m.R}, NAN);
    at::Tensor inner = at::full({m.T, m.Q}, NAN);
    ops::MlaPreprocessArgs a = m.args();
    a.cache_mode = nz ? "nzcache" : "krope_ctkv";
    ops::mla_preprocess(a, kv, kr, q0, q1, inner);
    const std::string w = nz ? " (nzcache)" : " (krope_ctkv)";
    expect_close(q0, qn, 2e-3, "q_out0" + w);
    expect_close(q1, qr, 2e-3, "q_out1" + w);
    expect_close(inner, c_q, 1e-4, "inner_out" + w);
    expect_close(kv, kv_want, 1e-4, "kv_cache" + w);
    expect_close(kr, kr_want, 1e-4, "kv_cache_rope" + w);
  }
}

TEST(RtOpsMlaQuant, MlaPreprocessRejectsWhatItDoesNotImplement) {
  Mlapo m;
  m.make(22);
  at::Tensor kv = at::zeros({m.nb, m.bs, 1, m.L}), kr = at::zeros({m.nb, m.bs, 1, m.R});
  at::Tensor q0 = at::zeros({m.T, m.H, m.L}), q1 = at::zeros({m.T, m.H, m.R}), inner = at::zeros({m.T, m.Q});
  for (const char* qm : {"per_token_quant_symm", "per_token_quant_asymm", "no_quant"}) {
    ops::MlaPreprocessArgs a = m.args();
    a.quant_mode = qm;
    expect_not_supported([&] { ops::mla_preprocess(a, kv, kr, q0, q1, inner); }, qm);
  }
  ops::MlaPreprocessArgs a = m.args();
  a.quant_mode = std::nullopt;  // the kernel's default: per_token_quant_symm
  expect_not_supported([&] { ops::mla_preprocess(a, kv, kr, q0, q1, inner); }, "per_token_quant_symm");
  for (const char* cm : {"kvcache", "int8_nzcache"}) {
    a = m.args();
    a.cache_mode = cm;
    expect_not_supported([&] { ops::mla_preprocess(a, kv, kr, q0, q1, inner); }, cm);
  }
  a = m.args();
  a.cos.reset();
  a.sin.reset();
  expect_not_supported([&] { ops::mla_preprocess(a, kv, kr, q0, q1, inner); }, "without RoPE");
  a = m.args();
  a.ctkv_scale = at::full({1}, 2.0f);
  expect_not_supported([&] { ops::mla_preprocess(a, kv, kr, q0, q1, inner); }, "ctkv_scale");
  a = m.args();
  a.descale0 = a.descale0->to(at::kLong);
  expect_not_supported([&] { ops::mla_preprocess(a, kv, kr, q0, q1, inner); }, "int64 descale0");
  a = m.args();
  a.wdqkv = a.wdqkv.narrow(2, 0, 16);
  expect_invalid([&] { ops::mla_preprocess(a, kv, kr, q0, q1, inner); }, "wdqkv");
  // Nothing was written by the rejected calls.
  EXPECT_TRUE(at::equal(kv, at::zeros_like(kv)) && at::equal(q0, at::zeros_like(q0)));
}

// ---------------------------------------------------------------- FIA v2, fully quantised MLA decode

TEST(RtOpsMlaQuant, FiaV2FullQuantBsndNbsdOverNzInt8Cache) {
  at::manual_seed(31);
  const int64_t T = 3, N = 4, L = 64, R = 16, bs = 16, nb = 6;
  const std::vector<int64_t> kv_len{5, 33, 17};
  const at::Tensor lat = rand_i8({nb, bs, L}), rope = at::randn({nb, bs, R});
  const at::Tensor q8 = rand_i8({T, 1, N, L}), qr = at::randn({T, 1, N, R});
  const at::Tensor sq = at::rand({T, 1, N}) * 1e-2 + 1e-3;
  const at::Tensor sk = at::full({1}, 0.02f);
  const at::Tensor table = at::tensor({0, 1, 2, 3, 4, 5, 2, 4, 0}, at::kInt).view({3, 3});
  ops::FiaV2Tensors t;
  t.query = q8;
  t.key = to_nz(lat, 32);
  t.value = t.key;
  t.query_rope = qr;
  t.key_rope = to_nz(rope, 8);
  t.block_table = table;
  t.dequant_scale_query = sq;
  t.dequant_scale_key = sk;
  t.dequant_scale_value = sk;
  ops::FiaV2Params prm;
  prm.has_actual_seq_qlen = false;
  prm.actual_seq_kvlen = kv_len;
  prm.num_query_heads = N;
  prm.num_key_value_heads = 1;
  prm.softmax_scale = 0.1;
  prm.input_layout = "BSND_NBSD";
  prm.block_size = bs;
  prm.query_quant_mode = 3;
  auto [out, lse] = ops::fused_infer_attention_score_v2(t, prm);
  ASSERT_EQ(out.sizes(), (c10::IntArrayRef{N, T, 1, L}));
  ASSERT_EQ(out.scalar_type(), at::kFloat);
  const auto tb = table.accessor<int32_t, 2>();
  for (int64_t b = 0; b < T; ++b) {
    const int64_t s = kv_len[b];
    at::Tensor k = at::empty({s, 1, L + R}, F64), v = at::empty({s, 1, L}, F64);
    for (int64_t j = 0; j < s; ++j) {
      const int64_t blk = tb[b][j / bs], off = j % bs;
      k[j][0].narrow(0, 0, L).copy_(d(lat[blk][off]) * 0.02);
      k[j][0].narrow(0, L, R).copy_(d(rope[blk][off]));
      v[j][0].copy_(d(lat[blk][off]) * 0.02);
    }
    const at::Tensor q = at::cat({d(q8[b][0]) * d(sq[b][0]).unsqueeze(1), d(qr[b][0])}, -1).unsqueeze(0);
    const RefResult want = ref_attention(q, k, v, 0, 0, 0, 0.1);
    expect_close(out.select(1, b).select(1, 0), want.out[0], 1e-4, "batch " + std::to_string(b));
  }
  // Per-token key scales and offsets are not implemented.
  t.dequant_offset_key = at::zeros({1});
  expect_not_supported([&] { ops::fused_infer_attention_score_v2(t, prm); }, "dequant_offset_key");
  t.dequant_offset_key.reset();
  prm.key_quant_mode = 1;
  expect_not_supported([&] { ops::fused_infer_attention_score_v2(t, prm); }, "key_quant_mode=1");
}

// ---------------------------------------------------------------- int8 latent write, NZ gather

TEST(RtOpsMlaQuant, KvRmsnormRopeCacheQuantisesTheLatentAndGatherReadsNz) {
  at::manual_seed(41);
  const int64_t T = 4, L = 64, R = 16, bs = 16, nb = 3;
  const at::Tensor kv = at::randn({T, 1, 1, L + R}), g = at::rand({L}) + 0.5;
  const at::Tensor ang = at::rand({T, R / 2}) * 3;
  const at::Tensor cos = at::cat({ang.cos(), ang.cos()}, -1).view({T, 1, 1, R});
  const at::Tensor sin = at::cat({ang.sin(), ang.sin()}, -1).view({T, 1, 1, R});
  const at::Tensor slots = at::tensor({2, 17, -1, 40}, at::kLong);
  at::Tensor ckv = to_nz(at::zeros({nb, bs, L}, at::kChar), 32);
  at::Tensor kr = to_nz(at::zeros({nb, bs, R}), 8);
  const at::Tensor qs = at::full({1}, 50.0f);
  auto res = ops::kv_rmsnorm_rope_cache(kv, g, cos, sin, slots, kr, ckv, 1e-6, "PA_NZ", true, qs);
  const at::Tensor c = rms_ref(kv.narrow(-1, 0, L), g, 1e-6).view({T, L});
  expect_close(std::get<3>(res).view({T, L}), c, 1e-5, "c_kv_out (unquantised)");
  // Gather the three valid rows back (request 0: slots 0..17 of blocks [0, 1]; request 1: block 2).
  const at::Tensor table = at::tensor({0, 1, 2, 0}, at::kInt).view({2, 2});
  at::Tensor key = at::empty({18 + 16, 1, L}, at::kChar), val = at::empty({18 + 16, 1, R});
  ops::gather_pa_kv_cache(ckv, kr, table, at::tensor({18, 16}, at::kInt), key, val, std::nullopt);
  const at::Tensor c8 = at::round(c * 50.0).clamp(-128, 127);
  EXPECT_LE((d(key[2][0]) - c8[0]).abs().max().item<double>(), 1.0);
  EXPECT_LE((d(key[17][0]) - c8[1]).abs().max().item<double>(), 1.0);
  EXPECT_LE((d(key[18 + 8][0]) - c8[3]).abs().max().item<double>(), 1.0);
  EXPECT_TRUE(at::equal(key[3][0], at::zeros({L}, at::kChar)));
  // An int8 cache without c_kv_scale is rejected by name.
  expect_invalid([&] { ops::kv_rmsnorm_rope_cache(kv, g, cos, sin, slots, kr, ckv, 1e-6, "PA_NZ", true); },
                 "int8 needs c_kv_scale");
}
