// CPU twin of npu_dynamic_block_quant: per (row_block_size x col_block_size)
// tile of x, scale = amax(|x|) / QMAX and y = x / scale converted to the
// destination type, in fp32; returns (y of x's shape, scale fp32 of shape
// x.shape[:-1] + (ceil(cols / col_block_size),)) — one scale per row and column
// tile, the last tile possibly partial (the wheel's example: x (3, 4) -> scale
// (3, 1)). An all-zero tile gives scale 0 and y 0. x is 2-D or 3-D.
// Destinations: dst_type 1 (int8: QMAX 127, y = rint(x / scale), half to even)
// and float8_e4m3fn (its ScalarType value 24, or torch_npu's code 292: QMAX 448,
// y = the e4m3 value nearest x / scale, ties to even, |y| <= 448) - the packed
// SFA C8 rows of A5 (docs/design/sfa.md §5). torch_npu 2.14's doc lists dst_type
// 1 only (A2/A3); the fp8 form is the same rule with e4m3's bound, as the A5
// rows' layout (same byte order, fp8 reinterpretation) and the fp8 LI C8 keys
// (npu_dynamic_quant, amax / 448) use it.
// Implemented: row_block_size 1, col_block_size 128, min_scale 0, round_mode
// "rint", dst_type_max 0 (or the destination's QMAX); other values are
// rejected by name (the wheel documents the same as the device's only
// supported values, except min_scale, whose exact use it does not define).
#include <torch/library.h>

#include "../op_signatures.h"
#include "attention_reference.h"

namespace aar::ops::cpu {
namespace {

constexpr const char* kDynamicBlockQuantOp = "npu_dynamic_block_quant";

std::tuple<at::Tensor, at::Tensor> dynamic_block_quant(AAR_DYNAMIC_BLOCK_QUANT_PARAMS) {
  reject_int(kDynamicBlockQuantOp, row_block_size, 1, "row_block_size");
  reject_int(kDynamicBlockQuantOp, col_block_size, 128, "col_block_size");
  constexpr int64_t kE4m3Scalar = static_cast<int64_t>(at::kFloat8_e4m3fn), kE4m3Npu = 292;
  const bool fp8 = dst_type == kE4m3Scalar || dst_type == kE4m3Npu;
  if (dst_type != 1 && !fp8) {
    throw_not_supported(kDynamicBlockQuantOp, ": not supported by the CPU twin: dst_type=", dst_type,
                        " (only 1, int8, and float8_e4m3fn, ", kE4m3Scalar, " or ", kE4m3Npu, ")");
  }
  const double qmax = fp8 ? 448.0 : 127.0;
  if (min_scale != 0.0) {
    throw_not_supported(kDynamicBlockQuantOp, ": not supported by the CPU twin: min_scale=", min_scale, " (only 0)");
  }
  if (round_mode != "rint") {
    throw_not_supported(kDynamicBlockQuantOp, ": not supported: round_mode=\"", round_mode, "\" (only \"rint\")");
  }
  if (dst_type_max != 0.0 && dst_type_max != qmax) {
    throw_not_supported(kDynamicBlockQuantOp, ": not supported by the CPU twin: dst_type_max=", dst_type_max, " (only 0 or ",
                        qmax, " for dst_type ", dst_type, ")");
  }
  AAR_CHECK_ARG(x.dim() == 2 || x.dim() == 3, kDynamicBlockQuantOp, ": x must be 2-D or 3-D, got ", x.sizes());
  AAR_CHECK_ARG(is_float_dtype(x.scalar_type()), kDynamicBlockQuantOp, ": x must be float16/bfloat16/float32, got ", x.scalar_type());
  AAR_CHECK_ARG(x.device().is_cpu(), kDynamicBlockQuantOp, ": the CPU twin needs a CPU x, got ", x.device());
  const int64_t cols = x.size(-1);
  const int64_t tiles = (cols + col_block_size - 1) / col_block_size;
  const int64_t padded = tiles * col_block_size;
  std::vector<int64_t> tiled(x.sizes().begin(), x.sizes().end() - 1);
  tiled.push_back(tiles);
  tiled.push_back(col_block_size);
  at::Tensor xf = x.to(at::kFloat);
  if (padded != cols) xf = at::constant_pad_nd(xf, {0, padded - cols}, 0.0);  // zeros do not change amax
  xf = xf.reshape(tiled);
  const at::Tensor scale = xf.abs().amax(-1, /*keepdim=*/true).div_(static_cast<float>(qmax));
  const at::Tensor safe = at::where(scale.eq(0), at::ones_like(scale), scale);
  at::Tensor y = (xf / safe);
  // fp8: clamp first (the fp32 quotient may exceed 448 by a rounding), then the RNE conversion.
  y = fp8 ? y.clamp_(-qmax, qmax).to(at::kFloat8_e4m3fn) : y.round_().clamp_(-qmax, qmax).to(at::kChar);
  y = y.flatten(-2).narrow(-1, 0, cols);
  return {y.contiguous(), scale.squeeze(-1)};
}

}  // namespace
}  // namespace aar::ops::cpu

TORCH_LIBRARY_IMPL(ascend_cpu, CPU, m) {
  m.impl("npu_dynamic_block_quant", TORCH_FN(aar::ops::cpu::dynamic_block_quant));
}
