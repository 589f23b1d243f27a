#include "open_capture.h"

#include "ascend_attn_rt/errors.h"

namespace aar::detail {

namespace {
thread_local int64_t tl_open_capture = -1;
}  // namespace

int64_t open_capture_bucket() noexcept { return tl_open_capture; }

void set_open_capture_bucket(int64_t bucket) noexcept { tl_open_capture = bucket; }

void refuse_if_capturing(const char* what) {
  if (__builtin_expect(tl_open_capture < 0, 1)) return;
  throw_not_supported(what, " cannot be captured in a graph (capture of bucket ", tl_open_capture,
                      " is open): it would run eagerly and its replay would leave the output stale");
}

}  // namespace aar::detail
