// Attention masks (docs/design/gqa.md §3.5). One builder per device (upstream's
// process-wide singleton lets the first device win; we key by device instead).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <optional>

namespace aar::gqa {

inline constexpr int64_t kCompressedMaskSize = 2048;

// Thread safety: every member may be called from any number of threads at once: one
// process-wide mutex guards the lazily made caches (cpp/gqa/mask.cpp), and a cached mask is
// replaced, never written, so a tensor handed out stays valid. (tests/cpp/test_concurrency.cpp)
class MaskBuilder {
 public:
  explicit MaskBuilder(c10::Device device);

  // 2048x2048 int8, 1 iff col > row; created once, kept on the device. The
  // fused kernels take it for sparse modes 3 and 4 (its content encodes only
  // the diagonal convention; the mode gives the semantics).
  const at::Tensor& splitfuse_mask();

  // LxL: strict upper triangle masked (-inf for fp16, 1/True otherwise), a
  // contiguous [:L,:L] slice on the device. Cached per dtype and regenerated
  // when L grows (upstream converts a cached mask between dtypes lossily,
  // turning bool into 1.0 instead of -inf; we generate per dtype).
  at::Tensor attn_mask(int64_t seq_len, at::ScalarType dtype);

  // None for non-causal attention; the bool 2048 mask for pooling models;
  // the splitfuse mask otherwise.
  std::optional<at::Tensor> attention_mask(bool causal, bool pooling);

  c10::Device device() const { return device_; }

 private:
  c10::Device device_;
  at::Tensor splitfuse_;
  at::Tensor cached_[3];          // fp16, bool, other (by dtype slot)
  at::ScalarType cached_dtype_[3] = {at::kHalf, at::kBool, at::kFloat};
  int64_t cached_len_[3] = {0, 0, 0};
};

}  // namespace aar::gqa
