// The paged KV-cache write of the GQA family, shared by the GQA layer and the
// PCP layer (cp/gqa_pcp.h): npu_scatter_pa_kv_cache on A2/A3/A5, ATB's
// _npu_reshape_and_cache on 310P. Non-contiguous key/value are copied once
// (the kernels read row-major memory); slots < 0 are skipped.
#pragma once

#include <ATen/core/Tensor.h>

#include "ascend_attn_rt/plan/workspace.h"

namespace aar::gqa {

void write_paged_kv(plan::DeviceKind device, const at::Tensor& key, const at::Tensor& value, at::Tensor& key_cache,
                    at::Tensor& value_cache, const at::Tensor& slot_mapping);

}  // namespace aar::gqa
