// Internal: small helpers shared by the DSA compressor CPU twins (compressor,
// compressor_metadata, the two epilogs): reading int32/int64 index tensors to
// the host with named errors, and the cu_seqlens checks.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

#include "ascend_attn_rt/errors.h"

namespace aar::ops::cpu::dsa {

// A 1-D int32 or int64 CPU tensor, as int64 values.
std::vector<int64_t> read_ints(const char* op, const at::Tensor& t, const char* name);

// A 2-D int32 or int64 CPU table, row-major int64.
struct IntTable {
  int64_t rows = 0, cols = 0;
  std::vector<int64_t> v;
  int64_t at(int64_t r, int64_t c) const { return v[static_cast<size_t>(r * cols + c)]; }
};
IntTable read_table(const char* op, const at::Tensor& t, const char* name);

// cu_seqlens (B + 1): cu[0] == 0, non-decreasing, cu[B] <= tokens (tokens < 0:
// no bound). Returns B.
int64_t check_cu_seqlens(const char* op, const std::vector<int64_t>& cu, int64_t tokens, const char* tokens_name);

// One-byte dtypes a byte-addressed cache may have (uint8, int8, fp8 e4m3 / e5m2).
bool is_byte_dtype(at::ScalarType t);

}  // namespace aar::ops::cpu::dsa
