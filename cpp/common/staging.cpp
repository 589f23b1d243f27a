#include "staging.h"

#include <c10/core/Event.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <exception>
#include <optional>
#include <vector>

#include "ascend_attn_rt/errors.h"

namespace aar {

void StagingHooks::copy(const at::Tensor& dst, const at::Tensor& src) {
  at::Tensor d = dst;
  d.copy_(src, /*non_blocking=*/true);
}

namespace {

// One c10::Event per host buffer on the device's current stream.
class EventStagingHooks final : public StagingHooks {
 public:
  EventStagingHooks(c10::Device device, int n) : device_(device) {
    events_.reserve(n);
    for (int i = 0; i < n; ++i) events_.emplace_back(device.type());
  }
  void record(int slot) override {
    const c10::impl::VirtualGuardImpl guard(device_.type());
    events_.at(slot).record(guard.getStream(device_));
  }
  void wait(int slot) override {
    c10::Event& e = events_.at(slot);
    if (e.was_marked_for_recording()) e.synchronize();
  }

 private:
  c10::Device device_;
  std::vector<c10::Event> events_;
};

// The CPU: copies are complete when copy_ returns.
class SyncStagingHooks final : public StagingHooks {
 public:
  void record(int) override {}
  void wait(int) override {}
};

}  // namespace

std::shared_ptr<StagingHooks> default_staging_hooks(c10::Device device, int num_slots) {
  AAR_CHECK_ARG(num_slots >= 1, "num_slots must be positive, got ", num_slots);
  if (device.is_cpu() || device.is_meta()) return std::make_shared<SyncStagingHooks>();
  return std::make_shared<EventStagingHooks>(device, num_slots);
}

namespace detail {

StagingBuffers::StagingBuffers(int64_t words, c10::Device device, bool separate, int num_host,
                               std::shared_ptr<StagingHooks> hooks, int slot_base)
    : separate_(separate), num_host_(separate ? num_host : 1), slot_base_(slot_base) {
  // Checked with or without separate buffers: a value the builder would not use is still refused.
  AAR_CHECK_ARG(num_host >= 1 && num_host <= kMaxHostBuffers, "staging_buffers must be in [1, ", kMaxHostBuffers,
                "], got ", num_host);
  AAR_CHECK_ARG(slot_base >= 0 && (hooks != nullptr || slot_base == 0), "staging slot_base=", slot_base,
                " needs shared hooks (the default hooks are private, with slots from 0)");
  const auto opts = at::TensorOptions().dtype(at::kInt).device(at::kCPU);
  for (int i = 0; i < num_host_; ++i) {
    if (separate && !device.is_cpu()) {
      // Page-locked staging makes the copy asynchronous; fall back to pageable
      // memory when no device runtime provides a pinned allocator.
      try {
        host_[i] = at::zeros({words}, opts.pinned_memory(true));
      } catch (const std::exception&) {
        host_[i] = at::zeros({words}, opts);
      }
    } else {
      host_[i] = at::zeros({words}, opts);
    }
  }
  device_ = separate ? at::zeros({words}, opts.device(device)) : host_[0];
  if (separate) hooks_ = hooks ? std::move(hooks) : default_staging_hooks(device, num_host_);
}

int32_t* StagingBuffers::begin() {
  if (pending_[active_]) {
    hooks_->wait(slot_base_ + active_);
    pending_[active_] = false;
  }
  copied_ = false;
  return host_[active_].data_ptr<int32_t>();
}

void StagingBuffers::copy(int64_t offset, int64_t words) {
  if (!separate_ || words <= 0) return;
  hooks_->copy(device_.narrow(0, offset, words), host_[active_].narrow(0, offset, words));
  copied_ = true;
}

void StagingBuffers::finish() {
  if (separate_ && copied_) {
    hooks_->record(slot_base_ + active_);
    pending_[active_] = true;
  }
  copied_ = false;
  active_ = (active_ + 1) % num_host_;
}

}  // namespace detail
}  // namespace aar
