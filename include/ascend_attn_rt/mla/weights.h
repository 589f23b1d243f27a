// MLA weight processing (spec mla.md section 4). Linear weights are in torch
// layout (out_features, in_features).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>

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
};

// Validates every weight's shape against dims; errors name the weight.
void validate_weights(const Dims& d, const Weights& w);

// Spec 4.1: W_UK_T[h,p,l] = kv_b[h*(P+V)+p, l] (H,P,L); W_UV[h,l,v] = kv_b[h*(P+V)+P+v, l] (H,L,V).
struct Absorbed {
  at::Tensor w_uk_t, w_uv;
};
Absorbed split_kv_b_proj(const at::Tensor& kv_b_proj, int64_t num_heads, int64_t qk_nope_head_dim,
                         int64_t v_head_dim);

// Spec 4.2: along dim -2, the last `rope_dim` rows are reordered even offsets
// first, then odd; the rows before stay. rope_dim == 0: contiguous copy.
at::Tensor trans_rope_weight(const at::Tensor& w, int64_t rope_dim);

// Spec 4.3 / gqa 9.15: ND (R, C) -> FRACTAL_NZ staging layout (C'/cb, R', cb)
// with R' = round_up(R, rb), C' = round_up(C, cb), Z[j, i, k] = padded[i, cb*j + k].
// Rows are zero-padded by R'-R and columns by C'-C (upstream swaps the two pad
// amounts, which is only harmless when both are 0; fixed here).
at::Tensor transdata(const at::Tensor& nd, int64_t row_block = 16, int64_t col_block = 32);

// Weights of npu_mla_prolog_v3 (requires q-LoRA), ND layout (on the NPU they are
// additionally npu_format_cast to FRACTAL_NZ, a storage-format change only).
struct PrologWeights {
  at::Tensor weight_dq;      // (hidden, Q)
  at::Tensor weight_uq_qr;   // (Q, H*(P+R)), rope rows of every head via trans_rope_weight
  at::Tensor weight_uk;      // (H, P, L) = W_UK_T
  at::Tensor weight_dkv_kr;  // (hidden, L+R), rope columns via trans_rope_weight
  at::Tensor gamma_cq, gamma_ckv;
};
PrologWeights prepare_prolog_weights(const Dims& d, const Weights& w, const at::Tensor& w_uk_t);

}  // namespace aar::mla
