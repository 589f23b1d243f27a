// DeepSeek-V3.2 (SFA) layer weights from a checkpoint's names.
//
// `state` maps names to tensors (a safetensors file's, or a transformers
// model's state_dict); `prefix` selects one attention layer (e.g.
// "model.layers.3.self_attn."; a '.' is appended when missing). DeepSeek's
// published V3.2 checkpoints, transformers' DeepseekV32 and GlmMoeDsa models
// name the layer alike (MLA names plus the indexer's):
//
//   field                         checkpoint
//   weights.q_a_proj              q_a_proj.weight           with q_lora_rank
//   weights.q_a_layernorm         q_a_layernorm.weight      with q_lora_rank
//   weights.q_proj                q_b_proj.weight           (q_proj.weight without q_lora_rank)
//   weights.kv_a_proj_with_mqa    kv_a_proj_with_mqa.weight
//   weights.kv_a_layernorm        kv_a_layernorm.weight
//   weights.kv_b_proj             kv_b_proj.weight
//   weights.o_proj                o_proj.weight
//   indexer->wq_b                 indexer.wq_b.weight       with cfg.indexer
//   indexer->wk                   indexer.wk.weight
//   indexer->weights_proj         indexer.weights_proj.weight
//   indexer->k_norm_weight        indexer.k_norm.weight
//   indexer->k_norm_bias          indexer.k_norm.bias
//
// All of them are the layer's weights in the runtime's layout already (torch
// (out, in)): the tensors are the checkpoint's own (no copy), except norm
// weights (RMSNorm gammas, the indexer's LayerNorm) stored in another float
// dtype than the projections, which are cast to the projections' dtype (the
// layer takes one dtype). The indexer's weights_proj is taken unscaled: the
// model's n_head^-0.5 D^-0.5 factor is a positive constant, which does not
// change the top-k (sfa/impl.h: IndexerWeights).
// Shapes come from cfg.dims and cfg.indexer (n_head, head_dim), for the whole
// layer (num_heads is the checkpoint's head count; no tensor-parallel
// slicing). A layer without an indexer (cfg.indexer unset) finds indexer.*
// keys unexpected. Errors (InvalidArgument, Python ValueError) list by full
// key every missing, misshapen and unexpected key under the prefix, and name a
// projection of another dtype than kv_b_proj's. Not supported (NotSupported,
// Python NotImplementedError), by key: quantised projections (float8 weights,
// or a weight's scale / weight_scale / weight_scale_inv / input_scale
// companion: dequantise first; the runtime's W8A8 layers take
// mla::QuantWeights) and projection biases (attention_bias). The caller's
// tensors are never written.
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
