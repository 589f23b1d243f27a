// The resident-slot LRU step as it was before issue 30's rework (commit 84f1d38,
// cpp/sfa/plan/resident_lru.cpp then: per-row hash table, recency queue with a
// push per hit, threads started per step), kept verbatim apart from the names
// so bench_resident_lru_cpp can time it beside the current one in the same run.
// Benchmark only: nothing else includes it.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <limits>
#include <system_error>
#include <thread>
#include <vector>

#include "ascend_attn_rt/errors.h"
#include "ascend_attn_rt/sfa/plan/resident_lru.h"

namespace aar_bench::legacy {

using aar::plan::CSpan;
using aar::plan::ResidentMiss;
using aar::plan::ResidentStepInputs;
using aar::plan::ResidentStepOutputs;
using aar::plan::ResidentStepStats;
using aar::plan::Span;

class LegacyResidentLru {
 public:
  // max_rows decode rows of `capacity` slots each (capacity >= K of every step).
  // threads: the most threads a step uses (the caller's included); 0 = the
  // machine's hardware threads (at most kMaxThreads). 1 by default: no gain
  // was measured on the 2-core test machine, where starting a thread per step
  // costs about as much as it saves (docs/design/sfa.md §6.3).
  LegacyResidentLru(int32_t max_rows, int32_t capacity, int32_t threads = 1);

  static constexpr int32_t kMaxThreads = 64;
  // A step runs on more than one thread only when every thread gets at least
  // this many rows (fewer rows cost less than starting a thread).
  static constexpr int32_t kMinRowsPerThread = 8;

  int32_t max_rows() const;
  int32_t capacity() const;
  int32_t threads() const;
  // Changes the thread limit (as the constructor's `threads`, in [0, kMaxThreads]).
  void set_threads(int32_t threads);

  // One step for rows = req_ids.size() rows (<= max_rows), steps (a)-(g) of
  // docs/design/sfa.md §6 per row. Validates everything before changing any state (sizes,
  // 1 <= K <= capacity, stable prefixes >= 0, room in the outputs); a rejected
  // call changes nothing, neither the state nor the outputs. Returns the stats;
  // outputs.misses[0 .. stats.misses) are the copies to make.
  ResidentStepStats step(const ResidentStepInputs& in, const ResidentStepOutputs& out);

  // Forgets every row (all slots empty, every row's request unknown).
  void reset();
  // Forgets rows [begin, end) (clamped to [0, max_rows)): each is rebuilt at
  // its next step. The SFA offload layer calls it for the rows a step did not
  // cover, since their host rows may be rewritten before they come back.
  void reset_rows(int32_t begin, int32_t end);

  // The token held by `slot` of `row` (-1: empty). For tests and tracing.
  int32_t token_at(int32_t row, int32_t slot) const;

 private:
  // Per-row scalars; the per-row arrays live in the vectors below, one block
  // of each per row (layout in resident_lru.cpp).
  struct RowHead {
    uint64_t req = 0;        // request id last served (when has_req)
    bool has_req = false;    // false: none (reset pending)
    int32_t max_token = -1;  // upper bound of the row's resident tokens (-1: none)
    int32_t head = 0;        // recency queue: live range [head, tail)
    int32_t tail = 0;
    int32_t free_head = 0;   // ring of empty slots: free_count entries from free_head
    int32_t free_count = 0;
  };
  // Scratch of one thread's rows (no allocation per step).
  struct Scratch {
    std::vector<int32_t> miss_pos, miss_token, hit_slots;  // capacity each
    std::vector<uint8_t> maybe_dup;                         // capacity
  };
  // Rows [begin, end); their misses go to misses[0 ..), counted in the stats.
  template <class Idx>
  ResidentStepStats run_rows(const ResidentStepInputs& in, const ResidentStepOutputs& out, Idx* index,
                             int32_t begin, int32_t end, ResidentMiss* misses, Scratch& scratch);
  template <class Idx>
  ResidentStepStats run(const ResidentStepInputs& in, const ResidentStepOutputs& out, Idx* index);

