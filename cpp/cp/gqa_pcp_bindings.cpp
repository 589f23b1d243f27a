// _C.cp: the GQA PCP builder and layer (include/ascend_attn_rt/cp/gqa_pcp.h).
// Construction, build and forward only.
#include <ATen/ATen.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <string>
#include <vector>

#include "ascend_attn_rt/comm/comm.h"
#include "ascend_attn_rt/cp/gqa_pcp.h"
#include "../bindings/common.h"
#include "../bindings/tensor_caster.h"

namespace aar::bindings {
namespace {

namespace nb = nanobind;
using namespace nb::literals;

plan::PcpKvMode parse_kv_mode(const std::string& s) {
  if (s == "sharded") return plan::PcpKvMode::Sharded;
  if (s == "replicated") return plan::PcpKvMode::Replicated;
  throw_invalid("kv_mode must be 'sharded' (legacy head/tail PCP, KV sharded over PCP x DCP) or 'replicated' "
                "(model-runner v2 PCP, KV replicated), got '", s, "'");
}


const cp::PcpMetadata& live(const cp::PcpMetadata& m) {
  check_current(m.stamp, "metadata");
  return m;
}

cp::PcpBuildInputs pcp_inputs(nb::handle qsl, nb::handle seq_lens, nb::handle bt,
                               const std::optional<at::Tensor>& is_prefilling, int32_t num_input_tokens = 0) {
  const at::Tensor& q = borrow_tensor(qsl, "query_start_loc", false);
  const at::Tensor& s = borrow_tensor(seq_lens, "seq_lens", false);
  const at::Tensor& t = borrow_tensor(bt, "block_table", false);
  cp::PcpBuildInputs in;
  in.query_start_loc = i32_span(q, "query_start_loc");
  in.seq_lens = i32_span(s, "seq_lens");
  in.block_table = i32_span(t, "block_table", 2);
  in.block_table_stride = static_cast<int32_t>(t.size(1));
  in.is_prefilling = bool_span(is_prefilling, "is_prefilling");
  in.num_input_tokens = num_input_tokens;
  return in;
}

void bind_gqa_pcp(nb::module_& m) {
  nb::module_ c = nb::borrow<nb::module_>(m.attr("cp"));

  def_step_counts(nb::class_<cp::PcpMetadata>(c, "PcpMetadata"))
      .def_prop_ro("kv_mode", [](const cp::PcpMetadata& d) {
        return std::string(d.kv_mode == plan::PcpKvMode::Sharded ? "sharded" : "replicated");
      })
      .def_ro("attn_state", &cp::PcpMetadata::attn_state, "the global step's state")
      .def_ro("pcp_size", &cp::PcpMetadata::pcp_size)
      .def_ro("pcp_rank", &cp::PcpMetadata::pcp_rank)
      .def_ro("dcp_size", &cp::PcpMetadata::dcp_size)
      .def_ro("dcp_rank", &cp::PcpMetadata::dcp_rank)
      .def_ro("num_local_tokens", &cp::PcpMetadata::num_local_tokens)
      .def_ro("decode_kernel_rows", &cp::PcpMetadata::decode_kernel_rows,
              "decode rows: one per decode token, plus the padding rows of a padded decode-only step")
      .def_prop_ro("decode_slots", [](const cp::PcpMetadata& d) { return live(d).decode_slots; })
      .def_prop_ro("decode_block_tables", [](const cp::PcpMetadata& d) { return live(d).decode_block_tables; })
      .def_prop_ro("decode_q_ends", [](const cp::PcpMetadata& d) { return to_list(live(d).decode_q_ends); })
      .def_ro("has_context", &cp::PcpMetadata::has_context)
      .def_prop_ro("is_current", [](const cp::PcpMetadata& d) { return d.stamp.current(); })
      .def_prop_ro("padded_slot_mapping", [](const cp::PcpMetadata& d) { return live(d).padded_slot_mapping; })
      .def_prop_ro("restore_idx", [](const cp::PcpMetadata& d) { return live(d).restore_idx; })
      .def_prop_ro("write_slots", [](const cp::PcpMetadata& d) { return live(d).write_slots; })
      .def_prop_ro("decode_kv_lens", [](const cp::PcpMetadata& d) { return to_list(live(d).decode_kv_lens); })
      .def_prop_ro("ctx_kv_lens", [](const cp::PcpMetadata& d) { return to_list(live(d).ctx_kv_lens); })
      .def_prop_ro("local_attn_state", [](const cp::PcpMetadata& d) {
        return live(d).local != nullptr ? std::string(plan::to_string(d.local->attn_state)) : std::string();
      });

  nb::class_<cp::PcpMetadataBuilder>(c, "PcpMetadataBuilder")
      .def(
          "__init__",
          [](cp::PcpMetadataBuilder* self, int32_t max_num_reqs, int32_t max_num_tokens, int32_t max_blocks_per_req,
             int32_t block_size, int32_t num_blocks, int32_t pcp_size, int32_t pcp_rank, int32_t dcp_size,
             int32_t dcp_rank, int32_t interleave_size, const std::string& kv_mode, int32_t num_speculative_tokens,
             const std::string& device, std::optional<bool> separate_device_buffers, int32_t staging_buffers) {
            cp::PcpConfig cfg;
            cfg.max_num_reqs = max_num_reqs;
            cfg.max_num_tokens = max_num_tokens;
            cfg.max_blocks_per_req = max_blocks_per_req;
            cfg.block_size = block_size;
            cfg.num_blocks = num_blocks;
            cfg.pcp_size = pcp_size;
            cfg.pcp_rank = pcp_rank;
            cfg.dcp_size = dcp_size;
            cfg.dcp_rank = dcp_rank;
            cfg.interleave_size = interleave_size;
            cfg.kv_mode = parse_kv_mode(kv_mode);
            cfg.num_speculative_tokens = num_speculative_tokens;
            cfg.device = c10::Device(device);
            cfg.separate_device_buffers = separate_device_buffers;
            cfg.staging_buffers = staging_buffers;
            new (self) cp::PcpMetadataBuilder(cfg);
          },
          nb::kw_only(), "max_num_reqs"_a, "max_num_tokens"_a, "max_blocks_per_req"_a, "block_size"_a = 128,
          "num_blocks"_a, "pcp_size"_a, "pcp_rank"_a, "dcp_size"_a = 1, "dcp_rank"_a = 0, "interleave_size"_a = 1,
          "kv_mode"_a = "sharded", "num_speculative_tokens"_a = 0, "device"_a = "cpu",
          "separate_device_buffers"_a = nb::none(), "staging_buffers"_a = 2)
      .def(
          "build",
          [](cp::PcpMetadataBuilder& b, nb::handle qsl, nb::handle seq_lens, nb::handle bt,
             const std::optional<at::Tensor>& is_prefilling, int32_t num_input_tokens) -> cp::PcpMetadata {
            return b.build(pcp_inputs(qsl, seq_lens, bt, is_prefilling, num_input_tokens));
          },
          "query_start_loc"_a, "seq_lens"_a, "block_table"_a, nb::kw_only(), "is_prefilling"_a = nb::none(),
          "num_input_tokens"_a = 0,
          nb::rv_policy::move, nb::keep_alive<0, 1>(),
          "The global batch (the same on every rank, decodes first) -> this rank's metadata (stale after the "
          "next build).")
      .def(
          "build_for_graph_capture",
          [](cp::PcpMetadataBuilder& b, nb::handle qsl, nb::handle seq_lens, nb::handle bt,
             plan::AttentionState state, const std::optional<at::Tensor>& is_prefilling,
             int32_t num_input_tokens) -> cp::PcpMetadata {
            return b.build_for_graph_capture(pcp_inputs(qsl, seq_lens, bt, is_prefilling, num_input_tokens), state);
          },
          "query_start_loc"_a, "seq_lens"_a, "block_table"_a, nb::kw_only(),
          "state"_a = plan::AttentionState::DecodeOnly, "is_prefilling"_a = nb::none(), "num_input_tokens"_a = 0,
          nb::rv_policy::move, nb::keep_alive<0, 1>(),
          "A decode-only step (DecodeOnly or SpecDecoding, padded to num_input_tokens) for a graph capture; "
          "other states and steps with prefills raise NotImplementedError before anything is built.")
      .def(
          "build_for_drafting",
          [](cp::PcpMetadataBuilder& b, nb::handle qsl, nb::handle seq_lens, nb::handle bt, int32_t draft_index,
             const std::optional<at::Tensor>& is_prefilling) -> cp::PcpMetadata {
            return b.build_for_drafting(pcp_inputs(qsl, seq_lens, bt, is_prefilling), draft_index);
          },
          "query_start_loc"_a, "seq_lens"_a, "block_table"_a, "draft_index"_a, nb::kw_only(),
          "is_prefilling"_a = nb::none(), nb::rv_policy::move, nb::keep_alive<0, 1>(),
          "A draft model's step: build() (the previous metadata becomes stale).")
      .def_prop_ro("local_token_index",
                   [](const cp::PcpMetadataBuilder& b) { return int_tensor(b.local_token_index()); },
                   "int32 (num_local_tokens): the global token of every local row of the latest build, -1 = pad")
      .def_prop_ro("local_positions", [](const cp::PcpMetadataBuilder& b) { return int_tensor(b.local_positions()); },
                   "int32 (num_local_tokens): each local row's position among its request's new tokens");

  nb::class_<cp::PcpAttentionImpl>(c, "PcpAttentionImpl")
      .def(
          "__init__",
          [](cp::PcpAttentionImpl* self, int64_t num_heads, int64_t head_size, cp::Comm* pcp, cp::Comm* dcp,
             double scale, int64_t num_kv_heads, std::optional<int64_t> sliding_window,
             const std::string& device_kind) {
            gqa::ImplConfig cfg;
            cfg.num_heads = num_heads;
            cfg.head_size = head_size;
            cfg.scale = scale;
            cfg.num_kv_heads = num_kv_heads;
            cfg.sliding_window = sliding_window;
            cfg.device_kind = parse_device_kind(device_kind);
            new (self) cp::PcpAttentionImpl(cfg, pcp, dcp);
          },
          "num_heads"_a, "head_size"_a, nb::kw_only(), "pcp"_a, "dcp"_a.none() = nb::none(), "scale"_a = 0.0,
          "num_kv_heads"_a = 0, "sliding_window"_a = nb::none(), "device_kind"_a = "a2", nb::keep_alive<1, 4>(),
          nb::keep_alive<1, 5>())
      .def(
          "forward",
          // The tensors are borrowed from their Python objects (no caster copies), as DcpAttentionImpl's.
          [](cp::PcpAttentionImpl& impl, nb::handle query, nb::handle key, nb::handle value, nb::handle key_cache,
             nb::handle value_cache, const cp::PcpMetadata* md, nb::handle output) -> nb::object {
            const at::Tensor& q = borrow_tensor(query, "query", false);
            const at::Tensor& k = borrow_tensor(key, "key", false);
            const at::Tensor& v = borrow_tensor(value, "value", false);
            const at::Tensor& kc = borrow_tensor(key_cache, "key_cache", false);
            const at::Tensor& vc = borrow_tensor(value_cache, "value_cache", false);
            const at::Tensor& out = borrow_tensor(output, "output", false);
            {
              // The collectives run without the GIL (see cp_bindings.cpp).
              nb::gil_scoped_release nogil;
              impl.forward(q, k, v, kc, vc, md, out);
            }
            return nb::borrow(output);
          },
          "query"_a, "key"_a, "value"_a, "key_cache"_a, "value_cache"_a, "metadata"_a.none(), "output"_a,
          "metadata=None: a profiling run (output zero-filled, no collective).")
      .def_prop_ro("num_heads", [](const cp::PcpAttentionImpl& i) { return i.config().num_heads; })
      .def_prop_ro("num_kv_heads", [](const cp::PcpAttentionImpl& i) { return i.config().num_kv_heads; });
}

const BindingRegistrar kRegisterGqaPcp(/*order=*/910, &bind_gqa_pcp);

}  // namespace
}  // namespace aar::bindings
