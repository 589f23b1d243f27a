// Schema definitions for our two provider namespaces. Kernels are attached
// elsewhere (cpp/ops/cpu/*.cpp, cpp/ops/noop/*.cpp) with TORCH_LIBRARY_IMPL.
#include <torch/library.h>

#include "ascend_attn_rt/ops/schemas.h"

namespace {

void define_all(torch::Library& m) {
  for (const auto& s : aar::ops::op_schemas()) {
    m.def(s.schema);
  }
}

// No autograd for inference kernels: a per-operator Autograd fallthrough keeps the
// dispatcher off the boxed autograd fallback without an InferenceMode guard per
// call (the guard's TLS switches cost about as much as the dispatch itself).
void autograd_fallthrough(torch::Library& m) {
  for (const auto& s : aar::ops::op_schemas()) {
    m.impl(s.name, torch::CppFunction::makeFallthrough());
  }
}

}  // namespace

TORCH_LIBRARY(ascend_cpu, m) { define_all(m); }

TORCH_LIBRARY(ascend_noop, m) { define_all(m); }

TORCH_LIBRARY_IMPL(ascend_cpu, Autograd, m) { autograd_fallthrough(m); }

TORCH_LIBRARY_IMPL(ascend_noop, Autograd, m) { autograd_fallthrough(m); }
