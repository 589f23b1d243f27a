// npu_gather_pa_kv_cache (docs/design/ops.md §4.5): gathers per-request token ranges
// of two paged caches into contiguous buffers.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

#include "ascend_attn_rt/ops/provider.h"

namespace aar::ops {

// key_cache/value_cache (nb, bs, Nkv, Dk|Dv); block_tables int32 (B, MB);
// seq_lens int32 (B) per-request lengths; seq_offset int32 (B), multiples of bs.
// key (sum(seq_lens), Nkv, Dk), value (sum, Nkv, Dv) are written.
void gather_pa_kv_cache(const at::Tensor& key_cache, const at::Tensor& value_cache, const at::Tensor& block_tables,
                        const at::Tensor& seq_lens, at::Tensor& key, at::Tensor& value,
                        const std::optional<at::Tensor>& seq_offset, Provider pv = Provider::Auto);

}  // namespace aar::ops
