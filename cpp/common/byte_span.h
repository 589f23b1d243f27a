#pragma once
// Private to cpp/: whether two tensors share bytes of one storage (docs/design/core.md §5). The
// layers refuse a cache pair, or an output and an input, that do, before their first write.
#include <ATen/core/Tensor.h>

#include <cstdint>

namespace aar::detail {

// The bytes [first, last) of its storage a tensor's elements span (strided views included: the
// span from its first element to its last).
struct ByteSpan {
  int64_t first = 0, last = 0;
};

inline ByteSpan byte_span(const at::Tensor& t) {
  int64_t extent = 0;  // elements from the first to the last
  for (int64_t d = 0; d < t.dim(); ++d) extent += (t.size(d) - 1) * t.stride(d);
  const int64_t es = static_cast<int64_t>(t.element_size());
  return {t.storage_offset() * es, (t.storage_offset() + extent + 1) * es};
}

// True when `a` and `b` are non-empty views of one storage whose spans intersect (their spans in
// `sa`, `sb`). Separate allocations, the common case, cost two pointer loads and a compare.
inline bool spans_overlap(const at::Tensor& a, const at::Tensor& b, ByteSpan& sa, ByteSpan& sb) {
  if (!a.defined() || !b.defined() || a.numel() == 0 || b.numel() == 0) return false;
  const c10::StorageImpl* pa = a.unsafeGetTensorImpl()->unsafe_storage().unsafeGetStorageImpl();
  const c10::StorageImpl* pb = b.unsafeGetTensorImpl()->unsafe_storage().unsafeGetStorageImpl();
  if (pa != pb || pa == nullptr) return false;
  sa = byte_span(a);
  sb = byte_span(b);
  return sa.first < sb.last && sb.first < sa.last;
}

}  // namespace aar::detail
