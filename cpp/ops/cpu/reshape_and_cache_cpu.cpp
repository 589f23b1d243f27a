// CPU twin of ATB _npu_reshape_and_cache (310P KV write): the ND-cache write of
// npu_scatter_pa_kv_cache "Norm", slots given as slot_indices.
#include <torch/library.h>

#include "../op_signatures.h"
#include "kv_scatter.h"

namespace aar::ops::cpu {

namespace {

void reshape_and_cache(AAR_RESHAPE_AND_CACHE_PARAMS) {
  scatter_kv("_npu_reshape_and_cache", "slot_indices", key, value, key_cache, value_cache, slot_indices,
             CacheFormat::Nd);
}

}  // namespace

}  // namespace aar::ops::cpu

TORCH_LIBRARY_IMPL(ascend_cpu, CPU, m) {
  m.impl("_npu_reshape_and_cache", TORCH_FN(aar::ops::cpu::reshape_and_cache));
}
