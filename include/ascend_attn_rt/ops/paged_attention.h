// torch_npu._npu_paged_attention (ATB PagedAttention, one query token per request)
// and its workspace query.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>

#include "ascend_attn_rt/ops/provider.h"

namespace aar::ops {

struct PagedAttentionArgs {
  at::Tensor query;        // (B, N, D)
  at::Tensor key_cache;    // (nb, bs, Nkv, D)
  at::Tensor value_cache;  // (nb, bs, Nkv, D)
  int64_t num_kv_heads = 0;
  int64_t num_heads = 0;
  double scale_value = 1.0;
  at::Tensor block_table;   // (B, max_blocks) int32
  at::Tensor context_lens;  // (B,) int32, host
};

void paged_attention(const PagedAttentionArgs& a, at::Tensor& out, const std::optional<at::Tensor>& workspace,
                     Provider pv = Provider::Auto);
at::Tensor paged_attention_get_workspace(const PagedAttentionArgs& a, at::Tensor& out,
                                         Provider pv = Provider::Auto);

}  // namespace aar::ops
