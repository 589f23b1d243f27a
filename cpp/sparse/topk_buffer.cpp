#include "ascend_attn_rt/sparse/topk_buffer.h"

#include <ATen/ATen.h>

#include <limits>

#include "ascend_attn_rt/errors.h"
#include "ascend_attn_rt/ops/dense.h"

namespace aar::sfa {

namespace {

// A bound far above any model's buffer (2^31 - 1 int32 entries, 8 GiB): a
// larger product is a units mistake (bytes for tokens, a sequence length for
// a batch), refused by name rather than handed to the allocator.
constexpr int64_t kMaxEntries = std::numeric_limits<int32_t>::max();

}  // namespace

TopkBuffer::TopkBuffer(int64_t max_num_tokens, int64_t index_topk, c10::Device device) {
  AAR_CHECK_ARG(max_num_tokens > 0, "max_num_tokens must be positive, got ", max_num_tokens);
  AAR_CHECK_ARG(index_topk > 0, "index_topk must be positive, got ", index_topk);
  // Divided, not multiplied: the product of two int64 may overflow.
  AAR_CHECK_ARG(max_num_tokens <= kMaxEntries / index_topk, "max_num_tokens=", max_num_tokens, " x index_topk=",
                index_topk, " entries exceed the top-k buffer's bound of ", kMaxEntries,
                " int32 entries (8 GiB)");
  try {
    buffer_ = at::full({max_num_tokens, index_topk}, -1, at::TensorOptions().dtype(at::kInt).device(device));
  } catch (const c10::Error& e) {
    throw_invalid("TopkBuffer(max_num_tokens=", max_num_tokens, ", index_topk=", index_topk, "): allocating ",
                  max_num_tokens * index_topk * 4, " bytes on ", device, " failed: ", e.what_without_backtrace());
  }
}

const at::Tensor& TopkBuffer::view(int64_t n) const {
  AAR_CHECK_ARG(n >= 0 && n <= max_num_tokens(), "num_tokens=", n, " is out of range [0, max_num_tokens=",
                max_num_tokens(), "]");
  // Grown on demand: a view per size used, not one slot per possible size.
  if (views_.size() <= static_cast<size_t>(n)) views_.resize(static_cast<size_t>(n) + 1);
  at::Tensor& v = views_[static_cast<size_t>(n)];
  if (!v.defined()) v = buffer_.narrow(0, 0, n).unsqueeze(1);
  return v;
}

const at::Tensor& TopkBuffer::store(const at::Tensor& topk) {
  AAR_CHECK_ARG(topk.defined(), "topk must be a tensor");
  AAR_CHECK_ARG(topk.scalar_type() == at::kInt, "topk must be int32, got ", topk.scalar_type());
  AAR_CHECK_ARG(topk.device() == buffer_.device(), "topk is on ", topk.device(), " but the top-k buffer is on ",
                buffer_.device());
  const bool shape_ok = (topk.dim() == 3 && topk.size(1) == 1) || topk.dim() == 2;
  AAR_CHECK_ARG(shape_ok && topk.size(-1) == index_topk(), "topk must be (num_tokens, 1, ", index_topk(),
                ") or (num_tokens, ", index_topk(), "), got ", topk.sizes());
  const int64_t n = topk.size(0);
  AAR_CHECK_ARG(n <= max_num_tokens(), "topk has ", n, " rows, more than max_num_tokens=", max_num_tokens());
  const at::Tensor& v = view(n);
  // Rows already written in place (a collective's output placed in view(n)) are not copied again.
  const bool in_place = topk.dim() == 3 && topk.data_ptr() == v.data_ptr() && topk.sizes() == v.sizes() &&
                        topk.strides() == v.strides();
  if (!in_place) ops::dense::copy(v, topk.dim() == 3 ? topk : topk.unsqueeze(1));
  return v;
}

}  // namespace aar::sfa
