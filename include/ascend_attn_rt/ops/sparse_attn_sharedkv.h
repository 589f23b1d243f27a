// DeepSeek-V4 (DSA) shared-KV sparse attention, vllm-ascend's
// _C_ascend::npu_sparse_attn_sharedkv and its tiling-metadata operator
// npu_sparse_attn_sharedkv_metadata (spec sparse.md 1.6.3, 6.7, 6.8, 9, 12.7).
//
// One KV head whose rows are both key and value (V = K, D = 512 in DSV4). For
// query row i of request b (rows cu_seqlens_q[b] .. cu_seqlens_q[b+1]), with
// S_b = seqused_kv[b] and q_b its query count, the absolute position is
// p = S_b - q_b + i, and the row attends over
//   - original (sliding-window) keys: raw positions
//     [max(0, p - ori_win_left), min(S_b - 1, p + ori_win_right)] of ori_kv,
//     token s at ori_block_table[b][s / bs], offset s % bs (ori_mask_mode 4);
//     or, when ori_sparse_indices (T, 1, K) is given (DSpark drafts, spec
//     6.6), exactly its entries as PHYSICAL slots block * bs + offset (-1
//     skipped, duplicates count twice, the window is then not applied);
//   - compressed keys (cmp_kv given, cmp_mask_mode 3): row c is visible iff
//     c < floor((p + 1) / cmp_ratio); all visible rows (C128) or only the
//     entries e of cmp_sparse_indices[t, 0, :] with 0 <= e < that limit (C4;
//     -1 and entries at or beyond the limit skipped, duplicates twice); row c
//     at cmp_block_table[b][c / bs_cmp], offset c % bs_cmp;
//   - a per-head sink logit sinks[h] (fp32) that joins the denominator only:
//     out[h] = sum_j e^(l_j - m) k_j / (e^(sinks[h] - m) + sum_j e^(l_j - m)),
//     m = max(max_j l_j, sinks[h]), l_j = softmax_scale * (q[h] . k_j).
// A row with no key gets a zero output. Accumulation is fp32.
//
// Lengths are DEVICE int32 tensors (cumulative cu_seqlens_q of length B + 1,
// per-request totals seqused_kv of length B; spec 11.1).
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

// The (1024,) int32 tiling blob the attention kernel reads (spec 6.7). It must
// be regenerated whenever the lengths change and copied into an address-stable
// buffer for graph replay. The provider is picked from the first given length
// tensor (cu_seqlens_q, seqused_kv, cu_seqlens_ori_kv, cu_seqlens_cmp_kv,
// seqused_q), or `pv` / the process-wide override when none is given. The CPU
// twin's blob is deterministic but opaque: see sparse_attn_sharedkv_cpu.cpp.
at::Tensor sparse_attn_sharedkv_metadata(const SparseAttnSharedKvMetadataArgs& a, Provider pv = Provider::Auto);

// ---- A5: npu_kv_quant_sparse_attn_sharedkv (+ _metadata). The caches hold the
// 640-byte FP8 rows written by kv_compress_epilog (spec 1.6.3):
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
