// Shared pieces of the plan-layer fuzz targets (libFuzzer, `make fuzz`).
//
// Every target decodes the fuzzer's bytes into a plan function's inputs, calls it once and
// checks its contract:
//  - accepted input: the outputs against a naive model written in the target (or, where a
//    model would be the implementation again, the invariants the header promises);
//  - rejected input: aar::InvalidArgument with a non-empty message, and every caller buffer
//    bit-identical to before the call (the plan layer validates before it writes);
//  - anything else (another exception type, a sanitizer report, a failed check) is a crash.
// Inputs are biased towards valid batches (monotonic query_start_loc, seq_len >= query_len,
// in-range block ids) with a few bytes choosing a corruption, so the checks on accepted
// input are reached as often as the rejections.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <exception>
#include <vector>

#include "ascend_attn_rt/errors.h"

namespace aar::fuzz {

// Reads the fuzzer's bytes; past the end every read returns 0 (a short input is a small batch).
class Bytes {
 public:
  Bytes(const uint8_t* data, size_t size) : p_(data), n_(size) {}
  uint8_t u8() { return i_ < n_ ? p_[i_++] : 0; }
  uint16_t u16() { return static_cast<uint16_t>(u8() | (u8() << 8)); }
  uint32_t u32() { return static_cast<uint32_t>(u16()) | (static_cast<uint32_t>(u16()) << 16); }
  bool flag() { return u8() & 1; }
  // Uniform-ish in [lo, hi] (inclusive), hi >= lo.
  int32_t range(int32_t lo, int32_t hi) {
    const uint64_t span = static_cast<uint64_t>(static_cast<int64_t>(hi) - lo) + 1;
    return static_cast<int32_t>(lo + static_cast<int64_t>(u32() % span));
  }
  // Mostly `v`, sometimes an adversarial value (negative, zero, huge): one corruption knob.
  int32_t maybe_bad(int32_t v) {
    switch (u8() % 16) {
      case 0: return -1;
      case 1: return 0;
      case 2: return v == INT32_MAX ? v : v + 1;  // saturating: v may be a corrupted value already
      case 3: return v == INT32_MIN ? v : v - 1;
      case 4: return INT32_MAX;
      case 5: return INT32_MIN;
      default: return v;
    }
  }
  size_t remaining() const { return i_ < n_ ? n_ - i_ : 0; }

