// Internal helpers shared by the CPU twins: argument rejection with named
// errors, paged-KV gathering, and the per-request attention maths (fp32).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "ascend_attn_rt/errors.h"

namespace aar::ops::cpu {

// ---- named rejection of arguments a twin does not implement
inline void reject_tensor(const char* op, const std::optional<at::Tensor>& t, const char* name) {
  if (t.has_value() && t->defined()) {
    throw_not_supported(op, ": not supported by the CPU twin: ", name, " (got a tensor of shape ", t->sizes(),
                        "; pass None)");
  }
}
inline void reject_int(const char* op, int64_t v, int64_t expected, const char* name) {
  if (v != expected) {
    throw_not_supported(op, ": not supported by the CPU twin: ", name, "=", v, " (only ", expected, ")");
  }
}
inline void reject_opt_int(const char* op, const std::optional<int64_t>& v, const char* name) {
  if (v.has_value()) {
    throw_not_supported(op, ": not supported by the CPU twin: ", name, "=", *v, " (pass None)");
  }
}

bool is_float_dtype(at::ScalarType t);  // fp32 / fp16 / bf16

// Copies a length list to host int64 (twins only; not a hot path).
std::vector<int64_t> to_vector(at::OptionalSymIntArrayRef v);
std::vector<int64_t> to_vector(at::OptionalIntArrayRef v);

// Validates a cumulative-ends list (non-negative, non-decreasing) and returns
// per-request (start, length). `total` >= 0 requires the last end == total.
void cumulative_to_ranges(const char* op, const char* name, const std::vector<int64_t>& ends, int64_t total,
                          const char* total_name, std::vector<int64_t>& start, std::vector<int64_t>& len);

// Paged KV layouts. Token j of a request lives in block table[j / bs], offset j % bs.
enum class PagedLayout {
  Hidden3D,  // (nb, bs, Nkv*D)        FIA ND cache view
  Bnbd4D,    // (nb, Nkv, bs, D)       FIA 4-D cache (torch_npu docs)
  Nz5D,      // (nb, Nkv, D/c, bs, c)  NZ, c = 32 / sizeof(dtype)
  Nd4D,      // (nb, bs, Nkv, D)       ATB paged attention cache
};

// Checks block_table (int32, 2-D, rows == batch) and that every block a
// request needs (ceil(kv_len / bs) blocks) is in [0, num_blocks).
void check_block_table(const char* op, const at::Tensor& block_table, int64_t batch,
                       const std::vector<int64_t>& kv_len, int64_t block_size, int64_t num_blocks,
                       const char* kv_len_name);

// Returns (kv_len, Nkv, D) rows of request `row` from a paged cache.
at::Tensor gather_paged(const at::Tensor& cache, PagedLayout layout, const at::Tensor& block_table, int64_t row,
                        int64_t kv_len, int64_t block_size, int64_t num_kv_heads, int64_t head_dim);

// Mask semantics of one request (right-down aligned, docs/design/ops.md §4.1).
struct MaskSpec {
  int64_t sparse_mode = 0;  // 0: none, 3: causal, 4: band
  int64_t pre_tokens = 0;
  int64_t next_tokens = 0;
};

// One request: q (Sq, N, D), k (Skv, Nkv, D), v (Skv, Nkv, Dv), any float dtype.
// Writes out (Sq, N, Dv) and, if defined, lse (Sq, N, 1) (views into the
// caller's outputs). sink: (N,) fp32 or undefined. Rows without an allowed key
// get output 0 and lse -inf (no sink).
void attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const MaskSpec& mask, double scale,
            const at::Tensor& sink, at::Tensor out, at::Tensor lse);

// The compressed mask of sparse modes 2-4: last two dims 2048 x 2048, leading dims 1.
void check_compressed_mask(const char* op, const std::optional<at::Tensor>& mask, int64_t sparse_mode);

}  // namespace aar::ops::cpu
