// Static facts of the C8 (INT8 KV cache) backend. Upstream installs the C8
// impl into the CUSTOM backend per layer (docs/design/gqa.md §5.1); here it is a backend of
// its own with an explicit NZ cache shape.
#pragma once

#include <cstdint>
#include <vector>
#include "ascend_attn_rt/core/backend.h"

namespace aar::c8 {

struct Backend {
  // The declared facts (core/backend.h), registered with the runtime.
  static core::BackendFacts facts();
  static const char* name();  // "CUSTOM" (the upstream registration name)
  // NZ needs block_size % 32 == 0: 32, 64, 128.
  static const std::vector<int64_t>& supported_block_sizes();
  static bool is_supported_block_size(int64_t block_size);
  // (2, num_blocks, num_kv_heads, head_size / 32, block_size, 32), int8.
  // head_size must be a multiple of 32.
  static std::vector<int64_t> kv_cache_shape(int64_t num_blocks, int64_t block_size, int64_t num_kv_heads,
                                             int64_t head_size);
  // vLLM's get_kv_cache_stride_order (see gqa::Backend): the kernels read each
  // layer's key and value caches as contiguous row-major NZ memory
  // (num_blocks, num_kv_heads, head_size / 32, block_size, 32), so the order is
  // the identity, (0, ..., 5), or (0, ..., 6) with a leading num_layers
  // dimension (layers outermost, each layer contiguous). forward rejects caches
  // that are not contiguous (any storage offset is fine).
  static std::vector<int64_t> kv_cache_stride_order(bool include_num_layers_dimension = false);
};

}  // namespace aar::c8
