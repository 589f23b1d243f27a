// The operator library of CANN's torch extension `cann_ops_transformer`
// (SparseFlashMla, spec sparse.md 7.2):
//   CannOpsTransformer -> cann_ops_transformer / ascend_cpu_cot / ascend_noop_cot
// It is the fourth OpLibrary value (3), which provider_namespace and
// to_string ("CannOpsTransformer") accept. It is declared here rather than as
// an enumerator of OpLibrary in provider.h only to keep this change from
// rebuilding every translation unit; folding it into the enum is a one-line
// follow-up that changes no value.
#pragma once

#include "ascend_attn_rt/ops/provider.h"

namespace aar::ops {

inline constexpr OpLibrary kCannOpsTransformer = static_cast<OpLibrary>(3);

}  // namespace aar::ops
