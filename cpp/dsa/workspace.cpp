#include "workspace.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "../common/shared_by_shape.h"
#include "ascend_attn_rt/errors.h"
#include "../graph/exclusive_scope.h"

namespace aar::dsa::detail {

namespace {

WriteViews write_views(const at::Tensor& mask, const at::Tensor& idx, const at::Tensor& upd,
                                   const at::Tensor& cur, int64_t m, int64_t D) {
  WriteViews w;
  if (!mask.defined()) return w;
  w.mask = mask.narrow(0, 0, m);
  w.idx = idx.narrow(0, 0, m * 2).view({m, 2});
  w.upd = upd.narrow(0, 0, m * D).view({m, 1, D});
  w.cur = cur;
  return w;
}

}  // namespace

bool WorkspaceShape::operator==(const WorkspaceShape& o) const {
  return device == o.device && dtype == o.dtype && num_heads == o.num_heads && head_dim == o.head_dim &&
         q_lora_rank == o.q_lora_rank && o_groups == o.o_groups && o_lora_rank == o.o_lora_rank &&
         compress_ratio == o.compress_ratio && group == o.group && index_n_heads == o.index_n_heads &&
         index_head_dim == o.index_head_dim && index_topk == o.index_topk && idx_q == o.idx_q &&
         idx_q_scale == o.idx_q_scale && li_weights == o.li_weights && idx_k == o.idx_k &&
         idx_k_scale == o.idx_k_scale && mx_o_proj == o.mx_o_proj && w8a8 == o.w8a8 &&
         inplace_write == o.inplace_write && hidden_size == o.hidden_size;
}

std::shared_ptr<Workspace> Workspace::shared(const WorkspaceShape& shape) {
  return aar::detail::shared_by_shape<Workspace>(shape);
}

void Workspace::grow(int64_t n) {
  const WorkspaceShape& s = shape_;
  const int64_t cap = std::max<int64_t>(n, 2 * capacity_);
  const auto opts = at::TensorOptions().dtype(s.dtype).device(s.device);
  const int64_t N = s.num_heads, D = s.head_dim;
  qa_ = at::empty({cap * s.q_lora_rank}, opts);
  q_ = at::empty({cap * N * D}, opts);
  kv_ = at::empty({cap * D}, opts);
  o_ = at::empty({cap * N * D}, opts);
  y_ = at::empty({cap * s.o_groups * s.o_lora_rank}, opts);
  if (s.compress_ratio > 1) cmp_ = at::empty({cap * D}, opts);
  if (s.compress_ratio == 4) {
    const int64_t nh = s.index_n_heads, Di = s.index_head_dim;
    qi_ = at::empty({cap * nh * Di}, opts);
    qi_rot_ = at::empty({cap * nh * Di}, opts);
    wts_raw_ = at::empty({cap * nh}, opts);
    wts_ = s.li_weights == s.dtype ? wts_raw_ : at::empty({cap * nh}, opts.dtype(s.li_weights));
    q_q_ = at::empty({cap * nh * Di}, opts.dtype(s.idx_q));
    q_scale_ = at::empty({cap * nh}, opts.dtype(at::kFloat));
    q_scale_c_ = s.idx_q_scale == at::kFloat ? q_scale_ : at::empty({cap * nh}, opts.dtype(s.idx_q_scale));
    sel_ = at::empty({cap * s.index_topk}, opts.dtype(at::kInt));
    ik_ = at::empty({cap * Di}, opts);
    ik_rot_ = at::empty({cap * Di}, opts);
    ik_q_ = at::empty({cap * Di}, opts.dtype(s.idx_k));
    ik_scale_ = at::empty({cap}, opts.dtype(at::kFloat));
    ik_scale_c_ = s.idx_k_scale == at::kFloat ? ik_scale_ : at::empty({cap}, opts.dtype(s.idx_k_scale));
  }
  if (s.mx_o_proj) {
    o8_ = at::empty({cap * N * D}, opts.dtype(at::kFloat8_e4m3fn));
    o_mxs_ = at::empty({cap * N * D / 32}, opts.dtype(at::kByte));  // one byte per 32 values (k % 64 == 0)
  }
  if (s.w8a8) {
    x_q_ = at::empty({cap * s.hidden_size}, opts.dtype(at::kChar));
    x_scale_ = at::empty({cap}, opts.dtype(at::kFloat));
    qr_q_ = at::empty({cap * s.q_lora_rank}, opts.dtype(at::kChar));
    qr_scale_ = at::empty({cap}, opts.dtype(at::kFloat));
  }
  if (s.inplace_write) {
    for (auto* w : {&sw_mask_, &cw_mask_}) *w = at::empty({cap}, opts.dtype(at::kBool));
    for (auto* w : {&sw_idx_, &cw_idx_}) *w = at::empty({cap * 2}, opts.dtype(at::kInt));
    for (auto* w : {&sw_upd_, &cw_upd_}) *w = at::empty({cap * D}, opts);
    for (auto* w : {&sw_cur_, &cw_cur_}) *w = at::empty({1, 1, D}, opts);
  }
  capacity_ = cap;
  ++generation_;
}

Workspace::Workspace(const WorkspaceShape& shape)
    : shape_(shape),
      exclusive_(std::make_shared<::aar::detail::ExclusiveUse>(
          "the DSA layer workspace of workspace_group " + std::to_string(shape.group))) {}

const TokenViews& Workspace::tokens(int64_t n) {
  graph::use_in_forward(exclusive_);
  if (n > capacity_) grow(n);
  if (static_cast<int64_t>(tokens_.size()) <= n) tokens_.resize(n + 1);
  TokenViews& v = tokens_[n];
  if (v.generation == generation_) return v;
  const WorkspaceShape& s = shape_;
  const int64_t N = s.num_heads, D = s.head_dim, G = s.o_groups;
  auto take = [n](const at::Tensor& buf, int64_t per_row) { return buf.narrow(0, 0, n * per_row); };
  v = TokenViews{};
  v.generation = generation_;
  v.qa = take(qa_, s.q_lora_rank).view({n, s.q_lora_rank});
  v.q2 = take(q_, N * D).view({n, N * D});
  v.q = v.q2.view({n, N, D});
  v.kv = take(kv_, D).view({n, D});
  v.o = take(o_, N * D).view({n, N, D});
  v.o_rows = v.o.view({n * N, D});
  v.o_groups = v.o.view({n, G, N * D / G});
  v.y = take(y_, G * s.o_lora_rank).view({n, G, s.o_lora_rank});
  v.y2 = v.y.view({n, G * s.o_lora_rank});
  if (s.compress_ratio == 4) {
    const int64_t nh = s.index_n_heads, Di = s.index_head_dim;
    v.qi2 = take(qi_, nh * Di).view({n, nh * Di});
    v.qi = v.qi2.view({n, nh, Di});
    v.qi_rot = take(qi_rot_, nh * Di).view({n, nh, Di});
    v.wts_raw = take(wts_raw_, nh).view({n, nh});
    v.wts = take(wts_, nh).view({n, nh});
    v.q_q = take(q_q_, nh * Di).view({n, nh, Di});
    v.q_scale = take(q_scale_, nh).view({n, nh});
    v.q_scale_c = take(q_scale_c_, nh).view({n, nh});
    v.sel = take(sel_, s.index_topk).view({n, 1, s.index_topk});
  }
  if (s.mx_o_proj) {
    const int64_t k = N * D / G;
    v.o8 = take(o8_, N * D).view({n, G, k});
    v.o_mxs = take(o_mxs_, N * D / 32).view({n, G, k / 64, 2});
    v.o_mxs_e8m0 = v.o_mxs.view(at::kFloat8_e8m0fnu);
  }
  if (s.w8a8) {
    v.x_q = take(x_q_, s.hidden_size).view({n, s.hidden_size});
    v.x_scale = take(x_scale_, 1);
    v.qr_q = take(qr_q_, s.q_lora_rank).view({n, s.q_lora_rank});
    v.qr_scale = take(qr_scale_, 1);
  }
  v.swa_write = write_views(sw_mask_, sw_idx_, sw_upd_, sw_cur_, n, D);
  return v;
}

const RowViews& Workspace::rows(int64_t r) {
  graph::use_in_forward(exclusive_);
  AAR_CHECK_ARG(r >= 0 && r <= capacity_, "dsa workspace: ", r, " compressed rows exceed the capacity ", capacity_);
  if (static_cast<int64_t>(rows_.size()) <= r) rows_.resize(r + 1);
  RowViews& v = rows_[r];
  if (v.generation == generation_) return v;
  const WorkspaceShape& s = shape_;
  v = RowViews{};
  v.generation = generation_;
  if (s.compress_ratio > 1) v.cmp = cmp_.narrow(0, 0, r * s.head_dim).view({r, s.head_dim});
  if (s.compress_ratio == 4) {
    const int64_t Di = s.index_head_dim;
    v.ik = ik_.narrow(0, 0, r * Di).view({r, Di});
    v.ik_rot = ik_rot_.narrow(0, 0, r * Di).view({r, Di});
    v.ik_q = ik_q_.narrow(0, 0, r * Di).view({r, Di});
    v.ik_scale = ik_scale_.narrow(0, 0, r);
    v.ik_scale_c1 = ik_scale_c_.narrow(0, 0, r);
    v.ik_scale_c = v.ik_scale_c1.view({r, 1});
  }
  if (s.compress_ratio > 1) v.cmp_write = write_views(cw_mask_, cw_idx_, cw_upd_, cw_cur_, r, s.head_dim);
  return v;
}

const at::Tensor& Workspace::dcp_cmp(int64_t n, int64_t width) {
  graph::use_in_forward(exclusive_);
  AAR_CHECK_ARG(n >= 0 && width >= 1, "dsa workspace: a DCP list of ", n, " rows of ", width, " entries");
  if (!dcp_cmp_.defined() || dcp_cmp_.numel() < n * width) {
    const int64_t cap = std::max<int64_t>(n * width, dcp_cmp_.defined() ? 2 * dcp_cmp_.numel() : 0);
    dcp_cmp_ = at::empty({cap}, at::TensorOptions().dtype(at::kInt).device(shape_.device));
    dcp_cmp_views_.clear();
  }
  for (const DcpCmpView& v : dcp_cmp_views_) {
    if (v.n == n && v.width == width) return v.view;
  }
  // Few (n, width) pairs in practice (C4: width K; C128: one width per step length class).
  if (dcp_cmp_views_.size() >= 64) dcp_cmp_views_.clear();
  dcp_cmp_views_.push_back({n, width, dcp_cmp_.narrow(0, 0, n * width).view({n, 1, width})});
  return dcp_cmp_views_.back().view;
}

const at::Tensor& Workspace::dcp_lse(int64_t n) {
  graph::use_in_forward(exclusive_);
  AAR_CHECK_ARG(n >= 0, "dsa workspace: a DCP LSE of ", n, " rows");
  const int64_t N = shape_.num_heads;
  if (!dcp_lse_.defined() || dcp_lse_.numel() < n * N) {
    const int64_t cap = std::max<int64_t>(n, dcp_lse_.defined() ? 2 * (dcp_lse_.numel() / N) : 0);
    dcp_lse_ = at::empty({cap * N}, at::TensorOptions().dtype(at::kFloat).device(shape_.device));
    dcp_lse_views_.clear();
    dcp_lse_rows_.clear();
  }
  if (static_cast<int64_t>(dcp_lse_views_.size()) <= n) dcp_lse_views_.resize(n + 1);
  at::Tensor& v = dcp_lse_views_[n];
  if (!v.defined()) v = dcp_lse_.narrow(0, 0, n * N).view({n, N});
  return v;
}

const at::Tensor& Workspace::dcp_lse_rows(int64_t n) {
  const at::Tensor& v2 = dcp_lse(n);  // grows the buffer first
  if (static_cast<int64_t>(dcp_lse_rows_.size()) <= n) dcp_lse_rows_.resize(n + 1);
  at::Tensor& v = dcp_lse_rows_[n];
  if (!v.defined()) v = v2.view({n * shape_.num_heads});
  return v;
}

}  // namespace aar::dsa::detail
