// CPU twin of torch_npu's npu_transpose_quant_batchmatmul (ops/mx_quant.h), MX
// mode: x1 (m, b, k) and x2 (b, k, n) / (b, n, k) float8_e4m3fn decoded with
// their e8m0 scales (one per 32 k-values, paired in a trailing dim of 2),
// multiplied per batch in float32 and returned as (m, b, n) in `dtype`. The
// products of two decoded values are exact in float32; the sums are float32
// (the device's accumulation order is not known, so the last bits may differ).
// Checked as the doc states them: perm_x1 = perm_y = (1, 0, 2), perm_x2 (0, 1,
// 2) or (0, 2, 1), k a multiple of 64, the scale shapes, group_sizes one of
// (0|1, 0|1, 32) with the inferred 0s equal to 1. Refused by name: bias (the
// doc: not supported yet), float32 scales (the per-channel "K-C" mode),
// batch_split_factor other than 1, x1_dtype / x2_dtype naming another type.
#include <torch/library.h>

#include <vector>

#include "../op_signatures_mx.h"
#include "attention_reference.h"
#include "mx_codec.h"

namespace aar::ops::cpu {
namespace {

constexpr const char* kTransposeQuantBatchmatmulOp = "npu_transpose_quant_batchmatmul";
constexpr int64_t kGroupK = 32;

std::vector<int64_t> perm_of(at::OptionalIntArrayRef p, const char* name) {
  AAR_CHECK_ARG(p.has_value(), kTransposeQuantBatchmatmulOp, ": ", name, " must be given (the device supports only the listed orders)");
  return std::vector<int64_t>(p->begin(), p->end());
}

void check_type_arg(const std::optional<int64_t>& t, const char* name) {
  if (t.has_value() && *t != static_cast<int64_t>(at::kFloat8_e4m3fn)) {
    throw_not_supported(kTransposeQuantBatchmatmulOp, ": not supported by the CPU twin: ", name, "=", *t, " (only None or float8_e4m3fn = ",
                        static_cast<int64_t>(at::kFloat8_e4m3fn), ")");
  }
}

// (..., k / 64, 2) scales -> (..., k / 32) float32 along the last dim, each repeated 32 times -> (..., k).
at::Tensor expand_scales(const at::Tensor& s) {
  at::Tensor f = mx::e8m0_to_float(s.contiguous());
  f = f.flatten(-2);  // (..., k / 32), block j at [j / 2, j % 2]
  return f.repeat_interleave(kGroupK, -1);
}

at::Tensor transpose_quant_batchmatmul(AAR_TRANSPOSE_QUANT_BMM_PARAMS) {
  reject_tensor(kTransposeQuantBatchmatmulOp, bias, "bias");
  if (batch_split_factor.has_value() && *batch_split_factor != 1) {
    throw_not_supported(kTransposeQuantBatchmatmulOp, ": not supported by the CPU twin: batch_split_factor=", *batch_split_factor,
                        " (only 1)");
  }
  AAR_CHECK_ARG(dtype == static_cast<int64_t>(at::kBFloat16) || dtype == static_cast<int64_t>(at::kHalf), kTransposeQuantBatchmatmulOp,
                ": dtype=", dtype, " must be bfloat16 (", static_cast<int64_t>(at::kBFloat16), ") or float16 (",
                static_cast<int64_t>(at::kHalf), ")");
  AAR_CHECK_ARG(x1.defined() && x2.defined() && x1.device().is_cpu() && x2.device().is_cpu(), kTransposeQuantBatchmatmulOp,
                ": the CPU twin needs CPU tensors x1 and x2");
  AAR_CHECK_ARG(x1.dim() == 3 && x2.dim() == 3, kTransposeQuantBatchmatmulOp, ": x1 and x2 must be 3-D, got ", x1.sizes(), " and ",
                x2.sizes());
  AAR_CHECK_ARG(x1_scale.has_value() && x1_scale->defined() && x2_scale.has_value() && x2_scale->defined(), kTransposeQuantBatchmatmulOp,
                ": x1_scale and x2_scale must both be given");
  const at::ScalarType s1t = x1_scale->scalar_type(), s2t = x2_scale->scalar_type();
  if (s1t == at::kFloat || s2t == at::kFloat) {
    throw_not_supported(kTransposeQuantBatchmatmulOp, ": not supported by the CPU twin: float32 x1_scale / x2_scale (the per-channel K-C "
                        "mode); only the MX mode (float8_e8m0fnu scales)");
  }
  AAR_CHECK_ARG(s1t == at::kFloat8_e8m0fnu && s2t == at::kFloat8_e8m0fnu, kTransposeQuantBatchmatmulOp,
                ": x1_scale and x2_scale must be float8_e8m0fnu (view npu_dynamic_mx_quant's uint8 scales as "
                "float8_e8m0fnu), got ", s1t, " and ", s2t);
  AAR_CHECK_ARG(x1.scalar_type() == at::kFloat8_e4m3fn && x2.scalar_type() == at::kFloat8_e4m3fn, kTransposeQuantBatchmatmulOp,
                ": MX mode needs float8_e4m3fn x1 and x2, got ", x1.scalar_type(), " and ", x2.scalar_type());
  check_type_arg(x1_dtype, "x1_dtype");
  check_type_arg(x2_dtype, "x2_dtype");
  const std::vector<int64_t> p1 = perm_of(perm_x1, "perm_x1"), p2 = perm_of(perm_x2, "perm_x2"),
                             py = perm_of(perm_y, "perm_y");
  const std::vector<int64_t> k102{1, 0, 2}, k012{0, 1, 2}, k021{0, 2, 1};
  AAR_CHECK_ARG(p1 == k102, kTransposeQuantBatchmatmulOp, ": perm_x1=", c10::IntArrayRef(p1), " is not supported (only [1, 0, 2])");
  AAR_CHECK_ARG(py == k102, kTransposeQuantBatchmatmulOp, ": perm_y=", c10::IntArrayRef(py), " is not supported (only [1, 0, 2])");
  AAR_CHECK_ARG(p2 == k012 || p2 == k021, kTransposeQuantBatchmatmulOp, ": perm_x2=", c10::IntArrayRef(p2),
                " is not supported (only [0, 1, 2] or [0, 2, 1])");
  const bool x2_kn = p2 == k012;
  const int64_t m = x1.size(0), b = x1.size(1), k = x1.size(2);
  const int64_t n = x2_kn ? x2.size(2) : x2.size(1);
  AAR_CHECK_ARG(x2.size(0) == b && (x2_kn ? x2.size(1) : x2.size(2)) == k, kTransposeQuantBatchmatmulOp, ": x2 ", x2.sizes(),
                " must be (b, k, n) for perm_x2 [0, 1, 2] or (b, n, k) for [0, 2, 1], with x1 (m, b, k) = ",
                x1.sizes());
  AAR_CHECK_ARG(k > 0 && k % 64 == 0, kTransposeQuantBatchmatmulOp, ": k=", k, " must be a positive multiple of 64 in MX mode");
  const std::vector<int64_t> want1{m, b, k / 64, 2};
  const std::vector<int64_t> want2 = x2_kn ? std::vector<int64_t>{b, k / 64, n, 2} : std::vector<int64_t>{b, n, k / 64, 2};
  AAR_CHECK_ARG(x1_scale->sizes() == c10::IntArrayRef(want1), kTransposeQuantBatchmatmulOp, ": x1_scale must be (m, b, k / 64, 2) = ",
                c10::IntArrayRef(want1), ", got ", x1_scale->sizes());
  AAR_CHECK_ARG(x2_scale->sizes() == c10::IntArrayRef(want2), kTransposeQuantBatchmatmulOp, ": x2_scale must be ",
                x2_kn ? "(b, k / 64, n, 2) = " : "(b, n, k / 64, 2) = ", c10::IntArrayRef(want2), ", got ",
                x2_scale->sizes());
  AAR_CHECK_ARG(group_sizes.has_value(), kTransposeQuantBatchmatmulOp, ": group_sizes must be given in MX mode ([0|1, 0|1, 32])");
  const std::vector<int64_t> gs(group_sizes->begin(), group_sizes->end());
  AAR_CHECK_ARG(gs.size() == 3 && (gs[0] == 0 || gs[0] == 1) && (gs[1] == 0 || gs[1] == 1) && gs[2] == kGroupK, kTransposeQuantBatchmatmulOp,
                ": group_sizes=", c10::IntArrayRef(gs), " is not supported (only [0|1, 0|1, 32])");

  // Decode: x1 (m, b, k) * scales over k; x2 to (b, k, n) with its scales over k.
  const at::Tensor a = x1.to(at::kFloat) * expand_scales(*x1_scale);
  at::Tensor w;
  if (x2_kn) {
    const at::Tensor s = expand_scales(x2_scale->permute({0, 2, 1, 3}));  // (b, n, k)
    w = x2.to(at::kFloat) * s.transpose(1, 2);
  } else {
    w = (x2.to(at::kFloat) * expand_scales(*x2_scale)).transpose(1, 2);
  }
  const at::Tensor y = at::bmm(a.permute({1, 0, 2}), w);  // (b, m, n) float32
  return y.permute({1, 0, 2}).to(static_cast<at::ScalarType>(dtype)).contiguous();
}

}  // namespace
}  // namespace aar::ops::cpu

TORCH_LIBRARY_IMPL(ascend_cpu, CPU, m) {
  m.impl("npu_transpose_quant_batchmatmul", TORCH_FN(aar::ops::cpu::transpose_quant_batchmatmul));
}
