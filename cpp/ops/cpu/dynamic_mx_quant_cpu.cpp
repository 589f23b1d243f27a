// CPU twin of torch_npu's npu_dynamic_mx_quant (ops/mx_quant.h), float8
// e4m3fn targets. Per block of block_size values along the last axis (a
// short last block is padded with zeros, as the doc's dual-axis variant
// says), amax = max |x| (scale_alg 1: max(amax, max_low_bound)), then
//   scale_alg 0 (OCP MX v1.0, the default and the DSA o_proj's):
//     e = floor(log2(amax)) - 8       (8: e4m3's emax)
//   scale_alg 1 (the doc's "CuBALS" rule, kv_compress_epilog's):
//     e = the smallest e with 448 * 2^e >= amax
// clamped to [-127, 127] (amax 0 gives -127), y = RNE(x / 2^e) saturated to
// +-448, scale byte e + 127. The doc writes P = cast_to_dst_type(V / mxscale,
// "rint") and is silent on overflow; under rule 0 the block's largest element
// lands in [256, 512): saturating to 448 is the OCP spec's conversion (clamp
// to the element type's max normal). A block holding a NaN or inf gets scale
// byte 255 (e8m0 NaN) and NaN elements.
// mxscale: uint8 (the doc: float8_e8m0fnu, returned as uint8), shape the
// input's with the last dim replaced by (ceil(n / block_size) rounded up to
// even) / 2 and a trailing 2; a pad block's byte is 0.
#include <torch/library.h>

#include <cmath>
#include <vector>

#include "../op_signatures_mx.h"
#include "attention_reference.h"
#include "mx_codec.h"

