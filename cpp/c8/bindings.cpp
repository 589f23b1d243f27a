// Python facade of the C8 (INT8 KV cache) backend: construction, forward, the
// prepared scales, the quantisation helpers and the decode call's FIA
// arguments (what a graph capture records). No logic.
#include <ATen/ATen.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "ascend_attn_rt/c8/backend.h"
#include "ascend_attn_rt/c8/impl.h"
#include "ascend_attn_rt/c8/quant.h"
#include "ascend_attn_rt/c8/scales.h"
#include "../bindings/common.h"
#include "../bindings/tensor_caster.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace aar::bindings {


namespace {

c8::KvTransferRole parse_role(const std::string& s) {
  if (s == "none") return c8::KvTransferRole::None;
  if (s == "producer") return c8::KvTransferRole::Producer;
  if (s == "consumer") return c8::KvTransferRole::Consumer;
  throw_invalid("kv_transfer must be 'none', 'producer' or 'consumer', got '", s, "'");
}

at::ScalarType parse_dtype(const std::string& s) {
  if (s == "float32") return at::kFloat;
  if (s == "float16") return at::kHalf;
  if (s == "bfloat16") return at::kBFloat16;
  throw_invalid("dtype must be 'float32', 'float16' or 'bfloat16', got '", s, "'");
}

nb::dict decode_call_dict(const c8::DecodeCall& c) {
  nb::dict d;
  const auto& t = c.tensors;
  const auto& p = c.params;
  d["query"] = t.query;
  d["key"] = t.key;
  d["value"] = t.value;
  d["block_table"] = *t.block_table;
  d["key_antiquant_scale"] = *t.key_antiquant_scale;
  d["value_antiquant_scale"] = *t.value_antiquant_scale;
  d["key_antiquant_offset"] = t.key_antiquant_offset ? nb::cast(*t.key_antiquant_offset) : nb::none();
  d["value_antiquant_offset"] = t.value_antiquant_offset ? nb::cast(*t.value_antiquant_offset) : nb::none();
  d["actual_seq_lengths_kv"] = std::vector<int64_t>(p.actual_seq_lengths_kv.begin(), p.actual_seq_lengths_kv.end());
  d["num_heads"] = p.num_heads;
  d["num_key_value_heads"] = p.num_key_value_heads;
  d["scale"] = p.scale;
  d["input_layout"] = std::string(p.input_layout.data(), p.input_layout.size());
  d["sparse_mode"] = p.sparse_mode;
  d["inner_precise"] = p.inner_precise;
  d["block_size"] = p.block_size;
  d["antiquant_mode"] = p.antiquant_mode;
  d["key_antiquant_mode"] = p.key_antiquant_mode;
  d["value_antiquant_mode"] = p.value_antiquant_mode;
  d["output"] = c.output;
  return d;
}

void bind_c8(nb::module_& m) {
  nb::class_<c8::Backend>(m, "C8Backend")
      .def_static("name", &c8::Backend::name)
      .def_static("supported_block_sizes", &c8::Backend::supported_block_sizes)
      .def_static("kv_cache_shape", &c8::Backend::kv_cache_shape, "num_blocks"_a, "block_size"_a, "num_kv_heads"_a,
                  "head_size"_a)
      .def_static("kv_cache_stride_order", &c8::Backend::kv_cache_stride_order,
                  "include_num_layers_dimension"_a = false);

  nb::class_<c8::Scales>(m, "C8Scales")
      .def_prop_ro("k_scale", [](const c8::Scales& s) { return s.k_scale; })
      .def_prop_ro("k_offset", [](const c8::Scales& s) { return s.k_offset; })
      .def_prop_ro("v_scale", [](const c8::Scales& s) { return s.v_scale; })
      .def_prop_ro("v_offset", [](const c8::Scales& s) { return s.v_offset; })
      .def_prop_ro("k_inv_scale", [](const c8::Scales& s) { return s.k_inv_scale; })
      .def_prop_ro("v_inv_scale", [](const c8::Scales& s) { return s.v_inv_scale; })
      .def_prop_ro("k_antiquant_scale", [](const c8::Scales& s) { return s.k_antiquant_scale; })
      .def_prop_ro("v_antiquant_scale", [](const c8::Scales& s) { return s.v_antiquant_scale; })
      .def_prop_ro("k_antiquant_offset", [](const c8::Scales& s) { return s.k_antiquant_offset; })
      .def_prop_ro("v_antiquant_offset", [](const c8::Scales& s) { return s.v_antiquant_offset; })
      .def_ro("has_offset", &c8::Scales::has_offset);

  m.def(
      "c8_prepare_scales",
      [](const at::Tensor& k_scale, const at::Tensor& k_offset, const at::Tensor& v_scale,
         const at::Tensor& v_offset, int64_t num_kv_heads, int64_t head_size, int64_t tp_rank, int64_t tp_size) {
        return c8::prepare_scales({k_scale, k_offset, v_scale, v_offset}, num_kv_heads, head_size, tp_rank, tp_size);
      },
      "k_scale"_a, "k_offset"_a, "v_scale"_a, "v_offset"_a, nb::kw_only(), "num_kv_heads"_a, "head_size"_a,
      "tp_rank"_a = 0, "tp_size"_a = 1);
  m.def("c8_quantize", &c8::quantize, "x"_a, "inv_scale"_a, "offset"_a);
  m.def(
      "c8_dequant_paged_to_dense",
      [](const at::Tensor& cache, const at::Tensor& block_table, const std::vector<int64_t>& seq_lens,
         const at::Tensor& scale, const at::Tensor& offset, const std::string& dtype) {
        AAR_CHECK_ARG(scale.defined() && scale.dim() >= 2, "scale must have shape (..., num_kv_heads, head_size), got ",
                      scale.defined() ? scale.sizes() : c10::IntArrayRef{});
        const at::Tensor nz = c8::nz_view(cache, scale.size(-2), scale.size(-1), "cache");
        return c8::dequant_paged_to_dense(nz, block_table, seq_lens, scale, offset, parse_dtype(dtype));
      },
      "cache"_a, "block_table"_a, "seq_lens"_a, "scale"_a, "offset"_a, "dtype"_a = "float32");

  nb::class_<c8::AttentionImpl>(m, "C8AttentionImpl")
      .def(
          "__init__",
          [](c8::AttentionImpl* self, int64_t num_heads, int64_t head_size, std::optional<at::Tensor> k_scale,
             std::optional<at::Tensor> k_offset, std::optional<at::Tensor> v_scale,
             std::optional<at::Tensor> v_offset, double scale, int64_t num_kv_heads,
             std::optional<int64_t> sliding_window, std::optional<at::Tensor> sinks,
             std::optional<at::Tensor> alibi_slopes, std::optional<double> logits_soft_cap,
             const std::string& attn_type, bool kv_sharing, const std::string& kv_transfer,
             const std::string& device_kind, int64_t tp_rank, int64_t tp_size, int64_t layer_index,
             int32_t kv_cache_group) {
            c8::ImplConfig c;
            c.layer_index = layer_index;
            c.kv_cache_group = kv_cache_group;
            c.num_heads = num_heads;
            c.head_size = head_size;
            c.scale = scale;
            c.num_kv_heads = num_kv_heads;
            c.sliding_window = sliding_window;
            c.has_sinks = sinks.has_value();
            c.has_alibi_slopes = alibi_slopes.has_value();
            c.logits_soft_cap = logits_soft_cap;
            c.attn_type = parse_attn_type(attn_type);
            c.kv_sharing = kv_sharing;
            c.kv_transfer = parse_role(kv_transfer);
            c.device_kind = parse_device_kind(device_kind);
            c.tp_rank = tp_rank;
            c.tp_size = tp_size;
            if (k_scale) c.scales.k_scale = *k_scale;
            if (k_offset) c.scales.k_offset = *k_offset;
            if (v_scale) c.scales.v_scale = *v_scale;
            if (v_offset) c.scales.v_offset = *v_offset;
            new (self) c8::AttentionImpl(c);
          },
          "num_heads"_a, "head_size"_a, nb::kw_only(), "k_scale"_a = nb::none(), "k_offset"_a = nb::none(),
          "v_scale"_a = nb::none(), "v_offset"_a = nb::none(), "scale"_a = 0.0, "num_kv_heads"_a = 0,
          "sliding_window"_a = nb::none(), "sinks"_a = nb::none(), "alibi_slopes"_a = nb::none(),
          "logits_soft_cap"_a = nb::none(), "attn_type"_a = "decoder", "kv_sharing"_a = false,
          "kv_transfer"_a = "none", "device_kind"_a = "a2", "tp_rank"_a = 0, "tp_size"_a = 1, "layer_index"_a = -1,
          "kv_cache_group"_a = 0)
      .def(
          "forward",
          [](c8::AttentionImpl& impl, const at::Tensor& query, const std::optional<at::Tensor>& key,
             const std::optional<at::Tensor>& value, const std::optional<at::Tensor>& key_cache,
             const std::optional<at::Tensor>& value_cache, const gqa::Metadata* metadata,
             const at::Tensor& output) -> at::Tensor {
            static const at::Tensor undefined;
            return impl.forward(query, key, value, key_cache ? *key_cache : undefined,
                                value_cache ? *value_cache : undefined, metadata, output);
          },
          "query"_a, "key"_a.none(), "value"_a.none(), "key_cache"_a.none(), "value_cache"_a.none(),
          "metadata"_a.none(), "output"_a)
      .def(
          "decode_call",
          [](c8::AttentionImpl& impl, const at::Tensor& query, const gqa::Metadata& md, int64_t num_decodes,
             const at::Tensor& output) { return decode_call_dict(impl.decode_call(query, md, num_decodes, output)); },
          "query"_a, "metadata"_a, "num_decodes"_a, "output"_a)
      .def_prop_ro("scales", &c8::AttentionImpl::scales, nb::rv_policy::reference_internal)
      .def_prop_ro("last_path", [](const c8::AttentionImpl& i) { return std::string(c8::to_string(i.last_path())); })
      .def_prop_ro("num_heads", [](const c8::AttentionImpl& i) { return i.config().num_heads; })
      .def_prop_ro("num_kv_heads", [](const c8::AttentionImpl& i) { return i.config().num_kv_heads; })
      .def_prop_ro("head_size", [](const c8::AttentionImpl& i) { return i.config().head_size; })
      .def_prop_ro("scale", [](const c8::AttentionImpl& i) { return i.config().scale; });
}

const BindingRegistrar kRegisterC8(/*order=*/20, &bind_c8);

}  // namespace

}  // namespace aar::bindings
