// Internal: the C++ function types that correspond to the schemas in
// schemas.cpp (Tensor? -> const std::optional<at::Tensor>&, SymInt[]? ->
// at::OptionalSymIntArrayRef, int[]? -> at::OptionalIntArrayRef, str ->
// c10::string_view, float -> double). The wrappers call through these types and
// the CPU twins / no-compute kernels are defined with them, so a mismatch with a
// schema fails loudly at registration time.
#pragma once

#include <ATen/core/ATen_fwd.h>
#include <ATen/core/Tensor.h>
#include <c10/util/OptionalArrayRef.h>
#include <c10/util/string_view.h>

#include <optional>
#include <tuple>

namespace aar::ops::sig {

using OptT = const std::optional<at::Tensor>&;
using SymList = at::OptionalSymIntArrayRef;
using Str = c10::string_view;
using OptInt = std::optional<int64_t>;

// npu_fused_infer_attention_score: (query, key, value) then the keyword arguments.
#define AAR_FIA_V1_PARAMS                                                                         \
  const at::Tensor &query, const at::Tensor &key, const at::Tensor &value, sig::OptT pse_shift,   \
      sig::OptT atten_mask, sig::SymList actual_seq_lengths, sig::SymList actual_seq_lengths_kv,  \
      sig::OptT dequant_scale1, sig::OptT quant_scale1, sig::OptT dequant_scale2,                 \
      sig::OptT quant_scale2, sig::OptT quant_offset2, sig::OptT antiquant_scale,                 \
      sig::OptT antiquant_offset, sig::OptT key_antiquant_scale, sig::OptT key_antiquant_offset,  \
      sig::OptT value_antiquant_scale, sig::OptT value_antiquant_offset, sig::OptT block_table,   \
      sig::OptT query_padding_size, sig::OptT kv_padding_size, sig::OptT key_shared_prefix,       \
      sig::OptT value_shared_prefix, sig::SymList actual_shared_prefix_len, sig::OptT query_rope, \
      sig::OptT key_rope, sig::OptT key_rope_antiquant_scale, int64_t num_heads, double scale,    \
      int64_t pre_tokens, int64_t next_tokens, sig::Str input_layout, int64_t num_key_value_heads, \
      int64_t sparse_mode, int64_t inner_precise, int64_t block_size, int64_t antiquant_mode,     \
      int64_t key_antiquant_mode, int64_t value_antiquant_mode, bool softmax_lse_flag

#define AAR_FIA_V1_ARGS                                                                            \
  query, key, value, pse_shift, atten_mask, actual_seq_lengths, actual_seq_lengths_kv,             \
      dequant_scale1, quant_scale1, dequant_scale2, quant_scale2, quant_offset2, antiquant_scale,  \
      antiquant_offset, key_antiquant_scale, key_antiquant_offset, value_antiquant_scale,          \
      value_antiquant_offset, block_table, query_padding_size, kv_padding_size, key_shared_prefix, \
      value_shared_prefix, actual_shared_prefix_len, query_rope, key_rope,                         \
      key_rope_antiquant_scale, num_heads, scale, pre_tokens, next_tokens, input_layout,           \
      num_key_value_heads, sparse_mode, inner_precise, block_size, antiquant_mode,                 \
      key_antiquant_mode, value_antiquant_mode, softmax_lse_flag

#define AAR_FIA_V2_PARAMS                                                                          \
  const at::Tensor &query, const at::Tensor &key, const at::Tensor &value, sig::OptT query_rope,   \
      sig::OptT key_rope, sig::OptT pse_shift, sig::OptT atten_mask, sig::SymList actual_seq_qlen, \
      sig::SymList actual_seq_kvlen, sig::OptT block_table, sig::OptT dequant_scale_query,         \
      sig::OptT dequant_scale_key, sig::OptT dequant_offset_key, sig::OptT dequant_scale_value,    \
      sig::OptT dequant_offset_value, sig::OptT dequant_scale_key_rope, sig::OptT quant_scale_out, \
      sig::OptT quant_offset_out, sig::OptT quant_scale_p, sig::OptT learnable_sink,               \
      int64_t num_query_heads, int64_t num_key_value_heads, double softmax_scale,                  \
      int64_t pre_tokens, int64_t next_tokens, sig::Str input_layout, int64_t sparse_mode,         \
      int64_t block_size, int64_t query_quant_mode, int64_t key_quant_mode,                        \
      int64_t value_quant_mode, int64_t inner_precise, bool return_softmax_lse,                    \
      sig::OptInt query_dtype, sig::OptInt key_dtype, sig::OptInt value_dtype,                     \
      sig::OptInt query_rope_dtype, sig::OptInt key_rope_dtype, sig::OptInt key_shared_prefix_dtype, \
      sig::OptInt value_shared_prefix_dtype, sig::OptInt dequant_scale_query_dtype,               \
      sig::OptInt dequant_scale_key_dtype, sig::OptInt dequant_scale_value_dtype,                  \
      sig::OptInt dequant_scale_key_rope_dtype, sig::OptInt out_dtype

#define AAR_FIA_V2_ARGS                                                                             \
  query, key, value, query_rope, key_rope, pse_shift, atten_mask, actual_seq_qlen, actual_seq_kvlen, \
      block_table, dequant_scale_query, dequant_scale_key, dequant_offset_key, dequant_scale_value,  \
      dequant_offset_value, dequant_scale_key_rope, quant_scale_out, quant_offset_out, quant_scale_p, \
      learnable_sink, num_query_heads, num_key_value_heads, softmax_scale, pre_tokens, next_tokens,  \
      input_layout, sparse_mode, block_size, query_quant_mode, key_quant_mode, value_quant_mode,     \
      inner_precise, return_softmax_lse, query_dtype, key_dtype, value_dtype, query_rope_dtype,      \
      key_rope_dtype, key_shared_prefix_dtype, value_shared_prefix_dtype, dequant_scale_query_dtype, \
      dequant_scale_key_dtype, dequant_scale_value_dtype, dequant_scale_key_rope_dtype, out_dtype

#define AAR_OUT_TAIL_PARAMS sig::OptT workspace, at::Tensor &attention_out, at::Tensor &softmax_lse

using FiaV1 = std::tuple<at::Tensor, at::Tensor>(AAR_FIA_V1_PARAMS);
using FiaV1Out = std::tuple<at::Tensor&, at::Tensor&>(AAR_FIA_V1_PARAMS, AAR_OUT_TAIL_PARAMS);
using FiaV1Ws = at::Tensor(AAR_FIA_V1_PARAMS);
using FiaV2 = std::tuple<at::Tensor, at::Tensor>(AAR_FIA_V2_PARAMS);
using FiaV2Out = std::tuple<at::Tensor&, at::Tensor&>(AAR_FIA_V2_PARAMS, AAR_OUT_TAIL_PARAMS);
using FiaV2Ws = at::Tensor(AAR_FIA_V2_PARAMS);

#define AAR_FUSION_ATTENTION_PARAMS                                                                \
  const at::Tensor &query, const at::Tensor &key, const at::Tensor &value, int64_t head_num,       \
      sig::Str input_layout, sig::OptT pse, sig::OptT padding_mask, sig::OptT atten_mask,          \
      double scale, double keep_prob, int64_t pre_tockens, int64_t next_tockens,                   \
      int64_t inner_precise, at::OptionalIntArrayRef prefix, at::OptionalIntArrayRef actual_seq_qlen, \
      at::OptionalIntArrayRef actual_seq_kvlen, int64_t sparse_mode, bool gen_mask_parallel,       \
      bool sync, sig::Str softmax_layout, sig::OptT sink, sig::OptT dropout_mask, int64_t seed,    \
      int64_t offset
using FusionAttentionResult =
    std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, int64_t, int64_t, int64_t>;
using FusionAttention = FusionAttentionResult(AAR_FUSION_ATTENTION_PARAMS);

#define AAR_SCATTER_PA_PARAMS                                                                      \
  const at::Tensor &key, const at::Tensor &value, at::Tensor &key_cache, at::Tensor &value_cache,  \
      const at::Tensor &slot_mapping, sig::OptT compress_lens, sig::OptT compress_seq_offsets,     \
      sig::OptT seq_lens, std::optional<c10::string_view> cache_mode
using ScatterPaKvCache = void(AAR_SCATTER_PA_PARAMS);

#define AAR_PAGED_ATTENTION_PARAMS                                                                 \
  const at::Tensor &query, const at::Tensor &key_cache, const at::Tensor &value_cache,             \
      int64_t num_kv_heads, int64_t num_heads, double scale_value, const at::Tensor &block_table,  \
      const at::Tensor &context_lens, at::Tensor &out
using PagedAttention = void(AAR_PAGED_ATTENTION_PARAMS, sig::OptT workspace);
using PagedAttentionWs = at::Tensor(AAR_PAGED_ATTENTION_PARAMS);

#define AAR_RESHAPE_AND_CACHE_PARAMS                                                              \
  const at::Tensor &key, const at::Tensor &value, at::Tensor &key_cache, at::Tensor &value_cache, \
      const at::Tensor &slot_indices
using ReshapeAndCache = void(AAR_RESHAPE_AND_CACHE_PARAMS);


// ---- MLA operators (issue 5)
using InterleaveRope = at::Tensor(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);
using RotaryMul = at::Tensor(const at::Tensor& self, const at::Tensor& r1, const at::Tensor& r2,
                             c10::string_view rotary_mode, const std::optional<at::Tensor>& rotate);

#define AAR_KV_RMSNORM_ROPE_CACHE_PARAMS                                                            \
  const at::Tensor &kv, const at::Tensor &gamma, const at::Tensor &cos, const at::Tensor &sin,      \
      const at::Tensor &index, const at::Tensor &k_cache, const at::Tensor &ckv_cache,             \
      sig::OptT k_rope_scale, sig::OptT c_kv_scale, sig::OptT k_rope_offset, sig::OptT c_kv_offset, \
      sig::OptT v, double epsilon, sig::Str cache_mode, bool is_output_kv
using KvRmsnormRopeCache = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>(AAR_KV_RMSNORM_ROPE_CACHE_PARAMS);

using GatherPaKvCache = void(const at::Tensor& key_cache, const at::Tensor& value_cache,
                             const at::Tensor& block_tables, const at::Tensor& seq_lens, at::Tensor& key,
                             at::Tensor& value, sig::OptT seq_offset, bool is_seq_lens_cumsum);

using AttentionUpdate = std::tuple<at::Tensor, at::Tensor>(at::TensorList lse, at::TensorList local_out,
                                                           int64_t update_type);

using TransposeBatchMatmul = at::Tensor(const at::Tensor& input, const at::Tensor& weight, sig::OptT bias,
                                        sig::OptT scale, at::OptionalIntArrayRef perm_x1,
                                        at::OptionalIntArrayRef perm_x2, at::OptionalIntArrayRef perm_y,
                                        sig::OptInt batch_split_factor);

#define AAR_MLA_PROLOG_V3_PARAMS                                                                      \
  const at::Tensor &token_x, const at::Tensor &weight_dq, const at::Tensor &weight_uq_qr,             \
      const at::Tensor &weight_uk, const at::Tensor &weight_dkv_kr, const at::Tensor &rmsnorm_gamma_cq, \
      const at::Tensor &rmsnorm_gamma_ckv, const at::Tensor &rope_sin, const at::Tensor &rope_cos,     \
      at::Tensor &kv_cache, at::Tensor &kr_cache, sig::OptT cache_index, sig::OptT dequant_scale_x,   \
      sig::OptT dequant_scale_w_dq, sig::OptT dequant_scale_w_uq_qr, sig::OptT dequant_scale_w_dkv_kr, \
      sig::OptT quant_scale_ckv, sig::OptT quant_scale_ckr, sig::OptT smooth_scales_cq,               \
      sig::OptT actual_seq_len, sig::OptT k_nope_clip_alpha, double rmsnorm_epsilon_cq,               \
      double rmsnorm_epsilon_ckv, sig::Str cache_mode, bool query_norm_flag, int64_t weight_quant_mode, \
      int64_t kv_cache_quant_mode, int64_t query_quant_mode, int64_t ckvkr_repo_mode,                 \
      int64_t quant_scale_repo_mode, int64_t tile_size, double qc_qr_scale, double kc_scale,          \
      sig::OptInt token_x_dtype, sig::OptInt weight_dq_dtype, sig::OptInt weight_uq_qr_dtype,         \
      sig::OptInt weight_dkv_kr_dtype, sig::OptInt kv_cache_dtype
using MlaPrologV3 =
    std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>(AAR_MLA_PROLOG_V3_PARAMS);

// npu_mla_prolog_v2: like v3 but cache_index is positional and required, and the
// caches are not marked mutable in the schema (the kernel still writes them in
// place; torch_npu's documentation recommends v3 for that reason). Returns
// (query, query_rope, kv_cache, kr_cache, dequant_scale_q_nope).
#define AAR_MLA_PROLOG_V2_PARAMS                                                                      \
  const at::Tensor &token_x, const at::Tensor &weight_dq, const at::Tensor &weight_uq_qr,             \
      const at::Tensor &weight_uk, const at::Tensor &weight_dkv_kr, const at::Tensor &rmsnorm_gamma_cq, \
      const at::Tensor &rmsnorm_gamma_ckv, const at::Tensor &rope_sin, const at::Tensor &rope_cos,     \
      const at::Tensor &cache_index, const at::Tensor &kv_cache, const at::Tensor &kr_cache,          \
      sig::OptT dequant_scale_x, sig::OptT dequant_scale_w_dq, sig::OptT dequant_scale_w_uq_qr,       \
      sig::OptT dequant_scale_w_dkv_kr, sig::OptT quant_scale_ckv, sig::OptT quant_scale_ckr,         \
      sig::OptT smooth_scales_cq, double rmsnorm_epsilon_cq, double rmsnorm_epsilon_ckv,              \
      sig::Str cache_mode
using MlaPrologV2 =
    std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>(AAR_MLA_PROLOG_V2_PARAMS);

// _C_ascend mla_preprocess (vllm-ascend's MLAPO kernel). The kernel function
// returns references to its five out arguments (`Tensor!`), hence the tuple of
// references; `kv_cache` / `kv_cache_rope` are the inputs the kernel reads the
// cache geometry from, kv_cache_out0 / kv_cache_out1 the caches it writes
// (callers pass the same tensors).
#define AAR_MLA_PREPROCESS_PARAMS                                                                          \
  const at::Tensor &hiddenState, const at::Tensor &wdqkv, sig::OptT descale0, const at::Tensor &gamma1,   \
      sig::OptT beta1, const at::Tensor &wuq, sig::OptT descale1, const at::Tensor &gamma2, sig::OptT cos,  \
      sig::OptT sin, const at::Tensor &wuk, const at::Tensor &kv_cache, const at::Tensor &kv_cache_rope,    \
      const at::Tensor &slotmapping, sig::OptT quant_scale0, sig::OptT quant_offset0, sig::OptT bias0,     \
      sig::OptT quant_scale1, sig::OptT quant_offset1, sig::OptT bias1, sig::OptT ctkv_scale,              \
      sig::OptT q_nope_scale, std::optional<c10::string_view> cache_mode,                                  \
      std::optional<c10::string_view> quant_mode, std::optional<bool> enable_inner_out, at::Tensor &q_out0, \
      at::Tensor &kv_cache_out0, at::Tensor &q_out1, at::Tensor &kv_cache_out1, at::Tensor &inner_out
using MlaPreprocessResult = std::tuple<at::Tensor&, at::Tensor&, at::Tensor&, at::Tensor&, at::Tensor&>;
using MlaPreprocess = MlaPreprocessResult(AAR_MLA_PREPROCESS_PARAMS);

// npu_quantize / npu_quant_matmul: the W8A8 linears.
using Quantize = at::Tensor(const at::Tensor& self, const at::Tensor& scales, sig::OptT zero_points, int64_t dtype,
                            int64_t axis, bool div_mode);

#define AAR_QUANT_MATMUL_PARAMS                                                                        \
  const at::Tensor &x1, const at::Tensor &x2, const at::Tensor &scale, sig::OptT offset,               \
      sig::OptT pertoken_scale, sig::OptT bias, sig::OptInt output_dtype, sig::OptInt x1_dtype,        \
      sig::OptInt x2_dtype, sig::OptInt pertoken_scale_dtype, sig::OptInt scale_dtype,                 \
      at::OptionalIntArrayRef group_sizes, sig::OptT y_scale
using QuantMatmul = at::Tensor(AAR_QUANT_MATMUL_PARAMS);

// ---- sparse attention (SFA, DeepSeek-V3.2) and quantisation operators (issue 10).
// `Npu` = torch_npu's operator, `Va` = vllm-ascend's `_C_ascend` operator of the same
// (or a similar) name; their schemas differ, hence the separate types.

// npu_lightning_indexer: torch_npu's and _C_ascend's take the same arguments.
#define AAR_LIGHTNING_INDEXER_PARAMS                                                                \
  const at::Tensor &query, const at::Tensor &key, const at::Tensor &weights,                       \
      sig::OptT actual_seq_lengths_query, sig::OptT actual_seq_lengths_key, sig::OptT block_table, \
      sig::Str layout_query, sig::Str layout_key, int64_t sparse_count, int64_t sparse_mode,       \
      int64_t pre_tokens, int64_t next_tokens, bool return_value
using LightningIndexer = std::tuple<at::Tensor, at::Tensor>(AAR_LIGHTNING_INDEXER_PARAMS);

#define AAR_QUANT_LIGHTNING_INDEXER_NPU_PARAMS                                                        \
  const at::Tensor &query, const at::Tensor &key, const at::Tensor &weights,                         \
      const at::Tensor &query_dequant_scale, const at::Tensor &key_dequant_scale,                    \
      int64_t query_quant_mode, int64_t key_quant_mode, sig::OptT actual_seq_lengths_query,          \
      sig::OptT actual_seq_lengths_key, sig::OptT block_table, sig::Str layout_query,                \
      sig::Str layout_key, int64_t sparse_count, int64_t sparse_mode, int64_t pre_tokens,            \
      int64_t next_tokens, sig::OptInt query_dtype, sig::OptInt key_dtype
using QuantLightningIndexerNpu = at::Tensor(AAR_QUANT_LIGHTNING_INDEXER_NPU_PARAMS);

#define AAR_LIGHTNING_INDEXER_QUANT_VA_PARAMS                                                         \
  const at::Tensor &query, const at::Tensor &key, const at::Tensor &weights,                         \
      const at::Tensor &query_dequant_scale, const at::Tensor &key_dequant_scale,                    \
      sig::OptT actual_seq_lengths_query, sig::OptT actual_seq_lengths_key, sig::OptT block_table,   \
      int64_t query_quant_mode, int64_t key_quant_mode, sig::Str layout_query, sig::Str layout_key,  \
      int64_t sparse_count, int64_t sparse_mode
using LightningIndexerQuantVa = at::Tensor(AAR_LIGHTNING_INDEXER_QUANT_VA_PARAMS);

// _C_ascend::npu_vllm_quant_lightning_indexer (+ _metadata): the DeepSeek-V4 quantised
// indexer over compressed keys (cmp_ratio) with an opaque tiling blob (issue 12).
#define AAR_VLLM_QUANT_LIGHTNING_INDEXER_PARAMS                                                       \
  const at::Tensor &query, const at::Tensor &key, const at::Tensor &weights,                         \
      const at::Tensor &query_dequant_scale, const at::Tensor &key_dequant_scale,                    \
      int64_t query_quant_mode, int64_t key_quant_mode, sig::OptT actual_seq_lengths_query,          \
      sig::OptT actual_seq_lengths_key, sig::OptT block_table, sig::OptT metadata,                   \
      sig::Str layout_query, sig::Str layout_key, int64_t sparse_count, int64_t sparse_mode,         \
      int64_t pre_tokens, int64_t next_tokens, int64_t cmp_ratio, bool return_value
using VllmQuantLightningIndexer = std::tuple<at::Tensor, at::Tensor>(AAR_VLLM_QUANT_LIGHTNING_INDEXER_PARAMS);

#define AAR_VLLM_QUANT_LIGHTNING_INDEXER_METADATA_PARAMS                                              \
  int64_t num_heads_q, int64_t num_heads_k, int64_t head_dim, int64_t query_quant_mode,              \
      int64_t key_quant_mode, sig::OptT actual_seq_lengths_query, sig::OptT actual_seq_lengths_key,  \
      int64_t batch_size, int64_t max_seqlen_q, int64_t max_seqlen_k, sig::Str layout_query,         \
      sig::Str layout_key, int64_t sparse_count, int64_t sparse_mode, int64_t pre_tokens,            \
      int64_t next_tokens, int64_t cmp_ratio, sig::Str device
using VllmQuantLightningIndexerMetadata = at::Tensor(AAR_VLLM_QUANT_LIGHTNING_INDEXER_METADATA_PARAMS);

// npu_sparse_flash_attention: torch_npu's value is optional and it takes `sinks`.
#define AAR_SFA_COMMON_PARAMS                                                                          \
  const at::Tensor &sparse_indices, double scale_value, sig::OptT block_table,                        \
      sig::OptT actual_seq_lengths_query, sig::OptT actual_seq_lengths_kv, sig::OptT query_rope,      \
      sig::OptT key_rope, int64_t sparse_block_size, sig::Str layout_query, sig::Str layout_kv,       \
      int64_t sparse_mode, int64_t pre_tokens, int64_t next_tokens, int64_t attention_mode,           \
      bool return_softmax_lse
using SfaResult = std::tuple<at::Tensor, at::Tensor, at::Tensor>;
#define AAR_SFA_NPU_PARAMS \
  const at::Tensor &query, const at::Tensor &key, sig::OptT value, AAR_SFA_COMMON_PARAMS, sig::OptT sinks
#define AAR_SFA_VA_PARAMS const at::Tensor &query, const at::Tensor &key, const at::Tensor &value, AAR_SFA_COMMON_PARAMS
using SparseFlashAttentionNpu = SfaResult(AAR_SFA_NPU_PARAMS);
using SparseFlashAttentionVa = SfaResult(AAR_SFA_VA_PARAMS);

// npu_kv_quant_sparse_flash_attention: torch_npu's returns one tensor and takes key/value dtypes;
// _C_ascend's returns (out, softmax_max, softmax_sum).
#define AAR_KVQ_SFA_COMMON_PARAMS                                                                      \
  const at::Tensor &query, const at::Tensor &key, const at::Tensor &value,                            \
      const at::Tensor &sparse_indices, double scale_value, int64_t key_quant_mode,                   \
      int64_t value_quant_mode, sig::OptT key_dequant_scale, sig::OptT value_dequant_scale,           \
      sig::OptT block_table, sig::OptT actual_seq_lengths_query, sig::OptT actual_seq_lengths_kv,     \
      int64_t sparse_block_size, sig::Str layout_query, sig::Str layout_kv, int64_t sparse_mode,      \
      int64_t pre_tokens, int64_t next_tokens, int64_t attention_mode, int64_t quant_scale_repo_mode, \
      int64_t tile_size, int64_t rope_head_dim
#define AAR_KVQ_SFA_NPU_PARAMS AAR_KVQ_SFA_COMMON_PARAMS, sig::OptInt key_dtype, sig::OptInt value_dtype
#define AAR_KVQ_SFA_VA_PARAMS AAR_KVQ_SFA_COMMON_PARAMS, bool return_softmax_lse
using KvQuantSparseFlashAttentionNpu = at::Tensor(AAR_KVQ_SFA_NPU_PARAMS);
using KvQuantSparseFlashAttentionVa = SfaResult(AAR_KVQ_SFA_VA_PARAMS);

using ScatterNdUpdate_ = at::Tensor&(at::Tensor& self, const at::Tensor& indices, const at::Tensor& updates);

#define AAR_DYNAMIC_QUANT_PARAMS                                                                    \
  const at::Tensor &input, sig::OptT smooth_scales, sig::OptT group_index, sig::OptInt dst_type, \
      sig::Str quant_mode, double dst_type_max
using DynamicQuant = std::tuple<at::Tensor, at::Tensor>(AAR_DYNAMIC_QUANT_PARAMS);

#define AAR_DYNAMIC_BLOCK_QUANT_PARAMS                                                              \
  const at::Tensor &x, double min_scale, sig::Str round_mode, int64_t dst_type, int64_t row_block_size, \
      int64_t col_block_size, double dst_type_max
using DynamicBlockQuant = std::tuple<at::Tensor, at::Tensor>(AAR_DYNAMIC_BLOCK_QUANT_PARAMS);

// _C_ascend batch_matmul_transpose: writes tensor_c, although its schema does not
// mark it mutable (`Tensor tensor_c`), hence const here.
using BatchMatmulTranspose = void(const at::Tensor& tensor_a, const at::Tensor& tensor_b, const at::Tensor& tensor_c,
                                  std::optional<c10::string_view> format_mode,
                                  std::optional<c10::string_view> quant_mode);

// ---- DeepSeek-V4 (DSA) shared-KV sparse attention and its in-place helpers (issue 12),
// vllm-ascend's _C_ascend operators.
#define AAR_SAS_TENSOR_PARAMS                                                                           \
  sig::OptT ori_kv, sig::OptT cmp_kv, sig::OptT ori_sparse_indices, sig::OptT cmp_sparse_indices,        \
      sig::OptT ori_block_table, sig::OptT cmp_block_table, sig::OptT cu_seqlens_q,                      \
      sig::OptT cu_seqlens_ori_kv, sig::OptT cu_seqlens_cmp_kv, sig::OptT seqused_q, sig::OptT seqused_kv, \
      sig::OptT sinks, sig::OptT metadata
#define AAR_SAS_MODE_PARAMS                                                                             \
  int64_t cmp_ratio, int64_t ori_mask_mode, int64_t cmp_mask_mode, int64_t ori_win_left,               \
      int64_t ori_win_right, sig::Str layout_q, sig::Str layout_kv, bool return_softmax_lse
#define AAR_SPARSE_ATTN_SHAREDKV_PARAMS \
  const at::Tensor &q, AAR_SAS_TENSOR_PARAMS, double softmax_scale, AAR_SAS_MODE_PARAMS
using SasResult = std::tuple<at::Tensor, at::Tensor>;
using SparseAttnSharedKv = SasResult(AAR_SPARSE_ATTN_SHAREDKV_PARAMS);
#define AAR_SAS_TENSOR_ARGS                                                                                 \
  ori_kv, cmp_kv, ori_sparse_indices, cmp_sparse_indices, ori_block_table, cmp_block_table, cu_seqlens_q, \
      cu_seqlens_ori_kv, cu_seqlens_cmp_kv, seqused_q, seqused_kv, sinks, metadata
#define AAR_SAS_MODE_ARGS \
  cmp_ratio, ori_mask_mode, cmp_mask_mode, ori_win_left, ori_win_right, layout_q, layout_kv, return_softmax_lse
#define AAR_SPARSE_ATTN_SHAREDKV_ARGS q, AAR_SAS_TENSOR_ARGS, softmax_scale, AAR_SAS_MODE_ARGS

// A5: npu_kv_quant_sparse_attn_sharedkv (positional kv_quant_mode, tile_size and rope_head_dim; no `*`).
#define AAR_KV_QUANT_SPARSE_ATTN_SHAREDKV_PARAMS                                                          \
  const at::Tensor &q, int64_t kv_quant_mode, AAR_SAS_TENSOR_PARAMS, int64_t tile_size, int64_t rope_head_dim, \
      double softmax_scale, AAR_SAS_MODE_PARAMS
using KvQuantSparseAttnSharedKv = SasResult(AAR_KV_QUANT_SPARSE_ATTN_SHAREDKV_PARAMS);

#define AAR_SAS_METADATA_LEN_PARAMS                                                                    \
  sig::OptT cu_seqlens_q, sig::OptT cu_seqlens_ori_kv, sig::OptT cu_seqlens_cmp_kv, sig::OptT seqused_q, \
      sig::OptT seqused_kv, int64_t batch_size, int64_t max_seqlen_q, int64_t max_seqlen_kv,           \
      int64_t ori_topk, int64_t cmp_topk
#define AAR_SAS_METADATA_MODE_PARAMS                                                                    \
  int64_t cmp_ratio, int64_t ori_mask_mode, int64_t cmp_mask_mode, int64_t ori_win_left,               \
      int64_t ori_win_right, sig::Str layout_q, sig::Str layout_kv, bool has_ori_kv, bool has_cmp_kv,   \
      sig::Str device
#define AAR_SPARSE_ATTN_SHAREDKV_METADATA_PARAMS                                              \
  int64_t num_heads_q, int64_t num_heads_kv, int64_t head_dim, AAR_SAS_METADATA_LEN_PARAMS, \
      AAR_SAS_METADATA_MODE_PARAMS
using SparseAttnSharedKvMetadata = at::Tensor(AAR_SPARSE_ATTN_SHAREDKV_METADATA_PARAMS);
#define AAR_SPARSE_ATTN_SHAREDKV_METADATA_ARGS                                                              \
  num_heads_q, num_heads_kv, head_dim, cu_seqlens_q, cu_seqlens_ori_kv, cu_seqlens_cmp_kv, seqused_q,     \
      seqused_kv, batch_size, max_seqlen_q, max_seqlen_kv, ori_topk, cmp_topk, cmp_ratio, ori_mask_mode, \
      cmp_mask_mode, ori_win_left, ori_win_right, layout_q, layout_kv, has_ori_kv, has_cmp_kv, device
#define AAR_KV_QUANT_SPARSE_ATTN_SHAREDKV_METADATA_PARAMS                                                    \
  int64_t num_heads_q, int64_t num_heads_kv, int64_t head_dim, int64_t kv_quant_mode,                       \
      AAR_SAS_METADATA_LEN_PARAMS, int64_t tile_size, int64_t rope_head_dim, AAR_SAS_METADATA_MODE_PARAMS
using KvQuantSparseAttnSharedKvMetadata = at::Tensor(AAR_KV_QUANT_SPARSE_ATTN_SHAREDKV_METADATA_PARAMS);

using ScatterNdUpdateV2 = void(at::Tensor& var, const at::Tensor& indices, const at::Tensor& update);
using InplacePartialRotaryMul = void(at::Tensor& x, const at::Tensor& r1, const at::Tensor& r2,
                                     c10::string_view rotary_mode, at::IntArrayRef partial_slice);
#define AAR_RMS_NORM_DYNAMIC_QUANT_PARAMS \
  const at::Tensor &x, const at::Tensor &gamma, sig::OptT smooth_scale, sig::OptT beta, double epsilon
using RmsNormDynamicQuant = std::tuple<at::Tensor, at::Tensor>(AAR_RMS_NORM_DYNAMIC_QUANT_PARAMS);

// ---- DeepSeek-V4 (DSA) compressor operators of vllm-ascend's _C_ascend (issue 12).
#define AAR_COMPRESSOR_PARAMS                                                                          \
  const at::Tensor &x, const at::Tensor &wkv, const at::Tensor &wgate, at::Tensor &state_cache,       \
      const at::Tensor &ape, const at::Tensor &norm_weight, const at::Tensor &rope_sin,               \
      const at::Tensor &rope_cos, sig::OptT state_block_table, sig::OptT cu_seqlens, sig::OptT seqused, \
      sig::OptT start_pos, int64_t rope_head_dim, int64_t cmp_ratio, int64_t coff, double norm_eps,   \
      int64_t rotary_mode, int64_t cache_mode
using Compressor = at::Tensor(AAR_COMPRESSOR_PARAMS);

#define AAR_COMPRESSOR_METADATA_HEAD_PARAMS                                                          \
  const at::Tensor &rope_cos, const at::Tensor &rope_sin, const at::Tensor &cu_seqlens,             \
      const at::Tensor &start_pos, const at::Tensor &kv_block_table, int64_t kv_block_size,         \
      int64_t slot_mapping_format, int64_t compress_ratio
#define AAR_COMPRESSOR_METADATA_PARAMS \
  AAR_COMPRESSOR_METADATA_HEAD_PARAMS, int64_t num_compressed_tokens, int64_t num_reqs_actual
#define AAR_COMPRESSOR_METADATA_OUT_PARAMS                                                            \
  AAR_COMPRESSOR_METADATA_HEAD_PARAMS, int64_t num_reqs_actual, at::Tensor &compress_cos,            \
      at::Tensor &compress_sin, at::Tensor &slot_mapping
using CompressorMetadata = std::tuple<at::Tensor, at::Tensor, at::Tensor>(AAR_COMPRESSOR_METADATA_PARAMS);
using CompressorMetadataOut = std::tuple<at::Tensor&, at::Tensor&, at::Tensor&>(AAR_COMPRESSOR_METADATA_OUT_PARAMS);

#define AAR_KV_COMPRESS_EPILOG_PARAMS                                                                 \
  at::Tensor &kv_compress_cache, const at::Tensor &x, const at::Tensor &slot_mapping,               \
      int64_t quant_group_size, int64_t quant_mode, bool round_scale_flag, int64_t layout
using KvCompressEpilog = void(AAR_KV_COMPRESS_EPILOG_PARAMS);

#define AAR_INDEXER_COMPRESS_EPILOG_PARAMS \
  at::Tensor &indexer_compress_cache, const at::Tensor &x, const at::Tensor &slot_mapping, int64_t layout
using IndexerCompressEpilogV2 = void(AAR_INDEXER_COMPRESS_EPILOG_PARAMS);

}  // namespace aar::ops::sig
