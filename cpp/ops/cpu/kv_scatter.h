// Internal: the paged KV-cache write shared by npu_scatter_pa_kv_cache and
// _npu_reshape_and_cache. Validates everything (dtypes, shapes, every slot)
// before the first write, so a rejected call leaves both caches untouched.
#pragma once

#include <ATen/ATen.h>

namespace aar::ops::cpu {

enum class CacheFormat {
  Nd,  // (nb, bs, ...) with per-slot trailing shape == per-token key shape
  Nz,  // (nb, Nkv, D/c, bs, c), c = 32 / sizeof(dtype)
};

void scatter_kv(const char* op, const char* slot_name, const at::Tensor& key, const at::Tensor& value,
                at::Tensor& key_cache, at::Tensor& value_cache, const at::Tensor& slots, CacheFormat format);

}  // namespace aar::ops::cpu
