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
//  W8A8 MXFP8 (A5, dynamic): weight float8_e4m3fn (out, in), weight_scale the
//    e8m0 bytes (out, in / 32) (uint8 or float8_e8m0fnu: 2^(b - 127) per 32
//    inputs); x is quantised per 32 values (npu_dynamic_mx_quant, OCP rule),
//    y[t, o] = sum_k x_q[t, k] s_x[t, k / 32] weight[o, k] weight_scale[o, k / 32]
//    (npu_quant_matmul's MX mode); bfloat16 / float16 activations, in % 32 == 0.
// All approximate x @ W^T with W the dequantised weights. The fused preprocess
// operators (MLAPO, PROLOG_V3 / V2) take no MXFP8 weights here: refused by name.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>

namespace aar::mla {

struct Dims;

// The quant-method type of fused_qkv_a_proj (docs/design/sfa.md §4.2's `qt`).
enum class QuantType : int32_t { None = 0, W8A8Dynamic = 1, W8A8Static = 2, MxFp8 = 3 };
// Inputs per e8m0 scale of an MXFP8 linear.
constexpr int64_t kMxBlock = 32;
const char* to_string(QuantType t);  // "none", "w8a8_dynamic", "w8a8_static", "mxfp8"
// "none" / "w8a8_dynamic" / "w8a8_static" / "mxfp8"; anything else is rejected by name.
QuantType parse_quant_type(const std::string& s);

// One W8A8 linear, torch layout.
struct QuantLinear {
  at::Tensor weight;                       // int8 (out, in); MXFP8: float8_e4m3fn (out, in)
  at::Tensor weight_scale;                 // float32 (out): per-output-channel weight scale; MXFP8: e8m0 (out, in / 32)
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
// are act_dtype on device. None is rejected.
void validate_quant_weights(const Dims& d, const QuantWeights& q, at::ScalarType act_dtype, c10::Device device);

}  // namespace aar::mla
