#pragma once
// Private to cpp/comm: the clock behind cp::Comm::collective_ns (docs/design/cp.md §8.1). A step issues
// up to five synchronous collectives per layer and each is timed at both ends, so the clock read is on
// the host path of every layer: steady_clock costs about 20 ns per read on the VMs we measure on, the
// x86 time-stamp counter about 9 ns. Ticks are summed as they are and converted once, when the total is
// read, with a rate measured against steady_clock over the process's life so far.
#include <chrono>
#include <cstdint>

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <x86intrin.h>
#define AAR_COMM_TSC 1
#else
#define AAR_COMM_TSC 0
#endif

namespace aar::cp::detail {

inline int64_t steady_ns() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

#if AAR_COMM_TSC
// The counter ticks at a constant rate across frequency changes and sleep states only when the CPU says
// so (CPUID 0x80000007, EDX bit 8, "invariant TSC"); otherwise steady_clock's nanoseconds are the ticks.
inline bool tsc_invariant() noexcept {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid_max(0x80000000u, nullptr) < 0x80000007u) return false;
  __cpuid(0x80000007u, a, b, c, d);
  return (d >> 8) & 1u;
}
inline const bool kUseTsc = tsc_invariant();
#endif

inline int64_t ticks() noexcept {
#if AAR_COMM_TSC
  if (kUseTsc) return static_cast<int64_t>(__rdtsc());
#endif
  return steady_ns();
}

// Nanoseconds per tick: the ticks and steady_clock's nanoseconds elapsed since the first call (made when
// comm.cpp is loaded), 1 when the ticks are nanoseconds or too little time has passed to tell.
inline double ns_per_tick() noexcept {
#if AAR_COMM_TSC
  if (!kUseTsc) return 1.0;
  static const int64_t t0 = ticks(), n0 = steady_ns();
  const int64_t dt = ticks() - t0, dn = steady_ns() - n0;
  return dt > 0 && dn > 0 ? static_cast<double>(dn) / static_cast<double>(dt) : 1.0;
#else
  return 1.0;
#endif
}

}  // namespace aar::cp::detail
