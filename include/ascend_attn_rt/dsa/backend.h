// The DeepSeek-V4 ("DSA") backend family's declared facts (core/backend.h).
// The per-cache-kind facts (the six upstream backend descriptors, block sizes,
// page geometry) are in plan/dsa_backend_facts.h.
#pragma once

#include "ascend_attn_rt/core/backend.h"

namespace aar::dsa {

struct Backend {
  // Registered with the runtime as "dsa": the builder is StepBuilder (its
  // GroupBuilders build for the step it made), the layer dsa::Impl, whose
  // forward takes the compose_kv_cache tuple and route_layer's metadata.
  // block_sizes are the cache block sizes a GroupConfig takes (each cache
  // kind's kernel block size follows from it); capturable: DecodeOnly and
  // SpecDecoding; draft lanes: yes (StepBuilder::build_for_drafting).
  static core::BackendFacts facts();
  // The name vLLM knows the upstream backend by ("ASCEND_DSA").
  static const char* name();
};

}  // namespace aar::dsa
