// SFA in graph mode: what GraphParams::update hands the captured SFA layers.
// A plain SFA layer is one Prepare call over the builder's stable buffers and
// needs no update; a KV-offloaded layer also records a host callback (the
// resident-slot step, docs/design/sfa.md §6.6) whose per-step host inputs (the
// decode rows' request ids, lengths, stable prefixes, the token-to-request map,
// the host block table and slots) come from the step's metadata through this.
#pragma once

#include "ascend_attn_rt/graph/step_params.h"
#include "ascend_attn_rt/sfa/metadata.h"

namespace aar::sfa {

// The step as GraphParams::update sees it (group 0): the block table, both
// length lists, the counts, the stamp, and the metadata itself for the
// offload's host callback (StepParams::backend_metadata_as<sfa::Metadata>()).
// `md` must outlive the update call only: the update copies the host lists the
// callbacks read into the bucket's snapshot (docs/design/sfa.md §6.7), so the
// next step may be built before the replay's callbacks run; a CPU replay checks
// that the build is still the latest (its device work reads the builder's buffers).
graph::StepParams graph_step_params(const Metadata& md);

}  // namespace aar::sfa
