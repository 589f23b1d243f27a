#pragma once
// Private to cpp/: a resource that one thread at a time may use, checked rather
// than assumed. The decode / indexer / DCP / offload / DSA workspaces are shared
// by every layer of one shape and workspace_group, which is right for the layers
// of one engine (they run one after another on one thread) and wrong for two
// engines on two threads: their intermediates would overwrite each other and
// the outputs and caches would be silently wrong. Every forward that uses a
// shared workspace enters it for its duration, and a graph bucket whose calls
// use one enters it for each CPU replay (graph::ExclusiveScope), so a second
// thread is refused by name instead of corrupting the first one's work.
//
// Cost: one compare-and-swap to enter, one store to leave. Nested entries on
// one thread are counted (a layer inside a replay, a workspace two layers of
// one step share).
#include <atomic>
#include <cstdint>
#include <string>

#include "ascend_attn_rt/errors.h"

namespace aar::detail {

class ExclusiveUse {
 public:
  // `what` names the resource in the error, e.g. "the MLA decode workspace (group 0)".
  explicit ExclusiveUse(std::string what) : what_(std::move(what)) {}
  ExclusiveUse(const ExclusiveUse&) = delete;
  ExclusiveUse& operator=(const ExclusiveUse&) = delete;

  // Throws InvalidArgument naming the resource when another thread is inside.
  void enter() {
    const uintptr_t me = thread_token();
    uintptr_t owner = owner_.load(std::memory_order_acquire);
    if (owner == me) {
      ++depth_;
      return;
    }
    uintptr_t expected = 0;
    if (!owner_.compare_exchange_strong(expected, me, std::memory_order_acq_rel)) {
      AAR_CHECK_ARG(false, what_, " is in use by another thread: layers (or graph replays) that run concurrently "
                    "must not share it; give each engine its own workspace_group");
    }
    depth_ = 1;
  }
  void leave() noexcept {
    if (--depth_ == 0) owner_.store(0, std::memory_order_release);
  }
  const std::string& what() const { return what_; }

 private:
  static uintptr_t thread_token() {
    static thread_local char token;
    return reinterpret_cast<uintptr_t>(&token);
  }

  std::atomic<uintptr_t> owner_{0};
  int depth_ = 0;  // touched only by the owner
  std::string what_;
};

}  // namespace aar::detail
