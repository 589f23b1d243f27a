#include "inference_scope.h"

#include "ascend_attn_rt/ops/inference_mode.h"

namespace aar::ops {

namespace {
thread_local int64_t t_entries = 0;
}  // namespace

void detail::count_inference_mode_entry() noexcept { ++t_entries; }

int64_t testing::inference_mode_entries() { return t_entries; }

}  // namespace aar::ops
