// verify-npu from Python: the C++ CLI over the one case table (verify_npu.h). No logic.
#include <nanobind/nanobind.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "ascend_attn_rt/verify_npu.h"
#include "common.h"

namespace nb = nanobind;
using namespace nb::literals;

namespace aar::bindings {
namespace {

void bind_verify(nb::module_& m) {
  m.def(
      "verify_npu_cli",
      [](const std::vector<std::string>& args) {
        std::string out;
        int rc;
        {
          // Rows may run for seconds on the CPU twin; other Python threads keep running.
          nb::gil_scoped_release nogil;
          rc = verify::run_verify_cli(args, out);
        }
        return std::make_pair(rc, out);
      },
      "args"_a, "verify-npu's command line (verify_npu.h): returns (exit code, report).");
  m.def("npu_available", &verify::npu_available, "True when a PrivateUse1 (NPU) device is present.");
}

}  // namespace

const BindingRegistrar kRegisterVerify(/*order=*/810, &bind_verify);

}  // namespace aar::bindings
