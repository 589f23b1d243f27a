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
};

}  // namespace aar::mla
