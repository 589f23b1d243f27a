#include "ascend_attn_rt/plan/request_keys.h"

#include <vector>

#include "ascend_attn_rt/errors.h"

namespace aar::plan {

namespace {

uint64_t mix64(uint64_t x) {  // splitmix64's finaliser: spreads sequential ids over the table
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

void check_distinct_request_ids(CSpan<uint64_t> ids, const char* name) {
  const std::size_t n = ids.size();
  if (n < 2) return;
  std::size_t size = 4;
  while (size < 2 * n) size *= 2;
  // Open addressing over positions + 1 (0 = empty), so any id value is allowed.
  thread_local std::vector<uint32_t> table;
  if (table.size() < size) table.resize(size);
  std::fill(table.begin(), table.begin() + static_cast<std::ptrdiff_t>(size), 0u);
  const std::size_t mask = size - 1;
  for (std::size_t i = 0; i < n; ++i) {
    std::size_t h = static_cast<std::size_t>(mix64(ids[i])) & mask;
    while (table[h] != 0) {
      const std::size_t j = table[h] - 1;
      AAR_CHECK_ARG(ids[j] != ids[i], name, "[", i, "]=", ids[i], " repeats ", name, "[", j,
                    "]: every request of a batch needs its own id (per-request state such as the offload's "
                    "resident rows is keyed by it)");
      h = (h + 1) & mask;
    }
    table[h] = static_cast<uint32_t>(i + 1);
  }
}

void RequestKeys::assign(CSpan<std::string_view> ids, Span<uint64_t> keys) {
  AAR_CHECK_ARG(keys.size() >= ids.size(), "keys has room for ", keys.size(), " entries, needs ", ids.size());
  next_.clear();
  pending_.resize(ids.size());
  uint64_t fresh = 0;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const auto [it, inserted] = next_.emplace(std::string(ids[i]), 0);
    if (!inserted) {
      std::size_t j = 0;
      while (ids[j] != ids[i]) ++j;
      next_.clear();
      AAR_CHECK_ARG(false, "req_ids[", i, "]=\"", std::string(ids[i]), "\" repeats req_ids[", j,
                    "]: every request of a batch needs its own id");
    }
    const auto old = current_.find(it->first);
    // A new id's key is counted from counter_ only once the call succeeds.
    it->second = old != current_.end() ? old->second : counter_ + (++fresh);
    pending_[i] = it->second;
  }
  counter_ += fresh;
  for (std::size_t i = 0; i < ids.size(); ++i) keys[i] = pending_[i];
  current_.swap(next_);
}

}  // namespace aar::plan
