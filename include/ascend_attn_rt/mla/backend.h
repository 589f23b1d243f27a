// Static facts of the MLA backend (docs/design/mla.md §1): two per-layer paged
// caches, the latent ("nope") cache (num_blocks, block_size, 1, kv_lora_rank)
// and the rope cache (num_blocks, block_size, 1, qk_rope_head_dim); their NZ
// views; block sizes; head padding to a power of two for the decode kernel.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "ascend_attn_rt/core/backend.h"

namespace aar::mla {

struct Backend {
  // The declared facts (core/backend.h), registered with the runtime. The
  // builder-less mla::LatentAttention takes this backend's metadata and is no
  // backend of its own.
  static core::BackendFacts facts();
  static const char* name();  // "ASCEND_MLA"
  // Upstream fixes 128; like the GQA backend we also accept 16, 32 and 64
  // (the kernels take multiples of 16) for tests and small caches.
  static const std::vector<int64_t>& supported_block_sizes();
  static bool is_supported_block_size(int64_t block_size);
  // The upstream get_kv_cache_shape: (num_blocks, block_size, num_kv_heads, head_size) unchanged.
  static std::vector<int64_t> kv_cache_shape(int64_t num_blocks, int64_t block_size, int64_t num_kv_heads,
                                             int64_t head_size);
  // vLLM's get_kv_cache_stride_order (see gqa::Backend) for kv_cache_shape and
  // each of kv_cache_shapes: the kernels read the latent and rope caches as
  // contiguous row-major memory, so the order is the identity (0, 1, 2, 3), or
  // (0, 1, 2, 3, 4) with a leading num_layers dimension (layers outermost, each
  // layer contiguous). NZ caches (enable_kv_nz) are contiguous tensors of
  // nz_cache_shape. forward rejects caches that are not contiguous (any storage
  // offset is fine; the size-1 head dimension's stride does not matter).
  static std::vector<int64_t> kv_cache_stride_order(bool include_num_layers_dimension = false);
  // The two caches of one layer: {latent (nb, bs, 1, L), rope (nb, bs, 1, R)}.
  static std::vector<std::vector<int64_t>> kv_cache_shapes(int64_t num_blocks, int64_t block_size,
                                                           int64_t kv_lora_rank, int64_t qk_rope_head_dim);
  // FRACTAL_NZ view shape of a (nb, bs, 1, D) cache: (nb, 1, D/c, bs, c), c = 32 / element size
  // (16 for fp16/bf16, 32 for int8). NZ element (blk, c1, s, c0) == ND element (blk, s, c1*c + c0).
  static std::vector<int64_t> nz_cache_shape(int64_t num_blocks, int64_t block_size, int64_t dim,
                                             int64_t element_size);
  // Copies an ND cache (nb, bs, 1, D) into a new NZ-layout tensor and back.
  static at::Tensor to_nz(const at::Tensor& nd_cache);
  static at::Tensor from_nz(const at::Tensor& nz_cache);
  // The decode kernel's head count: next power of two >= num_heads (1..128).
  static int64_t num_heads_padded(int64_t num_heads);
  static constexpr int64_t kMaxHeads = 128;
};

}  // namespace aar::mla
