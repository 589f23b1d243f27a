#include "ascend_attn_rt/gqa/mask.h"

#include <ATen/ATen.h>

#include <limits>
#include <mutex>

#include "ascend_attn_rt/errors.h"

namespace aar::gqa {

namespace {
// Guards every MaskBuilder's lazily made caches (mask.h, "Thread safety"). One
// process-wide mutex rather than one per object keeps the class layout (and every
// header including it) unchanged; it is held only to look a cache up or to make
// it (rare: once per device, dtype slot and larger length), never for the copy
// a caller gets, and a cached mask is replaced, never written, so a tensor
// handed out stays valid while another thread regenerates the cache.
std::mutex& mask_mutex() {
  static std::mutex mu;
  return mu;
}
}  // namespace

MaskBuilder::MaskBuilder(c10::Device device) : device_(device) {}

const at::Tensor& MaskBuilder::splitfuse_mask() {
  std::lock_guard<std::mutex> lock(mask_mutex());
  if (!splitfuse_.defined()) {
    at::Tensor upper = at::ones({kCompressedMaskSize, kCompressedMaskSize}, at::kBool).triu(1);
    splitfuse_ = upper.to(at::kChar).to(device_);
  }
  return splitfuse_;
}

at::Tensor MaskBuilder::attn_mask(int64_t seq_len, at::ScalarType dtype) {
  AAR_CHECK_ARG(seq_len > 0, "seq_len must be positive, got ", seq_len);
  const int slot = dtype == at::kHalf ? 0 : (dtype == at::kBool ? 1 : 2);
  at::Tensor cached;
  {
    std::lock_guard<std::mutex> lock(mask_mutex());
    if (!cached_[slot].defined() || seq_len > cached_len_[slot] || cached_dtype_[slot] != dtype) {
      at::Tensor upper = at::ones({seq_len, seq_len}, at::kBool).triu(1);
      at::Tensor m;
      if (dtype == at::kHalf) {
        m = at::zeros({seq_len, seq_len}, at::kHalf).masked_fill(upper, -std::numeric_limits<float>::infinity());
      } else {
        m = upper.to(dtype);
      }
      cached_[slot] = m;
      cached_len_[slot] = seq_len;
      cached_dtype_[slot] = dtype;
    }
    cached = cached_[slot];
  }
  return cached.slice(0, 0, seq_len).slice(1, 0, seq_len).contiguous().to(device_, /*non_blocking=*/true);
}

std::optional<at::Tensor> MaskBuilder::attention_mask(bool causal, bool pooling) {
  if (!causal) return std::nullopt;
  if (pooling) return attn_mask(kCompressedMaskSize, at::kBool);
  return splitfuse_mask();
}

}  // namespace aar::gqa
