// Helpers shared by the binding translation units: host int arrays as spans,
// with errors that name the argument.
#pragma once

#include <string>
#include <type_traits>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/core/Tensor.h>
#include <nanobind/nanobind.h>

#include "ascend_attn_rt/errors.h"
#include "ascend_attn_rt/gqa/impl.h"
#include "ascend_attn_rt/plan/attention_state.h"
#include "ascend_attn_rt/plan/workspace.h"
#include "ascend_attn_rt/plan/span.h"
#include "ascend_attn_rt/plan/step_input.h"

namespace aar::bindings {

namespace nb = nanobind;

inline void check_host_tensor(const at::Tensor& t, const char* name, at::ScalarType dtype, int64_t dims) {
  AAR_CHECK_ARG(t.defined(), name, " must be a tensor");
  AAR_CHECK_ARG(t.scalar_type() == dtype, name, " must be ", dtype, ", got ", t.scalar_type());
  AAR_CHECK_ARG(t.device().is_cpu(), name, " must be a host (CPU) tensor, got device ", t.device());
  AAR_CHECK_ARG(t.dim() == dims, name, " must have ", dims, " dimension(s), got shape ", t.sizes());
  AAR_CHECK_ARG(t.is_contiguous(), name, " must be contiguous");
}

// A shape as a Python list.
inline std::vector<int64_t> to_list(c10::IntArrayRef a) { return std::vector<int64_t>(a.begin(), a.end()); }

// A host int32 list (a builder's per-row indices) as a new int32 tensor.
inline at::Tensor int_tensor(const std::vector<int32_t>& v) {
  return at::tensor(c10::ArrayRef<int32_t>(v.data(), v.size()), at::TensorOptions().dtype(at::kInt));
}

inline plan::CSpan<int32_t> i32_span(const at::Tensor& t, const char* name, int64_t dims = 1) {
  check_host_tensor(t, name, at::kInt, dims);
  return {static_cast<const int32_t*>(t.const_data_ptr()), static_cast<size_t>(t.numel())};
}

inline plan::CSpan<uint8_t> bool_span(const std::optional<at::Tensor>& t, const char* name) {
  if (!t.has_value()) return {};
  AAR_CHECK_ARG(t->scalar_type() == at::kBool || t->scalar_type() == at::kByte, name,
                " must be bool or uint8, got ", t->scalar_type());
  check_host_tensor(*t, name, t->scalar_type(), 1);
  return {static_cast<const uint8_t*>(t->const_data_ptr()), static_cast<size_t>(t->numel())};
}

// String options of the facade, parsed once for every backend (module.cpp).
plan::DeviceKind parse_device_kind(const std::string& s);
plan::SpecMethod spec_method_from(const std::string& s);
gqa::AttnType parse_attn_type(const std::string& s);

void bind_plan(nb::module_& m);

// Each backend's binding file registers its bind function with a static
// BindingRegistrar; the module runs them in `order` (ties: registration order),
// so adding a backend never touches module.cpp.
using BindFn = void (*)(nb::module_&);
struct BindingRegistrar {
  BindingRegistrar(int order, BindFn fn);
};
void run_registered_bindings(nb::module_& m);

// The counts every backend's metadata embeds (core::StepCounts), bound with one meaning for all
// of them (docs/design/core.md §2).
// Used as the head of a class_ chain: def_step_counts(nb::class_<M>(m, "Metadata")).def_ro(...).
template <typename M, typename... Extra>
nb::class_<M, Extra...> def_step_counts(nb::class_<M, Extra...> c) {
  static_assert(std::is_base_of_v<plan::StepCounts, M>, "the metadata embeds core::StepCounts");
  c.def_prop_ro("num_reqs", [](const M& m) { return m.num_reqs; }, "scheduled (real) requests")
      .def_prop_ro("num_kernel_reqs", [](const M& m) { return m.num_kernel_reqs; },
                   "requests the kernels see (graph-padding dummies included)")
      .def_prop_ro("num_actual_tokens", [](const M& m) { return m.num_actual_tokens; }, "the real requests' tokens")
      .def_prop_ro("num_input_tokens", [](const M& m) { return m.num_input_tokens; },
                   "tokens the layers receive (>= num_actual_tokens)")
      .def_prop_ro("num_decodes", [](const M& m) { return m.num_decodes; })
      .def_prop_ro("num_decode_tokens", [](const M& m) { return m.num_decode_tokens; })
      .def_prop_ro("num_prefills", [](const M& m) { return m.num_prefills; })
      .def_prop_ro("num_prefill_tokens", [](const M& m) { return m.num_prefill_tokens; })
      .def_prop_ro("max_query_len", [](const M& m) { return m.max_query_len; }, "over the real requests")
      .def_prop_ro("max_seq_len", [](const M& m) { return m.max_seq_len; }, "over the real requests");
  return c;
}

}  // namespace aar::bindings
