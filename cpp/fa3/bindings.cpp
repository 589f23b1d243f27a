// Python facade of the FA3-style backend: construction and forward. No logic.
#include <ATen/ATen.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "ascend_attn_rt/fa3/backend.h"
#include "ascend_attn_rt/fa3/impl.h"
#include "../bindings/common.h"
#include "../bindings/tensor_caster.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace aar::bindings {

namespace {

void bind_fa3(nb::module_& m) {
  nb::class_<fa3::Backend>(m, "FA3Backend")
      .def_static("name", &fa3::Backend::name)
      .def_static("supported_block_sizes", &fa3::Backend::supported_block_sizes)
      .def_static("kv_cache_shape", &fa3::Backend::kv_cache_shape, "num_blocks"_a, "block_size"_a,
                  "num_kv_heads"_a, "head_size"_a)
      .def_static("kv_cache_stride_order", &fa3::Backend::kv_cache_stride_order,
                  "include_num_layers_dimension"_a = false);

  nb::class_<fa3::AttentionImpl>(m, "FA3AttentionImpl")
      .def(
          "__init__",
          [](fa3::AttentionImpl* self, int64_t num_heads, int64_t head_size, double scale, int64_t num_kv_heads,
             std::optional<int64_t> sliding_window, std::optional<at::Tensor> sinks,
             std::optional<at::Tensor> alibi_slopes, std::optional<double> logits_soft_cap,
             const std::string& kv_cache_dtype, const std::string& attn_type, bool kv_sharing, bool enforce_eager,
             bool full_decode_only_graph) {
            fa3::ImplConfig c;
            c.num_heads = num_heads;
            c.head_size = head_size;
            c.scale = scale;
            c.num_kv_heads = num_kv_heads;
            c.sliding_window = sliding_window;
            c.has_sinks = sinks.has_value();
            c.has_alibi_slopes = alibi_slopes.has_value();
            c.logits_soft_cap = logits_soft_cap;
            c.kv_cache_dtype = kv_cache_dtype;
            c.attn_type = parse_attn_type(attn_type);
            c.kv_sharing = kv_sharing;
            c.enforce_eager = enforce_eager;
            c.full_decode_only_graph = full_decode_only_graph;
            new (self) fa3::AttentionImpl(c);
          },
          "num_heads"_a, "head_size"_a, nb::kw_only(), "scale"_a = 0.0, "num_kv_heads"_a = 0,
          "sliding_window"_a = nb::none(), "sinks"_a = nb::none(), "alibi_slopes"_a = nb::none(),
          "logits_soft_cap"_a = nb::none(), "kv_cache_dtype"_a = "auto", "attn_type"_a = "decoder",
          "kv_sharing"_a = false, "enforce_eager"_a = true, "full_decode_only_graph"_a = false)
      .def(
          "forward",
          [](fa3::AttentionImpl& impl, const at::Tensor& query, const std::optional<at::Tensor>& key,
             const std::optional<at::Tensor>& value, const std::optional<at::Tensor>& key_cache,
             const std::optional<at::Tensor>& value_cache, const gqa::Metadata* metadata,
             const at::Tensor& output) -> at::Tensor {
            static const at::Tensor undefined;
            return impl.forward(query, key, value, key_cache ? *key_cache : undefined,
                                value_cache ? *value_cache : undefined, metadata, output);
          },
          "query"_a, "key"_a.none(), "value"_a.none(), "key_cache"_a.none(), "value_cache"_a.none(),
          "metadata"_a.none(), "output"_a)
      .def_prop_ro("last_path", [](const fa3::AttentionImpl& i) { return std::string(fa3::to_string(i.last_path())); })
      .def_prop_ro("last_num_calls", &fa3::AttentionImpl::last_num_calls)
      .def_prop_ro("num_heads", [](const fa3::AttentionImpl& i) { return i.config().num_heads; })
      .def_prop_ro("num_kv_heads", [](const fa3::AttentionImpl& i) { return i.config().num_kv_heads; })
      .def_prop_ro("head_size", [](const fa3::AttentionImpl& i) { return i.config().head_size; })
      .def_prop_ro("scale", [](const fa3::AttentionImpl& i) { return i.config().scale; });
}

const BindingRegistrar kRegisterFa3(/*order=*/30, &bind_fa3);

}  // namespace

}  // namespace aar::bindings
