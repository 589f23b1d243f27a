// Python facade of the SFA backend (submodule `sfa`): backend facts, the cache
// tuple composition, the shared top-k buffer, the metadata builders, and the
// plan layer's build_valid_topk_mask (in `plan`). No logic beyond argument
// conversion.
#include <ATen/ATen.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <string>
#include <utility>

#include "ascend_attn_rt/plan/sfa_plan.h"
#include "ascend_attn_rt/sfa/backend.h"
#include "ascend_attn_rt/sfa/builder.h"
#include "ascend_attn_rt/sfa/impl.h"
#include "ascend_attn_rt/sfa/preprocess.h"
#include "ascend_attn_rt/mla/quant.h"
#include "ascend_attn_rt/sfa/topk_buffer.h"
#include "common.h"
#include "latent_build_inputs.h"
#include "tensor_caster.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace aar::bindings {
namespace {

std::vector<int64_t> to_list(c10::IntArrayRef a) { return std::vector<int64_t>(a.begin(), a.end()); }

// Host lists live in the builder and hold its lane's latest build (see gqa_bindings.cpp).
const sfa::Metadata& live(const sfa::Metadata& m) {
  check_current(m.stamp, "metadata");
  return m;
}

// torch dtypes by name, both ways (the dtypes the SFA facts use).
constexpr std::pair<const char*, at::ScalarType> kDtypes[] = {
    {"float16", at::kHalf},    {"bfloat16", at::kBFloat16}, {"float32", at::kFloat},
    {"int8", at::kChar},       {"float8_e4m3fn", at::kFloat8_e4m3fn}};

at::ScalarType dtype_from(nb::handle h, const char* name) {
  std::string s = nb::str(h).c_str();
  if (s.rfind("torch.", 0) == 0) s = s.substr(6);
  for (const auto& [n, t] : kDtypes) {
    if (s == n) return t;
  }
  throw_invalid(name, " must be torch.float16, torch.bfloat16 or torch.float32, got ", s);
}

nb::object dtype_to(at::ScalarType t) {
  for (const auto& [n, st] : kDtypes) {
    if (st == t) return nb::module_::import_("torch").attr(n);
  }
  throw_invalid("no torch dtype for ", t);
}

nb::list dtypes_to(const std::vector<at::ScalarType>& v) {
  nb::list l;
  for (at::ScalarType t : v) l.append(dtype_to(t));
  return l;
}

void bind_sfa(nb::module_& root) {
  nb::module_ m = root.def_submodule("sfa", "SFA backend (DeepSeek-V3.2 sparse attention): facts, builders");

  nb::class_<sfa::Backend>(m, "Backend")
      .def_static("name", &sfa::Backend::name)
      .def_static("supported_block_sizes", &sfa::Backend::supported_block_sizes)
      .def_static("is_builder_block_size", &sfa::Backend::is_builder_block_size, "block_size"_a)
      .def_static("graph_support", &sfa::Backend::graph_support)
      .def_static("reorder_batch", &sfa::Backend::reorder_batch)
      .def_static("kv_cache_shape", &sfa::Backend::kv_cache_shape, "num_blocks"_a, "block_size"_a,
                  "num_kv_heads"_a, "head_size"_a)
      .def_static("kv_cache_stride_order", &sfa::Backend::kv_cache_stride_order,
                  "include_num_layers_dimension"_a = false)
      .def_static("main_cache_shapes", &sfa::Backend::main_cache_shapes, "num_blocks"_a, "block_size"_a,
                  "sfa_c8"_a = false, "kv_lora_rank"_a = sfa::kKvLoraRank, "qk_rope_head_dim"_a = sfa::kRopeHeadDim)
      .def_static(
          "main_cache_dtypes",
          [](bool sfa_c8, const std::string& device_kind, nb::handle model_dtype) {
            return dtypes_to(sfa::Backend::main_cache_dtypes(sfa_c8, parse_device_kind(device_kind),
                                                             dtype_from(model_dtype, "model_dtype")));
          },
          "sfa_c8"_a = false, "device_kind"_a = "a2", "model_dtype"_a);

  nb::class_<sfa::IndexerBackend>(m, "IndexerBackend")
      .def_static("name", &sfa::IndexerBackend::name)
      .def_static("supported_block_sizes", &sfa::IndexerBackend::supported_block_sizes)
      .def_static("graph_support", &sfa::IndexerBackend::graph_support)
      .def_static("kv_cache_shape", &sfa::IndexerBackend::kv_cache_shape, "num_blocks"_a, "block_size"_a,
                  "num_kv_heads"_a, "head_size"_a)
      .def_static("kv_cache_stride_order", &sfa::IndexerBackend::kv_cache_stride_order,
                  "include_num_layers_dimension"_a = false)
      .def_static("cache_shapes", &sfa::IndexerBackend::cache_shapes, "num_blocks"_a, "block_size"_a,
                  "li_c8"_a = false, "repl"_a = 1, "index_head_dim"_a = sfa::kIndexHeadDim)
      .def_static(
          "cache_dtypes",
          [](bool li_c8, const std::string& device_kind, nb::handle model_dtype) {
            return dtypes_to(sfa::IndexerBackend::cache_dtypes(li_c8, parse_device_kind(device_kind),
                                                               dtype_from(model_dtype, "model_dtype")));
          },
          "li_c8"_a = false, "device_kind"_a = "a2", "model_dtype"_a)
      .def_static(
          "page_bytes",
          [](int64_t block_size, bool li_c8, const std::string& device_kind, nb::handle model_dtype, int64_t repl,
             int64_t index_head_dim) {
            return sfa::IndexerBackend::page_bytes(block_size, li_c8, parse_device_kind(device_kind),
                                                   dtype_from(model_dtype, "model_dtype"), repl, index_head_dim);
          },
          "block_size"_a, "li_c8"_a = false, "device_kind"_a = "a2", "model_dtype"_a, "repl"_a = 1,
          "index_head_dim"_a = sfa::kIndexHeadDim);

  m.def(
      "compose_kv_cache",
      [](const std::vector<at::Tensor>& main, const std::optional<std::vector<at::Tensor>>& indexer, bool sfa_c8,
         bool li_c8) {
        const sfa::ComposedKvCache c =
            sfa::compose_kv_cache(main, indexer.value_or(std::vector<at::Tensor>{}), sfa_c8, li_c8);
        nb::list caches;
        for (const at::Tensor& t : c.caches) caches.append(nb::cast(t));
        nb::object k = c.indexer_k_index < 0 ? nb::none() : nb::cast(c.indexer_k_index);
        nb::object s = c.indexer_scale_index < 0 ? nb::none() : nb::cast(c.indexer_scale_index);
        return nb::make_tuple(nb::tuple(caches), k, s);
      },
      "main_kv_cache"_a, "indexer_kv_cache"_a = nb::none(), nb::kw_only(), "sfa_c8"_a = false, "li_c8"_a = false,
      "Spec 3.1: (composed tuple, indexer_k index or None, indexer_scale index or None); no indexer part: the "
      "main tuple.");

  nb::class_<sfa::TopkBuffer>(m, "TopkBuffer")
      .def(
          "__init__",
          [](sfa::TopkBuffer* self, int64_t max_num_tokens, int64_t index_topk, const std::string& device) {
            new (self) sfa::TopkBuffer(max_num_tokens, index_topk, c10::Device(device));
          },
          "max_num_tokens"_a, "index_topk"_a, nb::kw_only(), "device"_a = "cpu")
      .def_prop_ro("max_num_tokens", &sfa::TopkBuffer::max_num_tokens)
      .def_prop_ro("index_topk", &sfa::TopkBuffer::index_topk)
      .def_prop_ro("buffer", [](const sfa::TopkBuffer& b) { return b.buffer(); })
      .def(
          "view", [](const sfa::TopkBuffer& b, int64_t n) { return b.view(n); }, "num_tokens"_a,
          "(num_tokens, 1, index_topk) view of the first rows, at a stable address.")
      .def(
          "store", [](sfa::TopkBuffer& b, const at::Tensor& t) { return b.store(t); }, "topk"_a,
          "Copy a (T, 1, K) or (T, K) int32 selection into the first T rows; returns view(T).");

  nb::class_<sfa::Metadata>(m, "Metadata")
      .def_ro("attn_state", &sfa::Metadata::attn_state)
      .def_ro("num_reqs", &sfa::Metadata::num_reqs)
      .def_ro("num_kernel_reqs", &sfa::Metadata::num_kernel_reqs)
      .def_ro("num_actual_tokens", &sfa::Metadata::num_actual_tokens)
      .def_ro("num_input_tokens", &sfa::Metadata::num_input_tokens)
      .def_ro("num_decodes", &sfa::Metadata::num_decodes)
      .def_ro("num_decode_tokens", &sfa::Metadata::num_decode_tokens)
      .def_ro("num_prefills", &sfa::Metadata::num_prefills)
      .def_ro("max_query_len", &sfa::Metadata::max_query_len)
      .def_ro("max_seq_len", &sfa::Metadata::max_seq_len)
      .def_ro("block_size", &sfa::Metadata::block_size)
      .def_ro("num_blocks", &sfa::Metadata::num_blocks)
      .def_ro("speculative", &sfa::Metadata::speculative)
      .def_ro("draft_index", &sfa::Metadata::draft_index)
      .def_prop_ro("generation", [](const sfa::Metadata& m) { return m.stamp.generation; })
      .def_prop_ro("is_current", [](const sfa::Metadata& m) { return m.stamp.current(); })
      .def_prop_ro("cum_query_lens", [](const sfa::Metadata& m) { return m.cum_query_lens; })
      .def_prop_ro("seq_lens", [](const sfa::Metadata& m) { return m.seq_lens; })
      .def_prop_ro("block_table", [](const sfa::Metadata& m) { return m.block_table; })
      .def_prop_ro("slot_mapping", [](const sfa::Metadata& m) { return m.slot_mapping; })
      .def_prop_ro("cos", [](const sfa::Metadata& m) { return m.cos; })
      .def_prop_ro("sin", [](const sfa::Metadata& m) { return m.sin; })
      .def_prop_ro("query_start_loc", [](const sfa::Metadata& m) { return m.query_start_loc; })
      .def_prop_ro("seq_lens_list", [](const sfa::Metadata& m) { return to_list(live(m).seq_lens_list); })
      .def_prop_ro("cum_query_lens_list",
                   [](const sfa::Metadata& m) { return to_list(live(m).cum_query_lens_list); });

  nb::class_<sfa::MetadataBuilder>(m, "MetadataBuilder")
      .def(
          "__init__",
          [](sfa::MetadataBuilder* self, int32_t max_num_reqs, int32_t max_num_tokens, int32_t max_blocks_per_req,
             int32_t block_size, int32_t num_blocks, const at::Tensor& cos_table, const at::Tensor& sin_table,
             int32_t num_speculative_tokens, bool chunked_prefill_enabled, bool graph_decode_padding,
             std::optional<int32_t> num_drafts, const std::string& device, std::optional<bool> separate_device_buffers,
             int32_t staging_buffers) {
            sfa::BuilderConfig c;
            c.max_num_reqs = max_num_reqs;
            c.max_num_tokens = max_num_tokens;
            c.max_blocks_per_req = max_blocks_per_req;
            c.block_size = block_size;
            c.num_blocks = num_blocks;
            c.cos_table = cos_table;
            c.sin_table = sin_table;
            c.num_speculative_tokens = num_speculative_tokens;
            c.chunked_prefill_enabled = chunked_prefill_enabled;
            c.graph_decode_padding = graph_decode_padding;
            c.num_drafts = num_drafts;
            c.device = c10::Device(device);
            c.separate_device_buffers = separate_device_buffers;
            c.staging_buffers = staging_buffers;
            new (self) sfa::MetadataBuilder(c);
          },
          nb::kw_only(), "max_num_reqs"_a, "max_num_tokens"_a, "max_blocks_per_req"_a, "block_size"_a = 128,
          "num_blocks"_a, "cos_table"_a, "sin_table"_a, "num_speculative_tokens"_a = 0,
          "chunked_prefill_enabled"_a = true, "graph_decode_padding"_a = false, "num_drafts"_a = nb::none(),
          "device"_a = "cpu", "separate_device_buffers"_a = nb::none(), "staging_buffers"_a = 2)
      .def(
          "build",
          [](sfa::MetadataBuilder& b, nb::handle qsl, nb::handle seq_lens, nb::handle bt, int32_t num_input_tokens,
             std::optional<plan::AttentionState> attn_state,
             const std::optional<at::Tensor>& num_spec_tokens) -> sfa::Metadata {
            // A Python object per build (a copy of the builder's metadata, with
            // this build's stamp): one kept past the next build is rejected as stale.
            return b.build(latent_build_inputs(qsl, seq_lens, bt, num_input_tokens, attn_state, num_spec_tokens));
          },
          "query_start_loc"_a, "seq_lens"_a, "block_table"_a, nb::kw_only(), "num_input_tokens"_a = 0,
          "attn_state"_a = nb::none(), "num_spec_tokens"_a = nb::none(), nb::rv_policy::move, nb::keep_alive<0, 1>())
      .def(
          "build_for_graph_capture",
          [](sfa::MetadataBuilder& b, nb::handle qsl, nb::handle seq_lens, nb::handle bt, int32_t num_input_tokens,
             plan::AttentionState state) -> sfa::Metadata {
            return b.build_for_graph_capture(
                latent_build_inputs(qsl, seq_lens, bt, num_input_tokens, std::nullopt, std::nullopt), state);
          },
          "query_start_loc"_a, "seq_lens"_a, "block_table"_a, nb::kw_only(), "num_input_tokens"_a = 0,
          "state"_a = plan::AttentionState::DecodeOnly, nb::rv_policy::move, nb::keep_alive<0, 1>())
      .def(
          "build_for_drafting",
          [](sfa::MetadataBuilder& b, nb::handle qsl, nb::handle seq_lens, nb::handle bt, int32_t draft_index,
             int32_t num_input_tokens, std::optional<plan::AttentionState> attn_state,
             const std::optional<at::Tensor>& num_spec_tokens) -> sfa::Metadata {
            return b.build_for_drafting(
                latent_build_inputs(qsl, seq_lens, bt, num_input_tokens, attn_state, num_spec_tokens), draft_index);
          },
          "query_start_loc"_a, "seq_lens"_a, "block_table"_a, "draft_index"_a, nb::kw_only(),
          "num_input_tokens"_a = 0, "attn_state"_a = nb::none(), "num_spec_tokens"_a = nb::none(),
          nb::rv_policy::move, nb::keep_alive<0, 1>(),
          "A draft step's metadata, in the draft lane's own buffers and stamp counter: it does not make the main "
          "build's metadata (or another draft index's) stale.")
      .def_prop_ro("metadata", &sfa::MetadataBuilder::metadata, nb::rv_policy::reference_internal)
      .def("draft_metadata", &sfa::MetadataBuilder::draft_metadata, "draft_index"_a, nb::rv_policy::reference_internal)
      .def_prop_ro("block_table_staging", [](const sfa::MetadataBuilder& b) { return b.block_table_staging(); })
      .def_prop_ro("decode_threshold", &sfa::MetadataBuilder::decode_threshold)
      .def_prop_ro("num_drafts", &sfa::MetadataBuilder::num_drafts)
      .def_prop_ro("generation", &sfa::MetadataBuilder::generation)
      .def("draft_generation", &sfa::MetadataBuilder::draft_generation, "draft_index"_a);

  nb::class_<sfa::IndexerMetadataBuilder>(m, "IndexerMetadataBuilder",
                                          "The indexer cache group's builder (spec 4): no metadata of its own; the "
                                          "indexer reads the main group's sfa.Metadata.")
      .def(nb::init<>())
      .def_prop_ro_static("reorder_batch_threshold",
                          [](nb::handle) { return sfa::IndexerMetadataBuilder::reorder_batch_threshold(); })
      .def(
          "build", [](const sfa::IndexerMetadataBuilder&, nb::args, nb::kwargs) { return nb::none(); },
          "Returns None, whatever it is given (upstream's contract).")
      .def(
          "build_for_graph_capture",
          [](const sfa::IndexerMetadataBuilder&, nb::args, nb::kwargs) { return nb::none(); },
          "Returns None.");

  nb::class_<sfa::Impl>(m, "Impl")
      .def(
          "__init__",
          [](sfa::Impl* self, int64_t num_heads, int64_t hidden_size, std::optional<int64_t> q_lora_rank,
             int64_t kv_lora_rank, int64_t qk_nope_head_dim, int64_t qk_rope_head_dim, int64_t v_head_dim,
             std::optional<at::Tensor> q_a_proj, std::optional<at::Tensor> q_a_layernorm,
             std::optional<at::Tensor> q_proj, std::optional<at::Tensor> kv_a_proj_with_mqa,
             const at::Tensor& kv_a_layernorm, const at::Tensor& kv_b_proj, const at::Tensor& o_proj, double scale,
             double q_norm_eps, double kv_norm_eps,
             std::optional<int64_t> index_n_head, int64_t index_head_dim, int64_t index_topk,
             std::optional<at::Tensor> indexer_wq_b, std::optional<at::Tensor> indexer_wk,
             std::optional<at::Tensor> indexer_weights_proj, std::optional<at::Tensor> indexer_k_norm_weight,
             std::optional<at::Tensor> indexer_k_norm_bias, double indexer_k_norm_eps, bool glm_moe_dsa,
             bool use_index_cache, bool sfa_c8, bool li_c8, const std::string& device_kind, int64_t layer_index,
             int64_t workspace_group, std::optional<mla::QuantWeights> quant, bool is_kv_consumer,
             bool is_kv_producer, bool enable_mlapo, bool chunked_q_proj, bool dsa_cp, int64_t dcp_size,
             bool kv_offload) {
            sfa::ImplConfig c;
            c.preprocess.quant = quant.has_value() ? quant->type : mla::QuantType::None;
            c.preprocess.is_kv_consumer = is_kv_consumer;
            c.preprocess.is_kv_producer = is_kv_producer;
            c.preprocess.enable_mlapo = enable_mlapo;
            c.preprocess.enable_sparse_sfa_c8 = sfa_c8;  // the selection follows the layer's SFA C8
            c.preprocess.chunked_q_proj = chunked_q_proj;
            c.preprocess.dsa_cp = dsa_cp;
            c.preprocess.dcp_size = dcp_size;
            c.preprocess.kv_offload = kv_offload;
            c.dims = {num_heads, hidden_size, q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim,
                      v_head_dim};
            c.scale = scale;
            c.q_norm_eps = q_norm_eps;
            c.kv_norm_eps = kv_norm_eps;
            c.use_index_cache = use_index_cache;
            c.sfa_c8 = sfa_c8;
            c.li_c8 = li_c8;
            c.device_kind = parse_device_kind(device_kind);
            c.layer_index = layer_index;
            c.workspace_group = workspace_group;
            std::optional<sfa::IndexerWeights> iw;
            const bool any_idx = indexer_wq_b || indexer_wk || indexer_weights_proj || indexer_k_norm_weight ||
                                 indexer_k_norm_bias;
            if (index_n_head.has_value()) {
              AAR_CHECK_ARG(indexer_wq_b && indexer_wk && indexer_weights_proj && indexer_k_norm_weight &&
                                indexer_k_norm_bias,
                            "an indexer layer (index_n_head given) needs indexer_wq_b, indexer_wk, "
                            "indexer_weights_proj, indexer_k_norm_weight and indexer_k_norm_bias");
              sfa::IndexerConfig ic;
              ic.n_head = *index_n_head;
              ic.head_dim = index_head_dim;
              ic.topk = index_topk;
              ic.k_norm_eps = indexer_k_norm_eps;
              ic.glm_moe_dsa = glm_moe_dsa;
              c.indexer = ic;
              iw = sfa::IndexerWeights{*indexer_wq_b, *indexer_wk, *indexer_weights_proj, *indexer_k_norm_weight,
                                       *indexer_k_norm_bias};
            } else {
              AAR_CHECK_ARG(!any_idx, "indexer weights were given but index_n_head is None (a layer without an "
                            "indexer reuses the top-k buffer)");
            }
            mla::Weights w{q_a_proj,       q_a_layernorm, q_proj.value_or(at::Tensor()),
                           kv_a_proj_with_mqa.value_or(at::Tensor()), kv_a_layernorm, kv_b_proj, o_proj, quant};
            new (self) sfa::Impl(c, w, iw);
          },
          nb::kw_only(), "num_heads"_a, "hidden_size"_a, "q_lora_rank"_a = nb::none(), "kv_lora_rank"_a,
          "qk_nope_head_dim"_a, "qk_rope_head_dim"_a, "v_head_dim"_a, "q_a_proj"_a = nb::none(),
          "q_a_layernorm"_a = nb::none(), "q_proj"_a = nb::none(), "kv_a_proj_with_mqa"_a = nb::none(),
          "kv_a_layernorm"_a, "kv_b_proj"_a, "o_proj"_a, "scale"_a = 0.0, "q_norm_eps"_a = 1e-6,
          "kv_norm_eps"_a = 1e-6, "index_n_head"_a = nb::none(), "index_head_dim"_a = 128, "index_topk"_a = 2048,
          "indexer_wq_b"_a = nb::none(), "indexer_wk"_a = nb::none(), "indexer_weights_proj"_a = nb::none(),
          "indexer_k_norm_weight"_a = nb::none(), "indexer_k_norm_bias"_a = nb::none(),
          "indexer_k_norm_eps"_a = 1e-6, "glm_moe_dsa"_a = false, "use_index_cache"_a = false,
          "sfa_c8"_a = false, "li_c8"_a = false, "device_kind"_a = "a2", "layer_index"_a = -1, "workspace_group"_a = 0,
          "quant"_a = nb::none(), "is_kv_consumer"_a = false, "is_kv_producer"_a = false, "enable_mlapo"_a = false,
          "chunked_q_proj"_a = false, "dsa_cp"_a = false, "dcp_size"_a = 1, "kv_offload"_a = false)
      .def(
          "forward",
          [](sfa::Impl& impl, const at::Tensor& hidden, const std::vector<at::Tensor>& kv_cache,
             const sfa::Metadata* md, const at::Tensor& output, sfa::TopkBuffer* topk) -> at::Tensor {
            return impl.forward(hidden, kv_cache, md, topk, output);
          },
          "hidden_states"_a, "kv_cache"_a, "metadata"_a.none(), "output"_a, "topk_buffer"_a.none() = nb::none())
      .def("release_views", &sfa::Impl::release_views)
      .def_prop_ro("last_topk_source", [](const sfa::Impl& i) { return std::string(sfa::to_string(i.last_topk_source())); })
      .def_prop_ro("last_topk", [](const sfa::Impl& i) { return i.last_topk(); })
      .def_prop_ro("w_uk_t", [](const sfa::Impl& i) { return i.w_uk_t(); })
      .def_prop_ro("w_uv", [](const sfa::Impl& i) { return i.w_uv(); })
      .def_prop_ro("scale", [](const sfa::Impl& i) { return i.config().scale; })
      .def_prop_ro("sfa_c8", [](const sfa::Impl& i) { return i.config().sfa_c8; })
      .def_prop_ro("li_c8", [](const sfa::Impl& i) { return i.config().li_c8; })
      .def_prop_ro("preprocess", [](const sfa::Impl& i) { return std::string(sfa::to_string(i.preprocess())); })
      .def_prop_ro("preprocess_reason", [](const sfa::Impl& i) { return i.preprocess_reason(); })
      .def_prop_ro("last_preprocess",
                   [](const sfa::Impl& i) { return std::string(sfa::to_string(i.last_preprocess())); });

  // Spec 3.2's selection table on its own (sfa/preprocess.h).
  m.def(
      "resolve_preprocess",
      [](const std::string& quant_type, bool has_q_lora, bool is_kv_consumer, bool is_kv_producer, bool enable_mlapo,
         bool enable_sparse_sfa_c8, bool chunked_q_proj, bool dsa_cp, int64_t dcp_size, bool kv_offload) {
        sfa::PreprocessConfig c;
        c.quant = mla::parse_quant_type(quant_type);
        c.has_q_lora = has_q_lora;
        c.is_kv_consumer = is_kv_consumer;
        c.is_kv_producer = is_kv_producer;
        c.enable_mlapo = enable_mlapo;
        c.enable_sparse_sfa_c8 = enable_sparse_sfa_c8;
        c.chunked_q_proj = chunked_q_proj;
        c.dsa_cp = dsa_cp;
        c.dcp_size = dcp_size;
        c.kv_offload = kv_offload;
        const sfa::PreprocessChoice r = sfa::resolve_preprocess(c);
        return std::make_tuple(std::string(sfa::to_string(r.kind)), r.reason);
      },
      nb::kw_only(), "quant_type"_a = "none", "has_q_lora"_a = true, "is_kv_consumer"_a = false,
      "is_kv_producer"_a = false, "enable_mlapo"_a = false, "enable_sparse_sfa_c8"_a = false,
      "chunked_q_proj"_a = false, "dsa_cp"_a = false, "dcp_size"_a = 1, "kv_offload"_a = false,
      "Spec sparse.md 3.2: (\"native\" | \"prolog_v3\" | \"mlapo\", reason).");
  m.def(
      "runtime_preprocess",
      [](const std::string& resolved, plan::AttentionState state, int64_t num_input_tokens) {
        sfa::Preprocess p = sfa::Preprocess::Native;
        if (resolved == "prolog_v3") {
          p = sfa::Preprocess::PrologV3;
        } else if (resolved == "mlapo") {
          p = sfa::Preprocess::Mlapo;
        } else {
          AAR_CHECK_ARG(resolved == "native", "resolved must be \"native\", \"prolog_v3\" or \"mlapo\", got \"",
                        resolved, "\"");
        }
        return std::string(sfa::to_string(sfa::runtime_preprocess(p, state, num_input_tokens)));
      },
      "resolved"_a, "attn_state"_a, "num_input_tokens"_a,
      "The per-call path of a layer that resolved to `resolved` (spec 3.2's downgrade rules).");

  // The plan layer's spec 1.4 mask, next to the other plan functions.
  nb::module_ p = nb::borrow<nb::module_>(root.attr("plan"));
  p.def(
      "build_valid_topk_mask",
      [](const at::Tensor& topk, const at::Tensor& thresholds) {
        check_host_tensor(topk, "topk", at::kInt, topk.dim());
        AAR_CHECK_ARG(topk.dim() >= 1, "topk must have at least one dimension (..., K), got a scalar");
        check_host_tensor(thresholds, "thresholds", at::kInt, thresholds.dim());
        const int64_t K = topk.size(-1);
        AAR_CHECK_ARG(K > 0 && K <= INT32_MAX, "topk's last dimension (K) must be in [1, 2^31), got ", K);
        at::Tensor out = at::empty(topk.sizes(), at::TensorOptions().dtype(at::kBool));
        plan::build_valid_topk_mask(
            {topk.const_data_ptr<int32_t>(), static_cast<size_t>(topk.numel())}, static_cast<int32_t>(K),
            {thresholds.const_data_ptr<int32_t>(), static_cast<size_t>(thresholds.numel())},
            {static_cast<uint8_t*>(out.data_ptr()), static_cast<size_t>(out.numel())});
        return out;
      },
      "topk"_a, "thresholds"_a,
      "Spec 1.4: (topk >= 0) & (topk < threshold of the row), for host int32 topk (..., K) and one int32 "
      "threshold per row (thresholds.numel() == topk.numel() / K); returns a bool tensor of topk's shape.");
}

const BindingRegistrar kRegisterSfa(/*order=*/40, &bind_sfa);
}  // namespace
}  // namespace aar::bindings
