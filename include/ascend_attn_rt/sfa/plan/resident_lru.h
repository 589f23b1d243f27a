// The resident-slot LRU of the SFA KV-offload decode path: per layer and decode row,
// maps the row's top-k token positions to `capacity` device slots, reusing resident
// tokens and assigning misses to the least recently used evictable slots; the caller
// copies the misses host -> device. Torch-free; allocates only at construction
// (and in set_threads; helper threads are started once per process and kept);
// validates before changing any state. Large steps run their rows on a shared
// pool of helper threads (the results do not depend on the thread count). Not
// thread-safe (one per layer).
// Rules (a)-(g), where they differ from upstream, the cost: docs/design/sfa.md §6.3.
#pragma once

#include <cstdint>
#include <vector>

#include "ascend_attn_rt/plan/span.h"

namespace aar::plan {

// A top-k entry not resident before the step: copy token `token` of row
// `row`'s request into slot `slot` of that row.
struct ResidentMiss {
  int32_t row;
  int32_t token;
  int32_t slot;
};

struct ResidentStepInputs {
  CSpan<int32_t> topk;           // rows x K, row-major; < 0 = invalid (already masked: build_valid_topk_mask)
  int32_t K = 0;                 // top-k width, 1 .. capacity
  CSpan<uint64_t> req_ids;       // rows: the id of the request each row belongs to (a change resets the row)
  CSpan<int32_t> stable_prefix;  // rows, >= 0: resident tokens >= this are invalidated first (speculative suffix)
};

struct ResidentStepOutputs {
  Span<int32_t> current_slots;   // >= rows x K: the slot of each top-k entry, -1 where the entry is invalid
  Span<ResidentMiss> misses;     // room for rows x K entries; the first `returned count` are written
};

struct ResidentStepStats {
  int64_t hits = 0;        // distinct valid top-k tokens found resident
  int64_t misses = 0;      // distinct valid top-k tokens copied: entries written to outputs.misses
  int64_t resets = 0;      // rows reset because their request changed (every row's first step counts)
  int64_t invalidated = 0;  // resident tokens dropped for being >= stable_prefix
  int64_t duplicates = 0;  // valid top-k entries repeating a token earlier in the same row
};

// The copies' rows (docs/design/sfa.md §6.3): copy i (row t, token p) reads pool row
// block_table[r * stride + p / block_size] * block_size + p % block_size, r = token_to_req[t],
// into src[i], and writes resident row t * capacity + slot into dst[i]. The copies come from a
// ResidentLru step over the same rows (so every row < token_to_req.size()) and tokens below their
// request's length (so every block index < stride): not checked again. src and dst hold
// >= copies.size() entries; block_size > 0.
void resident_copy_rows(CSpan<ResidentMiss> copies, CSpan<int32_t> token_to_req, CSpan<int32_t> block_table,
                        int64_t stride, int32_t block_size, int64_t capacity, Span<int64_t> src, Span<int64_t> dst);

// Thread safety: one thread at a time per object; objects share nothing.
class ResidentLru {
 public:
  // max_rows decode rows of `capacity` slots each (capacity >= K of every step).
  // threads: the most threads a step uses (the caller's included); 0 = the
  // machine's hardware threads (at most kMaxThreads). 1 by default (the
  // caller's thread only; measurements in docs/design/sfa.md §6.3).
  ResidentLru(int32_t max_rows, int32_t capacity, int32_t threads = 1);

  static constexpr int32_t kMaxThreads = 64;
  // A step runs on more than one thread only when every thread gets at least
  // this many rows (fewer rows cost less than waking a helper).
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
  // The resident tokens of rows [0, min(rows, max_rows)) as copies (row, token,
  // slot), row by row and slot by slot, into `out` (resized). What a buffer
  // that must come to hold this state copies (docs/design/sfa.md §6.8).
  void list_resident(int32_t rows, std::vector<ResidentMiss>& out) const;
  // Changes with every change of state (each accepted step, reset, reset_rows):
  // a copy of the state's decisions is complete when it saw every version.
  uint64_t version() const { return version_; }

 private:
  // Per-row scalars; the per-row arrays live in the vectors below, one block
  // of each per row (layout in resident_lru.cpp).
  struct RowHead {
    uint64_t req = 0;        // request id last served (when has_req)
    bool has_req = false;    // false: none (reset pending)
    bool clean = false;      // the last step had K distinct valid hits and no miss; its top-k is in prev_topk_
    int32_t clean_k = 0;     // that step's K
    int32_t max_token = -1;  // upper bound of the row's resident tokens (-1: none)
    uint32_t head = 0;       // recency queue: positions [head, tail), least recent first
    uint32_t tail = 0;
    int32_t free_head = 0;   // ring of empty slots: free_count entries from free_head
    int32_t free_count = 0;
  };
  // Scratch of one thread's rows (no allocation per step).
  struct Scratch {
    std::vector<int32_t> miss_pos, miss_token, found;  // capacity each
    std::vector<uint32_t> victim_pos;                  // capacity
    std::vector<uint32_t> squeeze;                     // queue_size_
    std::vector<uint8_t> maybe_dup;                    // capacity
  };
  // Rows [begin, end); their misses go to misses[0 ..), counted in the stats.
  template <class Idx>
  ResidentStepStats run_rows(const ResidentStepInputs& in, const ResidentStepOutputs& out, Idx* index,
                             int32_t begin, int32_t end, ResidentMiss* misses, Scratch& scratch);
  template <class Idx>
  ResidentStepStats run(const ResidentStepInputs& in, const ResidentStepOutputs& out, Idx* index);

  int32_t max_rows_ = 0, capacity_ = 0, threads_ = 1;
  uint64_t version_ = 0;
  int32_t table_size_ = 0;  // hash slots per row (power of two >= 2 x capacity)
  int32_t queue_size_ = 0;  // recency queue entries per row (a ring; power of two >= 3 x capacity)
  std::vector<RowHead> heads_;
  std::vector<int32_t> tokens_;      // max_rows x (capacity + 1): slot `capacity` is a sentinel
  std::vector<int32_t> prev_topk_;   // max_rows x capacity: a clean row's last top-k
  // Per-row index arrays (stamps, free ring, queue, hash table): 16-bit when
  // capacity allows it (less memory traffic), else 32-bit; one vector is empty.
  std::vector<uint16_t> index16_;
  std::vector<uint32_t> index32_;
  std::vector<Scratch> scratch_;  // one per thread
};

}  // namespace aar::plan
