// Python facade of the DeepSeek-V4 (DSA) plan layer (include/ascend_attn_rt/
// dsa/plan/dsa_kv_plan.h, backend_facts.h): the per-configuration AttnKvPlan, the
// backend descriptors and the cache specs; and of the metadata builders
// (dsa/builder.h): aar.dsa.StepBuilder (once per step) and one
// aar.dsa.GroupBuilder per KV-cache group, mirroring the C++ API one to one.
// build() returns a metadata object per build (a copy carrying the build's
// stamp; its host lists raise once the builder has built again). No logic
// beyond argument conversion.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <string>
#include <vector>

#include "ascend_attn_rt/build_stamp.h"
#include "ascend_attn_rt/comm/comm.h"
#include "ascend_attn_rt/dsa/plan/dsa_backend_facts.h"
#include "ascend_attn_rt/dsa/builder.h"
#include "ascend_attn_rt/dsa/graph.h"
#include "ascend_attn_rt/dsa/impl.h"
#include "ascend_attn_rt/sparse/topk_buffer.h"
#include "ascend_attn_rt/dsa/plan/dsa_kv_plan.h"
#include "../bindings/common.h"
#include "../bindings/tensor_caster.h"

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

const char* cache_kind_name(dsa::DsaCacheKind k) {
  for (const auto& [n, kind] : kCacheKinds) {
    if (kind == k) return n;
  }
  throw_invalid("DSA: cache kind is not a DsaCacheKind (value ", static_cast<int32_t>(k), ")");
}

// The type of an argument as an error names it ("int", "ascend_attn_rt._C.dsa.GroupMetadata").
std::string arg_type(nb::handle h) { return nb::inst_name(h).c_str(); }

// A GroupMetadata argument (None allowed); anything else is a TypeError naming
// the argument and the type received (nb::cast would throw a bare bad_cast).
const dsa::GroupMetadata* group_arg(nb::handle h, const std::string& name) {
  if (h.is_none()) return nullptr;
  if (!nb::isinstance<dsa::GroupMetadata>(h)) {
    throw nb::type_error((name + " must be an aar.dsa.GroupMetadata (a GroupBuilder.build result) or None, got " +
                          arg_type(h)).c_str());
  }
  return nb::cast<const dsa::GroupMetadata*>(h);
}

const dsa::StepMetadata& step_arg(nb::handle h, const char* name) {
  if (!nb::isinstance<dsa::StepMetadata>(h)) {
    throw nb::type_error((std::string(name) + " must be an aar.dsa.StepMetadata (a StepBuilder.build result), got " +
                          arg_type(h)).c_str());
  }
  return *nb::cast<const dsa::StepMetadata*>(h);
}

nb::dict view_dict(const dsa::DsaCacheView& v) {
  nb::dict d;
  d["dtype"] = dsa::to_string(v.dtype);
  d["shape"] = v.shape;
  d["stride"] = v.stride;
  d["storage_offset"] = v.storage_offset;
  return d;
}

