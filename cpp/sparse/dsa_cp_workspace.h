// Internal: the buffers of a DSA-CP layer's token slice (docs/design/sparse_cp.md §7.1), shared by
// every DSA-CP layer of one shape and workspace group (layers run one after another, so one layer's
// slice is dead when the next one starts), sized for the largest slice seen. The views a slice of
// (tokens_per_rank, local tokens) needs are made the first time that pair is seen and cached, so a
// steady-state forward allocates nothing and creates no view for them.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "ascend_attn_rt/sparse/dsa_cp_road.h"

namespace aar::detail {
class ExclusiveUse;  // cpp/common/exclusive_use.h
}

namespace aar::sparse::detail {

struct DsaCpShape {
  c10::Device device = c10::Device(c10::kCPU);
  c10::ScalarType dtype = c10::ScalarType::Undefined;
  int64_t world = 1;
  int64_t road_width = 0;           // heads x value dim of the slice's attention output
  std::vector<int64_t> pack_cols;   // the column blocks of the rows every rank gathers (empty: none)
  int64_t group = 0;                // workspace_group
  int64_t topk = 0;                 // DSA-CP x DCP: K of the slice's padded selection (0: none)
  bool operator==(const DsaCpShape& o) const {
    return device == o.device && dtype == o.dtype && world == o.world && road_width == o.road_width &&
           pack_cols == o.pack_cols && group == o.group && topk == o.topk;
  }
};

// Views of one (tpr, nloc) slice. `rows` / `real` / `pad` are (rows, W, road_width / W) views of the
// road's buffer in the layout of the road (DsaCpRows); `pack_*` exist when the shape has pack columns.
struct DsaCpViews {
  int64_t generation = -1;
  at::Tensor decode_buf, decode_rows, decode_real, decode_pad;  // (W, tpr, C) and its (tpr, W, C) views
  at::Tensor full_buf, full_rows, full_real, full_pad;          // (tpr, W C) and its (tpr, W, C) views
  at::Tensor send, exchange;                                    // (W tpr, C): decode_buf, the all-to-all's output
  at::Tensor pack, pack_pad;                                    // (tpr, width); rows [nloc, tpr)
  std::vector<at::Tensor> pack_cols;                            // (nloc, cols[i]) of the real rows
  at::Tensor gathered;                                          // (W tpr, width): the all-gather's output
  std::vector<at::Tensor> gathered_cols;                        // (W tpr, cols[i]) views of `gathered`
  std::vector<at::Tensor> staged_cols;                          // (W tpr, cols[i]) contiguous copies' targets
  at::Tensor topk, topk_real, topk_pad;                         // shape.topk > 0: (tpr, 1, K) int32, rows [0, nloc) / rest
  DsaCpRows decode_road, full_road;                             // road_rows' two answers, made with the views
};

class DsaCpWorkspace {
 public:
  explicit DsaCpWorkspace(const DsaCpShape& shape);
  // Enters the workspace for the running forward (graph::use_in_forward).
  const DsaCpViews& views(int64_t tpr, int64_t nloc);
  // The road's rows (sparse/dsa_cp_road.h) of that slice, padding rows zeroed.
  // (The views' own copy, no reference count per call; remade with the views when the workspace grows.)
  const DsaCpRows& road_rows(int64_t tpr, int64_t nloc, bool full_road);
  const DsaCpShape& shape() const { return shape_; }
  static std::shared_ptr<DsaCpWorkspace> shared(const DsaCpShape& shape);

 private:
  DsaCpShape shape_;
  std::shared_ptr<::aar::detail::ExclusiveUse> exclusive_;
  int64_t capacity_ = 0, generation_ = 0, pack_width_ = 0;
  at::Tensor road_, exchange_, pack_, gathered_, stage_, topk_;
  std::vector<at::Tensor> retired_;  // buffers outgrown (at most as large, together, as the current ones)
  std::map<std::pair<int64_t, int64_t>, DsaCpViews> views_;
};

}  // namespace aar::sparse::detail
