// Internal: the host staging buffer of a metadata builder and its device twin,
// shared by the backend builders. A build writes the staging buffer and copies
// what it used to the device buffer; on the CPU (or without separate buffers)
// the two are the same tensor and nothing is copied.
#pragma once

#include <ATen/ATen.h>

#include <exception>

namespace aar::detail {

struct StagingPair {
  at::Tensor staging, device;  // int32, `words` long, zero-filled
};

inline StagingPair make_staging_pair(int64_t words, const c10::Device& device, bool separate) {
  const auto host = at::TensorOptions().dtype(at::kInt).device(at::kCPU);
  StagingPair p;
  if (separate && !device.is_cpu()) {
    // Page-locked staging makes the per-build copy asynchronous; fall back to
    // pageable memory when no device runtime provides a pinned allocator.
    try {
      p.staging = at::zeros({words}, host.pinned_memory(true));
    } catch (const std::exception&) {
      p.staging = at::zeros({words}, host);
    }
  } else {
    p.staging = at::zeros({words}, host);
  }
  p.device = separate ? at::zeros({words}, host.device(device)) : p.staging;
  return p;
}

}  // namespace aar::detail
