// The DCP exchange: query-head gather, partial all-to-all in the fp32 wire
// layout, LSE merge through npu_attention_update (decisions in cp/dcp.h).
#include "ascend_attn_rt/cp/dcp.h"

#include <ATen/ATen.h>

#include <vector>

#include "ascend_attn_rt/errors.h"
#include "ascend_attn_rt/ops/attention_update.h"
#include "../ops/attention_update_check.h"

namespace aar::cp {

DcpWorkspace::DcpWorkspace(int64_t max_rows, int64_t world, int64_t heads, int64_t head_dim, at::ScalarType q_dtype,
                           c10::Device device)
    : max_rows_(max_rows), world_(world), heads_(heads), dim_(head_dim) {
  AAR_CHECK_ARG(max_rows > 0 && world > 0 && heads > 0 && head_dim > 0,
                "DcpWorkspace: max_rows, world, heads and head_dim must be positive, got ", max_rows, ", ", world,
                ", ", heads, ", ", head_dim);
  const auto f32 = at::TensorOptions().dtype(at::kFloat).device(device);
  const int64_t wh = world * heads;
  q_ = at::empty({max_rows * wh * head_dim}, f32.dtype(q_dtype));
  send_ = at::empty({wh * (head_dim + 1) * max_rows}, f32);
  recv_ = at::empty({wh * (head_dim + 1) * max_rows}, f32);
  out_ = at::empty({world * max_rows * heads * head_dim}, f32);
  lse_ = at::empty({world * max_rows * heads}, f32);
}

namespace {

at::Tensor prefix(const at::Tensor& flat, c10::IntArrayRef sizes, int64_t rows, int64_t max_rows) {
  AAR_CHECK_ARG(rows >= 0 && rows <= max_rows, "DcpWorkspace: ", rows, " rows exceed its max_rows=", max_rows);
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  return flat.narrow(0, 0, n).view(sizes);
}

}  // namespace

at::Tensor DcpWorkspace::gathered_query(int64_t T) const {
  return prefix(q_, {T, world_ * heads_, dim_}, T, max_rows_);
}
at::Tensor DcpWorkspace::send(int64_t T) const { return prefix(send_, {world_ * heads_, dim_ + 1, T}, T, max_rows_); }
at::Tensor DcpWorkspace::recv(int64_t T) const { return prefix(recv_, {world_ * heads_, dim_ + 1, T}, T, max_rows_); }
at::Tensor DcpWorkspace::parts_out(int64_t T) const { return prefix(out_, {world_, T * heads_, dim_}, T, max_rows_); }
at::Tensor DcpWorkspace::parts_lse(int64_t T) const { return prefix(lse_, {world_, T * heads_}, T, max_rows_); }

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

void combine_partials(Comm& comm, const at::Tensor& partial_out, const at::Tensor& partial_lse, at::Tensor& out,
                      const std::optional<at::Tensor>& lse_out, const DcpWorkspace* ws) {
  const int64_t W = comm.size();
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
  const at::Tensor lse3 = partial_lse.view({T, WH});
  if (W == 1) {
    out.copy_(partial_out);
    if (lse_out.has_value()) lse_out->view({T, H}).copy_(lse3);
    return;
  }
  if (T == 0) return;  // batch-global: no rank exchanges
  // The merge's limits, before anything is sent (a rank refusing alone would
  // leave its peers in the all-to-all until the timeout).
  {
    const at::Tensor probe_lse = at::empty({0}, partial_lse.options());
    const at::Tensor probe_out = at::empty({0, D}, partial_lse.options());
    std::vector<at::Tensor> l(static_cast<size_t>(W), probe_lse), o(static_cast<size_t>(W), probe_out);
    ops::detail::check_attention_update_args(l, o, lse_out.has_value() ? 1 : 0, "combine_partials (npu_attention_update)");
  }
  if (ws != nullptr) {
    AAR_CHECK_ARG(ws->defined() && T <= ws->max_rows(), "combine_partials: workspace holds ", ws->max_rows(),
                  " rows, the exchange needs ", T);
  }
  // Wire: [W*H, D+1, T] fp32, heads first (spec 6.2).
  at::Tensor send = ws ? ws->send(T) : at::empty({WH, D + 1, T}, partial_lse.options());
  send.narrow(1, 0, D).copy_(partial_out.permute({1, 2, 0}));
  send.select(1, D).copy_(lse3.t());
  at::Tensor recv = ws ? ws->recv(T) : at::empty_like(send);
  comm.all_to_all_single(send, recv);
  // recv viewed [W, H, D+1, T]: block i is rank i's partial for this rank's heads.
  const at::Tensor r4 = recv.view({W, H, D + 1, T});
  at::Tensor po = ws ? ws->parts_out(T) : at::empty({W, T * H, D}, partial_lse.options());
  at::Tensor pl = ws ? ws->parts_lse(T) : at::empty({W, T * H}, partial_lse.options());
  po.view({W, T, H, D}).copy_(r4.narrow(2, 0, D).permute({0, 3, 1, 2}));
  pl.view({W, T, H}).copy_(r4.select(2, D).permute({0, 2, 1}));
  std::vector<at::Tensor> lses, outs;
  lses.reserve(W);
  outs.reserve(W);
  for (int64_t i = 0; i < W; ++i) {
    lses.push_back(pl.select(0, i));
    outs.push_back(po.select(0, i));
  }
  auto [merged, merged_lse] = ops::attention_update(lses, outs, lse_out.has_value() ? 1 : 0);
  out.copy_(merged.view({T, H, D}));
  if (lse_out.has_value()) lse_out->view({T, H}).copy_(merged_lse.view({T, H}));
}

}  // namespace aar::cp
