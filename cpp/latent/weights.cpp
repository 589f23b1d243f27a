// MLA weight processing (docs/design/mla.md §4.1-§4.3, prolog weights).
#include "ascend_attn_rt/latent/weights.h"

#include <ATen/ATen.h>

#include "ascend_attn_rt/errors.h"
#include "ascend_attn_rt/plan/workspace.h"
#include "../common/impl_checks.h"

namespace aar::mla {

namespace {
void check_shape(const at::Tensor& t, const char* name, std::initializer_list<int64_t> shape) {
  AAR_CHECK_ARG(t.defined(), name, " is missing");
  AAR_CHECK_ARG(t.sizes() == c10::IntArrayRef(shape), name, " must have shape ", c10::IntArrayRef(shape), ", got ",
                t.sizes());
}
}  // namespace

void validate_weights(const Dims& d, const Weights& w, int64_t o_proj_shards) {
  const int64_t H = d.num_heads, L = d.kv_lora_rank, P = d.qk_nope_head_dim, R = d.qk_rope_head_dim,
                V = d.v_head_dim, hid = d.hidden_size;
  // Bounded (internal::kMaxModelDim) before any product of them is formed: INT64_MAX wrapped the
  // weights' expected shapes, and the error then named a weight instead of the dim.
  const int64_t Q = d.q_lora_rank.value_or(1);
  using internal::dim_in_range;
  AAR_CHECK_ARG(dim_in_range(H) && dim_in_range(hid) && dim_in_range(L) && dim_in_range(P) && dim_in_range(R) &&
                    dim_in_range(V) && dim_in_range(Q),
                "MLA dims must be in [1, ", internal::kMaxModelDim, "] (num_heads=", H, ", hidden_size=", hid,
                ", q_lora_rank=", Q, ", kv_lora_rank=", L, ", qk_nope_head_dim=", P, ", qk_rope_head_dim=", R,
                ", v_head_dim=", V, ")");
  AAR_CHECK_ARG(R % 2 == 0, "qk_rope_head_dim must be even, got ", R);
  check_shape(w.kv_a_layernorm, "kv_a_layernorm", {L});
  check_shape(w.kv_b_proj, "kv_b_proj", {H * (P + V), L});
  AAR_CHECK_ARG(o_proj_shards >= 1 && H % o_proj_shards == 0, "o_proj shards: num_heads=", H,
                " is not divisible by the DSA-CP group size ", o_proj_shards);
  if (o_proj_shards > 1) {
    AAR_CHECK_ARG(w.o_proj.defined() && w.o_proj.sizes() == c10::IntArrayRef({hid, H * V / o_proj_shards}),
                  "o_proj must be this rank's row-parallel shard of shape ", c10::IntArrayRef({hid, H * V / o_proj_shards}),
                  " (hidden_size, num_heads * v_head_dim / ", o_proj_shards, ": DSA-CP computes all heads), got ",
                  w.o_proj.defined() ? w.o_proj.sizes() : c10::IntArrayRef{});
  } else {
    check_shape(w.o_proj, "o_proj", {hid, H * V});
  }
  const auto dt = w.kv_b_proj.scalar_type();
  const c10::Device dev = w.kv_b_proj.device();
  std::vector<const at::Tensor*> dense{&w.kv_a_layernorm, &w.kv_b_proj, &w.o_proj};
  if (w.quant.has_value()) {
    AAR_CHECK_ARG(!w.q_a_proj.has_value() && !w.q_proj.defined() && !w.kv_a_proj_with_mqa.defined(),
                  "quantised weights (", to_string(w.quant->type), "): q_a_proj, q_proj and kv_a_proj_with_mqa are "
                  "replaced by the quantised fused_qkv_a_proj and q_proj, do not pass them");
    AAR_CHECK_ARG(d.q_lora_rank.has_value() && w.q_a_layernorm.has_value(),
                  "quantised weights need q-LoRA: q_lora_rank and q_a_layernorm");
    check_shape(*w.q_a_layernorm, "q_a_layernorm", {*d.q_lora_rank});
    dense.push_back(&*w.q_a_layernorm);
    validate_quant_weights(d, *w.quant, dt, dev);
  } else {
    int64_t q_in = hid;
    if (d.q_lora_rank.has_value()) {
      const int64_t Q = *d.q_lora_rank;
      AAR_CHECK_ARG(Q > 0, "q_lora_rank must be positive, got ", Q);
      AAR_CHECK_ARG(w.q_a_proj.has_value() && w.q_a_layernorm.has_value(),
                    "q_lora_rank is set: q_a_proj and q_a_layernorm are required");
      check_shape(*w.q_a_proj, "q_a_proj", {Q, hid});
      check_shape(*w.q_a_layernorm, "q_a_layernorm", {Q});
      q_in = Q;
    } else {
      AAR_CHECK_ARG(!w.q_a_proj.has_value() && !w.q_a_layernorm.has_value(),
                    "q_a_proj / q_a_layernorm given but q_lora_rank is None");
    }
    check_shape(w.q_proj, "q_proj", {H * (P + R), q_in});
    check_shape(w.kv_a_proj_with_mqa, "kv_a_proj_with_mqa", {L + R, hid});
    dense.insert(dense.end(), {&w.q_proj, &w.kv_a_proj_with_mqa});
  }
  for (const at::Tensor* t : dense) {
    AAR_CHECK_ARG(t->scalar_type() == dt, "MLA weights must share one dtype: got ", t->scalar_type(), " and ", dt);
    AAR_CHECK_ARG(t->device() == dev, "MLA weights must share one device: got ", t->device(), " and ", dev);
  }
}

Absorbed split_kv_b_proj(const at::Tensor& kv_b, int64_t H, int64_t P, int64_t V) {
  AAR_CHECK_ARG(kv_b.dim() == 2 && kv_b.size(0) == H * (P + V), "kv_b_proj must be (H*(P+V)=", H * (P + V),
                ", L), got ", kv_b.sizes());
  const at::Tensor w = kv_b.view({H, P + V, kv_b.size(1)});
  return {w.narrow(1, 0, P).contiguous(), w.narrow(1, P, V).transpose(1, 2).contiguous()};
}

at::Tensor trans_rope_weight(const at::Tensor& w, int64_t rope_dim) {
  AAR_CHECK_ARG(w.dim() >= 2, "trans_rope_weight: weight must have at least 2 dims, got ", w.sizes());
  const int64_t n = w.size(-2);
  AAR_CHECK_ARG(rope_dim >= 0 && rope_dim <= n && rope_dim % 2 == 0, "trans_rope_weight: rope_dim=", rope_dim,
                " must be even and <= the weight's rows (size(-2)=", n, ")");
  if (rope_dim == 0) return w.contiguous();
  const at::Tensor rope = w.narrow(-2, n - rope_dim, rope_dim);
  return at::cat({w.narrow(-2, 0, n - rope_dim), rope.slice(-2, 0, rope_dim, 2), rope.slice(-2, 1, rope_dim, 2)}, -2)
      .contiguous();
}

at::Tensor transdata(const at::Tensor& nd, int64_t rb, int64_t cb) {
  AAR_CHECK_ARG(nd.dim() == 2, "transdata: input must be 2-D, got ", nd.sizes());
  AAR_CHECK_ARG(rb > 0 && cb > 0, "transdata: block sizes must be positive, got (", rb, ", ", cb, ")");
  const int64_t r = plan::round_up(nd.size(0), rb), c = plan::round_up(nd.size(1), cb);
  // Rows padded by their own pad amount, columns by theirs (the upstream swap is fixed).
  const at::Tensor padded = at::constant_pad_nd(nd, {0, c - nd.size(1), 0, r - nd.size(0)});
  return padded.view({r, c / cb, cb}).permute({1, 0, 2}).contiguous();
}

namespace {

// trans_rope_weight of a per-output-channel vector (n) whose last `rope` entries are rope rows.
at::Tensor permute_rope_rows(const at::Tensor& v, int64_t rope) {
  return trans_rope_weight(v.unsqueeze(-1), rope).squeeze(-1);
}

// The same for a per-head stacked vector (H * (P + R)).
at::Tensor permute_rope_rows_per_head(const at::Tensor& v, int64_t heads, int64_t rope) {
  return trans_rope_weight(v.view({heads, -1, 1}), rope).reshape({-1});
}

}  // namespace

PrologWeights prepare_prolog_weights(const Dims& d, const Weights& w, const at::Tensor& w_uk_t) {
  AAR_CHECK_ARG(d.q_lora_rank.has_value(), "the fused prolog (npu_mla_prolog_v3 / v2) needs q-LoRA (q_lora_rank)");
  const int64_t H = d.num_heads, P = d.qk_nope_head_dim, R = d.qk_rope_head_dim, Q = *d.q_lora_rank;
  PrologWeights p;
  p.weight_uk = w_uk_t;
  p.gamma_cq = *w.q_a_layernorm;
  p.gamma_ckv = w.kv_a_layernorm;
  if (!w.quant.has_value()) {
    p.weight_dq = w.q_a_proj->t().contiguous();
    p.weight_uq_qr = trans_rope_weight(w.q_proj.view({H, P + R, Q}), R).view({H * (P + R), Q}).t().contiguous();
    p.weight_dkv_kr = trans_rope_weight(w.kv_a_proj_with_mqa, R).t().contiguous();
    return p;
  }
  const QuantWeights& qw = *w.quant;
  AAR_CHECK_ARG(qw.type == QuantType::W8A8Dynamic, "the fused prolog takes W8A8-dynamic weights (per-token "
                "quantised activations), got ", to_string(qw.type));
  const QuantLinear& f = qw.fused_qkv_a_proj;
  const at::Tensor wkv = f.weight.narrow(0, Q, f.weight.size(0) - Q);
  p.weight_dq = f.weight.narrow(0, 0, Q).t().contiguous();
  p.weight_dkv_kr = trans_rope_weight(wkv, R).t().contiguous();
  p.weight_uq_qr =
      trans_rope_weight(qw.q_proj.weight.view({H, P + R, Q}), R).view({H * (P + R), Q}).t().contiguous();
  p.dequant_scale_w_dq = f.weight_scale.narrow(0, 0, Q).reshape({1, Q}).contiguous();
  p.dequant_scale_w_dkv_kr = permute_rope_rows(f.weight_scale.narrow(0, Q, f.weight.size(0) - Q), R).view({1, -1});
  p.dequant_scale_w_uq_qr = permute_rope_rows_per_head(qw.q_proj.weight_scale, H, R).view({1, -1});
  return p;
}

MlapoWeights prepare_mlapo_weights(const Dims& d, const Weights& w) {
  AAR_CHECK_ARG(d.q_lora_rank.has_value() && w.quant.has_value() && w.quant->type == QuantType::W8A8Static,
                "mla_preprocess (MLAPO) takes W8A8-static weights with q-LoRA");
  const int64_t H = d.num_heads, P = d.qk_nope_head_dim, R = d.qk_rope_head_dim, Q = *d.q_lora_rank;
  const QuantWeights& qw = *w.quant;
  const QuantLinear& f = qw.fused_qkv_a_proj;
  const QuantLinear& u = qw.q_proj;
  const int64_t nkv = f.weight.size(0) - Q;
  MlapoWeights m;
  // Down projection: rows kv (rope rows permuted) | q; dequant scale = input_scale * weight_scale.
  const at::Tensor deq0 = f.weight_scale * f.input_scale->to(at::kFloat);
  m.wd_qkv = transdata(at::cat({trans_rope_weight(f.weight.narrow(0, Q, nkv), R), f.weight.narrow(0, 0, Q)}, 0))
                 .unsqueeze(0);
  m.deq_scale_qkv = at::cat({permute_rope_rows(deq0.narrow(0, Q, nkv), R), deq0.narrow(0, 0, Q)}).contiguous();
  m.quant_bias_qkv =
      at::cat({permute_rope_rows(f.quant_bias->narrow(0, Q, nkv), R), f.quant_bias->narrow(0, 0, Q)}).contiguous();
  // Up projection: per-head rope rows permuted.
  m.wu_q = transdata(trans_rope_weight(u.weight.view({H, P + R, Q}), R).view({H * (P + R), Q})).unsqueeze(0);
  m.qb_deq_scl = permute_rope_rows_per_head(u.weight_scale * u.input_scale->to(at::kFloat), H, R).contiguous();
  m.qb_qt_bias = permute_rope_rows_per_head(*u.quant_bias, H, R).contiguous();
  m.gamma1 = *w.q_a_layernorm;
  m.beta1 = at::zeros_like(*w.q_a_layernorm);
  m.gamma2 = w.kv_a_layernorm;
  m.quant_scale0 = *f.input_scale;
  m.quant_offset0 = *f.input_offset;
  m.quant_scale1 = *u.input_scale;
  m.quant_offset1 = *u.input_offset;
  m.ctkv_scale = at::ones({1}, w.kv_b_proj.options());
  m.q_nope_scale = at::ones({H}, w.kv_b_proj.options());
  return m;
}

}  // namespace aar::mla
