// Static facts of the C8 (INT8 KV cache) backend. Upstream installs the C8
// impl into the CUSTOM backend per layer (spec 8.1); here it is a backend of
// its own with an explicit NZ cache shape.
#pragma once

#include <cstdint>
#include <vector>

namespace aar::c8 {

struct Backend {
  static const char* name();  // "CUSTOM" (the upstream registration name)
  // NZ needs block_size % 32 == 0: 32, 64, 128.
  static const std::vector<int64_t>& supported_block_sizes();
  static bool is_supported_block_size(int64_t block_size);
  // (2, num_blocks, num_kv_heads, head_size / 32, block_size, 32), int8.
  // head_size must be a multiple of 32.
  static std::vector<int64_t> kv_cache_shape(int64_t num_blocks, int64_t block_size, int64_t num_kv_heads,
                                             int64_t head_size);
};

}  // namespace aar::c8
