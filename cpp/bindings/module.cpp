// The _C extension module: exception mapping, providers, operator schemas, and
// the torch-free plan functions. Backends are bound in their own files.
#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <algorithm>

#include "ascend_attn_rt/ops/provider.h"
#include "ascend_attn_rt/ops/schemas.h"
#include "ascend_attn_rt/plan/attention_state.h"
#include "ascend_attn_rt/plan/slot_mapping.h"
#include "ascend_attn_rt/plan/split.h"
#include "ascend_attn_rt/plan/workspace.h"
#include "common.h"
#include "tensor_caster.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace aar::bindings {

namespace {

ops::Provider parse_provider(const std::string& s) {
  if (s == "auto") return ops::Provider::Auto;
  if (s == "npu") return ops::Provider::Npu;
  if (s == "cpu") return ops::Provider::Cpu;
  if (s == "no_compute") return ops::Provider::NoCompute;
  throw_invalid("provider must be one of 'auto', 'npu', 'cpu', 'no_compute', got '", s, "'");
}

plan::SpecMethod parse_spec_method(const std::string& s) {
  if (s == "none") return plan::SpecMethod::None;
  if (s == "mtp") return plan::SpecMethod::Mtp;
  if (s == "other") return plan::SpecMethod::Other;
  throw_invalid("spec_method must be 'none', 'mtp' or 'other', got '", s, "'");
}

}  // namespace

plan::DeviceKind parse_device_kind(const std::string& s) {
  if (s == "a2") return plan::DeviceKind::A2;
  if (s == "a3") return plan::DeviceKind::A3;
  if (s == "a5") return plan::DeviceKind::A5;
  if (s == "310p") return plan::DeviceKind::Ascend310P;
  throw_invalid("device_kind must be 'a2', 'a3', 'a5' or '310p', got '", s, "'");
}

plan::SpecMethod spec_method_from(const std::string& s) { return parse_spec_method(s); }

gqa::AttnType parse_attn_type(const std::string& s) {
  if (s == "decoder") return gqa::AttnType::Decoder;
  if (s == "encoder_only") return gqa::AttnType::EncoderOnly;
  if (s == "encoder") return gqa::AttnType::Encoder;
  if (s == "encoder_decoder") return gqa::AttnType::EncoderDecoder;
  throw_invalid("attn_type must be 'decoder', 'encoder_only', 'encoder' or 'encoder_decoder', got '", s, "'");
}

