// Static facts of the FA3-style backend (docs/design/gqa.md §6): upstream's
// flash_attn_with_kvcache entry, selected for RL training consistency. Same KV
// cache as GQA, one kernel block size (128).
#pragma once

#include <cstdint>
#include <vector>
#include "ascend_attn_rt/core/backend.h"

namespace aar::fa3 {

struct Backend {
  // The declared facts (core/backend.h), registered with the runtime.
  static core::BackendFacts facts();
  static const char* name();  // "CUSTOM" (the upstream registration name)
  static const std::vector<int64_t>& supported_block_sizes();  // {128}
  static bool is_supported_block_size(int64_t block_size);
  // (2, num_blocks, block_size, num_kv_heads, head_size); block_size must be 128.
  static std::vector<int64_t> kv_cache_shape(int64_t num_blocks, int64_t block_size, int64_t num_kv_heads,
                                             int64_t head_size);
  // vLLM's get_kv_cache_stride_order, as gqa::Backend: the identity
  // (0, 1, 2, 3, 4), or (0, ..., 5) with a leading num_layers dimension; each
  // layer's key and value caches must be contiguous.
  static std::vector<int64_t> kv_cache_stride_order(bool include_num_layers_dimension = false);
};

}  // namespace aar::fa3
