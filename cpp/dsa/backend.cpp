#include "ascend_attn_rt/dsa/backend.h"

#include <algorithm>

#include "ascend_attn_rt/plan/attention_state.h"
#include "ascend_attn_rt/dsa/plan/dsa_backend_facts.h"

namespace aar::dsa {

const char* Backend::name() { return dsa_backend(DsaBackendKind::Generic, DeviceKind::A2).name; }

core::BackendFacts Backend::facts() {
  core::BackendFacts f;
  f.id = "dsa";
  f.name = name();
  for (const Dsv4BlockSizesRow& row : kDsv4BlockSizes) {
    const int64_t cbs = row.sizes.cache_block_size;
    if (std::find(f.block_sizes.begin(), f.block_sizes.end(), cbs) == f.block_sizes.end()) f.block_sizes.push_back(cbs);
  }
  std::sort(f.block_sizes.begin(), f.block_sizes.end());
  // The model dtype of the plain-row plans (bf16, fp16), and float32 for CPU reference runs.
  f.dtypes = {c10::kBFloat16, c10::kHalf, c10::kFloat};
  // compose_kv_cache's tuple (dsa/impl.h); plans with an indexer full view add indexer_full.
  f.kv_caches = {"compress_kv", "swa_kv", "state", "indexer_state", "indexer_k", "indexer_scale"};
  f.capturable = core::state_bit(plan::AttentionState::DecodeOnly) | core::state_bit(plan::AttentionState::SpecDecoding);
  f.draft_lanes = true;
  return f;
}

namespace {
const core::BackendRegistrar kRegisterDsaBackend(&Backend::facts);
}  // namespace

}  // namespace aar::dsa
