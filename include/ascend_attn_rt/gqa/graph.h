// GQA-family metadata in graph mode: what a per-step update refreshes.
#pragma once

#include "ascend_attn_rt/graph/step_params.h"
#include "ascend_attn_rt/gqa/metadata.h"

namespace aar::gqa {

// graph_step_params(const Metadata&) (declared in gqa/metadata.h): the step's
// block table, host lists (cumulative query ends, per-request KV lengths, the KV
// lengths as a host tensor for paged attention) and counts, for
// GraphParams::update (also reached as GraphParams::update(n, metadata)).

// The name of a bucket's paged-attention workspace (graph::Bucket::workspace):
// its own slot, not the fused calls' (upstream shares one).
inline constexpr const char* kPagedAttentionWorkspace = "paged_attention";

}  // namespace aar::gqa
