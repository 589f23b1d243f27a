// The shared KV-cache pieces: the binding key the layers keep for a caller's
// cache (detail::TensorBinding) and the layout checks (cpp/common/kv_cache.h).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <string>

#include "../../cpp/common/kv_cache.h"
#include "ascend_attn_rt/detail/tensor_binding.h"
#include "ascend_attn_rt/errors.h"

using aar::detail::TensorBinding;

TEST(RtKvCacheBinding, SameTensorSameMemoryMatches) {
  at::Tensor t = at::zeros({4, 16, 2, 8});
  TensorBinding b;
  EXPECT_FALSE(b.same(t));
  b.bind(t);
  EXPECT_TRUE(b.same(t));
  at::Tensor alias = t;  // the same TensorImpl through another handle
  EXPECT_TRUE(b.same(alias));
  t.fill_(3.0);  // writing the memory changes nothing the views depend on
  EXPECT_TRUE(b.same(t));
  b.reset();
  EXPECT_FALSE(b.same(t));
}

TEST(RtKvCacheBinding, AnotherTensorOverTheSameMemoryIsRebound) {
  at::Tensor t = at::zeros({4, 16, 2, 8});
  TensorBinding b;
  b.bind(t);
  EXPECT_FALSE(b.same(t.view({4, 16, 2, 8})));  // a new tensor over the same storage
  EXPECT_FALSE(b.same(t.clone()));
}

TEST(RtKvCacheBinding, InPlaceMovesAreRebound) {
  const std::vector<int64_t> shape{4, 16, 2, 8};
  {  // set_: other storage, same geometry
    at::Tensor t = at::zeros(shape), other = at::zeros(shape);
    TensorBinding b;
    b.bind(t);
    t.set_(other.storage(), 0, shape, other.strides());
    EXPECT_FALSE(b.same(t));
    b.bind(t);
    EXPECT_TRUE(b.same(t));
  }
  {  // resize_: more blocks (the storage is reallocated)
    at::Tensor t = at::zeros(shape);
    TensorBinding b;
    b.bind(t);
    t.resize_({8, 16, 2, 8});
    EXPECT_FALSE(b.same(t));
  }
  {  // resize_ within the storage: same data pointer, other sizes
    at::Tensor t = at::zeros(shape);
    TensorBinding b;
    b.bind(t);
    t.resize_({2, 16, 2, 8});
    EXPECT_FALSE(b.same(t));
  }
  {  // as_strided_: same storage, another offset
    at::Tensor base = at::zeros({8, 16, 2, 8});
    at::Tensor t = base.narrow(0, 0, 4);
    TensorBinding b;
    b.bind(t);
    t.as_strided_(shape, t.strides(), 4 * 16 * 2 * 8);
    EXPECT_FALSE(b.same(t));
  }
  {  // as_strided_: same storage and offset, other strides
    at::Tensor base = at::zeros({4 * 16 * 2 * 8});
    at::Tensor t = base.view(shape);
    TensorBinding b;
    b.bind(t);
    t.as_strided_({4, 2, 16, 8}, {256, 8, 16, 1}, 0);
    EXPECT_FALSE(b.same(t));
    t.as_strided_(shape, {256, 16, 8, 1}, 0);  // back: matches again
    EXPECT_TRUE(b.same(t));
  }
}

TEST(RtKvCacheBinding, HoldsTheBoundTensorSoItsAddressIsNotReused) {
  at::Tensor t = at::zeros({4, 16, 2, 8});
  const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  c10::weak_intrusive_ptr<c10::TensorImpl> weak(t.getIntrusivePtr());
  TensorBinding b;
  b.bind(t);
  EXPECT_EQ(t.use_count(), 2);
  t.reset();  // the caller drops its cache
  EXPECT_FALSE(weak.expired());
  EXPECT_EQ(b.tensor().unsafeGetTensorImpl(), impl);
  b.reset();
  EXPECT_TRUE(weak.expired());
}

TEST(RtKvCacheBinding, TooManyDimensionsAreAlwaysRebound) {
  at::Tensor t = at::zeros(std::vector<int64_t>(TensorBinding::kMaxDims + 1, 1));
  TensorBinding b;
  b.bind(t);
  EXPECT_TRUE(b.bound());
  EXPECT_FALSE(b.same(t));
}

TEST(RtKvCacheLayout, ContiguousAtAnyOffsetIsAccepted) {
  at::Tensor stacked = at::zeros({2, 6, 16, 2, 8});
  EXPECT_NO_THROW(aar::detail::check_kv_cache_layout(stacked[1], "value_cache", "(nb, bs, Nkv, D)"));
  EXPECT_NO_THROW(aar::detail::check_kv_cache_layout(stacked[0].narrow(0, 2, 3), "key_cache", "(nb, bs, Nkv, D)"));
}

TEST(RtKvCacheLayout, OtherLayoutsAreRejectedWithNameShapeAndStrides) {
  at::Tensor hnd = at::zeros({6, 2, 16, 8}).permute({0, 2, 1, 3});
  try {
    aar::detail::check_kv_cache_layout(hnd, "key_cache", "(num_blocks, block_size, num_kv_heads, head_size)");
    FAIL() << "a permuted cache was accepted";
  } catch (const aar::InvalidArgument& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("key_cache must be contiguous"), std::string::npos) << msg;
    EXPECT_NE(msg.find("(num_blocks, block_size, num_kv_heads, head_size)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("shape [6, 16, 2, 8] strides [256, 8, 128, 1]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("strides [256, 16, 8, 1]"), std::string::npos) << msg;  // the expected ones
  }
  at::Tensor wide = at::zeros({6, 16, 3, 8});
  EXPECT_THROW(aar::detail::check_kv_cache_layout(wide.narrow(2, 0, 2), "value_cache", "x"), aar::InvalidArgument);
  EXPECT_THROW(aar::detail::check_kv_cache_layout(wide.narrow(3, 0, 4), "value_cache", "x"), aar::InvalidArgument);
}

TEST(RtKvCacheLayout, NonOverlapping) {
  using aar::detail::is_non_overlapping;
  at::Tensor t = at::zeros({6, 16, 2, 8});
  EXPECT_TRUE(is_non_overlapping(t));
  EXPECT_TRUE(is_non_overlapping(t.permute({0, 2, 1, 3})));
  EXPECT_TRUE(is_non_overlapping(t.narrow(3, 0, 5)));
  EXPECT_TRUE(is_non_overlapping(t.flip({0})));
  EXPECT_TRUE(is_non_overlapping(at::zeros({6 * 300}).as_strided({6, 16, 2, 8}, {300, 16, 8, 1})));  // padded
  EXPECT_TRUE(is_non_overlapping(at::zeros({0, 16, 2, 8}).expand({0, 16, 2, 8})));
  EXPECT_FALSE(is_non_overlapping(t.narrow(0, 0, 1).expand({6, 16, 2, 8})));
  EXPECT_FALSE(is_non_overlapping(at::zeros({6 * 256}).as_strided({6, 16, 2, 8}, {128, 16, 8, 1})));
  // Conservative: this interleaving touches distinct elements but is reported as overlapping.
  EXPECT_FALSE(is_non_overlapping(at::zeros({16}).as_strided({3, 2}, {2, 3})));
  EXPECT_THROW(aar::detail::check_non_overlapping(t.narrow(0, 0, 1).expand({6, 16, 2, 8}), "dst_key_cache"),
               aar::InvalidArgument);
}
