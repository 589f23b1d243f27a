// npu_fused_infer_attention_score (FIA v1) and npu_fused_infer_attention_score_v2,
// their .out variants and the get_max_workspace queries.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>
#include <c10/util/string_view.h>

#include <optional>
#include <tuple>

#include "ascend_attn_rt/ops/provider.h"

namespace aar::ops {

inline constexpr int64_t kIntMax32 = 2147483647;

// Tensor arguments of FIA v1 that the runtime uses; every other tensor argument
// of the schema is passed as None.
struct FiaTensors {
  at::Tensor query, key, value;
  std::optional<at::Tensor> atten_mask;
  std::optional<at::Tensor> block_table;
  std::optional<at::Tensor> key_antiquant_scale, key_antiquant_offset;
  std::optional<at::Tensor> value_antiquant_scale, value_antiquant_offset;
  std::optional<at::Tensor> query_rope, key_rope;
};

struct FiaParams {
  c10::IntArrayRef actual_seq_lengths;     // query: cumulative ends (TND)
  c10::IntArrayRef actual_seq_lengths_kv;  // per-request with block_table, cumulative without
  bool has_actual_seq_lengths = true;
  bool has_actual_seq_lengths_kv = true;
  int64_t num_heads = 1;
  double scale = 1.0;
  int64_t pre_tokens = kIntMax32;
  int64_t next_tokens = kIntMax32;
  c10::string_view input_layout = "TND";
  int64_t num_key_value_heads = 0;
  int64_t sparse_mode = 0;
  int64_t inner_precise = 0;
  int64_t block_size = 0;
  int64_t antiquant_mode = 0;
  int64_t key_antiquant_mode = 0;
  int64_t value_antiquant_mode = 0;
  bool softmax_lse_flag = false;
};

std::tuple<at::Tensor, at::Tensor> fused_infer_attention_score(const FiaTensors& t, const FiaParams& p,
                                                               Provider pv = Provider::Auto);
void fused_infer_attention_score_out(const FiaTensors& t, const FiaParams& p,
                                     const std::optional<at::Tensor>& workspace, at::Tensor& attention_out,
                                     at::Tensor& softmax_lse, Provider pv = Provider::Auto);
at::Tensor fused_infer_attention_score_get_max_workspace(const FiaTensors& t, const FiaParams& p,
                                                         Provider pv = Provider::Auto);

struct FiaV2Tensors {
  at::Tensor query, key, value;
  std::optional<at::Tensor> query_rope, key_rope;
  std::optional<at::Tensor> atten_mask;
  std::optional<at::Tensor> block_table;
  std::optional<at::Tensor> dequant_scale_key, dequant_offset_key;
  std::optional<at::Tensor> dequant_scale_value, dequant_offset_value;
  std::optional<at::Tensor> learnable_sink;
  // The fully quantised MLA decode (FA-quant): the int8 query's per-(token, head)
  // dequant scale (query_quant_mode 3; dequant_scale_key / _value per-tensor).
  std::optional<at::Tensor> dequant_scale_query;
};

struct FiaV2Params {
  c10::IntArrayRef actual_seq_qlen;
  c10::IntArrayRef actual_seq_kvlen;
  bool has_actual_seq_qlen = true;
  bool has_actual_seq_kvlen = true;
  int64_t num_query_heads = 1;
  int64_t num_key_value_heads = 0;
  double softmax_scale = 1.0;
  int64_t pre_tokens = kIntMax32;
  int64_t next_tokens = kIntMax32;
  c10::string_view input_layout = "TND";
  int64_t sparse_mode = 0;
  int64_t block_size = 0;
  int64_t query_quant_mode = 0;
  int64_t key_quant_mode = 0;
  int64_t value_quant_mode = 0;
  int64_t inner_precise = 0;
  bool return_softmax_lse = false;
};

std::tuple<at::Tensor, at::Tensor> fused_infer_attention_score_v2(const FiaV2Tensors& t, const FiaV2Params& p,
                                                                  Provider pv = Provider::Auto);
void fused_infer_attention_score_v2_out(const FiaV2Tensors& t, const FiaV2Params& p,
                                        const std::optional<at::Tensor>& workspace, at::Tensor& attention_out,
                                        at::Tensor& softmax_lse, Provider pv = Provider::Auto);
at::Tensor fused_infer_attention_score_v2_get_max_workspace(const FiaV2Tensors& t, const FiaV2Params& p,
                                                            Provider pv = Provider::Auto);

}  // namespace aar::ops
