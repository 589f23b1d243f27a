// Typed wrapper for torch_npu's npu_attention_update (namespace `npu` on the NPU).
#include "ascend_attn_rt/ops/attention_update.h"

#include "attention_update_check.h"
#include "op_handle.h"
#include "op_signatures.h"

namespace aar::ops {

namespace {
detail::OpHandle<sig::AttentionUpdate> g_attn_update("npu_attention_update", "", OpLibrary::TorchNpu);

std::tuple<at::Tensor, at::Tensor> call_attention_update(at::TensorList lse, at::TensorList local_out,
                                                         int64_t update_type, Provider pv) {
  const Provider p = detail::pick_provider(pv, lse[0]);
  const auto& op = g_attn_update.get(p);
  detail::DispatchGuard guard(p);
  return op.call(lse, local_out, update_type);
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> attention_update(at::TensorList lse, at::TensorList local_out,
                                                    int64_t update_type, Provider pv) {
  detail::check_attention_update_args(lse, local_out, update_type, "attention_update");
  return call_attention_update(lse, local_out, update_type, pv);
}

namespace detail {

std::tuple<at::Tensor, at::Tensor> attention_update_prechecked(at::TensorList lse, at::TensorList local_out,
                                                               int64_t update_type) {
  return call_attention_update(lse, local_out, update_type, Provider::Auto);
}

}  // namespace detail

}  // namespace aar::ops
