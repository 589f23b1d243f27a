// Schema definitions for our two provider namespaces. Kernels are attached
// elsewhere (cpp/ops/cpu/*.cpp, cpp/ops/noop/*.cpp) with TORCH_LIBRARY_IMPL.
//
// Like torch_npu's inference operators, ours register no Autograd kernel (no
// fallthrough either): the runtime's wrappers call every provider under the
// same InferenceMode guard (op_handle.h, DispatchGuard), so the CPU twins and
// the no-compute provider take the NPU path's dispatch and guard, and the
// host-time benchmarks measure what the NPU path pays.
#include <torch/library.h>

#include "ascend_attn_rt/ops/schemas.h"

namespace {

void define_all(torch::Library& m) {
  for (const auto& s : aar::ops::op_schemas()) {
    m.def(s.schema);
  }
}

}  // namespace

TORCH_LIBRARY(ascend_cpu, m) { define_all(m); }

TORCH_LIBRARY(ascend_noop, m) { define_all(m); }
