#include "ascend_attn_rt/sfa/checkpoint.h"

#include <ATen/ATen.h>

#include <utility>
#include <vector>

#include "../common/checkpoint_reader.h"
#include "ascend_attn_rt/errors.h"

namespace aar::sfa {

namespace ck = ::aar::detail;  // the shared reader (cpp/common), not sfa::detail

CheckpointWeights weights_from_checkpoint(const std::map<std::string, at::Tensor>& state, std::string_view prefix,
                                          const ImplConfig& cfg) {
  const mla::Dims& d = cfg.dims;
  const int64_t Hn = d.num_heads, hid = d.hidden_size, L = d.kv_lora_rank, P = d.qk_nope_head_dim,
                R = d.qk_rope_head_dim, V = d.v_head_dim;
  AAR_CHECK_ARG(Hn > 0 && hid > 0 && L > 0 && P > 0 && R > 0 && V > 0, "num_heads, hidden_size, kv_lora_rank, "
                "qk_nope_head_dim, qk_rope_head_dim and v_head_dim must be positive, got ", Hn, ", ", hid, ", ", L,
                ", ", P, ", ", R, ", ", V);
  AAR_CHECK_ARG(!d.q_lora_rank.has_value() || *d.q_lora_rank > 0, "q_lora_rank must be positive (or None), got ",
                d.q_lora_rank.value_or(0));
  if (cfg.indexer.has_value()) {
    AAR_CHECK_ARG(cfg.indexer->n_head > 0 && cfg.indexer->head_dim > 0, "index_n_head and index_head_dim must be "
                  "positive, got ", cfg.indexer->n_head, ", ", cfg.indexer->head_dim);
  }

  ck::CheckpointReader r(state, prefix, "SFA");
  std::vector<std::pair<const at::Tensor*, const char*>> linears;
  auto linear = [&](at::Tensor& dst, const char* name, int64_t out, int64_t in) {
    dst = r.take(name, {out, in});
    linears.emplace_back(&dst, name);
  };
  CheckpointWeights out;
  mla::Weights& w = out.weights;
  at::Tensor q_a_proj, q_a_layernorm;
  const int64_t q_in = d.q_lora_rank.value_or(hid);
  // docs/design/sfa.md §9: an MXFP8 checkpoint (ModelSlim's W8A8-MXFP8) stores q_a_proj, kv_a_proj_with_mqa and
  // q_b_proj as float8_e4m3fn weights with e8m0 weight_scale bytes (out, in / 32); recognised by q_a_proj's dtype.
  const bool mx = d.q_lora_rank.has_value() && r.has("q_a_proj.weight") &&
                  state.at(r.key("q_a_proj.weight")).defined() &&
                  state.at(r.key("q_a_proj.weight")).scalar_type() == at::kFloat8_e4m3fn;
  mla::QuantLinear mx_q_a, mx_kv_a, mx_q_b;
  auto mx_linear = [&](mla::QuantLinear& dst, const std::string& name, int64_t o, int64_t in) {
    dst.weight = r.take(name + ".weight", {o, in});
    AAR_CHECK_ARG(in % mla::kMxBlock == 0, "'", r.key(name + ".weight"), "': an MXFP8 weight's input size must be a "
                  "multiple of ", mla::kMxBlock, ", got ", in);
    dst.weight_scale = r.take(name + ".weight_scale", {o, in / mla::kMxBlock});
  };
  if (mx) {
    mx_linear(mx_q_a, "q_a_proj", *d.q_lora_rank, hid);
    q_a_layernorm = r.take("q_a_layernorm.weight", {*d.q_lora_rank});
    mx_linear(mx_q_b, "q_b_proj", Hn * (P + R), q_in);
    mx_linear(mx_kv_a, "kv_a_proj_with_mqa", L + R, hid);
  } else if (d.q_lora_rank.has_value()) {
    linear(q_a_proj, "q_a_proj.weight", *d.q_lora_rank, hid);
    q_a_layernorm = r.take("q_a_layernorm.weight", {*d.q_lora_rank});
    linear(w.q_proj, "q_b_proj.weight", Hn * (P + R), q_in);
  } else {
    linear(w.q_proj, "q_proj.weight", Hn * (P + R), q_in);
  }
  if (!mx) linear(w.kv_a_proj_with_mqa, "kv_a_proj_with_mqa.weight", L + R, hid);
  w.kv_a_layernorm = r.take("kv_a_layernorm.weight", {L});
  linear(w.kv_b_proj, "kv_b_proj.weight", Hn * (P + V), L);
  linear(w.o_proj, "o_proj.weight", hid, Hn * V);
  IndexerWeights iw;
  if (cfg.indexer.has_value()) {
    const int64_t n = cfg.indexer->n_head, Di = cfg.indexer->head_dim;
    linear(iw.wq_b, "indexer.wq_b.weight", n * Di, q_in);
    linear(iw.wk, "indexer.wk.weight", Di, hid);
    linear(iw.weights_proj, "indexer.weights_proj.weight", n, hid);
    iw.k_norm_weight = r.take("indexer.k_norm.weight", {Di});
    iw.k_norm_bias = r.take("indexer.k_norm.bias", {Di});
  }
  r.finish();

  // kv_b_proj's dtype is the layer's (mla::activation_dtype: it is never quantised).
  const at::ScalarType dt = w.kv_b_proj.scalar_type();
  for (const auto& [t, name] : linears) ck::check_linear_dtype(*t, r.key(name), dt);
  w.kv_a_layernorm = ck::as_dtype(w.kv_a_layernorm, r.key("kv_a_layernorm.weight"), dt);
  if (mx) {
    for (const auto& [l, name] : {std::pair<const mla::QuantLinear*, const char*>{&mx_q_a, "q_a_proj"},
                                  {&mx_kv_a, "kv_a_proj_with_mqa"},
                                  {&mx_q_b, "q_b_proj"}}) {
      AAR_CHECK_ARG(l->weight.scalar_type() == at::kFloat8_e4m3fn, "'", r.key(std::string(name) + ".weight"), "' is ",
                    l->weight.scalar_type(), " but q_a_proj.weight is float8_e4m3fn: an MXFP8 checkpoint quantises "
                    "q_a_proj, kv_a_proj_with_mqa and q_b_proj together (the runtime fuses the first two)");
      const auto st = l->weight_scale.scalar_type();
      AAR_CHECK_ARG(st == at::kByte || st == at::kFloat8_e8m0fnu, "'", r.key(std::string(name) + ".weight_scale"),
                    "' is ", st, ", expected the e8m0 scale bytes (uint8 or float8_e8m0fnu)");
    }
    mla::QuantWeights q;
    q.type = mla::QuantType::MxFp8;
    // fused_qkv_a_proj = q_a_proj | kv_a_proj_with_mqa (rows), weights and scales alike: one copy at load.
    q.fused_qkv_a_proj.weight = at::cat({mx_q_a.weight, mx_kv_a.weight}, 0);
    q.fused_qkv_a_proj.weight_scale =
        at::cat({mx_q_a.weight_scale.view(at::kByte), mx_kv_a.weight_scale.view(at::kByte)}, 0);
    q.q_proj = mx_q_b;
    w.quant = std::move(q);
    w.q_a_layernorm = ck::as_dtype(q_a_layernorm, r.key("q_a_layernorm.weight"), dt);
  } else if (d.q_lora_rank.has_value()) {
    w.q_a_proj = q_a_proj;
    w.q_a_layernorm = ck::as_dtype(q_a_layernorm, r.key("q_a_layernorm.weight"), dt);
  }
  if (cfg.indexer.has_value()) {
    iw.k_norm_weight = ck::as_dtype(iw.k_norm_weight, r.key("indexer.k_norm.weight"), dt);
    iw.k_norm_bias = ck::as_dtype(iw.k_norm_bias, r.key("indexer.k_norm.bias"), dt);
    out.indexer = std::move(iw);
  }
  return out;
}

}  // namespace aar::sfa
