// CPU twin of npu_dynamic_quant (per-token symmetric dynamic quantisation):
// per row (last dim) of input, scale = amax(|x|) / QMAX and q = round(x / scale),
// rounding half to even, computed in fp32; returns (q, scale) with scale fp32 of
// shape input.shape[:-1] (the DEQUANT scale: x ~ q * scale). An all-zero row
// gives scale 0 and q 0.
// dst_type is an at::ScalarType value: None or int8 (1) -> int8, QMAX 127;
// float8_e4m3fn (24) -> float8_e4m3fn, QMAX 448 (x / scale converted with
// round-to-nearest-even, as CPU torch's float8 cast does). Implemented:
// quant_mode "pertoken", dst_type_max 0 (or the dtype's own QMAX); smooth_scales,
// group_index (MoE) and other dst types (quint4x2, hifloat8) are rejected by name.
#include <torch/library.h>

#include "../op_signatures.h"
#include "attention_reference.h"

namespace aar::ops::cpu {
namespace {

constexpr const char* kDynamicQuantOp = "npu_dynamic_quant";

std::tuple<at::Tensor, at::Tensor> dynamic_quant(AAR_DYNAMIC_QUANT_PARAMS) {
  reject_tensor(kDynamicQuantOp, smooth_scales, "smooth_scales");
  reject_tensor(kDynamicQuantOp, group_index, "group_index");
  if (quant_mode != "pertoken") {
    throw_not_supported(kDynamicQuantOp, ": not supported by the CPU twin: quant_mode=\"", quant_mode, "\" (only \"pertoken\")");
  }
  at::ScalarType out = at::kChar;
  double qmax = 127.0;
  if (dst_type.has_value() && *dst_type != static_cast<int64_t>(at::kChar)) {
    if (*dst_type != static_cast<int64_t>(at::kFloat8_e4m3fn)) {
      throw_not_supported(kDynamicQuantOp, ": not supported by the CPU twin: dst_type=", *dst_type, " (only None / ",
                          static_cast<int64_t>(at::kChar), " = int8 and ", static_cast<int64_t>(at::kFloat8_e4m3fn),
                          " = float8_e4m3fn)");
    }
    out = at::kFloat8_e4m3fn;
    qmax = 448.0;
  }
  if (dst_type_max != 0.0 && dst_type_max != qmax) {
    throw_not_supported(kDynamicQuantOp, ": not supported by the CPU twin: dst_type_max=", dst_type_max, " (only 0 or ", qmax,
                        ", the ", out, " maximum)");
  }
  AAR_CHECK_ARG(input.dim() >= 2, kDynamicQuantOp, ": input must have at least 2 dims, got ", input.sizes());
  AAR_CHECK_ARG(is_float_dtype(input.scalar_type()), kDynamicQuantOp, ": input must be float16/bfloat16/float32, got ",
                input.scalar_type());
  AAR_CHECK_ARG(input.device().is_cpu(), kDynamicQuantOp, ": the CPU twin needs a CPU input, got ", input.device());
  const at::Tensor x = input.to(at::kFloat);
  const at::Tensor scale = x.abs().amax(-1, /*keepdim=*/true).div_(static_cast<float>(qmax));
  const at::Tensor safe = at::where(scale.eq(0), at::ones_like(scale), scale);  // zero rows: q = 0 / 1 = 0
  at::Tensor y = x / safe;
  at::Tensor q = out == at::kChar ? y.round_().clamp_(-qmax, qmax).to(at::kChar)
                                  : y.clamp_(-qmax, qmax).to(at::kFloat8_e4m3fn);
  return {q, scale.squeeze(-1)};
}

}  // namespace
}  // namespace aar::ops::cpu

TORCH_LIBRARY_IMPL(ascend_cpu, CPU, m) {
  m.impl("npu_dynamic_quant", TORCH_FN(aar::ops::cpu::dynamic_quant));
}
