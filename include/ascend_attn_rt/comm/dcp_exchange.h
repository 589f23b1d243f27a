// The DCP exchange shared by the backends that shard their KV cache along the
// sequence (GQA, MLA): gather_query_heads ([T, H, D] -> [T, W*H, D]) and
// combine_partials (the fp32 [W, T, H, Dv+1] all-to-all of partial outputs with their
// LSE, merged by npu_attention_update into this rank's heads). W == 1 and T == 0 issue
// no collective; limits are checked before any collective. A DcpWorkspace keeps the
// intermediates at stable addresses. Design: docs/design/cp.md §4, §7.
#pragma once

#include <ATen/core/Tensor.h>

#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <tuple>
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
  int64_t world = 1, heads = 0, q_dim = 0, out_dim = 0;  // q_dim 0: a merge-only workspace (no query)
  bool regroup = false;
  // > 0: the query is [a | b] with a of q_split columns (the MLA family's [ql_nope | q_pe]); the
  // views of its halves are cached too.
  int64_t q_split = 0;
  // Sharing scope. Layers on one process group issue their collectives in order, so one
  // workspace per (comm, workspace_group, shape) is never used by two threads at once;
  // engines driven from different threads have different comms (or MLA workspace_groups).
  const void* comm = nullptr;
  int64_t workspace_group = 0;
  // The merge inputs (parts_out / parts_lse) head-major: row h*T + t, so the merged rows are a
  // (H, T, Dv) tensor, the MLA family's W_UV input, copied into it by one call with no view made per
  // call (docs/design/cp.md §11.7). Token-major (row t*H + h) otherwise.
  bool head_major = false;
  bool operator==(const DcpWorkspaceShape& o) const;
};

