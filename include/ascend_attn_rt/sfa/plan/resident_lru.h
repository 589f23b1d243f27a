// The resident-slot LRU of the SFA KV-offload decode path (spec sparse.md 5,
// "Resident decode path" step 3): per layer, each decode row (one query token)
// owns `capacity` device slots that hold host KV rows; a step maps the row's
// top-k token positions to slots, reusing resident tokens (hits) and assigning
// the misses to the least recently used evictable slots. The caller copies the
// misses host -> device and attends over the slots. Torch-free; allocates only
// at construction.
//
// One step, per row (spec 5 step 3 (a)-(g)):
//  (a) a row whose request id differs from the one it last served (or that has
//      served none since construction / reset()) is reset: every slot empty.
//  (b) resident tokens >= stable_prefix[row] are dropped (their host rows may
//      have been rewritten by speculative tokens); their slots become empty.
//  (c) hits: valid top-k tokens already resident; current_slots[pos] = slot.
//  (d) evictable slots, in the order they are used: the empty slots first, then
//      the resident slots that are not hits, least recently used first.
//  (e) the misses, in top-k order, take the evictable slots in that order.
//  (f) the row's new recency order, least recent first: the evictable slots
//      left unassigned (empty ones, then the rest in their old order), then the
//      newly assigned slots, then the hits.
//  (g) current_slots[pos] = -1 where topk[pos] < 0.
//
// Where spec 5 is silent (upstream = vllm-ascend's lru_resident_compact, the
// C++ host routine behind onload_topk_kv in vllm_ascend/attention/
// sfa_kv_offload.py, read for its behaviour):
//  - Empty slots are used before any resident token is evicted (d). Upstream
//    resets a row to the order 0, 1, ..., capacity-1 (so empties come first
//    then too) but leaves a slot emptied by (b) at its place in the LRU order,
//    so it may evict a valid token while an empty slot is still free. Here the
//    empty slots are used first, in the order they became empty: after a reset
//    slot 0, 1, ...; slots emptied by (b) in the same step are queued in
//    ascending slot order after the ones already empty.
//  - Order inside the blocks of (f): upstream appends the newly assigned slots
//    in assignment order and the hits in their previous relative order (which
//    needs a walk over all `capacity` slots every step). Here both blocks are
//    in reverse top-k order: the lightning indexer returns a row's top-k
//    sorted by descending score (spec 1.2), so a later position (a lower
//    score) counts as less recently used, and among the tokens that drop out
//    of a later top-k the lowest-scored are evicted first. This also lets a
//    step cost O(K) per row instead of O(capacity).
//  - A token repeated in one row's top-k: every occurrence gets the slot of
//    the first one, it is copied at most once, and the first occurrence alone
//    decides its place in the order (stats.duplicates counts the repeats).
//    Upstream gives only the first occurrence the resident hit and treats
//    every later one as a further miss, so a token can occupy several slots
//    and be copied again.
//  - K > capacity is rejected (InvalidArgument). Upstream (whose config check
//    requires topk_buffer_size >= index_topk) would leave the misses that find
//    no slot at -1, silently dropping selected tokens from attention.
//  - Rows: a step covers rows 0 .. req_ids.size()-1 (<= max_rows). State is
//    kept per row index, as upstream: rows past the step's count keep theirs
//    untouched, and a row that comes back with the request id it last served
//    resumes with its resident tokens. A request that moves to another row
//    index starts empty there (its new row's id differs), like upstream.
//  - Any negative top-k entry is invalid, not only -1 (as upstream). Tokens
//    need no upper bound: the token -> slot lookup is a per-row hash table of
//    2 x capacity entries, not an array over the context.
//  - Request ids are 64-bit identities compared as given; the offload builder
//    refuses a batch with an id twice (upstream keys rows by adler32 of the
//    request id, so two live requests can share rows).
//
// Misses are written in row order, then in top-k order within a row. Tokens
// >= stable_prefix in the top-k (a speculative suffix) are valid: they are
// copied like any miss and dropped again by (b) at the next step whose stable
// prefix does not cover them.
//
// Cost: O(K) per row and step (one pass over the top-k, a probe per entry,
// hits moved to the recency tail through a lazily compacted queue), plus, only
// in a step whose stable prefix is below the largest resident token of a row
// (speculative decoding), a scan over that row's `capacity` slots for (b).
// Not thread-safe: one step at a time per ResidentLru (one per layer).
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

// Thread safety: one thread at a time per object; objects share nothing.
class ResidentLru {
 public:
  // max_rows decode rows of `capacity` slots each (capacity >= K of every step).
  ResidentLru(int32_t max_rows, int32_t capacity);

  int32_t max_rows() const;
  int32_t capacity() const;

  // One step for rows = req_ids.size() rows (<= max_rows), steps (a)-(g) of
  // spec 5 per row. Validates everything before changing any state (sizes,
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
  template <class Idx>
  ResidentStepStats run(const ResidentStepInputs& in, const ResidentStepOutputs& out, Idx* index);

  int32_t max_rows_ = 0, capacity_ = 0;
  int32_t table_size_ = 0;  // hash slots per row (power of two >= 2 x capacity)
  int32_t queue_size_ = 0;  // recency queue entries per row
  std::vector<RowHead> heads_;
  std::vector<int32_t> slot_to_token_;  // max_rows x capacity
  // Per-row index arrays (slot ids, queue positions): 16-bit when capacity
  // allows it (half the memory traffic), else 32-bit; one vector is empty.
  std::vector<uint16_t> index16_;
  std::vector<uint32_t> index32_;
  // Scratch of one row's step (no allocation per step).
  std::vector<uint32_t> hit_stamp_;  // capacity: == stamp_ when the slot is a hit of the current row
  uint32_t stamp_ = 0;
  std::vector<int32_t> miss_pos_, miss_token_, hit_slots_;  // capacity each
  std::vector<uint8_t> maybe_dup_;                           // capacity
};

}  // namespace aar::plan
