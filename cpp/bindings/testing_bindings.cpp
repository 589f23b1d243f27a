// _C._testing: tiny entry points that let the Python tests see what the C++
// side receives (tests/python/test_tensor_caster.py, test_dispatch.py). Not
// part of the facade.
#include <ATen/core/Tensor.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "ascend_attn_rt/ops/attention_update.h"
#include "ascend_attn_rt/ops/fault_injection.h"
#include "ascend_attn_rt/ops/inference_mode.h"
#include "common.h"
#include "tensor_caster.h"

namespace aar::bindings {
namespace {

namespace nb = nanobind;
using namespace nb::literals;

ops::Provider provider_of(const std::string& s) {
  if (s == "auto") return ops::Provider::Auto;
  if (s == "npu") return ops::Provider::Npu;
  if (s == "cpu") return ops::Provider::Cpu;
  if (s == "no_compute") return ops::Provider::NoCompute;
  throw_invalid("provider must be one of 'auto', 'npu', 'cpu', 'no_compute', got '", s, "'");
}

// What C++ sees of a tensor: (TensorImpl address, data address, sizes, strides, storage offset).
std::tuple<uintptr_t, uintptr_t, std::vector<int64_t>, std::vector<int64_t>, int64_t> describe(const at::Tensor& t) {
  return {reinterpret_cast<uintptr_t>(t.unsafeGetTensorImpl()), reinterpret_cast<uintptr_t>(t.const_data_ptr()),
          t.sizes().vec(), t.strides().vec(), t.storage_offset()};
}

void bind_testing(nb::module_& m) {
  nb::module_ t = m.def_submodule("_testing", "Test hooks (not part of the API)");
  t.def(
      "identity", [](const at::Tensor& x) { return x; }, "x"_a,
      "The tensor through the at::Tensor caster and back.");
  t.def(
      "identity_optional", [](const std::optional<at::Tensor>& x) { return x; }, "x"_a.none(),
      "An optional tensor (None <-> std::nullopt) through the caster and back.");
  t.def(
      "borrow",
      [](nb::handle x, bool none_ok) -> at::Tensor { return borrow_tensor(x, "x", none_ok); },
      "x"_a.none(), "none_ok"_a = false, "The tensor through borrow_tensor (the forward entry points' path) and back.");
  t.def("describe", &describe, "x"_a);
  t.def("arm_fault", &ops::testing::arm_fault, "k"_a,
        "Make the k-th operator call on this thread raise (k = 0: count only). ops/fault_injection.h.");
  t.def("disarm_fault", &ops::testing::disarm_fault, "Disarm this thread; returns the operator calls counted.");
  t.def("fault_calls", &ops::testing::fault_calls, "Operator calls counted on this thread since arm_fault.");
  t.def("inference_mode_entries", &ops::testing::inference_mode_entries,
        "InferenceMode guards the runtime took on this thread (ops/inference_mode.h).");
  t.def(
      "attention_update",
      [](const std::vector<at::Tensor>& lse, const std::vector<at::Tensor>& local_out, int64_t update_type,
         const std::string& provider) {
        return ops::attention_update(lse, local_out, update_type, provider_of(provider));
      },
      "lse"_a, "local_out"_a, "update_type"_a, "provider"_a = "auto",
      "ops::attention_update, the runtime's wrapper of npu_attention_update, with an explicit provider.");
}

const BindingRegistrar kRegisterTesting(/*order=*/1000, &bind_testing);

}  // namespace
}  // namespace aar::bindings