namespace aar::ops::cpu {
namespace {

constexpr const char* kDynamicMxQuantOp = "npu_dynamic_mx_quant";

// torch.float8_e4m3fn as the ScalarType value torch passes, and torch_npu's own code in the doc.
constexpr int64_t kE4m3Scalar = static_cast<int64_t>(at::kFloat8_e4m3fn), kE4m3Npu = 292;

void check_dst_type(int64_t dst_type) {
  if (dst_type == kE4m3Scalar || dst_type == kE4m3Npu) return;
  if (dst_type == static_cast<int64_t>(at::kFloat8_e5m2) || dst_type == 291) {
    throw_not_supported(kDynamicMxQuantOp, ": not supported by the CPU twin: dst_type=", dst_type,
                        " (float8_e5m2); only float8_e4m3fn (", kE4m3Scalar, " or ", kE4m3Npu, ")");
  }
  if (dst_type == 296 || dst_type == 297) {
    throw_not_supported(kDynamicMxQuantOp, ": not supported by the CPU twin: dst_type=", dst_type,
                        dst_type == 296 ? " (float4_e2m1fn_x2, the schema default)" : " (float4_e1m2fn_x2)",
                        "; only float8_e4m3fn (", kE4m3Scalar, " or ", kE4m3Npu, ")");
  }
  throw_invalid(kDynamicMxQuantOp, ": dst_type=", dst_type, " is not an MX target (float8_e4m3fn ", kE4m3Scalar, " / ", kE4m3Npu,
                ", float8_e5m2 23 / 291, float4 296 / 297)");
}

std::tuple<at::Tensor, at::Tensor> dynamic_mx_quant(AAR_DYNAMIC_MX_QUANT_PARAMS) {
  AAR_CHECK_ARG(input.defined() && input.device().is_cpu(), kDynamicMxQuantOp, ": the CPU twin needs a CPU input");
  AAR_CHECK_ARG(is_float_dtype(input.scalar_type()), kDynamicMxQuantOp, ": input must be float16, bfloat16 or float32, got ",
                input.scalar_type());
  const int64_t rank = input.dim();
  AAR_CHECK_ARG(rank >= 1 && rank <= 7, kDynamicMxQuantOp, ": input must have 1 to 7 dims, got ", input.sizes());
  AAR_CHECK_ARG(axis >= -rank && axis < rank, kDynamicMxQuantOp, ": axis=", axis, " is outside [", -rank, ", ", rank - 1, "]");
  if (axis != -1 && axis != rank - 1) {
    throw_not_supported(kDynamicMxQuantOp, ": not supported by the CPU twin: axis=", axis, " (only the last axis; on other "
                        "axes the device interleaves the scales of row pairs)");
  }
  check_dst_type(dst_type);
  AAR_CHECK_ARG(round_mode == "rint", kDynamicMxQuantOp, ": round_mode='", std::string(round_mode),
                "' is not supported for float8 targets (only 'rint')");
  AAR_CHECK_ARG(block_size > 0 && block_size % 32 == 0 && block_size <= 1024, kDynamicMxQuantOp, ": block_size=", block_size,
                " must be a positive multiple of 32, at most 1024");
  const int64_t alg = scale_alg.value_or(0);
  AAR_CHECK_ARG(alg == 0 || alg == 1, kDynamicMxQuantOp, ": scale_alg=", alg, " is not valid for float8 targets (0: OCP, 1: CuBALS)");
  AAR_CHECK_ARG(dst_type_max == 0.0, kDynamicMxQuantOp, ": dst_type_max=", dst_type_max,
                " applies to float4_e2m1fn_x2 only; float8 targets need 0.0");
  AAR_CHECK_ARG(max_low_bound >= 0.0 && (alg == 1 || max_low_bound == 0.0), kDynamicMxQuantOp, ": max_low_bound=", max_low_bound,
                " must be >= 0, and 0.0 unless scale_alg is 1");
  const int64_t n = input.size(-1);
  if (input.scalar_type() == at::kFloat) {
    AAR_CHECK_ARG(block_size == 32 && n >= 32, kDynamicMxQuantOp, ": float32 input needs block_size 32 and a quantised axis of "
                  "at least 32, got block_size=", block_size, ", axis size ", n);
  }
  AAR_CHECK_ARG(n > 0, kDynamicMxQuantOp, ": the quantised axis is empty (input ", input.sizes(), ")");

  const int64_t blocks = (n + block_size - 1) / block_size, pairs = (blocks + 1) / 2;
  std::vector<int64_t> lead(input.sizes().begin(), input.sizes().end() - 1);
  int64_t rows = 1;
  for (int64_t s : lead) rows *= s;
  at::Tensor x = input.to(at::kFloat).reshape({rows, n});
  if (blocks * block_size != n) x = at::constant_pad_nd(x, {0, blocks * block_size - n});
  const at::Tensor xb = x.view({rows, blocks, block_size});
  const at::Tensor amax = xb.abs().amax(-1).to(at::kDouble).contiguous();  // NaN propagates
  std::vector<int64_t> ex(static_cast<size_t>(rows * blocks));
  const double* ap = amax.data_ptr<double>();
  for (size_t i = 0; i < ex.size(); ++i) {
    ex[i] = alg == 0 ? mx::exponent_ocp(ap[i]) : mx::exponent_ceil(std::max(ap[i], max_low_bound));
  }
  const at::Tensor e = at::tensor(ex, at::TensorOptions().dtype(at::kLong)).view({rows, blocks});
  std::vector<int64_t> ys(lead), ss(lead);
  ys.push_back(n);
  ss.push_back(pairs);
  ss.push_back(2);
  const at::Tensor y = mx::quantize_e4m3(xb, e).view({rows, blocks * block_size}).narrow(1, 0, n).reshape(ys);
  at::Tensor sb = (e + mx::kE8m0Bias).to(at::kByte);
  if (2 * pairs != blocks) sb = at::constant_pad_nd(sb, {0, 1});
  return {y.contiguous(), sb.reshape(ss).contiguous()};
}

}  // namespace
}  // namespace aar::ops::cpu

TORCH_LIBRARY_IMPL(ascend_cpu, CPU, m) {
  m.impl("npu_dynamic_mx_quant", TORCH_FN(aar::ops::cpu::dynamic_mx_quant));
}
