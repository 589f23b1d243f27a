// Typed wrappers for ATB _npu_paged_attention and its workspace query
// (namespace `atb` on the NPU).
#include "ascend_attn_rt/ops/paged_attention.h"

#include "op_handle.h"
#include "op_signatures.h"

namespace aar::ops {

namespace {
detail::OpHandle<sig::PagedAttention> g_pa("_npu_paged_attention", "", OpLibrary::Atb);
detail::OpHandle<sig::PagedAttentionWs> g_pa_ws("_npu_paged_attention_get_workspace", "", OpLibrary::Atb);
}  // namespace

void paged_attention(const PagedAttentionArgs& a, at::Tensor& out, const std::optional<at::Tensor>& workspace,
                     Provider pv) {
  const Provider prov = detail::pick_provider(pv, a.query);
  const auto& op = g_pa.get(prov);
  detail::DispatchGuard guard(prov);
  op.call(a.query, a.key_cache, a.value_cache, a.num_kv_heads, a.num_heads, a.scale_value, a.block_table,
          a.context_lens, out, workspace);
}

at::Tensor paged_attention_get_workspace(const PagedAttentionArgs& a, at::Tensor& out, Provider pv) {
  const Provider prov = detail::pick_provider(pv, a.query);
  const auto& op = g_pa_ws.get(prov);
  detail::DispatchGuard guard(prov);
  return op.call(a.query, a.key_cache, a.value_cache, a.num_kv_heads, a.num_heads, a.scale_value, a.block_table,
                 a.context_lens, out);
}

}  // namespace aar::ops