// A cache spec as Python sees it (aar.dsa.cache_spec, GroupBuilder.cache_spec):
// the fields, the shape for num_blocks and the views over a raw buffer of
// num_blocks padded pages.
nb::dict spec_dict(const dsa::DsaCacheSpec& s, const dsa::AttnKvPlan& p, int64_t num_blocks) {
  nb::dict d;
  d["kind"] = cache_kind_name(s.kind);
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
  d["num_blocks"] = num_blocks;
  d["shape"] = dsa::dsa_kv_cache_shape(s, num_blocks);
  d["view"] = view_dict(dsa::dsa_cache_view(s, num_blocks));
  if (s.scale_dim > 0) {
    d["scale_shape"] = dsa::dsa_scale_cache_shape(s, num_blocks);
    d["scale_view"] = view_dict(dsa::dsa_indexer_scale_view(s, num_blocks));
    if (p.indexer_full_view) d["full_view"] = view_dict(dsa::dsa_indexer_full_view(s, p, num_blocks));
  }
  return d;
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
  d["block_offset_skip"] = dsa::to_string(p.block_offset_skip);
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


std::vector<int32_t> span_list(plan::CSpan<int32_t> s) { return std::vector<int32_t>(s.begin(), s.end()); }

const dsa::StepMetadata& live(const dsa::StepMetadata& m) {
  check_current(m.stamp, "step metadata");
  return m;
}
const dsa::GroupMetadata& live(const dsa::GroupMetadata& m) {
  dsa::check_current(m, "group metadata");
  return m;
}

dsa::StepInputs step_inputs(nb::handle qsl, nb::handle seq_lens, int32_t num_reqs_actual, int32_t num_input_tokens,
                            std::optional<plan::AttentionState> attn_state,
                            const std::optional<at::Tensor>& num_spec_tokens) {
  dsa::StepInputs in;
  in.query_start_loc = i32_span(borrow_tensor(qsl, "query_start_loc", false), "query_start_loc");
  in.seq_lens = i32_span(borrow_tensor(seq_lens, "seq_lens", false), "seq_lens");
  in.num_reqs_actual = num_reqs_actual;
  in.num_input_tokens = num_input_tokens;
  in.attn_state = attn_state;
  if (num_spec_tokens.has_value()) in.num_spec_tokens = i32_span(*num_spec_tokens, "num_spec_tokens");
  return in;
}

dsa::GroupInputs group_inputs(nb::handle bt) {
  const at::Tensor& b = borrow_tensor(bt, "block_table", false);
  dsa::GroupInputs in;
  in.block_table = i32_span(b, "block_table", 2);
  in.block_table_stride = static_cast<int32_t>(b.size(1));
  return in;
}

// What aar.dsa.route_layer returns: the routed layer metadata (pointers into
// the Python metadata objects below, which it keeps alive).
struct RoutedLayer {
  dsa::LayerMetadata md;
  nb::object step, swa, attention, compressor_state, indexer_cache, indexer_state;
};

void bind_dsa_builders(nb::module_& m) {
  auto opt_t = [](const at::Tensor& t) -> std::optional<at::Tensor> {
    if (!t.defined()) return std::nullopt;
    return t;
  };
  def_step_counts(nb::class_<dsa::StepMetadata>(m, "StepMetadata", "The per-step shared DSA metadata (dsa/metadata.h)."))
      .def_prop_ro("num_reqs_actual", [](const dsa::StepMetadata& s) { return s.num_reqs; }, "alias of num_reqs")
      .def_ro("num_kernel_tokens", &dsa::StepMetadata::num_kernel_tokens,
              "query_start_loc[B]: the tokens of all B requests, padding requests' included")
      .def_ro("decode_threshold", &dsa::StepMetadata::decode_threshold)
      .def_ro("max_seqlen_q", &dsa::StepMetadata::max_seqlen_q, "over all B requests (the kernels')")
      .def_ro("max_seqlen_kv", &dsa::StepMetadata::max_seqlen_kv, "over all B requests (the kernels')")
      .def_ro("attn_state", &dsa::StepMetadata::attn_state)
      .def_ro("draft_index", &dsa::StepMetadata::draft_index)
      .def_prop_ro("has_prefill", &dsa::StepMetadata::has_prefill)
      .def_prop_ro("generation", [](const dsa::StepMetadata& s) { return s.stamp.generation; })
      .def_prop_ro("is_current", [](const dsa::StepMetadata& s) { return s.stamp.current(); })
      .def_prop_ro("query_start_loc", [](const dsa::StepMetadata& s) { return s.query_start_loc; })
      .def_prop_ro("seq_lens", [](const dsa::StepMetadata& s) { return s.seq_lens; })
      .def_prop_ro("start_pos", [](const dsa::StepMetadata& s) { return s.start_pos; })
      .def_prop_ro("cu_seqlens_kv", [](const dsa::StepMetadata& s) { return s.cu_seqlens_kv; })
      .def_prop_ro("cos", [](const dsa::StepMetadata& s) { return s.cos; })
      .def_prop_ro("sin", [](const dsa::StepMetadata& s) { return s.sin; })
      .def_prop_ro("neg_sin", [](const dsa::StepMetadata& s) { return s.neg_sin; })
      .def_prop_ro("compress_neg_sin", [](const dsa::StepMetadata& s) -> std::optional<at::Tensor> {
        if (!s.compress_neg_sin.defined()) return std::nullopt;
        return s.compress_neg_sin;
      })
      .def_prop_ro("compress_cos", [](const dsa::StepMetadata& s) -> std::optional<at::Tensor> {
        if (!s.compress_cos.defined()) return std::nullopt;
        return s.compress_cos;
      })
      .def_prop_ro("compress_sin", [](const dsa::StepMetadata& s) -> std::optional<at::Tensor> {
        if (!s.compress_sin.defined()) return std::nullopt;
        return s.compress_sin;
      })
      .def_prop_ro("query_start_loc_list", [](const dsa::StepMetadata& s) { return span_list(live(s).query_start_loc_host); })
      .def_prop_ro("seq_lens_list", [](const dsa::StepMetadata& s) { return span_list(live(s).seq_lens_host); })
      .def_prop_ro("start_pos_list", [](const dsa::StepMetadata& s) { return span_list(live(s).start_pos_host); })
      .def_prop_ro("positions_list", [](const dsa::StepMetadata& s) { return span_list(live(s).positions_host); })
      // DSA-CP token sharding (docs/design/sparse_cp.md §4, §10; dsa_cp_world_size 1 otherwise).
      .def_prop_ro("dsa_cp_world_size", [](const dsa::StepMetadata& s) { return s.dsa_cp.world_size; })
      .def_prop_ro("dsa_cp_rank", [](const dsa::StepMetadata& s) { return s.dsa_cp.rank; })
      // DSA DCP (docs/design/sparse_cp.md §12; dcp_world_size 1 otherwise).
      .def_prop_ro("dcp_world_size", [](const dsa::StepMetadata& s) { return s.dcp.world_size; })
      .def_prop_ro("dcp_rank", [](const dsa::StepMetadata& s) { return s.dcp.rank; })
      .def_prop_ro("dcp_interleave", [](const dsa::StepMetadata& s) { return s.dcp.interleave; })
      // DSA PCP (docs/design/sparse_cp.md §13; pcp_world_size 1 otherwise): this rank's rows and segments.
      .def_prop_ro("pcp_world_size", [](const dsa::StepMetadata& s) { return s.pcp.world_size; })
      .def_prop_ro("pcp_rank", [](const dsa::StepMetadata& s) { return s.pcp.rank; })
      .def_prop_ro("num_local_tokens", [](const dsa::StepMetadata& s) { return s.pcp.num_local_tokens; })
      .def_prop_ro("num_pcp_segments", [](const dsa::StepMetadata& s) { return s.pcp.num_segments; })
      .def_prop_ro("local_token_index", [opt_t](const dsa::StepMetadata& s) { return opt_t(s.pcp.local_token_index); })
      .def_prop_ro("local_token_index_list",
                   [](const dsa::StepMetadata& s) { return span_list(live(s).pcp.local_token_index_host); })
      .def_prop_ro("pcp_gather_index", [opt_t](const dsa::StepMetadata& s) { return opt_t(s.pcp.gather_index); })
      .def_prop_ro("pcp_query_start_loc_list",
                   [](const dsa::StepMetadata& s) { return span_list(live(s).pcp.query_start_loc_host); })
      .def_prop_ro("pcp_seq_lens_list", [](const dsa::StepMetadata& s) { return span_list(live(s).pcp.seq_lens_host); })
      .def_prop_ro("pcp_req_list", [](const dsa::StepMetadata& s) { return span_list(live(s).pcp.req_host); })
      .def_prop_ro("pcp_indexer_seq_lens",
                   [opt_t](const dsa::StepMetadata& s) { return opt_t(s.pcp.indexer_seq_lens); })
      .def_prop_ro("num_tokens_pad", [](const dsa::StepMetadata& s) { return s.dsa_cp.num_tokens_pad; })
      .def_prop_ro("tokens_per_rank", [](const dsa::StepMetadata& s) { return s.dsa_cp.tokens_per_rank; })
      .def_prop_ro("local_start", [](const dsa::StepMetadata& s) { return s.dsa_cp.local_start; })
      .def_prop_ro("local_end", [](const dsa::StepMetadata& s) { return s.dsa_cp.local_end; })
      .def_prop_ro("local_max_seqlen_q", [](const dsa::StepMetadata& s) { return s.dsa_cp.max_seqlen_q; })
      .def_prop_ro("local_max_seqlen_kv", [](const dsa::StepMetadata& s) { return s.dsa_cp.max_seqlen_kv; })
      .def_prop_ro("local_query_start_loc",
                   [opt_t](const dsa::StepMetadata& s) { return opt_t(s.dsa_cp.query_start_loc); })
      .def_prop_ro("local_seq_lens", [opt_t](const dsa::StepMetadata& s) { return opt_t(s.dsa_cp.seq_lens); })
      .def_prop_ro("local_cu_seqlens_kv", [opt_t](const dsa::StepMetadata& s) { return opt_t(s.dsa_cp.cu_seqlens_kv); })
      .def_prop_ro("local_cos", [opt_t](const dsa::StepMetadata& s) { return opt_t(s.dsa_cp.cos); })
      .def_prop_ro("local_sin", [opt_t](const dsa::StepMetadata& s) { return opt_t(s.dsa_cp.sin); })
      .def_prop_ro("local_neg_sin", [opt_t](const dsa::StepMetadata& s) { return opt_t(s.dsa_cp.neg_sin); })
      .def_prop_ro("local_compress_cos", [opt_t](const dsa::StepMetadata& s) { return opt_t(s.dsa_cp.compress_cos); })
      .def_prop_ro("local_compress_sin", [opt_t](const dsa::StepMetadata& s) { return opt_t(s.dsa_cp.compress_sin); })
      .def_prop_ro("local_query_start_loc_list",
                   [](const dsa::StepMetadata& s) { return span_list(live(s).dsa_cp.query_start_loc_host); })
      .def_prop_ro("local_seq_lens_list",
                   [](const dsa::StepMetadata& s) { return span_list(live(s).dsa_cp.seq_lens_host); });

  auto opt = [](const at::Tensor& t) -> std::optional<at::Tensor> {
    if (!t.defined()) return std::nullopt;
    return t;
  };
  nb::class_<dsa::GroupMetadata>(m, "GroupMetadata", "One KV-cache group's DSA metadata (dsa/metadata.h).")
      .def_prop_ro("kind", [](const dsa::GroupMetadata& g) { return std::string(dsa::to_string(g.kind)); })
      .def_ro("compress_ratio", &dsa::GroupMetadata::compress_ratio)
      .def_ro("block_size", &dsa::GroupMetadata::block_size)
      .def_ro("storage_block_size", &dsa::GroupMetadata::storage_block_size)
      .def_prop_ro("slot_format", [](const dsa::GroupMetadata& g) { return std::string(dsa::to_string(g.slot_format)); })
      .def_ro("num_reqs", &dsa::GroupMetadata::num_reqs, "the step's real requests")
      .def_ro("num_kernel_reqs", &dsa::GroupMetadata::num_kernel_reqs, "the step's B (the block table's rows)")
      .def_prop_ro("num_reqs_actual", [](const dsa::GroupMetadata& g) { return g.num_reqs; }, "alias of num_reqs")
      .def_ro("draft_index", &dsa::GroupMetadata::draft_index)
      .def_ro("num_blocks", &dsa::GroupMetadata::num_blocks)
      .def_ro("window", &dsa::GroupMetadata::window)
      .def_ro("num_compressed_tokens", &dsa::GroupMetadata::num_compressed_tokens)
      .def_ro("num_valid_rows", &dsa::GroupMetadata::num_valid_rows)
      .def_ro("ori_win_left", &dsa::GroupMetadata::ori_win_left)
      .def_ro("ori_win_right", &dsa::GroupMetadata::ori_win_right)
      .def_ro("max_seqlen_q", &dsa::GroupMetadata::max_seqlen_q)
      .def_ro("max_seqlen_kv", &dsa::GroupMetadata::max_seqlen_kv)
      .def_ro("sas_metadata_filled", &dsa::GroupMetadata::sas_metadata_filled)
      .def_ro("qli_metadata_filled", &dsa::GroupMetadata::qli_metadata_filled)
      .def_ro("qli_num_heads", &dsa::GroupMetadata::qli_num_heads)
      .def_ro("qli_head_dim", &dsa::GroupMetadata::qli_head_dim)
      .def_ro("qli_sparse_count", &dsa::GroupMetadata::qli_sparse_count)
      .def_ro("dspark_width", &dsa::GroupMetadata::dspark_width)
      .def_prop_ro("cu_seqlens_ori_kv_kind",
                   [](const dsa::GroupMetadata& g) { return std::string(dsa::to_string(g.cu_seqlens_ori_kv_kind)); })
      .def_prop_ro("cu_seqlens_cmp_kv_kind",
                   [](const dsa::GroupMetadata& g) { return std::string(dsa::to_string(g.cu_seqlens_cmp_kv_kind)); })
      .def_prop_ro("generation", [](const dsa::GroupMetadata& g) { return g.stamp.generation; })
      .def_prop_ro("is_current", &dsa::GroupMetadata::current)
      .def_prop_ro("block_table", [](const dsa::GroupMetadata& g) { return g.block_table; })
      .def_prop_ro("pcp_block_table", [](const dsa::GroupMetadata& g) -> std::optional<at::Tensor> {
        if (!g.pcp_block_table.defined()) return std::nullopt;
        return g.pcp_block_table;
      })
      .def_prop_ro("seq_lens", [](const dsa::GroupMetadata& g) { return g.seq_lens; })
      .def_prop_ro("query_start_loc", [](const dsa::GroupMetadata& g) { return g.query_start_loc; })
      .def_prop_ro("start_pos", [](const dsa::GroupMetadata& g) { return g.start_pos; })
      .def_prop_ro("slot_mapping", [](const dsa::GroupMetadata& g) { return g.slot_mapping; })
      .def_prop_ro("row_index", [](const dsa::GroupMetadata& g) { return g.row_index; })
      .def_prop_ro("row_position", [](const dsa::GroupMetadata& g) { return g.row_position; })
      .def_prop_ro("row_request", [](const dsa::GroupMetadata& g) { return g.row_request; })
      .def_prop_ro("cos", [](const dsa::GroupMetadata& g) { return g.cos; })
      .def_prop_ro("sin", [](const dsa::GroupMetadata& g) { return g.sin; })
      .def_prop_ro("neg_sin", [](const dsa::GroupMetadata& g) { return g.neg_sin; })
      .def_prop_ro("compressed_cos", [opt](const dsa::GroupMetadata& g) { return opt(g.compressed_cos); })
      .def_prop_ro("compressed_sin", [opt](const dsa::GroupMetadata& g) { return opt(g.compressed_sin); })
      .def_prop_ro("compressed_slots", [opt](const dsa::GroupMetadata& g) { return opt(g.compressed_slots); })
      .def_prop_ro("full_compress_cos", [opt](const dsa::GroupMetadata& g) { return opt(g.full_compress_cos); })
      .def_prop_ro("full_compress_sin", [opt](const dsa::GroupMetadata& g) { return opt(g.full_compress_sin); })
      .def_prop_ro("sas_metadata", [](const dsa::GroupMetadata& g) { return g.sas_metadata; })
      .def_prop_ro("qli_metadata", [](const dsa::GroupMetadata& g) { return g.qli_metadata; })
      .def_prop_ro("cu_seqlens_ori_kv", [opt](const dsa::GroupMetadata& g) { return opt(g.cu_seqlens_ori_kv); })
      .def_prop_ro("cu_seqlens_cmp_kv", [opt](const dsa::GroupMetadata& g) { return opt(g.cu_seqlens_cmp_kv); })
      .def_prop_ro("dspark_swa_indices", [opt](const dsa::GroupMetadata& g) { return opt(g.dspark_swa_indices); })
      .def_prop_ro("dcp_ori_indices", [opt](const dsa::GroupMetadata& g) { return opt(g.dcp_ori_indices); })
      .def_prop_ro("dcp_cmp_limit", [opt](const dsa::GroupMetadata& g) { return opt(g.dcp_cmp_limit); })
      .def_prop_ro("seqused_cmp_kv", [opt](const dsa::GroupMetadata& g) { return opt(g.seqused_cmp_kv); })
      .def_prop_ro("graph_fill_slot", [opt](const dsa::GroupMetadata& g) { return opt(g.graph_fill_slot); })
      .def_prop_ro("cmp_residual_kv", [opt](const dsa::GroupMetadata& g) { return opt(g.cmp_residual_kv); })
      .def_ro("max_seqlen_cmp_kv", &dsa::GroupMetadata::max_seqlen_cmp_kv)
      .def_prop_ro("block_table_list", [](const dsa::GroupMetadata& g) { return span_list(live(g).block_table_host); })
      .def_prop_ro("slot_mapping_list", [](const dsa::GroupMetadata& g) { return span_list(live(g).slot_mapping_host); })
      .def_prop_ro("row_index_list", [](const dsa::GroupMetadata& g) { return span_list(live(g).row_index_host); })
      .def_prop_ro("row_position_list", [](const dsa::GroupMetadata& g) { return span_list(live(g).row_position_host); })
      .def_prop_ro("row_request_list", [](const dsa::GroupMetadata& g) { return span_list(live(g).row_request_host); })
      .def_prop_ro("dspark_list", [](const dsa::GroupMetadata& g) { return span_list(live(g).dspark_host); });

  nb::class_<dsa::StepBuilder>(m, "StepBuilder",
                               "The per-step shared DSA computation (dsa/builder.h): split, start_pos, lengths, "
                               "RoPE rows of both tables; one copy per step.")
      .def(
          "__init__",
          [](dsa::StepBuilder* self, int32_t max_num_reqs, int32_t max_num_tokens, const at::Tensor& cos_table,
             const at::Tensor& sin_table, const std::optional<at::Tensor>& compress_cos_table,
             const std::optional<at::Tensor>& compress_sin_table, int32_t num_speculative_tokens,
             std::optional<int32_t> num_drafts, bool chunked_prefill_enabled, const std::string& device,
             std::optional<bool> separate_device_buffers, int32_t staging_buffers, int32_t head_dim, int32_t window,
             int32_t dspark_num_spec, int32_t dspark_width, int32_t num_heads_q, int32_t index_topk,
             int32_t index_n_heads, int32_t index_head_dim, int32_t dsa_cp_world_size, int32_t dsa_cp_rank,
             int32_t dcp_world_size, int32_t dcp_rank, int32_t dcp_interleave, int32_t pcp_world_size,
             int32_t pcp_rank) {
            dsa::StepBuilderConfig c;
            c.max_num_reqs = max_num_reqs;
            c.max_num_tokens = max_num_tokens;
            c.cos_table = cos_table;
            c.sin_table = sin_table;
            if (compress_cos_table.has_value()) c.compress_cos_table = *compress_cos_table;
            if (compress_sin_table.has_value()) c.compress_sin_table = *compress_sin_table;
            c.num_speculative_tokens = num_speculative_tokens;
            c.num_drafts = num_drafts;
            c.chunked_prefill_enabled = chunked_prefill_enabled;
            c.device = c10::Device(device);
            c.separate_device_buffers = separate_device_buffers;
            c.staging_buffers = staging_buffers;
            c.model.head_dim = head_dim;
            c.model.window = window;
            c.model.dspark_num_spec = dspark_num_spec;
            c.model.dspark_width = dspark_width;
            c.model.num_heads_q = num_heads_q;
            c.model.index_topk = index_topk;
            c.model.index_n_heads = index_n_heads;
            c.model.index_head_dim = index_head_dim;
            c.dsa_cp_world_size = dsa_cp_world_size;
            c.dsa_cp_rank = dsa_cp_rank;
            c.dcp_world_size = dcp_world_size;
            c.dcp_rank = dcp_rank;
            c.dcp_interleave = dcp_interleave;
            c.pcp_world_size = pcp_world_size;
            c.pcp_rank = pcp_rank;
            new (self) dsa::StepBuilder(c);
          },
          nb::kw_only(), "max_num_reqs"_a, "max_num_tokens"_a, "cos_table"_a, "sin_table"_a,
          "compress_cos_table"_a = nb::none(), "compress_sin_table"_a = nb::none(), "num_speculative_tokens"_a = 0,
          "num_drafts"_a = nb::none(), "chunked_prefill_enabled"_a = true, "device"_a = "cpu",
          "separate_device_buffers"_a = nb::none(), "staging_buffers"_a = 2, "head_dim"_a = dsa::ModelSettings().head_dim,
          "window"_a = dsa::ModelSettings().window, "dspark_num_spec"_a = 0, "dspark_width"_a = 0, "num_heads_q"_a = 0,
          "index_topk"_a = dsa::ModelSettings().index_topk, "index_n_heads"_a = dsa::ModelSettings().index_n_heads,
          "index_head_dim"_a = dsa::ModelSettings().index_head_dim, "dsa_cp_world_size"_a = 1, "dsa_cp_rank"_a = 0,
          "dcp_world_size"_a = 1, "dcp_rank"_a = 0, "dcp_interleave"_a = 1, "pcp_world_size"_a = 1, "pcp_rank"_a = 0)
      .def(
          "build",
          [](dsa::StepBuilder& b, nb::handle qsl, nb::handle seq_lens, int32_t num_reqs_actual,
             int32_t num_input_tokens, std::optional<plan::AttentionState> attn_state,
             const std::optional<at::Tensor>& num_spec_tokens) -> dsa::StepMetadata {
            return b.build(step_inputs(qsl, seq_lens, num_reqs_actual, num_input_tokens, attn_state, num_spec_tokens));
          },
          "query_start_loc"_a, "seq_lens"_a, nb::kw_only(), "num_reqs_actual"_a = -1, "num_input_tokens"_a = 0,
          "attn_state"_a = nb::none(), "num_spec_tokens"_a = nb::none(), nb::rv_policy::move, nb::keep_alive<0, 1>())
      .def(
          "build_for_graph_capture",
          [](dsa::StepBuilder& b, nb::handle qsl, nb::handle seq_lens, int32_t num_reqs_actual,
             int32_t num_input_tokens, plan::AttentionState state) -> dsa::StepMetadata {
            return b.build_for_graph_capture(
                step_inputs(qsl, seq_lens, num_reqs_actual, num_input_tokens, std::nullopt, std::nullopt), state);
          },
          "query_start_loc"_a, "seq_lens"_a, nb::kw_only(), "num_reqs_actual"_a = -1, "num_input_tokens"_a = 0,
          "state"_a = plan::AttentionState::DecodeOnly, nb::rv_policy::move, nb::keep_alive<0, 1>())
      .def(
          "build_for_drafting",
          [](dsa::StepBuilder& b, nb::handle qsl, nb::handle seq_lens, int32_t draft_index, int32_t num_reqs_actual,
             int32_t num_input_tokens) -> dsa::StepMetadata {
            return b.build_for_drafting(
                step_inputs(qsl, seq_lens, num_reqs_actual, num_input_tokens, std::nullopt, std::nullopt),
                draft_index);
          },
          "query_start_loc"_a, "seq_lens"_a, "draft_index"_a, nb::kw_only(), "num_reqs_actual"_a = -1,
          "num_input_tokens"_a = 0, nb::rv_policy::move, nb::keep_alive<0, 1>())
      .def_prop_ro("decode_threshold", &dsa::StepBuilder::decode_threshold)
      .def_prop_ro("num_drafts", &dsa::StepBuilder::num_drafts)
      .def_prop_ro("generation", &dsa::StepBuilder::generation)
      .def_prop_ro(
          "model",
          [](const dsa::StepBuilder& b) {
            const dsa::ModelSettings& ms = b.model();
            nb::dict d;
            d["head_dim"] = ms.head_dim;
            d["window"] = ms.window;
            d["dspark_num_spec"] = ms.dspark_num_spec;
            d["dspark_width"] = ms.dspark_width;
            d["num_heads_q"] = ms.num_heads_q;
            d["index_topk"] = ms.index_topk;
            d["index_n_heads"] = ms.index_n_heads;
            d["index_head_dim"] = ms.index_head_dim;
            return d;
          },
          "The model settings every GroupBuilder of this step reads (dsa/builder.h ModelSettings), as a dict.")
      .def_prop_ro(
          "cache_dims",
          [](const dsa::StepBuilder& b) {
            const dsa::DsaCacheDims c = b.cache_dims();
            nb::dict d;
            d["head_dim"] = c.head_dim;
            d["rope_dim"] = c.rope_dim;
            d["index_head_dim"] = c.index_head_dim;
            return d;
          },
          "The dims the groups' cache specs are for (rope_dim: the RoPE tables' width).");

  nb::class_<dsa::GroupBuilder>(m, "GroupBuilder",
                                "One KV-cache group's DSA builder (dsa/builder.h): block table, slots, compressed "
                                "rows, DSpark indices, SAS/QLI buffers; one copy per group per step.")
      .def(
          "__init__",
          [](dsa::GroupBuilder* self, const dsa::StepBuilder& step, const std::string& kind, int32_t cache_block_size,
             const std::string& device_kind, const std::optional<std::string>& cache_dtype,
             const std::string& model_dtype, int32_t max_blocks_per_req, int32_t num_blocks) {
            dsa::GroupConfig c;
            c.kind = parse_cache_kind(kind);
            c.cache_block_size = cache_block_size;
            c.plan = plan_from(device_kind, cache_dtype, model_dtype);
            c.max_blocks_per_req = max_blocks_per_req;
            c.num_blocks = num_blocks;
            new (self) dsa::GroupBuilder(step, c);
          },
          "step_builder"_a, nb::kw_only(), "kind"_a, "cache_block_size"_a = 128, "device_kind"_a = "a2",
          "cache_dtype"_a = nb::none(), "model_dtype"_a = "bfloat16", "max_blocks_per_req"_a = 64, "num_blocks"_a,
          nb::keep_alive<1, 2>())
      .def(
          "build",
          [](dsa::GroupBuilder& g, const dsa::StepMetadata& step, nb::handle bt) -> dsa::GroupMetadata {
            return g.build(step, group_inputs(bt));
          },
          "step"_a, "block_table"_a, nb::rv_policy::move, nb::keep_alive<0, 1>())
      .def(
          "build_for_drafting",
          [](dsa::GroupBuilder& g, const dsa::StepMetadata& step, nb::handle bt, int32_t draft_index)
              -> dsa::GroupMetadata { return g.build_for_drafting(step, group_inputs(bt), draft_index); },
          "step"_a, "block_table"_a, "draft_index"_a, nb::rv_policy::move, nb::keep_alive<0, 1>())
      .def_prop_ro("compress_ratio", &dsa::GroupBuilder::compress_ratio)
      .def_prop_ro("block_size", &dsa::GroupBuilder::block_size)
      .def_prop_ro("storage_block_size", &dsa::GroupBuilder::storage_block_size)
      .def_prop_ro("slot_format", [](const dsa::GroupBuilder& g) { return std::string(dsa::to_string(g.slot_format())); })
      .def_prop_ro("num_drafts", &dsa::GroupBuilder::num_drafts)
      .def_prop_ro("block_table_staging", [](const dsa::GroupBuilder& g) { return g.block_table_staging(); })
      .def_prop_ro("generation", &dsa::GroupBuilder::generation)
      .def_prop_ro(
          "cache_spec",
          [](const dsa::GroupBuilder& g) { return spec_dict(g.cache_spec(), g.config().plan, g.config().num_blocks); },
          "The group's cache spec for the step's model dims (aar.dsa.cache_spec's dict, for its num_blocks): "
          "'shape' is the cache tensor its layers take.");

  // route_layer's result: the routed C++ LayerMetadata and the Python
  // metadata objects it points into, kept alive with it.
  nb::class_<RoutedLayer>(m, "LayerMetadata",
                          "One layer's routed metadata (docs/design/dsa.md §3.3, dsa::LayerMetadata): what route_layer returns and "
                          "Impl.forward takes as its metadata argument.")
      .def_prop_ro("compress_ratio", [](const RoutedLayer& r) { return r.md.compress_ratio; })
      .def_prop_ro("step", [](const RoutedLayer& r) { return r.step; })
      .def_prop_ro("swa", [](const RoutedLayer& r) { return r.swa; })
      .def_prop_ro("attention", [](const RoutedLayer& r) { return r.attention; })
      .def_prop_ro("compressor_state", [](const RoutedLayer& r) { return r.compressor_state; })
      .def_prop_ro("indexer_cache", [](const RoutedLayer& r) { return r.indexer_cache; })
      .def_prop_ro("indexer_state", [](const RoutedLayer& r) { return r.indexer_state; })
      .def_prop_ro(
          "common", [](const RoutedLayer& r) { return r.md.attention != nullptr ? r.attention : r.swa; },
          "attention if the layer has one, else swa (docs/design/dsa.md §3.3).");

  // By kind, from all of a step's groups (a {kind: metadata} dict or a
  // sequence); registered first: a GroupMetadata is neither, so the
  // positional form below still gets those calls.
  auto route_by_kind = [](int32_t ratio, nb::handle step, const std::vector<std::pair<std::string, nb::handle>>& items) {
    const dsa::StepMetadata& st = step_arg(step, "step");
    std::vector<const dsa::GroupMetadata*> ptrs;
    for (const auto& [name, h] : items) ptrs.push_back(group_arg(h, name));
    const dsa::LayerMetadata l =
        dsa::route_layer(ratio, st, plan::CSpan<const dsa::GroupMetadata*>(ptrs.data(), ptrs.size()));
    RoutedLayer out;
    out.md = l;
    out.step = nb::borrow(step);
    auto obj = [&](const dsa::GroupMetadata* g) -> nb::object {
      if (g == nullptr) return nb::none();
      for (size_t i = 0; i < ptrs.size(); ++i) {
        if (ptrs[i] == g) return nb::borrow(items[i].second);
      }
      return nb::none();
    };
    out.swa = obj(l.swa);
    out.attention = obj(l.attention);
    out.compressor_state = obj(l.compressor_state);
    out.indexer_cache = obj(l.indexer_cache);
    out.indexer_state = obj(l.indexer_state);
    return out;
  };
  m.def(
      "route_layer",
      [route_by_kind](int32_t ratio, nb::handle step, const nb::dict& groups) {
        std::vector<std::pair<std::string, nb::handle>> items;
        for (auto [k, v] : groups) items.emplace_back("groups[" + nb::cast<std::string>(nb::repr(k)) + "]", v);
        return route_by_kind(ratio, step, items);
      },
      "compress_ratio"_a, "step"_a, "groups"_a,
      "docs/design/dsa.md §3.3 by cache kind: the layer's groups picked from all of the step's groups ({kind: metadata}), checked; "
      "an aar.dsa.LayerMetadata (Impl.forward's metadata).");
  m.def(
      "route_layer",
      [route_by_kind](int32_t ratio, nb::handle step, const nb::sequence& groups) {
        std::vector<std::pair<std::string, nb::handle>> items;
        size_t i = 0;
        for (nb::handle h : groups) items.emplace_back("groups[" + std::to_string(i++) + "]", h);
        return route_by_kind(ratio, step, items);
      },
      "compress_ratio"_a, "step"_a, "groups"_a,
      "docs/design/dsa.md §3.3 by cache kind: the layer's groups picked from a sequence of the step's group metadata, checked.");
  m.def(
      "route_layer",
      [](int32_t ratio, nb::handle step, nb::handle swa, nb::handle attention, nb::handle compressor_state,
         nb::handle indexer_cache, nb::handle indexer_state) {
        RoutedLayer out;
        out.md = dsa::route_layer(ratio, step_arg(step, "step"), group_arg(swa, "swa"),
                                  group_arg(attention, "attention"), group_arg(compressor_state, "compressor_state"),
                                  group_arg(indexer_cache, "indexer_cache"),
                                  group_arg(indexer_state, "indexer_state"));
        out.step = nb::borrow(step);
        out.swa = nb::borrow(swa);
        out.attention = nb::borrow(attention);
        out.compressor_state = nb::borrow(compressor_state);
        out.indexer_cache = nb::borrow(indexer_cache);
        out.indexer_state = nb::borrow(indexer_state);
        return out;
      },
      "compress_ratio"_a, "step"_a, "swa"_a.none(), "attention"_a = nb::none(), "compressor_state"_a = nb::none(),
      "indexer_cache"_a = nb::none(), "indexer_state"_a = nb::none(),
      "docs/design/dsa.md §3.3: a layer's groups, checked (kinds, currency, same step); an aar.dsa.LayerMetadata.");
  m.def(
      "graph_update",
      [](graph::GraphParams& g, int64_t num_tokens, const dsa::StepMetadata& step, nb::handle swa) {
        // One SWA group's metadata, or a sequence of them: swa[k] for the layers made with kv_cache_group=k.
        std::vector<const dsa::GroupMetadata*> groups;
        if (nb::isinstance<dsa::GroupMetadata>(swa)) {
          groups.push_back(nb::cast<const dsa::GroupMetadata*>(swa));
        } else {
          AAR_CHECK_ARG(nb::isinstance<nb::sequence>(swa) && !nb::isinstance<nb::str>(swa),
                        "swa must be an aar.dsa.GroupMetadata or a sequence of them (one per kv_cache_group), got ",
                        nb::cast<std::string>(nb::str(swa.type())));
          size_t i = 0;
          for (nb::handle h : nb::borrow<nb::sequence>(swa)) {
            AAR_CHECK_ARG(nb::isinstance<dsa::GroupMetadata>(h), "swa[", i, "] must be an aar.dsa.GroupMetadata, got ",
                          nb::cast<std::string>(nb::str(h.type())));
            groups.push_back(nb::cast<const dsa::GroupMetadata*>(h));
            ++i;
          }
        }
        std::vector<graph::StepParams> params;
        for (const dsa::GroupMetadata* m : groups) {
          dsa::LayerMetadata l;
          l.step = &step;
          l.swa = m;
          params.push_back(dsa::graph_step_params(l));
        }
        g.update(num_tokens, params);
      },
      "graph"_a, "num_tokens"_a, "step"_a, "swa"_a,
      "GraphParams.update for captured DSA layers (dsa/graph.h): checks the step fits the bucket (tokens, requests, "
      "no prefill, the SWA metadata at the captured addresses); re-issues nothing for them. swa: one SWA group's metadata, or a "
      "sequence of them indexed by the layers' kv_cache_group (a model whose layers read several SWA groups).");
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
      "docs/design/dsa.md §4.2's attention KV dtype (a string); never mutates anything.");
  m.def(
      "flash_mla_cmp_lengths",
      [](const std::vector<int32_t>& seqused_kv, int32_t max_seqlen_kv, int32_t cmp_ratio) {
        std::vector<int32_t> cmp(seqused_kv.size()), res(seqused_kv.size());
        const int32_t mx = dsa::flash_mla_cmp_lengths(seqused_kv, max_seqlen_kv, cmp_ratio, cmp, res);
        return std::make_tuple(cmp, res, mx);
      },
      "seqused_kv"_a, "max_seqlen_kv"_a, "cmp_ratio"_a,
      "The SparseFlashMla adapter's derived lengths (docs/design/dsa.md §4.2, dsa/plan/dsa_kv_plan.h): (seqused_cmp_kv, cmp_residual_kv, "
      "max_seqlen_cmp_kv).");
  m.def(
      "make_attn_kv_plan",
      [](const std::string& device_kind, const std::optional<std::string>& cache_dtype,
         const std::string& model_dtype) { return plan_dict(plan_from(device_kind, cache_dtype, model_dtype)); },
      nb::kw_only(), "device_kind"_a = "a2", "cache_dtype"_a = nb::none(), "model_dtype"_a = "bfloat16",
      "Every per-device decision of the DSA backend (docs/design/dsa.md §4.1 / §4.2) as a dict (dsa/plan/dsa_kv_plan.h: AttnKvPlan).");
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
      "A DSA backend descriptor (docs/design/dsa.md §2.1): kind 'generic', 'c4', 'c128', 'swa', 'c4_state' or 'c128_state'.");
  m.def(
      "cache_spec",
      [](const std::string& kind, int64_t cache_block_size, const std::string& device_kind,
         const std::optional<std::string>& cache_dtype, const std::string& model_dtype, int64_t num_blocks,
         int64_t head_dim, int64_t rope_dim, int64_t index_head_dim) {
        const dsa::AttnKvPlan p = plan_from(device_kind, cache_dtype, model_dtype);
        dsa::DsaCacheDims dims;
        dims.head_dim = head_dim;
        dims.rope_dim = rope_dim;
        dims.index_head_dim = index_head_dim;
        return spec_dict(dsa::dsa_cache_spec(parse_cache_kind(kind), cache_block_size, p, dims), p, num_blocks);
      },
      "kind"_a, "cache_block_size"_a = 128, nb::kw_only(), "device_kind"_a = "a2", "cache_dtype"_a = nb::none(),
      "model_dtype"_a = "bfloat16", "num_blocks"_a = 1, "head_dim"_a = dsa::kDsaHeadDim,
      "rope_dim"_a = dsa::kDsaRopeDim, "index_head_dim"_a = dsa::kDsaIndexerHeadDim,
      "A DSA cache's spec (docs/design/dsa.md §2.2) under the plan of (device_kind, cache_dtype, model_dtype) for a model of head_dim / "
      "rope_dim / index_head_dim (defaults DeepSeek-V4's): kind 'swa', 'c4_kv', 'c128_kv', 'c4_indexer_k', "
      "'c4_attn_state', 'c4_indexer_state', 'c128_state'; its block geometry, dtypes, page bytes and tier, the shape "
      "the layer takes for num_blocks ('shape', 'scale_shape') and the views over a raw buffer of num_blocks padded "
      "pages ('view', 'scale_view', 'full_view': dtype, shape, stride, storage_offset).");
  m.def(
      "layer_cache_kinds",
      [](int64_t compress_ratio) {
        std::vector<std::string> out;
        for (dsa::DsaCacheKind k : dsa::layer_cache_kinds(compress_ratio)) out.emplace_back(cache_kind_name(k));
        return out;
      },
      "compress_ratio"_a,
      "docs/design/dsa.md §3.3: the cache kinds a layer of compress_ratio (1, 4 or 128) reads, in route_layer's order.");
}

