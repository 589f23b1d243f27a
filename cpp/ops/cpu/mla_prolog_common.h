// Internal: the maths shared by the CPU twins of npu_mla_prolog_v2 and
// npu_mla_prolog_v3 (docs/design/mla.md §5.4, docs/design/sfa.md §4.2; the torch_npu 2.14.0
// documentation of both operators). Each twin maps its arguments onto a Mode
// (rejecting by name what it does not implement) and calls run():
//
//   weights: W_dq (He, Hcq), W_uq_qr (Hcq, N*(D+Dr)), W_uk (N, D, Hckv), W_dkv_kr (He, Hckv+Dr)
//   c_q   = RMSNorm(x W_dq) * gamma_cq                      (activation dtype)
//   [q_n | q_r] per head = c_q W_uq_qr
//   query      = q_n W_uk[n]                    (N, Hckv)
//   query_rope = rotate_half RoPE(q_r)           (N, Dr)
//   [c | k_r]  = x W_dkv_kr;  c_kv = RMSNorm(c) * gamma_ckv, k_rope = rotate_half RoPE(k_r)
//   the token's cache rows at cache_index (negative: skipped).
// Full quantisation (token_x int8 with its per-token dequant scale, int8
// weights with per-output-channel dequant scales; v2's int8 inputs, v3's
// weight_quant_mode 2): each x-matmul is exact in integers, then scaled by
// dequant_scale_x[t] * dequant_scale_w[c]; c_q is quantised per token
// (symmetric int8, scale = amax / 127, round half to even: npu_dynamic_quant's
// rule) before its matmul with the int8 W_uq_qr, whose result is scaled by
// that token scale * dequant_scale_w_uq_qr[c].
// Cache quantisation:
//   KvQuant::Channel (v2 full quantisation with an int8 kv_cache): c_kv is
//     stored as saturate_int8(rint(c_kv * quant_scale_ckv[c])) (quant_scale_ckv
//     is the multiplier: the reciprocal of the dequant scale the attention
//     kernel takes [verify on hardware]); k_rope unquantised. The query is then
//     quantised per (token, head): dequant_scale_q_nope = amax(|query|) / 127,
//     query = rint(query / dequant_scale_q_nope) (the v3 documentation's formula).
//   KvQuant::Tile (v3 kv_cache_quant_mode 3, ckvkr_repo_mode 1,
//     quant_scale_repo_mode 1, tile 128): the SFA C8 packed 656-byte row
//     [int8 c_kv per 128-column tile | k_rope bytes | 4 fp32 tile scales]
//     (ops/sfa_c8_rows.h) written into kv_cache (nb, bs, 1, 656); kr_cache is
//     not written (upstream passes a dummy).
// query_norm (v3 query_norm_flag): c_q in the activation dtype, or (full
// quantisation) its per-token int8 form with dequant_scale_q_norm (T, 1).
// Caches: ND (nb, bs, 1, D) ("PA_BSND") or NZ (nb, 1, D/c, bs, c) ("PA_NZ"),
// c = 32 / element size. Everything is validated before the first cache write.
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <tuple>

namespace aar::ops::cpu::prolog {

enum class KvQuant { None, Channel, Tile };

struct Mode {
  const char* op = "";
  bool full_quant = false;  // int8 token_x and weights
  KvQuant kv = KvQuant::None;
  bool query_norm = false;
  bool nz = false;
};

struct Inputs {
  const at::Tensor* token_x;
  const at::Tensor* weight_dq;
  const at::Tensor* weight_uq_qr;
  const at::Tensor* weight_uk;
  const at::Tensor* weight_dkv_kr;
  const at::Tensor* gamma_cq;
  const at::Tensor* gamma_ckv;
  const at::Tensor* rope_sin;
  const at::Tensor* rope_cos;
  const at::Tensor* kv_cache;
  const at::Tensor* kr_cache;
  std::optional<at::Tensor> cache_index;
  std::optional<at::Tensor> dequant_scale_x, dequant_scale_w_dq, dequant_scale_w_uq_qr, dequant_scale_w_dkv_kr;
  std::optional<at::Tensor> quant_scale_ckv;
  double eps_cq = 1e-5, eps_ckv = 1e-5;
};

// (query, query_rope, dequant_scale_q_nope, query_norm, dequant_scale_q_norm);
// the unused ones are (1,) zero tensors, as the operators document.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> run(const Mode& m, const Inputs& in);

}  // namespace aar::ops::cpu::prolog
