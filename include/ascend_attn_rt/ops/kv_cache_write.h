// Paged KV-cache writes: npu_scatter_pa_kv_cache (A2/A3/A5) and
// _npu_reshape_and_cache (ATB, 310P). Negative slots are skipped.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/string_view.h>

#include "ascend_attn_rt/ops/provider.h"

namespace aar::ops {

// cache_mode "Norm": ND cache (nb, bs, Nkv, D); "PA_NZ": 5-D NZ cache.
void scatter_pa_kv_cache(const at::Tensor& key, const at::Tensor& value, at::Tensor& key_cache,
                         at::Tensor& value_cache, const at::Tensor& slot_mapping, c10::string_view cache_mode,
                         Provider pv = Provider::Auto);

void reshape_and_cache(const at::Tensor& key, const at::Tensor& value, at::Tensor& key_cache,
                       at::Tensor& value_cache, const at::Tensor& slot_indices, Provider pv = Provider::Auto);

}  // namespace aar::ops