// aar.dsa.Impl: the layer forward (dsa/impl.h). Weights from the reference's
// dict names; the metadata as route_layer's LayerMetadata, or the step and
// group objects of this step (route_layer's slots); kv_cache the 6/7-entry
// tuple with None for unused slots.
// The 6/7-entry cache tuple; None for unused slots, any other non-tensor a
// TypeError naming its entry.
std::vector<at::Tensor> kv_list(const nb::sequence& kv_cache) {
  std::vector<at::Tensor> kv;
  for (nb::handle h : kv_cache) {
    if (h.is_none()) {
      kv.emplace_back();
    } else if (is_torch_tensor(h.ptr())) {
      kv.push_back(nb::cast<at::Tensor>(h));
    } else {
      throw nb::type_error(("kv_cache[" + std::to_string(kv.size()) + "] must be a torch.Tensor or None, got " +
                            arg_type(h)).c_str());
    }
  }
  return kv;
}

at::Tensor weight_of(const nb::dict& w, const char* name) {
  if (!w.contains(name)) return at::Tensor();
  return nb::cast<at::Tensor>(w[name]);
}

void bind_dsa_impl(nb::module_& m) {
  nb::class_<dsa::Impl>(m, "Impl", "One DeepSeek-V4 (DSA) attention layer (dsa/impl.h).")
      .def(
          "__init__",
          [](dsa::Impl* self, const nb::dict& weights, int64_t hidden_size, int64_t num_heads, int64_t head_dim,
             int64_t rope_dim, int64_t q_lora_rank, int64_t window, int32_t compress_ratio, int64_t index_n_heads,
             int64_t index_head_dim, int64_t index_topk, double eps, int64_t o_groups, int64_t o_lora_rank,
             const std::string& device_kind, const std::optional<std::string>& cache_dtype,
             const std::string& model_dtype, bool use_index_cache, bool skip_topk, int64_t layer_index,
             int64_t workspace_group, cp::Comm* dsa_cp_comm, bool dsa_cp_full_o_proj_prefill, cp::Comm* dcp_comm,
             bool multistream, bool log_streams, cp::Comm* pcp_comm, int32_t kv_cache_group) {
            dsa::ImplConfig c;
            c.hidden_size = hidden_size;
            c.num_heads = num_heads;
            c.head_dim = head_dim;
            c.rope_dim = rope_dim;
            c.q_lora_rank = q_lora_rank;
            c.window = window;
            c.compress_ratio = compress_ratio;
            c.index_n_heads = index_n_heads;
            c.index_head_dim = index_head_dim;
            c.index_topk = index_topk;
            c.eps = eps;
            c.o_groups = o_groups;
            c.o_lora_rank = o_lora_rank;
            c.plan = plan_from(device_kind, cache_dtype, model_dtype);
            c.use_index_cache = use_index_cache;
            c.skip_topk = skip_topk;
            c.layer_index = layer_index;
            c.kv_cache_group = kv_cache_group;
            c.workspace_group = workspace_group;
            c.dsa_cp_comm = dsa_cp_comm;
            c.dsa_cp_full_o_proj_prefill = dsa_cp_full_o_proj_prefill;
            c.dcp_comm = dcp_comm;
            c.pcp_comm = pcp_comm;
            c.multistream = multistream;
            c.log_streams = log_streams;
            dsa::Weights w;
            w.wq_a = weight_of(weights, "wq_a");
            w.q_norm = weight_of(weights, "q_norm");
            w.wq_b = weight_of(weights, "wq_b");
            w.wkv = weight_of(weights, "wkv");
            w.kv_norm = weight_of(weights, "kv_norm");
            w.attn_sink = weight_of(weights, "attn_sink");
            w.wo_a = weight_of(weights, "wo_a");
            w.wo_b = weight_of(weights, "wo_b");
            w.wo_a_scale = weight_of(weights, "wo_a_scale");
            w.wq_a_scale = weight_of(weights, "wq_a_scale");
            w.wq_b_scale = weight_of(weights, "wq_b_scale");
            w.wkv_scale = weight_of(weights, "wkv_scale");
            w.cmp_wkv = weight_of(weights, "cmp_wkv");
            w.cmp_wgate = weight_of(weights, "cmp_wgate");
            w.cmp_ape = weight_of(weights, "cmp_ape");
            w.cmp_norm = weight_of(weights, "cmp_norm");
            w.idx_wq_b = weight_of(weights, "idx_wq_b");
            w.idx_weights_proj = weight_of(weights, "idx_weights_proj");
            w.idx_cmp_wkv = weight_of(weights, "idx_cmp_wkv");
            w.idx_cmp_wgate = weight_of(weights, "idx_cmp_wgate");
            w.idx_cmp_ape = weight_of(weights, "idx_cmp_ape");
            w.idx_cmp_norm = weight_of(weights, "idx_cmp_norm");
            new (self) dsa::Impl(c, w);
          },
          "weights"_a, nb::kw_only(), "hidden_size"_a, "num_heads"_a, "head_dim"_a = dsa::kDsaHeadDim,
          "rope_dim"_a = dsa::kDsaRopeDim, "q_lora_rank"_a, "window"_a = 0, "compress_ratio"_a = 1,
          "index_n_heads"_a = dsa::kDsaIndexerHeads, "index_head_dim"_a = dsa::kDsaIndexerHeadDim,
          "index_topk"_a = 512, "eps"_a = 1e-6, "o_groups"_a = 1, "o_lora_rank"_a, "device_kind"_a = "a2",
          "cache_dtype"_a = nb::none(), "model_dtype"_a = "bfloat16", "use_index_cache"_a = false,
          "skip_topk"_a = false, "layer_index"_a = -1, "workspace_group"_a = 0, "dsa_cp_comm"_a = nb::none(),
          "dsa_cp_full_o_proj_prefill"_a = true, "dcp_comm"_a = nb::none(), "multistream"_a = false,
          "log_streams"_a = false, "pcp_comm"_a = nb::none(), "kv_cache_group"_a = 0, nb::keep_alive<1, 23>(),
          nb::keep_alive<1, 25>(), nb::keep_alive<1, 28>())
      .def(
          "forward",
          [](dsa::Impl& self, const at::Tensor& hidden, const nb::sequence& kv_cache, const RoutedLayer* metadata,
             const at::Tensor& output, sfa::TopkBuffer* topk_buffer) -> at::Tensor {
            const std::vector<at::Tensor> kv = kv_list(kv_cache);
            // DSA-CP and DCP run collectives inside: never with the GIL held (comm/bindings.cpp's PyCommWork note).
            nb::gil_scoped_release nogil;
            return self.forward(hidden, kv, metadata != nullptr ? &metadata->md : nullptr, output, topk_buffer);
          },
          "hidden"_a, "kv_cache"_a, "metadata"_a.none(), "output"_a, nb::kw_only(), "topk_buffer"_a.none() = nb::none(),
          "docs/design/dsa.md §5.1 with route_layer's result as it is (the routing it checked is used, not made again); "
          "metadata=None: profiling run (output zero-filled). Returns output.")
      .def(
          "forward",
          [](dsa::Impl& self, const at::Tensor& hidden, const nb::sequence& kv_cache, nb::handle step, nb::handle swa,
             const at::Tensor& output, nb::handle attention, nb::handle compressor_state, nb::handle indexer_cache,
             nb::handle indexer_state, sfa::TopkBuffer* topk_buffer) -> at::Tensor {
            const std::vector<at::Tensor> kv = kv_list(kv_cache);
            if (step.is_none()) return self.forward(hidden, kv, nullptr, output, topk_buffer);
            AAR_CHECK_ARG(!swa.is_none(), "swa metadata must be given with step");
            const dsa::LayerMetadata md = dsa::route_layer(
                self.config().compress_ratio, step_arg(step, "step"), group_arg(swa, "swa"),
                group_arg(attention, "attention"), group_arg(compressor_state, "compressor_state"),
                group_arg(indexer_cache, "indexer_cache"), group_arg(indexer_state, "indexer_state"));
            // As above: the collectives of DSA-CP and DCP run without the GIL.
            nb::gil_scoped_release nogil;
            return self.forward(hidden, kv, &md, output, topk_buffer);
          },
          "hidden"_a, "kv_cache"_a, "step"_a.none(), "swa"_a.none(), "output"_a, nb::kw_only(),
          "attention"_a = nb::none(), "compressor_state"_a = nb::none(), "indexer_cache"_a = nb::none(),
          "indexer_state"_a = nb::none(), "topk_buffer"_a.none() = nb::none(),
          "docs/design/dsa.md §5.1 with the step and group metadata (routed here, as route_layer). step=None: profiling run "
          "(output zero-filled). Returns output.")
      .def_prop_ro("last_topk", [](const dsa::Impl& i) { return i.last_topk(); })
      .def_prop_ro(
          "stream_log",
          [](const dsa::Impl& i) {
            nb::list out;
            for (const dsa::StreamLogEntry& e : i.stream_log()) {
              out.append(nb::make_tuple(std::string(e.part), e.role == dsa::StreamRole::Side ? "side" : "main",
                                        e.stream_id));
            }
            return out;
          },
          "docs/design/dsa.md §5.5: the last forward's parts in issue order as (part, 'main' | 'side', c10 stream id) "
          "(log_streams=True; empty otherwise)")
      .def_prop_ro("w8a8_prolog", &dsa::Impl::w8a8_prolog,
                   "True when wq_a / wq_b / wkv are W8A8-dynamic (weights wq_a_scale, wq_b_scale, wkv_scale given)")
      .def_prop_ro("compress_ratio", [](const dsa::Impl& i) { return i.config().compress_ratio; })
      .def_prop_ro("dsa_cp_world_size", &dsa::Impl::dsa_cp_world_size)
      .def_prop_ro("wo_a", [](const dsa::Impl& i) { return i.wo_a(); },
                   "wo_a as the layer holds it now (under DSA-CP: its shard outside the full-weight switch)")
      .def_prop_ro("wo_b", [](const dsa::Impl& i) { return i.wo_b(); })
      .def("o_proj_full_pool", &dsa::Impl::o_proj_full_pool, "index"_a,
           "DSA-CP: the full-weight switch's static pool of wo_a (0) or wo_b (1)")
      .def_prop_ro(
          "o_proj", [](const dsa::Impl& i) { return std::string(dsa::to_string(i.o_proj())); },
          "The o_proj the layer runs: 'MxFp8QuantBmm' (A5 plan and weights['wo_a_scale'] given) or 'Bmm'.");

  m.def(
      "compose_kv_cache",
      [](const std::string& device_kind, const std::optional<std::string>& cache_dtype, const std::string& model_dtype,
         const std::optional<at::Tensor>& compress_kv, const at::Tensor& swa_kv, const std::optional<at::Tensor>& state,
         const std::optional<at::Tensor>& indexer_state, const std::optional<at::Tensor>& indexer_k,
         const std::optional<at::Tensor>& indexer_scale, const std::optional<at::Tensor>& indexer_full) {
        auto t = [](const std::optional<at::Tensor>& x) { return x.value_or(at::Tensor()); };
        const std::vector<at::Tensor> v =
            dsa::compose_kv_cache(plan_from(device_kind, cache_dtype, model_dtype), t(compress_kv), swa_kv, t(state),
                                  t(indexer_state), t(indexer_k), t(indexer_scale), t(indexer_full));
        nb::list out;
        for (const at::Tensor& x : v) {
          if (x.defined()) out.append(nb::cast(x)); else out.append(nb::none());
        }
        return nb::tuple(out);
      },
      nb::kw_only(), "device_kind"_a = "a2", "cache_dtype"_a = nb::none(), "model_dtype"_a = "bfloat16",
      "compress_kv"_a = nb::none(), "swa_kv"_a, "state"_a = nb::none(), "indexer_state"_a = nb::none(),
      "indexer_k"_a = nb::none(), "indexer_scale"_a = nb::none(), "indexer_full"_a = nb::none(),
      "docs/design/dsa.md §2.3: the per-layer tuple (compress_kv, swa_kv, state, indexer_state, indexer_k, indexer_scale"
      "[, indexer_full]); None for unused slots.");
}

void bind_dsa_all(nb::module_& root) {
  bind_dsa(root);
  nb::module_ m = nb::borrow<nb::module_>(root.attr("dsa"));
  bind_dsa_builders(m);
  bind_dsa_impl(m);
}

const BindingRegistrar kRegisterDsa(/*order=*/50, &bind_dsa_all);
}  // namespace
}  // namespace aar::bindings
