// The DeepSeek-V4 (DSA) compressor operators of vllm-ascend's `_C_ascend` (issue
// 12; spec sparse.md 1.6.1, 1.6.2 step 2, 1.6.3, 6.2, 7.1, 9): `compressor`,
// `compressor_metadata` (and its `_out` form), `kv_compress_epilog` and
// `indexer_compress_epilog_v2`. One typed wrapper per operator; the provider is
// picked from the first tensor's device (or `pv`). Only vllm-ascend provides
// these operators (OpLibrary::VllmAscend is implied).
//
// ---- compressor (1.6.1)
// Per token t of request b (raw position p = start_pos[b] + i):
//   kv_t = x_t W_kv^T,  score_t = x_t W_gate^T + ape[p mod r]       (width coff*D)
// Compressed row c covers raw positions [c r, (c+1) r) and is emitted in the step
// that processes position (c+1) r - 1. coff = 1: per feature d, softmax over the
// group's r scores, y[d] = sum_k a_k kv_k[d]. coff = 2: 2r entries, group c-1's
// tokens with columns [0, D) then group c's with [D, 2D); for c = 0 the c-1
// entries are kv 0, score -inf. Then y = RMSNorm(y) * norm_weight (norm_eps) and
// interleaved RoPE on the last rope_head_dim dims (pairs (2i, 2i+1), tables
// already repeat-interleaved: y0 = x0 c0 - x1 s0, y1 = x1 c1 + x0 s1).
//
// Decisions where the spec is silent (the CPU twin implements them; [verify] on
// hardware):
// - RoPE rows: output row j uses rope_cos / rope_sin row j, i.e. the tables are
//   the (compress_cos, compress_sin) that compressor_metadata produced for the
//   same step (row j = the full table's row c r of the j-th emitted row; an
//   invalid metadata row carries cos 1 / sin 0, the identity). Any shape whose
//   last dim is rope_head_dim ((rows, R) or (rows, 1, 1, R)); rows >= emitted rows.
// - Lengths: cu_seqlens (B+1, query_start_loc, cu[0] = 0, non-decreasing,
//   cu[B] <= T: trailing tokens (graph padding) belong to no request) is
//   required. Each request's context is start_pos[b] (= S_b - q_b, spec 6.5) or,
//   when only seqused is given, seqused[b] - q_b with seqused[b] = S_b, the
//   request's total length including this step's tokens (as seqused_kv of the
//   attention operator); when both are given they must agree.
// - State cache (fp32 (nb, sbs, 2 coff D), per raw position [kv | score]):
//   raw position p of request b lives at block state_block_table[b][p / sbs],
//   row p % sbs (sbs = state_cache.size(1)). Every position processed in the
//   step is written (not only the tail a later step needs), so a step that
//   re-processes positions (speculative tokens rolled back) finds its earlier
//   positions intact. Positions before start_pos that the step's completed
//   groups need ([(c - coff + 1) r, start_pos)) are read from it. Only the
//   table entries the step touches are checked (a sliding-window table may hold
//   anything elsewhere); they must be in [0, nb). state_block_table is required.
// - Precision (CPU twin): projections accumulate in float64 and the raw entries
//   are rounded to fp32 (what the state holds) before use, so a row does not
//   depend on how a prefill was chunked; the group maths is float64, the output
//   is cast to x's dtype.
// - Output (min(T, T // r + B), D) in x's dtype: request b's rows
//   ((S_b // r) - (start_b // r) of them) in request order, then zero rows.
// - rotary_mode 2 (interleave) and cache_mode 1 (paged state) only.
//
// ---- compressor_metadata (spec 9, bit-exact pseudocode)
// For requests b < num_reqs_actual with start_pos >= 0 and q_b > 0 (others emit
// nothing): rows c = start_b // r ... (start_b + q_b) // r - 1, in request order,
// truncated to num_compressed_tokens. Row c is valid iff c // kv_block_size <
// table cols, c r < rope_cos rows and table[b][c // kv_block_size] >= 0; then
// cos/sin = full row c r and the slot is (table[b][c // bs], c % bs)
// (slot_mapping_format 2, BLOCK_OFFSET, (rows, 2)) or table[b][c // bs] * bs +
// c % bs (format 1, FLAT, (rows)); otherwise cos 1, sin 0, slot (-1, bs - 1) or
// -1. kv_block_size is the PHYSICAL storage block size (geometry rule 6.2), the
// table the scheduler's logical one. Outputs: cos / sin (rows, 1, 1, R) in the
// tables' dtype, slots int32.
//
// ---- kv_compress_epilog (A5, 1.6.3 last bullet)
// x (N, 512) bf16 rows are MXFP8-quantised and scattered into 640-byte cache
// rows [448 fp8 e4m3 nope | 64 bf16 rope (128 B) | 7 ue8m0 scales | 57 zero pad]:
// per group of 64 nope elements, e = clamp(ceil(log2(amax / 448)), -127, 127),
// scale byte e + 127, fp8 = RNE(x / 2^e) ([verify] the scale rounding on
// hardware). slot_mapping (N) flat rows of the cache ((rows, 1, 640), one-byte
// dtype); slot -1 is skipped. quant_group_size 64, quant_mode 2 (MXFP8),
// round_scale_flag true, layout 1 only.
//
// ---- indexer_compress_epilog_v2 (A5, 1.6.2 step 2, 6.2)
// x (N, Di) rows quantised per row to fp8 e4m3 with an fp32 scale = amax / 448
// (0 for an all-zero row) and written by slot (block s / bs, row s % bs) into
// the indexer cache's "full" byte view (nb, bs, 1, Di + 4), whose page holds
// layout 2 (block-separated): bs rows of Di fp8 bytes, then bs fp32 scales.
// Slot -1 is skipped.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <tuple>

