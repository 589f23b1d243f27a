#pragma once
// Private to cpp/: the GQA family's own captured calls (paged attention, the
// paged KV write); its fused-attention calls are the shared ones
// (graph_calls/fused_attention_calls.h).
#include <ATen/core/Tensor.h>

#include "ascend_attn_rt/graph/graph_params.h"
#include "ascend_attn_rt/graph_calls/fused_attention_calls.h"
#include "ascend_attn_rt/gqa/graph.h"
#include "ascend_attn_rt/ops/paged_attention.h"

namespace aar::gqa {

// Records a paged-attention call (one query row per request): an update
// refreshes its block table and KV lengths and, once per step, the workspace
// the kernel needs for those lengths.
void capture_paged_attention(graph::GraphParams& g, graph_calls::CallKeys keys, ops::PagedAttentionArgs a,
                             at::Tensor out);

// Records a paged KV-cache write: key/value rows at the slot mapping's slots
// (stable addresses; negative slots skipped). `reshape_and_cache`: the 310P
// operator instead of npu_scatter_pa_kv_cache.
void capture_kv_write(graph::GraphParams& g, graph_calls::CallKeys keys, at::Tensor key, at::Tensor value,
                      at::Tensor key_cache, at::Tensor value_cache, at::Tensor slot_mapping, bool reshape_and_cache);

}  // namespace aar::gqa
