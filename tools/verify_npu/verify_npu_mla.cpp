// verify-npu rows of the MLA family (cpp/mla, the SFA / MLA decode preprocess):
// mla_preprocess (MLAPO), npu_mla_prolog_v3 / v2, npu_kv_rmsnorm_rope_cache,
// npu_interleave_rope, FIA v1 / v2 over the latent layouts, the W_UV
// projections (npu_transpose_batchmatmul, batch_matmul_transpose) and
// npu_gather_pa_kv_cache, the latent cache write of mla::LatentAttention
// (npu_scatter_pa_kv_cache). Conventions: verify_npu_cases.h.
#include <ATen/ATen.h>

#include <sstream>

#include "ascend_attn_rt/ops/batch_matmul_transpose.h"
#include "ascend_attn_rt/ops/fused_infer_attention.h"
#include "ascend_attn_rt/ops/gather_pa_kv_cache.h"
#include "ascend_attn_rt/ops/interleave_rope.h"
#include "ascend_attn_rt/ops/kv_cache_write.h"
#include "ascend_attn_rt/ops/kv_rmsnorm_rope_cache.h"
#include "ascend_attn_rt/ops/mla_preprocess.h"
#include "ascend_attn_rt/ops/mla_prolog.h"
#include "ascend_attn_rt/ops/transpose_batchmatmul.h"
#include "verify_npu_cases.h"