#include "ascend_attn_rt/ops/provider.h"

namespace aar::ops {

struct CompressorArgs {
  at::Tensor x;            // (T, H)
  at::Tensor wkv, wgate;   // (coff * D, H)
  at::Tensor state_cache;  // (nb, sbs, 2 * coff * D) fp32, read and written
  at::Tensor ape;          // (r, coff * D) fp32
  at::Tensor norm_weight;  // (D)
  at::Tensor rope_sin, rope_cos;                 // per output row, last dim rope_head_dim
  std::optional<at::Tensor> state_block_table;   // int32 (>= B, cols)
  std::optional<at::Tensor> cu_seqlens;          // int32 (B + 1)
  std::optional<at::Tensor> seqused;             // int32 (B): S_b
  std::optional<at::Tensor> start_pos;           // int32 (B): S_b - q_b
  int64_t rope_head_dim = 64, cmp_ratio = 4, coff = 2;
  double norm_eps = 1e-6;
  int64_t rotary_mode = 2, cache_mode = 1;
};

// Returns the compressed rows (min(T, T // r + B), D); updates state_cache.
at::Tensor compressor(const CompressorArgs& a, Provider pv = Provider::Auto);

// Slot formats of compressor_metadata (spec 7.1).
enum class CompressedSlotFormat : int64_t { Flat = 1, BlockOffset = 2 };

struct CompressorMetadataArgs {
  at::Tensor rope_cos, rope_sin;  // full tables (max_pos, R)
  at::Tensor cu_seqlens;          // int32 (B + 1)
  at::Tensor start_pos;           // int32 (B)
  at::Tensor kv_block_table;      // int32 (B, cols), logical
  int64_t kv_block_size = 128;    // physical storage block size
  CompressedSlotFormat slot_mapping_format = CompressedSlotFormat::BlockOffset;
  int64_t compress_ratio = 4;
  int64_t num_reqs_actual = 0;
};

// Returns (compress_cos (rows, 1, 1, R), compress_sin, slot_mapping (rows, 2) or
// (rows)) with rows = num_compressed_tokens.
std::tuple<at::Tensor, at::Tensor, at::Tensor> compressor_metadata(const CompressorMetadataArgs& a,
                                                                   int64_t num_compressed_tokens,
                                                                   Provider pv = Provider::Auto);

// The same into caller buffers (rows = compress_cos.size(0)); returns nothing new.
void compressor_metadata_out(const CompressorMetadataArgs& a, at::Tensor& compress_cos, at::Tensor& compress_sin,
                             at::Tensor& slot_mapping, Provider pv = Provider::Auto);

struct KvCompressEpilogArgs {
  at::Tensor kv_compress_cache;  // (rows, 1, 640) one-byte dtype, written
  at::Tensor x;                  // (N, 512) bf16
  at::Tensor slot_mapping;       // (N) flat rows, -1 skipped
  int64_t quant_group_size = 64, quant_mode = 2;
  bool round_scale_flag = true;
  int64_t layout = 1;
};

void kv_compress_epilog(const KvCompressEpilogArgs& a, Provider pv = Provider::Auto);

struct IndexerCompressEpilogArgs {
  at::Tensor indexer_compress_cache;  // (nb, bs, 1, Di + 4) byte view of the pages, written
  at::Tensor x;                       // (N, Di)
  at::Tensor slot_mapping;            // (N) flat slots, -1 skipped
  int64_t layout = 2;
};

void indexer_compress_epilog_v2(const IndexerCompressEpilogArgs& a, Provider pv = Provider::Auto);

}  // namespace aar::ops
