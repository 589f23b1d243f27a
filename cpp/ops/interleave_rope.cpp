// Typed wrapper for torch_npu's npu_interleave_rope (namespace `npu` on the NPU).
#include "ascend_attn_rt/ops/interleave_rope.h"

#include "op_handle.h"
#include "op_signatures.h"

namespace aar::ops {

namespace {
detail::OpHandle<sig::InterleaveRope> g_interleave_rope("npu_interleave_rope", "", OpLibrary::TorchNpu);
}  // namespace

at::Tensor interleave_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, Provider pv) {
  const Provider p = detail::pick_provider(pv, x);
  const auto& op = g_interleave_rope.get(p);
  detail::DispatchGuard guard(p);
  return op.call(x, cos, sin);
}

}  // namespace aar::ops
