// C8 quantisation, the NZ INT8 cache layout, and dequantisation to dense
// (docs/design/gqa.md §5.3, §5.5, §5.1).
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/List.h>
#include <c10/util/ArrayRef.h>

#include <optional>

#include <cstdint>

#include "ascend_attn_rt/c8/scales.h"

namespace aar::c8 {

// NZ fractal width for int8: 32 bytes / sizeof(int8).
inline constexpr int64_t kNzWidth = 32;

// x (T, Nkv, D) float -> int8 clamp(round_half_even(x * inv_scale + offset),
// -128, 127), computed in fp32 (upstream computes in the model dtype).
at::Tensor quantize(const at::Tensor& x, const at::Tensor& inv_scale, const at::Tensor& offset);

// int8 (..., Nkv, D) -> (q - offset) * scale in `dtype` (fp32 maths).
at::Tensor dequantize(const at::Tensor& q, const at::Tensor& scale, const at::Tensor& offset, at::ScalarType dtype);

// The (num_blocks, block_size) of an int8 C8 cache given either as NZ (nb, Nkv,
// D/32, bs, 32) or with the ND shape it is declared with, (nb, bs, Nkv, D),
// whose bytes are NZ-ordered (docs/design/gqa.md §5.1; never index such a tensor as (blk, off,
// h, d)). Either form must be contiguous (the kernels read the NZ bytes as laid
// out; any storage offset is fine): anything else is rejected with `name`, its
// shape and strides. Makes no tensor (the per-layer validation calls it).
struct NzCacheGeometry {
  int64_t num_blocks = 0, block_size = 0;
};
NzCacheGeometry check_nz_cache(const at::Tensor& cache, int64_t num_kv_heads, int64_t head_size, const char* name);

// check_nz_cache, then the 5-D NZ view of the cache (the cache itself when it
// is 5-D), aliasing its memory.
at::Tensor nz_view(const at::Tensor& cache, int64_t num_kv_heads, int64_t head_size, const char* name);

// Paged NZ int8 cache -> dense (sum(seq_lens), Nkv, D) in `dtype`: request b's
// positions 0..seq_lens[b]-1 (block block_table[b, j / bs], offset j % bs),
// request after request, dequantised with (q - offset) * scale. Upstream drops
// the offset here (correct only for symmetric scales). block_table may live on
// the device; seq_lens are host values; unused block-table columns are never
// dereferenced (clamped into range, then discarded).
at::Tensor dequant_paged_to_dense(const at::Tensor& cache_nz, const at::Tensor& block_table,
                                  c10::IntArrayRef seq_lens, const at::Tensor& scale, const at::Tensor& offset,
                                  at::ScalarType dtype);

// The (block, offset) index pair of cache slots (device int64, block *
// block_size + offset each) for dequant_slots.
c10::List<std::optional<at::Tensor>> nz_slot_index(const at::Tensor& slots, int64_t block_size);

// The rows of an NZ int8 cache at the slots of `slot_index`, dequantised:
// (n, Nkv, D) in `dtype`. Device operations only (no host loop): what forward
// uses with the slots a build computed (gqa::Metadata::dense).
at::Tensor dequant_slots(const at::Tensor& cache_nz, const c10::List<std::optional<at::Tensor>>& slot_index,
                         const at::Tensor& scale, const at::Tensor& offset, at::ScalarType dtype);

}  // namespace aar::c8
