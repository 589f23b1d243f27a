#include "ascend_attn_rt/build_stamp.h"

#include "ascend_attn_rt/errors.h"

namespace aar {

void check_current(const BuildStamp& s, const char* what) {
  if (__builtin_expect(s.current(), 1)) return;
  const uint64_t live = s.live->load(std::memory_order_acquire);
  if (live == BuildStamp::kRetired) {
    throw_invalid(what, " was built by a metadata builder that no longer exists (its lists and buffers are gone)");
  }
  throw_invalid(what, " is stale: it is build #", s.generation, " of its builder, which has since built #", live,
                " and rewrote the lists and buffers it points at (use the latest build's metadata; to keep "
                "several metadata live at once, e.g. one per draft step, build each with its own builder)");
}

}  // namespace aar
