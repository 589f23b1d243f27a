// npu_mla_prolog_v3: the fused MLA decode preprocess (q down/up projection with
// RMSNorm, W_UK absorption, RoPE of q and k_pe, RMSNorm of the latent, paged
// cache writes). The runtime uses the non-quantized form only.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/string_view.h>

#include <optional>
#include <tuple>

#include "ascend_attn_rt/ops/provider.h"

namespace aar::ops {

struct MlaPrologArgs {
  at::Tensor token_x;            // (T, He)
  at::Tensor weight_dq;          // (He, Hcq)
  at::Tensor weight_uq_qr;       // (Hcq, N*(D+Dr)), rope columns of every head in half-split order
  at::Tensor weight_uk;          // (N, D, Hckv)
  at::Tensor weight_dkv_kr;      // (He, Hckv+Dr), rope columns in half-split order
  at::Tensor rmsnorm_gamma_cq;   // (Hcq)
  at::Tensor rmsnorm_gamma_ckv;  // (Hckv)
  at::Tensor rope_sin, rope_cos; // (T, Dr)
  std::optional<at::Tensor> cache_index;  // int64 (T) flat slots
  double rmsnorm_epsilon_cq = 1e-5;
  double rmsnorm_epsilon_ckv = 1e-5;
  c10::string_view cache_mode = "PA_BSND";
};

// Returns (query (T, N, Hckv), query_rope (T, N, Dr), dequant_scale_q_nope,
// query_norm, dequant_scale_q_norm); kv_cache / kr_cache are written in place.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> mla_prolog_v3(
    const MlaPrologArgs& a, at::Tensor& kv_cache, at::Tensor& kr_cache, Provider pv = Provider::Auto);

}  // namespace aar::ops
