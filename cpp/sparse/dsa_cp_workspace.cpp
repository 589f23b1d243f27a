#include "dsa_cp_workspace.h"

#include <ATen/ATen.h>

#include <numeric>
#include <string>

#include "../common/shared_by_shape.h"
#include "../graph/exclusive_scope.h"
#include "ascend_attn_rt/ops/dense.h"

namespace aar::sparse::detail {

std::shared_ptr<DsaCpWorkspace> DsaCpWorkspace::shared(const DsaCpShape& shape) {
  return aar::detail::shared_by_shape<DsaCpWorkspace>(shape);
}

DsaCpWorkspace::DsaCpWorkspace(const DsaCpShape& shape)
    : shape_(shape),
      exclusive_(std::make_shared<::aar::detail::ExclusiveUse>("the DSA-CP slice workspace of workspace_group " +
                                                               std::to_string(shape.group))),
      pack_width_(std::accumulate(shape.pack_cols.begin(), shape.pack_cols.end(), int64_t{0})) {}

const DsaCpViews& DsaCpWorkspace::views(int64_t tpr, int64_t nloc) {
  graph::use_in_forward(exclusive_);
  const DsaCpShape& s = shape_;
  const int64_t W = s.world, width = s.road_width, C = width / W, P = pack_width_;
  if (tpr > capacity_) {
    // Grown buffers: the views of earlier sizes are remade on their next use.
    // The old buffers are kept: a captured graph may still read them at their addresses.
    for (at::Tensor* b : {&road_, &exchange_, &pack_, &gathered_, &stage_, &topk_}) {
      if (b->defined()) retired_.push_back(*b);
    }
    const int64_t cap = std::max<int64_t>(tpr, 2 * capacity_);
    const auto opts = at::TensorOptions().dtype(s.dtype).device(s.device);
    road_ = at::empty({cap * width}, opts);
    exchange_ = at::empty({W * cap * C}, opts);
    if (P > 0) {
      pack_ = at::empty({cap * P}, opts);
      gathered_ = at::empty({W * cap * P}, opts);
      stage_ = at::empty({W * cap * P}, opts);
    }
    if (s.topk > 0) topk_ = at::empty({cap * s.topk}, opts.dtype(at::kInt));
    capacity_ = cap;
    ++generation_;
  }
  DsaCpViews& v = views_[{tpr, nloc}];
  if (v.generation == generation_) return v;
  v.generation = generation_;
  const at::Tensor road = road_.narrow(0, 0, tpr * width);
  v.decode_buf = road.view({W, tpr, C});
  v.decode_rows = v.decode_buf.transpose(0, 1);
  v.full_buf = road.view({tpr, width});
  v.full_rows = v.full_buf.view({tpr, W, C});
  v.decode_real = v.decode_rows.narrow(0, 0, nloc);
  v.full_real = v.full_rows.narrow(0, 0, nloc);
  v.decode_pad = v.decode_rows.narrow(0, nloc, tpr - nloc);
  v.full_pad = v.full_rows.narrow(0, nloc, tpr - nloc);
  v.send = v.decode_buf.view({W * tpr, C});
  v.exchange = exchange_.narrow(0, 0, W * tpr * C).view({W * tpr, C});
  v.pack_cols.clear();
  v.gathered_cols.clear();
  v.staged_cols.clear();
  if (P > 0) {
    v.pack = pack_.narrow(0, 0, tpr * P).view({tpr, P});
    v.pack_pad = v.pack.narrow(0, nloc, tpr - nloc);
    v.gathered = gathered_.narrow(0, 0, W * tpr * P).view({W * tpr, P});
    int64_t col = 0, off = 0;
    for (const int64_t w : s.pack_cols) {
      v.pack_cols.push_back(v.pack.narrow(0, 0, nloc).narrow(1, col, w));
      v.gathered_cols.push_back(v.gathered.narrow(1, col, w));
      v.staged_cols.push_back(stage_.narrow(0, off, W * tpr * w).view({W * tpr, w}));
      col += w;
      off += W * tpr * w;
    }
  }
  for (const bool full_road : {false, true}) {
    DsaCpRows& r = full_road ? v.full_road : v.decode_road;
    r.full_road = full_road;
    r.world = W;
    r.tpr = tpr;
    r.width = width;
    r.buf = full_road ? v.full_buf : v.decode_buf;
    r.rows = full_road ? v.full_rows : v.decode_rows;
    r.real = full_road ? v.full_real : v.decode_real;
    r.send = v.send;
    r.exchange = v.exchange;
  }
  if (s.topk > 0) {
    v.topk = topk_.narrow(0, 0, tpr * s.topk).view({tpr, 1, s.topk});
    v.topk_real = v.topk.narrow(0, 0, nloc);
    v.topk_pad = v.topk.narrow(0, nloc, tpr - nloc);
  }
  return v;
}

const DsaCpRows& DsaCpWorkspace::road_rows(int64_t tpr, int64_t nloc, bool full_road) {
  const DsaCpViews& v = views(tpr, nloc);
  if (nloc < tpr) ops::dense::zero(full_road ? v.full_pad : v.decode_pad);
  return full_road ? v.full_road : v.decode_road;
}

}  // namespace aar::sparse::detail
