// How a metadata builder's host staging buffers reach the device.
//
// A build writes the step's metadata into a host (page-locked when possible)
// staging buffer and copies what it used to the builder's device buffer with
// one asynchronous copy. The device may consume that copy later (asynchronous
// scheduling, or a drafter building several times per step), so a host buffer
// is never rewritten before the copies made from it have completed: the
// builders use their host buffers in turn (two by default), record an event
// after each build's copies, and wait on a buffer's event before writing it
// again. With two buffers the wait is normally for a copy two builds old, which
// has long completed.
//
// The hooks below are that mechanism's device interface: the default one uses
// a c10::Event on the device's current stream (torch_npu's stream on an NPU); a
// test or an engine with its own streams supplies its own. On the CPU (or when
// the builder's device buffer is the host buffer) nothing is copied and no hook
// is called.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <memory>

namespace aar {

// Thread safety: called by the builder that owns them, on the thread of its build; hooks
// shared by several builders must synchronise themselves.
class StagingHooks {
 public:
  virtual ~StagingHooks() = default;
  // Enqueues dst <- src (dst on the device, src a host staging range), without
  // waiting for it. The default is dst.copy_(src, /*non_blocking=*/true).
  virtual void copy(const at::Tensor& dst, const at::Tensor& src);
  // After a build's copies from host buffer `slot` were enqueued.
  virtual void record(int slot) = 0;
  // Before host buffer `slot` is rewritten: returns once every copy recorded
  // for it has completed.
  virtual void wait(int slot) = 0;
};

// The default: one c10::Event per host buffer, recorded on the current stream
// of `device`; for a CPU device, copies complete when they return and record /
// wait do nothing.
std::shared_ptr<StagingHooks> default_staging_hooks(c10::Device device, int num_slots);

}  // namespace aar
