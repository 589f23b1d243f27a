#include "latent_core.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include "ascend_attn_rt/errors.h"
#include "ascend_attn_rt/ops/dense.h"
#include "ascend_attn_rt/ops/interleave_rope.h"
#include "ascend_attn_rt/ops/kv_rmsnorm_rope_cache.h"
#include "ascend_attn_rt/ops/mx_quant.h"
#include "ascend_attn_rt/ops/batch_matmul_transpose.h"
#include "ascend_attn_rt/ops/quant.h"
#include "ascend_attn_rt/ops/transpose_batchmatmul.h"
#include "../common/impl_checks.h"

namespace aar::mla::detail {

const char* to_string(Fused f) {
  switch (f) {
    case Fused::None: return "native";
    case Fused::PrologV3: return "prolog_v3";
    case Fused::Mlapo: return "mlapo";
    case Fused::PrologV2: return "prolog_v2";
  }
  return "unknown";
}

namespace {

// Copies src into dst unless they are the same tensor.
void put(at::Tensor& dst, const at::Tensor& src) {
  if (!dst.is_same(src)) dst.copy_(src);
}
void put(std::optional<at::Tensor>& dst, const std::optional<at::Tensor>& src) {
  if (dst.has_value() && src.has_value()) put(*dst, *src);
}
// dst = src, or (in_place) copied into dst's memory.
void assign(at::Tensor& dst, const at::Tensor& src, bool in_place) {
  if (in_place && dst.defined()) {
    dst.copy_(src);
  } else {
    dst = src;
  }
}

}  // namespace

void LatentCore::QLinear::prepare(const QuantLinear& l, QuantType t, at::ScalarType act_dtype, bool in_place) {
  type = t;
  act = act_dtype;
  assign(weight_t, l.weight.t().contiguous(), in_place);
  if (t == QuantType::MxFp8) {
    // npu_quant_matmul's MX mode takes x2 and its scales transposed: x2 (in, out) is the transposed view
    // of the (out, in) weight; the scale bytes (out, in / 32) pair consecutive blocks, (out, in / 64, 2)
    // (an odd block count padded with a 0 byte, which scales no element), viewed (in / 64, out, 2).
    const int64_t out = l.weight.size(0), nb = l.weight_scale.size(1), pairs = (nb + 1) / 2;
    at::Tensor sb = l.weight_scale.view(at::kByte);
    if (nb % 2 != 0) sb = at::constant_pad_nd(sb, {0, 1}, 0);
    assign(weight_t, l.weight.contiguous().t(), in_place);
    assign(deq_scale, sb.contiguous().view({out, pairs, 2}).view(at::kFloat8_e8m0fnu).transpose(0, 1), in_place);
    return;
  }
  if (t == QuantType::W8A8Static) {
    // y = (x_q W^T + quant_bias) * input_scale * weight_scale; x_q = rint(x * (1 / input_scale) + input_offset),
    // the reciprocal and the zero point expanded per input channel in the activation dtype (upstream's form).
    const int64_t in = l.weight.size(1);
    assign(deq_scale, (l.weight_scale * l.input_scale->to(at::kFloat)).contiguous(), in_place);
    assign(bias, l.quant_bias->contiguous(), in_place);
    assign(inv_scale, l.input_scale->reciprocal().expand({in}).contiguous(), in_place);
    assign(offset, l.input_offset->to(act_dtype).expand({in}).contiguous(), in_place);
  } else {
    assign(deq_scale, l.weight_scale.contiguous(), in_place);
  }
}

at::Tensor LatentCore::QLinear::run(const at::Tensor& x) const {
  ops::QuantMatmulArgs a;
  a.x2 = weight_t;
  a.scale = deq_scale;
  a.output_dtype = static_cast<int64_t>(act);
  if (type == QuantType::MxFp8) {
    // x per block of 32 values (OCP rule, e4m3 elements, e8m0 scales), then the MX matmul.
    static const int64_t kGroups[3] = {1, 1, kMxBlock};
    ops::DynamicMxQuantArgs q;
    q.input = x;
    q.dst_type = static_cast<int64_t>(at::kFloat8_e4m3fn);
    q.block_size = kMxBlock;
    q.scale_alg = 0;
    auto [xq, s] = ops::dynamic_mx_quant(q);
    a.x1 = xq;
    a.pertoken_scale = s.view(at::kFloat8_e8m0fnu);  // the operator returns the e8m0 bytes as uint8
    a.pertoken_scale_dtype = static_cast<int64_t>(at::kFloat8_e8m0fnu);
    a.scale_dtype = static_cast<int64_t>(at::kFloat8_e8m0fnu);
    a.group_sizes = c10::IntArrayRef(kGroups, 3);
    return ops::quant_matmul(a);
  }
  if (type != QuantType::W8A8Static) {
    // W8A8-dynamic: the shared per-token linear (ops/quant.h), as the DSA prolog runs it.
    return ops::w8a8_dynamic_matmul(ops::quantize_per_token(x), weight_t, deq_scale, act);
  }
  a.x1 = ops::quantize(x, inv_scale, offset, static_cast<int64_t>(at::kQInt8), -1, /*div_mode=*/false);
  a.bias = bias;
  return ops::quant_matmul(a);
}

LatentCore::LatentCore(const LatentConfig& cfg, const Weights& weights) : cfg_(cfg), w_(weights) {
  const Dims& d = cfg_.dims;
  validate_weights(d, w_, cfg_.o_proj_shards);
  internal::check_norm_eps(cfg_.q_norm_eps, "q_norm_eps");
  internal::check_norm_eps(cfg_.kv_norm_eps, "kv_norm_eps");
  AAR_CHECK_ARG(cfg_.heads_padded >= d.num_heads, "heads_padded=", cfg_.heads_padded, " is smaller than num_heads=",
                d.num_heads);
  const Absorbed a = split_kv_b_proj(w_.kv_b_proj, d.num_heads, d.qk_nope_head_dim, d.v_head_dim);
  w_uk_t_ = a.w_uk_t;
  w_uv_ = a.w_uv;
  if (w_.quant.has_value()) {
    qkv_a_.prepare(w_.quant->fused_qkv_a_proj, w_.quant->type, dtype(), false);
    q_b_.prepare(w_.quant->q_proj, w_.quant->type, dtype(), false);
  }
  prepare_fused(false);
  ws_ = DecodeWorkspace::shared(decode_shape_of(d, cfg_.heads_padded, cfg_.workspace_group, device(), dtype()));
}

void LatentCore::prepare_fused(bool in_place) {
  const Dims& d = cfg_.dims;
  const QuantType qt = quant();
  const char* name = to_string(cfg_.fused);
  if (qt == QuantType::MxFp8 && cfg_.fused != Fused::None) {
    // docs/design/mla.md §5.4: upstream's A5 fused preprocess (MLAPO and FA-quant alike) is npu_mla_prolog_v3 with
    // weight_quant_mode 3; torch_npu 2.14.0 documents weight_quant_mode 0, 1 and 2 only.
    throw_not_supported("the fused preprocess ", name, " with MXFP8 weights (A5 ",
                        cfg_.fused == Fused::Mlapo ? "MLAPO" : cfg_.fused == Fused::PrologV2 ? "FA-quant" : "PROLOG_V3",
                        "): upstream runs npu_mla_prolog_v3 with weight_quant_mode 3 there, which torch_npu 2.14.0's "
                        "documentation of the operator does not describe (it lists weight_quant_mode 0, 1 and 2), so "
                        "there are no documented semantics to build and check it against; the native preprocess takes "
                        "MXFP8 weights");
  }
  if (cfg_.fused == Fused::Mlapo && dtype() == at::kHalf) {
    throw_not_supported("mla_preprocess (MLAPO) with float16 activations: the float16 kernel takes its dequant scales "
                        "(descale0 / descale1) as npu_trans_quant_param's int64 words, whose bit layout torch_npu 2.14.0 "
                        "does not document (only \"fp32 filled to FP19\"), so the call cannot be checked against a "
                        "twin; the native preprocess takes float16 W8A8-static weights (npu_quant_matmul's float16 "
                        "output with float32 scales)");
  }
  switch (cfg_.fused) {
    case Fused::None:
      return;
    case Fused::PrologV3:
    case Fused::PrologV2: {
      AAR_CHECK_ARG(d.q_lora_rank.has_value(), "the fused preprocess ", name,
                    " needs q-LoRA (q_lora_rank): the operator takes the q down-projection");
      if (cfg_.fused == Fused::PrologV3) {
        AAR_CHECK_ARG(qt == QuantType::None || qt == QuantType::W8A8Dynamic, "npu_mla_prolog_v3 takes unquantised "
                      "or W8A8-dynamic weights (weight_quant_mode 0 / 2), got ", to_string(qt));
      } else {
        AAR_CHECK_ARG(qt == QuantType::W8A8Dynamic, "the FA-quant preprocess (npu_mla_prolog_v2, fully quantised) "
                      "takes W8A8-dynamic weights, got ", to_string(qt));
        AAR_CHECK_ARG(cfg_.kv_cache_scale > 0.0, "the FA-quant preprocess needs the int8 latent cache's dequant "
                      "scale (kv_cache_scale > 0), got ", cfg_.kv_cache_scale);
      }
      PrologWeights p = prepare_prolog_weights(d, w_, w_uk_t_);
      if (in_place && prolog_.has_value()) {
        // weight_uk is W_UK_T and the gammas are the layer's norm weights: already current.
        prolog_->weight_dq.copy_(p.weight_dq);
        prolog_->weight_uq_qr.copy_(p.weight_uq_qr);
        prolog_->weight_dkv_kr.copy_(p.weight_dkv_kr);
        put(prolog_->dequant_scale_w_dq, p.dequant_scale_w_dq);
        put(prolog_->dequant_scale_w_uq_qr, p.dequant_scale_w_uq_qr);
        put(prolog_->dequant_scale_w_dkv_kr, p.dequant_scale_w_dkv_kr);
        return;
      }
      prolog_ = std::move(p);
      ops::MlaPrologArgs& pa = prolog_args_;
      pa.weight_dq = prolog_->weight_dq;
      pa.weight_uq_qr = prolog_->weight_uq_qr;
      pa.weight_uk = prolog_->weight_uk;
      pa.weight_dkv_kr = prolog_->weight_dkv_kr;
      pa.rmsnorm_gamma_cq = prolog_->gamma_cq;
      pa.rmsnorm_gamma_ckv = prolog_->gamma_ckv;
      pa.rmsnorm_epsilon_cq = cfg_.q_norm_eps;
      pa.rmsnorm_epsilon_ckv = cfg_.kv_norm_eps;
      pa.cache_mode = cfg_.kv_nz ? "PA_NZ" : "PA_BSND";
      pa.dequant_scale_w_dq = prolog_->dequant_scale_w_dq;
      pa.dequant_scale_w_uq_qr = prolog_->dequant_scale_w_uq_qr;
      pa.dequant_scale_w_dkv_kr = prolog_->dequant_scale_w_dkv_kr;
      if (cfg_.fused == Fused::PrologV3) {
        pa.weight_quant_mode = qt == QuantType::W8A8Dynamic ? 2 : 0;
        pa.query_norm_flag = cfg_.query_norm;
        if (cfg_.sfa_c8_rows) {
          AAR_CHECK_ARG(!cfg_.kv_nz, "the packed SFA C8 rows are ND (cache_mode PA_BSND), not FRACTAL_NZ");
          pa.kv_cache_quant_mode = 3;
          pa.ckvkr_repo_mode = 1;
          pa.quant_scale_repo_mode = 1;
          pa.tile_size = 128;
          pa.k_nope_clip_alpha = at::full({1}, 1.0, at::TensorOptions().dtype(at::kFloat).device(device()));
        }
      } else {
        const auto f32 = at::TensorOptions().dtype(at::kFloat).device(device());
        kv_qscale_ = at::full({1, d.kv_lora_rank}, 1.0 / cfg_.kv_cache_scale, f32);
        kv_dqscale_ = at::full({1}, cfg_.kv_cache_scale, f32);
        pa.quant_scale_ckv = kv_qscale_;
      }
      return;
    }
    case Fused::Mlapo: {
      AAR_CHECK_ARG(qt == QuantType::W8A8Static, "mla_preprocess (MLAPO) takes W8A8-static weights, got ",
                    to_string(qt));
      MlapoWeights m = prepare_mlapo_weights(d, w_);
      if (in_place && mlapo_.has_value()) {
        for (auto [dst, src] : {std::pair<at::Tensor*, const at::Tensor*>{&mlapo_->wd_qkv, &m.wd_qkv},
                                {&mlapo_->deq_scale_qkv, &m.deq_scale_qkv},
                                {&mlapo_->quant_bias_qkv, &m.quant_bias_qkv},
                                {&mlapo_->wu_q, &m.wu_q},
                                {&mlapo_->qb_deq_scl, &m.qb_deq_scl},
                                {&mlapo_->qb_qt_bias, &m.qb_qt_bias}}) {
          dst->copy_(*src);
        }
        return;
      }
      mlapo_ = std::move(m);
      ops::MlaPreprocessArgs& ma = mlapo_args_;
      ma.wdqkv = mlapo_->wd_qkv;
      ma.descale0 = mlapo_->deq_scale_qkv;
      ma.gamma1 = mlapo_->gamma1;
      ma.beta1 = mlapo_->beta1;
      ma.wuq = mlapo_->wu_q;
      ma.descale1 = mlapo_->qb_deq_scl;
      ma.gamma2 = mlapo_->gamma2;
      ma.wuk = w_uk_t_;
      ma.quant_scale0 = mlapo_->quant_scale0;
      ma.quant_offset0 = mlapo_->quant_offset0;
      ma.bias0 = mlapo_->quant_bias_qkv;
      ma.quant_scale1 = mlapo_->quant_scale1;
      ma.quant_offset1 = mlapo_->quant_offset1;
      ma.bias1 = mlapo_->qb_qt_bias;
      ma.ctkv_scale = mlapo_->ctkv_scale;
      ma.q_nope_scale = mlapo_->q_nope_scale;
      ma.cache_mode = cfg_.kv_nz ? "nzcache" : "krope_ctkv";
      ma.quant_mode = "per_tensor_quant_asymm";
      ma.enable_inner_out = cfg_.query_norm;
      return;
    }
  }
}

void LatentCore::reload_weights(const Weights& nw) {
  const Dims& d = cfg_.dims;
  validate_weights(d, nw, cfg_.o_proj_shards);
  AAR_CHECK_ARG(activation_dtype(nw) == dtype() && weights_device(nw) == device(), "reload_weights: the new weights "
                "are ", activation_dtype(nw), " on ", weights_device(nw), ", the layer's are ", dtype(), " on ",
                device());
  AAR_CHECK_ARG(quant_type(nw) == quant(), "reload_weights: the new weights are ", to_string(quant_type(nw)),
                ", the layer's ", to_string(quant()));
  c10::InferenceMode guard;
  if (d.q_lora_rank.has_value()) put(*w_.q_a_layernorm, *nw.q_a_layernorm);
  if (w_.quant.has_value()) {
    for (auto [dst, src] : {std::pair<QuantLinear*, const QuantLinear*>{&w_.quant->fused_qkv_a_proj,
                                                                        &nw.quant->fused_qkv_a_proj},
                            {&w_.quant->q_proj, &nw.quant->q_proj}}) {
      put(dst->weight, src->weight);
      put(dst->weight_scale, src->weight_scale);
      put(dst->input_scale, src->input_scale);
      put(dst->input_offset, src->input_offset);
      put(dst->quant_bias, src->quant_bias);
    }
    qkv_a_.prepare(w_.quant->fused_qkv_a_proj, w_.quant->type, dtype(), true);
    q_b_.prepare(w_.quant->q_proj, w_.quant->type, dtype(), true);
  } else {
    if (d.q_lora_rank.has_value()) put(*w_.q_a_proj, *nw.q_a_proj);
    put(w_.q_proj, nw.q_proj);
    put(w_.kv_a_proj_with_mqa, nw.kv_a_proj_with_mqa);
  }
  put(w_.kv_a_layernorm, nw.kv_a_layernorm);
  put(w_.kv_b_proj, nw.kv_b_proj);
  put(w_.o_proj, nw.o_proj);
  const Absorbed a = split_kv_b_proj(w_.kv_b_proj, d.num_heads, d.qk_nope_head_dim, d.v_head_dim);
  w_uk_t_.copy_(a.w_uk_t);
  w_uv_.copy_(a.w_uv);
  prepare_fused(true);
}

Projections LatentCore::project(const at::Tensor& x) const {
  const Dims& d = cfg_.dims;
  Projections p;
  if (w_.quant.has_value()) {
    const int64_t Q = *d.q_lora_rank;
    const at::Tensor y = qkv_a_.run(x);  // (T, Q + L + R): q_a | kv_a
    p.q_c = ops::dense::rms_norm(y.narrow(-1, 0, Q), *w_.q_a_layernorm, cfg_.q_norm_eps);
    p.kv_raw = y.narrow(-1, Q, y.size(-1) - Q);
    p.q = q_b_.run(p.q_c);
    return p;
  }
  p.q_c = x;
  if (d.q_lora_rank.has_value()) {
    p.q_c = ops::dense::rms_norm(ops::dense::linear(x, *w_.q_a_proj), *w_.q_a_layernorm, cfg_.q_norm_eps);
  }
  p.kv_raw = ops::dense::linear(x, w_.kv_a_proj_with_mqa);
  p.q = ops::dense::linear(p.q_c, w_.q_proj);
  return p;
}

namespace {

// The int8 query (td, H, L), its rope part (td, H, R) and scales (td, H, 1) viewed in `layout`.
LatentQuery fa_views(const at::Tensor& qn, const at::Tensor& qr, const at::Tensor& dsq, int64_t td, int64_t H,
                     int64_t L, int64_t R, DecodeLayout layout) {
  switch (layout) {
    case DecodeLayout::TND: return {qn.view({td, H, L}), qr.view({td, H, R}), {}, {}, dsq.view({td, H})};
    case DecodeLayout::BSND: return {qn.view({td, 1, H, L}), qr.view({td, 1, H, R}), {}, {}, dsq.view({td, 1, H})};
    case DecodeLayout::BNSD: return {qn.view({td, H, 1, L}), qr.view({td, H, 1, R}), {}, {}, dsq.view({td, H, 1})};
  }
  return {};
}

}  // namespace

LatentQuery LatentCore::fa_query_buffers(int64_t td, DecodeLayout layout) {
  const Dims& d = cfg_.dims;
  const int64_t H = d.num_heads, L = d.kv_lora_rank, R = d.qk_rope_head_dim;
  FaBuffers& b = fa_bufs_[td];
  if (!b.qn.defined()) {
    const auto opts = at::TensorOptions().device(device());
    b.qn = at::zeros({td, H, L}, opts.dtype(at::kChar));
    b.qr = at::zeros({td, H, R}, opts.dtype(dtype()));
    b.dsq = at::zeros({td, H, 1}, opts.dtype(at::kFloat));
  }
  return fa_views(b.qn, b.qr, b.dsq, td, H, L, R, layout);
}

LatentQuery LatentCore::finish(const DecodeViews& v, const at::Tensor& qn, const at::Tensor& qr, int64_t td,
                               bool stable) {
  const Dims& d = cfg_.dims;
  const int64_t hp = cfg_.heads_padded;
  if (hp != d.num_heads || stable) {
    ops::dense::copy(v.qn_heads, qn);
    ops::dense::copy(v.qr_heads, qr);
    return {v.fia_qn, v.fia_qr};
  }
  auto as_layout = [&](const at::Tensor& x, int64_t D) -> at::Tensor {
    switch (v.layout) {
      case DecodeLayout::TND: return x.view({td, hp, D});
      case DecodeLayout::BSND: return x.view({td, 1, hp, D});
      case DecodeLayout::BNSD: return x.view({td, hp, 1, D});
    }
    return x;
  };
  return {view_of(qn, td, seen_.qn_src, seen_.qn, [&] { return as_layout(qn, d.kv_lora_rank); }),
          view_of(qr, td, seen_.qr_src, seen_.qr, [&] { return as_layout(qr, d.qk_rope_head_dim); })};
}

std::pair<const at::Tensor&, const at::Tensor&> LatentCore::rope_rows(const LatentStep& s, int64_t td) {
  const int64_t R = cfg_.dims.qk_rope_head_dim;
  const at::Tensor& cos = view_of(s.cos, td, seen_.cos_src, seen_.cos4,
                                  [&] { return s.cos.narrow(0, 0, td).view({td, 1, 1, R}); });
  const at::Tensor& sin = view_of(s.sin, td, seen_.sin_src, seen_.sin4,
                                  [&] { return s.sin.narrow(0, 0, td).view({td, 1, 1, R}); });
  return {cos, sin};
}

std::pair<const at::Tensor&, const at::Tensor&> LatentCore::rope_rows_2d(const LatentStep& s, int64_t td) {
  const at::Tensor& cos = view_of(s.cos, td, seen_.cos2_src, seen_.cos2, [&] { return s.cos.narrow(0, 0, td); });
  const at::Tensor& sin = view_of(s.sin, td, seen_.sin2_src, seen_.sin2, [&] { return s.sin.narrow(0, 0, td); });
  return {cos, sin};
}

at::Tensor LatentCore::native_query(const DecodeViews& v, const LatentStep& s, const at::Tensor& cos,
                                    const at::Tensor& sin) {
  const Dims& d = cfg_.dims;
  const int64_t L = d.kv_lora_rank, R = d.qk_rope_head_dim;
  if (w_.quant.has_value()) {
    const int64_t Q = *d.q_lora_rank;
    const at::Tensor y = qkv_a_.run(s.x);  // (td, Q + L + R)
    ops::dense::rms_norm_out(v.qc, y.narrow(1, 0, Q), *w_.q_a_layernorm, cfg_.q_norm_eps);
    ops::dense::copy(v.kv_raw, y.narrow(1, Q, L + R));
    ops::dense::copy(v.q, q_b_.run(v.qc));
  } else {
    if (d.q_lora_rank.has_value()) {
      ops::dense::linear_out(v.qa, s.x, *w_.q_a_proj);
      ops::dense::rms_norm_out(v.qc, v.qa, *w_.q_a_layernorm, cfg_.q_norm_eps);
    }
    ops::dense::linear_out(v.kv_raw, s.x, w_.kv_a_proj_with_mqa);
    ops::dense::linear_out(v.q, d.q_lora_rank.has_value() ? v.qc : s.x, w_.q_proj);
  }
  ops::dense::bmm_out(v.qn_heads_t, v.q_nope_t, w_uk_t_);  // ql_nope (td, H, L) into the padded query
  return ops::interleave_rope(v.q_pe4, cos, sin);          // q_pe (td, H, 1, R)
}

LatentQuery LatentCore::preprocess(const DecodeViews& v, const LatentStep& s, const at::Tensor& nope,
                                   const at::Tensor& rope, Fused path, bool stable) {
  const Dims& d = cfg_.dims;
  const int64_t td = s.x.sizes()[0], H = d.num_heads, L = d.kv_lora_rank, R = d.qk_rope_head_dim;
  const int64_t hp = cfg_.heads_padded;
  const bool padded = hp != H;
  AAR_CHECK_ARG(path == Fused::None || path == cfg_.fused, "the fused preprocess ", to_string(path),
                " was asked for but the layer prepared ", to_string(cfg_.fused));
  // Per-token views of the step's tensors, remade only when the caller hands
  // over another tensor (the builders hand out the same view for a batch shape).
  const at::Tensor& slots = view_of(s.slots, td, seen_.slots_src, seen_.slots, [&] {
    return s.slots.sizes()[0] == td ? s.slots : s.slots.narrow(0, 0, td);
  });
  const auto [cos, sin] = rope_rows(s, td);
  switch (path) {
    case Fused::PrologV3:
    case Fused::PrologV2: {
      // docs/design/mla.md §5.4 / docs/design/sfa.md §4.2: the fused prolog; q and k_pe come out in the
      // half-split RoPE order of the native path (weights via trans_rope_weight).
      // The weights are set once; only the step's inputs change.
      ops::MlaPrologArgs& a = prolog_args_;
      if (quant() == QuantType::W8A8Dynamic) {
        ops::DynamicQuantArgs q;
        q.input = s.x;
        auto [xq, sx] = ops::dynamic_quant(q);  // per-token int8 with its dequant scale
        a.token_x = xq;
        a.dequant_scale_x = sx.view({td, 1});
      } else {
        a.token_x = s.x;
      }
      const auto [cos2, sin2] = rope_rows_2d(s, td);
      a.rope_cos = cos2;
      a.rope_sin = sin2;
      a.cache_index = slots;
      LatentQuery out;
      if (path == Fused::PrologV3) {
        at::Tensor nope_w = nope, rope_w = rope;
        auto r = ops::mla_prolog_v3(a, nope_w, rope_w);
        out = finish(v, std::get<0>(r), std::get<1>(r), td, stable);
        if (cfg_.query_norm) {
          out.qc = std::get<3>(r);
          if (quant() == QuantType::W8A8Dynamic) out.qc_scale = std::get<4>(r);
        }
      } else {
        auto r = ops::mla_prolog_v2(a, nope, rope);
        at::Tensor qn = std::get<0>(r), qr = std::get<1>(r), dsq = std::get<4>(r);  // int8, act, (td, H, 1)
        // Never padded (FA-quant layers have power-of-two heads); viewed in the layout of v.
        if (stable) {
          out = fa_query_buffers(td, v.layout);
          const FaBuffers& b = fa_bufs_.at(td);
          ops::dense::copy(b.qn, qn);
          ops::dense::copy(b.qr, qr);
          ops::dense::copy(b.dsq, dsq);
        } else {
          out = fa_views(qn, qr, dsq, td, H, L, R, v.layout);
        }
      }
      a.token_x.reset();  // holds no step tensor past the call
      a.dequant_scale_x.reset();
      a.rope_cos.reset();
      a.rope_sin.reset();
      a.cache_index.reset();
      return out;
    }
    case Fused::Mlapo: {
      // docs/design/mla.md §5.4 / docs/design/sfa.md §4.2: vllm-ascend's W8A8-static mla_preprocess.
      ops::MlaPreprocessArgs& a = mlapo_args_;
      a.hidden_state = s.x;
      const auto [cos2, sin2] = rope_rows_2d(s, td);
      a.cos = cos2;
      a.sin = sin2;
      a.slotmapping = slots;
      at::Tensor q0 = at::empty({td, H, L}, s.x.options()), q1 = at::empty({td, H, R}, s.x.options());
      at::Tensor inner = v.qc;  // (td, Q): q_c with enable_inner_out
      at::Tensor nope_w = nope, rope_w = rope;
      ops::mla_preprocess(a, nope_w, rope_w, q0, q1, inner);
      a.hidden_state.reset();
      a.cos.reset();
      a.sin.reset();
      a.slotmapping.reset();
      LatentQuery out = finish(v, q0, q1, td, stable);
      if (cfg_.query_norm) out.qc = v.qc;
      return out;
    }
    case Fused::None:
      break;
  }
  // docs/design/mla.md §5.2: native preprocess, into the workspace.
  const at::Tensor q_pe = native_query(v, s, cos, sin);  // (td, H, 1, R)
  const char* mode = cfg_.kv_nz ? "PA_NZ" : "PA";
  if (kv_qscale_.defined()) {
    // FA-quant layer: the int8 latent cache, quantised like npu_mla_prolog_v2 does.
    ops::kv_rmsnorm_rope_cache(v.kv4, w_.kv_a_layernorm, cos, sin, slots, rope, nope, cfg_.kv_norm_eps, mode, false,
                               kv_qscale_);
  } else {
    ops::kv_rmsnorm_rope_cache(v.kv4, w_.kv_a_layernorm, cos, sin, slots, rope, nope, cfg_.kv_norm_eps, mode, false);
  }
  LatentQuery out;
  if (padded || stable) {
    ops::dense::copy(v.qr_heads4, q_pe);
    out = {v.fia_qn, v.fia_qr};
  } else {
    auto as_layout = [&](const at::Tensor& x4, int64_t D) -> at::Tensor {
      switch (v.layout) {
        case DecodeLayout::TND: return x4.view({td, hp, D});
        case DecodeLayout::BSND: return x4.view({td, 1, hp, D});
        case DecodeLayout::BNSD: return x4;
      }
      return x4;
    };
    out = {v.fia_qn, view_of(q_pe, td, seen_.qr_src, seen_.qr, [&] { return as_layout(q_pe, R); })};
  }
  if (d.q_lora_rank.has_value()) out.qc = v.qc;
  return out;
}

LatentQuery LatentCore::preprocess_unwritten(const DecodeViews& v, const LatentStep& s, LatentKv& kv) {
  // The query half is preprocess's native path; the key half replaces
  // npu_kv_rmsnorm_rope_cache's cache writes by the same maths on the rows:
  // RMSNorm * gamma and the interleave->half RoPE.
  const Dims& d = cfg_.dims;
  const int64_t td = s.x.sizes()[0];
  const auto [cos, sin] = rope_rows(s, td);
  ops::dense::copy(v.qr_heads4, native_query(v, s, cos, sin));
  // The column views are the workspace's (a narrow per call was a third of a DSA-CP slice's host time,
  // docs/design/sparse_cp.md §15).
  kv.k_nope = ops::dense::rms_norm(v.kv_nope, w_.kv_a_layernorm, cfg_.kv_norm_eps);
  kv.k_rope = ops::interleave_rope(v.kv_rope4, cos, sin);
  LatentQuery out{v.fia_qn, v.fia_qr};
  if (d.q_lora_rank.has_value()) out.qc = v.qc;
  return out;
}

LatentQuery LatentCore::preprocess_query(const DecodeViews& v, const LatentStep& s) {
  const int64_t td = s.x.sizes()[0];
  const auto [cos, sin] = rope_rows(s, td);
  ops::dense::copy(v.qr_heads4, native_query(v, s, cos, sin));  // v.kv_raw written too
  LatentQuery out{v.fia_qn, v.fia_qr};
  if (cfg_.dims.q_lora_rank.has_value()) out.qc = v.qc;
  return out;
}

void LatentCore::write_kv_rows(const at::Tensor& kv4, const at::Tensor& cos, const at::Tensor& sin,
                               const at::Tensor& slots, const at::Tensor& nope, const at::Tensor& rope) {
  // preprocess's native cache write (Fused::None), on the caller's rows.
  const char* mode = cfg_.kv_nz ? "PA_NZ" : "PA";
  if (kv_qscale_.defined()) {
    ops::kv_rmsnorm_rope_cache(kv4, w_.kv_a_layernorm, cos, sin, slots, rope, nope, cfg_.kv_norm_eps, mode, false,
                               kv_qscale_);
  } else {
    ops::kv_rmsnorm_rope_cache(kv4, w_.kv_a_layernorm, cos, sin, slots, rope, nope, cfg_.kv_norm_eps, mode, false);
  }
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
