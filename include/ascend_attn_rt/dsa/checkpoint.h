// DeepSeek-V4 (DSA) layer weights from a checkpoint's names.
//
// `state` maps names to tensors (a safetensors file's, or a transformers
// model's state_dict); `prefix` selects one attention layer (e.g.
// "layers.3.attn." in DeepSeek's published checkpoints, "model.layers.3.
// self_attn." in a transformers DeepseekV4 model; a '.' is appended when
// missing). Two namings are read, decided by which of "wq_a.weight" and
// "q_a_proj.weight" is under the prefix:
//
//   Weights field    published checkpoint            transformers
//   wq_a             wq_a.weight                     q_a_proj.weight
//   q_norm           q_norm.weight                   q_a_norm.weight
//   wq_b             wq_b.weight                     q_b_proj.weight
//   wkv              wkv.weight                      kv_proj.weight
//   kv_norm          kv_norm.weight                  kv_norm.weight
//   attn_sink        attn_sink                       sinks
//   wo_a             wo_a.weight                     o_a_proj.weight
//   wo_b             wo_b.weight                     o_b_proj.weight
//   cmp_wkv          compressor.wkv.weight           compressor.kv_proj.weight
//   cmp_wgate        compressor.wgate.weight         compressor.gate_proj.weight
//   cmp_ape          compressor.ape                  compressor.position_bias
//   cmp_norm         compressor.norm.weight          compressor.kv_norm.weight
//   idx_wq_b         indexer.wq_b.weight             compressor.indexer.q_b_proj.weight
//   idx_weights_proj indexer.weights_proj.weight     compressor.indexer.scorer.weights_proj.weight
//   idx_cmp_wkv      indexer.compressor.wkv.weight   compressor.indexer.kv_proj.weight
//   idx_cmp_wgate    indexer.compressor.wgate.weight compressor.indexer.gate_proj.weight
//   idx_cmp_ape      indexer.compressor.ape          compressor.indexer.position_bias
//   idx_cmp_norm     indexer.compressor.norm.weight  compressor.indexer.kv_norm.weight
//
// (compressor.* with compress_ratio 4 or 128, the indexer's with ratio 4.)
// Every tensor is the checkpoint's own (a view, no copy) except:
//  - wo_a: stored as one linear (G o_lora, N D / G), group g's output rows
//    g o_lora .. (g + 1) o_lora; the runtime's (G, N D / G, o_lora) is its
//    per-group transpose, made contiguous once here so the device's batched
//    matmul does not re-layout the weight on every call.
//  - norm weights in another float dtype than the projections (checkpoints
//    keep them in float32 next to bf16 projections) are cast to the
//    projections' dtype, which the layer computes in; attn_sink is cast to
//    float32 when stored otherwise. The compressors' ape are passed as stored
//    (the layer takes any float dtype).
// Shapes come from the config (hidden_size, num_heads, head_dim, q_lora_rank,
// compress_ratio, index_n_heads, index_head_dim, o_groups, o_lora_rank), for
// the whole layer: num_heads is the checkpoint's head count (no tensor-parallel
// slicing here). Errors (InvalidArgument, Python ValueError) list by full key
// every missing, misshapen and unexpected key under the prefix, and name a
// projection of another dtype than wq_a's. Not supported (NotSupported, Python
// NotImplementedError), by key: quantised projections (float8 weights or a
// weight's scale / weight_scale / weight_scale_inv / input_scale companion:
// dequantise first) and projection biases. The caller's tensors are never
// written.
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <string>
#include <string_view>

#include "ascend_attn_rt/dsa/impl.h"

namespace aar::dsa {

Weights weights_from_checkpoint(const std::map<std::string, at::Tensor>& state, std::string_view prefix,
                                const ImplConfig& cfg);

}  // namespace aar::dsa
