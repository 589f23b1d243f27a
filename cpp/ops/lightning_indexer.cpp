// Typed wrappers for the lightning indexer operators (issue 10): plain and quantised, from
// torch_npu (namespace `npu`) or from vllm-ascend (`_C_ascend`), whose schemas differ, and
// vllm-ascend's DSV4 quantised indexer with its metadata operator. Arguments a library's schema
// does not have are rejected here by name when set; everything else is the provider's to validate.
#include "ascend_attn_rt/ops/lightning_indexer.h"

#include "library_select.h"
#include "op_handle.h"
#include "op_signatures.h"

namespace aar::ops {

namespace {

constexpr int64_t kNoLimit = std::numeric_limits<int64_t>::max();

detail::OpHandle<sig::LightningIndexer> g_li_npu("npu_lightning_indexer", "", OpLibrary::TorchNpu);
detail::OpHandle<sig::LightningIndexer> g_li_va("npu_lightning_indexer", "", OpLibrary::VllmAscend);
detail::OpHandle<sig::QuantLightningIndexerNpu> g_qli_npu("npu_quant_lightning_indexer", "", OpLibrary::TorchNpu);
detail::OpHandle<sig::LightningIndexerQuantVa> g_qli_va("npu_lightning_indexer_quant", "", OpLibrary::VllmAscend);
detail::OpHandle<sig::VllmQuantLightningIndexer> g_vqli_va("npu_vllm_quant_lightning_indexer", "",
                                                        OpLibrary::VllmAscend);
detail::OpHandle<sig::VllmQuantLightningIndexerMetadata> g_vqli_md_va("npu_vllm_quant_lightning_indexer_metadata", "",
                                                                      OpLibrary::VllmAscend);

}  // namespace

std::tuple<at::Tensor, at::Tensor> lightning_indexer(const LightningIndexerArgs& a, OpLibrary lib, Provider pv) {
  const bool va = detail::is_vllm_ascend("lightning_indexer", lib);
  const Provider p = detail::pick_provider(pv, a.query);
  const auto& op = va ? g_li_va.get(p) : g_li_npu.get(p);
  detail::DispatchGuard guard(p);
  return op.call(a.query, a.key, a.weights, a.actual_seq_lengths_query, a.actual_seq_lengths_key, a.block_table,
                 a.layout_query, a.layout_key, a.sparse_count, a.sparse_mode, a.pre_tokens, a.next_tokens,
                 a.return_value);
}

at::Tensor quant_lightning_indexer(const QuantLightningIndexerArgs& a, OpLibrary lib, Provider pv) {
  constexpr const char* kWhat = "quant_lightning_indexer";
  const bool va = detail::is_vllm_ascend(kWhat, lib);
  const LightningIndexerArgs& b = a.base;
  if (b.return_value) {
    throw_not_supported(kWhat, ": return_value=true: the quantised indexer returns the indices only");
  }
  const Provider p = detail::pick_provider(pv, b.query);
  if (va) {
    detail::reject_for_va(kWhat, b.pre_tokens != kNoLimit, "pre_tokens", "npu_lightning_indexer_quant");
    detail::reject_for_va(kWhat, b.next_tokens != kNoLimit, "next_tokens", "npu_lightning_indexer_quant");
    detail::reject_for_va(kWhat, a.query_dtype.has_value(), "query_dtype", "npu_lightning_indexer_quant");
    detail::reject_for_va(kWhat, a.key_dtype.has_value(), "key_dtype", "npu_lightning_indexer_quant");
    const auto& op = g_qli_va.get(p);
    detail::DispatchGuard guard(p);
    return op.call(b.query, b.key, b.weights, a.query_dequant_scale, a.key_dequant_scale,
                   b.actual_seq_lengths_query, b.actual_seq_lengths_key, b.block_table, a.query_quant_mode,
                   a.key_quant_mode, b.layout_query, b.layout_key, b.sparse_count, b.sparse_mode);
  }
  const auto& op = g_qli_npu.get(p);
  detail::DispatchGuard guard(p);
  return op.call(b.query, b.key, b.weights, a.query_dequant_scale, a.key_dequant_scale, a.query_quant_mode,
                 a.key_quant_mode, b.actual_seq_lengths_query, b.actual_seq_lengths_key, b.block_table,
                 b.layout_query, b.layout_key, b.sparse_count, b.sparse_mode, b.pre_tokens, b.next_tokens,
                 a.query_dtype, a.key_dtype);
}

std::tuple<at::Tensor, at::Tensor> vllm_quant_lightning_indexer(const VllmQuantLightningIndexerArgs& v,
                                                                Provider pv) {
  constexpr const char* kWhat = "vllm_quant_lightning_indexer";
  const QuantLightningIndexerArgs& a = v.quant;
  const LightningIndexerArgs& b = a.base;
  detail::reject_for_va(kWhat, a.query_dtype.has_value(), "query_dtype", "npu_vllm_quant_lightning_indexer");
  detail::reject_for_va(kWhat, a.key_dtype.has_value(), "key_dtype", "npu_vllm_quant_lightning_indexer");
  const Provider p = detail::pick_provider(pv, b.query);
  const auto& op = g_vqli_va.get(p);
  detail::DispatchGuard guard(p);
  return op.call(b.query, b.key, b.weights, a.query_dequant_scale, a.key_dequant_scale, a.query_quant_mode,
                 a.key_quant_mode, b.actual_seq_lengths_query, b.actual_seq_lengths_key, b.block_table, v.metadata,
                 b.layout_query, b.layout_key, b.sparse_count, b.sparse_mode, b.pre_tokens, b.next_tokens,
                 v.cmp_ratio, b.return_value);
}

at::Tensor vllm_quant_lightning_indexer_metadata(const VllmQuantLightningIndexerMetadataArgs& a, Provider pv) {
  Provider p = pv;
  if (p == Provider::Auto) {
    const at::Tensor* first = nullptr;
    for (const auto* t : {&a.actual_seq_lengths_query, &a.actual_seq_lengths_key}) {
      if (first == nullptr && t->has_value() && (*t)->defined()) first = &**t;
    }
    if (first != nullptr) {
      p = resolve_provider(*first);
    } else if (provider_override() != Provider::Auto) {
      p = provider_override();
    } else {
      throw_invalid("vllm_quant_lightning_indexer_metadata: pv=Auto needs a device: give ",
                    "actual_seq_lengths_query or actual_seq_lengths_key, pass a Provider, or set the override");
    }
  }
  const auto& op = g_vqli_md_va.get(p);
  detail::DispatchGuard guard(p);
  return op.call(a.num_heads_q, a.num_heads_k, a.head_dim, a.query_quant_mode, a.key_quant_mode,
                 a.actual_seq_lengths_query, a.actual_seq_lengths_key, a.batch_size, a.max_seqlen_q, a.max_seqlen_k,
                 a.layout_query, a.layout_key, a.sparse_count, a.sparse_mode, a.pre_tokens, a.next_tokens,
                 a.cmp_ratio, a.device);
}

}  // namespace aar::ops
