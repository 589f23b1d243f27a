// Internal: the host staging buffers of a metadata builder and their device
// twin, shared by the backend builders (see include/ascend_attn_rt/staging.h
// for why there are several host buffers and events).
//
// A build calls begin() (the host buffer to write, once its previous copies
// have completed), writes it, copy()s what it used to the device, and calls
// finish() (records the copies; the next build writes the next host buffer).
// A build that throws before finish() leaves the turn where it was. Without
// separate device buffers (the CPU) there is one host buffer, which is also the
// device buffer, and copy() does nothing.
#pragma once

#include <ATen/ATen.h>

#include <array>
#include <memory>

#include "ascend_attn_rt/staging.h"

namespace aar::detail {

class StagingBuffers {
 public:
  static constexpr int kMaxHostBuffers = 4;

  StagingBuffers() = default;
  // `words` int32 per buffer, zero-filled. `num_host` host buffers (1..4) when
  // `separate`; hooks == nullptr: default_staging_hooks(device). Host buffer i
  // is the hooks' slot slot_base + i (several StagingBuffers may share one
  // hooks object with disjoint slot ranges; the default hooks are private, so
  // slot_base must then be 0).
  StagingBuffers(int64_t words, c10::Device device, bool separate, int num_host,
                 std::shared_ptr<StagingHooks> hooks, int slot_base = 0);

  bool separate() const { return separate_; }
  int num_host() const { return num_host_; }
  // The host buffer the current (or next) build writes.
  int active() const { return active_; }
  const at::Tensor& host(int i) const { return host_[i]; }
  const at::Tensor& host() const { return host_[active_]; }
  const at::Tensor& device() const { return device_; }

  // Starts a build: waits until the copies last made from the next host
  // buffer have completed, makes it the active one, returns its data.
  int32_t* begin();
  // Enqueues device[offset, offset + words) <- active host buffer's same range.
  void copy(int64_t offset, int64_t words);
  // Ends a build: records its copies; the next begin() takes the next buffer.
  void finish();

 private:
  bool separate_ = false;
  int num_host_ = 1;
  int active_ = 0;
  int slot_base_ = 0;
  bool copied_ = false;  // copy() called since begin()
  std::array<at::Tensor, kMaxHostBuffers> host_;
  std::array<bool, kMaxHostBuffers> pending_{};  // recorded copies not yet waited for
  at::Tensor device_;
  std::shared_ptr<StagingHooks> hooks_;
};

}  // namespace aar::detail
