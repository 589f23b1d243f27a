// Request identities for state kept per request across steps (the SFA KV-offload
// resident rows). Such state must be keyed by something two live requests can
// never share: a 32-bit hash of the request id (upstream's adler32) collides
// easily, and the second request then reads the first one's resident rows.
//
// RequestKeys turns an engine's string request ids into 64-bit keys that never
// collide: the key an id had at the previous step is kept, a new id gets a fresh
// key, and keys are never reused (a counter). An id absent from a step is
// forgotten, so a request that comes back after a gap gets a new key: its
// per-request state is rebuilt, which costs a rebuild, never a wrong result.
// Engines with their own unique integer request numbers pass those instead.
//
// Thread safety: RequestKeys, one thread at a time; check_distinct_request_ids,
// any number of threads (its scratch is per thread).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "ascend_attn_rt/plan/span.h"

namespace aar::plan {

// Throws InvalidArgument naming `name`[i] and [j] when two entries are equal.
// Expected O(n) (a hash table in a per-thread scratch kept between calls).
void check_distinct_request_ids(CSpan<uint64_t> ids, const char* name);

class RequestKeys {
 public:
  // keys[i] = the key of ids[i] (keys.size() >= ids.size()). Validates first
  // (room, no id twice: InvalidArgument naming both positions); a rejected
  // call changes nothing.
  void assign(CSpan<std::string_view> ids, Span<uint64_t> keys);
  // Ids remembered from the last assign.
  std::size_t size() const { return current_.size(); }

 private:
  std::unordered_map<std::string, uint64_t> current_, next_;
  std::vector<uint64_t> pending_;
  uint64_t counter_ = 0;
};

}  // namespace aar::plan
