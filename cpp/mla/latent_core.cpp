#include "latent_core.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include "ascend_attn_rt/errors.h"
#include "ascend_attn_rt/ops/dense.h"
#include "ascend_attn_rt/ops/interleave_rope.h"
#include "ascend_attn_rt/ops/kv_rmsnorm_rope_cache.h"
#include "ascend_attn_rt/ops/batch_matmul_transpose.h"
#include "ascend_attn_rt/ops/transpose_batchmatmul.h"

namespace aar::mla::detail {

LatentCore::LatentCore(const LatentConfig& cfg, const Weights& weights) : cfg_(cfg), w_(weights) {
  const Dims& d = cfg_.dims;
  validate_weights(d, w_);
  AAR_CHECK_ARG(cfg_.heads_padded >= d.num_heads, "heads_padded=", cfg_.heads_padded, " is smaller than num_heads=",
                d.num_heads);
  const Absorbed a = split_kv_b_proj(w_.kv_b_proj, d.num_heads, d.qk_nope_head_dim, d.v_head_dim);
  w_uk_t_ = a.w_uk_t;
  w_uv_ = a.w_uv;
  if (cfg_.enable_prolog) {
    AAR_CHECK_ARG(d.q_lora_rank.has_value(),
                  "enable_prolog needs q-LoRA (q_lora_rank): npu_mla_prolog_v3 takes the q down-projection");
    prolog_ = prepare_prolog_weights(d, w_, w_uk_t_);
    ops::MlaPrologArgs& p = prolog_args_;
    p.weight_dq = prolog_->weight_dq;
    p.weight_uq_qr = prolog_->weight_uq_qr;
    p.weight_uk = prolog_->weight_uk;
    p.weight_dkv_kr = prolog_->weight_dkv_kr;
    p.rmsnorm_gamma_cq = prolog_->gamma_cq;
    p.rmsnorm_gamma_ckv = prolog_->gamma_ckv;
    p.rmsnorm_epsilon_cq = cfg_.q_norm_eps;
    p.rmsnorm_epsilon_ckv = cfg_.kv_norm_eps;
    p.cache_mode = cfg_.kv_nz ? "PA_NZ" : "PA_BSND";
  }
  DecodeShape shape;
  shape.device = w_.q_proj.device();
  shape.dtype = w_.q_proj.scalar_type();
  shape.heads = d.num_heads;
  shape.heads_padded = cfg_.heads_padded;
  shape.kv_lora_rank = d.kv_lora_rank;
  shape.nope_dim = d.qk_nope_head_dim;
  shape.rope_dim = d.qk_rope_head_dim;
  shape.q_lora_rank = d.q_lora_rank.value_or(0);
  shape.v_head_dim = d.v_head_dim;
  shape.group = cfg_.workspace_group;
  ws_ = DecodeWorkspace::shared(shape);
}

void LatentCore::reload_weights(const Weights& nw) {
  const Dims& d = cfg_.dims;
  validate_weights(d, nw);
  const at::Tensor& ref = w_.q_proj;
  AAR_CHECK_ARG(nw.q_proj.scalar_type() == ref.scalar_type() && nw.q_proj.device() == ref.device(),
                "reload_weights: the new weights are ", nw.q_proj.scalar_type(), " on ", nw.q_proj.device(),
                ", the layer's are ", ref.scalar_type(), " on ", ref.device());
  c10::InferenceMode guard;
  auto put = [](at::Tensor& dst, const at::Tensor& src) {
    if (!dst.is_same(src)) dst.copy_(src);
  };
  if (d.q_lora_rank.has_value()) {
    put(*w_.q_a_proj, *nw.q_a_proj);
    put(*w_.q_a_layernorm, *nw.q_a_layernorm);
  }
  put(w_.q_proj, nw.q_proj);
  put(w_.kv_a_proj_with_mqa, nw.kv_a_proj_with_mqa);
  put(w_.kv_a_layernorm, nw.kv_a_layernorm);
  put(w_.kv_b_proj, nw.kv_b_proj);
  put(w_.o_proj, nw.o_proj);
  const Absorbed a = split_kv_b_proj(w_.kv_b_proj, d.num_heads, d.qk_nope_head_dim, d.v_head_dim);
  w_uk_t_.copy_(a.w_uk_t);
  w_uv_.copy_(a.w_uv);
  if (prolog_) {
    // weight_uk is W_UK_T and the gammas are the layer's norm weights: already current.
    const PrologWeights p = prepare_prolog_weights(d, w_, w_uk_t_);
    prolog_->weight_dq.copy_(p.weight_dq);
    prolog_->weight_uq_qr.copy_(p.weight_uq_qr);
    prolog_->weight_dkv_kr.copy_(p.weight_dkv_kr);
  }
}

LatentQuery LatentCore::preprocess(const DecodeViews& v, const LatentStep& s, const at::Tensor& nope,
                                   const at::Tensor& rope, bool use_prolog, bool stable) {
  const Dims& d = cfg_.dims;
  const int64_t td = s.x.sizes()[0], H = d.num_heads, L = d.kv_lora_rank, R = d.qk_rope_head_dim;
  const int64_t hp = cfg_.heads_padded;
  const bool padded = hp != H;
  // Per-token views of the step's tensors, remade only when the caller hands
  // over another tensor (the builders hand out the same view for a batch shape).
  const at::Tensor& slots = view_of(s.slots, td, seen_.slots_src, seen_.slots, [&] {
    return s.slots.sizes()[0] == td ? s.slots : s.slots.narrow(0, 0, td);
  });
  const at::Tensor& cos = view_of(s.cos, td, seen_.cos_src, seen_.cos4,
                                  [&] { return s.cos.narrow(0, 0, td).view({td, 1, 1, R}); });
  const at::Tensor& sin = view_of(s.sin, td, seen_.sin_src, seen_.sin4,
                                  [&] { return s.sin.narrow(0, 0, td).view({td, 1, 1, R}); });
  // A query of the real heads in the workspace layout (heads not padded): BNSD
  // is (td, H, 1, D) already.
  auto as_layout = [&](const at::Tensor& x4, int64_t D) -> at::Tensor {
    switch (v.layout) {
      case DecodeLayout::TND: return x4.view({td, hp, D});
      case DecodeLayout::BSND: return x4.view({td, 1, hp, D});
      case DecodeLayout::BNSD: return x4.dim() == 4 ? x4 : x4.view({td, hp, 1, D});
    }
    return x4;
  };
  if (use_prolog) {
    AAR_CHECK_ARG(prolog_.has_value(), "the fused prolog preprocess was asked for but the layer has no prolog weights "
                  "(enable_prolog)");
    // Spec mla 5.4: the fused preprocess; q and k_pe come out in the same
    // half-split RoPE order as the native path (weights via trans_rope_weight).
    // The weights are set once (constructor); only the step's inputs change.
    ops::MlaPrologArgs& a = prolog_args_;
    a.token_x = s.x;
    a.rope_cos = cos.view({td, R});
    a.rope_sin = sin.view({td, R});
    a.cache_index = slots;
    at::Tensor nope_w = nope, rope_w = rope;
    auto r = ops::mla_prolog_v3(a, nope_w, rope_w);
    a.token_x.reset();  // holds no step tensor past the call
    a.rope_cos.reset();
    a.rope_sin.reset();
    a.cache_index.reset();
    const at::Tensor& qn = std::get<0>(r);  // (td, H, L)
    const at::Tensor& qr = std::get<1>(r);  // (td, H, R)
    if (padded || stable) {
      ops::dense::copy(v.qn_heads, qn);
      ops::dense::copy(v.qr_heads, qr);
      return {v.fia_qn, v.fia_qr};
    }
    return {view_of(qn, td, seen_.qn_src, seen_.qn, [&] { return as_layout(qn, L); }),
            view_of(qr, td, seen_.qr_src, seen_.qr, [&] { return as_layout(qr, R); })};
  }
  // Spec mla 5.2: native preprocess, into the workspace.
  if (d.q_lora_rank.has_value()) {
    ops::dense::linear_out(v.qa, s.x, *w_.q_a_proj);
    ops::dense::rms_norm_out(v.qc, v.qa, *w_.q_a_layernorm, cfg_.q_norm_eps);
  }
  ops::dense::linear_out(v.kv_raw, s.x, w_.kv_a_proj_with_mqa);
  ops::dense::linear_out(v.q, d.q_lora_rank.has_value() ? v.qc : s.x, w_.q_proj);
  ops::dense::bmm_out(v.qn_heads_t, v.q_nope_t, w_uk_t_);  // ql_nope (td, H, L) into the padded query
  const at::Tensor q_pe = ops::interleave_rope(v.q_pe4, cos, sin);  // (td, H, 1, R)
  ops::kv_rmsnorm_rope_cache(v.kv4, w_.kv_a_layernorm, cos, sin, slots, rope, nope, cfg_.kv_norm_eps,
                             cfg_.kv_nz ? "PA_NZ" : "PA", false);
  if (padded || stable) {
    ops::dense::copy(v.qr_heads4, q_pe);
    return {v.fia_qn, v.fia_qr};
  }
  return {v.fia_qn, view_of(q_pe, td, seen_.qr_src, seen_.qr, [&] { return as_layout(q_pe, R); })};
}

LatentQuery LatentCore::preprocess_unwritten(const DecodeViews& v, const LatentStep& s, LatentKv& kv) {
  // The query half is preprocess's native path (spec mla 5.2); kept apart from
  // it so the two can change independently until the preprocess variants
  // settle. The key half replaces npu_kv_rmsnorm_rope_cache's cache writes by
  // the same maths on the rows: RMSNorm * gamma and the interleave->half RoPE.
  const Dims& d = cfg_.dims;
  const int64_t td = s.x.sizes()[0], L = d.kv_lora_rank, R = d.qk_rope_head_dim;
  const at::Tensor& cos = view_of(s.cos, td, seen_.cos_src, seen_.cos4,
                                  [&] { return s.cos.narrow(0, 0, td).view({td, 1, 1, R}); });
  const at::Tensor& sin = view_of(s.sin, td, seen_.sin_src, seen_.sin4,
                                  [&] { return s.sin.narrow(0, 0, td).view({td, 1, 1, R}); });
  if (d.q_lora_rank.has_value()) {
    ops::dense::linear_out(v.qa, s.x, *w_.q_a_proj);
    ops::dense::rms_norm_out(v.qc, v.qa, *w_.q_a_layernorm, cfg_.q_norm_eps);
  }
  ops::dense::linear_out(v.kv_raw, s.x, w_.kv_a_proj_with_mqa);
  ops::dense::linear_out(v.q, d.q_lora_rank.has_value() ? v.qc : s.x, w_.q_proj);
  ops::dense::bmm_out(v.qn_heads_t, v.q_nope_t, w_uk_t_);            // ql_nope (td, H, L)
  ops::dense::copy(v.qr_heads4, ops::interleave_rope(v.q_pe4, cos, sin));  // q_pe (td, H, 1, R)
  kv.k_nope = ops::dense::rms_norm(v.kv_raw.narrow(1, 0, L), w_.kv_a_layernorm, cfg_.kv_norm_eps);
  kv.k_rope = ops::interleave_rope(v.kv4.narrow(3, L, R), cos, sin);
  return {v.fia_qn, v.fia_qr};
}

const at::Tensor& LatentCore::w_uv_out(const DecodeViews& v, int64_t td) {
  const Dims& d = cfg_.dims;
  // Head-major output (_NBSD / _NTD): the real heads, then W_UV -> (td, H*V).
  static const int64_t perm_y[3] = {1, 0, 2};
  const at::Tensor y = ops::transpose_batchmatmul(v.attn_heads, w_uv_, std::nullopt, std::nullopt,
                                                  c10::IntArrayRef(perm_y, 3));
  return view_of(y, td, seen_.y_src, seen_.y2d, [&] { return y.view({td, d.num_heads * d.v_head_dim}); });
}

const at::Tensor& LatentCore::w_uv_out_token_major(const DecodeViews& v, const at::Tensor& attn, int64_t td) {
  const Dims& d = cfg_.dims;
  const auto dt = attn.scalar_type();
  if ((dt == at::kHalf || dt == at::kBFloat16) && td <= 1024) {
    at::Tensor y3 = v.y3;
    ops::batch_matmul_transpose(attn, w_uv_, y3);
    return v.y;
  }
  // (td, H, L) read head-major, W_UV per head, written token-major -> (td, H*V).
  static const int64_t perm[3] = {1, 0, 2};
  const at::Tensor y = ops::transpose_batchmatmul(attn, w_uv_, c10::IntArrayRef(perm, 3), std::nullopt,
                                                  c10::IntArrayRef(perm, 3));
  return view_of(y, td, seen_.y_src, seen_.y2d, [&] { return y.view({td, d.num_heads * d.v_head_dim}); });
}

}  // namespace aar::mla::detail
