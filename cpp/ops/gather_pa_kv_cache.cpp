// Typed wrapper for torch_npu's npu_gather_pa_kv_cache (namespace `npu` on the NPU).
#include "ascend_attn_rt/ops/gather_pa_kv_cache.h"

#include "op_handle.h"
#include "op_signatures.h"

namespace aar::ops {

namespace {
detail::OpHandle<sig::GatherPaKvCache> g_gather("npu_gather_pa_kv_cache", "", OpLibrary::TorchNpu);
}  // namespace

void gather_pa_kv_cache(const at::Tensor& key_cache, const at::Tensor& value_cache, const at::Tensor& block_tables,
                        const at::Tensor& seq_lens, at::Tensor& key, at::Tensor& value,
                        const std::optional<at::Tensor>& seq_offset, Provider pv) {
  const Provider p = detail::pick_provider(pv, key_cache);
  const auto& op = g_gather.get(p);
  detail::DispatchGuard guard(p);
  op.call(key_cache, value_cache, block_tables, seq_lens, key, value, seq_offset, false);
}

}  // namespace aar::ops
