#pragma once
// Private to cpp/: whether two tensors share bytes of memory (docs/design/core.md §5). The layers
// refuse a cache pair, or an output and an input, that do, before their first write.
#include <ATen/core/Tensor.h>

#include <cstdint>

namespace aar::detail {

// The bytes [first, last) a view spans in memory, from its first element to its last (strided
// views included), as addresses on its device.
struct ByteSpan {
  uintptr_t first = 0, last = 0;
};

inline ByteSpan byte_span(const at::Tensor& t) {
  int64_t extent = 0;  // elements from the first to the last
  for (int64_t d = 0; d < t.dim(); ++d) extent += (t.size(d) - 1) * t.stride(d);
  const auto first = reinterpret_cast<uintptr_t>(t.const_data_ptr());
  return {first, first + static_cast<uintptr_t>((extent + 1) * static_cast<int64_t>(t.element_size()))};
}

// The bytes of a tensor's whole storage, [lo, hi) ({0, 0}: no storage). One storage's range is read
// once per forward where several pairs involve it (the output of the GQA family's checks).
struct MemRange {
  uintptr_t lo = 0, hi = 0;
};

inline MemRange storage_range(const at::Tensor& t) {
  c10::StorageImpl* s = t.unsafeGetTensorImpl()->unsafe_storage().unsafeGetStorageImpl();
  if (s == nullptr) return {};
  // A read of the pointer: the accessor without the mutable-data-pointer guard (nothing is written).
  const auto lo = reinterpret_cast<uintptr_t>(s->_mutable_data_ptr_no_checks().get());
  return {lo, lo + s->nbytes()};
}

inline bool ranges_meet(const MemRange& a, const MemRange& b) {
  return a.lo != 0 && b.lo != 0 && a.lo < b.hi && b.lo < a.hi;
}

// Whether the views `a` and `b`, whose storages' ranges meet, share bytes (their spans in `sa`, `sb`).
inline bool views_overlap(const at::Tensor& a, const at::Tensor& b, ByteSpan& sa, ByteSpan& sb) {
  if (a.device() != b.device() || a.numel() == 0 || b.numel() == 0) return false;
  sa = byte_span(a);
  sb = byte_span(b);
  return sa.first < sb.last && sb.first < sa.last;
}

// True when `a` and `b` are non-empty views whose spans intersect in the memory of one device (their
// spans in `sa`, `sb`): views of one storage, or two storages over the same memory (two tensors an
// engine made from one pointer, as the C API's DLPack tensors are). Tensors whose allocations are
// apart, the common case, cost a few loads and compares.
inline bool spans_overlap(const at::Tensor& a, const at::Tensor& b, ByteSpan& sa, ByteSpan& sb) {
  if (!ranges_meet(storage_range(a), storage_range(b))) [[likely]] return false;
  return views_overlap(a, b, sa, sb);
}

}  // namespace aar::detail
