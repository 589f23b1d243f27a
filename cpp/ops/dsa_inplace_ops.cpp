// Typed wrappers for the in-place DeepSeek-V4 (DSA) helpers of vllm-ascend's _C_ascend
// (issue 12): npu_scatter_nd_update_v2 and inplace_partial_rotary_mul. Validation is the provider's.
#include "ascend_attn_rt/ops/dsa_inplace_ops.h"

#include "op_handle.h"
#include "op_signatures.h"

namespace aar::ops {

namespace {

detail::OpHandle<sig::ScatterNdUpdateV2> g_scatter_v2("npu_scatter_nd_update_v2", "", OpLibrary::VllmAscend);
detail::OpHandle<sig::InplacePartialRotaryMul> g_partial_rope("inplace_partial_rotary_mul", "",
                                                              OpLibrary::VllmAscend);

}  // namespace

void scatter_nd_update_v2(at::Tensor& var, const at::Tensor& indices, const at::Tensor& update, Provider pv) {
  const Provider p = detail::pick_provider(pv, var);
  const auto& op = g_scatter_v2.get(p);
  detail::DispatchGuard guard(p);
  op.call(var, indices, update);
}

void inplace_partial_rotary_mul(at::Tensor& x, const at::Tensor& r1, const at::Tensor& r2,
                                c10::string_view rotary_mode, c10::IntArrayRef partial_slice, Provider pv) {
  const Provider p = detail::pick_provider(pv, x);
  const auto& op = g_partial_rope.get(p);
  detail::DispatchGuard guard(p);
  op.call(x, r1, r2, rotary_mode, partial_slice);
}

}  // namespace aar::ops
