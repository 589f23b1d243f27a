// CPU twin of vllm-ascend's npu_scatter_nd_update_v2 (ascend_cpu_va; semantics in
// include/ascend_attn_rt/ops/dsa_inplace_ops.h): var[indices[i]] = update[i]; rows with a
// negative component or a linear index outside [0, numel of var's first k dims) are skipped, as
// the kernel drops them; the last of repeated rows wins. Every check precedes the first write.
#include <torch/library.h>

#include <unordered_set>

#include "../op_signatures.h"
#include "attention_reference.h"

namespace aar::ops::cpu {
namespace {

constexpr const char* kScatter = "_C_ascend::npu_scatter_nd_update_v2";

void scatter_nd_update_v2(at::Tensor& var, const at::Tensor& indices, const at::Tensor& update) {
  for (const at::Tensor* t : std::initializer_list<const at::Tensor*>{&var, &indices, &update}) {
    AAR_CHECK_ARG(t->device().is_cpu(), kScatter, ": the CPU twin needs CPU tensors, got ",
                  t == &var ? "var" : t == &indices ? "indices" : "update", " on ", t->device());
  }
  AAR_CHECK_ARG(indices.scalar_type() == at::kInt || indices.scalar_type() == at::kLong, kScatter,
                ": indices must be int32 or int64, got ", indices.scalar_type());
  AAR_CHECK_ARG(indices.dim() >= 1, kScatter, ": indices must be at least 1-D (..., k), got ", indices.sizes());
  const int64_t k = indices.size(-1);
  AAR_CHECK_ARG(k >= 1 && k <= var.dim(), kScatter, ": indices' last dim k=", k, " must be in [1, var.dim()=",
                var.dim(), "] (var ", var.sizes(), ")");
  AAR_CHECK_ARG(update.scalar_type() == var.scalar_type(), kScatter, ": update must have var's dtype ",
                var.scalar_type(), ", got ", update.scalar_type());
  const std::vector<int64_t> lead(indices.sizes().begin(), indices.sizes().end() - 1);
  std::vector<int64_t> want = lead, squeezed = lead;
  int64_t inner = 1;
  for (int64_t j = k; j < var.dim(); ++j) {
    want.push_back(var.size(j));
    if (var.size(j) != 1) squeezed.push_back(var.size(j));
    inner *= var.size(j);
  }
  AAR_CHECK_ARG(update.sizes() == c10::IntArrayRef(want) || update.sizes() == c10::IntArrayRef(squeezed), kScatter,
                ": update must be indices.shape[:-1] + var.shape[", k, ":] = ", c10::IntArrayRef(want),
                " (or without var's size-1 dims: ", c10::IntArrayRef(squeezed), "), got ", update.sizes());
  const int64_t rows = indices.numel() / k;
  if (rows == 0) return;
  const at::Tensor idx = indices.reshape({rows, k}).to(at::kLong).contiguous();
  const int64_t* ip = idx.data_ptr<int64_t>();
  std::vector<int64_t> stride(k, 1);
  for (int64_t j = k - 2; j >= 0; --j) stride[j] = stride[j + 1] * var.size(j + 1);
  const int64_t total = stride[0] * var.size(0);
  std::vector<int64_t> keep, lin_of;
  std::unordered_set<int64_t> seen;
  for (int64_t r = rows - 1; r >= 0; --r) {  // backwards: the last row of an index wins
    int64_t lin = 0;
    bool skip = false;
    for (int64_t j = 0; j < k && !skip; ++j) {
      const int64_t v = ip[r * k + j];
      int64_t term;
      skip = v < 0 || __builtin_mul_overflow(v, stride[j], &term) || __builtin_add_overflow(lin, term, &lin);
    }
    if (skip || lin >= total) continue;
    if (!seen.insert(lin).second) continue;
    keep.push_back(r);
    lin_of.push_back(lin);
  }
  if (keep.empty()) return;
  const int64_t n = static_cast<int64_t>(keep.size());
  c10::List<std::optional<at::Tensor>> where;
  for (int64_t j = 0; j < k; ++j) {
    at::Tensor w = at::empty({n}, at::kLong);
    int64_t* wp = w.data_ptr<int64_t>();
    for (int64_t i = 0; i < n; ++i) wp[i] = (lin_of[i] / stride[j]) % var.size(j);
    where.push_back(w);
  }
  std::vector<int64_t> upd_shape{n};
  upd_shape.insert(upd_shape.end(), var.sizes().begin() + k, var.sizes().end());
  const at::Tensor upd = update.reshape({rows, inner}).index_select(0, at::tensor(keep, at::kLong)).view(upd_shape);
  var.index_put_(where, upd);
}

}  // namespace
}  // namespace aar::ops::cpu

TORCH_LIBRARY_IMPL(ascend_cpu_va, CPU, m) {
  m.impl("npu_scatter_nd_update_v2", TORCH_FN(aar::ops::cpu::scatter_nd_update_v2));
}
