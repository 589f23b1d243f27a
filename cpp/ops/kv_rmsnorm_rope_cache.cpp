// Typed wrappers for torch_npu's npu_kv_rmsnorm_rope_cache (namespace `npu` on the NPU):
// the plain form and the one with the int8 latent's c_kv_scale.
#include "ascend_attn_rt/ops/kv_rmsnorm_rope_cache.h"

#include "op_handle.h"
#include "op_signatures.h"

namespace aar::ops {

namespace {
detail::OpHandle<sig::KvRmsnormRopeCache> g_kv_rmsnorm("npu_kv_rmsnorm_rope_cache", "", OpLibrary::TorchNpu);
}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> kv_rmsnorm_rope_cache(
    const at::Tensor& kv, const at::Tensor& gamma, const at::Tensor& cos, const at::Tensor& sin,
    const at::Tensor& index, const at::Tensor& k_cache, const at::Tensor& ckv_cache, double epsilon,
    c10::string_view cache_mode, bool is_output_kv, Provider pv) {
  const Provider p = detail::pick_provider(pv, kv);
  const auto& op = g_kv_rmsnorm.get(p);
  const auto& none = detail::none_tensor();
  detail::DispatchGuard guard(p);
  return op.call(kv, gamma, cos, sin, index, k_cache, ckv_cache, none, none, none, none, none, epsilon, cache_mode,
                 is_output_kv);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> kv_rmsnorm_rope_cache(
    const at::Tensor& kv, const at::Tensor& gamma, const at::Tensor& cos, const at::Tensor& sin,
    const at::Tensor& index, const at::Tensor& k_cache, const at::Tensor& ckv_cache, double epsilon,
    c10::string_view cache_mode, bool is_output_kv, const std::optional<at::Tensor>& c_kv_scale, Provider pv) {
  const Provider p = detail::pick_provider(pv, kv);
  const auto& op = g_kv_rmsnorm.get(p);
  const auto& none = detail::none_tensor();
  detail::DispatchGuard guard(p);
  return op.call(kv, gamma, cos, sin, index, k_cache, ckv_cache, none, c_kv_scale, none, none, none, epsilon,
                 cache_mode, is_output_kv);
}

}  // namespace aar::ops
