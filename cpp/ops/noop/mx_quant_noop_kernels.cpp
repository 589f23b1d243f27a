// No-compute kernels of torch_npu's MX fp8 operators (ops/mx_quant.h):
// correctly shaped outputs from the per-thread cache (output_cache.h), no
// arithmetic. Registered for the CPU and the Meta dispatch keys.
#include <c10/util/SmallVector.h>
#include <torch/library.h>

#include <array>

#include "../op_signatures_mx.h"
#include "ascend_attn_rt/errors.h"
#include "output_cache.h"

namespace aar::ops::noop {
namespace {

// (y, mxscale) as the doc shapes them: fp8 targets keep the input's shape, the
// fp4 pairs (296 / 297) pack two values per uint8 on the last dim; the scales
// replace the quantised axis by ceil(n / block_size) rounded up to even / 2 and
// append 2.
std::tuple<at::Tensor, at::Tensor> dynamic_mx_quant(AAR_DYNAMIC_MX_QUANT_PARAMS) {
  const int64_t rank = input.dim();
  AAR_CHECK_ARG(rank >= 1 && axis >= -rank && axis < rank && block_size > 0,
                "ascend_noop npu_dynamic_mx_quant: input ", input.sizes(), ", axis ", axis, ", block_size ",
                block_size);
  const int64_t ax = axis < 0 ? axis + rank : axis;
  const bool fp4 = dst_type == 296 || dst_type == 297;
  c10::SmallVector<int64_t, 8> ys(input.sizes().begin(), input.sizes().end());
  c10::SmallVector<int64_t, 8> ss(ys);
  const int64_t blocks = (ys[ax] + block_size - 1) / block_size;
  ss[ax] = (blocks + 1) / 2;
  ss.push_back(2);
  at::ScalarType yt = at::kFloat8_e4m3fn;
  if (fp4) {
    ys.back() /= 2;
    yt = at::kByte;
  } else if (dst_type == static_cast<int64_t>(at::kFloat8_e5m2) || dst_type == 291) {
    yt = at::kFloat8_e5m2;
  }
  return {cached(ys, yt, input.device()), cached(ss, at::kByte, input.device())};
}

at::Tensor transpose_quant_batchmatmul(AAR_TRANSPOSE_QUANT_BMM_PARAMS) {
  AAR_CHECK_ARG(x1.dim() == 3 && x2.dim() == 3, "ascend_noop npu_transpose_quant_batchmatmul: 3-D inputs, got ",
                x1.sizes(), " and ", x2.sizes());
  AAR_CHECK_ARG(dtype == static_cast<int64_t>(at::kBFloat16) || dtype == static_cast<int64_t>(at::kHalf),
                "ascend_noop npu_transpose_quant_batchmatmul: dtype ", dtype, " is not bfloat16 / float16");
  const bool x2_nk = perm_x2.has_value() && perm_x2->size() == 3 && (*perm_x2)[1] == 2;
  const std::array<int64_t, 3> y{x1.size(0), x1.size(1), x2_nk ? x2.size(1) : x2.size(2)};
  return cached(y, static_cast<at::ScalarType>(dtype), x1.device());
}

void register_mx(torch::Library& m) {
  m.impl("npu_dynamic_mx_quant", TORCH_FN(dynamic_mx_quant));
  m.impl("npu_transpose_quant_batchmatmul", TORCH_FN(transpose_quant_batchmatmul));
}

}  // namespace
}  // namespace aar::ops::noop

TORCH_LIBRARY_IMPL(ascend_noop, CPU, m) { aar::ops::noop::register_mx(m); }
TORCH_LIBRARY_IMPL(ascend_noop, Meta, m) { aar::ops::noop::register_mx(m); }
