// DeepSeek-V4 shared-KV sparse attention (vllm-ascend's npu_sparse_attn_sharedkv, its
// A5 kv-quant form over 640-byte MXFP8 rows, and their tiling-metadata operators):
// one KV head whose rows are key and value, a sliding window of raw rows (or DSpark's
// explicit slots), causal compressed rows (all, or a top-k), per-head sinks in the
// denominator. Lengths are device int32 tensors. Semantics: docs/design/dsa.md §1.4,
// twin decisions docs/design/ops.md §4.6.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/string_view.h>

#include <cstdint>
#include <optional>
#include <tuple>

#include "ascend_attn_rt/ops/provider.h"

namespace aar::ops {

struct SparseAttnSharedKvArgs {
  at::Tensor q;                                 // (T, N, D) "TND" or (B, S, N, D) "BSND"
  std::optional<at::Tensor> ori_kv, cmp_kv;     // (num_blocks, block_size, 1, D) paged ("PA_ND")
  std::optional<at::Tensor> ori_sparse_indices; // (T, 1, K) int32 physical slots (DSpark), -1 = none
  std::optional<at::Tensor> cmp_sparse_indices; // (T, 1, K) int32 compressed-row ids (C4), -1 = none
  std::optional<at::Tensor> ori_block_table, cmp_block_table;  // (B, cols) int32
  std::optional<at::Tensor> cu_seqlens_q;       // (B + 1) int32, "TND" only
  std::optional<at::Tensor> cu_seqlens_ori_kv, cu_seqlens_cmp_kv;  // A2/A3 pass them; unused by PA_ND (see twin)
  std::optional<at::Tensor> seqused_q;          // NotSupported by the CPU twin
  std::optional<at::Tensor> seqused_kv;         // (B) int32 raw lengths S_b
  std::optional<at::Tensor> sinks;             // (N) fp32
  std::optional<at::Tensor> metadata;           // (1024) int32 from sparse_attn_sharedkv_metadata
  double softmax_scale = 0.0;                   // must be set (> 0), DSV4: 512^-0.5
  int64_t cmp_ratio = 0;                        // >= 2 with cmp_kv; 0 or 1 without
  int64_t ori_mask_mode = 4, cmp_mask_mode = 3;
  int64_t ori_win_left = 127, ori_win_right = 0;  // DSV4: W - 1, 0 (the schema's default left is 128)
  c10::string_view layout_q = "TND", layout_kv = "PA_ND";
  bool return_softmax_lse = false;
};

// Returns (out, softmax_lse): out has q's shape and dtype. softmax_lse, which
// upstream documents as unsupported (garbage), is defined by the CPU twin as
// the log of the full denominator, lse = m + log(e^(sink - m) + sum_j e^(l_j - m))
// (the sink included, so out = sum_j e^(l_j - lse) k_j), fp32 with q's shape
// minus the last dim; -inf for an empty row without a sink. Without
// return_softmax_lse it is an empty fp32 tensor.
std::tuple<at::Tensor, at::Tensor> sparse_attn_sharedkv(const SparseAttnSharedKvArgs& a,
                                                        Provider pv = Provider::Auto);

struct SparseAttnSharedKvMetadataArgs {
  int64_t num_heads_q = 0, num_heads_kv = 1, head_dim = 512;
  std::optional<at::Tensor> cu_seqlens_q, cu_seqlens_ori_kv, cu_seqlens_cmp_kv, seqused_q, seqused_kv;
  int64_t batch_size = 0, max_seqlen_q = 0, max_seqlen_kv = 0, ori_topk = 0, cmp_topk = 0;
  int64_t cmp_ratio = 4, ori_mask_mode = 4, cmp_mask_mode = 3, ori_win_left = 127, ori_win_right = 0;
  c10::string_view layout_q = "TND", layout_kv = "PA_ND";
  bool has_ori_kv = true, has_cmp_kv = true;
  c10::string_view device = "npu";
};

// The (1024,) int32 tiling blob the attention kernel reads (docs/design/dsa.md §3.5). It must
// be regenerated whenever the lengths change and copied into an address-stable
// buffer for graph replay. The provider is picked from the first given length
// tensor (cu_seqlens_q, seqused_kv, cu_seqlens_ori_kv, cu_seqlens_cmp_kv,
// seqused_q), or `pv` / the process-wide override when none is given. The CPU
// twin's blob is deterministic but opaque: see sparse_attn_sharedkv_cpu.cpp.
at::Tensor sparse_attn_sharedkv_metadata(const SparseAttnSharedKvMetadataArgs& a, Provider pv = Provider::Auto);

// ---- A5: npu_kv_quant_sparse_attn_sharedkv (+ _metadata). The caches hold the
// 640-byte FP8 rows written by kv_compress_epilog (docs/design/dsa.md §1.4):
//   [448 fp8-e4m3 nope | 64 bf16 rope (128 B) | 7 e8m0 scales | 57 pad]
// dequantised as nope[d] = fp8[d] * 2^(e8m0[d / 64] - 127) (e8m0 255 = NaN),
// rope = the bf16 values; q is (.., 512) = [nope | rope]. Otherwise exactly the
// semantics above. The CPU twin takes kv_quant_mode 1, tile_size 64 and
// rope_head_dim 64 only (the A5 call), and caches of any 1-byte dtype
// (float8_e4m3fn, uint8, int8) shaped (num_blocks, block_size, 1, 640).
struct KvQuantSparseAttnSharedKvArgs {
  SparseAttnSharedKvArgs base;  // ori_kv / cmp_kv: the 640-byte row caches
  int64_t kv_quant_mode = 1, tile_size = 64, rope_head_dim = 64;
};

std::tuple<at::Tensor, at::Tensor> kv_quant_sparse_attn_sharedkv(const KvQuantSparseAttnSharedKvArgs& a,
                                                                 Provider pv = Provider::Auto);

struct KvQuantSparseAttnSharedKvMetadataArgs {
  SparseAttnSharedKvMetadataArgs base;  // `device` is an argument of this schema too
  int64_t kv_quant_mode = 1, tile_size = 64, rope_head_dim = 64;
};

at::Tensor kv_quant_sparse_attn_sharedkv_metadata(const KvQuantSparseAttnSharedKvMetadataArgs& a,
                                                  Provider pv = Provider::Auto);

}  // namespace aar::ops