  int32_t max_rows_ = 0, capacity_ = 0, threads_ = 1;
  int32_t table_size_ = 0;  // hash slots per row (power of two >= 2 x capacity)
  int32_t queue_size_ = 0;  // recency queue entries per row
  std::vector<RowHead> heads_;
  std::vector<int32_t> slot_to_token_;  // max_rows x capacity
  // Per-row index arrays (slot ids, queue positions): 16-bit when capacity
  // allows it (half the memory traffic), else 32-bit; one vector is empty.
  std::vector<uint16_t> index16_;
  std::vector<uint32_t> index32_;
  std::vector<Scratch> scratch_;  // one per thread
};


namespace legacy_detail {

constexpr int32_t kMaxCapacity = 1 << 24;
// Capacities up to this use 16-bit index arrays: queue positions < 4 * capacity < 0xFFFE
// (kHit; 0xFFFF is kNone).
constexpr int32_t kMaxNarrowCapacity = 16383;
constexpr uint32_t kHashMul = 0x9E3779B1u;   // Fibonacci hashing: consecutive positions spread out
constexpr uint32_t kBloomMul = 0x85EBCA6Bu;  // an independent 12-bit hash for the duplicate filter
constexpr int kBloomBits = 12;

inline int32_t table_size_for(int32_t capacity) {
  int32_t t = 2;
  while (t < 2 * capacity) t *= 2;
  return t;
}

inline int log2_of(int32_t pow2) {
  int b = 0;
  while ((int32_t{1} << b) < pow2) ++b;
  return b;
}

inline int32_t threads_for(int32_t threads) {
  AAR_CHECK_ARG(threads >= 0 && threads <= LegacyResidentLru::kMaxThreads, "ResidentLru: threads must be in [0, ",
                LegacyResidentLru::kMaxThreads, "] (0: the hardware threads), got ", threads);
  if (threads > 0) return threads;
  const unsigned hw = std::thread::hardware_concurrency();
  return std::max(1, std::min(static_cast<int32_t>(hw), LegacyResidentLru::kMaxThreads));
}

}  // namespace legacy_detail
using namespace legacy_detail;

inline LegacyResidentLru::LegacyResidentLru(int32_t max_rows, int32_t capacity, int32_t threads) {
  AAR_CHECK_ARG(max_rows >= 1, "ResidentLru: max_rows must be >= 1, got ", max_rows);
  AAR_CHECK_ARG(capacity >= 1 && capacity <= kMaxCapacity, "ResidentLru: capacity must be in [1, ", kMaxCapacity,
                "], got ", capacity);
  max_rows_ = max_rows;
  capacity_ = capacity;
  table_size_ = table_size_for(capacity);
  queue_size_ = 4 * capacity;
  const std::size_t rows = static_cast<std::size_t>(max_rows);
  const std::size_t cap = static_cast<std::size_t>(capacity);
  const std::size_t stride = 2 * cap + static_cast<std::size_t>(queue_size_) + static_cast<std::size_t>(table_size_);
  heads_.assign(rows, RowHead{});
  slot_to_token_.assign(rows * cap, -1);
  if (capacity <= kMaxNarrowCapacity) {
    index16_.assign(rows * stride, 0);
  } else {
    index32_.assign(rows * stride, 0);
  }
  set_threads(threads);
}

inline int32_t LegacyResidentLru::max_rows() const { return max_rows_; }
inline int32_t LegacyResidentLru::capacity() const { return capacity_; }
inline int32_t LegacyResidentLru::threads() const { return threads_; }

inline void LegacyResidentLru::set_threads(int32_t threads) {
  const int32_t n = threads_for(threads);
  const std::size_t cap = static_cast<std::size_t>(capacity_);
  std::vector<Scratch> fresh(static_cast<std::size_t>(n));
  for (Scratch& s : fresh) {
    s.miss_pos.assign(cap, 0);
    s.miss_token.assign(cap, 0);
    s.hit_slots.assign(cap, 0);
    s.maybe_dup.assign(cap, 0);
  }
  scratch_ = std::move(fresh);
  threads_ = n;
}

inline void LegacyResidentLru::reset() {
  // Lazy: a row whose request is unknown is rebuilt at its next step.
  for (RowHead& h : heads_) h.has_req = false;
}

inline void LegacyResidentLru::reset_rows(int32_t begin, int32_t end) {
  begin = std::max(begin, 0);
  end = std::min(end, max_rows_);
  for (int32_t r = begin; r < end; ++r) heads_[static_cast<std::size_t>(r)].has_req = false;
}

inline int32_t LegacyResidentLru::token_at(int32_t row, int32_t slot) const {
  AAR_CHECK_ARG(row >= 0 && row < max_rows_, "token_at: row=", row, " is out of range [0, ", max_rows_, ")");
  AAR_CHECK_ARG(slot >= 0 && slot < capacity_, "token_at: slot=", slot, " is out of range [0, ", capacity_, ")");
  if (!heads_[static_cast<std::size_t>(row)].has_req) return -1;
  return slot_to_token_[static_cast<std::size_t>(row) * static_cast<std::size_t>(capacity_) +
                        static_cast<std::size_t>(slot)];
}

template <class Idx>
ResidentStepStats LegacyResidentLru::run_rows(const ResidentStepInputs& in, const ResidentStepOutputs& out, Idx* index,
                                        int32_t begin, int32_t end, ResidentMiss* misses, Scratch& scratch) {
  constexpr Idx kNone = std::numeric_limits<Idx>::max();
  constexpr Idx kHit = kNone - 1;  // above every queue position (< 4 x capacity)
  const std::size_t rows = static_cast<std::size_t>(end);
  const int32_t K = in.K;
  const int32_t cap = capacity_;
  const std::size_t ucap = static_cast<std::size_t>(cap);
  const std::size_t uk = static_cast<std::size_t>(K);
  const uint32_t mask = static_cast<uint32_t>(table_size_) - 1;
  const int shift = 32 - log2_of(table_size_);
  const std::size_t stride = 2 * ucap + static_cast<std::size_t>(queue_size_) + static_cast<std::size_t>(table_size_);
  const auto home = [shift](int32_t t) { return (static_cast<uint32_t>(t) * kHashMul) >> shift; };

  int32_t* miss_pos = scratch.miss_pos.data();
  int32_t* miss_token = scratch.miss_token.data();
  int32_t* hit_slots = scratch.hit_slots.data();
  uint8_t* maybe_dup = scratch.maybe_dup.data();
  uint64_t bloom[(1 << kBloomBits) / 64];
  std::memset(bloom, 0, sizeof(bloom));
  std::size_t n_out = 0;
  ResidentStepStats st;

  for (std::size_t r = static_cast<std::size_t>(begin); r < rows; ++r) {
    RowHead& rh = heads_[r];
    int32_t* s2t = slot_to_token_.data() + r * ucap;
    Idx* qpos = index + r * stride;
    Idx* free_ring = qpos + ucap;
    Idx* queue = free_ring + ucap;
    Idx* table = queue + queue_size_;
    const int32_t* tk = in.topk.data() + r * uk;
    int32_t* cur = out.current_slots.data() + r * uk;
    const int32_t row = static_cast<int32_t>(r);

    // Removes the table entry at position i, shifting later entries of the
    // probe run back into the hole (their keys are still in s2t).
    const auto erase_at = [&](uint32_t i) {
      uint32_t j = i;
      for (;;) {
        j = (j + 1) & mask;
        const Idx e = table[j];
        if (e == kNone) break;
        const uint32_t k = home(s2t[e]);
        if (((j - k) & mask) >= ((j - i) & mask)) {
          table[i] = e;
          i = j;
        }
      }
      table[i] = kNone;
    };
    // Removes slot s (holding token t) from the table: the entry is found by slot id, no key compares.
    const auto erase_slot = [&](int32_t t, Idx s) {
      uint32_t h = home(t);
      while (table[h] != s) h = (h + 1) & mask;
      erase_at(h);
    };

    if (r + 1 < rows) {  // pull the next row's table, tokens and queue positions towards L2
      const char* lines[3] = {reinterpret_cast<const char*>(table + stride),
                              reinterpret_cast<const char*>(s2t + ucap), reinterpret_cast<const char*>(qpos + stride)};
      const std::size_t bytes[3] = {sizeof(Idx) * static_cast<std::size_t>(table_size_), sizeof(int32_t) * ucap,
                                    sizeof(Idx) * ucap};
      for (int a = 0; a < 3; ++a) {
        for (std::size_t o = 0; o < bytes[a]; o += 64) __builtin_prefetch(lines[a] + o, 0, 2);
      }
    }

    // (a) a new request: every slot empty, used in the order 0, 1, ...
    const uint64_t req = in.req_ids[r];
    if (!rh.has_req || rh.req != req) {
      std::fill(s2t, s2t + ucap, -1);
      std::fill(qpos, qpos + ucap, kNone);
      for (int32_t s = 0; s < cap; ++s) free_ring[s] = static_cast<Idx>(s);
      std::fill(table, table + table_size_, kNone);
      rh = RowHead{req, true, -1, 0, 0, 0, cap};
      ++st.resets;
    }

    // (b) the speculative suffix: tokens >= stable_prefix are dropped. The
    // scan is skipped when no resident token can be that large.
    const int32_t sp = in.stable_prefix[r];
    if (rh.max_token >= sp) {
      int32_t new_max = -1;
      for (int32_t s = 0; s < cap; ++s) {
        const int32_t t = s2t[s];
        if (t >= sp) {  // sp >= 0, so an empty slot (-1) never matches
          erase_slot(t, static_cast<Idx>(s));
          s2t[s] = -1;
          qpos[s] = kNone;  // its queue entry turns stale
          int32_t at = rh.free_head + rh.free_count;
          if (at >= cap) at -= cap;
          free_ring[at] = static_cast<Idx>(s);
          ++rh.free_count;
          ++st.invalidated;
        } else {
          new_max = std::max(new_max, t);
        }
      }
      rh.max_token = new_max;
    }

    // (c), (g): one pass over the top-k. Hits get their slot; first-seen
    // misses are listed in top-k order, flagged when the filter has seen
    // their hash among this row's misses (a possible repeat, checked in (e)).
    int32_t nh = 0, nm = 0;
    for (int32_t pos = 0; pos < K; ++pos) {
      const int32_t t = tk[pos];
      if (t < 0) {
        cur[pos] = -1;
        continue;
      }
      uint32_t h = home(t);
      Idx e;
      while ((e = table[h]) != kNone && s2t[e] != t) h = (h + 1) & mask;
      if (e != kNone) {
        cur[pos] = static_cast<int32_t>(e);
        if (qpos[e] != kHit) {
          qpos[e] = kHit;
          hit_slots[nh++] = static_cast<int32_t>(e);
        } else {
          ++st.duplicates;
        }
      } else {
        const uint32_t b = (static_cast<uint32_t>(t) * kBloomMul) >> (32 - kBloomBits);
        const uint64_t bit = uint64_t{1} << (b & 63);
        maybe_dup[nm] = (bloom[b >> 6] & bit) != 0;
        bloom[b >> 6] |= bit;
        miss_pos[nm] = pos;
        miss_token[nm] = t;
        ++nm;
      }
    }
    st.hits += nh;

    // (d), (e): the misses take the empty slots, then the least recent
    // non-hit residents. K <= capacity guarantees enough of them.
    const std::size_t first_miss = n_out;
    int32_t max_token = rh.max_token;
    for (int32_t i = 0; i < nm; ++i) {
      const int32_t t = miss_token[i];
      const int32_t pos = miss_pos[i];
      if (maybe_dup[i]) {
        uint32_t h = home(t);
        Idx e;
        while ((e = table[h]) != kNone && s2t[e] != t) h = (h + 1) & mask;
        if (e != kNone) {  // copied earlier in this row
          cur[pos] = static_cast<int32_t>(e);
          ++st.duplicates;
          continue;
        }
      }
      Idx v;
      if (rh.free_count > 0) {
        v = free_ring[rh.free_head];
        if (++rh.free_head == cap) rh.free_head = 0;
        --rh.free_count;
      } else {
        for (;;) {
          const Idx s = queue[rh.head];
          const bool live = qpos[s] == static_cast<Idx>(rh.head);
          ++rh.head;
          // A hit's entry is stale (kHit) and dropped too: the hit is pushed again below.
          if (live) {
            v = s;
            break;
          }
        }
        qpos[v] = kNone;
        erase_slot(s2t[v], v);
      }
      s2t[v] = t;
      uint32_t h = home(t);
      while (table[h] != kNone) h = (h + 1) & mask;
      table[h] = v;
      cur[pos] = static_cast<int32_t>(v);
      misses[n_out++] = ResidentMiss{row, t, static_cast<int32_t>(v)};
      max_token = std::max(max_token, t);
    }
    rh.max_token = max_token;
    if (nm > 0) std::memset(bloom, 0, sizeof(bloom));

    // (f) the new recency tail: the assigned slots, then the hits, each in
    // reverse top-k order. Squeeze stale entries out first if the pushes
    // would not fit (live entries <= capacity, pushes <= K <= capacity).
    const int32_t pushes = static_cast<int32_t>(n_out - first_miss) + nh;
    if (rh.tail + pushes > queue_size_) {
      // Without branches (live and stale entries interleave unpredictably):
      // every entry is written at j, which only a live one advances; a
      // stale entry precedes its slot's live one, so writing its qpos back
      // unchanged loses nothing.
      int32_t j = 0;
      for (int32_t i = rh.head; i < rh.tail; ++i) {
        const Idx s = queue[i];
        const Idx q = qpos[s];
        const bool live = q == static_cast<Idx>(i);
        queue[j] = s;
        qpos[s] = live ? static_cast<Idx>(j) : q;
        j += static_cast<int32_t>(live);
      }
      rh.head = 0;
      rh.tail = j;
    }
    int32_t tail = rh.tail;
    for (std::size_t i = n_out; i > first_miss; --i) {
      const Idx s = static_cast<Idx>(misses[i - 1].slot);
      queue[tail] = s;
      qpos[s] = static_cast<Idx>(tail);
      ++tail;
    }
    for (int32_t i = nh; i > 0; --i) {
      const Idx s = static_cast<Idx>(hit_slots[i - 1]);
      queue[tail] = s;
      qpos[s] = static_cast<Idx>(tail);
      ++tail;
    }
    rh.tail = tail;
  }
  st.misses = static_cast<int64_t>(n_out);
  return st;
}

template <class Idx>
ResidentStepStats LegacyResidentLru::run(const ResidentStepInputs& in, const ResidentStepOutputs& out, Idx* index) {
  const int32_t rows = static_cast<int32_t>(in.req_ids.size());
  const int32_t threads = std::max(1, std::min(threads_, rows / kMinRowsPerThread));
  if (threads == 1) return run_rows(in, out, index, 0, rows, out.misses.data(), scratch_[0]);

  // Contiguous chunks of rows, a few per thread (the machine may be shared:
  // a thread that finishes early takes the next one).
  constexpr int32_t kChunksPerThread = 4;
  const int32_t chunks = std::min(rows, kChunksPerThread * threads);
  std::array<ResidentStepStats, kChunksPerThread * kMaxThreads> chunk_stats{};
  const std::size_t uk = static_cast<std::size_t>(in.K);
  const auto chunk_begin = [rows, chunks](int32_t c) {
    return static_cast<int32_t>(static_cast<int64_t>(rows) * c / chunks);
  };
  std::atomic<int32_t> next{0};
  const auto work = [&](Scratch& scratch) {
    for (int32_t c = next.fetch_add(1, std::memory_order_relaxed); c < chunks;
         c = next.fetch_add(1, std::memory_order_relaxed)) {
      const int32_t b = chunk_begin(c), e = chunk_begin(c + 1);
      chunk_stats[static_cast<std::size_t>(c)] =
          run_rows(in, out, index, b, e, out.misses.data() + static_cast<std::size_t>(b) * uk, scratch);
    }
  };
  std::array<std::thread, kMaxThreads> helpers;
  for (int32_t t = 1; t < threads; ++t) {
    try {
      helpers[static_cast<std::size_t>(t)] = std::thread(work, std::ref(scratch_[static_cast<std::size_t>(t)]));
    } catch (const std::system_error&) {
      break;  // no more threads: the ones started and this one take every chunk
    }
  }
  work(scratch_[0]);
  for (std::thread& h : helpers) {
    if (h.joinable()) h.join();
  }

  // Each chunk's misses to their place after the previous chunks'.
  ResidentStepStats st;
  std::size_t n_out = 0;
  ResidentMiss* misses = out.misses.data();
  for (int32_t c = 0; c < chunks; ++c) {
    const ResidentStepStats& cs = chunk_stats[static_cast<std::size_t>(c)];
    const std::size_t from = static_cast<std::size_t>(chunk_begin(c)) * uk;
    const std::size_t n = static_cast<std::size_t>(cs.misses);
    if (from != n_out && n > 0) std::memmove(misses + n_out, misses + from, n * sizeof(ResidentMiss));
    n_out += n;
    st.hits += cs.hits;
    st.misses += cs.misses;
    st.resets += cs.resets;
    st.invalidated += cs.invalidated;
    st.duplicates += cs.duplicates;
  }
  return st;
}

inline ResidentStepStats LegacyResidentLru::step(const ResidentStepInputs& in, const ResidentStepOutputs& out) {
  // ---------------------------------------------------------------- validate
  const std::size_t rows = in.req_ids.size();
  AAR_CHECK_ARG(rows <= static_cast<std::size_t>(max_rows_), "req_ids has ", rows, " rows, more than max_rows=",
                max_rows_);
  AAR_CHECK_ARG(in.K >= 1, "K (index_topk) must be >= 1, got ", in.K);
  AAR_CHECK_ARG(in.K <= capacity_, "K=", in.K, " exceeds the resident capacity ", capacity_,
                " (topk_buffer_size must be >= index_topk)");
  const std::size_t entries = rows * static_cast<std::size_t>(in.K);
  AAR_CHECK_ARG(in.topk.size() == entries, "topk has ", in.topk.size(), " entries, expected rows x K = ", rows, " x ",
                in.K, " = ", entries);
  AAR_CHECK_ARG(in.stable_prefix.size() == rows, "stable_prefix has ", in.stable_prefix.size(),
                " entries, expected one per row: ", rows);
  for (std::size_t r = 0; r < rows; ++r) {
    AAR_CHECK_ARG(in.stable_prefix[r] >= 0, "stable_prefix[", r, "]=", in.stable_prefix[r],
                  " is negative (a stable prefix is a KV length)");
  }
  AAR_CHECK_ARG(out.current_slots.size() >= entries, "current_slots has room for ", out.current_slots.size(),
                " entries, needs rows x K = ", entries);
  AAR_CHECK_ARG(out.misses.size() >= entries, "misses has room for ", out.misses.size(),
                " entries, needs rows x K = ", entries);

  // ---------------------------------------------------------------- write
  if (!index16_.empty()) return run(in, out, index16_.data());
  return run(in, out, index32_.data());
}

}  // namespace aar_bench::legacy
