// The SFA C8 packed KV row (docs/design/sfa.md §5): one 656-byte int8 row per
// token, [k_nope_q: 512 x int8 | k_rope: 64 x fp16/bf16 (128 B) | scale: 4 x fp32 (16 B)],
// k_nope[d] = k_nope_q[d] * scale[d / 128]. npu_kv_quant_sparse_flash_attention
// reads these rows (key = value = the packed cache (nb, bs, 1, 656)).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "ascend_attn_rt/ops/provider.h"

namespace aar::ops {

constexpr int64_t kSfaC8NopeDim = 512;   // L
constexpr int64_t kSfaC8RopeDim = 64;    // R
constexpr int64_t kSfaC8Tile = 128;      // columns per scale
constexpr int64_t kSfaC8Scales = kSfaC8NopeDim / kSfaC8Tile;
constexpr int64_t kSfaC8RowBytes = kSfaC8NopeDim + 2 * kSfaC8RopeDim + 4 * kSfaC8Scales;  // 656

// Packs rows (..., 656) int8 from k_nope (..., 512) float and k_rope (..., 64)
// fp16/bf16 (the rope bytes are stored as they are, in k_rope's dtype). The
// nope part is quantised by npu_dynamic_block_quant(row 1, col 128) through the
// operator provider (scale = amax / 127 per 128-column tile, q = rint(x / scale)),
// so on the NPU this is the device operator plus a concatenation.
at::Tensor pack_sfa_c8_rows(const at::Tensor& k_nope, const at::Tensor& k_rope, Provider pv = Provider::Auto);

// As above, rows in `row_dtype`: int8 (A2/A3) or float8_e4m3fn (A5, docs/design/sfa.md §5:
// the same byte order reinterpreted as fp8; the nope part quantised by
// npu_dynamic_block_quant with dst_type = float8_e4m3fn's ScalarType value).
// torch_npu 2.14 documents dst_type 1 (int8) only, on A2/A3; the CPU twin
// implements both (fp8: scale = amax / 448, the nearest e4m3 value, ties to even).
at::Tensor pack_sfa_c8_rows(const at::Tensor& k_nope, const at::Tensor& k_rope, at::ScalarType row_dtype,
                            Provider pv = Provider::Auto);

struct SfaC8Unpacked {
  at::Tensor k_nope_q;  // (..., 512) the rows' dtype: int8 or float8_e4m3fn
  at::Tensor k_rope;    // (..., 64) rope_dtype
  at::Tensor scale;     // (..., 4) fp32
  at::Tensor k_nope;    // (..., 512) fp32, dequantised: k_nope_q * scale[d / 128]
};

// Splits and dequantises packed rows (..., 656) int8 or float8_e4m3fn; rope_dtype is the dtype
// the rope bytes hold (the query's: kHalf or kBFloat16). Results are new
// tensors (no aliasing of `rows`).
SfaC8Unpacked unpack_sfa_c8_rows(const at::Tensor& rows, at::ScalarType rope_dtype);

}  // namespace aar::ops