 private:
  const uint8_t* p_;
  size_t n_;
  size_t i_ = 0;
};

struct Batch;
inline const Batch*& current_batch() {
  static const Batch* b = nullptr;
  return b;
}
void dump(const Batch& b);

[[noreturn]] inline void fail(const char* file, int line, const char* what) {
  std::fprintf(stderr, "fuzz contract violated at %s:%d: %s\n", file, line, what);
  if (current_batch()) dump(*current_batch());
  std::abort();
}
#define FUZZ_CHECK(cond)                                      \
  do {                                                        \
    if (!(cond)) ::aar::fuzz::fail(__FILE__, __LINE__, #cond); \
  } while (0)

// A caller buffer filled with a canary pattern (so "unchanged" and "written" are both visible).
template <typename T>
std::vector<T> canary(size_t n, T value) {
  return std::vector<T>(n, value);
}

// Snapshot of caller buffers, compared after a rejected call.
class Snapshot {
 public:
  template <typename T>
  void add(const std::vector<T>& v) {
    parts_.push_back({reinterpret_cast<const uint8_t*>(v.data()), v.size() * sizeof(T), {}});
    auto& p = parts_.back();
    p.copy.assign(p.ptr, p.ptr + p.bytes);
  }
  bool unchanged() const {
    for (const auto& p : parts_)
      if (p.bytes && std::memcmp(p.ptr, p.copy.data(), p.bytes) != 0) return false;
    return true;
  }

 private:
  struct Part {
    const uint8_t* ptr;
    size_t bytes;
    std::vector<uint8_t> copy;
  };
  std::vector<Part> parts_;
};

// Runs `call`; returns true when it was accepted. A rejection must be InvalidArgument with a
// message, and leave `snap`'s buffers untouched; any other exception aborts.
template <typename F>
bool accepted(F&& call, const Snapshot& snap) {
  try {
    call();
    return true;
  } catch (const aar::InvalidArgument& e) {
    FUZZ_CHECK(e.what() != nullptr && e.what()[0] != '\0');
    FUZZ_CHECK(snap.unchanged());
    return false;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "unexpected exception: %s\n", e.what());
    std::abort();
  }
}

// A batch of B requests: query lengths, context lengths and a block table, valid unless the
// bytes chose a corruption. block_size and the table geometry are chosen too.
struct Batch {
  std::vector<int32_t> qsl, seq_lens, table;
  int32_t stride = 0, block_size = 1, num_blocks = 0;
  int32_t B() const { return static_cast<int32_t>(seq_lens.size()); }
};

inline Batch make_batch(Bytes& in, int32_t max_reqs = 8, int32_t max_q = 40, int32_t max_ctx = 300) {
  Batch b;
  const int32_t B = in.range(0, max_reqs);
  const int32_t bs_pick[] = {1, 2, 4, 16, 64, 128};
  b.block_size = bs_pick[in.u8() % 6];
  b.qsl.push_back(0);
  int32_t max_seq = 0;
  for (int32_t r = 0; r < B; ++r) {
    const bool decode = in.flag();
    const int32_t q = decode ? in.range(0, 2) : in.range(0, max_q);
    const int32_t ctx = in.flag() ? 0 : in.range(0, max_ctx);
    b.qsl.push_back(b.qsl.back() + q);
    b.seq_lens.push_back(ctx + q);
    max_seq = std::max(max_seq, ctx + q);
  }
  b.stride = (max_seq + b.block_size - 1) / b.block_size + in.range(0, 2);
  b.num_blocks = std::max(1, b.stride * B + in.range(0, 3));
  b.table.resize(static_cast<size_t>(B) * b.stride);
  for (auto& id : b.table) id = in.range(0, b.num_blocks - 1);
  // One optional corruption.
  switch (in.u8() % 10) {
    case 0:
      if (B) b.seq_lens[in.range(0, B - 1)] = in.maybe_bad(b.seq_lens[0]);
      break;
    case 1:
      if (B) b.qsl[in.range(1, B)] = in.maybe_bad(b.qsl[1]);
      break;
    case 2:
      if (!b.table.empty()) b.table[in.range(0, static_cast<int32_t>(b.table.size()) - 1)] = in.maybe_bad(0);
      break;
    case 3:
      b.block_size = in.maybe_bad(b.block_size);
      break;
    case 4:
      b.num_blocks = in.maybe_bad(b.num_blocks);
      break;
    default:
      break;
  }
  return b;
}

inline void dump(const Batch& b) {
  auto row = [](const char* name, const std::vector<int32_t>& v) {
    std::fprintf(stderr, "  %s = [", name);
    for (size_t i = 0; i < v.size(); ++i) std::fprintf(stderr, "%s%d", i ? ", " : "", v[i]);
    std::fprintf(stderr, "]\n");
  };
  std::fprintf(stderr, "batch: block_size=%d stride=%d num_blocks=%d\n", b.block_size, b.stride, b.num_blocks);
  row("query_start_loc", b.qsl);
  row("seq_lens", b.seq_lens);
  row("block_table", b.table);
}

// num_input_tokens for a step: 0 (= query_start_loc[B]) or qsl[B] plus a small, possibly negative,
// padding (computed in int64: a corrupted qsl[B] may be near INT32_MAX).
inline int32_t input_tokens(Bytes& in, int32_t real) {
  if (in.flag()) return 0;
  const int64_t t = static_cast<int64_t>(real) + in.range(-1, 6);
  return static_cast<int32_t>(std::max<int64_t>(INT32_MIN, std::min<int64_t>(INT32_MAX, t)));
}
// A caller buffer's length for `n` entries: a corrupted batch asks for absurd sizes, which the
// planners must reject by their own checks, not by us allocating gigabytes.
inline size_t room(int64_t n) { return static_cast<size_t>(std::max<int64_t>(0, std::min<int64_t>(n, 1 << 14))); }

// The fields every step planner's inputs share (plan::StepInputs, MlaStepInputs, SfaStepInputs):
// the batch, num_input_tokens and the decode threshold.
template <class StepInputs>
void fill_step_inputs(StepInputs& si, const Batch& b, Bytes& in) {
  si.query_start_loc = b.qsl;
  si.seq_lens = b.seq_lens;
  si.block_table = b.table;
  si.block_table_stride = b.stride;
  si.block_size = b.block_size;
  si.num_blocks = b.num_blocks;
  si.num_input_tokens = input_tokens(in, b.qsl.back());
  si.decode_threshold = in.range(1, 3);
}

// Independent naive slot of token `t` of request `r` (docs/design/gqa.md §2.4).
inline int64_t naive_slot(const Batch& b, int32_t r, int32_t t) {
  const int64_t q = b.qsl[r + 1] - b.qsl[r];
  const int64_t pos = b.seq_lens[r] - q + (t - b.qsl[r]);
  return static_cast<int64_t>(b.table[static_cast<size_t>(r) * b.stride + pos / b.block_size]) * b.block_size +
         pos % b.block_size;
}

// Keys of DCP rank `rank` among positions [0, len): runs of `interleave` dealt round robin over
// `world` ranks (counted, not the formula of plan/dcp_layout.h).
inline int64_t naive_local_len(int64_t len, int32_t world, int32_t interleave, int32_t rank) {
  int64_t n = 0;
  for (int64_t x = 0; x < len; ++x) n += (x / interleave) % world == rank;
  return n;
}

// True when the batch is one the step planners must accept (the corruption, if any, was benign).
inline bool batch_valid(const Batch& b) {
  if (b.block_size <= 0 || b.num_blocks < 0 || b.qsl.empty() || b.qsl[0] != 0) return false;
  if (static_cast<int64_t>(b.num_blocks) * b.block_size > INT32_MAX) return false;
  for (int32_t r = 0; r < b.B(); ++r) {
    const int64_t q = static_cast<int64_t>(b.qsl[r + 1]) - b.qsl[r];
    if (q < 0 || b.seq_lens[r] < q) return false;
    if (q == 0) continue;
    const int64_t last = (static_cast<int64_t>(b.seq_lens[r]) - 1) / b.block_size;
    if (last >= b.stride) return false;
    const int64_t first = (b.seq_lens[r] - q) / b.block_size;
    for (int64_t c = first; c <= last; ++c) {
      const int32_t id = b.table[static_cast<size_t>(r) * b.stride + c];
      if (id < 0 || id >= b.num_blocks) return false;
    }
  }
  return true;
}

}  // namespace aar::fuzz
