// Python facade of the MLA backend (submodule `mla`): backend facts, weight
// utilities, plan functions, builder, impl. No logic beyond argument conversion.
#include <optional>
#include <ATen/ATen.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include "ascend_attn_rt/comm/comm.h"
#include "ascend_attn_rt/mla/backend.h"
#include "ascend_attn_rt/mla/builder.h"
#include "ascend_attn_rt/mla/impl.h"
#include "ascend_attn_rt/mla/latent_attention.h"
#include "ascend_attn_rt/latent/quant.h"
#include "ascend_attn_rt/latent/weights.h"
#include "ascend_attn_rt/mla/plan/mla_plan.h"
#include "../bindings/common.h"
#include "../latent/bindings_build_inputs.h"
#include "../bindings/tensor_caster.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace aar::bindings {
namespace {


// Host lists live in the builder and hold its latest build (see gqa_bindings.cpp).
const mla::Metadata& live(const mla::Metadata& m) {
  check_current(m.stamp, "metadata");
  return m;
}

void bind_mla(nb::module_& root) {
  nb::module_ m = root.def_submodule("mla", "MLA backend (DeepSeek V2/V3 multi-head latent attention)");

  nb::class_<mla::Backend>(m, "Backend")
      .def_static("name", &mla::Backend::name)
      .def_static("supported_block_sizes", &mla::Backend::supported_block_sizes)
      .def_static("kv_cache_shape", &mla::Backend::kv_cache_shape, "num_blocks"_a, "block_size"_a,
                  "num_kv_heads"_a, "head_size"_a)
      .def_static("kv_cache_stride_order", &mla::Backend::kv_cache_stride_order,
                  "include_num_layers_dimension"_a = false)
      .def_static("kv_cache_shapes", &mla::Backend::kv_cache_shapes, "num_blocks"_a, "block_size"_a,
                  "kv_lora_rank"_a, "qk_rope_head_dim"_a)
      .def_static("nz_cache_shape", &mla::Backend::nz_cache_shape, "num_blocks"_a, "block_size"_a, "dim"_a,
                  "element_size"_a)
      .def_static("to_nz", &mla::Backend::to_nz, "nd_cache"_a)
      .def_static("from_nz", &mla::Backend::from_nz, "nz_cache"_a)
      .def_static("num_heads_padded", &mla::Backend::num_heads_padded, "num_heads"_a);

  m.def(
      "split_kv_b_proj",
      [](const at::Tensor& w, int64_t h, int64_t p, int64_t v) {
        auto a = mla::split_kv_b_proj(w, h, p, v);
        return std::make_tuple(a.w_uk_t, a.w_uv);
      },
      "kv_b_proj"_a, "num_heads"_a, "qk_nope_head_dim"_a, "v_head_dim"_a);
  m.def("trans_rope_weight", &mla::trans_rope_weight, "weight"_a, "rope_dim"_a);
  m.def("transdata", &mla::transdata, "nd"_a, "row_block"_a = 16, "col_block"_a = 32);

  m.def(
      "reorder_batch",
      [](const at::Tensor& num_scheduled, int32_t decode_threshold) {
        auto sched = i32_span(num_scheduled, "num_scheduled");
        std::vector<int32_t> perm(sched.size()), swaps(2 * sched.size());
        const int32_t n = plan::mla_reorder_batch(sched, decode_threshold, perm, swaps);
        std::vector<std::tuple<int32_t, int32_t>> pairs;
        for (int32_t i = 0; i < n; ++i) pairs.emplace_back(swaps[2 * i], swaps[2 * i + 1]);
        return std::make_tuple(perm, pairs);
      },
      "num_scheduled"_a, "decode_threshold"_a = 1);
  m.def(
      "plan_context_chunks",
      [](const at::Tensor& context_lens, int64_t workspace_tokens, int32_t block_size, int32_t max_chunks) {
        auto ctx = i32_span(context_lens, "context_lens");
        const size_t np = ctx.size(), cap = static_cast<size_t>(std::max(max_chunks, 1));
        std::vector<int32_t> cu(cap * (np + 1)), starts(cap * np), lens(cap * np);
        std::vector<int64_t> ends(cap * np), tot(cap), mx(cap);
        plan::ContextChunkInputs in;
        in.context_lens = ctx;
        in.workspace_tokens = workspace_tokens;
        in.block_size = block_size;
        in.max_chunks = max_chunks;
        const auto p = plan::plan_context_chunks(in, {cu, starts, lens, ends, tot, mx});
        const size_t C = p.num_chunks;
        auto rows = [&](auto& v, size_t w) {
          using T = typename std::decay_t<decltype(v)>::value_type;
          std::vector<std::vector<T>> out;
          for (size_t c = 0; c < C; ++c) out.emplace_back(v.begin() + c * w, v.begin() + (c + 1) * w);
          return out;
        };
        nb::dict d;
        d["num_chunks"] = p.num_chunks;
        d["chunk_size"] = p.chunk_size;
        d["bounded"] = p.bounded;
        d["cu_seq_lens"] = rows(cu, np + 1);
        d["starts"] = rows(starts, np);
        d["chunk_seq_lens"] = rows(lens, np);
        d["kv_ends"] = rows(ends, np);
        d["seq_tot"] = std::vector<int64_t>(tot.begin(), tot.begin() + C);
        d["max_seq_lens"] = std::vector<int64_t>(mx.begin(), mx.begin() + C);
        return d;
      },
      "context_lens"_a, "workspace_tokens"_a, "block_size"_a, "max_chunks"_a = plan::kMaxContextChunks);
  m.def(
      "pad_actual_q_disable_mode",
      [](const std::vector<int64_t>& q, int32_t num_reqs, int32_t graph_pad_size) {
        std::vector<int64_t> out(q.size() + std::max(0, graph_pad_size - num_reqs));
        out.resize(plan::pad_actual_q_disable_mode(q, num_reqs, graph_pad_size, out));
        return out;
      },
      "actual_q"_a, "num_reqs"_a, "graph_pad_size"_a);
  m.def(
      "pad_actual_q_enable_mode",
      [](const std::vector<int64_t>& q, int32_t num_reqs, int32_t req_pad, const std::vector<int64_t>& ref) {
        std::vector<int64_t> out(q.size() + std::max(0, req_pad));
        out.resize(plan::pad_actual_q_enable_mode(q, num_reqs, req_pad, ref, out));
        return out;
      },
      "actual_q"_a, "num_reqs"_a, "req_pad"_a, "ref"_a);

  // The decode / prefill parts of a Metadata (None when the step has none): what
  // engines that test `metadata.decode is not None` (vLLM's MLAAttention) read.
  nb::class_<mla::DecodeMetadata>(m, "DecodeMetadata")
      .def_ro("num_kernel_reqs", &mla::DecodeMetadata::num_kernel_reqs)
      .def_ro("num_kernel_tokens", &mla::DecodeMetadata::num_kernel_tokens)
      .def_ro("max_seq_len", &mla::DecodeMetadata::max_seq_len)
      .def_prop_ro("block_table", [](const mla::DecodeMetadata& d) { return d.block_table; });
  nb::class_<mla::PrefillMetadata>(m, "PrefillMetadata")
      .def_ro("max_query_len", &mla::PrefillMetadata::max_query_len)
      .def_ro("max_seq_len", &mla::PrefillMetadata::max_seq_len)
      .def_prop_ro("block_table", [](const mla::PrefillMetadata& p) { return p.block_table; })
      .def_prop_ro("num_context_chunks", [](const mla::PrefillMetadata& p) { return p.chunked.num_chunks; });
  def_step_counts(nb::class_<mla::Metadata>(m, "Metadata"))
      .def_prop_ro(
          "decode",
          [](const mla::Metadata& m) -> const mla::DecodeMetadata* { return m.num_decodes > 0 ? &m.decode : nullptr; },
          nb::rv_policy::reference_internal)
      .def_prop_ro(
          "prefill",
          [](const mla::Metadata& m) -> const mla::PrefillMetadata* {
            return m.num_prefills > 0 ? &m.prefill : nullptr;
          },
          nb::rv_policy::reference_internal)
      .def_ro("attn_state", &mla::Metadata::attn_state)
      .def_ro("block_size", &mla::Metadata::block_size)
      .def_prop_ro("generation", [](const mla::Metadata& m) { return m.stamp.generation; })
      .def_prop_ro("is_current", [](const mla::Metadata& m) { return m.stamp.current(); })
      .def_prop_ro("slot_mapping", [](const mla::Metadata& m) { return m.slot_mapping; })
      .def_prop_ro("query_start_loc", [](const mla::Metadata& m) { return m.query_start_loc; })
      .def_prop_ro("decode_seq_lens_list", [](const mla::Metadata& m) { return to_list(live(m).decode.seq_lens_list); })
      .def_prop_ro("decode_actual_seq_lengths_q",
                   [](const mla::Metadata& m) { return to_list(live(m).decode.actual_seq_lengths_q); })
      .def_prop_ro("attn_mask", [](const mla::Metadata& m) { return m.attn_mask; })
      .def_prop_ro("decode_block_table", [](const mla::Metadata& m) { return m.decode.block_table; })
      .def_prop_ro("decode_num_kernel_reqs", [](const mla::Metadata& m) { return m.decode.num_kernel_reqs; })
      .def_prop_ro("decode_num_kernel_tokens", [](const mla::Metadata& m) { return m.decode.num_kernel_tokens; })
      .def_prop_ro("decode_cos", [](const mla::Metadata& m) { return m.decode.cos; })
      .def_prop_ro("decode_sin", [](const mla::Metadata& m) { return m.decode.sin; })
      .def_prop_ro("decode_max_seq_len", [](const mla::Metadata& m) { return m.decode.max_seq_len; })
      .def_prop_ro("prefill_actual_seq_lengths_q",
                   [](const mla::Metadata& m) { return to_list(live(m).prefill.actual_seq_lengths_q); })
      .def_prop_ro("prefill_block_table", [](const mla::Metadata& m) { return m.prefill.block_table; })
      .def_prop_ro("prefill_cos", [](const mla::Metadata& m) { return m.prefill.cos; })
      .def_prop_ro("prefill_sin", [](const mla::Metadata& m) { return m.prefill.sin; })
      .def_prop_ro("prefill_max_query_len", [](const mla::Metadata& m) { return m.prefill.max_query_len; })
      .def_prop_ro("prefill_max_seq_len", [](const mla::Metadata& m) { return m.prefill.max_seq_len; })
      .def_prop_ro("num_context_chunks", [](const mla::Metadata& m) { return m.prefill.chunked.num_chunks; })
      .def_prop_ro("context_chunk_size", [](const mla::Metadata& m) { return m.prefill.chunked.chunk_size; })
      .def_prop_ro("context_seq_tot", [](const mla::Metadata& m) { return to_list(live(m).prefill.chunked.seq_tot); })
      .def_prop_ro("context_kv_ends",
                   [](const mla::Metadata& m) {
                     std::vector<std::vector<int64_t>> r;
                     for (auto a : live(m).prefill.chunked.kv_ends) r.push_back(to_list(a));
                     return r;
                   })
      .def_prop_ro("context_cu_seq_lens", [](const mla::Metadata& m) { return m.prefill.chunked.cu_seq_lens; })
      .def_prop_ro("context_starts", [](const mla::Metadata& m) { return m.prefill.chunked.starts; })
      .def_prop_ro("context_chunk_seq_lens", [](const mla::Metadata& m) { return m.prefill.chunked.chunk_seq_lens; })
      .def_ro("draft_step", &mla::Metadata::draft_step)
      .def_prop_ro("dcp_world_size", [](const mla::Metadata& m) { return m.dcp.world_size; })
      .def_prop_ro("dcp_rank", [](const mla::Metadata& m) { return m.dcp.rank; })
      .def_prop_ro("context_local_chunk_size",
                   [](const mla::Metadata& m) { return m.prefill.chunked.local_chunk_size; })
      .def_prop_ro("context_padded_chunk_seq_lens",
                   [](const mla::Metadata& m) { return m.prefill.chunked.padded_chunk_seq_lens; })
      .def_prop_ro("context_local_seq_tot",
                   [](const mla::Metadata& m) { return to_list(live(m).prefill.chunked.local_seq_tot); })
      .def_prop_ro("context_reorg_index", [](const mla::Metadata& m) { return m.prefill.chunked.reorg_index; })
      .def_prop_ro("context_reorg_offsets",
                   [](const mla::Metadata& m) { return to_list(live(m).prefill.chunked.reorg_offsets); })
      .def_prop_ro("pcp_world_size", [](const mla::Metadata& m) { return m.pcp.world_size; })
      .def_prop_ro("pcp_rank", [](const mla::Metadata& m) { return m.pcp.rank; })
      .def_prop_ro("num_local_tokens", [](const mla::Metadata& m) { return m.pcp.num_local_tokens; })
      .def_prop_ro("num_local_prefill_tokens", [](const mla::Metadata& m) { return m.pcp.num_local_prefill_tokens; })
      .def_prop_ro("pcp_padded_slot_mapping", [](const mla::Metadata& m) { return m.pcp.padded_slot_mapping; })
      .def_prop_ro("pcp_prefill_restore_idx", [](const mla::Metadata& m) { return m.pcp.prefill_restore_idx; })
      .def_prop_ro("pcp_q_head_idx", [](const mla::Metadata& m) { return m.pcp.q_head_idx; })
      .def_prop_ro("pcp_q_tail_idx", [](const mla::Metadata& m) { return m.pcp.q_tail_idx; })
      .def_prop_ro("pcp_kv_head_nomask_idx", [](const mla::Metadata& m) { return m.pcp.kv_head_nomask_idx; })
      .def_prop_ro("pcp_kv_head_mask_idx", [](const mla::Metadata& m) { return m.pcp.kv_head_mask_idx; })
      .def_prop_ro("pcp_kv_tail_nomask_idx", [](const mla::Metadata& m) { return m.pcp.kv_tail_nomask_idx; })
      .def_prop_ro("pcp_kv_tail_mask_idx", [](const mla::Metadata& m) { return m.pcp.kv_tail_mask_idx; })
      .def_prop_ro("pcp_q_full_idx", [](const mla::Metadata& m) { return m.pcp.q_full_idx; })
      .def_prop_ro("pcp_mask_seq_ends", [](const mla::Metadata& m) { return to_list(live(m).pcp.mask_seq_ends); })
      .def_prop_ro("pcp_head_nomask_kv_ends",
                   [](const mla::Metadata& m) { return to_list(live(m).pcp.head_nomask_kv_ends); })
      .def_prop_ro("pcp_tail_nomask_kv_ends",
                   [](const mla::Metadata& m) { return to_list(live(m).pcp.tail_nomask_kv_ends); });

  nb::class_<mla::MetadataBuilder>(m, "MetadataBuilder")
      .def(
          "__init__",
          [](mla::MetadataBuilder* self, int32_t max_num_reqs, int32_t max_num_tokens, int32_t max_blocks_per_req,
             int32_t block_size, int32_t num_blocks, const at::Tensor& cos_table, const at::Tensor& sin_table,
             int32_t max_model_len, int32_t num_speculative_tokens, bool chunked_prefill_enabled,
             int64_t workspace_tokens, const std::string& device, std::optional<bool> separate_device_buffers,
             bool graph_decode_padding, bool disable_padded_drafter_batch, int32_t staging_buffers,
             int32_t dcp_world_size, int32_t dcp_rank, int32_t cp_kv_cache_interleave_size,
             bool pd_recompute_scheduler, int32_t pcp_world_size, int32_t pcp_rank) {
            mla::BuilderConfig c;
            c.pcp_world_size = pcp_world_size;
            c.pcp_rank = pcp_rank;
            c.pd_recompute_scheduler = pd_recompute_scheduler;
            c.dcp_world_size = dcp_world_size;
            c.dcp_rank = dcp_rank;
            c.cp_kv_cache_interleave_size = cp_kv_cache_interleave_size;
            c.staging_buffers = staging_buffers;
            c.graph_decode_padding = graph_decode_padding;
            c.disable_padded_drafter_batch = disable_padded_drafter_batch;
            c.max_num_reqs = max_num_reqs;
            c.max_num_tokens = max_num_tokens;
            c.max_blocks_per_req = max_blocks_per_req;
            c.block_size = block_size;
            c.num_blocks = num_blocks;
            c.cos_table = cos_table;
            c.sin_table = sin_table;
            c.max_model_len = max_model_len;
            c.num_speculative_tokens = num_speculative_tokens;
            c.chunked_prefill_enabled = chunked_prefill_enabled;
            c.workspace_tokens = workspace_tokens;
            c.device = c10::Device(device);
            c.separate_device_buffers = separate_device_buffers;
            new (self) mla::MetadataBuilder(c);
          },
          nb::kw_only(), "max_num_reqs"_a, "max_num_tokens"_a, "max_blocks_per_req"_a, "block_size"_a = 128,
          "num_blocks"_a, "cos_table"_a, "sin_table"_a, "max_model_len"_a = 0, "num_speculative_tokens"_a = 0,
          "chunked_prefill_enabled"_a = true, "workspace_tokens"_a = 0, "device"_a = "cpu",
          "separate_device_buffers"_a = nb::none(), "graph_decode_padding"_a = false,
          "disable_padded_drafter_batch"_a = false, "staging_buffers"_a = 2, "dcp_world_size"_a = 1,
          "dcp_rank"_a = 0, "cp_kv_cache_interleave_size"_a = 1, "pd_recompute_scheduler"_a = false,
          "pcp_world_size"_a = 1, "pcp_rank"_a = 0)
      .def(
          "build",
          [](mla::MetadataBuilder& b, nb::handle qsl, nb::handle seq_lens, nb::handle bt, int32_t num_input_tokens,
             std::optional<plan::AttentionState> attn_state,
             const std::optional<at::Tensor>& num_spec_tokens,
             const std::optional<at::Tensor>& is_prefilling, int32_t draft_step) -> mla::Metadata {
            // A Python object per build (a copy of the builder's metadata, with
            // this build's stamp): one kept past the next build is rejected as stale.
            mla::BuildInputs in = latent_build_inputs(qsl, seq_lens, bt, num_input_tokens, attn_state, num_spec_tokens);
            in.is_prefilling = bool_span(is_prefilling, "is_prefilling");
            in.draft_step = draft_step;
            return b.build(in);
          },
          "query_start_loc"_a, "seq_lens"_a, "block_table"_a, nb::kw_only(), "num_input_tokens"_a = 0,
          "attn_state"_a = nb::none(), "num_spec_tokens"_a = nb::none(), "is_prefilling"_a = nb::none(),
          "draft_step"_a = -1, nb::rv_policy::move, nb::keep_alive<0, 1>())
      .def(
          "build_for_graph_capture",
          [](mla::MetadataBuilder& b, nb::handle qsl, nb::handle seq_lens, nb::handle bt, int32_t num_input_tokens,
             plan::AttentionState state) -> mla::Metadata {
            return b.build_for_graph_capture(
                latent_build_inputs(qsl, seq_lens, bt, num_input_tokens, std::nullopt, std::nullopt), state);
          },
          "query_start_loc"_a, "seq_lens"_a, "block_table"_a, nb::kw_only(), "num_input_tokens"_a = 0,
          "state"_a = plan::AttentionState::DecodeOnly, nb::rv_policy::move, nb::keep_alive<0, 1>(),
          "build() of a batch to capture, the metadata carrying `state`: DecodeOnly or SpecDecoding (others raise "
          "NotImplementedError before anything is built).")
      .def(
          "build_for_drafting",
          [](mla::MetadataBuilder& b, nb::handle qsl, nb::handle seq_lens, nb::handle bt, int32_t draft_index,
             int32_t num_input_tokens, std::optional<plan::AttentionState> attn_state,
             const std::optional<at::Tensor>& num_spec_tokens, const std::optional<at::Tensor>& is_prefilling,
             int32_t draft_step) -> mla::Metadata {
            mla::BuildInputs in = latent_build_inputs(qsl, seq_lens, bt, num_input_tokens, attn_state, num_spec_tokens);
            in.is_prefilling = bool_span(is_prefilling, "is_prefilling");
            in.draft_step = draft_step;
            return b.build_for_drafting(in, draft_index);
          },
          "query_start_loc"_a, "seq_lens"_a, "block_table"_a, "draft_index"_a, nb::kw_only(),
          "num_input_tokens"_a = 0, "attn_state"_a = nb::none(), "num_spec_tokens"_a = nb::none(),
          "is_prefilling"_a = nb::none(), "draft_step"_a = -1, nb::rv_policy::move, nb::keep_alive<0, 1>(),
          "A draft model's step: build() (the MLA builder keeps no draft lanes, so the previous metadata becomes "
          "stale).")
      .def_prop_ro("metadata", &mla::MetadataBuilder::metadata, nb::rv_policy::reference_internal)
      .def_prop_ro("decode_threshold", &mla::MetadataBuilder::decode_threshold)
      .def_prop_ro("block_table_staging", [](const mla::MetadataBuilder& b) { return b.block_table_staging(); })
      .def_prop_ro("workspace_tokens", &mla::MetadataBuilder::workspace_tokens)
      .def_prop_ro("generation", &mla::MetadataBuilder::generation)
      .def_prop_ro(
          "local_token_index",
          [](const mla::MetadataBuilder& b) { return int_tensor(b.pcp_local_token_index()); },
          "PCP: the global token of every local row of the latest build (-1: a padding row), int32; empty without "
          "PCP.");

  // W8A8 weights (latent/quant.h), shared with aar.sfa.
  nb::class_<mla::QuantLinear>(m, "QuantLinear")
      .def(
          "__init__",
          [](mla::QuantLinear* self, const at::Tensor& weight, const at::Tensor& weight_scale,
             std::optional<at::Tensor> input_scale, std::optional<at::Tensor> input_offset,
             std::optional<at::Tensor> quant_bias) {
            new (self) mla::QuantLinear{weight, weight_scale, input_scale, input_offset, quant_bias};
          },
          "weight"_a, "weight_scale"_a, nb::kw_only(), "input_scale"_a = nb::none(), "input_offset"_a = nb::none(),
          "quant_bias"_a = nb::none(),
          "One W8A8 linear: int8 weight (out, in), float32 weight_scale (out); W8A8 static adds input_scale (1), "
          "input_offset (1) int8 and the int32 quant_bias (out). MXFP8: float8_e4m3fn weight (out, in), "
          "weight_scale the e8m0 bytes (out, in / 32), uint8 or float8_e8m0fnu.")
      .def_ro("weight", &mla::QuantLinear::weight)
      .def_ro("weight_scale", &mla::QuantLinear::weight_scale)
      .def_ro("input_scale", &mla::QuantLinear::input_scale)
      .def_ro("input_offset", &mla::QuantLinear::input_offset)
      .def_ro("quant_bias", &mla::QuantLinear::quant_bias);
  nb::class_<mla::QuantWeights>(m, "QuantWeights")
      .def(
          "__init__",
          [](mla::QuantWeights* self, const std::string& quant_type, const mla::QuantLinear& fused_qkv_a_proj,
             const mla::QuantLinear& q_proj) {
            new (self) mla::QuantWeights{mla::parse_quant_type(quant_type), fused_qkv_a_proj, q_proj};
          },
          "quant_type"_a, "fused_qkv_a_proj"_a, "q_proj"_a,
          "The quantised projections of an MLA-family layer: quant_type \"w8a8_dynamic\", \"w8a8_static\" or "
          "\"mxfp8\" (A5; native preprocess only), fused_qkv_a_proj (Q+L+R, hidden) = q_a_proj | "
          "kv_a_proj_with_mqa, q_proj (H*(P+R), Q).")
      .def_prop_ro("quant_type", [](const mla::QuantWeights& q) { return std::string(mla::to_string(q.type)); })
      .def_ro("fused_qkv_a_proj", &mla::QuantWeights::fused_qkv_a_proj)
      .def_ro("q_proj", &mla::QuantWeights::q_proj);
  m.def(
      "prepare_mlapo_weights",
      [](int64_t num_heads, int64_t hidden_size, int64_t q_lora_rank, int64_t kv_lora_rank, int64_t qk_nope_head_dim,
         int64_t qk_rope_head_dim, int64_t v_head_dim, const at::Tensor& q_a_layernorm,
         const at::Tensor& kv_a_layernorm, const at::Tensor& kv_b_proj, const at::Tensor& o_proj,
         const mla::QuantWeights& quant) {
        mla::Dims d{num_heads, hidden_size, q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim,
                    v_head_dim};
        mla::Weights w{std::nullopt, q_a_layernorm, {}, {}, kv_a_layernorm, kv_b_proj, o_proj, quant};
        mla::validate_weights(d, w);
        const mla::MlapoWeights mw = mla::prepare_mlapo_weights(d, w);
        nb::dict r;
        r["wd_qkv"] = mw.wd_qkv;
        r["deq_scale_qkv"] = mw.deq_scale_qkv;
        r["quant_bias_qkv"] = mw.quant_bias_qkv;
        r["wu_q"] = mw.wu_q;
        r["qb_deq_scl"] = mw.qb_deq_scl;
        r["qb_qt_bias"] = mw.qb_qt_bias;
        return r;
      },
      nb::kw_only(), "num_heads"_a, "hidden_size"_a, "q_lora_rank"_a, "kv_lora_rank"_a, "qk_nope_head_dim"_a,
      "qk_rope_head_dim"_a, "v_head_dim"_a, "q_a_layernorm"_a, "kv_a_layernorm"_a, "kv_b_proj"_a, "o_proj"_a,
      "quant"_a, "The mla_preprocess (MLAPO) weights of W8A8-static projections (docs/design/mla.md §4.4).");

  nb::class_<mla::Impl>(m, "Impl")
      .def(
          "__init__",
          [](mla::Impl* self, int64_t num_heads, int64_t hidden_size, std::optional<int64_t> q_lora_rank,
             int64_t kv_lora_rank, int64_t qk_nope_head_dim, int64_t qk_rope_head_dim, int64_t v_head_dim,
             std::optional<at::Tensor> q_a_proj, std::optional<at::Tensor> q_a_layernorm,
             std::optional<at::Tensor> q_proj, std::optional<at::Tensor> kv_a_proj_with_mqa,
             const at::Tensor& kv_a_layernorm, const at::Tensor& kv_b_proj, const at::Tensor& o_proj, double scale,
             double q_norm_eps, double kv_norm_eps, bool enable_prolog, bool enable_kv_nz, int64_t layer_index,
             int64_t workspace_group, std::optional<bool> prefill_in_bf16, std::optional<mla::QuantWeights> quant,
             bool enable_mlapo, std::optional<double> fa_quant_kv_scale, cp::Comm* dcp_comm, cp::Comm* pcp_comm) {
            mla::ImplConfig c;
            c.dcp_comm = dcp_comm;
            c.pcp_comm = pcp_comm;
            c.enable_mlapo = enable_mlapo;
            c.fa_quant_kv_scale = fa_quant_kv_scale;
            c.prefill_in_bf16 = prefill_in_bf16;
            c.layer_index = layer_index;
            c.workspace_group = workspace_group;
            c.dims = {num_heads, hidden_size, q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim,
                      v_head_dim};
            c.scale = scale;
            c.q_norm_eps = q_norm_eps;
            c.kv_norm_eps = kv_norm_eps;
            c.enable_prolog = enable_prolog;
            c.enable_kv_nz = enable_kv_nz;
            mla::Weights w{q_a_proj,       q_a_layernorm, q_proj.value_or(at::Tensor()),
                           kv_a_proj_with_mqa.value_or(at::Tensor()), kv_a_layernorm, kv_b_proj, o_proj, quant};
            new (self) mla::Impl(c, w);
          },
          nb::kw_only(), "num_heads"_a, "hidden_size"_a, "q_lora_rank"_a = nb::none(), "kv_lora_rank"_a,
          "qk_nope_head_dim"_a, "qk_rope_head_dim"_a, "v_head_dim"_a, "q_a_proj"_a = nb::none(),
          "q_a_layernorm"_a = nb::none(), "q_proj"_a = nb::none(), "kv_a_proj_with_mqa"_a = nb::none(),
          "kv_a_layernorm"_a, "kv_b_proj"_a, "o_proj"_a, "scale"_a = 0.0, "q_norm_eps"_a = 1e-6,
          "kv_norm_eps"_a = 1e-6, "enable_prolog"_a = false, "enable_kv_nz"_a = false, "layer_index"_a = -1,
          "workspace_group"_a = 0, "prefill_in_bf16"_a = nb::none(), "quant"_a = nb::none(),
          "enable_mlapo"_a = false, "fa_quant_kv_scale"_a = nb::none(), "dcp_comm"_a = nb::none(),
          "pcp_comm"_a = nb::none(), nb::keep_alive<1, 27>(), nb::keep_alive<1, 28>())
      .def(
          "forward",
          [](mla::Impl& impl, const at::Tensor& hidden, const at::Tensor& nope_cache, const at::Tensor& rope_cache,
             const mla::Metadata* md, const at::Tensor& output) -> at::Tensor {
            // A layer with a CP group runs collectives inside: never with the GIL held (comm/bindings.cpp's
            // PyCommWork note).
            const mla::ImplConfig& cf = impl.config();
            std::optional<nb::gil_scoped_release> nogil;
            if (cf.dcp_comm != nullptr || cf.pcp_comm != nullptr) nogil.emplace();
            return impl.forward(hidden, nope_cache, rope_cache, md, output);
          },
          "hidden_states"_a, "nope_cache"_a, "rope_cache"_a, "metadata"_a.none(), "output"_a)
      .def(
          "reload_weights",
          [](mla::Impl& impl, std::optional<at::Tensor> q_a_proj, std::optional<at::Tensor> q_a_layernorm,
             std::optional<at::Tensor> q_proj, std::optional<at::Tensor> kv_a_proj_with_mqa,
             const at::Tensor& kv_a_layernorm, const at::Tensor& kv_b_proj, const at::Tensor& o_proj,
             std::optional<mla::QuantWeights> quant) {
            impl.reload_weights(mla::Weights{q_a_proj, q_a_layernorm, q_proj.value_or(at::Tensor()),
                                             kv_a_proj_with_mqa.value_or(at::Tensor()), kv_a_layernorm, kv_b_proj,
                                             o_proj, quant});
          },
          nb::kw_only(), "q_a_proj"_a = nb::none(), "q_a_layernorm"_a = nb::none(), "q_proj"_a = nb::none(),
          "kv_a_proj_with_mqa"_a = nb::none(), "kv_a_layernorm"_a, "kv_b_proj"_a, "o_proj"_a, "quant"_a = nb::none(),
          "Copy new weights into the layer's weight tensors and recompute W_UK_T / W_UV / the prolog weights in "
          "place (graph-captured addresses stay valid).")
      .def("refresh_weights", &mla::Impl::refresh_weights,
           "Recompute the derived weights after the weight tensors were updated in place.")
      .def("release_views", &mla::Impl::release_views,
           "Drop the views of the last caches and metadata a decode kept (see the C++ Impl::forward).")
      .def_prop_ro("num_heads_padded", &mla::Impl::num_heads_padded)
      .def_prop_ro("w_uk_t", [](const mla::Impl& i) { return i.w_uk_t(); })
      .def_prop_ro("w_uv", [](const mla::Impl& i) { return i.w_uv(); })
      .def_prop_ro("scale", [](const mla::Impl& i) { return i.config().scale; })
      .def_prop_ro("last_decode_path",
                   [](const mla::Impl& i) { return std::string(mla::to_string(i.last_decode_path())); })
      .def_prop_ro("fused_decode_path",
                   [](const mla::Impl& i) { return std::string(mla::to_string(i.fused_decode_path())); })
      .def_prop_ro(
          "decode_workspace_id",
          [](const mla::Impl& i) { return reinterpret_cast<uintptr_t>(i.decode_workspace_id()); },
          "Address of the decode workspace this layer uses: equal for layers that share one (same shape, dtype, "
          "device and workspace_group).");

  nb::class_<mla::LatentAttention>(m, "LatentAttention",
                                   "MLA attention without the projections (C++ mla::LatentAttention): the cache "
                                   "write, the absorbed latent decode and the un-absorbed prefill with its cached "
                                   "context, for engines that project themselves (vLLM's MLAAttention).")
      .def(
          "__init__",
          [](mla::LatentAttention* self, int64_t num_heads, int64_t kv_lora_rank, int64_t qk_nope_head_dim,
             int64_t qk_rope_head_dim, int64_t v_head_dim, double scale, std::optional<bool> prefill_in_bf16,
             int64_t workspace_group, cp::Comm* dcp_comm) {
            mla::LatentAttentionConfig c;
            c.num_heads = num_heads;
            c.kv_lora_rank = kv_lora_rank;
            c.qk_nope_head_dim = qk_nope_head_dim;
            c.qk_rope_head_dim = qk_rope_head_dim;
            c.v_head_dim = v_head_dim;
            c.scale = scale;
            c.prefill_in_bf16 = prefill_in_bf16;
            c.workspace_group = workspace_group;
            c.dcp_comm = dcp_comm;
            new (self) mla::LatentAttention(c);
          },
          nb::kw_only(), "num_heads"_a, "kv_lora_rank"_a, "qk_nope_head_dim"_a, "qk_rope_head_dim"_a, "v_head_dim"_a,
          "scale"_a = 0.0, "prefill_in_bf16"_a = nb::none(), "workspace_group"_a = 0, "dcp_comm"_a = nb::none(),
          nb::keep_alive<1, 10>(),
          "dcp_comm: the DCP group's aar.cp.Comm (kept alive by the layer) for metadata built with "
          "dcp_world_size > 1.")
      .def_static(
          "split_kv_cache",
          [](const at::Tensor& kv_cache, int64_t kv_lora_rank) {
            return mla::LatentAttention::split_kv_cache(kv_cache, kv_lora_rank);
          },
          "kv_cache"_a, "kv_lora_rank"_a,
          "(num_blocks, block_size, L+R) buffer -> (latent cache (nb, bs, 1, L), rope cache (nb, bs, 1, R)), both "
          "aliasing it.")
      .def("write_kv", &mla::LatentAttention::write_kv, "kv_c"_a, "k_pe"_a, "slot_mapping"_a, "nope_cache"_a,
           "rope_cache"_a)
      .def(
          "forward_decode",
          [](mla::LatentAttention& a, const at::Tensor& ql_nope, const at::Tensor& q_pe, const at::Tensor& nope_cache,
             const at::Tensor& rope_cache, const mla::Metadata* md, const at::Tensor& out) {
            // Collectives run inside under DCP: never with the GIL held (cp_bindings.cpp).
            std::optional<nb::gil_scoped_release> nogil;
            if (a.config().dcp_comm != nullptr) nogil.emplace();
            a.forward_decode(ql_nope, q_pe, nope_cache, rope_cache, md, out);
          },
          "ql_nope"_a, "q_pe"_a, "nope_cache"_a, "rope_cache"_a, "metadata"_a.none(), "out"_a,
          "metadata None: a profiling run (out zero-filled).")
      .def(
          "forward_prefill",
          [](const mla::LatentAttention& a, const at::Tensor& q, const at::Tensor& kv_c, const at::Tensor& k_pe,
             const at::Tensor& kv_b_proj, const at::Tensor& nope_cache, const at::Tensor& rope_cache,
             const mla::Metadata* md, const at::Tensor& out) {
            std::optional<nb::gil_scoped_release> nogil;
            if (a.config().dcp_comm != nullptr) nogil.emplace();
            a.forward_prefill(q, kv_c, k_pe, nope_cache, rope_cache, md, out, kv_b_proj);
          },
          "q"_a, "kv_c"_a, "k_pe"_a, "kv_b_proj"_a, "nope_cache"_a, "rope_cache"_a, "metadata"_a.none(), "out"_a,
          "metadata None: a profiling run (out zero-filled).")
      .def_prop_ro("num_heads_padded", &mla::LatentAttention::num_heads_padded)
      .def_prop_ro("scale", [](const mla::LatentAttention& a) { return a.config().scale; })
      .def_prop_ro("dcp_world_size", [](const mla::LatentAttention& a) {
        return a.config().dcp_comm != nullptr ? a.config().dcp_comm->size() : 1;
      });
}

const BindingRegistrar kRegisterMla(/*order=*/30, &bind_mla);
}  // namespace
}  // namespace aar::bindings
