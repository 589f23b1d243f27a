// Python facade of the GQA backend: construction, build, forward. No logic
// beyond turning Python arguments into the C++ structs.
#include <ATen/ATen.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "ascend_attn_rt/gqa/backend.h"
#include "ascend_attn_rt/gqa/builder.h"
#include "ascend_attn_rt/gqa/impl.h"
#include "../bindings/common.h"
#include "../bindings/tensor_caster.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace aar::bindings {


namespace {

gqa::BuildInputs make_inputs(const at::Tensor& qsl, const at::Tensor& seq_lens, const at::Tensor& block_table,
                             int32_t num_input_tokens, const std::optional<plan::AttentionState>& attn_state,
                             const std::optional<at::Tensor>& is_prefilling,
                             const std::optional<at::Tensor>& num_spec_tokens, bool causal) {
  gqa::BuildInputs in;
  in.query_start_loc = i32_span(qsl, "query_start_loc");
  in.seq_lens = i32_span(seq_lens, "seq_lens");
  in.block_table = i32_span(block_table, "block_table", 2);
  in.block_table_stride = static_cast<int32_t>(block_table.size(1));
  in.num_input_tokens = num_input_tokens;
  in.attn_state = attn_state;
  in.is_prefilling = bool_span(is_prefilling, "is_prefilling");
  if (num_spec_tokens.has_value()) in.num_spec_tokens = i32_span(*num_spec_tokens, "num_spec_tokens");
  in.causal = causal;
  return in;
}


// The host lists of a metadata live in its builder and hold the latest build:
// reading them through a stale metadata is an error, not another step's values.
const gqa::Metadata& live(const gqa::Metadata& m) {
  check_current(m.stamp, "metadata");
  return m;
}

}  // namespace

