// DeepSeek-V3.2 (SFA) layer weights from a checkpoint's names (MLA names plus the
// indexer's) for one layer under `prefix`; the checkpoint's own tensors, mixed-dtype
// norms cast, weights_proj unscaled. Missing / misshapen / unexpected keys:
// InvalidArgument listing them by full name; biases and quantised projections
// other than an MXFP8 checkpoint's q_a_proj / kv_a_proj_with_mqa / q_b_proj
// (float8_e4m3fn weights with e8m0 weight_scale (out, in / 32), returned as
// weights.quant, quant type mxfp8, fused_qkv_a_proj = q_a_proj | kv_a_proj_with_mqa):
// NotSupported by key. Names and rules: docs/design/sfa.md §9.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "ascend_attn_rt/latent/weights.h"
#include "ascend_attn_rt/sfa/impl.h"

namespace aar::sfa {

// What sfa::Impl's constructor takes besides its config.
struct CheckpointWeights {
  mla::Weights weights;
  std::optional<IndexerWeights> indexer;  // set iff cfg.indexer is
};

CheckpointWeights weights_from_checkpoint(const std::map<std::string, at::Tensor>& state, std::string_view prefix,
                                          const ImplConfig& cfg);

}  // namespace aar::sfa
