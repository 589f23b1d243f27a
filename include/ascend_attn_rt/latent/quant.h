// Quantised (W8A8) projections of an MLA-family layer (MLA, SFA): the two
// linears ModelSlim quantises before attention, fused_qkv_a_proj (q_a_proj and
// kv_a_proj_with_mqa stacked) and q_proj (q_b_proj). kv_b_proj and o_proj stay
// unquantised (docs/design/mla.md §4.1: W_UK / W_UV are derived from kv_b_proj).
//
//  W8A8 dynamic: y = (x_q @ weight^T) * s_x[t] * weight_scale[o], with
//    (x_q, s_x) the per-token symmetric int8 quantisation of x (npu_dynamic_quant).
//  W8A8 static (per-tensor asymmetric activations):
//    x_q = saturate_int8(rint(x / input_scale + input_offset)),
//    y   = (x_q @ weight^T + quant_bias) * input_scale * weight_scale[o],
//    quant_bias (int32, accumulator units) carrying the zero-point correction
//    -input_offset * sum_k weight[o, k] (ModelSlim's quant_bias) plus any affine bias.
// Both approximate x @ (weight * weight_scale[:, None])^T: "the dequantised weights".
// MXFP8 (A5) is recognised by name and rejected (not implemented).
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>

namespace aar::mla {

struct Dims;

// The quant-method type of fused_qkv_a_proj (docs/design/sfa.md §4.2's `qt`).
enum class QuantType : int32_t { None = 0, W8A8Dynamic = 1, W8A8Static = 2, MxFp8 = 3 };
const char* to_string(QuantType t);  // "none", "w8a8_dynamic", "w8a8_static", "mxfp8"
// "none" / "w8a8_dynamic" / "w8a8_static" / "mxfp8"; anything else is rejected by name.
QuantType parse_quant_type(const std::string& s);

// One W8A8 linear, torch layout.
struct QuantLinear {
  at::Tensor weight;                       // int8 (out, in)
  at::Tensor weight_scale;                 // float32 (out): per-output-channel weight scale
  std::optional<at::Tensor> input_scale;   // W8A8 static: (1), the activation dtype
  std::optional<at::Tensor> input_offset;  // W8A8 static: (1) int8 zero point
  std::optional<at::Tensor> quant_bias;    // W8A8 static: int32 (out)
};

struct QuantWeights {
  QuantType type = QuantType::None;
  QuantLinear fused_qkv_a_proj;  // (Q + L + R, hidden): rows q_a_proj | kv_a_proj_with_mqa
  QuantLinear q_proj;            // (H * (P + R), Q)
};

// Shapes, dtypes and devices (error messages name the tensor); the activations
// are act_dtype on device. MXFP8 and None are rejected.
void validate_quant_weights(const Dims& d, const QuantWeights& q, at::ScalarType act_dtype, c10::Device device);

}  // namespace aar::mla
