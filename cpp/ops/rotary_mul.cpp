// Typed wrapper for torch_npu's npu_rotary_mul (namespace `npu` on the NPU).
#include "ascend_attn_rt/ops/rotary_mul.h"

#include "op_handle.h"
#include "op_signatures.h"

namespace aar::ops {

namespace {
detail::OpHandle<sig::RotaryMul> g_rotary_mul("npu_rotary_mul", "", OpLibrary::TorchNpu);
}  // namespace

at::Tensor rotary_mul(const at::Tensor& x, const at::Tensor& r1, const at::Tensor& r2, c10::string_view rotary_mode,
                      Provider pv) {
  const Provider p = detail::pick_provider(pv, x);
  const auto& op = g_rotary_mul.get(p);
  detail::DispatchGuard guard(p);
  return op.call(x, r1, r2, rotary_mode, detail::none_tensor());
}

}  // namespace aar::ops
