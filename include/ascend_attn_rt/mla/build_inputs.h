// What a step's build takes, shared by the MLA-family builders (mla::, sfa::).
#pragma once

#include <cstdint>
#include <optional>

#include "ascend_attn_rt/plan/attention_state.h"
#include "ascend_attn_rt/plan/span.h"

namespace aar::mla {

struct BuildInputs {
  plan::CSpan<int32_t> query_start_loc;  // B+1, exclusive prefix sums (any decode/prefill order)
  plan::CSpan<int32_t> seq_lens;         // B, context + new tokens
  plan::CSpan<int32_t> block_table;      // B x block_table_stride, row-major, host
  int32_t block_table_stride = 0;
  int32_t num_input_tokens = 0;          // 0 = query_start_loc[B]
  std::optional<plan::AttentionState> attn_state;  // derived when absent
  plan::CSpan<int32_t> num_spec_tokens;  // optional (state derivation)
  // optional, B entries: request still prefilling its prompt (read under DCP
  // only, spec 3.6; empty: seq_len == query_len)
  plan::CSpan<uint8_t> is_prefilling;
  // mla:: only (the SFA builders refuse it; theirs is build_for_drafting's
  // lane): a draft-model (MTP proposer) step d >= 0, spec cp.md 3.1. seq_lens
  // are the requests' base lengths, each request has one query token at
  // position base + d (query_start_loc 0, 1, ..., B), so its length is
  // base + d + 1 (plan::draft_step_seq_lens) and, under DCP, its local KV length
  // local_len(base + d + 1, rank) (upstream's draft_cp_seq_len); every request
  // is a decode. -1: a normal step.
  int32_t draft_step = -1;
};

}  // namespace aar::mla
