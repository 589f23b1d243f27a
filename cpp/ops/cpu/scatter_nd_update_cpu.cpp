// CPU twin of npu_scatter_nd_update_ (in place): for each row i of indices
// (..., k), self[indices[i]] = updates[i], indexing self's first k dims; updates
// is indices.shape[:-1] + self.shape[k:]. A row whose LINEAR index into self's
// first k dims (sum_j idx_j * prod(self.shape[j+1:k])) is negative or >= their
// element count is skipped: the upstream kernel drops negative linear indices
// (docs/design/sparse.md §7), which is what slot -1 and the A2/A3 (-1, bs-1)
// block/offset encoding rely on; out of range is skipped too rather than
// written past the tensor. A component outside its own dim but with an in-range
// linear index writes where the linear index points, as a flattening kernel
// does. When rows repeat an index the last one wins. Any dtype (updates must
// match self's); self may be any strided view; every check precedes the write.
#include <torch/library.h>

#include <unordered_set>

#include "../op_signatures.h"
#include "attention_reference.h"

namespace aar::ops::cpu {
namespace {

constexpr const char* kScatterNdUpdateOp = "npu_scatter_nd_update_";

at::Tensor& scatter_nd_update_(at::Tensor& self, const at::Tensor& indices, const at::Tensor& updates) {
  AAR_CHECK_ARG(indices.scalar_type() == at::kLong || indices.scalar_type() == at::kInt, kScatterNdUpdateOp,
                ": indices must be int64 or int32, got ", indices.scalar_type());
  AAR_CHECK_ARG(indices.dim() >= 2, kScatterNdUpdateOp, ": indices must be at least 2-D (..., k), got ", indices.sizes());
  const int64_t k = indices.size(-1);
  AAR_CHECK_ARG(k >= 1 && k <= self.dim(), kScatterNdUpdateOp, ": indices' last dim k=", k, " must be in [1, self.dim()=",
                self.dim(), "] (self ", self.sizes(), ")");
  AAR_CHECK_ARG(updates.scalar_type() == self.scalar_type(), kScatterNdUpdateOp, ": updates must have self's dtype ",
                self.scalar_type(), ", got ", updates.scalar_type());
  std::vector<int64_t> want(indices.sizes().begin(), indices.sizes().end() - 1);
  want.insert(want.end(), self.sizes().begin() + k, self.sizes().end());
  AAR_CHECK_ARG(updates.sizes() == c10::IntArrayRef(want), kScatterNdUpdateOp, ": updates must be indices.shape[:-1] + self.shape[",
                k, ":] = ", c10::IntArrayRef(want), ", got ", updates.sizes());
  for (const at::Tensor* t : std::initializer_list<const at::Tensor*>{&self, &indices, &updates}) {
    AAR_CHECK_ARG(t->device().is_cpu(), kScatterNdUpdateOp, ": the CPU twin needs CPU tensors, got one on ", t->device());
  }
  const int64_t rows = indices.numel() / k;
  const at::Tensor idx = indices.reshape({rows, k}).to(at::kLong).contiguous();
  const int64_t* ip = idx.data_ptr<int64_t>();
  std::vector<int64_t> stride(k, 1);
  for (int64_t j = k - 2; j >= 0; --j) stride[j] = stride[j + 1] * self.size(j + 1);
  const int64_t total = stride[0] * self.size(0);

  // Rows to write, last occurrence of each linear index first (walked backwards).
  std::vector<int64_t> keep, lin_of;
  std::unordered_set<int64_t> seen;
  for (int64_t r = rows - 1; r >= 0; --r) {
    int64_t lin = 0;
    bool overflow = false;
    for (int64_t j = 0; j < k; ++j) {
      int64_t term;
      overflow |= __builtin_mul_overflow(ip[r * k + j], stride[j], &term);
      overflow |= __builtin_add_overflow(lin, term, &lin);
    }
    if (overflow || lin < 0 || lin >= total) continue;  // dropped, as the kernel drops it
    if (!seen.insert(lin).second) continue;              // a later row already writes here
    keep.push_back(r);
    lin_of.push_back(lin);
  }
  if (keep.empty()) return self;
  const int64_t n = static_cast<int64_t>(keep.size());
  std::vector<at::Tensor> where;
  where.reserve(k);
  for (int64_t j = 0; j < k; ++j) {
    at::Tensor d = at::empty({n}, at::kLong);
    int64_t* dp = d.data_ptr<int64_t>();
    for (int64_t i = 0; i < n; ++i) dp[i] = (lin_of[i] / stride[j]) % self.size(j);
    where.push_back(d);
  }
  std::vector<int64_t> upd_shape{n};
  upd_shape.insert(upd_shape.end(), self.sizes().begin() + k, self.sizes().end());
  int64_t inner = 1;
  for (int64_t j = k; j < self.dim(); ++j) inner *= self.size(j);
  const at::Tensor upd = updates.reshape({rows, inner}).index_select(0, at::tensor(keep, at::kLong)).view(upd_shape);
  c10::List<std::optional<at::Tensor>> where_list;
  for (auto& w : where) where_list.push_back(w);
  self.index_put_(where_list, upd);
  return self;
}

}  // namespace
}  // namespace aar::ops::cpu

TORCH_LIBRARY_IMPL(ascend_cpu, CPU, m) {
  m.impl("npu_scatter_nd_update_", TORCH_FN(aar::ops::cpu::scatter_nd_update_));
}
