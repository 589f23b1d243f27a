// The DeepSeek-V3.2 lightning indexer (docs/design/sparse.md §4): per query
// token, the top-k key positions of its request by
//   score(t, s) = sum_h w[t, h] * relu(q[t, h] . k[s])
// Two libraries provide it with different schemas (OpLibrary::TorchNpu:
// torch_npu's npu_lightning_indexer / npu_quant_lightning_indexer;
// OpLibrary::VllmAscend: _C_ascend's npu_lightning_indexer /
// npu_lightning_indexer_quant); the wrappers call the one `lib` names.
//
// Lengths are DEVICE tensors here (int32), unlike FIA's host lists.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/string_view.h>

#include <cstdint>
#include <limits>
#include <optional>
#include <tuple>

#include "ascend_attn_rt/ops/provider.h"

namespace aar::ops {

struct LightningIndexerArgs {
  at::Tensor query;    // (T, n_head, D_i), layout_query "TND"
  at::Tensor key;      // (nb, bs, 1, D_i) paged, layout_key "PA_BSND"
  at::Tensor weights;  // (T, n_head)
  std::optional<at::Tensor> actual_seq_lengths_query;  // int32 (B): cumulative query ends
  std::optional<at::Tensor> actual_seq_lengths_key;    // int32 (B): per-request KV lengths
  std::optional<at::Tensor> block_table;               // int32 (B, W)
  c10::string_view layout_query = "TND", layout_key = "PA_BSND";
  int64_t sparse_count = 2048, sparse_mode = 3;
  int64_t pre_tokens = std::numeric_limits<int64_t>::max(), next_tokens = std::numeric_limits<int64_t>::max();
  bool return_value = false;
};

// Returns (sparse_indices (T, 1, sparse_count) int32: positions within the
// request, by descending score, then -1; values). `values` is (T, 1,
// sparse_count) fp32 (the selected scores, -inf where the index is -1) when
// return_value is set, an empty fp32 tensor otherwise (CPU twin; the device's
// values dtype is unverified). lib: TorchNpu or VllmAscend (Atb has no indexer).
std::tuple<at::Tensor, at::Tensor> lightning_indexer(const LightningIndexerArgs& a, OpLibrary lib,
                                                     Provider pv = Provider::Auto);

struct QuantLightningIndexerArgs {
  LightningIndexerArgs base;       // query/key int8 (or fp8 e4m3), weights fp16; return_value must be false
  at::Tensor query_dequant_scale;  // (T, n_head)
  at::Tensor key_dequant_scale;    // (nb, bs, 1): the scale cache (nb, bs, 1, 1) squeezed at dim 2
  int64_t query_quant_mode = 0, key_quant_mode = 0;  // 0: per token (and head)
  std::optional<int64_t> query_dtype, key_dtype;     // torch_npu only (NotSupported for VllmAscend when set)
};

// torch_npu npu_quant_lightning_indexer (TorchNpu) or _C_ascend
// npu_lightning_indexer_quant (VllmAscend; it takes no pre/next tokens: values
// other than the defaults are NotSupported); returns sparse_indices.
at::Tensor quant_lightning_indexer(const QuantLightningIndexerArgs& a, OpLibrary lib, Provider pv = Provider::Auto);

// ---- DeepSeek-V4 (DSA) quantised indexer: _C_ascend::npu_vllm_quant_lightning_indexer
// (docs/design/sparse.md §4, docs/design/dsa.md §1.3, docs/design/ops.md §4.6; VllmAscend only). The keys are the
// request's COMPRESSED rows (one per cmp_ratio raw tokens, written by the C4
// indexer compressor), read through block_table; actual_seq_lengths_key holds the
// RAW lengths S_b, so request b has floor(S_b / cmp_ratio) compressed rows and,
// under sparse_mode 3, row i (of q_b) sees the compressed rows
//   c < floor((S_b - q_b + i + 1) / cmp_ratio)   (sparse_mode 0: c < floor(S_b / cmp_ratio)).
// Score as docs/design/sparse.md §4 (int8 + fp16 scales on A2/A3, fp8 e4m3 + fp32 scales on A5);
// sparse_indices (T, 1, sparse_count) int32 are compressed-row ids within the
// request by descending score (CPU twin: ties lower id first), then -1.
// sparse_values: with return_value, (T, 1, sparse_count) fp32 selected scores
// (-inf at -1 entries), as the plain indexer's twin; otherwise an empty fp32
// tensor. `metadata` is the opaque (1024,) int32 blob of the metadata op below:
// the device's tiling data; the CPU twin checks its dtype/size and ignores it.
struct VllmQuantLightningIndexerArgs {
  QuantLightningIndexerArgs quant;  // query_dtype / key_dtype must stay unset (not in this schema)
  std::optional<at::Tensor> metadata;
  int64_t cmp_ratio = 1;  // 4 for the DSV4 C4 indexer
};

std::tuple<at::Tensor, at::Tensor> vllm_quant_lightning_indexer(const VllmQuantLightningIndexerArgs& a,
                                                                Provider pv = Provider::Auto);

// _C_ascend::npu_vllm_quant_lightning_indexer_metadata (docs/design/dsa.md §3.5): the (1024,)
// int32 tiling blob for the indexer above; regenerate it whenever lengths change.
// Opaque: on CPU it is a deterministic function of the arguments that nothing
// reads. The provider comes from the first length tensor given, else from `pv`
// / the process-wide override (there may be no tensor at all).
struct VllmQuantLightningIndexerMetadataArgs {
  int64_t num_heads_q = 64, num_heads_k = 1, head_dim = 128;
  int64_t query_quant_mode = 0, key_quant_mode = 0;
  std::optional<at::Tensor> actual_seq_lengths_query;  // int32 (B) cumulative ends
  std::optional<at::Tensor> actual_seq_lengths_key;    // int32 (B) raw KV lengths
  int64_t batch_size = 0, max_seqlen_q = 0, max_seqlen_k = 0;
  c10::string_view layout_query = "TND", layout_key = "PA_BSND";
  int64_t sparse_count = 2048, sparse_mode = 3;
  int64_t pre_tokens = std::numeric_limits<int64_t>::max(), next_tokens = std::numeric_limits<int64_t>::max();
  int64_t cmp_ratio = 1;
  c10::string_view device = "npu";
};

at::Tensor vllm_quant_lightning_indexer_metadata(const VllmQuantLightningIndexerMetadataArgs& a,
                                                 Provider pv = Provider::Auto);

}  // namespace aar::ops
