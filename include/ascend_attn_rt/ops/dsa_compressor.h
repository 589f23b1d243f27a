// vllm-ascend's DeepSeek-V4 compressor operators: compressor (and its state cache),
// compressor_metadata (+ _out), kv_compress_epilog and indexer_compress_epilog_v2,
// one typed wrapper each; the provider is picked from the first tensor's device.
// Semantics, including the CPU twins' decisions where upstream is silent (RoPE rows,
// state positions, precision) and compressor_metadata's bit-exact rule:
// docs/design/dsa.md §1.2, docs/design/ops.md §4.6.
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

// Slot formats of compressor_metadata (docs/design/dsa.md §4.1).
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
