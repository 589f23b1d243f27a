// npu_mla_prolog_v3 / npu_mla_prolog_v2: the fused MLA decode preprocess (q
// down/up projection with RMSNorm, W_UK absorption, RoPE of q and k_pe, RMSNorm
// of the latent, paged cache writes). The runtime uses v3 unquantised (MLA
// enable_prolog, SFA PROLOG_V3 with bf16 weights) and in its W8A8 forms (SFA
// PROLOG_V3: weight_quant_mode 2, with kv_cache_quant_mode 3 under SFA C8), and
// v2 fully quantised with an int8 latent cache (MLA FA-quant layers on A2/A3,
// docs/design/mla.md §5.4).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/string_view.h>

#include <optional>
#include <tuple>

#include "ascend_attn_rt/ops/provider.h"

namespace aar::ops {

struct MlaPrologArgs {
  at::Tensor token_x;            // (T, He): activations, or int8 (quantised forms, with dequant_scale_x)
  at::Tensor weight_dq;          // (He, Hcq)
  at::Tensor weight_uq_qr;       // (Hcq, N*(D+Dr)), rope columns of every head in half-split order
  at::Tensor weight_uk;          // (N, D, Hckv)
  at::Tensor weight_dkv_kr;      // (He, Hckv+Dr), rope columns in half-split order
  at::Tensor rmsnorm_gamma_cq;   // (Hcq)
  at::Tensor rmsnorm_gamma_ckv;  // (Hckv)
  at::Tensor rope_sin, rope_cos; // (T, Dr)
  std::optional<at::Tensor> cache_index;  // int64 (T) flat slots (required by v2)
  double rmsnorm_epsilon_cq = 1e-5;
  double rmsnorm_epsilon_ckv = 1e-5;
  c10::string_view cache_mode = "PA_BSND";
  // ---- quantised forms (all default to the unquantised call)
  std::optional<at::Tensor> dequant_scale_x;         // (T, 1) fp32: token_x's per-token dequant scale
  std::optional<at::Tensor> dequant_scale_w_dq;      // (1, Hcq) fp32, per output channel
  std::optional<at::Tensor> dequant_scale_w_uq_qr;   // (1, N*(D+Dr)) fp32
  std::optional<at::Tensor> dequant_scale_w_dkv_kr;  // (1, Hckv+Dr) fp32
  std::optional<at::Tensor> quant_scale_ckv;         // (1, Hckv) fp32: int8 latent cache (v2)
  std::optional<at::Tensor> quant_scale_ckr;         // (1, Dr): int8 rope cache (not used by the runtime)
  std::optional<at::Tensor> k_nope_clip_alpha;       // [1] fp32, per-tile cache quantisation (v3)
  // v3 only:
  bool query_norm_flag = false;      // also return query_norm (c_q), e.g. for the SFA indexer
  int64_t weight_quant_mode = 0;     // 0 none, 1 weight_uq_qr only, 2 W8A8 (int8 token_x), 3 MXFP8
  int64_t kv_cache_quant_mode = 0;   // 0 none, 1 per-tensor, 2 per-channel, 3 per-tile (SFA C8)
  int64_t query_quant_mode = 0;      // 0 none, 1 per-token-head
  int64_t ckvkr_repo_mode = 0;       // 1: latent and rope stored in one (packed) cache row
  int64_t quant_scale_repo_mode = 0; // 1: scales stored in the packed row
  int64_t tile_size = 128;
};

// v3. Returns (query (T, N, Hckv), query_rope (T, N, Dr), dequant_scale_q_nope,
// query_norm, dequant_scale_q_norm); kv_cache / kr_cache are written in place.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> mla_prolog_v3(
    const MlaPrologArgs& a, at::Tensor& kv_cache, at::Tensor& kr_cache, Provider pv = Provider::Auto);

// v2 (the v3-only fields of `a` must keep their defaults). Returns (query,
// query_rope, kv_cache, kr_cache, dequant_scale_q_nope): with an int8 kv_cache
// the query is int8, quantised per (token, head), and dequant_scale_q_nope is
// (T, N, 1). The caches are written in place (the schema does not say so).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> mla_prolog_v2(
    const MlaPrologArgs& a, const at::Tensor& kv_cache, const at::Tensor& kr_cache, Provider pv = Provider::Auto);

}  // namespace aar::ops
