// Python facade of the checkpoint weight loaders (dsa/checkpoint.h,
// sfa/checkpoint.h): aar.dsa.weights_from_checkpoint returns the dict that
// aar.dsa.Impl(weights=...) takes; aar.sfa.weights_from_checkpoint the
// keyword arguments of aar.sfa.Impl's weights. No logic beyond argument
// conversion.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <map>
#include <optional>
#include <string>

#include "ascend_attn_rt/dsa/checkpoint.h"
#include "ascend_attn_rt/sfa/checkpoint.h"
#include "common.h"
#include "tensor_caster.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace aar::bindings {
namespace {

std::map<std::string, at::Tensor> state_map(const nb::dict& state) {
  std::map<std::string, at::Tensor> m;
  for (auto [k, v] : state) {
    if (!nb::isinstance<nb::str>(k)) {
      throw nb::value_error(("state_dict keys must be str, got " + std::string(nb::inst_name(k).c_str())).c_str());
    }
    const std::string key = nb::cast<std::string>(k);
    m.emplace(key, borrow_tensor(v, ("state_dict['" + key + "']").c_str(), false));
  }
  return m;
}

void put(nb::dict& d, const char* name, const at::Tensor& t) {
  if (t.defined()) d[name] = t;
}

void bind_checkpoint(nb::module_& root) {
  nb::module_ dsa_m = nb::borrow<nb::module_>(root.attr("dsa"));
  dsa_m.def(
      "weights_from_checkpoint",
      [](const nb::dict& state, const std::string& prefix, int64_t hidden_size, int64_t num_heads, int64_t head_dim,
         int64_t q_lora_rank, int32_t compress_ratio, int64_t index_n_heads, int64_t index_head_dim, int64_t o_groups,
         int64_t o_lora_rank) {
        dsa::ImplConfig c;
        c.hidden_size = hidden_size;
        c.num_heads = num_heads;
        c.head_dim = head_dim;
        c.q_lora_rank = q_lora_rank;
        c.compress_ratio = compress_ratio;
        c.index_n_heads = index_n_heads;
        c.index_head_dim = index_head_dim;
        c.o_groups = o_groups;
        c.o_lora_rank = o_lora_rank;
        const dsa::Weights w = dsa::weights_from_checkpoint(state_map(state), prefix, c);
        nb::dict d;
        put(d, "wq_a", w.wq_a);
        put(d, "q_norm", w.q_norm);
        put(d, "wq_b", w.wq_b);
        put(d, "wq_a_scale", w.wq_a_scale);
        put(d, "wq_b_scale", w.wq_b_scale);
        put(d, "wkv_scale", w.wkv_scale);
        put(d, "wkv", w.wkv);
        put(d, "kv_norm", w.kv_norm);
        put(d, "attn_sink", w.attn_sink);
        put(d, "wo_a", w.wo_a);
        put(d, "wo_b", w.wo_b);
        put(d, "cmp_wkv", w.cmp_wkv);
        put(d, "cmp_wgate", w.cmp_wgate);
        put(d, "cmp_ape", w.cmp_ape);
        put(d, "cmp_norm", w.cmp_norm);
        put(d, "idx_wq_b", w.idx_wq_b);
        put(d, "idx_weights_proj", w.idx_weights_proj);
        put(d, "idx_cmp_wkv", w.idx_cmp_wkv);
        put(d, "idx_cmp_wgate", w.idx_cmp_wgate);
        put(d, "idx_cmp_ape", w.idx_cmp_ape);
        put(d, "idx_cmp_norm", w.idx_cmp_norm);
        return d;
      },
      "state_dict"_a, "prefix"_a = "", nb::kw_only(), "hidden_size"_a, "num_heads"_a, "head_dim"_a = 512,
      "q_lora_rank"_a, "compress_ratio"_a = 1, "index_n_heads"_a = 64, "index_head_dim"_a = 128, "o_groups"_a = 1,
      "o_lora_rank"_a,
      "One DeepSeek-V4 attention layer's weights from a checkpoint's names (dsa/checkpoint.h: DeepSeek's published "
      "names or transformers'), as the dict Impl(weights=...) takes. prefix selects the layer (e.g. "
      "'layers.3.attn.'); the dims are Impl's. ValueError lists missing / unexpected / misshapen keys.");

  nb::module_ sfa_m = nb::borrow<nb::module_>(root.attr("sfa"));
  sfa_m.def(
      "weights_from_checkpoint",
      [](const nb::dict& state, const std::string& prefix, int64_t num_heads, int64_t hidden_size,
         std::optional<int64_t> q_lora_rank, int64_t kv_lora_rank, int64_t qk_nope_head_dim, int64_t qk_rope_head_dim,
         int64_t v_head_dim, std::optional<int64_t> index_n_head, int64_t index_head_dim) {
        sfa::ImplConfig c;
        c.dims = {num_heads, hidden_size, q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim};
        if (index_n_head.has_value()) {
          sfa::IndexerConfig ic;
          ic.n_head = *index_n_head;
          ic.head_dim = index_head_dim;
          c.indexer = ic;
        }
        const sfa::CheckpointWeights cw = sfa::weights_from_checkpoint(state_map(state), prefix, c);
        const mla::Weights& w = cw.weights;
        nb::dict d;
        if (w.q_a_proj.has_value()) put(d, "q_a_proj", *w.q_a_proj);
        if (w.q_a_layernorm.has_value()) put(d, "q_a_layernorm", *w.q_a_layernorm);
        put(d, "q_proj", w.q_proj);
        put(d, "kv_a_proj_with_mqa", w.kv_a_proj_with_mqa);
        put(d, "kv_a_layernorm", w.kv_a_layernorm);
        put(d, "kv_b_proj", w.kv_b_proj);
        put(d, "o_proj", w.o_proj);
        if (w.quant.has_value()) d["quant"] = nb::cast(*w.quant);  // an MXFP8 checkpoint's projections
        if (cw.indexer.has_value()) {
          put(d, "indexer_wq_b", cw.indexer->wq_b);
          put(d, "indexer_wk", cw.indexer->wk);
          put(d, "indexer_weights_proj", cw.indexer->weights_proj);
          put(d, "indexer_k_norm_weight", cw.indexer->k_norm_weight);
          put(d, "indexer_k_norm_bias", cw.indexer->k_norm_bias);
        }
        return d;
      },
      "state_dict"_a, "prefix"_a = "", nb::kw_only(), "num_heads"_a, "hidden_size"_a, "q_lora_rank"_a = nb::none(),
      "kv_lora_rank"_a, "qk_nope_head_dim"_a, "qk_rope_head_dim"_a, "v_head_dim"_a, "index_n_head"_a = nb::none(),
      "index_head_dim"_a = 128,
      "One DeepSeek-V3.2 attention layer's weights from a checkpoint's names (sfa/checkpoint.h), as the keyword "
      "arguments Impl(**weights, ...) takes (indexer_* only with index_n_head; an MXFP8 checkpoint's q_a_proj, "
      "kv_a_proj_with_mqa and q_b_proj as quant=QuantWeights(\"mxfp8\", ...)). prefix selects the layer (e.g. "
      "'model.layers.3.self_attn.'); the dims are Impl's. ValueError lists missing / unexpected / misshapen keys.");
}

const BindingRegistrar kRegisterCheckpoint(/*order=*/60, &bind_checkpoint);
}  // namespace
}  // namespace aar::bindings
