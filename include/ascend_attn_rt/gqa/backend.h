// Static facts of the GQA/MHA backend (docs/design/gqa.md §1).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <utility>
#include <vector>
#include "ascend_attn_rt/core/backend.h"

namespace aar::gqa {

struct Backend {
  // The declared facts (core/backend.h), registered with the runtime.
  static core::BackendFacts facts();
  // The name vLLM knows the upstream backend by ("CUSTOM").
  static const char* name();
  // Kernel block sizes this runtime accepts. Upstream fixes 128; the kernels
  // (FIA, PagedAttention) take any multiple of 16 up to 512, and smaller blocks
  // are useful for tests and small caches, so we accept 16, 32, 64 and 128.
  static const std::vector<int64_t>& supported_block_sizes();
  static bool is_supported_block_size(int64_t block_size);
  // (2, num_blocks, block_size, num_kv_heads, head_size), whatever the dtype.
  // A layer takes the key and value halves, (num_blocks, block_size,
  // num_kv_heads, head_size) each.
  static std::vector<int64_t> kv_cache_shape(int64_t num_blocks, int64_t block_size, int64_t num_kv_heads,
                                             int64_t head_size);
  // vLLM's AttentionBackend.get_kv_cache_stride_order: the permutation from
  // kv_cache_shape to the physical layout (an engine allocates
  // [shape[i] for i in order] and permutes the result back with the inverse
  // order). With include_num_layers_dimension the logical shape gains a leading
  // num_layers dimension (one allocation for every layer).
  //
  // The kernels read each layer's key and value caches as contiguous
  // row-major (num_blocks, block_size, num_kv_heads, head_size) memory, so the
  // order is the identity: (0, 1, 2, 3, 4), or (0, 1, 2, 3, 4, 5) with the
  // layers dimension outermost (each layer's cache stays contiguous). forward
  // rejects caches that are not contiguous (any storage offset is fine).
  static std::vector<int64_t> kv_cache_stride_order(bool include_num_layers_dimension = false);
  // dst[dst_idx] = src[src_idx] along dim 0 for K and V; src_to_dst is (M, 2)
  // integer pairs; gathers before it scatters. The caches may have any
  // non-overlapping strides (torch indexing honours them). Everything (both
  // pairs' shapes, dtypes and devices, every index) is validated before the
  // first copy: a rejected call leaves the destination untouched.
  static void swap_blocks(const at::Tensor& src_key_cache, const at::Tensor& src_value_cache,
                          at::Tensor& dst_key_cache, at::Tensor& dst_value_cache, const at::Tensor& src_to_dst);
  // For every (K, V) pair: cache[dst] = cache[src] within the same tensor;
  // gather-then-scatter semantics. Any non-overlapping strides; every layer
  // and index is validated before the first copy.
  static void copy_blocks(const std::vector<std::pair<at::Tensor, at::Tensor>>& kv_caches,
                          const at::Tensor& src_to_dsts);
};

}  // namespace aar::gqa
