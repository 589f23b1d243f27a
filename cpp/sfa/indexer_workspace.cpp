#include "indexer_workspace.h"

#include <ATen/ATen.h>

#include "../common/shared_by_shape.h"
#include "../graph/exclusive_scope.h"

namespace aar::sfa::detail {

std::shared_ptr<IndexerWorkspace> IndexerWorkspace::shared(const IndexerShape& shape) {
  return aar::detail::shared_by_shape<IndexerWorkspace>(shape);
}

IndexerWorkspace::IndexerWorkspace(const IndexerShape& shape)
    : shape_(shape),
      exclusive_(std::make_shared<::aar::detail::ExclusiveUse>(
          "the SFA indexer workspace of workspace_group " + std::to_string(shape.group))) {}

const IndexerViews& IndexerWorkspace::views(int64_t tk) {
  graph::use_in_forward(exclusive_);
  const IndexerShape& s = shape_;
  const int64_t D = s.head_dim, N = s.n_head, R = s.rope_dim;
  if (tk > capacity_) {
    const int64_t cap = std::max<int64_t>(tk, 2 * capacity_);
    const auto opts = at::TensorOptions().dtype(s.dtype).device(s.device);
    k_ = at::empty({cap * D}, opts);
    q_ = at::empty({cap * N * D}, opts);
    w_ = at::empty({cap * N}, opts);
    capacity_ = cap;
    ++generation_;
  }
  if (static_cast<int64_t>(views_.size()) <= tk) views_.resize(tk + 1);
  IndexerViews& v = views_[tk];
  if (v.generation == generation_) return v;
  v.generation = generation_;
  v.k = k_.narrow(0, 0, tk * D).view({tk, D});
  v.k3 = v.k.view({tk, 1, D});
  v.k_head = v.k3.narrow(-1, 0, R).unsqueeze(1);
  v.q = q_.narrow(0, 0, tk * N * D).view({tk, N * D});
  v.q3 = v.q.view({tk, N, D});
  v.q_head = v.q3.narrow(-1, 0, R).unsqueeze(1);
  v.w = w_.narrow(0, 0, tk * N).view({tk, N});
  return v;
}

}  // namespace aar::sfa::detail
