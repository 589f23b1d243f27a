// The DCP exchange (spec cp.md 4, 5.1, 6.2, 7), shared by every backend that
// shards its KV cache along the sequence (GQA, MLA): the query-head all-gather
// over the DCP group, the all-to-all of partial outputs with their LSE in the
// fp32 wire layout, and the LSE merge through npu_attention_update. It takes
// tensors and a cp::Comm, nothing of a backend: a backend computes its local
// partial over the gathered heads and hands it here.
//
// Shapes (W = comm.size(), H = this rank's query heads, D = head dim, T rows):
//   gather_query_heads  q [T, H, D]            -> [T, W*H, D]   (head g = rank g/H, local head g%H)
//   combine_partials    out [T, W*H, Dv], lse [T, W*H, 1] fp32 (this rank's partial for every
//                       gathered head) -> merged [T, H, Dv] for this rank's own heads (+ lse)
// The wire tensor is [W*H, Dv+1, T] fp32 (the partial output and its LSE along
// the feature axis, heads first so rank blocks are dim-0 blocks); after the
// all-to-all, block i is rank i's partial for this rank's heads, merged in rank
// order. fp32 on the wire whatever the output dtype (spec 10.5), so every rank
// sends the same dtype.
//
// Decisions where the spec is silent:
// - W == 1 issues no collective: the gather is a copy, the combine a copy of
//   the (already complete) partial.
// - T == 0 issues no collective either; whether T is 0 must be a batch-global
//   fact (num_decode_tokens, num_prefill_tokens), so every rank skips alike.
// - The merge is npu_attention_update (update_type 0, or 1 when the merged LSE
//   is wanted) on W lists of [T*H, Dv] / [T*H]: the kernel's limits (W <= 16,
//   Dv a multiple of 8 in [8, 512]) are checked by the op wrapper, before any
//   collective is issued (checked here first, so a rejected call sends
//   nothing). Rows whose W partials are all empty (LSE -inf) merge to 0 / -inf
//   through the CPU twin; on the NPU callers only merge rows that have at least
//   one key somewhere (decode rows always do: rank 0 owns position 0).
// - A DcpWorkspace, when given, holds every intermediate at stable addresses
//   (graph capture; no allocation per layer); without one each call allocates
//   its intermediates.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>

#include "ascend_attn_rt/cp/comm.h"

namespace aar::cp {

// Intermediates of one exchange shape, reused across layers and steps: sized
// for max_rows rows, viewed to the step's rows.
//
// Thread safety: one thread at a time (layers using one workspace run in order).
class DcpWorkspace {
 public:
  DcpWorkspace() = default;
  // Buffers for up to max_rows rows of `heads` local heads, head dim
  // `head_dim`, group size `world`, query dtype `q_dtype`, on `device`.
  DcpWorkspace(int64_t max_rows, int64_t world, int64_t heads, int64_t head_dim, at::ScalarType q_dtype,
               c10::Device device);
  bool defined() const { return max_rows_ > 0; }
  int64_t max_rows() const { return max_rows_; }

  // Views for T rows (T <= max_rows).
  at::Tensor gathered_query(int64_t T) const;  // [T, W*H, D] q dtype
  at::Tensor send(int64_t T) const;            // [W*H, D+1, T] fp32
  at::Tensor recv(int64_t T) const;            // [W*H, D+1, T] fp32
  at::Tensor parts_out(int64_t T) const;       // [W, T*H, D] fp32
  at::Tensor parts_lse(int64_t T) const;       // [W, T*H] fp32

 private:
  int64_t max_rows_ = 0, world_ = 1, heads_ = 0, dim_ = 0;
  at::Tensor q_, send_, recv_, out_, lse_;
};

// Spec 4 step 1: q [T, H, D] gathered along the head axis over the group.
// `out` (optional, contiguous [T, W*H, D]) receives it.
at::Tensor gather_query_heads(Comm& comm, const at::Tensor& q, const std::optional<at::Tensor>& out = std::nullopt);

// Spec 4 steps 4-5 / 5.1 step 3: exchange this rank's partial for all W*H
// gathered heads and merge the W partials of this rank's own H heads.
// partial_out [T, W*H, Dv] (any float dtype), partial_lse [T, W*H, 1] (or
// [T, W*H]) fp32. Writes merged [T, H, Dv] into `out` (any float dtype, may be
// a strided view) and, when given, the merged LSE into `lse_out` ([T, H, 1] or
// [T, H], fp32).
void combine_partials(Comm& comm, const at::Tensor& partial_out, const at::Tensor& partial_lse, at::Tensor& out,
                      const std::optional<at::Tensor>& lse_out = std::nullopt, const DcpWorkspace* ws = nullptr);

}  // namespace aar::cp
