// vllm-ascend's mla_preprocess (_C_ascend, "MLAPO"): the fused A2/A3 decode
// preprocess of a W8A8-static MLA layer (docs/design/mla.md §4.4 / §5.4, docs/design/sfa.md §4.2).
// Per token, in the forms the runtime uses (quant_mode
// "per_tensor_quant_asymm", cache_mode "krope_ctkv" or "nzcache"):
//   x_q   = saturate_int8(rint(x * (1 / quant_scale0) + quant_offset0))
//   y     = (x_q @ Wdqkv^T + bias0) * descale0            rows [kv (L+R) | q (Q)]
//   c_kv  = RMSNorm(y[:L]) * gamma2  -> kv_cache_out0[slot]
//   k_pe  = rotate_half RoPE(y[L:L+R]) -> kv_cache_out1[slot]  (rope rows pre-permuted, docs/design/mla.md §4.2)
//   c_q   = RMSNorm(y[L+R:]) * gamma1 + beta1  (-> inner_out with enable_inner_out)
//   cq_q  = saturate_int8(rint(c_q * (1 / quant_scale1) + quant_offset1))
//   q     = (cq_q @ Wuq^T + bias1) * descale1  -> per head [q_nope (P) | q_rope (R)]
//   q_out0 = q_nope @ wuk[h] (T, H, L);  q_out1 = rotate_half RoPE(q_rope) (T, H, R)
// The int8 weights come in the NZ staging layout of transdata (docs/design/mla.md §4.3),
// unsqueezed to 4-D: wdqkv (1, He/32, round16(L+R+Q), 32), wuq (1, Q'/32,
// round16(H*(P+R)), 32); biases int32 in accumulator units (they carry the
// activation zero-point correction); descales float32 per output channel.
// Slots may be int32 or int64 (upstream passes the step's slot mapping as it
// is); negative slots are not written.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/string_view.h>

#include <optional>
#include <tuple>

#include "ascend_attn_rt/ops/provider.h"

namespace aar::ops {

struct MlaPreprocessArgs {
  at::Tensor hidden_state;                 // (T, He)
  at::Tensor wdqkv;                        // int8 NZ staging of [W_dkv (rope rows permuted) ; W_dq] (out, He)
  std::optional<at::Tensor> descale0;      // fp32 (L+R+Q)
  at::Tensor gamma1;                       // (Q) q_a_layernorm
  std::optional<at::Tensor> beta1;         // (Q)
  at::Tensor wuq;                          // int8 NZ staging of W_uq (H*(P+R), Q), rope rows permuted per head
  std::optional<at::Tensor> descale1;      // fp32 (H*(P+R))
  at::Tensor gamma2;                       // (L) kv_a_layernorm
  std::optional<at::Tensor> cos, sin;      // (T, R)
  at::Tensor wuk;                          // (H, P, L) = W_UK_T (ND)
  at::Tensor slotmapping;                  // (T)
  std::optional<at::Tensor> quant_scale0, quant_offset0, bias0;  // (1) act dtype, (1) int8, int32 (L+R+Q)
  std::optional<at::Tensor> quant_scale1, quant_offset1, bias1;  // (1), (1), int32 (H*(P+R))
  std::optional<at::Tensor> ctkv_scale, q_nope_scale;           // int8_nzcache only (upstream passes ones)
  std::optional<c10::string_view> cache_mode = "krope_ctkv";
  std::optional<c10::string_view> quant_mode = "per_tensor_quant_asymm";
  std::optional<bool> enable_inner_out = false;
};

// Writes q_out0 (T, H, L), q_out1 (T, H, R), inner_out (T, Q) (with
// enable_inner_out) and the token rows of kv_cache / kv_cache_rope (passed as
// both the operator's cache inputs and its kv_cache_out0 / kv_cache_out1).
void mla_preprocess(const MlaPreprocessArgs& a, at::Tensor& kv_cache, at::Tensor& kv_cache_rope, at::Tensor& q_out0,
                    at::Tensor& q_out1, at::Tensor& inner_out, Provider pv = Provider::Auto);

}  // namespace aar::ops
