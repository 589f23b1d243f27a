// Typed wrappers for torch_npu's npu_scatter_nd_update_, npu_dynamic_quant,
// npu_dynamic_block_quant, npu_quantize and npu_quant_matmul, and vllm-ascend's
// npu_rms_norm_dynamic_quant.
#include "ascend_attn_rt/ops/quant.h"

#include <utility>

#include "op_handle.h"
#include "op_signatures.h"

namespace aar::ops {

namespace {
detail::OpHandle<sig::ScatterNdUpdate_> g_scatter_nd("npu_scatter_nd_update_", "", OpLibrary::TorchNpu);
detail::OpHandle<sig::DynamicQuant> g_dyn_quant("npu_dynamic_quant", "", OpLibrary::TorchNpu);
detail::OpHandle<sig::DynamicBlockQuant> g_dyn_block_quant("npu_dynamic_block_quant", "", OpLibrary::TorchNpu);
detail::OpHandle<sig::Quantize> g_quantize("npu_quantize", "", OpLibrary::TorchNpu);
detail::OpHandle<sig::QuantMatmul> g_quant_matmul("npu_quant_matmul", "", OpLibrary::TorchNpu);
detail::OpHandle<sig::RmsNormDynamicQuant> g_rms_dyn_quant("npu_rms_norm_dynamic_quant", "", OpLibrary::VllmAscend);
}  // namespace

at::Tensor& scatter_nd_update_(at::Tensor& self, const at::Tensor& indices, const at::Tensor& updates, Provider pv) {
  const Provider p = detail::pick_provider(pv, self);
  const auto& op = g_scatter_nd.get(p);
  detail::DispatchGuard guard(p);
  op.call(self, indices, updates);
  return self;
}

std::tuple<at::Tensor, at::Tensor> dynamic_quant(const DynamicQuantArgs& a, Provider pv) {
  const Provider p = detail::pick_provider(pv, a.input);
  const auto& op = g_dyn_quant.get(p);
  detail::DispatchGuard guard(p);
  return op.call(a.input, a.smooth_scales, a.group_index, a.dst_type, a.quant_mode, a.dst_type_max);
}

std::tuple<at::Tensor, at::Tensor> dynamic_block_quant(const at::Tensor& x, int64_t row_block_size,
                                                       int64_t col_block_size, int64_t dst_type, double min_scale,
                                                       c10::string_view round_mode, double dst_type_max,
                                                       Provider pv) {
  const Provider p = detail::pick_provider(pv, x);
  const auto& op = g_dyn_block_quant.get(p);
  detail::DispatchGuard guard(p);
  return op.call(x, min_scale, round_mode, dst_type, row_block_size, col_block_size, dst_type_max);
}

at::Tensor quantize(const at::Tensor& x, const at::Tensor& scales, const std::optional<at::Tensor>& zero_points,
                    int64_t dtype, int64_t axis, bool div_mode, Provider pv) {
  const Provider p = detail::pick_provider(pv, x);
  const auto& op = g_quantize.get(p);
  detail::DispatchGuard guard(p);
  return op.call(x, scales, zero_points, dtype, axis, div_mode);
}

at::Tensor quant_matmul(const QuantMatmulArgs& a, Provider pv) {
  const Provider p = detail::pick_provider(pv, a.x1);
  const auto& op = g_quant_matmul.get(p);
  const auto& none = detail::none_tensor();
  detail::DispatchGuard guard(p);
  return op.call(a.x1, a.x2, a.scale, a.offset, a.pertoken_scale, a.bias, a.output_dtype, std::nullopt, std::nullopt,
                 a.pertoken_scale_dtype, a.scale_dtype, a.group_sizes, none);
}

W8A8DynamicInput quantize_per_token(const at::Tensor& x, Provider pv) {
  DynamicQuantArgs q;
  q.input = x;
  auto [xq, s] = dynamic_quant(q, pv);
  return {std::move(xq), std::move(s)};
}

W8A8DynamicInput rms_norm_dynamic_quant(const RmsNormDynamicQuantArgs& a, Provider pv) {
  const Provider p = detail::pick_provider(pv, a.x);
  const auto& op = g_rms_dyn_quant.get(p);
  detail::DispatchGuard guard(p);
  auto [q, s] = op.call(a.x, a.gamma, a.smooth_scale, a.beta, a.epsilon);
  return {std::move(q), std::move(s)};
}

at::Tensor w8a8_dynamic_matmul(const W8A8DynamicInput& x, const at::Tensor& weight_t, const at::Tensor& scale,
                               at::ScalarType out_dtype, Provider pv) {
  QuantMatmulArgs a;
  a.x1 = x.q;
  a.x2 = weight_t;
  a.scale = scale;
  a.pertoken_scale = x.scale;
  a.output_dtype = static_cast<int64_t>(out_dtype);
  return quant_matmul(a, pv);
}

}  // namespace aar::ops
