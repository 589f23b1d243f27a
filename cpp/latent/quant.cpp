// Quant types and the validation of W8A8 weights (latent/quant.h).
#include "ascend_attn_rt/latent/quant.h"

#include <ATen/ATen.h>

#include "ascend_attn_rt/errors.h"
#include "ascend_attn_rt/latent/weights.h"

namespace aar::mla {

const char* to_string(QuantType t) {
  switch (t) {
    case QuantType::None: return "none";
    case QuantType::W8A8Dynamic: return "w8a8_dynamic";
    case QuantType::W8A8Static: return "w8a8_static";
    case QuantType::MxFp8: return "mxfp8";
  }
  return "unknown";
}

QuantType parse_quant_type(const std::string& s) {
  for (QuantType t : {QuantType::None, QuantType::W8A8Dynamic, QuantType::W8A8Static, QuantType::MxFp8}) {
    if (s == to_string(t)) return t;
  }
  throw_invalid("quant_type must be one of \"none\", \"w8a8_dynamic\", \"w8a8_static\", \"mxfp8\", got \"", s, "\"");
}

namespace {

void check_linear(const QuantLinear& l, const char* name, int64_t out, int64_t in, bool is_static,
                  at::ScalarType act, c10::Device dev) {
  auto tensor = [&](const at::Tensor& t, const char* what, std::initializer_list<int64_t> shape, at::ScalarType dt) {
    AAR_CHECK_ARG(t.defined(), name, ".", what, " is missing");
    AAR_CHECK_ARG(t.sizes() == c10::IntArrayRef(shape), name, ".", what, " must have shape ", c10::IntArrayRef(shape),
                  ", got ", t.sizes());
    AAR_CHECK_ARG(t.scalar_type() == dt, name, ".", what, " must be ", dt, ", got ", t.scalar_type());
    AAR_CHECK_ARG(t.device() == dev, name, ".", what, " is on ", t.device(), " but the layer's weights are on ", dev);
  };
  tensor(l.weight, "weight", {out, in}, at::kChar);
  tensor(l.weight_scale, "weight_scale", {out}, at::kFloat);
  if (is_static) {
    AAR_CHECK_ARG(l.input_scale.has_value() && l.input_offset.has_value() && l.quant_bias.has_value(), name,
                  ": a W8A8-static linear needs input_scale, input_offset and quant_bias");
    tensor(*l.input_scale, "input_scale", {1}, act);
    tensor(*l.input_offset, "input_offset", {1}, at::kChar);
    tensor(*l.quant_bias, "quant_bias", {out}, at::kInt);
  } else {
    AAR_CHECK_ARG(!l.input_scale.has_value() && !l.input_offset.has_value() && !l.quant_bias.has_value(), name,
                  ": input_scale / input_offset / quant_bias belong to W8A8-static linears; a W8A8-dynamic one "
                  "quantises its input per token");
  }
}

// An MXFP8 linear: fp8 e4m3 weight (out, in), one e8m0 scale byte per 32 inputs (out, in / 32).
void check_mx_linear(const QuantLinear& l, const char* name, int64_t out, int64_t in, c10::Device dev) {
  AAR_CHECK_ARG(in % kMxBlock == 0, name, ": an MXFP8 linear's input size must be a multiple of ", kMxBlock,
                " (one e8m0 scale per ", kMxBlock, " inputs), got ", in);
  auto tensor = [&](const at::Tensor& t, const char* what, std::initializer_list<int64_t> shape) {
    AAR_CHECK_ARG(t.defined(), name, ".", what, " is missing");
    AAR_CHECK_ARG(t.sizes() == c10::IntArrayRef(shape), name, ".", what, " must have shape ", c10::IntArrayRef(shape),
                  ", got ", t.sizes());
    AAR_CHECK_ARG(t.device() == dev, name, ".", what, " is on ", t.device(), " but the layer's weights are on ", dev);
  };
  tensor(l.weight, "weight", {out, in});
  AAR_CHECK_ARG(l.weight.scalar_type() == at::kFloat8_e4m3fn, name, ".weight must be float8_e4m3fn (MXFP8), got ",
                l.weight.scalar_type());
  tensor(l.weight_scale, "weight_scale", {out, in / kMxBlock});
  const auto st = l.weight_scale.scalar_type();
  AAR_CHECK_ARG(st == at::kByte || st == at::kFloat8_e8m0fnu, name, ".weight_scale must be the e8m0 scale bytes, uint8 "
                "or float8_e8m0fnu, got ", st);
  AAR_CHECK_ARG(!l.input_scale.has_value() && !l.input_offset.has_value() && !l.quant_bias.has_value(), name,
                ": input_scale / input_offset / quant_bias belong to W8A8-static linears; an MXFP8 one quantises its "
                "input per block of ", kMxBlock, " (npu_dynamic_mx_quant)");
}

}  // namespace

void validate_quant_weights(const Dims& d, const QuantWeights& q, at::ScalarType act, c10::Device dev) {
  AAR_CHECK_ARG(q.type == QuantType::W8A8Dynamic || q.type == QuantType::W8A8Static || q.type == QuantType::MxFp8,
                "quantised weights need quant_type \"w8a8_dynamic\", \"w8a8_static\" or \"mxfp8\", got \"",
                to_string(q.type), "\"");
  AAR_CHECK_ARG(d.q_lora_rank.has_value(), "quantised weights (", to_string(q.type), ") need q-LoRA (q_lora_rank): "
                "fused_qkv_a_proj is the q-LoRA down projection stacked with kv_a_proj_with_mqa");
  const bool st = q.type == QuantType::W8A8Static;
  const int64_t Q = *d.q_lora_rank, L = d.kv_lora_rank, R = d.qk_rope_head_dim;
  if (q.type == QuantType::MxFp8) {
    AAR_CHECK_ARG(act == at::kBFloat16 || act == at::kHalf, "MXFP8 weights need bfloat16 or float16 activations "
                  "(npu_dynamic_mx_quant's input, npu_quant_matmul's MX output), the layer's are ", act);
    check_mx_linear(q.fused_qkv_a_proj, "fused_qkv_a_proj", Q + L + R, d.hidden_size, dev);
    check_mx_linear(q.q_proj, "q_proj", d.num_heads * (d.qk_nope_head_dim + R), Q, dev);
    return;
  }
  check_linear(q.fused_qkv_a_proj, "fused_qkv_a_proj", Q + L + R, d.hidden_size, st, act, dev);
  check_linear(q.q_proj, "q_proj", d.num_heads * (d.qk_nope_head_dim + R), Q, st, act, dev);
}

}  // namespace aar::mla
