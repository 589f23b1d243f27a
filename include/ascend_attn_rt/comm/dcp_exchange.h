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
// The wire tensor is [W, T, H, Dv+1] fp32 (the partial output and its LSE along
// the feature axis; block j = this rank's partial for rank j's H heads); after
// the all-to-all, block i is rank i's partial for this rank's heads, merged in
// rank order. fp32 on the wire whatever the output dtype (spec 10.5), so every
// rank sends the same dtype.
//
// Decisions where the spec is silent:
// - The wire's order. Upstream sends [W*H, Dv+1, T] (spec 6.2: heads first,
//   tokens last); both ends of the exchange are ours, and any layout whose
//   dim-0 blocks are the rank blocks carries the same bytes per rank. Ours is
//   token-major inside each block, so packing the partial and unpacking the
//   merge inputs copy contiguous runs of Dv; upstream's layout transposes the
//   token axis on both sides (a 128-token decode batch, 8 heads of 128 per
//   rank, bf16, CPU: the forward's host copies went from 7.2 ms to 1.8 ms).
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
//   its intermediates. One workspace per shape (DcpWorkspace::shared): the
//   layers of a model run one after the other on one stream, so a layer's
//   intermediates are dead when the next layer starts, and they share one
//   set of buffers (as the MLA decode workspace does), grown to the largest
//   row count seen (views handed out keep the older, smaller buffers alive).
//   The views for a row count are made once and cached, so a steady-state
//   exchange creates no tensor for them.
// - The merge result itself comes from npu_attention_update, which has no out
//   form: one tensor per call, copied into `out`.
#pragma once

#include <ATen/core/Tensor.h>

#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "ascend_attn_rt/comm/comm.h"

namespace aar::detail {
class ExclusiveUse;  // cpp/common/exclusive_use.h
}

namespace aar::cp {

// What a DcpWorkspace is sized by. q_dim: the gathered query's last dim
// (GQA: D; MLA: L + R, the concatenated [ql_nope | q_pe]); out_dim: the
// partial output's (GQA: D; MLA: L). regroup: a second set of query / partial
// buffers for a backend that reorders the gathered heads before its kernel
// (GQA with several KV heads per rank, cp/gqa_dcp.h) or splits the gathered
// query (MLA: [ql_nope | q_pe] into two contiguous parts), and a buffer for
// the local query a backend assembles before the gather (MLA's concat).
struct DcpWorkspaceShape {
  c10::Device device = c10::Device(c10::kCPU);
  at::ScalarType q_dtype = at::ScalarType::Undefined;
  at::ScalarType out_dtype = at::ScalarType::Undefined;
  int64_t world = 1, heads = 0, q_dim = 0, out_dim = 0;
  bool regroup = false;
  // Sharing scope. Layers on one process group issue their collectives in order, so one
  // workspace per (comm, workspace_group, shape) is never used by two threads at once;
  // engines driven from different threads have different comms (or MLA workspace_groups).
  const void* comm = nullptr;
  int64_t workspace_group = 0;
  bool operator==(const DcpWorkspaceShape& o) const;
};

// The views of one exchange of T rows (W = world, H = heads).
struct DcpViews {
  int64_t generation = -1;
  at::Tensor gathered_query;   // [T, W*H, q_dim] q dtype: gather_query_heads' out
  at::Tensor partial_out;      // [T, W*H, out_dim] out dtype: the local kernel's output
  at::Tensor partial_lse;      // [T, W*H, 1] fp32: its LSE
  // regroup only (undefined otherwise): same shapes, a second copy, and the
  // local query [T, H, q_dim] q dtype.
  at::Tensor staged_query, staged_out, staged_lse, local_query;
  at::Tensor send, recv;       // [W, T, H, out_dim+1] fp32 wire
  at::Tensor parts_out;        // [W, T*H, out_dim] fp32
  at::Tensor parts_lse;        // [W, T*H] fp32
  std::vector<at::Tensor> out_list, lse_list;  // the W partials of parts_out / parts_lse
};

// Intermediates of one exchange shape, reused across layers and steps: grown
// to the largest step, viewed to the step's rows.
//
// Thread safety: one thread at a time (layers using one workspace run in order).
class DcpWorkspace {
 public:
  explicit DcpWorkspace(const DcpWorkspaceShape& shape);
  DcpWorkspace(const DcpWorkspace&) = delete;
  DcpWorkspace& operator=(const DcpWorkspace&) = delete;
  // One workspace per shape in the process (held weakly: it goes with its last holder).
  static std::shared_ptr<DcpWorkspace> shared(const DcpWorkspaceShape& shape);
  const DcpWorkspaceShape& shape() const { return shape_; }
  int64_t capacity() const { return capacity_; }
  // One thread at a time (cpp/common/exclusive_use.h); views() holds it for the
  // current forward.
  const std::shared_ptr<::aar::detail::ExclusiveUse>& exclusive() const { return exclusive_; }
  // The views for T rows, growing the buffers when T exceeds the capacity.
  const DcpViews& views(int64_t T);

 private:
  void grow(int64_t rows);
  DcpWorkspaceShape shape_;
  std::shared_ptr<::aar::detail::ExclusiveUse> exclusive_;
  int64_t capacity_ = 0, generation_ = 0;
  at::Tensor q_, po_, pl_, sq_, so_, sl_, lq_, send_, recv_, parts_out_, parts_lse_;
  std::vector<DcpViews> views_;
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
// `ws`: views of a DcpWorkspace for T rows (the wire and the merge inputs).
void combine_partials(Comm& comm, const at::Tensor& partial_out, const at::Tensor& partial_lse, at::Tensor& out,
                      const std::optional<at::Tensor>& lse_out = std::nullopt, const DcpViews* ws = nullptr);

}  // namespace aar::cp
