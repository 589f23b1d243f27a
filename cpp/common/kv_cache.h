// Internal: the layout checks of caller-owned KV caches, shared by every
// backend (GQA, C8, FA3, MLA) and by the block copies (swap_blocks,
// copy_blocks).
//
// The NPU kernels that read and write the attention caches (FIA, paged
// attention, npu_scatter_pa_kv_cache, the MLA kernels) take a cache whose memory
// is exactly the backend's declared layout: the shape of Backend::kv_cache_shape
// laid out in Backend::kv_cache_stride_order (the identity: row-major), so the
// tensor handed to forward must be contiguous. Any storage offset is fine (a
// block slice cache[a:b], or one layer / the key half of a stacked allocation).
// Anything else (a permuted view, a head or column slice, padded block strides,
// an as_strided view with other strides, overlapping rows) is rejected by name
// with its shape and strides, before anything is written: reading it through a
// `reshape` would read a copy, and handing it to a kernel would read the wrong
// bytes.
#pragma once

#include <ATen/core/Tensor.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "ascend_attn_rt/errors.h"
#include "impl_checks.h"

namespace aar::detail {

[[noreturn]] __attribute__((noinline, cold)) inline void throw_kv_cache_layout(const at::Tensor& cache,
                                                                            const char* name,
                                                                            const char* layout) {
  std::vector<int64_t> expected(cache.dim());
  int64_t s = 1;
  for (int64_t i = cache.dim() - 1; i >= 0; --i) {
    expected[i] = s;
    s *= std::max<int64_t>(cache.size(i), 1);
  }
  throw_invalid(name, " must be contiguous in the backend's layout ", layout,
                " with stride order kv_cache_stride_order() (row-major strides ", c10::IntArrayRef(expected),
                ", any storage offset); got shape ", cache.sizes(), " strides ", cache.strides(),
                " (the kernels read the memory as laid out: allocate kv_cache_shape in kv_cache_stride_order, "
                "not a permuted, sliced or re-strided view)");
}

// `layout` describes the expected shape, e.g.
// "(num_blocks, block_size, num_kv_heads, head_size) = kv_cache_shape(...)[1:]".
// Hot path: one cached flag read when the cache is good.
inline void check_kv_cache_layout(const at::Tensor& cache, const char* name, const char* layout) {
  if (__builtin_expect(cache.is_contiguous(), 1)) return;
  throw_kv_cache_layout(cache, name, layout);
}

// True when no two elements of `t` share memory. Dimensions sorted by stride,
// each stride must step over everything the smaller ones span. This is
// sufficient, not necessary: an exotic interleaving (sizes (3, 2), strides
// (2, 3)) is non-overlapping but reported as overlapping; no cache allocator
// makes one.
inline bool is_non_overlapping(const at::Tensor& t) {
  if (t.is_non_overlapping_and_dense()) return true;
  std::vector<std::pair<int64_t, int64_t>> dims;  // (|stride|, size), size > 1 only
  dims.reserve(t.dim());
  for (int64_t i = 0; i < t.dim(); ++i) {
    if (t.size(i) == 0) return true;  // no elements
    if (t.size(i) > 1) dims.emplace_back(t.stride(i) < 0 ? -t.stride(i) : t.stride(i), t.size(i));
  }
  std::sort(dims.begin(), dims.end());
  int64_t span = 0;  // max offset reachable with the smaller strides
  for (const auto& [stride, size] : dims) {
    if (stride <= span) return false;
    span += stride * (size - 1);
  }
  return true;
}

// For torch indexing copies (swap_blocks, copy_blocks), which honour any
// strides: everything but an internally overlapping destination or source.
inline void check_non_overlapping(const at::Tensor& t, const char* name) {
  if (__builtin_expect(is_non_overlapping(t), 1)) return;
  throw_invalid(name, " may have overlapping elements (shape ", t.sizes(), ", strides ", t.strides(),
                "): a KV cache must give every element its own memory (no expand or overlapping as_strided view)");
}

// The identity stride order of a cache of `rank` logical dimensions (plus a
// leading num_layers dimension when asked): what every backend here declares.
inline std::vector<int64_t> identity_stride_order(int64_t rank, bool include_num_layers_dimension) {
  std::vector<int64_t> order(rank + (include_num_layers_dimension ? 1 : 0));
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int64_t>(i);
  return order;
}

// Two caches of one layer (K and V; latent and rope) must not share memory: the
// second write would overwrite the first. Views of one stacked allocation (kv[0],
// kv[1]) are disjoint and pass.
inline void check_caches_disjoint(const at::Tensor& a, const at::Tensor& b, const char* a_name,
                                  const char* b_name) {
  internal::check_apart(a, a_name, b, b_name, internal::kCachesApartWhy);
}

}  // namespace aar::detail
