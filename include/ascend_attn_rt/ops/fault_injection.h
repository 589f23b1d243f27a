// Test-only fault injection at the operator boundary: every operator wrapper (ops/*.h) passes
// through one hook just before its dispatcher call, and when armed the k-th such call on the
// calling thread throws FaultInjected instead of running the operator. Tests use it to prove
// that a failure at any operator call of a step surfaces, leaves the caller's buffers (KV
// caches above all) in the state each backend's contract promises, and that the next step
// succeeds (tests/python/test_fault_injection.py, through _C._testing).
//
// Thread-safety: the armed state is per thread (arming on one thread never affects another);
// when no thread is armed the hook costs one relaxed atomic load per operator call.
#pragma once

#include <cstdint>
#include <stdexcept>

namespace aar::ops::testing {

class FaultInjected : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Arms the calling thread: operator calls are counted from 1 and call number `k` throws
// FaultInjected (k == 0: count only, never throw). Re-arming resets the count.
void arm_fault(int64_t k);
// Disarms the calling thread; returns the operator calls counted since arm_fault.
int64_t disarm_fault();
// Operator calls counted on the calling thread since arm_fault (0 when not armed).
int64_t fault_calls();

namespace detail {
// Called by every operator wrapper before its dispatcher call (ops/op_handle.h).
void fault_point_slow();
bool any_fault_armed();
}  // namespace detail

// The hook itself, for a computation that is not an operator wrapper but must be reachable by a
// test's fault (the DSA-CP o_proj matmul under the full-weight switch, sfa/impl.h).
inline void fault_point() {
  if (__builtin_expect(detail::any_fault_armed(), 0)) detail::fault_point_slow();
}

}  // namespace aar::ops::testing
