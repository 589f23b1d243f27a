// Which build of which metadata builder a metadata (or the step parameters
// made from it) comes from.
//
// A builder owns the storage behind its metadata: the host length lists, the
// host and device buffers the tensors view. Each build rewrites them, so only
// the metadata of a builder's latest build is valid. Every build gets the next
// generation number; a metadata copied before a later build (a C++ copy, a
// Python object of an earlier build, a draft step's metadata from a builder
// that has since built again) is stale, and the consumers (forward, graph
// update) reject it instead of reading lists that now hold another step.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

namespace aar {

struct BuildStamp {
  static constexpr uint64_t kRetired = ~uint64_t{0};  // the builder was destroyed

  uint64_t generation = 0;
  // The builder's latest generation (kRetired once it is gone); null for
  // metadata that no builder made (filled in by hand), which is always current.
  std::shared_ptr<const std::atomic<uint64_t>> live;

  bool current() const noexcept {
    return live == nullptr || live->load(std::memory_order_acquire) == generation;
  }
};

// Throws InvalidArgument naming `what` (e.g. "metadata") when `s` is stale.
void check_current(const BuildStamp& s, const char* what);

namespace detail {
// A builder's side: the counter its metadata point at.
//
// Thread safety: that of the builder owning it (one thread at a time).
class BuildCounter {
 public:
  BuildCounter() : live_(std::make_shared<std::atomic<uint64_t>>(0)) {}
  ~BuildCounter() { live_->store(BuildStamp::kRetired, std::memory_order_release); }
  BuildCounter(const BuildCounter&) = delete;
  BuildCounter& operator=(const BuildCounter&) = delete;
  // Starts generation n+1 and stamps `s` with it.
  void next(BuildStamp& s) {
    if (s.live == nullptr) s.live = live_;
    s.generation = live_->load(std::memory_order_relaxed) + 1;
    live_->store(s.generation, std::memory_order_release);
  }
  uint64_t current() const { return live_->load(std::memory_order_relaxed); }

 private:
  std::shared_ptr<std::atomic<uint64_t>> live_;
};
}  // namespace detail

}  // namespace aar
