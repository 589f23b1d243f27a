// Internal to the backends; public only because the Impl classes hold it.
//
// A layer binds the caller's KV caches on first use and keeps views derived
// from them (the (nb, bs, Nkv*D) view the fused kernel takes, the NZ view, the
// MLA (nb, 1, bs, D) view) so that a steady-state forward makes none. Those
// views are only valid while the caller's tensor describes the same memory with
// the same geometry. The TensorImpl address alone does not say so: an in-place
// `set_`, `resize_` or `as_strided_` keeps the object but moves or reshapes its
// memory, and once a tensor is freed a new one may be allocated at its address.
// A TensorBinding therefore holds the bound tensor (its address cannot be
// reused while bound) and records its storage, data pointer, storage offset,
// dtype, sizes and strides; `same` is a handful of integer compares (no
// allocation), cheap enough for the per-layer hot path.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <array>
#include <cstdint>

namespace aar::detail {

class TensorBinding {
 public:
  // Tensors with more dimensions are never `same` (always rebound): correct,
  // only slower. Every cache this runtime takes has at most 6.
  static constexpr int64_t kMaxDims = 8;

  // True when `t` is the bound tensor and still describes the memory and the
  // geometry it had when bound.
  bool same(const at::Tensor& t) const noexcept {
    const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
    if (dim_ < 0 || impl != src_.unsafeGetTensorImpl()) return false;
    // Read through the TensorImpl: Tensor::storage() copies the Storage handle (two
    // atomic reference-count updates per call, on every layer's forward).
    const c10::Storage& storage = impl->unsafe_storage();
    if (impl->dim() != dim_ || impl->dtype().toScalarType() != dtype_ || impl->storage_offset() != offset_ ||
        storage.unsafeGetStorageImpl() != storage_ || storage_ == nullptr || storage.data() != storage_data_) {
      return false;
    }
    const c10::IntArrayRef sz = impl->sizes(), st = impl->strides();
    for (int64_t i = 0; i < dim_; ++i) {
      if (sz[i] != sizes_[i] || st[i] != strides_[i]) return false;
    }
    return true;
  }

  // Holds `t` and records its memory and geometry.
  void bind(const at::Tensor& t) {
    src_ = t;
    dim_ = -1;
    if (!t.defined() || t.dim() > kMaxDims) return;
    storage_ = t.storage().unsafeGetStorageImpl();
    storage_data_ = t.storage().data();
    offset_ = t.storage_offset();
    dtype_ = t.scalar_type();
    const c10::IntArrayRef sz = t.sizes(), st = t.strides();
    for (int64_t i = 0; i < t.dim(); ++i) {
      sizes_[i] = sz[i];
      strides_[i] = st[i];
    }
    dim_ = t.dim();
  }

  void reset() noexcept {
    src_.reset();
    dim_ = -1;
  }

  bool bound() const noexcept { return src_.defined(); }
  const at::Tensor& tensor() const noexcept { return src_; }

 private:
  at::Tensor src_;
  const c10::StorageImpl* storage_ = nullptr;
  const void* storage_data_ = nullptr;  // the storage's memory (with offset_: the tensor's data)
  int64_t offset_ = 0;
  int64_t dim_ = -1;
  at::ScalarType dtype_ = at::ScalarType::Undefined;
  std::array<int64_t, kMaxDims> sizes_{}, strides_{};
};

// A view a layer keeps across calls: made from `src` by `make`, remade only when `src` is another
// tensor or describes other memory, or `key` (the view's row count, say) differs. A dispatcher view
// op costs about 0.1-0.3 us of host time; a kept view costs the `same` compares. Two sources are
// kept (the last two seen): the metadata builders stage every other step in a second buffer (so a
// step's metadata stays valid while the next one is built), so a step's tensors alternate between two.
struct KeptView {
  struct Entry {
    TensorBinding src;
    int64_t key = -1;
    at::Tensor view;
  };
  std::array<Entry, 2> entries;
  int last = 0;  // the entry used last

  template <typename Make>
  const at::Tensor& get(const at::Tensor& from, int64_t k, Make make) {
    for (int i : {last, 1 - last}) {
      Entry& e = entries[i];
      if (e.key == k && e.view.defined() && e.src.same(from)) {
        last = i;
        return e.view;
      }
    }
    last = 1 - last;  // replaces the entry used less recently
    Entry& e = entries[last];
    e.view = make();
    e.src.bind(from);
    e.key = k;
    return e.view;
  }
};

// Rows [start, start + n) of t (dim >= 1) along dim 0: narrow's view, made through one dispatcher
// call (as_strided) where narrow makes three (narrow, slice, as_strided): about 0.5 us less per call
// on the host (docs/design/sparse_cp.md §15.1). For a view of a tensor the caller gets anew each call.
inline at::Tensor leading_rows(const at::Tensor& t, int64_t start, int64_t n) {
  const c10::IntArrayRef sz = t.sizes(), st = t.strides();
  TORCH_CHECK(sz.size() >= 1 && start >= 0 && n >= 0 && start + n <= sz[0], "leading_rows: rows [", start, ", ",
              start + n, ") of a tensor of ", sz.size() >= 1 ? sz[0] : 0, " rows");
  std::array<int64_t, TensorBinding::kMaxDims> buf{};
  TORCH_CHECK(sz.size() <= buf.size(), "leading_rows: ", sz.size(), " dims");
  std::copy(sz.begin(), sz.end(), buf.begin());
  buf[0] = n;
  return t.as_strided(c10::IntArrayRef(buf.data(), sz.size()), st, t.storage_offset() + start * st[0]);
}

// The first n rows of t: t itself when it has n rows (no new tensor), else leading_rows(t, 0, n).
inline at::Tensor first_rows(const at::Tensor& t, int64_t n) { return t.size(0) == n ? t : leading_rows(t, 0, n); }

// A GQA-family layer's bound ND caches (nb, bs, Nkv, D) and the (nb, bs, Nkv*D)
// views the fused kernels take, remade only when a cache is another tensor or
// describes other memory. The caches must have been validated contiguous, so
// the views alias them.
struct BoundNdCaches {
  TensorBinding key_src, value_src;
  at::Tensor key, value, key_3d, value_3d;

  void bind(const at::Tensor& k, const at::Tensor& v, int64_t row_width) {
    if (key_src.same(k) && value_src.same(v)) return;
    key = k;
    value = v;
    const int64_t nb = k.sizes()[0], bs = k.sizes()[1];
    key_3d = k.view({nb, bs, row_width});
    value_3d = v.view({nb, bs, row_width});
    key_src.bind(k);
    value_src.bind(v);
  }
};

}  // namespace aar::detail