void bind_plan(nb::module_& m) {
  nb::module_ p = m.def_submodule("plan", "Torch-free per-step planning functions");

  p.def(
      "select_attention_state",
      [](const at::Tensor& num_computed, const at::Tensor& num_scheduled, const std::optional<at::Tensor>& num_spec,
         const std::string& spec_method, bool chunked_prefill_enabled) {
        plan::StateInputs in;
        in.num_computed_tokens = i32_span(num_computed, "num_computed");
        in.num_scheduled_tokens = i32_span(num_scheduled, "num_scheduled");
        if (num_spec.has_value()) in.num_spec_tokens = i32_span(*num_spec, "num_spec");
        in.spec_method = parse_spec_method(spec_method);
        in.chunked_prefill_enabled = chunked_prefill_enabled;
        return plan::select_attention_state(in);
      },
      "num_computed"_a, "num_scheduled"_a, "num_spec"_a = nb::none(), "spec_method"_a = "none",
      "chunked_prefill_enabled"_a = true);

  p.def(
      "split_decodes_and_prefills",
      [](const at::Tensor& qsl, int32_t num_actual_tokens, int32_t max_query_len, int32_t decode_threshold,
         bool require_uniform, bool treat_short, const std::optional<at::Tensor>& is_prefilling) {
        plan::SplitInputs in;
        in.query_start_loc = i32_span(qsl, "query_start_loc");
        in.num_actual_tokens = num_actual_tokens;
        in.max_query_len = max_query_len;
        in.decode_threshold = decode_threshold;
        in.require_uniform = require_uniform;
        in.treat_short_extends_as_decodes = treat_short;
        in.is_prefilling = bool_span(is_prefilling, "is_prefilling");
        const plan::SplitResult r = plan::split_decodes_and_prefills(in);
        return std::make_tuple(r.num_decodes, r.num_prefills, r.num_decode_tokens, r.num_prefill_tokens);
      },
      "query_start_loc"_a, "num_actual_tokens"_a, "max_query_len"_a, "decode_threshold"_a = 1,
      "require_uniform"_a = false, "treat_short_extends_as_decodes"_a = true, "is_prefilling"_a = nb::none());

  p.def(
      "reorder_decode_first",
      [](const at::Tensor& num_scheduled, const at::Tensor& num_computed, const std::optional<at::Tensor>& is_prefilling,
         int32_t decode_threshold) {
        auto sched = i32_span(num_scheduled, "num_scheduled");
        std::vector<int32_t> perm(sched.size()), swaps(2 * sched.size());
        const int32_t n = plan::reorder_decode_first(sched, i32_span(num_computed, "num_computed"),
                                                     bool_span(is_prefilling, "is_prefilling"), decode_threshold,
                                                     plan::Span<int32_t>(perm), plan::Span<int32_t>(swaps));
        std::vector<std::pair<int32_t, int32_t>> pairs;
        for (int32_t i = 0; i < n; ++i) pairs.emplace_back(swaps[2 * i], swaps[2 * i + 1]);
        return std::make_pair(perm, pairs);
      },
      "num_scheduled"_a, "num_computed"_a, "is_prefilling"_a = nb::none(), "decode_threshold"_a = 1);

  p.def(
      "compute_slot_mapping",
      [](const at::Tensor& qsl, const at::Tensor& seq_lens, const at::Tensor& block_table, int32_t block_size,
         int32_t num_blocks, int32_t num_tokens) {
        plan::SlotMappingInputs in;
        in.query_start_loc = i32_span(qsl, "query_start_loc");
        in.seq_lens = i32_span(seq_lens, "seq_lens");
        in.block_table = i32_span(block_table, "block_table", 2);
        in.block_table_stride = static_cast<int32_t>(block_table.size(1));
        in.block_size = block_size;
        in.num_blocks = num_blocks;
        AAR_CHECK_ARG(num_tokens >= 0, "num_tokens must be non-negative, got ", num_tokens);
        at::Tensor out = at::empty({num_tokens}, at::kInt);
        plan::compute_slot_mapping(in, plan::Span<int32_t>(out.data_ptr<int32_t>(), num_tokens));
        return out;
      },
      "query_start_loc"_a, "seq_lens"_a, "block_table"_a, "block_size"_a, "num_blocks"_a, "num_tokens"_a);

  p.def("chunked_prefill_workspace_size", &plan::chunked_prefill_workspace_size, "max_model_len"_a,
        "max_num_seqs"_a, "block_size"_a);
  p.def("round_up", &plan::round_up, "val"_a, "align"_a);
  p.def(
      "using_paged_attention",
      [](int64_t runtime_shape, bool has_spec, const std::string& device_kind, bool full_decode_only,
         const std::vector<int32_t>& pa_shape_list, int64_t head_size) {
        plan::PagedAttentionRule r;
        r.has_speculative_config = has_spec;
        r.device = parse_device_kind(device_kind);
        r.full_decode_only_graph = full_decode_only;
        r.pa_shape_list = plan::CSpan<int32_t>(pa_shape_list.data(), pa_shape_list.size());
        return plan::using_paged_attention(runtime_shape, r, head_size);
      },
      "runtime_shape"_a, "has_speculative_config"_a = false, "device_kind"_a = "a2",
      "full_decode_only_graph"_a = false, "pa_shape_list"_a = std::vector<int32_t>{}, "head_size"_a = -1);
}

