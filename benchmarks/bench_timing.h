// Helpers shared by the C++ host-time benchmarks: timing and synthetic batches.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <vector>

#include "ascend_attn_rt/plan/span.h"

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

// A step's host inputs: `decodes` one-token requests of decode_seq tokens, then
// `prefills` requests of prefill_new new tokens on prefill_ctx cached ones; a
// block table of `stride` columns with ids i % num_blocks.
struct Batch {
  std::vector<int32_t> qsl, seq, table;
  int stride = 0;
};

inline Batch make_batch(int decodes, int decode_seq, int prefills, int prefill_new, int prefill_ctx, int stride,
                        int num_blocks) {
  Batch b;
  b.stride = stride;
  b.qsl.push_back(0);
  for (int i = 0; i < decodes; ++i) {
    b.qsl.push_back(b.qsl.back() + 1);
    b.seq.push_back(decode_seq);
  }
  for (int i = 0; i < prefills; ++i) {
    b.qsl.push_back(b.qsl.back() + prefill_new);
    b.seq.push_back(prefill_ctx + prefill_new);
  }
  b.table.resize(static_cast<size_t>(decodes + prefills) * stride);
  for (size_t i = 0; i < b.table.size(); ++i) b.table[i] = static_cast<int32_t>(i % static_cast<size_t>(num_blocks));
  return b;
}

// The batch as a builder's BuildInputs (gqa:: or mla::, same field names).
template <class Inputs>
Inputs inputs_of(const Batch& b) {
  Inputs in;
  in.query_start_loc = aar::plan::CSpan<int32_t>(b.qsl.data(), b.qsl.size());
  in.seq_lens = aar::plan::CSpan<int32_t>(b.seq.data(), b.seq.size());
  in.block_table = aar::plan::CSpan<int32_t>(b.table.data(), b.table.size());
  in.block_table_stride = b.stride;
  return in;
}

}  // namespace aar_bench
