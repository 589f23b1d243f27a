// The GQA DCP backend's declared facts (core/backend.h).
#include "ascend_attn_rt/core/backend.h"
#include "ascend_attn_rt/gqa/backend.h"
#include "ascend_attn_rt/cp/gqa_dcp.h"

namespace aar::gqa {

core::BackendFacts DcpBackend::facts() {
  core::BackendFacts f;
  f.id = "gqa_dcp";
  // vLLM selects the DCP builder and layer inside the same attention backend.
  f.name = Backend::name();
  f.block_sizes = Backend::supported_block_sizes();
  f.dtypes = {c10::kHalf, c10::kBFloat16, c10::kFloat};
  f.kv_caches = {"key_cache", "value_cache"};
  // A layer captures decode-only batches padded to the bucket (one query row
  // per decode token, speculative ones included).
  f.capturable = core::state_bit(plan::AttentionState::DecodeOnly) |
                 core::state_bit(plan::AttentionState::SpecDecoding);
  f.context_parallel = true;
  return f;
}

namespace {
const core::BackendRegistrar kRegisterGqaDcpBackend(&DcpBackend::facts);
}  // namespace

}  // namespace aar::gqa
