// Typed wrappers for the paged KV-cache writes: npu_scatter_pa_kv_cache (aclnn,
// namespace `npu`) and _npu_reshape_and_cache (ATB, namespace `atb`).
#include "ascend_attn_rt/ops/kv_cache_write.h"

#include "op_handle.h"
#include "op_signatures.h"

namespace aar::ops {

namespace {
detail::OpHandle<sig::ScatterPaKvCache> g_scatter("npu_scatter_pa_kv_cache", "", OpLibrary::TorchNpu);
detail::OpHandle<sig::ReshapeAndCache> g_reshape_and_cache("_npu_reshape_and_cache", "", OpLibrary::Atb);
}  // namespace

void scatter_pa_kv_cache(const at::Tensor& key, const at::Tensor& value, at::Tensor& key_cache,
                         at::Tensor& value_cache, const at::Tensor& slot_mapping, c10::string_view cache_mode,
                         Provider pv) {
  const Provider prov = detail::pick_provider(pv, key);
  const auto& op = g_scatter.get(prov);
  const auto& none = detail::none_tensor();
  detail::DispatchGuard guard(prov);
  op.call(key, value, key_cache, value_cache, slot_mapping, none, none, none,
          std::optional<c10::string_view>(cache_mode));
}

void reshape_and_cache(const at::Tensor& key, const at::Tensor& value, at::Tensor& key_cache,
                       at::Tensor& value_cache, const at::Tensor& slot_indices, Provider pv) {
  const Provider prov = detail::pick_provider(pv, key);
  const auto& op = g_reshape_and_cache.get(prov);
  detail::DispatchGuard guard(prov);
  op.call(key, value, key_cache, value_cache, slot_indices);
}

}  // namespace aar::ops
