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
// op costs about 0.1-0.3 us of host time; a kept view costs the `same` compares.
struct KeptView {
  TensorBinding src;
  int64_t key = -1;
  at::Tensor view;

  template <typename Make>
  const at::Tensor& get(const at::Tensor& from, int64_t k, Make make) {
    if (key != k || !view.defined() || !src.same(from)) {
      view = make();
      src.bind(from);
      key = k;
    }
    return view;
  }
};

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
