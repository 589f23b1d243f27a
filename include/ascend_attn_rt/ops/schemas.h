// The exact torch_npu 2.14.0 schemas of every operator the runtime calls, without
// namespace. The CPU twins and the no-compute provider are registered from this
// table; tests/python/test_schemas.py compares it with the torch_npu wheel.
#pragma once

#include <vector>

namespace aar::ops {

struct OpSchema {
  const char* name;      // "npu_fused_infer_attention_score.out"
  const char* schema;    // full schema string, without namespace
  bool atb;              // lives in torch_npu's `atb` namespace on the NPU
};

const std::vector<OpSchema>& op_schemas();

}  // namespace aar::ops
