// The operator library of CANN's torch extension `cann_ops_transformer`
// (SparseFlashMla, docs/design/dsa.md §4.2):
//   CannOpsTransformer -> cann_ops_transformer / ascend_cpu_cot / ascend_noop_cot
// (OpLibrary::CannOpsTransformer; the name below is kept for the code that
// spells it so).
#pragma once

#include "ascend_attn_rt/ops/provider.h"

namespace aar::ops {

inline constexpr OpLibrary kCannOpsTransformer = OpLibrary::CannOpsTransformer;

}  // namespace aar::ops
