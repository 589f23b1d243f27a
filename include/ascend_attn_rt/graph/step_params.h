// The step as a graph update hands it to the captured calls of one KV-cache
// group: backend-neutral host lists and the device tensors they index. Each
// backend makes its own from its metadata (gqa::graph_step_params,
// mla::graph_step_params, ...); the graph layer only passes it on.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>

#include <cstdint>
#include <typeinfo>

#include "ascend_attn_rt/build_stamp.h"

namespace aar::graph {

struct StepParams {
  at::Tensor block_tables;       // device int32 (num_reqs, max_blocks)
  at::Tensor seq_lens;           // host int32 (num_reqs): per-request KV lengths as a tensor
  c10::IntArrayRef q_ends;       // cumulative query ends (num_reqs)
  c10::IntArrayRef kv_lens;      // per-request KV lengths (num_reqs)
  int64_t num_reqs = 0;          // requests the kernels see (incl. padding dummies)
  int64_t num_real_reqs = 0;
  int64_t num_kernel_tokens = 0; // query rows attended (q_ends.back())
  int64_t num_input_tokens = 0;  // rows the layers see (>= num_kernel_tokens); 0: not given
  BuildStamp stamp;              // the build the lists belong to (stale ones are rejected)
  // The backend's own metadata, for calls that read more than the lists above
  // (a host callback's per-step host inputs: sfa::graph_step_params sets it).
  // Valid during the update only; a call copies what it keeps.
  const void* backend_metadata = nullptr;
  const std::type_info* backend_metadata_type = nullptr;

  template <class M>
  void set_backend_metadata(const M& md) {
    backend_metadata = &md;
    backend_metadata_type = &typeid(M);
  }
  // The backend metadata as an M, or nullptr when the step carries another kind.
  template <class M>
  const M* backend_metadata_as() const {
    return backend_metadata_type != nullptr && *backend_metadata_type == typeid(M)
               ? static_cast<const M*>(backend_metadata)
               : nullptr;
  }
};

}  // namespace aar::graph
