// Internal, torch-free: run-time CPU feature checks for the few loops that
// have an AVX2 clone (the project builds for baseline x86-64). Shared by the
// plan layer and the runtime.
#pragma once

namespace aar::detail {

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define AAR_HAVE_X86_DISPATCH 1
// Whether this CPU runs AVX2 code; computed once.
inline bool cpu_has_avx2() {
  static const bool has = [] {
    __builtin_cpu_init();  // callers may run during static initialisation
    return __builtin_cpu_supports("avx2") != 0;
  }();
  return has;
}
#else
#define AAR_HAVE_X86_DISPATCH 0
inline bool cpu_has_avx2() { return false; }
#endif

}  // namespace aar::detail
