// GQA DCP decode in graph mode: what a per-step update refreshes (cp/gqa_dcp.h).
#pragma once

#include "ascend_attn_rt/cp/gqa_dcp.h"
#include "ascend_attn_rt/graph/step_params.h"

namespace aar::gqa {

// The decode rows of the step: one per decode token plus the padding rows
// (KV length 0) up to the bucket, each with its request's block-table row,
// its query end and this rank's local KV length.
graph::StepParams dcp_graph_step_params(const DcpMetadata& md);
// The same, under the name GraphParams::update(n, metadata) looks for.
inline graph::StepParams graph_step_params(const DcpMetadata& md) { return dcp_graph_step_params(md); }

}  // namespace aar::gqa