namespace {
std::vector<std::pair<int, BindFn>>& registry() {
  static std::vector<std::pair<int, BindFn>> r;
  return r;
}
}  // namespace

BindingRegistrar::BindingRegistrar(int order, BindFn fn) { registry().emplace_back(order, fn); }

void run_registered_bindings(nb::module_& m) {
  auto r = registry();
  std::stable_sort(r.begin(), r.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (const auto& [order, fn] : r) fn(m);
}

}  // namespace aar::bindings

NB_MODULE(_C, m) {
  using namespace aar;
  m.doc() = "ascend_attn_rt: C++ attention runtime for Ascend NPUs (CPU twins of the NPU operators here)";

  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const aar::InvalidArgument& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const aar::NotSupported& e) {
      PyErr_SetString(PyExc_NotImplementedError, e.what());
    } catch (const c10::ValueError& e) {
      PyErr_SetString(PyExc_ValueError, e.what_without_backtrace());
    } catch (const c10::NotImplementedError& e) {
      PyErr_SetString(PyExc_NotImplementedError, e.what_without_backtrace());
    } catch (const c10::IndexError& e) {
      PyErr_SetString(PyExc_IndexError, e.what_without_backtrace());
    } catch (const c10::Error& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what_without_backtrace());
    }
  });

  nb::enum_<plan::AttentionState>(m, "AttentionState")
      .value("PrefillNoCache", plan::AttentionState::PrefillNoCache)
      .value("PrefillCacheHit", plan::AttentionState::PrefillCacheHit)
      .value("DecodeOnly", plan::AttentionState::DecodeOnly)
      .value("ChunkedPrefill", plan::AttentionState::ChunkedPrefill)
      .value("SpecDecoding", plan::AttentionState::SpecDecoding);

  m.def(
      "set_provider", [](const std::string& s) { ops::set_provider_override(bindings::parse_provider(s)); },
      "provider"_a, "Select the operator provider: 'auto' (by device), 'npu', 'cpu' or 'no_compute'.");
  m.def("get_provider", []() -> std::string {
    switch (ops::provider_override()) {
      case ops::Provider::Npu: return "npu";
      case ops::Provider::Cpu: return "cpu";
      case ops::Provider::NoCompute: return "no_compute";
      default: return "auto";
    }
  });
  m.def(
      "op_schemas",
      []() {
        std::vector<std::tuple<std::string, std::string, bool>> out;
        for (const auto& s : ops::op_schemas()) out.emplace_back(s.name, s.schema, s.atb);
        return out;
      },
      "Every torch_npu operator the runtime calls: (name, schema without namespace, lives in torch_npu's atb "
      "namespace). Registered for the CPU twins under ascend_cpu and for the no-compute provider under ascend_noop.");
  m.def(
      "vllm_ascend_op_schemas",
      []() {
        std::vector<std::tuple<std::string, std::string>> out;
        for (const auto& s : ops::vllm_ascend_op_schemas()) out.emplace_back(s.name, s.schema);
        return out;
      },
      "Every vllm-ascend (_C_ascend) operator the runtime calls: (name, schema without namespace). Registered for "
      "the CPU twins under ascend_cpu_va and for the no-compute provider under ascend_noop_va.");

  m.def(
      "cann_ops_transformer_op_schemas",
      []() {
        std::vector<std::tuple<std::string, std::string>> out;
        for (const auto& s : ops::cann_ops_transformer_op_schemas()) out.emplace_back(s.name, s.schema);
        return out;
      },
      "Every CANN torch-extension (cann_ops_transformer) operator the runtime calls: (name, schema without "
      "namespace). Registered for the CPU twins under ascend_cpu_cot and for the no-compute provider under "
      "ascend_noop_cot.");

  bindings::bind_plan(m);
  bindings::run_registered_bindings(m);
}
