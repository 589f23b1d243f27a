// Typed wrappers for torch_npu's npu_dynamic_mx_quant and
// npu_transpose_quant_batchmatmul (ops/mx_quant.h).
#include "ascend_attn_rt/ops/mx_quant.h"

#include "op_handle.h"
#include "op_signatures_mx.h"

namespace aar::ops {

namespace {
detail::OpHandle<sig::DynamicMxQuant> g_dyn_mx_quant("npu_dynamic_mx_quant", "", OpLibrary::TorchNpu);
detail::OpHandle<sig::TransposeQuantBatchMatmul> g_tqbmm("npu_transpose_quant_batchmatmul", "",
                                                         OpLibrary::TorchNpu);
}  // namespace

std::tuple<at::Tensor, at::Tensor> dynamic_mx_quant(const DynamicMxQuantArgs& a, Provider pv) {
  const Provider p = detail::pick_provider(pv, a.input);
  const auto& op = g_dyn_mx_quant.get(p);
  detail::DispatchGuard guard(p);
  return op.call(a.input, a.axis, a.round_mode, a.dst_type, a.block_size, a.scale_alg, a.dst_type_max,
                 a.max_low_bound);
}

at::Tensor transpose_quant_batchmatmul(const TransposeQuantBatchMatmulArgs& a, Provider pv) {
  const Provider p = detail::pick_provider(pv, a.x1);
  const auto& op = g_tqbmm.get(p);
  detail::DispatchGuard guard(p);
  return op.call(a.x1, a.x2, a.dtype, a.bias, a.x1_scale, a.x2_scale, a.group_sizes, a.perm_x1, a.perm_x2, a.perm_y,
                 a.batch_split_factor, a.x1_dtype, a.x2_dtype);
}

}  // namespace aar::ops
