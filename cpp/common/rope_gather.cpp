#include "rope_gather.h"

#include <ATen/ATen.h>

#include <cstring>

#include "ascend_attn_rt/errors.h"
#include "../plan/cpu_features.h"

namespace aar::detail {

namespace {

// RoPE rows: out row i = table row pos[i], for cos and sin in one pass (the
// position is loaded once). N is the row size in bytes, a multiple of 32: the
// rows move as 32-byte generic vectors, which an AVX2 clone (below) turns into
// one load and one store each. Without AVX2 the same code is two SSE2 / NEON
// moves per vector.
using Bytes32 = uint8_t __attribute__((vector_size(32)));
using GatherFn = RopeRows::GatherFn;

template <size_t N>
__attribute__((always_inline)) inline void gather_rows_body(const uint8_t* cos, const uint8_t* sin,
                                                              const int32_t* pos, int32_t n, uint8_t* out_cos,
                                                              uint8_t* out_sin) {
  static_assert(N % sizeof(Bytes32) == 0, "row size must be a multiple of 32 bytes");
  for (int32_t i = 0; i < n; ++i) {
    const size_t src = static_cast<size_t>(pos[i]) * N, dst = static_cast<size_t>(i) * N;
    for (size_t k = 0; k < N; k += sizeof(Bytes32)) {
      Bytes32 c, s;
      std::memcpy(&c, cos + src + k, sizeof c);
      std::memcpy(&s, sin + src + k, sizeof s);
      std::memcpy(out_cos + dst + k, &c, sizeof c);
      std::memcpy(out_sin + dst + k, &s, sizeof s);
    }
  }
}

template <size_t N>
void gather_rows_default(const uint8_t* cos, const uint8_t* sin, const int32_t* pos, int32_t n, uint8_t* out_cos,
                         uint8_t* out_sin) {
  gather_rows_body<N>(cos, sin, pos, n, out_cos, out_sin);
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
// The project builds for baseline x86-64 (SSE2), where a 128-byte row is eight
// 16-byte stores; stores are what bounds this copy (measured on Zen 2: 512 rows
// of 128 B in 1.5 us with SSE2, 1.0 us with AVX2). Chosen at run time.
template <size_t N>
__attribute__((target("avx2"))) void gather_rows_avx2(const uint8_t* cos, const uint8_t* sin, const int32_t* pos,
                                                      int32_t n, uint8_t* out_cos, uint8_t* out_sin) {
  gather_rows_body<N>(cos, sin, pos, n, out_cos, out_sin);
}
template <size_t N>
GatherFn pick_gather() {
  return cpu_has_avx2() ? &gather_rows_avx2<N> : &gather_rows_default<N>;
}
#else
template <size_t N>
GatherFn pick_gather() {
  return &gather_rows_default<N>;
}
#endif

// The specialised gather for the usual row sizes (64..512 bytes; DeepSeek's
// R = 64 in bf16 is 128), or null: then one memcpy per row.
GatherFn gather_for_row_bytes(int64_t row_bytes) {
  switch (row_bytes) {
    case 64: return pick_gather<64>();
    case 128: return pick_gather<128>();
    case 256: return pick_gather<256>();
    case 512: return pick_gather<512>();
    default: return nullptr;
  }
}

}  // namespace

void check_rope_rows_width(const at::Tensor& rows, int64_t rope_dim) {
  AAR_CHECK_ARG(!rows.defined() || rows.dim() != 2 || rows.size(1) == rope_dim, "the metadata's rope rows have width ",
                rows.size(-1), " but the layer's qk_rope_head_dim=", rope_dim,
                " (the builder's cos_table / sin_table are (max_position, qk_rope_head_dim))");
}

RopeRows::RopeRows(const at::Tensor& cos_table, const at::Tensor& sin_table) {
  for (const at::Tensor* t : {&cos_table, &sin_table}) {
    const char* name = t == &cos_table ? "cos_table" : "sin_table";
    AAR_CHECK_ARG(t->defined() && t->dim() == 2 && t->size(1) % 2 == 0, name,
                  " must be a (max_position, qk_rope_head_dim) tensor, got ",
                  t->defined() ? t->sizes() : c10::IntArrayRef{});
    // Padding tokens read row 0 and the rows are copied to the host: at least one row, of data.
    AAR_CHECK_ARG(t->size(0) >= 1 && t->size(1) >= 2, name, " must have at least one row of qk_rope_head_dim >= 2 "
                  "columns, got ", t->sizes());
    AAR_CHECK_ARG(at::isFloatingType(t->scalar_type()), name, " must be a floating tensor (the rotary cos / sin "
                  "values), got ", t->scalar_type());
    AAR_CHECK_ARG(!t->is_meta(), name, " is a meta tensor: the builder copies its rows on the host, it needs data");
  }
  AAR_CHECK_ARG(cos_table.sizes() == sin_table.sizes(), "cos_table ", cos_table.sizes(), " and sin_table ",
                sin_table.sizes(), " must have the same shape");
  AAR_CHECK_ARG(cos_table.scalar_type() == sin_table.scalar_type(), "cos_table dtype ", cos_table.scalar_type(),
                " and sin_table dtype ", sin_table.scalar_type(), " must match");
  const int64_t rope_dim = cos_table.size(1);
  row_bytes_ = rope_dim * static_cast<int64_t>(cos_table.element_size());
  AAR_CHECK_ARG(row_bytes_ % 4 == 0, "cos_table rows are ", row_bytes_, " bytes (qk_rope_head_dim=", rope_dim,
                ", dtype ", cos_table.scalar_type(),
                "); the builder packs RoPE rows into its int32 staging buffer, which needs a multiple of 4 bytes");
  // The rows are gathered on the host, so the tables live there.
  cos_ = cos_table.to(at::kCPU).contiguous();
  sin_ = sin_table.to(at::kCPU).contiguous();
  gather_ = gather_for_row_bytes(row_bytes_);
}

void RopeRows::gather(const int32_t* pos, int32_t n, uint8_t* out_cos, uint8_t* out_sin) const {
  if (n <= 0) return;
  const auto* cos_t = static_cast<const uint8_t*>(cos_.const_data_ptr());
  const auto* sin_t = static_cast<const uint8_t*>(sin_.const_data_ptr());
  if (gather_ != nullptr) {
    gather_(cos_t, sin_t, pos, n, out_cos, out_sin);
    return;
  }
  const size_t rb = static_cast<size_t>(row_bytes_);
  for (int32_t i = 0; i < n; ++i) {
    std::memcpy(out_cos + i * rb, cos_t + static_cast<size_t>(pos[i]) * rb, rb);
    std::memcpy(out_sin + i * rb, sin_t + static_cast<size_t>(pos[i]) * rb, rb);
  }
}

void RopeRows::copy_run(int32_t first_pos, int32_t n, uint8_t* out_cos, uint8_t* out_sin) const {
  if (n <= 0) return;
  const size_t rb = static_cast<size_t>(row_bytes_), src = static_cast<size_t>(first_pos) * rb;
  std::memcpy(out_cos, static_cast<const uint8_t*>(cos_.const_data_ptr()) + src, n * rb);
  std::memcpy(out_sin, static_cast<const uint8_t*>(sin_.const_data_ptr()) + src, n * rb);
}

at::Tensor RopeRows::view(const at::Tensor& words, int64_t offset, int64_t rows) const {
  return words.narrow(0, offset, rows * row_words()).view(dtype()).view({rows, dim()});
}

}  // namespace aar::detail
