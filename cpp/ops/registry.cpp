// Schema definitions for our provider namespaces. Kernels are attached
// elsewhere (cpp/ops/cpu/*.cpp, cpp/ops/noop/*.cpp) with TORCH_LIBRARY_IMPL.
//   ascend_cpu / ascend_noop       : torch_npu's operators (op_schemas())
//   ascend_cpu_va / ascend_noop_va : vllm-ascend's `_C_ascend` operators
//                                    (vllm_ascend_op_schemas()); separate namespaces
//                                    because some share a name with a torch_npu
//                                    operator but not its schema
//   ascend_cpu_cot / ascend_noop_cot : CANN's `cann_ops_transformer` operators
//                                    (cann_ops_transformer_op_schemas(): SparseFlashMla)
//
// Like torch_npu's inference operators, ours register no Autograd kernel (no
// fallthrough either): the runtime's wrappers call every provider under the
// same InferenceMode guard (op_handle.h, DispatchGuard), so the CPU twins and
// the no-compute provider take the NPU path's dispatch and guard, and the
// host-time benchmarks measure what the NPU path pays.
#include <torch/library.h>

#include "ascend_attn_rt/ops/schemas.h"

namespace {

void define_all(torch::Library& m, const std::vector<aar::ops::OpSchema>& table) {
  for (const auto& s : table) {
    m.def(s.schema);
  }
}

}  // namespace

TORCH_LIBRARY(ascend_cpu, m) { define_all(m, aar::ops::op_schemas()); }

TORCH_LIBRARY(ascend_noop, m) { define_all(m, aar::ops::op_schemas()); }

TORCH_LIBRARY(ascend_cpu_va, m) { define_all(m, aar::ops::vllm_ascend_op_schemas()); }

TORCH_LIBRARY(ascend_noop_va, m) { define_all(m, aar::ops::vllm_ascend_op_schemas()); }

TORCH_LIBRARY(ascend_cpu_cot, m) { define_all(m, aar::ops::cann_ops_transformer_op_schemas()); }

TORCH_LIBRARY(ascend_noop_cot, m) { define_all(m, aar::ops::cann_ops_transformer_op_schemas()); }
