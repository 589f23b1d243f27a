// Internal: the lightning indexer's per-token intermediates (key, query,
// weights) of the SFA layers, shared by every layer of one shape (layers run
// one after another, so a layer's intermediates are dead when the next one
// starts), sized for the largest step seen. The views a step of `tk` tokens
// needs are made the first time `tk` is seen and cached, so a steady-state
// forward creates none (the MLA family's decode workspace does the same).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace aar::detail {
class ExclusiveUse;  // cpp/common/exclusive_use.h
}

namespace aar::sfa::detail {

struct IndexerShape {
  c10::Device device = c10::Device(c10::kCPU);
  c10::ScalarType dtype = c10::ScalarType::Undefined;
  int64_t n_head = 0, head_dim = 0, rope_dim = 0, group = 0;
  bool operator==(const IndexerShape& o) const {
    return device == o.device && dtype == o.dtype && n_head == o.n_head && head_dim == o.head_dim &&
           rope_dim == o.rope_dim && group == o.group;
  }
};

struct IndexerViews {
  int64_t generation = -1;
  at::Tensor k;       // (tk, D): the key (projection, normed in place, RoPE'd in place)
  at::Tensor k3;      // (tk, 1, D)
  at::Tensor k_head;  // (tk, 1, 1, R): its first R dims (BSND, S = 1), rotated in place
  at::Tensor q;       // (tk, n_head * D): the query projection
  at::Tensor q3;      // (tk, n_head, D)
  at::Tensor q_head;  // (tk, 1, n_head, R)
  at::Tensor w;       // (tk, n_head): the score weights
};

class IndexerWorkspace {
 public:
  explicit IndexerWorkspace(const IndexerShape& shape);
  const IndexerViews& views(int64_t tk);
  const IndexerShape& shape() const { return shape_; }
  // One workspace per shape (and group) in the process.
  static std::shared_ptr<IndexerWorkspace> shared(const IndexerShape& shape);

 private:
  IndexerShape shape_;
  std::shared_ptr<::aar::detail::ExclusiveUse> exclusive_;
  int64_t capacity_ = 0, generation_ = 0;
  at::Tensor k_, q_, w_;
  std::vector<IndexerViews> views_;
};

}  // namespace aar::sfa::detail
