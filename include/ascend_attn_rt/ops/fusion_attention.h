// npu_fusion_attention (FlashAttentionScore): dense attention over TND/BNSD
// inputs; both length lists cumulative in TND. Returns element [0] of the op's
// 7-tuple (the attention output).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/string_view.h>

#include <optional>

#include "ascend_attn_rt/ops/fused_infer_attention.h"
#include "ascend_attn_rt/ops/provider.h"

namespace aar::ops {

struct FusionAttentionArgs {
  at::Tensor query, key, value;
  int64_t head_num = 1;
  c10::string_view input_layout = "TND";
  std::optional<at::Tensor> atten_mask;  // bool/uint8, True = masked
  double scale = 1.0;
  int64_t pre_tockens = kIntMax32;
  int64_t next_tockens = kIntMax32;
  c10::IntArrayRef actual_seq_qlen;   // cumulative ends (TND)
  c10::IntArrayRef actual_seq_kvlen;  // cumulative ends (TND)
  int64_t sparse_mode = 0;
};

at::Tensor fusion_attention(const FusionAttentionArgs& a, Provider pv = Provider::Auto);

}  // namespace aar::ops
