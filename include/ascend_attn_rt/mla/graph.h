// MLA decode in graph mode: what a per-step update refreshes.
#pragma once

#include "ascend_attn_rt/graph/graph_params.h"
#include "ascend_attn_rt/mla/metadata.h"

namespace aar::mla {

// The decode part of the step: block table, per-request KV lengths, cumulative
// query ends (speculative TND layout), one row per decode request.
graph::StepParams graph_step_params(const Metadata& md);

}  // namespace aar::mla
