// MLA weight processing (spec mla.md 4.1-4.3, prolog weights).
#include "ascend_attn_rt/mla/weights.h"

#include <ATen/ATen.h>

#include "ascend_attn_rt/errors.h"
#include "ascend_attn_rt/plan/workspace.h"

namespace aar::mla {

namespace {
void check_shape(const at::Tensor& t, const char* name, std::initializer_list<int64_t> shape) {
  AAR_CHECK_ARG(t.defined(), name, " is missing");
  AAR_CHECK_ARG(t.sizes() == c10::IntArrayRef(shape), name, " must have shape ", c10::IntArrayRef(shape), ", got ",
                t.sizes());
}
}  // namespace

void validate_weights(const Dims& d, const Weights& w) {
  const int64_t H = d.num_heads, L = d.kv_lora_rank, P = d.qk_nope_head_dim, R = d.qk_rope_head_dim,
                V = d.v_head_dim, hid = d.hidden_size;
  AAR_CHECK_ARG(H > 0 && hid > 0 && L > 0 && P > 0 && R > 0 && V > 0, "MLA dims must be positive (num_heads=", H,
                ", hidden_size=", hid, ", kv_lora_rank=", L, ", qk_nope_head_dim=", P, ", qk_rope_head_dim=", R,
                ", v_head_dim=", V, ")");
  AAR_CHECK_ARG(R % 2 == 0, "qk_rope_head_dim must be even, got ", R);
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
  check_shape(w.kv_a_layernorm, "kv_a_layernorm", {L});
  check_shape(w.kv_b_proj, "kv_b_proj", {H * (P + V), L});
  check_shape(w.o_proj, "o_proj", {hid, H * V});
  const auto dt = w.q_proj.scalar_type();
  for (const at::Tensor* t : {&w.q_proj, &w.kv_a_proj_with_mqa, &w.kv_a_layernorm, &w.kv_b_proj, &w.o_proj}) {
    AAR_CHECK_ARG(t->scalar_type() == dt, "MLA weights must share one dtype: got ", t->scalar_type(), " and ", dt);
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
                " must be even and <= ", n);
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

PrologWeights prepare_prolog_weights(const Dims& d, const Weights& w, const at::Tensor& w_uk_t) {
  AAR_CHECK_ARG(d.q_lora_rank.has_value(), "the fused prolog (npu_mla_prolog_v3) needs q-LoRA (q_lora_rank)");
  const int64_t H = d.num_heads, P = d.qk_nope_head_dim, R = d.qk_rope_head_dim, Q = *d.q_lora_rank;
  PrologWeights p;
  p.weight_dq = w.q_a_proj->t().contiguous();
  p.weight_uq_qr = trans_rope_weight(w.q_proj.view({H, P + R, Q}), R).view({H * (P + R), Q}).t().contiguous();
  p.weight_uk = w_uk_t;
  p.weight_dkv_kr = trans_rope_weight(w.kv_a_proj_with_mqa, R).t().contiguous();
  p.gamma_cq = *w.q_a_layernorm;
  p.gamma_ckv = w.kv_a_layernorm;
  return p;
}

}  // namespace aar::mla
