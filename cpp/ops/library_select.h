// Shared by the wrappers of the operators that both torch_npu and vllm-ascend provide under one name
// with different schemas (lightning_indexer.cpp, sparse_flash_attention.cpp): which library a call
// targets, and the refusal of an argument the vllm-ascend schema lacks.
#pragma once

#include "ascend_attn_rt/errors.h"
#include "ascend_attn_rt/ops/provider.h"

namespace aar::ops::detail {

// Only torch_npu and vllm-ascend provide these operators.
inline bool is_vllm_ascend(const char* what, OpLibrary lib) {
  if (lib == OpLibrary::TorchNpu) return false;
  if (lib == OpLibrary::VllmAscend) return true;
  throw_invalid(what, ": lib=", to_string(lib), " has no such operator (pass OpLibrary::TorchNpu or ",
                "OpLibrary::VllmAscend)");
}

inline void reject_for_va(const char* what, bool set, const char* name, const char* op) {
  if (set) {
    throw_not_supported(what, ": ", name, " is not an argument of vllm-ascend's _C_ascend::", op,
                        " (OpLibrary::VllmAscend); leave it unset or use OpLibrary::TorchNpu");
  }
}

}  // namespace aar::ops::detail
