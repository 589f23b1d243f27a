// Python facade of the DeepSeek-V4 (DSA) plan layer (include/ascend_attn_rt/
// dsa/kv_plan.h, backend_facts.h): the per-configuration AttnKvPlan, the
// backend descriptors and the cache specs. No logic beyond argument conversion.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <string>
#include <vector>

#include "ascend_attn_rt/dsa/backend_facts.h"
#include "ascend_attn_rt/dsa/kv_plan.h"
#include "common.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace aar::bindings {
namespace {

dsa::KvDtype parse_kv_dtype(const std::string& s) {
  for (dsa::KvDtype d : {dsa::KvDtype::BF16, dsa::KvDtype::FP16, dsa::KvDtype::FP32, dsa::KvDtype::INT8,
                         dsa::KvDtype::FP8_E4M3}) {
    if (s == dsa::to_string(d)) return d;
  }
  if (s == "bf16") return dsa::KvDtype::BF16;
  if (s == "fp16" || s == "half") return dsa::KvDtype::FP16;
  throw_invalid("model_dtype must be 'bfloat16', 'float16', 'float32', 'int8' or 'float8_e4m3fn', got '", s, "'");
}

dsa::DsaBackendKind parse_backend(const std::string& s) {
  static const std::pair<const char*, dsa::DsaBackendKind> kNames[] = {
      {"generic", dsa::DsaBackendKind::Generic}, {"c4", dsa::DsaBackendKind::C4},
      {"c128", dsa::DsaBackendKind::C128},       {"swa", dsa::DsaBackendKind::Swa},
      {"c4_state", dsa::DsaBackendKind::C4State}, {"c128_state", dsa::DsaBackendKind::C128State}};
  for (const auto& [n, k] : kNames) {
    if (s == n) return k;
  }
  throw_invalid("backend must be 'generic', 'c4', 'c128', 'swa', 'c4_state' or 'c128_state', got '", s, "'");
}

constexpr std::pair<const char*, dsa::DsaCacheKind> kCacheKinds[] = {
    {"swa", dsa::DsaCacheKind::Swa},
    {"c4_kv", dsa::DsaCacheKind::C4Kv},
    {"c128_kv", dsa::DsaCacheKind::C128Kv},
    {"c4_indexer_k", dsa::DsaCacheKind::C4IndexerK},
    {"c4_attn_state", dsa::DsaCacheKind::C4AttnState},
    {"c4_indexer_state", dsa::DsaCacheKind::C4IndexerState},
    {"c128_state", dsa::DsaCacheKind::C128State}};

dsa::DsaCacheKind parse_cache_kind(const std::string& s) {
  for (const auto& [n, k] : kCacheKinds) {
    if (s == n) return k;
  }
  throw_invalid("kind must be 'swa', 'c4_kv', 'c128_kv', 'c4_indexer_k', 'c4_attn_state', 'c4_indexer_state' or "
                "'c128_state', got '", s, "'");
}

nb::dict plan_dict(const dsa::AttnKvPlan& p) {
  nb::dict d;
  d["device"] = dsa::device_name(p.device);
  d["attn_kv_dtype"] = dsa::to_string(p.attn_kv_dtype);
  d["attn_head_dim"] = p.attn_head_dim;
  d["attn_head_size"] = p.attn_head_size;
  d["attn_head_bytes"] = p.attn_head_bytes;
  d["kv_head_extra"] = p.kv_head_extra;
  d["fp8_kv_rows"] = p.fp8_kv_rows;
  d["indexer_k_dtype"] = dsa::to_string(p.indexer_k_dtype);
  d["indexer_k_scale_dtype"] = dsa::to_string(p.indexer_k_scale_dtype);
  d["indexer_q_dtype"] = dsa::to_string(p.indexer_q_dtype);
  d["indexer_q_scale_dtype"] = dsa::to_string(p.indexer_q_scale_dtype);
  d["li_weights_dtype"] = dsa::to_string(p.li_weights_dtype);
  d["li_k_scale_dtype"] = dsa::to_string(p.li_k_scale_dtype);
  d["indexer_k_write"] = dsa::to_string(p.indexer_k_write);
  d["indexer_slot_format"] = dsa::to_string(p.indexer_slot_format);
  d["indexer_full_view"] = p.indexer_full_view;
  d["sparse_attn"] = dsa::to_string(p.sparse_attn);
  d["uses_sparse_flash_mla"] = p.uses_sparse_flash_mla;
  d["sparse_attn_op"] = p.sparse_attn_op;
  d["sparse_attn_metadata_op"] = p.sparse_attn_metadata_op;
  d["sparse_attn_op_library"] = p.sparse_attn_op_library;
  d["layout_kv"] = dsa::to_string(p.layout_kv);
  d["passes_kv_quant_kwargs"] = p.passes_kv_quant_kwargs;
  d["kv_quant_mode"] = p.kv_quant_mode;
  d["tile_size"] = p.tile_size;
  d["rope_head_dim"] = p.rope_head_dim;
  d["passes_device_kwarg"] = p.passes_device_kwarg;
  d["passes_cu_seqlens_kv_extras"] = p.passes_cu_seqlens_kv_extras;
  d["renames_seqused_for_flash_mla"] = p.renames_seqused_for_flash_mla;
  d["decode_cu_seqlens_ori_kv"] = dsa::to_string(p.decode_cu_seqlens_ori_kv);
  d["decode_cu_seqlens_cmp_kv"] = dsa::to_string(p.decode_cu_seqlens_cmp_kv);
  d["prefill_cu_seqlens_ori_kv"] = dsa::to_string(p.prefill_cu_seqlens_ori_kv);
  d["prefill_cu_seqlens_cmp_kv"] = dsa::to_string(p.prefill_cu_seqlens_cmp_kv);
  d["slot_format"] = dsa::to_string(p.slot_format);
  d["requires_block_offset_slots"] = p.requires_block_offset_slots;
  d["compressor_slot_format_code"] = p.compressor_slot_format_code;
  d["slot_mapping_columns"] = p.slot_mapping_columns;
  d["kv_scatter"] = dsa::to_string(p.kv_scatter);
  d["epilog_quant_group_size"] = p.epilog_quant_group_size;
  d["epilog_quant_mode"] = p.epilog_quant_mode;
  d["epilog_round_scale"] = p.epilog_round_scale;
  d["epilog_layout"] = p.epilog_layout;
  d["q_norm"] = dsa::to_string(p.q_norm);
  d["compressor_weights_unquantised"] = p.compressor_weights_unquantised;
  d["o_proj"] = dsa::to_string(p.o_proj);
  return d;
}

dsa::AttnKvPlan plan_from(const std::string& device_kind, const std::optional<std::string>& cache_dtype,
                          const std::string& model_dtype) {
  dsa::DsaConfig c;
  c.device = parse_device_kind(device_kind);
  c.cache_dtype = cache_dtype;
  c.model_dtype = parse_kv_dtype(model_dtype);
  return dsa::make_attn_kv_plan(c);
}

void bind_dsa(nb::module_& root) {
  nb::module_ m = root.def_submodule(
      "dsa", "DeepSeek-V4 (DSA) plan layer: the per-configuration attention-KV plan, backend facts, cache specs");
  m.def(
      "resolve_attn_kv_dtype",
      [](const std::string& device_kind, const std::optional<std::string>& cache_dtype,
         const std::string& non_a5_dtype) {
        return std::string(dsa::to_string(dsa::resolve_attn_kv_dtype(parse_device_kind(device_kind), cache_dtype,
                                                                     parse_kv_dtype(non_a5_dtype))));
      },
      "device_kind"_a, "cache_dtype"_a = nb::none(), "non_a5_dtype"_a = "bfloat16",
      "Spec 7.2's attention KV dtype (a string); never mutates anything.");
  m.def(
      "make_attn_kv_plan",
      [](const std::string& device_kind, const std::optional<std::string>& cache_dtype,
         const std::string& model_dtype) { return plan_dict(plan_from(device_kind, cache_dtype, model_dtype)); },
      nb::kw_only(), "device_kind"_a = "a2", "cache_dtype"_a = nb::none(), "model_dtype"_a = "bfloat16",
      "Every per-device decision of the DSA backend (spec 7.1 / 7.2) as a dict (dsa/kv_plan.h: AttnKvPlan).");
  m.def(
      "backend",
      [](const std::string& kind, const std::string& device_kind) {
        const dsa::DsaBackendFacts f = dsa::dsa_backend(parse_backend(kind), parse_device_kind(device_kind));
        nb::dict d;
        d["name"] = f.name;
        const auto bs = f.kernel_block_sizes();
        d["kernel_block_sizes"] = std::vector<int32_t>(bs.begin(), bs.end());
        return d;
      },
      "kind"_a, "device_kind"_a = "a2",
      "A DSA backend descriptor (spec 6.1): kind 'generic', 'c4', 'c128', 'swa', 'c4_state' or 'c128_state'.");
  m.def(
      "cache_spec",
      [](const std::string& kind, int64_t cache_block_size, const std::string& device_kind,
         const std::optional<std::string>& cache_dtype, const std::string& model_dtype, int64_t num_blocks) {
        const dsa::AttnKvPlan p = plan_from(device_kind, cache_dtype, model_dtype);
        const dsa::DsaCacheSpec s = dsa::dsa_cache_spec(parse_cache_kind(kind), cache_block_size, p);
        nb::dict d;
        d["kind"] = kind;
        d["backend"] = s.backend;
        d["cache_block_size"] = s.cache_block_size;
        d["compress_ratio"] = s.compress_ratio;
        d["coff"] = s.coff;
        d["block_size"] = s.block_size;
        d["storage_block_size"] = s.storage_block_size;
        d["num_kv_heads"] = s.num_kv_heads;
        d["head_size"] = s.head_size;
        d["dtype"] = dsa::to_string(s.dtype);
        d["scale_dim"] = s.scale_dim;
        d["scale_dtype"] = dsa::to_string(s.scale_dtype);
        d["page_bytes"] = s.page_bytes;
        d["pad_tier"] = s.pad_tier;
        d["padded_page_bytes"] = s.padded_page_bytes;
        d["slot_format"] = dsa::to_string(dsa::slot_format_for(p, s.kind));
        d["shape"] = dsa::dsa_kv_cache_shape(s, num_blocks);
        if (s.scale_dim > 0) d["scale_shape"] = dsa::dsa_scale_cache_shape(s, num_blocks);
        return d;
      },
      "kind"_a, "cache_block_size"_a = 128, nb::kw_only(), "device_kind"_a = "a2", "cache_dtype"_a = nb::none(),
      "model_dtype"_a = "bfloat16", "num_blocks"_a = 1,
      "A DSA cache's spec (6.2) under the plan of (device_kind, cache_dtype, model_dtype): kind 'swa', 'c4_kv', ... "
      "'c128_kv', 'c4_indexer_k', 'c4_attn_state', 'c4_indexer_state', 'c128_state', its block geometry, dtypes, page bytes and tier, and its shape for "
      "num_blocks.");
}

const BindingRegistrar kRegisterDsa(/*order=*/50, &bind_dsa);
}  // namespace
}  // namespace aar::bindings
