// Internal: the RoPE cos/sin rows a metadata builder gathers on the host into
// its packed staging buffer (MLA decode and prefill rows, SFA rows of every
// token), so a step needs no index_select on the device: the rows travel with
// the builder's one host-to-device copy.
//
// The tables are the MLA "half layout" ones, (max_position, R) with equal
// halves (docs/design/mla.md §1.3, docs/design/sfa.md §3.1), in any floating dtype whose rows are a
// multiple of 4 bytes (the packed buffer is int32 words), at least one row (padding tokens read row 0).
// The builder keeps contiguous host copies of them.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace aar::detail {

// A layer's check of the metadata's RoPE rows (cos or sin, (rows, R); undefined: none) against its
// qk_rope_head_dim: rows a builder gathered from tables of another width fail deep in the rope.
void check_rope_rows_width(const at::Tensor& rows, int64_t rope_dim);

class RopeRows {
 public:
  using GatherFn = void (*)(const uint8_t*, const uint8_t*, const int32_t*, int32_t, uint8_t*, uint8_t*);

  RopeRows() = default;
  // Validates the pair (errors name cos_table / sin_table: a (max_position, R)
  // floating tensor each with data (not meta), at least one row, same shape and
  // dtype, even R >= 2, rows a multiple of 4 bytes) and keeps contiguous host copies.
  RopeRows(const at::Tensor& cos_table, const at::Tensor& sin_table);

  int64_t positions() const { return cos_.size(0); }
  int64_t dim() const { return cos_.size(1); }
  at::ScalarType dtype() const { return cos_.scalar_type(); }
  int64_t row_bytes() const { return row_bytes_; }
  int64_t row_words() const { return row_bytes_ / 4; }
  const at::Tensor& cos_table() const { return cos_; }  // host, contiguous
  const at::Tensor& sin_table() const { return sin_; }

  // out_cos row i = cos row pos[i], out_sin likewise, i < n (positions checked
  // by the caller). Rows of 64..512 bytes move as 32-byte vectors (AVX2 when
  // the CPU has it), others one memcpy per row.
  void gather(const int32_t* pos, int32_t n, uint8_t* out_cos, uint8_t* out_sin) const;
  // n rows of consecutive positions first_pos.. (a prefill's tokens): one
  // memcpy per table.
  void copy_run(int32_t first_pos, int32_t n, uint8_t* out_cos, uint8_t* out_sin) const;
  // (rows, R) in the tables' dtype, reinterpreting `words` (an int32 buffer)
  // from word `offset` on.
  at::Tensor view(const at::Tensor& words, int64_t offset, int64_t rows) const;

 private:
  at::Tensor cos_, sin_;
  int64_t row_bytes_ = 0;
  GatherFn gather_ = nullptr;  // specialised for the row size, or null
};

}  // namespace aar::detail
