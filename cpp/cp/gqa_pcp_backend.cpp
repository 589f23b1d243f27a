// The GQA PCP backend's declared facts (core/backend.h).
#include "ascend_attn_rt/core/backend.h"
#include "ascend_attn_rt/cp/gqa_pcp.h"
#include "ascend_attn_rt/gqa/backend.h"

namespace aar::cp {

core::BackendFacts PcpBackend::facts() {
  core::BackendFacts f;
  f.id = "gqa_pcp";
  // vLLM selects the PCP builder and layer inside the same attention backend.
  f.name = gqa::Backend::name();
  f.block_sizes = gqa::Backend::supported_block_sizes();
  f.dtypes = {c10::kHalf, c10::kBFloat16, c10::kFloat};
  f.kv_caches = {"key_cache", "value_cache"};
  // A layer captures decode-only steps padded to the bucket (one decode row per
  // token, speculative ones included); steps with prefills run eagerly only.
  f.capturable = core::state_bit(plan::AttentionState::DecodeOnly) |
                 core::state_bit(plan::AttentionState::SpecDecoding);
  f.context_parallel = true;
  return f;
}

namespace {
const core::BackendRegistrar kRegisterGqaPcpBackend(&PcpBackend::facts);
}  // namespace

}  // namespace aar::cp
