// Typed wrappers of vllm-ascend's DSA compressor operators (issue 12): one
// dispatcher handle per operator, namespace `_C_ascend` on the NPU,
// `ascend_cpu_va` / `ascend_noop_va` here. Semantics and the decisions taken
// where upstream is silent: include/ascend_attn_rt/ops/dsa_compressor.h.
#include "ascend_attn_rt/ops/dsa_compressor.h"

#include "op_handle.h"
#include "op_signatures.h"

namespace aar::ops {

namespace {

detail::OpHandle<sig::Compressor> g_compressor("compressor", "", OpLibrary::VllmAscend);
detail::OpHandle<sig::CompressorMetadata> g_metadata("compressor_metadata", "", OpLibrary::VllmAscend);
detail::OpHandle<sig::CompressorMetadataOut> g_metadata_out("compressor_metadata_out", "", OpLibrary::VllmAscend);
detail::OpHandle<sig::KvCompressEpilog> g_kv_epilog("kv_compress_epilog", "", OpLibrary::VllmAscend);
detail::OpHandle<sig::IndexerCompressEpilogV2> g_indexer_epilog("indexer_compress_epilog_v2", "",
                                                                 OpLibrary::VllmAscend);

int64_t format_value(CompressedSlotFormat f) {
  const auto v = static_cast<int64_t>(f);
  AAR_CHECK_ARG(v == 1 || v == 2, "compressor_metadata: slot_mapping_format=", v,
                " (1: CompressedSlotFormat::Flat, 2: CompressedSlotFormat::BlockOffset)");
  return v;
}

}  // namespace

at::Tensor compressor(const CompressorArgs& a, Provider pv) {
  const Provider p = detail::pick_provider(pv, a.x);
  const auto& op = g_compressor.get(p);
  detail::DispatchGuard guard(p);
  // The schema marks state_cache mutable; the handle takes it by reference.
  at::Tensor state = a.state_cache;
  return op.call(a.x, a.wkv, a.wgate, state, a.ape, a.norm_weight, a.rope_sin, a.rope_cos, a.state_block_table,
                 a.cu_seqlens, a.seqused, a.start_pos, a.rope_head_dim, a.cmp_ratio, a.coff, a.norm_eps,
                 a.rotary_mode, a.cache_mode);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> compressor_metadata(const CompressorMetadataArgs& a,
                                                                   int64_t num_compressed_tokens, Provider pv) {
  const int64_t fmt = format_value(a.slot_mapping_format);
  const Provider p = detail::pick_provider(pv, a.rope_cos);
  const auto& op = g_metadata.get(p);
  detail::DispatchGuard guard(p);
  return op.call(a.rope_cos, a.rope_sin, a.cu_seqlens, a.start_pos, a.kv_block_table, a.kv_block_size, fmt,
                 a.compress_ratio, num_compressed_tokens, a.num_reqs_actual);
}

void compressor_metadata_out(const CompressorMetadataArgs& a, at::Tensor& compress_cos, at::Tensor& compress_sin,
                             at::Tensor& slot_mapping, Provider pv) {
  const int64_t fmt = format_value(a.slot_mapping_format);
  const Provider p = detail::pick_provider(pv, a.rope_cos);
  const auto& op = g_metadata_out.get(p);
  detail::DispatchGuard guard(p);
  op.call(a.rope_cos, a.rope_sin, a.cu_seqlens, a.start_pos, a.kv_block_table, a.kv_block_size, fmt,
          a.compress_ratio, a.num_reqs_actual, compress_cos, compress_sin, slot_mapping);
}

void kv_compress_epilog(const KvCompressEpilogArgs& a, Provider pv) {
  const Provider p = detail::pick_provider(pv, a.kv_compress_cache);
  const auto& op = g_kv_epilog.get(p);
  detail::DispatchGuard guard(p);
  at::Tensor cache = a.kv_compress_cache;
  op.call(cache, a.x, a.slot_mapping, a.quant_group_size, a.quant_mode, a.round_scale_flag, a.layout);
}

void indexer_compress_epilog_v2(const IndexerCompressEpilogArgs& a, Provider pv) {
  const Provider p = detail::pick_provider(pv, a.indexer_compress_cache);
  const auto& op = g_indexer_epilog.get(p);
  detail::DispatchGuard guard(p);
  at::Tensor cache = a.indexer_compress_cache;
  op.call(cache, a.x, a.slot_mapping, a.layout);
}

}  // namespace aar::ops
