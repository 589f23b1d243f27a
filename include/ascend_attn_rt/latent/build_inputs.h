// What a step's build takes, shared by the MLA-family builders (mla::, sfa::).
#pragma once

#include <cstdint>
#include <optional>

#include "ascend_attn_rt/core/step.h"
#include "ascend_attn_rt/plan/attention_state.h"
#include "ascend_attn_rt/plan/span.h"

namespace aar::mla {

// The step (core::StepInput, any decode/prefill order; is_prefilling is read
// under DCP only, docs/design/cp.md §6.5, empty meaning seq_len == query_len; req_ids only by
// the SFA KV-offload builder) and the MLA family's draft step.
struct BuildInputs : core::StepInput {
  // mla:: only (the SFA builders refuse it; theirs is build_for_drafting's
  // lane): a draft-model (MTP proposer) step d >= 0, docs/design/cp.md §3.1. seq_lens
  // are the requests' base lengths, each request has one query token at
  // position base + d (query_start_loc 0, 1, ..., B), so its length is
  // base + d + 1 (plan::draft_step_seq_lens) and, under DCP, its local KV length
  // local_len(base + d + 1, rank) (upstream's draft_cp_seq_len); every request
  // is a decode. -1: a normal step.
  int32_t draft_step = -1;
};

}  // namespace aar::mla
