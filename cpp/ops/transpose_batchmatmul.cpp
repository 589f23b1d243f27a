// Typed wrapper for torch_npu's npu_transpose_batchmatmul (namespace `npu` on the NPU).
#include "ascend_attn_rt/ops/transpose_batchmatmul.h"

#include "op_handle.h"
#include "op_signatures.h"

namespace aar::ops {

namespace {
detail::OpHandle<sig::TransposeBatchMatmul> g_tbmm("npu_transpose_batchmatmul", "", OpLibrary::TorchNpu);

at::OptionalIntArrayRef opt_list(const std::optional<c10::IntArrayRef>& v) {
  if (!v.has_value()) return std::nullopt;
  return at::OptionalIntArrayRef(*v);
}
}  // namespace

at::Tensor transpose_batchmatmul(const at::Tensor& input, const at::Tensor& weight,
                                 std::optional<c10::IntArrayRef> perm_x1, std::optional<c10::IntArrayRef> perm_x2,
                                 std::optional<c10::IntArrayRef> perm_y, Provider pv) {
  const Provider p = detail::pick_provider(pv, input);
  const auto& op = g_tbmm.get(p);
  const auto& none = detail::none_tensor();
  detail::DispatchGuard guard(p);
  return op.call(input, weight, none, none, opt_list(perm_x1), opt_list(perm_x2), opt_list(perm_y), int64_t{1});
}

}  // namespace aar::ops
