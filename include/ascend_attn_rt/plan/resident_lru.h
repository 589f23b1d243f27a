// The resident-slot LRU of the SFA KV-offload decode path (spec sparse.md 5,
// "Resident decode path" step 3): per layer, each decode row (one query token)
// owns `capacity` device slots that hold host KV rows; a step maps the row's
// top-k token positions to slots, reusing resident tokens (hits) and assigning
// the misses to the least recently used evictable slots. The caller copies the
// misses host -> device and attends over the slots. Torch-free; allocates only
// at construction.
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
  CSpan<int32_t> topk;           // rows x K, row-major; -1 = invalid (already masked: build_valid_topk_mask)
  int32_t K = 0;                 // top-k width
  CSpan<uint32_t> req_ids;       // rows: the id of the request each row belongs to (a change resets the row)
  CSpan<int32_t> stable_prefix;  // rows: resident tokens >= this are invalidated first (may hold stale rows)
};

struct ResidentStepOutputs {
  Span<int32_t> current_slots;   // rows x K: the slot of each top-k entry, -1 where the entry is invalid
  Span<ResidentMiss> misses;     // room for rows x K entries; the first `returned count` are written
};

struct ResidentStepStats {
  int64_t hits = 0;
  int64_t misses = 0;
  int64_t resets = 0;       // rows reset because their request changed
  int64_t invalidated = 0;  // resident tokens dropped for being >= stable_prefix
};

class ResidentLru {
 public:
  // max_rows decode rows of `capacity` slots each (capacity >= K of every step).
  ResidentLru(int32_t max_rows, int32_t capacity);

  int32_t max_rows() const;
  int32_t capacity() const;

  // One step for rows = req_ids.size() rows (<= max_rows), steps (a)-(g) of
  // spec 5 per row. Validates everything before changing any state (sizes,
  // K <= capacity, token values); a rejected call changes nothing. Returns the
  // stats; outputs.misses[0 .. stats.misses) are the copies to make.
  ResidentStepStats step(const ResidentStepInputs& in, const ResidentStepOutputs& out);

  // Forgets every row (all slots empty, every row's request unknown).
  void reset();

  // The token held by `slot` of `row` (-1: empty). For tests and tracing.
  int32_t token_at(int32_t row, int32_t slot) const;

 private:
  struct State;
  std::vector<int32_t> storage_;  // see resident_lru.cpp
  int32_t max_rows_ = 0, capacity_ = 0;
};

}  // namespace aar::plan
