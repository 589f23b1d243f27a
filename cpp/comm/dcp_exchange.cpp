// The DCP exchange: query-head gather, partial all-to-all in the fp32 wire
// layout, LSE merge through npu_attention_update (decisions in comm/dcp_exchange.h).
#include "ascend_attn_rt/comm/dcp_exchange.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <vector>

#include "ascend_attn_rt/errors.h"
#include "ascend_attn_rt/ops/attention_update.h"
#include "ascend_attn_rt/ops/dense.h"
#include "../common/shared_by_shape.h"
#include "../ops/attention_update_check.h"
#include "../graph/exclusive_scope.h"

namespace aar::cp {

namespace {

// npu_attention_update's limits for W partials of head dim D (W <= 16, D a
// multiple of 8 in [8, 512]), checked without running it.
void check_merge_limits(int64_t W, int64_t D, int64_t update_type) {
  const at::Tensor probe_lse = at::empty({0}, at::TensorOptions().dtype(at::kFloat));
  const at::Tensor probe_out = at::empty({0, D}, probe_lse.options());
  std::vector<at::Tensor> l(static_cast<size_t>(W), probe_lse), o(static_cast<size_t>(W), probe_out);
  ops::detail::check_attention_update_args(l, o, update_type, "combine_partials (npu_attention_update)");
}

}  // namespace

bool DcpWorkspaceShape::operator==(const DcpWorkspaceShape& o) const {
  return device == o.device && q_dtype == o.q_dtype && out_dtype == o.out_dtype && world == o.world &&
         heads == o.heads && q_dim == o.q_dim && out_dim == o.out_dim && regroup == o.regroup &&
         q_split == o.q_split && comm == o.comm && workspace_group == o.workspace_group &&
         head_major == o.head_major;
}

DcpWorkspace::DcpWorkspace(const DcpWorkspaceShape& shape)
    : shape_(shape),
      exclusive_(std::make_shared<::aar::detail::ExclusiveUse>(
          "the DCP exchange workspace of workspace_group " + std::to_string(shape.workspace_group))) {
  AAR_CHECK_ARG(shape.world > 0 && shape.heads > 0 && shape.q_dim >= 0 && shape.out_dim > 0,
                "DcpWorkspace: world, heads and out_dim must be positive and q_dim non-negative, got ", shape.world,
                ", ", shape.heads, ", ", shape.q_dim, ", ", shape.out_dim);
  if (shape.world > 1) check_merge_limits(shape.world, shape.out_dim, 1);
}

std::shared_ptr<DcpWorkspace> DcpWorkspace::shared(const DcpWorkspaceShape& shape) {
  return aar::detail::shared_by_shape<DcpWorkspace>(shape);
}

void DcpWorkspace::grow(int64_t rows) {
  const DcpWorkspaceShape& s = shape_;
  const int64_t cap = std::max<int64_t>(rows, 2 * capacity_);
  const int64_t wh = s.world * s.heads;
  const auto f32 = at::TensorOptions().dtype(at::kFloat).device(s.device);
  q_ = at::empty({cap * wh * s.q_dim}, f32.dtype(s.q_dtype));
  po_ = at::empty({cap * wh * s.out_dim}, f32.dtype(s.out_dtype));
  pl_ = at::empty({cap * wh}, f32);
  if (s.regroup) {
    sq_ = at::empty({cap * wh * s.q_dim}, f32.dtype(s.q_dtype));
    so_ = at::empty({cap * wh * s.out_dim}, f32.dtype(s.out_dtype));
    sl_ = at::empty({cap * wh}, f32);
    lq_ = at::empty({cap * s.heads * s.q_dim}, f32.dtype(s.q_dtype));
  }
  send_ = at::empty({wh * (s.out_dim + 1) * cap}, f32);
  recv_ = at::empty({wh * (s.out_dim + 1) * cap}, f32);
  parts_out_ = at::empty({cap * wh * s.out_dim}, f32);
  parts_lse_ = at::empty({cap * wh}, f32);
  capacity_ = cap;
  ++generation_;
}

const DcpViews& DcpWorkspace::views(int64_t T) {
  graph::use_in_forward(exclusive_);
  AAR_CHECK_ARG(T >= 0, "DcpWorkspace: row count must be non-negative, got ", T);
  if (T > capacity_ || capacity_ == 0) grow(std::max<int64_t>(T, 1));
  if (static_cast<int64_t>(views_.size()) <= T) views_.resize(T + 1);
  DcpViews& v = views_[T];
  if (v.generation == generation_) return v;
  const DcpWorkspaceShape& s = shape_;
  const int64_t W = s.world, H = s.heads, WH = W * H, Dq = s.q_dim, D = s.out_dim;
  auto take = [](const at::Tensor& flat, c10::IntArrayRef sizes) {
    int64_t n = 1;
    for (int64_t x : sizes) n *= x;
    return flat.narrow(0, 0, n).view(sizes);
  };
  v = DcpViews{};
  v.generation = generation_;
  v.gathered_query = take(q_, {T, WH, Dq});
  v.partial_out = take(po_, {T, WH, D});
  v.partial_lse = take(pl_, {T, WH, 1});
  if (s.regroup) {
    v.staged_query = take(sq_, {T, WH, Dq});
    v.staged_out = take(so_, {T, WH, D});
    v.staged_lse = take(sl_, {T, WH, 1});
    v.local_query = take(lq_, {T, H, Dq});
  }
  v.send = take(send_, {W, T, H, D + 1});
  v.recv = take(recv_, {W, T, H, D + 1});
  v.parts_out = take(parts_out_, {W, T * H, D});
  v.parts_lse = take(parts_lse_, {W, T * H});
  for (int64_t i = 0; i < W; ++i) {
    v.out_list.push_back(v.parts_out.select(0, i));
    v.lse_list.push_back(v.parts_lse.select(0, i));
  }
  v.send_out = v.send.narrow(3, 0, D);
  v.send_lse = v.send.select(3, D);
  v.recv_out = v.recv.narrow(3, 0, D);
  v.recv_lse = v.recv.select(3, D);
  v.head_major = s.head_major;
  // The unpack's targets seen token-major ([W, T, H, ...], the wire's order) over buffers laid out in the
  // merge order.
  v.parts_out4 = s.head_major ? v.parts_out.view({W, H, T, D}).permute({0, 2, 1, 3}) : v.parts_out.view({W, T, H, D});
  v.parts_lse3 = s.head_major ? v.parts_lse.view({W, H, T}).permute({0, 2, 1}) : v.parts_lse.view({W, T, H});
  v.partial_out_wire = v.partial_out.view({T, W, H, D}).permute({1, 0, 2, 3});
  v.send_out_twhd = v.send_out.permute({1, 0, 2, 3});
  v.send_lse_twh = v.send_lse.permute({1, 0, 2});
  v.partial_lse_wire = v.partial_lse.view({T, W, H}).permute({1, 0, 2});
  v.lse2 = v.partial_lse.view({T, WH});
  v.wire = v.send.select(0, 0);
  v.wire_out = v.wire.narrow(2, 0, D);
  v.wire_lse = v.wire.narrow(2, D, 1);
  v.wire_out4 = v.wire_out.unsqueeze(2);
  v.wire_out_rows = v.wire_out.view({T * H, D});
  v.wire_lse_rows = v.wire_lse.view({T * H});
  v.wire_lse4 = v.wire_lse.unsqueeze(2);
  v.gathered = v.recv.view({W * T, H, D + 1});
  if (s.q_split > 0 && s.regroup) {
    const int64_t a = s.q_split, b = Dq - a;
    v.local_query_a = v.local_query.narrow(-1, 0, a);
    v.local_query_b = v.local_query.narrow(-1, a, b);
    v.gathered_query_a = v.gathered_query.narrow(-1, 0, a);
    v.gathered_query_b = v.gathered_query.narrow(-1, a, b);
    const at::Tensor flat = v.staged_query.view({-1});
    v.staged_a4 = flat.narrow(0, 0, T * WH * a).view({T, WH, 1, a});
    v.staged_b4 = flat.narrow(0, T * WH * a, T * WH * b).view({T, WH, 1, b});
    v.staged_a = v.staged_a4.squeeze(2);
    v.staged_b = v.staged_b4.squeeze(2);
  }
  return v;
}

at::Tensor gather_query_heads(Comm& comm, const at::Tensor& q, const std::optional<at::Tensor>& out) {
  AAR_CHECK_ARG(q.defined() && q.dim() == 3, "gather_query_heads: q must be (T, H, D), got ",
                q.defined() ? q.sizes() : c10::IntArrayRef{});
  const int64_t W = comm.size();
  if (W == 1 || q.size(0) == 0) {
    // Nothing to exchange (W == 1; T == 0 is batch-global, so every rank skips).
    std::vector<int64_t> sz{q.size(0), q.size(1) * W, q.size(2)};
    at::Tensor o = out.has_value() ? *out : at::empty(sz, q.options());
    AAR_CHECK_ARG(o.sizes() == c10::IntArrayRef(sz), "gather_query_heads: out must be ", c10::IntArrayRef(sz),
                  ", got ", o.sizes());
    if (W == 1) o.copy_(q);
    return o;
  }
  return comm.all_gather(q, 1, out);
}

namespace {

// Rows (T H, D) / LSEs (T H) in a workspace's merge order seen as (T, H, D) / (T, H): token-major rows are
// viewed, head-major ones (row h T + t) viewed (H, T, ...) and transposed.
at::Tensor rows_as_thd(const at::Tensor& rows, bool head_major, int64_t T, int64_t H, int64_t D) {
  return head_major ? rows.view({H, T, D}).transpose(0, 1) : rows.view({T, H, D});
}
at::Tensor lse_as_th(const at::Tensor& lse, bool head_major, int64_t T, int64_t H) {
  return head_major ? lse.view({H, T}).t() : lse.view({T, H});
}

// The exchange and merge once the wire's send buffer holds this rank's partials (W > 1, T > 0):
// all-to-all'd, unpacked into the merge inputs (in the workspace's merge order) and merged. Returns the
// merged rows (T H, D) and, for update_type 1, their LSE (T H).
std::tuple<at::Tensor, at::Tensor> send_and_merge(Comm& comm, const DcpViews& ws, bool with_lse) {
  comm.all_to_all_single(ws.send, ws.recv);
  ops::dense::copy(ws.parts_out4, ws.recv_out);
  ops::dense::copy(ws.parts_lse3, ws.recv_lse);
  return ops::detail::attention_update_prechecked(ws.lse_list, ws.out_list, with_lse ? 1 : 0);
}

// The same for the workspace's own partials, packed into the wire first.
std::tuple<at::Tensor, at::Tensor> exchange_and_merge(Comm& comm, const DcpViews& ws, bool with_lse) {
  ops::dense::copy(ws.send_out, ws.partial_out_wire);
  ops::dense::copy(ws.send_lse, ws.partial_lse_wire);
  return send_and_merge(comm, ws, with_lse);
}

// The row forms of combine_partials with one rank (no exchange): the general form copies the partials
// into the caller's rows seen as (T, H, Dv) / (T, H).
void combine_one_rank_rows(Comm& comm, const DcpViews& ws, const at::Tensor& partial_out,
                           const at::Tensor& partial_lse, const at::Tensor& out_rows, const at::Tensor& lse_rows,
                           int64_t T, int64_t H, int64_t D) {
  at::Tensor out = rows_as_thd(out_rows, ws.head_major, T, H, D);
  combine_partials(comm, partial_out, partial_lse, out,
                   lse_rows.defined() ? std::optional<at::Tensor>(lse_as_th(lse_rows, ws.head_major, T, H))
                                      : std::nullopt,
                   &ws);
}

// The row targets' checks of the two row forms of combine_partials (T rows of H heads of Dv).
void check_row_targets(const at::Tensor& out_rows, const at::Tensor& lse_rows, int64_t T, int64_t H, int64_t D) {
  AAR_CHECK_ARG(out_rows.defined() && out_rows.dim() == 2 && out_rows.size(0) == T * H && out_rows.size(1) == D,
                "combine_partials: out_rows must be (", T * H, ", ", D, "), got ",
                out_rows.defined() ? out_rows.sizes() : c10::IntArrayRef{});
  AAR_CHECK_ARG(!lse_rows.defined() ||
                    (lse_rows.scalar_type() == at::kFloat && lse_rows.dim() == 1 && lse_rows.size(0) == T * H),
                "combine_partials: lse_rows must be float32 (", T * H, "), got ", lse_rows.sizes());
}

// combine_partials of a workspace's own partials (the usual call): the wire views were made for this
// T and their shapes checked when the workspace was made, so only the caller's targets are checked,
// and every tensor is used by reference (no handle copied per call).
void combine_own(Comm& comm, const DcpViews& ws, at::Tensor& out, const std::optional<at::Tensor>& lse_out) {
  const c10::IntArrayRef wire = ws.send.sizes();  // (W, T, H, D + 1)
  const int64_t W = comm.size(), T = wire[1], H = wire[2], D = wire[3] - 1;
  AAR_CHECK_ARG(wire[0] == W, "combine_partials: the workspace views are for a group of ", wire[0],
                " ranks, the comm has ", W);
  const c10::IntArrayRef os = out.sizes();
  AAR_CHECK_ARG(out.defined() && os.size() == 3 && os[0] == T && os[1] == H && os[2] == D,
                "combine_partials: out must be (", T, ", ", H, ", ", D, "), got ",
                out.defined() ? os : c10::IntArrayRef{});
  const bool with_lse = lse_out.has_value();
  if (with_lse) {
    AAR_CHECK_ARG(lse_out->scalar_type() == at::kFloat && lse_out->numel() == T * H && lse_out->size(0) == T &&
                      lse_out->size(1) == H,
                  "combine_partials: lse_out must be float32 (", T, ", ", H, ", 1), got ", lse_out->sizes());
  }
  if (T == 0) return;  // batch-global: no rank exchanges
  auto [merged, merged_lse] = exchange_and_merge(comm, ws, with_lse);
  ops::dense::copy(out, rows_as_thd(merged, ws.head_major, T, H, D));
  if (with_lse) ops::dense::copy(lse_out->view({T, H}), lse_as_th(merged_lse, ws.head_major, T, H));
}

}  // namespace

void combine_partials(Comm& comm, const at::Tensor& partial_out, const at::Tensor& partial_lse, at::Tensor& out,
                      const std::optional<at::Tensor>& lse_out, const DcpViews* ws) {
  const int64_t W = comm.size();
  if (W > 1 && ws != nullptr && partial_out.is_same(ws->partial_out) && partial_lse.is_same(ws->partial_lse)) {
    combine_own(comm, *ws, out, lse_out);
    return;
  }
  AAR_CHECK_ARG(partial_out.defined() && partial_out.dim() == 3, "combine_partials: partial_out must be (T, W*H, D), got ",
                partial_out.defined() ? partial_out.sizes() : c10::IntArrayRef{});
  const int64_t T = partial_out.size(0), WH = partial_out.size(1), D = partial_out.size(2);
  AAR_CHECK_ARG(WH % W == 0, "combine_partials: partial_out has ", WH, " heads, not a multiple of the group size ", W);
  const int64_t H = WH / W;
  AAR_CHECK_ARG(partial_lse.defined() && partial_lse.scalar_type() == at::kFloat && partial_lse.numel() == T * WH &&
                    partial_lse.size(0) == T && partial_lse.size(1) == WH,
                "combine_partials: partial_lse must be float32 (T=", T, ", ", WH, ", 1), got ",
                partial_lse.defined() ? partial_lse.sizes() : c10::IntArrayRef{}, " ",
                partial_lse.defined() ? partial_lse.scalar_type() : at::ScalarType::Undefined);
  AAR_CHECK_ARG(out.defined() && out.dim() == 3 && out.size(0) == T && out.size(1) == H && out.size(2) == D,
                "combine_partials: out must be (", T, ", ", H, ", ", D, "), got ",
                out.defined() ? out.sizes() : c10::IntArrayRef{});
  if (lse_out.has_value()) {
    AAR_CHECK_ARG(lse_out->scalar_type() == at::kFloat && lse_out->numel() == T * H && lse_out->size(0) == T &&
                      lse_out->size(1) == H,
                  "combine_partials: lse_out must be float32 (", T, ", ", H, ", 1), got ", lse_out->sizes());
  }
  // The caller's partials are usually the workspace's own (the views below are then made once per T).
  const bool own = ws != nullptr && partial_out.is_same(ws->partial_out) && partial_lse.is_same(ws->partial_lse);
  const at::Tensor lse3 = own ? ws->lse2 : partial_lse.view({T, WH});
  if (W == 1) {
    ops::dense::copy(out, partial_out);
    if (lse_out.has_value()) ops::dense::copy(lse_out->view({T, H}), lse3);
    return;
  }
  if (T == 0) return;  // batch-global: no rank exchanges
  // The merge's limits, before anything is sent (a rank refusing alone would
  // leave its peers in the all-to-all until the timeout); a workspace's shape
  // was checked once when it was made.
  if (ws == nullptr) {
    check_merge_limits(W, D, lse_out.has_value() ? 1 : 0);
  } else {
    AAR_CHECK_ARG(ws->send.defined() && ws->send.size(0) == W && ws->send.size(1) == T && ws->send.size(2) == H &&
                      ws->send.size(3) == D + 1,
                  "combine_partials: the workspace views are for (", ws->send.defined() ? ws->send.sizes() : c10::IntArrayRef{},
                  ") wire rows, the exchange needs (", W, ", ", T, ", ", H, ", ", D + 1, ")");
  }
  // Wire: [W, T, H, D+1] fp32 (see comm/dcp_exchange.h): block j holds this rank's
  // partial for rank j's heads, token-major, so packing and unpacking copy
  // contiguous runs of D.
  at::Tensor send = ws ? ws->send : at::empty({W, T, H, D + 1}, partial_lse.options());
  ops::dense::copy(ws ? ws->send_out : send.narrow(3, 0, D),
                   own ? ws->partial_out_wire : partial_out.reshape({T, W, H, D}).permute({1, 0, 2, 3}));
  ops::dense::copy(ws ? ws->send_lse : send.select(3, D),
                   own ? ws->partial_lse_wire : lse3.view({T, W, H}).permute({1, 0, 2}));
  at::Tensor recv = ws ? ws->recv : at::empty_like(send);
  comm.all_to_all_single(send, recv);
  // Block i of recv is rank i's partial for this rank's heads.
  at::Tensor po = ws ? ws->parts_out : at::empty({W, T * H, D}, partial_lse.options());
  at::Tensor pl = ws ? ws->parts_lse : at::empty({W, T * H}, partial_lse.options());
  ops::dense::copy(ws ? ws->parts_out4 : po.view({W, T, H, D}), ws ? ws->recv_out : recv.narrow(3, 0, D));
  ops::dense::copy(ws ? ws->parts_lse3 : pl.view({W, T, H}), ws ? ws->recv_lse : recv.select(3, D));
  std::vector<at::Tensor> lses, outs;
  if (ws == nullptr) {
    lses.reserve(W);
    outs.reserve(W);
    for (int64_t i = 0; i < W; ++i) {
      lses.push_back(pl.select(0, i));
      outs.push_back(po.select(0, i));
    }
  }
  auto [merged, merged_lse] = ops::attention_update(ws ? at::TensorList(ws->lse_list) : at::TensorList(lses),
                                                    ws ? at::TensorList(ws->out_list) : at::TensorList(outs),
                                                    lse_out.has_value() ? 1 : 0);
  const bool hm = ws != nullptr && ws->head_major;  // the merge inputs were unpacked in its order
  ops::dense::copy(out, rows_as_thd(merged, hm, T, H, D));
  if (lse_out.has_value()) ops::dense::copy(lse_out->view({T, H}), lse_as_th(merged_lse, hm, T, H));
}

void combine_partials(Comm& comm, const DcpViews& ws, const at::Tensor& out_rows, const at::Tensor& lse_rows) {
  const int64_t W = comm.size();
  AAR_CHECK_ARG(ws.partial_out.defined() && ws.send.defined() && ws.send.size(0) == W,
                "combine_partials: the workspace views are for a group of ",
                ws.send.defined() ? ws.send.size(0) : int64_t{0}, " ranks, the comm has ", W);
  const int64_t T = ws.partial_out.size(0), H = ws.send.size(2), D = ws.partial_out.size(2);
  check_row_targets(out_rows, lse_rows, T, H, D);
  const bool with_lse = lse_rows.defined();
  if (W == 1) {
    combine_one_rank_rows(comm, ws, ws.partial_out, ws.partial_lse, out_rows, lse_rows, T, H, D);
    return;
  }
  if (T == 0) return;  // batch-global: no rank exchanges
  // The wire of comm/dcp_exchange.h, through the workspace's views made once per T.
  auto [merged, merged_lse] = exchange_and_merge(comm, ws, with_lse);  // (T H, D), (T H)
  ops::dense::copy(out_rows, merged);
  if (with_lse) ops::dense::copy(lse_rows, merged_lse);
}

void combine_partials(Comm& comm, const DcpViews& ws, const at::Tensor& partial_out, const at::Tensor& partial_lse,
                      const at::Tensor& out_rows, const at::Tensor& lse_rows) {
  if (partial_out.is_same(ws.partial_out) && partial_lse.is_same(ws.partial_lse)) {
    combine_partials(comm, ws, out_rows, lse_rows);
    return;
  }
  const int64_t W = comm.size();
  AAR_CHECK_ARG(ws.send.defined() && ws.send.dim() == 4 && ws.send.size(0) == W,
                "combine_partials: the workspace views are for a group of ",
                ws.send.defined() ? ws.send.size(0) : int64_t{0}, " ranks, the comm has ", W);
  const int64_t T = ws.send.size(1), H = ws.send.size(2), D = ws.send.size(3) - 1, WH = W * H;
  AAR_CHECK_ARG(partial_out.defined() && partial_out.dim() == 3 && partial_out.size(0) == T &&
                    partial_out.size(1) == WH && partial_out.size(2) == D,
                "combine_partials: partial_out must be (", T, ", ", WH, ", ", D, ") for the workspace's views, got ",
                partial_out.defined() ? partial_out.sizes() : c10::IntArrayRef{});
  AAR_CHECK_ARG(partial_lse.defined() && partial_lse.scalar_type() == at::kFloat && partial_lse.numel() == T * WH &&
                    partial_lse.dim() >= 2 && partial_lse.size(0) == T && partial_lse.size(1) == WH,
                "combine_partials: partial_lse must be float32 (", T, ", ", WH, ", 1), got ",
                partial_lse.defined() ? partial_lse.sizes() : c10::IntArrayRef{}, " ",
                partial_lse.defined() ? partial_lse.scalar_type() : at::ScalarType::Undefined);
  check_row_targets(out_rows, lse_rows, T, H, D);
  const bool with_lse = lse_rows.defined();
  if (W == 1) {
    combine_one_rank_rows(comm, ws, partial_out, partial_lse, out_rows, lse_rows, T, H, D);
    return;
  }
  if (T == 0) return;  // batch-global: no rank exchanges
  // Packed through the wire's [T, W, H, ...] views: block j of the wire gets the partials of rank j's heads.
  ops::dense::copy(ws.send_out_twhd, partial_out.is_contiguous() ? partial_out.view({T, W, H, D})
                                                                 : partial_out.reshape({T, W, H, D}));
  ops::dense::copy(ws.send_lse_twh, partial_lse.is_contiguous() ? partial_lse.view({T, W, H})
                                                                : partial_lse.reshape({T, W, H}));
  auto [merged, merged_lse] = send_and_merge(comm, ws, with_lse);  // (T H, D), (T H)
  ops::dense::copy(out_rows, merged);
  if (with_lse) ops::dense::copy(lse_rows, merged_lse);
}

std::tuple<at::Tensor, at::Tensor> merge_wire_partials(const at::Tensor& parts) {
  AAR_CHECK_ARG(parts.defined() && parts.dim() == 3 && parts.size(2) >= 2 && parts.scalar_type() == at::kFloat,
                "merge_wire_partials: parts must be float32 (N, M, Dv+1), got ",
                parts.defined() ? parts.sizes() : c10::IntArrayRef{});
  const int64_t n = parts.size(0), d = parts.size(2) - 1;
  // Each part's column blocks, made contiguous for the merge.
  std::vector<at::Tensor> outs, lses;
  outs.reserve(n);
  lses.reserve(n);
  for (int64_t i = 0; i < n; ++i) {
    outs.push_back(ops::dense::contiguous(parts[i].narrow(1, 0, d)));
    lses.push_back(ops::dense::contiguous(parts[i].select(1, d)));
  }
  return ops::attention_update(lses, outs, /*update_type=*/1);
}

const DcpViews& pcp_wire_views(Comm& comm, int64_t heads, int64_t out_dim, c10::Device device,
                               int64_t workspace_group, int64_t T, std::shared_ptr<DcpWorkspace>& slot,
                               bool head_major) {
  DcpWorkspaceShape sh;
  sh.device = device;
  sh.q_dtype = sh.out_dtype = at::kFloat;  // no query; partial_out unused
  sh.world = comm.size();
  sh.heads = heads;
  sh.q_dim = 0;  // merge only
  sh.out_dim = out_dim;
  sh.comm = &comm;
  sh.workspace_group = workspace_group;
  sh.head_major = head_major;
  if (!slot || !(slot->shape() == sh)) slot = DcpWorkspace::shared(sh);
  return slot->views(T);
}

namespace {

// The PCP merge's collective and merge (W > 1): the wire rows gathered into w.gathered (rank-major), unpacked
// into the merge inputs (in the workspace's merge order) and merged; returns the merged (T H, D) rows.
at::Tensor gather_and_merge(Comm& comm, const DcpViews& w) {
  comm.all_gather(w.wire, 0, w.gathered);  // (W T, H, D+1): rank-major
  ops::dense::copy(w.parts_out4, w.recv_out);
  ops::dense::copy(w.parts_lse3, w.recv_lse);
  return std::get<0>(ops::detail::attention_update_prechecked(w.lse_list, w.out_list, /*update_type=*/0));
}

}  // namespace

void pcp_gather_merge(Comm& comm, const DcpViews& w, const at::Tensor& out_rows) {
  AAR_CHECK_ARG(w.wire.defined() && w.recv.size(0) == comm.size(), "pcp_gather_merge: the views are for a group of ",
                w.recv.defined() ? w.recv.size(0) : 0, " ranks, the comm has ", comm.size());
  const int64_t W = w.recv.size(0), T = w.wire.size(0), H = w.wire.size(1), D = w.wire.size(2) - 1;
  if (W == 1) {
    ops::dense::copy(out_rows, w.wire_out);
    return;
  }
  const at::Tensor merged = gather_and_merge(comm, w);
  ops::dense::copy(out_rows, rows_as_thd(merged, w.head_major, T, H, D));
}

void pcp_gather_merge_rows(Comm& comm, const DcpViews& w, const at::Tensor& rows) {
  AAR_CHECK_ARG(w.wire.defined() && w.recv.size(0) == comm.size(), "pcp_gather_merge: the views are for a group of ",
                w.recv.defined() ? w.recv.size(0) : 0, " ranks, the comm has ", comm.size());
  const c10::IntArrayRef ws = w.wire.sizes();  // (T, H, D + 1)
  const int64_t T = ws[0], H = ws[1], D = ws[2] - 1;
  AAR_CHECK_ARG(rows.defined() && rows.dim() == 2 && rows.size(0) == T * H && rows.size(1) == D,
                "pcp_gather_merge: rows must be (", T * H, ", ", D, "), got ",
                rows.defined() ? rows.sizes() : c10::IntArrayRef{});
  if (comm.size() == 1) {
    ops::dense::copy(rows_as_thd(rows, w.head_major, T, H, D), w.wire_out);
    return;
  }
  const at::Tensor merged = gather_and_merge(comm, w);
  ops::dense::copy(rows, merged);
}

std::tuple<at::Tensor, at::Tensor> merge_two_partials(const at::Tensor& out_a, const at::Tensor& lse_a,
                                                      const at::Tensor& out_b, const at::Tensor& lse_b) {
  AAR_CHECK_ARG(out_a.defined() && out_a.dim() == 3 && out_b.defined() && out_a.sizes() == out_b.sizes(),
                "merge_two_partials: the outputs must be two (T, N, Dv) tensors of one shape, got ",
                out_a.defined() ? out_a.sizes() : c10::IntArrayRef{}, " and ",
                out_b.defined() ? out_b.sizes() : c10::IntArrayRef{});
  const int64_t t = out_a.size(0), h = out_a.size(1), d = out_a.size(2);
  std::vector<at::Tensor> outs{out_a.to(at::kFloat).reshape({t * h, d}), out_b.to(at::kFloat).reshape({t * h, d})};
  std::vector<at::Tensor> lses{lse_a.reshape({t * h}).contiguous(), lse_b.reshape({t * h}).contiguous()};
  auto [o, l] = ops::attention_update(lses, outs, /*update_type=*/1);
  return {o.view({t, h, d}), l.view({t, h, 1})};
}

}  // namespace aar::cp
