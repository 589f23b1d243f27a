// Test-only fault injection at the operator boundary (ops/fault_injection.h).
#include "ascend_attn_rt/ops/fault_injection.h"

#include <atomic>
#include <string>

namespace aar::ops::testing {
namespace {
// Threads currently armed: the hot path's only shared read.
std::atomic<int32_t> g_armed{0};
struct ThreadState {
  bool armed = false;
  int64_t fail_at = 0;  // 0: count only
  int64_t calls = 0;
};
thread_local ThreadState t_state;
}  // namespace

void arm_fault(int64_t k) {
  if (!t_state.armed) g_armed.fetch_add(1, std::memory_order_relaxed);
  t_state = {true, k < 0 ? 0 : k, 0};
}

int64_t disarm_fault() {
  const int64_t n = t_state.calls;
  if (t_state.armed) g_armed.fetch_sub(1, std::memory_order_relaxed);
  t_state = {};
  return n;
}

int64_t fault_calls() { return t_state.calls; }

namespace detail {
bool any_fault_armed() { return g_armed.load(std::memory_order_relaxed) != 0; }

void fault_point_slow() {
  ThreadState& s = t_state;
  if (!s.armed) return;
  ++s.calls;
  if (s.fail_at != 0 && s.calls == s.fail_at) {
    throw FaultInjected("fault injected at operator call " + std::to_string(s.calls));
  }
}
}  // namespace detail

}  // namespace aar::ops::testing