namespace aar::verify::detail {

namespace {

// ND (nb, bs, D) -> NZ (nb, 1, D / c, bs, c): the FRACTAL_NZ cache layout.
at::Tensor to_nz(const at::Tensor& nd, int64_t c) {
  const int64_t nb = nd.size(0), bs = nd.size(1), D = nd.size(2);
  return nd.view({nb, bs, D / c, c}).permute({0, 2, 1, 3}).unsqueeze(1).contiguous();
}

// Half-split RoPE tables (T, R): [cos | cos], [sin | sin].
std::pair<at::Tensor, at::Tensor> rope_tables(int64_t T, int64_t R, at::ScalarType dt) {
  const at::Tensor ang = at::rand({T, R / 2}) * 6;
  return {at::cat({ang.cos(), ang.cos()}, -1).to(dt), at::cat({ang.sin(), ang.sin()}, -1).to(dt)};
}

at::Tensor i8(at::IntArrayRef shape, int64_t lo = -60, int64_t hi = 60) { return at::randint(lo, hi, shape, at::kChar); }

const char* dt_name(at::ScalarType dt) { return dt == at::kBFloat16 ? "bfloat16" : dt == at::kHalf ? "float16" : "float32"; }

// ---- mla_preprocess (MLAPO, W8A8 static)
Case mlapo(bool nz, at::ScalarType dt) {
  std::ostringstream a;
  a << "_C_ascend W8A8-static " << dt_name(dt) << " T=4 He=256 Q=64 L=64 R=16 H=2 P=32, quant_mode="
    << "per_tensor_quant_asymm cache_mode=" << (nz ? "nzcache" : "krope_ctkv")
    << " enable_inner_out=True, int32 slots with -1";
  return Case{"mla_preprocess", a.str(),
              "MLAPO reads the NZ-staged int8 weights as transdata writes them, the rope rows pre-permuted "
              "(rotate-half RoPE of q_pe / k_pe), bias0/bias1 in accumulator units; slot -1 is not written",
              2e-2, [=](const Side& s) {
                at::manual_seed(21);
                const int64_t T = 4, He = 256, Q = 64, L = 64, R = 16, H = 2, P = 32, nb = 3, bs = 16;
                const auto [cos, sin] = rope_tables(T, R, dt);
                ops::MlaPreprocessArgs m;
                m.hidden_state = s.to(rnd({T, He}, dt));
                m.wdqkv = s.to(i8({1, He / 32, L + R + Q, 32}));
                m.descale0 = s.to(at::rand({L + R + Q}) * 1e-3 + 1e-4);
                m.gamma1 = s.to((at::rand({Q}) + 0.5).to(dt));
                m.beta1 = s.to(rnd({Q}, dt, 0.1));
                m.wuq = s.to(i8({1, Q / 32, H * (P + R), 32}));
                m.descale1 = s.to(at::rand({H * (P + R)}) * 1e-3 + 1e-4);
                m.gamma2 = s.to((at::rand({L}) + 0.5).to(dt));
                m.cos = s.to(cos);
                m.sin = s.to(sin);
                m.wuk = s.to(rnd({H, P, L}, dt, 0.25));
                m.slotmapping = s.to(i32({5, -1, 12, 40}));
                m.quant_scale0 = s.to(at::full({1}, 0.03).to(dt));
                m.quant_offset0 = s.to(at::full({1}, 3, at::kChar));
                m.bias0 = s.to(at::randint(-3000, 3000, {L + R + Q}, at::kInt));
                m.quant_scale1 = s.to(at::full({1}, 0.025).to(dt));
                m.quant_offset1 = s.to(at::full({1}, -2, at::kChar));
                m.bias1 = s.to(at::randint(-3000, 3000, {H * (P + R)}, at::kInt));
                m.ctkv_scale = s.to(at::ones({1}));
                m.q_nope_scale = s.to(at::ones({H}));
                m.cache_mode = nz ? "nzcache" : "krope_ctkv";
                m.enable_inner_out = true;
                const int64_t c = 16;  // 32 bytes of a 2-byte dtype
                at::Tensor kv = rnd({nb, bs, 1, L}, dt), kr = rnd({nb, bs, 1, R}, dt);
                if (nz) {
                  kv = to_nz(kv.squeeze(2), c);
                  kr = to_nz(kr.squeeze(2), c);
                }
                kv = s.to(kv);
                kr = s.to(kr);
                at::Tensor q0 = s.to(at::zeros({T, H, L}, dt)), q1 = s.to(at::zeros({T, H, R}, dt));
                at::Tensor inner = s.to(at::zeros({T, Q}, dt));
                ops::mla_preprocess(m, kv, kr, q0, q1, inner, s.pv);
                return on_cpu({q0, q1, inner, kv, kr});
              }};
}

// ---- npu_mla_prolog_v3 / v2
struct PrologData {
  int64_t T = 5, He = 64, Hcq = 32, N = 2, D = 16, Dr = 8, Hckv = 32, nb = 4, bs = 16;
  ops::MlaPrologArgs a;
};

// quant: W8A8 (int8 token_x and weights with per-channel dequant scales).
PrologData prolog_data(const Side& s, bool quant, at::ScalarType dt, int64_t Hckv, int64_t Dr) {
  at::manual_seed(22);
  PrologData p;
  p.Hckv = Hckv;
  p.Dr = Dr;
  ops::MlaPrologArgs& a = p.a;
  const int64_t T = p.T, He = p.He, Hcq = p.Hcq, N = p.N, D = p.D;
  if (quant) {
    a.token_x = s.to(i8({T, He}, -127, 128));
    a.dequant_scale_x = s.to(at::rand({T, 1}) * 1e-2 + 1e-3);
    a.weight_dq = s.to(i8({He, Hcq}, -100, 100));
    a.weight_uq_qr = s.to(i8({Hcq, N * (D + Dr)}, -100, 100));
    a.weight_dkv_kr = s.to(i8({He, Hckv + Dr}, -100, 100));
    a.dequant_scale_w_dq = s.to(at::rand({1, Hcq}) * 1e-3 + 1e-4);
    a.dequant_scale_w_uq_qr = s.to(at::rand({1, N * (D + Dr)}) * 1e-3 + 1e-4);
    a.dequant_scale_w_dkv_kr = s.to(at::rand({1, Hckv + Dr}) * 1e-3 + 1e-4);
  } else {
    a.token_x = s.to(rnd({T, He}, dt));
    a.weight_dq = s.to(rnd({He, Hcq}, dt, 0.125));
    a.weight_uq_qr = s.to(rnd({Hcq, N * (D + Dr)}, dt, 0.16));
    a.weight_dkv_kr = s.to(rnd({He, Hckv + Dr}, dt, 0.125));
  }
  a.weight_uk = s.to(rnd({N, D, Hckv}, dt, 0.25));
  a.rmsnorm_gamma_cq = s.to((at::rand({Hcq}) + 0.5).to(dt));
  a.rmsnorm_gamma_ckv = s.to((at::rand({Hckv}) + 0.5).to(dt));
  const auto [cos, sin] = rope_tables(T, Dr, dt);
  a.rope_cos = s.to(cos);
  a.rope_sin = s.to(sin);
  a.cache_index = s.to(at::tensor({3, 17, -1, 30, 9}, at::kLong));
  a.rmsnorm_epsilon_cq = a.rmsnorm_epsilon_ckv = 1e-6;
  return p;
}

Case prolog_v3(int mode) {
  // mode 0: unquantised bf16 (MLA enable_prolog, SFA PROLOG_V3), 1: W8A8
  // (weight_quant_mode 2), 2: SFA C8 (W8A8 + kv_cache_quant_mode 3 into the
  // packed 656-byte rows).
  static const char* args[] = {
      "bfloat16 T=5 He=64 Hcq=32 N=2 D=16 Dr=8 Hckv=32, cache_mode=PA_BSND query_norm_flag=True, int64 "
      "cache_index with -1",
      "W8A8: int8 token_x + dequant_scale_x (T,1), int8 weights + per-channel scales, weight_quant_mode=2 "
      "query_norm_flag=True, bfloat16 caches PA_BSND",
      "SFA C8: weight_quant_mode=2 kv_cache_quant_mode=3 ckvkr_repo_mode=1 quant_scale_repo_mode=1 "
      "tile_size=128 k_nope_clip_alpha=[1], Hckv=512 Dr=64 into the (nb,bs,1,656) int8 packed cache"};
  return Case{"npu_mla_prolog_v3", args[mode],
              mode == 2 ? "the packed C8 row is [512 int8 | 64 rope in the query dtype | 4 fp32 scales], scale = "
                          "amax / 127 per 128-column tile"
                        : "rope columns of weight_uq_qr / weight_dkv_kr in half-split order give rotate-half RoPE; "
                          "query_norm is c_q after its RMSNorm",
              2e-2, [mode](const Side& s) {
                const bool quant = mode != 0;
                PrologData p = prolog_data(s, quant, at::kBFloat16, mode == 2 ? 512 : 32, mode == 2 ? 64 : 8);
                ops::MlaPrologArgs& a = p.a;
                at::Tensor kv, kr;
                if (mode == 2) {
                  a.weight_quant_mode = 2;
                  a.kv_cache_quant_mode = 3;
                  a.ckvkr_repo_mode = 1;
                  a.quant_scale_repo_mode = 1;
                  a.k_nope_clip_alpha = s.to(at::ones({1}));
                  kv = s.to(at::zeros({p.nb, p.bs, 1, 656}, at::kChar));  // zeros: untouched rows dequantise to 0
                  kr = s.to(at::empty({0}, at::kBFloat16));
                } else {
                  a.weight_quant_mode = quant ? 2 : 0;
                  a.query_norm_flag = true;
                  kv = s.to(rnd({p.nb, p.bs, 1, p.Hckv}, at::kBFloat16));
                  kr = s.to(rnd({p.nb, p.bs, 1, p.Dr}, at::kBFloat16));
                }
                auto [q, qr, dsq, qn, dsqn] = ops::mla_prolog_v3(a, kv, kr, s.pv);
                if (mode == 2) {
                  // The packed rows compared as their parts (int8 nope dequantised with its tile scale).
                  const at::Tensor rows = kv.cpu().view({-1, 656});
                  const at::Tensor scale = rows.narrow(1, 640, 16).contiguous().view(at::kFloat);  // (rows, 4)
                  const at::Tensor nope = rows.narrow(1, 0, 512).to(at::kFloat).view({-1, 4, 128}) * scale.unsqueeze(-1);
                  const at::Tensor rope = rows.narrow(1, 512, 128).contiguous().view(at::kBFloat16);
                  return on_cpu({q, qr, nope, rope});
                }
                return on_cpu({q, qr, qn, kv, kr});
              }};
}

Case prolog_v2_fa_quant() {
  return Case{"npu_mla_prolog_v2",
              "FA-quant W8A8: int8 token_x, quant_scale_ckv (1,Hckv) into an int8 PA_NZ latent cache (nb,1,Hckv/32,bs,32), "
              "bfloat16 rope cache NZ, int8 query + dequant_scale_q_nope (T,N,1)",
              "the int8 latent is saturate(rint(c_kv * quant_scale_ckv)) (the scale multiplies); the query is "
              "quantised per (token, head), scale = amax / 127",
              2e-2, [](const Side& s) {
                PrologData p = prolog_data(s, true, at::kBFloat16, 32, 16);
                ops::MlaPrologArgs& a = p.a;
                a.quant_scale_ckv = s.to(at::full({1, p.Hckv}, 40.0f));
                a.cache_mode = "PA_NZ";
                at::Tensor kv = s.to(to_nz(i8({p.nb, p.bs, p.Hckv}), 32));
                at::Tensor kr = s.to(to_nz(rnd({p.nb, p.bs, p.Dr}, at::kBFloat16), 16));
                auto [q, qr, kv_o, kr_o, dsq] = ops::mla_prolog_v2(a, kv, kr, s.pv);
                const at::Tensor qdeq = q.cpu().to(at::kFloat) * dsq.cpu();
                return on_cpu({qdeq, qr, kv.to(at::kFloat) / 40.0, kr});
              }};
}

// ---- npu_kv_rmsnorm_rope_cache (the native MLA preprocess's cache write)
Case kv_rmsnorm(const char* mode, at::ScalarType dt, bool int8_latent) {
  std::ostringstream a;
  a << "kv (td=5,1,1,L+R) " << dt_name(dt) << " L=64 R=16, cache_mode=" << mode << " is_output_kv=False, int64 slots with -1";
  if (int8_latent) a << ", c_kv_scale (L) fp32 into an int8 latent cache (FA-quant prefill)";
  return Case{"npu_kv_rmsnorm_rope_cache", a.str(),
              int8_latent ? "c_kv_scale multiplies: the latent is saturate(rint(c_kv * c_kv_scale))"
                          : "k_pe is interleaved on input and stored half-split (interleave-pair RoPE); slot -1 skipped",
              int8_latent ? 2e-2 : 1e-2, [=](const Side& s) {
                at::manual_seed(23);
                const int64_t td = 5, L = 64, R = 16, nb = 4, bs = 16;
                const bool nz = std::string(mode) == "PA_NZ";
                const auto [cos, sin] = rope_tables(td, R, dt);
                const at::Tensor kv = rnd({td, 1, 1, L + R}, dt);
                at::Tensor kc = rnd({nb, bs, 1, R}, dt);
                at::Tensor ckv = int8_latent ? at::zeros({nb, bs, 1, L}, at::kChar) : rnd({nb, bs, 1, L}, dt);
                if (nz) {
                  kc = to_nz(kc.squeeze(2), 16);
                  ckv = to_nz(ckv.squeeze(2), int8_latent ? 32 : 16);
                }
                kc = s.to(kc);
                ckv = s.to(ckv);
                const at::Tensor idx = s.to(at::tensor({7, 40, -1, 2, 63}, at::kLong));
                std::optional<at::Tensor> scale;
                if (int8_latent) scale = s.to(at::full({L}, 30.0f));
                ops::kv_rmsnorm_rope_cache(s.to(kv), s.to((at::rand({L}) + 0.5).to(dt)), s.to(cos.view({td, 1, 1, R})),
                                           s.to(sin.view({td, 1, 1, R})), idx, kc, ckv, 1e-6, mode, false, scale, s.pv);
                return on_cpu({kc, int8_latent ? ckv.to(at::kFloat) / 30.0 : ckv});
              }};
}

Case interleave_rope() {
  return Case{"npu_interleave_rope", "x (td=6, H=4, 1, R=64) bfloat16, cos/sin (td, 1, 1, 64) half-split tables",
              "input pairs (2i, 2i+1) are rotated and written half-split", 1e-2, [](const Side& s) {
                at::manual_seed(24);
                const auto [cos, sin] = rope_tables(6, 64, at::kBFloat16);
                return on_cpu({ops::interleave_rope(s.to(rnd({6, 4, 1, 64}, at::kBFloat16)), s.to(cos.view({6, 1, 1, 64})),
                                                    s.to(sin.view({6, 1, 1, 64})), s.pv)});
              }};
}

// ---- FIA over the latent layouts (MLA decode, DCP decode, MLA prefill)
struct Latent {
  Paged nope;
  at::Tensor rope;
  std::vector<int64_t> kv_lens{40, 7, 30};
  int64_t L = 64, R = 16, bs = 16, N = 8;
};

Latent latent(at::ScalarType dt, uint64_t seed) {
  Latent l;
  l.nope = paged(l.kv_lens, l.bs, {1, l.L}, dt, seed);
  l.rope = like_pages(l.nope, {1, l.R}, dt, seed + 1);
  return l;
}

// The latent caches as FIA (v1 or v2) reads them: key = value = the
// (nb, bs, 1, L) cache viewed (nb, 1, bs, L) (Nkv = 1), the rope cache alike.
template <class FiaT>
void latent_kv(FiaT& t, const Side& s, const Latent& l) {
  t.key = s.to(l.nope.cache).view({l.nope.nb, 1, l.bs, l.L});
  t.value = t.key;
  t.key_rope = s.to(l.rope).view({l.nope.nb, 1, l.bs, l.R});
  t.block_table = s.to(l.nope.table);
}

Case fia_v2_latent(const char* layout, bool out = false) {
  const bool tnd = std::string(layout) == "TND_NTD";
  std::ostringstream a;
  a << "MLA decode bfloat16 N=8 Nkv=1 L=64 R=16 query_rope/key_rope, key (nb,1,bs,L) = the (nb,bs,1,L) cache viewed, "
    << "bs=16 input_layout=" << layout << (tnd ? " sparse_mode=3 (q_lens 1,2,1, 2048 mask)" : " sparse_mode=0")
    << out_note(out);
  return Case{"npu_fused_infer_attention_score_v2", a.str(),
              tnd ? "TND_NTD returns (N, T, L); multi-token decodes are bottom-right causal over their own KV"
                  : "BNSD_NBSD returns (N, B, 1, L); the (nb,1,bs,L) view of the (nb,bs,1,L) cache is read as BNSD pages",
              5e-3, [=](const Side& s) {
                const Latent l = latent(at::kBFloat16, 25);
                at::manual_seed(26);
                const std::vector<int64_t> q_lens = tnd ? std::vector<int64_t>{1, 2, 1} : std::vector<int64_t>{1, 1, 1};
                const int64_t T = 4 - (tnd ? 0 : 1);
                const std::vector<int64_t> q_cum = cumsum(q_lens);
                ops::FiaV2Tensors t;
                if (tnd) {
                  t.query = s.to(rnd({T, l.N, l.L}, at::kBFloat16));
                  t.query_rope = s.to(rnd({T, l.N, l.R}, at::kBFloat16));
                  t.atten_mask = s.to(at::triu(at::ones({2048, 2048}, at::kBool), 1));
                } else {
                  t.query = s.to(rnd({T, l.N, 1, l.L}, at::kBFloat16));
                  t.query_rope = s.to(rnd({T, l.N, 1, l.R}, at::kBFloat16));
                }
                latent_kv(t, s, l);
                ops::FiaV2Params p;
                p.num_query_heads = l.N;
                p.num_key_value_heads = 1;
                p.softmax_scale = 0.1;
                p.block_size = l.bs;
                p.actual_seq_kvlen = l.kv_lens;
                p.input_layout = layout;
                p.sparse_mode = tnd ? 3 : 0;
                p.has_actual_seq_qlen = tnd;
                if (tnd) p.actual_seq_qlen = q_cum;
                // The .out buffer: (N, T, L) for TND_NTD, (N, B, 1, L) for BNSD_NBSD.
                std::vector<int64_t> shape;
                if (out) shape = tnd ? std::vector<int64_t>{l.N, T, l.L} : std::vector<int64_t>{l.N, T, 1, l.L};
                return run_fia_v2(t, p, s, shape, at::kBFloat16);
              }};
}

Case fia_v2_fa_quant() {
  return Case{"npu_fused_infer_attention_score_v2",
              "MLA FA-quant decode: int8 query (B,1,N,L) + dequant_scale_query (B,1,N) query_quant_mode=3, int8 NZ "
              "latent (nb,1,L/32,bs,32) + per-tensor dequant_scale_key/_value, bfloat16 NZ rope, BSND_NBSD",
              "query_quant_mode 3 dequantises q per (token, head) and the latent per tensor before the softmax", 5e-3,
              [](const Side& s) {
                at::manual_seed(27);
                const int64_t B = 3, N = 4, L = 64, R = 16, bs = 16;
                const Paged lat = paged({5, 33, 17}, bs, {L}, at::kFloat, 28);
                const at::Tensor lat8 = at::randint(-100, 100, {lat.nb, bs, L}, at::kChar);
                const at::Tensor rope = rnd({lat.nb, bs, R}, at::kBFloat16);
                const std::vector<int64_t> kv{5, 33, 17};
                ops::FiaV2Tensors t;
                t.query = s.to(at::randint(-100, 100, {B, 1, N, L}, at::kChar));
                t.query_rope = s.to(rnd({B, 1, N, R}, at::kBFloat16));
                t.key = s.to(to_nz(lat8, 32));
                t.value = t.key;
                t.key_rope = s.to(to_nz(rope, 16));
                t.block_table = s.to(lat.table);
                t.dequant_scale_query = s.to(at::rand({B, 1, N}) * 1e-2 + 1e-3);
                t.dequant_scale_key = s.to(at::full({1}, 0.02f));
                t.dequant_scale_value = t.dequant_scale_key;
                ops::FiaV2Params p;
                p.has_actual_seq_qlen = false;
                p.actual_seq_kvlen = kv;
                p.num_query_heads = N;
                p.num_key_value_heads = 1;
                p.softmax_scale = 0.1;
                p.input_layout = "BSND_NBSD";
                p.block_size = bs;
                p.query_quant_mode = 3;
                return on_cpu({std::get<0>(ops::fused_infer_attention_score_v2(t, p, s.pv))});
              }};
}

Case fia_v1_latent_lse() {
  return Case{"npu_fused_infer_attention_score",
              "MLA DCP decode: BNSD query (B,N,1,L) + query_rope, key (nb,1,bs,L) + key_rope, Nkv=1, sparse_mode=0, "
              "no actual_seq_lengths, softmax_lse_flag=True, bfloat16",
              "the latent decode's LSE is (B, N, 1, 1) fp32 natural log over the local keys (the DCP merge reads it)",
              5e-3, [](const Side& s) {
                const Latent l = latent(at::kBFloat16, 29);
                at::manual_seed(30);
                ops::FiaTensors t;
                t.query = s.to(rnd({3, l.N, 1, l.L}, at::kBFloat16));
                t.query_rope = s.to(rnd({3, l.N, 1, l.R}, at::kBFloat16));
                latent_kv(t, s, l);
                ops::FiaParams p;
                p.num_heads = l.N;
                p.num_key_value_heads = 1;
                p.scale = 0.1;
                p.input_layout = "BNSD";
                p.block_size = l.bs;
                p.has_actual_seq_lengths = false;
                p.actual_seq_lengths_kv = l.kv_lens;
                p.softmax_lse_flag = true;
                auto [o, lse] = ops::fused_infer_attention_score(t, p, s.pv);
                return on_cpu({o, lse});
              }};
}

Case fia_v1_mla_prefill(bool concat, bool causal) {
  std::ostringstream a;
  a << "MLA prefill TND bfloat16 H=4 P=32 R=16 V=32 dense K/V (num_key_value_heads=H), "
    << (concat ? "q/k concatenated [nope|rope] (no rope tensors)" : "query_rope/key_rope")
    << (causal ? ", sparse_mode=3 with the 2048 mask" : ", sparse_mode=0 over a gathered context chunk")
    << ", softmax_lse_flag=True";
  return Case{"npu_fused_infer_attention_score", a.str(),
              !causal ? "a context chunk (kv ends != q ends) attends every key; its LSE merges with npu_attention_update"
              : concat ? "q / k concatenated to D = P + R with no rope tensors (non-power-of-two heads) is plain "
                         "attention with Dv != Dqk"
                       : "the MLA TND prefill with separate rope tensors equals attention over [nope | rope], Dv != Dqk",
              5e-3, [=](const Side& s) {
                at::manual_seed(31);
                const int64_t H = 4, P = 32, R = 16, V = 32;
                const std::vector<int64_t> q_cum{3, 8, 9};
                const std::vector<int64_t> kv_cum = causal ? q_cum : std::vector<int64_t>{10, 14, 30};
                const int64_t T = q_cum.back(), S = kv_cum.back();
                const at::Tensor qn = rnd({T, H, P}, at::kBFloat16), qr = rnd({T, H, R}, at::kBFloat16);
                const at::Tensor kn = rnd({S, H, P}, at::kBFloat16), kr = rnd({S, H, R}, at::kBFloat16);
                ops::FiaTensors t;
                if (concat) {
                  t.query = s.to(at::cat({qn, qr}, -1));
                  t.key = s.to(at::cat({kn, kr}, -1));
                } else {
                  t.query = s.to(qn);
                  t.key = s.to(kn);
                  t.query_rope = s.to(qr);
                  t.key_rope = s.to(kr);
                }
                t.value = s.to(rnd({S, H, V}, at::kBFloat16));
                if (causal) t.atten_mask = s.to(at::triu(at::ones({2048, 2048}, at::kBool), 1));
                ops::FiaParams p;
                p.sparse_mode = causal ? 3 : 0;
                p.num_heads = H;
                p.num_key_value_heads = H;
                p.scale = 0.15;
                p.input_layout = "TND";
                p.actual_seq_lengths = q_cum;
                p.actual_seq_lengths_kv = kv_cum;
                p.softmax_lse_flag = true;
                auto [o, lse] = ops::fused_infer_attention_score(t, p, s.pv);
                return on_cpu({o, lse});
              }};
}

// ---- the W_UV up-projections
Case transpose_bmm(bool token_major) {
  return Case{"npu_transpose_batchmatmul",
              token_major ? "(td=6,H=4,L=64) bfloat16 @ W_UV (H,L,V=32), perm_x1=(1,0,2) perm_y=(1,0,2) -> (td,H,V)"
                          : "(H=4,td=6,L=64) bfloat16 @ W_UV (H,L,V=32), perm_y=(1,0,2) -> (td,H,V)",
              "perm_x1 permutes the input to (batch, m, k) before the bmm, perm_y the (batch, m, n) result", 1e-2,
              [=](const Side& s) {
                at::manual_seed(32);
                static const int64_t perm[3] = {1, 0, 2};
                const at::Tensor x = token_major ? rnd({6, 4, 64}, at::kBFloat16) : rnd({4, 6, 64}, at::kBFloat16);
                const at::Tensor w = rnd({4, 64, 32}, at::kBFloat16, 0.2);
                std::optional<c10::IntArrayRef> px1;
                if (token_major) px1 = c10::IntArrayRef(perm, 3);
                return on_cpu({ops::transpose_batchmatmul(s.to(x), s.to(w), px1, std::nullopt,
                                                          c10::IntArrayRef(perm, 3), s.pv)});
              }};
}

Case batch_matmul_transpose_case() {
  return Case{"batch_matmul_transpose", "_C_ascend a (T=6,N=4,L=64) float16, b (N,L,V=32), c (T,N,V) written in place",
              "c[t, n] = a[t, n] @ b[n] (fp32 accumulation), format_mode / quant_mode None", 1e-2, [](const Side& s) {
                at::manual_seed(33);
                at::Tensor c = s.to(at::zeros({6, 4, 32}, at::kHalf));
                ops::batch_matmul_transpose(s.to(rnd({6, 4, 64}, at::kHalf)), s.to(rnd({4, 64, 32}, at::kHalf, 0.2)), c,
                                            std::nullopt, std::nullopt, s.pv);
                return on_cpu({c});
              }};
}

Case gather_pa() {
  return Case{"npu_gather_pa_kv_cache",
              "latent (nb,bs=16,1,L=64) + rope (nb,16,1,R=16) bfloat16 caches, int32 seq_lens (5,16,9) and seq_offset "
              "(0,16,32) (a chunk of context per request)",
              "request b's rows [seq_offset[b], seq_offset[b] + seq_lens[b]) through its block table, packed request "
              "after request",
              0.0, [](const Side& s) {
                const Paged c = paged({40, 48, 41}, 16, {1, 64}, at::kBFloat16, 34);
                const at::Tensor r = like_pages(c, {1, 16}, at::kBFloat16, 35);
                at::Tensor k = s.to(at::zeros({30, 1, 64}, at::kBFloat16)), v = s.to(at::zeros({30, 1, 16}, at::kBFloat16));
                ops::gather_pa_kv_cache(s.to(c.cache), s.to(r), s.to(c.table), s.to(i32({5, 16, 9})), k, v,
                                        s.to(i32({0, 16, 32})), s.pv);
                return on_cpu({k, v});
              }};
}

// mla::LatentAttention::write_kv: the normalised latent and rotated k_pe (key
// and value of different widths) into the two caches, a -1 slot skipped.
Case latent_cache_write() {
  return Case{"npu_scatter_pa_kv_cache",
              "key (T=7, 1, L=512) / value (7, 1, R=64) bfloat16 (different widths), cache_mode=Norm, latent "
              "(nb=4, bs=128, 1, 512) + rope (4, 128, 1, 64) caches, slot_mapping int64 with a -1",
              "slot s >= 0 writes block s / bs, row s % bs of each cache; slot -1 writes nothing", 0.0,
              [](const Side& s) {
                at::manual_seed(36);
                const at::Tensor k = at::randn({7, 1, 512}).to(at::kBFloat16), v = at::randn({7, 1, 64}).to(at::kBFloat16);
                at::Tensor kc = s.to(at::zeros({4, 128, 1, 512}, at::kBFloat16));
                at::Tensor vc = s.to(at::zeros({4, 128, 1, 64}, at::kBFloat16));
                const at::Tensor slots = s.to(at::tensor({5, 300, -1, 128, 511, 0, 257}, at::kLong));
                ops::scatter_pa_kv_cache(s.to(k), s.to(v), kc, vc, slots, "Norm", s.pv);
                return on_cpu({kc, vc});
              }};
}

}  // namespace

void add_mla_cases(std::vector<Case>& c) {
  c.push_back(mlapo(false, at::kBFloat16));
  c.push_back(mlapo(true, at::kHalf));
  c.push_back(prolog_v3(0));
  c.push_back(prolog_v3(1));
  c.push_back(prolog_v3(2));
  c.push_back(prolog_v2_fa_quant());
  c.push_back(kv_rmsnorm("PA", at::kBFloat16, false));
  c.push_back(kv_rmsnorm("PA_NZ", at::kHalf, false));
  c.push_back(kv_rmsnorm("PA", at::kBFloat16, true));
  c.push_back(interleave_rope());
  c.push_back(fia_v2_latent("TND_NTD"));
  c.push_back(fia_v2_latent("BNSD_NBSD"));
  c.push_back(fia_v2_latent("TND_NTD", true));  // the MLA eager decode's call
  c.push_back(fia_v2_latent("BNSD_NBSD", true));
  c.push_back(fia_v2_fa_quant());
  c.push_back(fia_v1_latent_lse());
  c.push_back(fia_v1_mla_prefill(false, true));
  c.push_back(fia_v1_mla_prefill(true, true));
  c.push_back(fia_v1_mla_prefill(false, false));
  c.push_back(transpose_bmm(false));
  c.push_back(transpose_bmm(true));
  c.push_back(batch_matmul_transpose_case());
  c.push_back(gather_pa());
  c.push_back(latent_cache_write());
}

}  // namespace aar::verify::detail
