// The exact schemas of every operator the runtime calls, without namespace. The
// CPU twins and the no-compute provider are registered from these tables;
// tests/python/test_schemas.py compares them with their sources.
//
// Thread safety: each table is made once (a function-local static) and never
// changes: read it from any number of threads.
#pragma once

#include <vector>

namespace aar::ops {

struct OpSchema {
  const char* name;      // "npu_fused_infer_attention_score.out"
  const char* schema;    // full schema string, without namespace
  bool atb;              // lives in torch_npu's `atb` namespace on the NPU
};

// torch_npu 2.14.0's operators (namespaces `npu` / `atb` on the NPU), registered
// under `ascend_cpu` and `ascend_noop`; checked against the torch_npu wheel.
const std::vector<OpSchema>& op_schemas();

// vllm-ascend's own operators (namespace `_C_ascend` on the NPU; `atb` is always
// false), registered under `ascend_cpu_va` and `ascend_noop_va`; checked against
// third_party/vllm_ascend_ops.txt.
const std::vector<OpSchema>& vllm_ascend_op_schemas();

// CANN's torch-extension operators (namespace `cann_ops_transformer` on the NPU:
// SparseFlashMla, docs/design/dsa.md §4.2; `atb` is always false), registered under
// `ascend_cpu_cot` and `ascend_noop_cot`; checked against
// third_party/cann_ops_transformer_ops.txt.
const std::vector<OpSchema>& cann_ops_transformer_op_schemas();

}  // namespace aar::ops
