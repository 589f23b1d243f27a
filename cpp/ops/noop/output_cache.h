// The no-compute provider's outputs: correctly shaped tensors from a small
// per-thread cache keyed by (shape, dtype, device), so steady-state calls
// allocate nothing. Shared by every no-compute kernel file. The kernels are
// registered for the CPU and the Meta dispatch keys: on meta tensors (no
// storage) a whole forward runs its host work only, at any size.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

namespace aar::ops::noop {

// Up to 6 dims; the returned tensor is reused by later calls of the same shape.
// Returned by value: the cache is a small hashed table, so a later call may replace
// the entry an earlier result came from (a reference would then change under
// its holder, e.g. between two outputs of one kernel).
at::Tensor cached(c10::IntArrayRef shape, at::ScalarType dtype, c10::Device device);

}  // namespace aar::ops::noop
