// _C.DcpMetadataBuilder / DcpMetadata / DcpAttentionImpl: GQA decode context
// parallel (include/ascend_attn_rt/cp/gqa_dcp.h). Construction and entry points only.
#include <ATen/ATen.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "ascend_attn_rt/comm/comm.h"
#include "ascend_attn_rt/cp/gqa_dcp.h"
#include "../bindings/common.h"
#include "../bindings/tensor_caster.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace aar::bindings {
namespace {

std::vector<int64_t> list_of(const gqa::DcpMetadata& m, c10::IntArrayRef a) {
  check_current(m.stamp, "metadata");
  return std::vector<int64_t>(a.begin(), a.end());
}

gqa::DcpBuildInputs dcp_inputs(nb::handle qsl, nb::handle seq_lens, nb::handle bt, int32_t num_input_tokens,
                                const std::optional<at::Tensor>& is_prefilling, int32_t draft_step) {
  const at::Tensor& q = borrow_tensor(qsl, "query_start_loc", false);
  const at::Tensor& s = borrow_tensor(seq_lens, "seq_lens", false);
  const at::Tensor& t = borrow_tensor(bt, "block_table", false);
  gqa::DcpBuildInputs in;
  in.query_start_loc = i32_span(q, "query_start_loc");
  in.seq_lens = i32_span(s, "seq_lens");
  in.block_table = i32_span(t, "block_table", 2);
  in.block_table_stride = static_cast<int32_t>(t.size(1));
  in.num_input_tokens = num_input_tokens;
  in.is_prefilling = bool_span(is_prefilling, "is_prefilling");
  in.draft_step = draft_step;
  return in;
}

void bind_gqa_dcp(nb::module_& m) {
  def_step_counts(nb::class_<gqa::DcpMetadata>(m, "DcpMetadata"))
      .def_ro("attn_state", &gqa::DcpMetadata::attn_state)
      .def_ro("slot_mapping", &gqa::DcpMetadata::slot_mapping)
      .def_ro("decode_kernel_rows", &gqa::DcpMetadata::decode_kernel_rows)
      .def_ro("decode_block_tables", &gqa::DcpMetadata::decode_block_tables)
      .def_prop_ro("decode_q_ends", [](const gqa::DcpMetadata& d) { return list_of(d, d.decode_q_ends); })
      .def_prop_ro("decode_kv_lens", [](const gqa::DcpMetadata& d) { return list_of(d, d.decode_kv_lens); })
      .def_ro("prefill_block_tables", &gqa::DcpMetadata::prefill_block_tables)
      .def_prop_ro("prefill_q_ends", [](const gqa::DcpMetadata& d) { return list_of(d, d.prefill_q_ends); })
      .def_prop_ro("prefill_context_lens",
                   [](const gqa::DcpMetadata& d) { return list_of(d, d.prefill_context_lens); })
      .def_ro("has_context", &gqa::DcpMetadata::has_context)
      .def_ro("local_context_tokens", &gqa::DcpMetadata::local_context_tokens)
      .def_ro("context_token_idx", &gqa::DcpMetadata::context_token_idx)
      .def_ro("num_local_writes", &gqa::DcpMetadata::num_local_writes)
      .def_ro("draft_step", &gqa::DcpMetadata::draft_step)
      .def_prop_ro("dcp_world", [](const gqa::DcpMetadata& d) { return d.shard.world; })
      .def_prop_ro("dcp_rank", [](const gqa::DcpMetadata& d) { return d.shard.rank; })
      .def_prop_ro("interleave", [](const gqa::DcpMetadata& d) { return d.shard.interleave; })
      .def_prop_ro("is_current", [](const gqa::DcpMetadata& d) { return d.stamp.current(); });

  nb::class_<gqa::DcpMetadataBuilder>(m, "DcpMetadataBuilder")
      .def(
          "__init__",
          [](gqa::DcpMetadataBuilder* self, int32_t max_num_reqs, int32_t max_num_tokens,
             int32_t max_blocks_per_req, int32_t block_size, int32_t num_blocks, int32_t dcp_world,
             int32_t dcp_rank, int32_t interleave, int32_t num_speculative_tokens, const std::string& device,
             std::optional<bool> separate_device_buffers, int32_t staging_buffers, bool pd_recompute_scheduler) {
            gqa::DcpBuilderConfig c;
            c.pd_recompute_scheduler = pd_recompute_scheduler;
            c.max_num_reqs = max_num_reqs;
            c.max_num_tokens = max_num_tokens;
            c.max_blocks_per_req = max_blocks_per_req;
            c.block_size = block_size;
            c.num_blocks = num_blocks;
            c.shard = plan::DcpShard{dcp_world, dcp_rank, interleave};
            c.num_speculative_tokens = num_speculative_tokens;
            c.device = c10::Device(device);
            c.separate_device_buffers = separate_device_buffers;
            c.staging_buffers = staging_buffers;
            new (self) gqa::DcpMetadataBuilder(c);
          },
          nb::kw_only(), "max_num_reqs"_a, "max_num_tokens"_a, "max_blocks_per_req"_a, "block_size"_a = 128,
          "num_blocks"_a, "dcp_world"_a, "dcp_rank"_a, "interleave"_a = 1, "num_speculative_tokens"_a = 0,
          "device"_a = "cpu", "separate_device_buffers"_a = nb::none(), "staging_buffers"_a = 2,
          "pd_recompute_scheduler"_a = false)
      .def(
          "build",
          [](gqa::DcpMetadataBuilder& b, nb::handle qsl, nb::handle seq_lens, nb::handle bt, int32_t num_input_tokens,
             const std::optional<at::Tensor>& is_prefilling, int32_t draft_step) -> gqa::DcpMetadata {
            return b.build(dcp_inputs(qsl, seq_lens, bt, num_input_tokens, is_prefilling, draft_step));
          },
          "query_start_loc"_a, "seq_lens"_a, "block_table"_a, nb::kw_only(), "num_input_tokens"_a = 0,
          "is_prefilling"_a = nb::none(), "draft_step"_a = -1, nb::rv_policy::move, nb::keep_alive<0, 1>(),
          "A stamped copy of the builder's metadata; stale after the next build.")
      .def(
          "build_for_graph_capture",
          [](gqa::DcpMetadataBuilder& b, nb::handle qsl, nb::handle seq_lens, nb::handle bt, int32_t num_input_tokens,
             plan::AttentionState state, const std::optional<at::Tensor>& is_prefilling) -> gqa::DcpMetadata {
            return b.build_for_graph_capture(dcp_inputs(qsl, seq_lens, bt, num_input_tokens, is_prefilling, -1),
                                             state);
          },
          "query_start_loc"_a, "seq_lens"_a, "block_table"_a, nb::kw_only(), "num_input_tokens"_a = 0,
          "state"_a = plan::AttentionState::DecodeOnly, "is_prefilling"_a = nb::none(), nb::rv_policy::move,
          nb::keep_alive<0, 1>(),
          "build() for a capture of `state` (DecodeOnly or SpecDecoding; others raise NotImplementedError).")
      .def(
          "build_for_drafting",
          [](gqa::DcpMetadataBuilder& b, nb::handle qsl, nb::handle seq_lens, nb::handle bt, int32_t draft_index,
             int32_t num_input_tokens, const std::optional<at::Tensor>& is_prefilling,
             int32_t draft_step) -> gqa::DcpMetadata {
            return b.build_for_drafting(dcp_inputs(qsl, seq_lens, bt, num_input_tokens, is_prefilling, draft_step),
                                        draft_index);
          },
          "query_start_loc"_a, "seq_lens"_a, "block_table"_a, "draft_index"_a, nb::kw_only(),
          "num_input_tokens"_a = 0, "is_prefilling"_a = nb::none(), "draft_step"_a = -1, nb::rv_policy::move,
          nb::keep_alive<0, 1>(),
          "A draft model's step: build() over the draft step's own seq_lens (draft_step, if given, must equal "
          "draft_index); the previous metadata becomes stale.")
      .def_prop_ro("decode_threshold", &gqa::DcpMetadataBuilder::decode_threshold);

  nb::class_<gqa::DcpAttentionImpl>(m, "DcpAttentionImpl")
      .def(
          "__init__",
          [](gqa::DcpAttentionImpl* self, cp::Comm& comm, int64_t num_heads, int64_t head_size, double scale,
             int64_t num_kv_heads, bool kv_sharing) {
            gqa::ImplConfig c;
            c.num_heads = num_heads;
            c.head_size = head_size;
            c.scale = scale;
            c.num_kv_heads = num_kv_heads;
            c.kv_sharing = kv_sharing;
            new (self) gqa::DcpAttentionImpl(c, comm);
          },
          "comm"_a, "num_heads"_a, "head_size"_a, nb::kw_only(), "scale"_a = 0.0, "num_kv_heads"_a = 0,
          "kv_sharing"_a = false, nb::keep_alive<1, 2>(),
          "comm: the DCP group's aar.cp.Comm (kept alive by the layer).")
      .def(
          "forward",
          [](gqa::DcpAttentionImpl& impl, nb::handle query, nb::handle key, nb::handle value, nb::handle key_cache,
             nb::handle value_cache, const gqa::DcpMetadata* md, nb::handle output) -> nb::object {
            const at::Tensor& k = borrow_tensor(key, "key", true);
            const at::Tensor& v = borrow_tensor(value, "value", true);
            std::optional<at::Tensor> ko, vo;
            if (k.defined()) ko = k;
            if (v.defined()) vo = v;
            const at::Tensor& q = borrow_tensor(query, "query", false);
            const at::Tensor& kc = borrow_tensor(key_cache, "key_cache", true);
            const at::Tensor& vc = borrow_tensor(value_cache, "value_cache", true);
            const at::Tensor& o = borrow_tensor(output, "output", false);
            {
              // Collectives run inside: never with the GIL held (cp_bindings.cpp).
              nb::gil_scoped_release nogil;
              impl.forward(q, ko, vo, kc, vc, md, o);
            }
            return nb::borrow(output);
          },
          "query"_a, "key"_a.none(), "value"_a.none(), "key_cache"_a.none(), "value_cache"_a.none(),
          "metadata"_a.none(), "output"_a, "metadata=None: a profiling run (output zero-filled, no collective).")
      .def_prop_ro("num_heads", [](const gqa::DcpAttentionImpl& i) { return i.config().num_heads; })
      .def_prop_ro("num_kv_heads", [](const gqa::DcpAttentionImpl& i) { return i.config().num_kv_heads; })
      .def_prop_ro("head_size", [](const gqa::DcpAttentionImpl& i) { return i.config().head_size; });
}

const BindingRegistrar kRegisterGqaDcp(/*order=*/910, &bind_gqa_dcp);

}  // namespace
}  // namespace aar::bindings