// The views of one exchange of T rows (W = world, H = heads).
struct DcpViews {
  int64_t generation = -1;
  bool head_major = false;     // the workspace's merge order (DcpWorkspaceShape::head_major)
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
  // The same buffers seen the way the exchange packs and unpacks them (made once per T):
  at::Tensor send_out, send_lse, recv_out, recv_lse;  // [W, T, H, out_dim] / [W, T, H] of send, recv
  at::Tensor parts_out4, parts_lse3;                  // parts_out [W, T, H, out_dim], parts_lse [W, T, H]
  at::Tensor partial_out_wire, partial_lse_wire;      // partial_out / partial_lse as [W, T, H, ...]
  at::Tensor send_out_twhd, send_lse_twh;             // send_out / send_lse as [T, W, H, ...] (a caller's partials)
  at::Tensor lse2;                                    // partial_lse [T, W*H]
  // q_split > 0 and regroup: the halves of local_query and gathered_query ([..., a] / [..., b]), and
  // staged_query's flat halves as [T, W*H, 1, a] / [T, W*H, 1, b] and squeezed [T, W*H, a] / [T, W*H, b].
  at::Tensor local_query_a, local_query_b, gathered_query_a, gathered_query_b;
  at::Tensor staged_a4, staged_b4, staged_a, staged_b;
  // The PCP decode merge (docs/design/cp.md §11.5, pcp_gather_merge): this rank's wire rows are send's
  // first block, the all-gather lands in recv (rank-major), the merge reads parts_out / parts_lse.
  at::Tensor wire;                  // [T, H, out_dim+1] fp32 (send[0])
  at::Tensor wire_out, wire_lse;    // its [T, H, out_dim] / [T, H, 1] columns (what a kernel's out= writes)
  at::Tensor wire_out4, wire_lse4;  // the same as [T, H, 1, out_dim] / [T, H, 1, 1] (a BNSD kernel's out=)
  at::Tensor wire_out_rows, wire_lse_rows;  // the same as [T*H, out_dim] / [T*H] (combine_partials' row targets)
  at::Tensor gathered;              // [W*T, H, out_dim+1]: recv seen as the all-gather's destination
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

// docs/design/cp.md §4: q [T, H, D] gathered along the head axis over the group.
// `out` (optional, contiguous [T, W*H, D]) receives it.
at::Tensor gather_query_heads(Comm& comm, const at::Tensor& q, const std::optional<at::Tensor>& out = std::nullopt);

// docs/design/cp.md §4 / §5: exchange this rank's partial for all W*H
// gathered heads and merge the W partials of this rank's own H heads.
// partial_out [T, W*H, Dv] (any float dtype), partial_lse [T, W*H, 1] (or
// [T, W*H]) fp32. Writes merged [T, H, Dv] into `out` (any float dtype, may be
// a strided view) and, when given, the merged LSE into `lse_out` ([T, H, 1] or
// [T, H], fp32).
// `ws`: views of a DcpWorkspace for T rows (the wire and the merge inputs).
void combine_partials(Comm& comm, const at::Tensor& partial_out, const at::Tensor& partial_lse, at::Tensor& out,
                      const std::optional<at::Tensor>& lse_out = std::nullopt, const DcpViews* ws = nullptr);

// The same exchange over a workspace's own partials, for a layer that keeps its views: `ws` (views of a
// DcpWorkspace for T rows, made for this comm's size) holds this rank's partials in ws.partial_out /
// ws.partial_lse; the merged rows of this rank's H heads go to `out_rows` (T*H, Dv) (any float dtype;
// typically a (T*H, Dv) view the caller keeps) and, when defined, the merged LSE to `lse_rows` (T*H) fp32,
// both in the workspace's merge order (token-major, or head-major: row h*T + t).
// Only what the workspace does not guarantee is checked per call (the group size, the destinations' shapes);
// the merge's limits were checked when the workspace was made.
void combine_partials(Comm& comm, const DcpViews& ws, const at::Tensor& out_rows,
                      const at::Tensor& lse_rows = at::Tensor());

// The same exchange of a caller's partials (a kernel's fresh outputs: partial_out (T, W*H, Dv), partial_lse
// (T, W*H[, 1]) fp32) through the workspace's wire into the caller's kept rows (out_rows / lse_rows as
// above): the partials are packed through the wire's [T, W, H, ...] views, so a call makes two views (the
// partials seen as [T, W, H, ...]) where the first form makes eight (docs/design/cp.md §7.2).
void combine_partials(Comm& comm, const DcpViews& ws, const at::Tensor& partial_out, const at::Tensor& partial_lse,
                      const at::Tensor& out_rows, const at::Tensor& lse_rows);

// docs/design/cp.md §6.4: N partials of the same rows in the wire layout, `parts` (N, M, Dv+1)
// fp32 (LSE in the last channel; e.g. a PCP all-gather of (rows, H, Dv+1) viewed (N, rows*H,
// Dv+1)), merged through npu_attention_update: (M, Dv) fp32 and the merged (M) LSE.
std::tuple<at::Tensor, at::Tensor> merge_wire_partials(const at::Tensor& parts);

// docs/design/cp.md §11.5: the views for T rows of the merge-only workspace (q_dim 0) of the PCP decode
// merge over `comm` (world = comm.size()): `heads` this rank's heads, `out_dim` Dv, fp32 wire; `slot`
// keeps the layer's handle (replaced when the shape changes; one workspace per shape in the process).
const DcpViews& pcp_wire_views(Comm& comm, int64_t heads, int64_t out_dim, c10::Device device,
                               int64_t workspace_group, int64_t T, std::shared_ptr<DcpWorkspace>& slot,
                               bool head_major = false);

// docs/design/cp.md §11.5: `w.wire` (this rank's [out | LSE] rows, written by the caller) all-gathered over
// `comm` into `w.gathered`, the W rank blocks unpacked into the merge's inputs and merged through
// npu_attention_update into out_rows (T, H, Dv) (any float dtype, may be a strided view). W == 1: the wire's
// output columns are the result. Every buffer is the workspace's: nothing is allocated but the merge's result.
void pcp_gather_merge(Comm& comm, const DcpViews& w, const at::Tensor& out_rows);
// The same into `rows` (T*H, Dv) in the workspace's merge order (a view the caller keeps).
void pcp_gather_merge_rows(Comm& comm, const DcpViews& w, const at::Tensor& rows);

// Two partials of the same rows merged (a causal block and the earlier keys of the same
// queries, or a context part): outputs (T, N, Dv) in any float dtype with LSEs (T, N, 1)
// fp32 -> (T, N, Dv) fp32 and (T, N, 1).
std::tuple<at::Tensor, at::Tensor> merge_two_partials(const at::Tensor& out_a, const at::Tensor& lse_a,
                                                      const at::Tensor& out_b, const at::Tensor& lse_b);

}  // namespace aar::cp
