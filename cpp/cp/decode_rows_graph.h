// What a per-step update of a captured GQA context-parallel decode bucket
// refreshes (docs/design/cp.md §6.6): one kernel row per decode token, then the
// padding rows (KV length 0) up to the bucket. Shared by GQA DCP and the
// sharded GQA PCP, whose metadata carry the same decode-row fields.
#pragma once

#include "ascend_attn_rt/errors.h"
#include "ascend_attn_rt/graph/step_params.h"

namespace aar::cp::decode_rows {

// A captured bucket holds the decode-only path: a step with prefills would
// replay its decode rows only and skip the prefills, so it is refused.
// `family` names the layer in the error ("GQA DCP", "GQA PCP").
template <class M>
void require_decode_only(const M& md, const char* family) {
  AAR_CHECK_ARG(md.num_prefills == 0 && md.num_decodes > 0, "a ", family, " step with ", md.num_prefills,
                " prefills and ", md.num_decodes, " decodes cannot update a captured bucket (only decode-only "
                "steps are captured; run a step with prefills eagerly)");
}

template <class M>
graph::StepParams step_params(const M& md, const char* family) {
  require_decode_only(md, family);
  graph::StepParams sp;
  sp.block_tables = md.decode_block_tables;
  sp.q_ends = md.decode_q_ends;
  sp.kv_lens = md.decode_kv_lens;
  sp.num_reqs = md.decode_kernel_rows;  // one kernel "request" per decode row
  sp.num_real_reqs = md.num_decodes;
  sp.num_kernel_tokens = md.decode_kernel_rows;
  sp.num_input_tokens = md.num_input_tokens;
  sp.stamp = md.stamp;
  return sp;
}

}  // namespace aar::cp::decode_rows
