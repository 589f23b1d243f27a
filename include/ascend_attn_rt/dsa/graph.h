// DSA decode in graph mode (dsa/impl.h "Graph capture"): what a per-step
// update checks. A captured DSA layer is one Prepare call that reads every
// per-step value from the builders' stable buffers, so an update re-issues
// nothing for it; it only checks that the step fits the bucket.
#pragma once

#include "ascend_attn_rt/dsa/metadata.h"
#include "ascend_attn_rt/graph/graph_params.h"

namespace aar::dsa {

// The step as GraphParams::update sees it (the entry of the DSA layers'
// calls of ImplConfig::kv_cache_group, 0 by default; a model whose layers read
// several SWA groups gives one entry per group): the SWA group's block table
// and stamp (every DSA layer
// reads one), B (dummy requests included), query_start_loc[B]
// (num_kernel_tokens) and num_input_tokens. The captured layers check that
// the step has the bucket's tokens, all in its B requests, and that its SWA
// metadata is at the captured addresses (same builder lane, same
// block-table width), else InvalidArgument naming the layer and sizes; a
// stale SWA build is rejected by update itself.
graph::StepParams graph_step_params(const LayerMetadata& md);

}  // namespace aar::dsa
