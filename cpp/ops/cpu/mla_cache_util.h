// Internal: row access to the single-head MLA paged caches used by the MLA CPU
// twins. ND: (nb, bs, 1, D); NZ: (nb, 1, D/c, bs, c) with c = 32 / sizeof(dtype)
// (NZ element (blk, c1, s, c0) == ND element (blk, s, c1*c + c0)).
#pragma once

#include <ATen/ATen.h>

#include "ascend_attn_rt/errors.h"

namespace aar::ops::cpu {

struct MlaCacheView {
  at::Tensor cache;
  bool nz = false;
  int64_t num_blocks = 0, block_size = 0, dim = 0;

  // Validates the cache shape for `mode` ("PA"/"PA_BSND" = ND, "PA_NZ" = NZ).
  static MlaCacheView make(const char* op, const char* name, const at::Tensor& cache, bool nz) {
    MlaCacheView v;
    v.cache = cache;
    v.nz = nz;
    if (!nz) {
      AAR_CHECK_ARG(cache.dim() == 4 && cache.size(2) == 1, op, ": ", name,
                    " must be a paged ND cache (num_blocks, block_size, 1, D), got ", cache.sizes());
      v.num_blocks = cache.size(0);
      v.block_size = cache.size(1);
      v.dim = cache.size(3);
    } else {
      const int64_t c = 32 / static_cast<int64_t>(cache.element_size());
      AAR_CHECK_ARG(cache.dim() == 5 && cache.size(1) == 1 && cache.size(4) == c, op, ": ", name,
                    " must be a paged NZ cache (num_blocks, 1, D/", c, ", block_size, ", c, "), got ",
                    cache.sizes());
      v.num_blocks = cache.size(0);
      v.block_size = cache.size(3);
      v.dim = cache.size(2) * c;
    }
    return v;
  }

  void write(int64_t slot, const at::Tensor& row) const {
    const int64_t blk = slot / block_size, off = slot % block_size;
    if (!nz) {
      cache.select(0, blk).select(0, off).select(0, 0).copy_(row);
    } else {
      const int64_t c = cache.size(4);
      cache.select(0, blk).select(0, 0).select(1, off).copy_(row.view({dim / c, c}));
    }
  }

  // (bs, D) rows of block `blk`.
  at::Tensor block(int64_t blk) const {
    if (!nz) return cache.select(0, blk).select(1, 0);
    // (D/c, bs, c) -> (bs, D/c, c) -> (bs, D)
    return cache.select(0, blk).select(0, 0).permute({1, 0, 2}).reshape({block_size, dim});
  }
};

}  // namespace aar::ops::cpu