namespace {
// A dense-context tensor of the metadata's build, once computed (None before).
at::Tensor dense_field(const gqa::Metadata& m, at::Tensor gqa::DenseContext::*field) {
  const gqa::DenseContext* d = gqa::computed_dense_context(m);
  return d != nullptr ? d->*field : at::Tensor();
}

void bind_gqa(nb::module_& m) {
  nb::class_<gqa::Backend>(m, "Backend")
      .def_static("name", &gqa::Backend::name)
      .def_static("supported_block_sizes", &gqa::Backend::supported_block_sizes)
      .def_static("kv_cache_shape", &gqa::Backend::kv_cache_shape, "num_blocks"_a, "block_size"_a,
                  "num_kv_heads"_a, "head_size"_a)
      .def_static("kv_cache_stride_order", &gqa::Backend::kv_cache_stride_order,
                  "include_num_layers_dimension"_a = false)
      .def_static(
          "swap_blocks",
          [](const at::Tensor& sk, const at::Tensor& sv, at::Tensor dk, at::Tensor dv, const at::Tensor& pairs) {
            gqa::Backend::swap_blocks(sk, sv, dk, dv, pairs);
          },
          "src_key_cache"_a, "src_value_cache"_a, "dst_key_cache"_a, "dst_value_cache"_a, "src_to_dst"_a)
      .def_static("copy_blocks", &gqa::Backend::copy_blocks, "kv_caches"_a, "src_to_dsts"_a);

  def_step_counts(nb::class_<gqa::Metadata>(m, "Metadata"))
      .def_ro("attn_state", &gqa::Metadata::attn_state)
      .def_prop_ro("num_real_reqs", [](const gqa::Metadata& m) { return m.num_reqs; }, "alias of num_reqs")
      .def_ro("num_kernel_tokens", &gqa::Metadata::num_kernel_tokens)
      .def_ro("block_size", &gqa::Metadata::block_size)
      .def_ro("num_blocks", &gqa::Metadata::num_blocks)
      .def_ro("causal", &gqa::Metadata::causal)
      .def_ro("is_pooling", &gqa::Metadata::is_pooling)
      .def_ro("no_context", &gqa::Metadata::no_context)
      .def_ro("prefill_no_context", &gqa::Metadata::prefill_no_context)
      .def_prop_ro("generation", [](const gqa::Metadata& m) { return m.stamp.generation; })
      .def_prop_ro("is_current", [](const gqa::Metadata& m) { return m.stamp.current(); })
      .def_prop_ro("prefill_actual_seq_lengths_q",
                   [](const gqa::Metadata& m) { return to_list(live(m).prefill_actual_seq_lengths_q); })
      .def_prop_ro("dense_valid", [](const gqa::Metadata& m) { return gqa::computed_dense_context(m) != nullptr; })
      .def_prop_ro("dense_slots", [](const gqa::Metadata& m) { return dense_field(m, &gqa::DenseContext::slots); })
      .def_prop_ro("dense_token_rows",
                   [](const gqa::Metadata& m) { return dense_field(m, &gqa::DenseContext::token_rows); })
      .def_prop_ro("dense_prefill_token_rows",
                   [](const gqa::Metadata& m) { return dense_field(m, &gqa::DenseContext::prefill_token_rows); })
      .def_prop_ro("dense_kv_ends", [](const gqa::Metadata& m) {
        const gqa::DenseContext* d = gqa::computed_dense_context(live(m));
        return to_list(d != nullptr ? d->kv_ends : c10::IntArrayRef{});
      })
      .def_prop_ro("dense_prefill_kv_ends", [](const gqa::Metadata& m) {
        const gqa::DenseContext* d = gqa::computed_dense_context(live(m));
        return to_list(d != nullptr ? d->prefill_kv_ends : c10::IntArrayRef{});
      })
      .def_prop_ro("query_start_loc", [](const gqa::Metadata& m) { return m.query_start_loc; })
      .def_prop_ro("seq_lens", [](const gqa::Metadata& m) { return m.seq_lens; })
      .def_prop_ro("block_tables", [](const gqa::Metadata& m) { return m.block_tables; })
      .def_prop_ro("slot_mapping", [](const gqa::Metadata& m) { return m.slot_mapping; })
      .def_prop_ro("attn_mask", [](const gqa::Metadata& m) { return m.attn_mask; })
      .def_prop_ro("actual_seq_lengths_q", [](const gqa::Metadata& m) { return to_list(live(m).actual_seq_lengths_q); })
      .def_prop_ro("seq_lens_list", [](const gqa::Metadata& m) { return to_list(live(m).seq_lens_list); });

  nb::class_<gqa::MetadataBuilder>(m, "MetadataBuilder")
      .def(
          "__init__",
          [](gqa::MetadataBuilder* self, int32_t max_num_reqs, int32_t max_num_tokens, int32_t max_blocks_per_req,
             int32_t block_size, int32_t num_blocks, int32_t num_speculative_tokens, const std::string& spec_method,
             bool chunked_prefill_enabled, bool pooling, bool pad_fia_batch, const std::string& device,
             std::optional<bool> separate_device_buffers, bool uniform_decode_padding, int32_t staging_buffers,
             std::optional<bool> dense_context) {
            gqa::BuilderConfig c;
            c.staging_buffers = staging_buffers;
            c.dense_context = dense_context;
            c.max_num_reqs = max_num_reqs;
            c.max_num_tokens = max_num_tokens;
            c.max_blocks_per_req = max_blocks_per_req;
            c.block_size = block_size;
            c.num_blocks = num_blocks;
            c.num_speculative_tokens = num_speculative_tokens;
            c.spec_method = spec_method_from(spec_method);
            c.chunked_prefill_enabled = chunked_prefill_enabled;
            c.pooling = pooling;
            c.pad_fia_batch = pad_fia_batch;
            c.device = c10::Device(device);
            c.separate_device_buffers = separate_device_buffers;
            c.uniform_decode_padding = uniform_decode_padding;
            new (self) gqa::MetadataBuilder(c);
          },
          nb::kw_only(), "max_num_reqs"_a, "max_num_tokens"_a, "max_blocks_per_req"_a, "block_size"_a = 128,
          "num_blocks"_a, "num_speculative_tokens"_a = 0, "spec_method"_a = "none",
          "chunked_prefill_enabled"_a = true, "pooling"_a = false, "pad_fia_batch"_a = true, "device"_a = "cpu",
          "separate_device_buffers"_a = nb::none(), "uniform_decode_padding"_a = false, "staging_buffers"_a = 2,
          "dense_context"_a = nb::none())
      .def(
          "build",
          // The three arrays are borrowed from their Python objects (no caster copies).
          [](gqa::MetadataBuilder& b, nb::handle qsl, nb::handle seq_lens, nb::handle bt, int32_t num_input_tokens,
             std::optional<plan::AttentionState> attn_state, const std::optional<at::Tensor>& is_prefilling,
             const std::optional<at::Tensor>& num_spec_tokens, bool causal) -> gqa::Metadata {
            return b.build(make_inputs(borrow_tensor(qsl, "query_start_loc", false),
                                       borrow_tensor(seq_lens, "seq_lens", false),
                                       borrow_tensor(bt, "block_table", false), num_input_tokens, attn_state,
                                       is_prefilling, num_spec_tokens, causal));
          },
          "query_start_loc"_a, "seq_lens"_a, "block_table"_a, nb::kw_only(), "num_input_tokens"_a = 0,
          "attn_state"_a = nb::none(), "is_prefilling"_a = nb::none(), "num_spec_tokens"_a = nb::none(),
          "causal"_a = true, nb::rv_policy::move, nb::keep_alive<0, 1>(),
          "A Python object per build (a copy of the builder's metadata, stamped with this build): one kept "
          "past the builder's next build is stale, and forward / graph update reject it.")
      .def(
          "build_for_drafting",
          [](gqa::MetadataBuilder& b, nb::handle qsl, nb::handle seq_lens, nb::handle bt, int32_t draft_index,
             int32_t num_input_tokens, std::optional<plan::AttentionState> attn_state,
             const std::optional<at::Tensor>& is_prefilling, const std::optional<at::Tensor>& num_spec_tokens,
             bool causal) -> gqa::Metadata {
            return b.build_for_drafting(make_inputs(borrow_tensor(qsl, "query_start_loc", false),
                                                    borrow_tensor(seq_lens, "seq_lens", false),
                                                    borrow_tensor(bt, "block_table", false), num_input_tokens,
                                                    attn_state, is_prefilling, num_spec_tokens, causal),
                                        draft_index);
          },
          "query_start_loc"_a, "seq_lens"_a, "block_table"_a, "draft_index"_a, nb::kw_only(),
          "num_input_tokens"_a = 0, "attn_state"_a = nb::none(), "is_prefilling"_a = nb::none(),
          "num_spec_tokens"_a = nb::none(), "causal"_a = true, nb::rv_policy::move, nb::keep_alive<0, 1>(),
          "A draft model's step: build() (the GQA builder keeps no draft lanes, so the previous metadata becomes "
          "stale).")
      .def(
          "build_for_graph_capture",
          [](gqa::MetadataBuilder& b, const at::Tensor& qsl, const at::Tensor& seq_lens, const at::Tensor& bt,
             int32_t num_input_tokens, plan::AttentionState state, bool causal) -> gqa::Metadata {
            return b.build_for_graph_capture(
                make_inputs(qsl, seq_lens, bt, num_input_tokens, std::nullopt, std::nullopt, std::nullopt, causal),
                state);
          },
          "query_start_loc"_a, "seq_lens"_a, "block_table"_a, nb::kw_only(), "num_input_tokens"_a = 0,
          "state"_a = plan::AttentionState::DecodeOnly, "causal"_a = true, nb::rv_policy::move, nb::keep_alive<0, 1>())
      .def_prop_ro("metadata", &gqa::MetadataBuilder::metadata, nb::rv_policy::reference_internal)
      .def_prop_ro("block_table_staging", [](const gqa::MetadataBuilder& b) { return b.block_table_staging(); })
      .def_prop_ro("decode_threshold", &gqa::MetadataBuilder::decode_threshold)
      .def_prop_ro("generation", &gqa::MetadataBuilder::generation)
      .def_prop_ro("reorder_batch_threshold", &gqa::MetadataBuilder::reorder_batch_threshold);

  nb::class_<gqa::AttentionImpl>(m, "AttentionImpl")
      .def(
          "__init__",
          [](gqa::AttentionImpl* self, int64_t num_heads, int64_t head_size, double scale, int64_t num_kv_heads,
             std::optional<int64_t> sliding_window, std::optional<at::Tensor> sinks,
             std::optional<at::Tensor> alibi_slopes, std::optional<double> logits_soft_cap,
             const std::string& kv_cache_dtype, const std::string& attn_type, bool kv_sharing,
             const std::string& device_kind, bool has_speculative_config, bool full_decode_only_graph,
             const std::vector<int32_t>& pa_shape_list, int64_t layer_index, int32_t kv_cache_group) {
            gqa::ImplConfig c;
            c.num_heads = num_heads;
            c.head_size = head_size;
            c.scale = scale;
            c.num_kv_heads = num_kv_heads;
            c.sliding_window = sliding_window;
            c.sinks = sinks;
            c.has_alibi_slopes = alibi_slopes.has_value();
            c.logits_soft_cap = logits_soft_cap;
            c.kv_cache_dtype = kv_cache_dtype;
            c.attn_type = parse_attn_type(attn_type);
            c.kv_sharing = kv_sharing;
            c.device_kind = parse_device_kind(device_kind);
            c.has_speculative_config = has_speculative_config;
            c.full_decode_only_graph = full_decode_only_graph;
            c.pa_shape_list = pa_shape_list;
            c.layer_index = layer_index;
            c.kv_cache_group = kv_cache_group;
            new (self) gqa::AttentionImpl(c);
          },
          "num_heads"_a, "head_size"_a, nb::kw_only(), "scale"_a = 0.0, "num_kv_heads"_a = 0,
          "sliding_window"_a = nb::none(), "sinks"_a = nb::none(), "alibi_slopes"_a = nb::none(),
          "logits_soft_cap"_a = nb::none(), "kv_cache_dtype"_a = "auto", "attn_type"_a = "decoder",
          "kv_sharing"_a = false, "device_kind"_a = "a2", "has_speculative_config"_a = false,
          "full_decode_only_graph"_a = false, "pa_shape_list"_a = std::vector<int32_t>{}, "layer_index"_a = -1,
          "kv_cache_group"_a = 0)
      .def(
          "forward",
          // Arguments are borrowed from the Python objects (no casters, no
          // refcounts) and the output object is returned as passed: the facade
          // adds well under a microsecond to the C++ call.
          [](gqa::AttentionImpl& impl, nb::handle query, nb::handle key, nb::handle value, nb::handle key_cache,
             nb::handle value_cache, const gqa::Metadata* metadata, nb::handle output) -> nb::object {
            const at::Tensor& k = borrow_tensor(key, "key", true);
            const at::Tensor& v = borrow_tensor(value, "value", true);
            std::optional<at::Tensor> ko, vo;
            if (k.defined()) ko = k;
            if (v.defined()) vo = v;
            impl.forward(borrow_tensor(query, "query", false), ko, vo, borrow_tensor(key_cache, "key_cache", true),
                         borrow_tensor(value_cache, "value_cache", true), metadata,
                         borrow_tensor(output, "output", false));
            return nb::borrow(output);
          },
          "query"_a, "key"_a.none(), "value"_a.none(), "key_cache"_a.none(), "value_cache"_a.none(),
          "metadata"_a.none(), "output"_a)
      .def_prop_ro("last_path", [](const gqa::AttentionImpl& i) { return std::string(gqa::to_string(i.last_path())); })
      .def_prop_ro("num_heads", [](const gqa::AttentionImpl& i) { return i.config().num_heads; })
      .def_prop_ro("num_kv_heads", [](const gqa::AttentionImpl& i) { return i.config().num_kv_heads; })
      .def_prop_ro("head_size", [](const gqa::AttentionImpl& i) { return i.config().head_size; })
      .def_prop_ro("scale", [](const gqa::AttentionImpl& i) { return i.config().scale; });
}

const BindingRegistrar kRegisterGqa(/*order=*/10, &bind_gqa);
}  // namespace

}  // namespace aar::bindings
