// MLA weight processing (docs/design/mla.md §4). Linear weights are in torch
// layout (out_features, in_features).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>

#include "ascend_attn_rt/latent/quant.h"

namespace aar::mla {

struct Dims {
  int64_t num_heads = 0;
  int64_t hidden_size = 0;
  std::optional<int64_t> q_lora_rank;  // None: q_proj straight from hidden
  int64_t kv_lora_rank = 512;          // L
  int64_t qk_nope_head_dim = 128;      // P
  int64_t qk_rope_head_dim = 64;       // R
  int64_t v_head_dim = 128;            // V
};

struct Weights {
  std::optional<at::Tensor> q_a_proj;       // (Q, hidden)             with q-LoRA
  std::optional<at::Tensor> q_a_layernorm;  // (Q) RMSNorm gamma       with q-LoRA
  at::Tensor q_proj;                        // (H*(P+R), Q or hidden)  (q_b_proj with q-LoRA)
  at::Tensor kv_a_proj_with_mqa;            // (L+R, hidden)
  at::Tensor kv_a_layernorm;                // (L) RMSNorm gamma
  at::Tensor kv_b_proj;                     // (H*(P+V), L)
  at::Tensor o_proj;                        // (hidden, H*V)
  // W8A8 layers (quant.h, needs q-LoRA): the quantised fused_qkv_a_proj and
  // q_proj replace q_a_proj, kv_a_proj_with_mqa and q_proj, which are then not
  // given (q_proj / kv_a_proj_with_mqa left undefined).
  std::optional<QuantWeights> quant;
};

// Validates every weight's shape against dims; errors name the weight. o_proj_shards > 1: o_proj is one
// rank's row-parallel shard (hidden, H*V / o_proj_shards) of a layer computing all H heads (DSA-CP,
// docs/design/sparse_cp.md §7).
void validate_weights(const Dims& d, const Weights& w, int64_t o_proj_shards = 1);

// The quant type of the layer's fused_qkv_a_proj (None for unquantised weights).
inline QuantType quant_type(const Weights& w) { return w.quant.has_value() ? w.quant->type : QuantType::None; }
// The activation dtype / device of the layer (kv_b_proj's: it is never quantised).
inline at::ScalarType activation_dtype(const Weights& w) { return w.kv_b_proj.scalar_type(); }
inline c10::Device weights_device(const Weights& w) { return w.kv_b_proj.device(); }

// docs/design/mla.md §4.1: W_UK_T[h,p,l] = kv_b[h*(P+V)+p, l] (H,P,L); W_UV[h,l,v] = kv_b[h*(P+V)+P+v, l] (H,L,V).
struct Absorbed {
  at::Tensor w_uk_t, w_uv;
};
Absorbed split_kv_b_proj(const at::Tensor& kv_b_proj, int64_t num_heads, int64_t qk_nope_head_dim,
                         int64_t v_head_dim);

// docs/design/mla.md §4.2: along dim -2, the last `rope_dim` rows are reordered even offsets
// first, then odd; the rows before stay. rope_dim == 0: contiguous copy.
at::Tensor trans_rope_weight(const at::Tensor& w, int64_t rope_dim);

// docs/design/mla.md §4.3: ND (R, C) -> FRACTAL_NZ staging layout (C'/cb, R', cb)
// with R' = round_up(R, rb), C' = round_up(C, cb), Z[j, i, k] = padded[i, cb*j + k].
// Rows are zero-padded by R'-R and columns by C'-C (upstream swaps the two pad
// amounts, which is only harmless when both are 0; fixed here).
at::Tensor transdata(const at::Tensor& nd, int64_t row_block = 16, int64_t col_block = 32);

// Weights of npu_mla_prolog_v3 / v2 (requires q-LoRA), ND layout (on the NPU they
// are additionally npu_format_cast to FRACTAL_NZ, a storage-format change only).
// Unquantised weights, or W8A8 dynamic (SFA PROLOG_V3, MLA FA-quant): the int8
// weights transposed to (in, out) with the same rope permutation, and their
// per-channel scales as (1, n) rows permuted alike. The rope columns are
// permuted for the quantised forms too (upstream's FA-quant preparation skips
// trans_rope_weight, which would leave the decode's cache rows in another RoPE
// order than the native path's, docs/design/mla.md §1.3: we keep one convention).
struct PrologWeights {
  at::Tensor weight_dq;      // (hidden, Q)
  at::Tensor weight_uq_qr;   // (Q, H*(P+R)), rope rows of every head via trans_rope_weight
  at::Tensor weight_uk;      // (H, P, L) = W_UK_T
  at::Tensor weight_dkv_kr;  // (hidden, L+R), rope columns via trans_rope_weight
  at::Tensor gamma_cq, gamma_ckv;
  // W8A8 dynamic only: fp32 dequant scales (1, Q), (1, H*(P+R)), (1, L+R).
  std::optional<at::Tensor> dequant_scale_w_dq, dequant_scale_w_uq_qr, dequant_scale_w_dkv_kr;
};
PrologWeights prepare_prolog_weights(const Dims& d, const Weights& w, const at::Tensor& w_uk_t);

// Weights of vllm-ascend's mla_preprocess (MLAPO, docs/design/mla.md §4.4) from W8A8-static
// weights (requires q-LoRA): the down projection with its output rows reordered
// kv | q and the kv rope rows permuted, the up projection with each head's rope
// rows permuted, both in transdata's NZ staging layout unsqueezed to 4-D; their
// dequant scales (input_scale * weight_scale) and int32 biases in the same row
// orders; the norms; the two activation quantisation parameters. beta1 is zero
// (the runtime's weights carry no q_a_layernorm bias).
struct MlapoWeights {
  at::Tensor wd_qkv;          // int8 (1, hidden/32, round16(L+R+Q), 32)
  at::Tensor deq_scale_qkv;   // fp32 (L+R+Q)
  at::Tensor quant_bias_qkv;  // int32 (L+R+Q)
  at::Tensor wu_q;            // int8 (1, round32(Q)/32, round16(H*(P+R)), 32)
  at::Tensor qb_deq_scl;      // fp32 (H*(P+R))
  at::Tensor qb_qt_bias;      // int32 (H*(P+R))
  at::Tensor gamma1, beta1, gamma2;
  at::Tensor quant_scale0, quant_offset0, quant_scale1, quant_offset1;  // (1) act dtype / (1) int8
  at::Tensor ctkv_scale, q_nope_scale;  // ones (1), (H): used by the int8_nzcache mode only
};
MlapoWeights prepare_mlapo_weights(const Dims& d, const Weights& w);

}  // namespace aar::mla
