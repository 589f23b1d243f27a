// Timing helper shared by the C++ host-time benchmarks.
#pragma once

#include <algorithm>
#include <chrono>
#include <functional>
#include <vector>

namespace aar_bench {

// Median over `repeats` of the mean time per call, in microseconds, after a warm-up.
inline double time_us(const std::function<void()>& fn, int iters, int repeats = 7) {
  using Clock = std::chrono::steady_clock;
  for (int i = 0; i < std::max(5, iters / 10); ++i) fn();
  std::vector<double> samples;
  for (int r = 0; r < repeats; ++r) {
    const auto t0 = Clock::now();
    for (int i = 0; i < iters; ++i) fn();
    samples.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / iters);
  }
  std::sort(samples.begin(), samples.end());
  return samples[samples.size() / 2];
}

}  // namespace aar_bench
