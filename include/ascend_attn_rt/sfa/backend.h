// Static facts of the SFA backends (docs/design/sfa.md §2.1, §2.2, §2.3): the
// DeepSeek-V3.2 sparse attention backend ("ASCEND_SFA") and its indexer cache
// backend ("ASCEND_SFA_INDEXER", a separate KV-cache group that shares the
// main group's block ids and has no metadata of its own).
//
// Block sizes: upstream fixes the SFA kernel block at 128 (docs/design/sfa.md §2.1), and
// supported_block_sizes() reports exactly that: it is what an engine should
// allocate. For tests and small caches the runtime (the metadata builder, the
// cache-shape facts below) also takes any multiple of 16 in [16, 128]
// (is_builder_block_size): the kernels' page rows are multiples of 16, as the
// MLA backend allows 16..128.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <vector>

#include "ascend_attn_rt/core/backend.h"
#include "ascend_attn_rt/plan/workspace.h"

namespace aar::sfa {

// DeepSeek-V3.2 geometry (docs/design/sfa.md §1, docs/design/sparse.md §4): kv_lora_rank, qk_rope_head_dim,
// index_head_dim, the C8 quantisation tile.
inline constexpr int64_t kKvLoraRank = 512;
inline constexpr int64_t kRopeHeadDim = 64;
inline constexpr int64_t kIndexHeadDim = 128;
inline constexpr int64_t kC8Tile = 128;

struct Backend {
  // The declared facts (core/backend.h) of the "sfa" backend, registered with
  // the runtime; the indexer cache group (IndexerBackend,
  // IndexerMetadataBuilder) is part of it.
  static core::BackendFacts facts();
  static const char* name();  // "ASCEND_SFA"
  static const std::vector<int64_t>& supported_block_sizes();  // {128} (docs/design/sfa.md §2.1)
  static bool is_supported_block_size(int64_t block_size);     // == 128
  // What the runtime accepts (builder, shapes): multiples of 16 in [16, 128].
  static bool is_builder_block_size(int64_t block_size);
  // The graph (cudagraph) support level upstream declares: "UNIFORM_BATCH".
  static const char* graph_support();
  // SFA needs no decode/prefill reorder (docs/design/sfa.md §2.1): always false.
  static bool reorder_batch() { return false; }
  // The upstream get_kv_cache_shape: (num_blocks, block_size, num_kv_heads, head_size).
  static std::vector<int64_t> kv_cache_shape(int64_t num_blocks, int64_t block_size, int64_t num_kv_heads,
                                             int64_t head_size);
  // vLLM's get_kv_cache_stride_order for kv_cache_shape and every cache shape
  // below: the kernels read each cache as contiguous row-major memory, so the
  // identity (0, 1, 2, 3), or (0, 1, 2, 3, 4) with a leading num_layers
  // dimension (layers outermost).
  static std::vector<int64_t> kv_cache_stride_order(bool include_num_layers_dimension = false);
  // The main ("*.attn") cache tensors of one layer (docs/design/sfa.md §2.2): without SFA C8
  // the latent (nb, bs, 1, L) and rope (nb, bs, 1, R) caches; with SFA C8 one
  // packed (nb, bs, 1, L + 2R + 4L/128) byte cache ([k_nope int8/fp8 | k_pe as
  // bytes (bf16) | per-128-tile fp32 scales as bytes]: 656 for DeepSeek-V3.2).
  static std::vector<std::vector<int64_t>> main_cache_shapes(int64_t num_blocks, int64_t block_size, bool sfa_c8,
                                                             int64_t kv_lora_rank = kKvLoraRank,
                                                             int64_t qk_rope_head_dim = kRopeHeadDim);
  // Their dtypes: the model dtype (fp16/bf16) for both latent and rope
  // caches, or the C8 byte dtype (int8 on A2/A3, fp8 e4m3 on A5).
  static std::vector<at::ScalarType> main_cache_dtypes(bool sfa_c8, plan::DeviceKind device, at::ScalarType model_dtype);
  // int8 on A2/A3 (and 310P), Float8_e4m3fn on A5 (docs/design/sfa.md §2.2).
  static at::ScalarType c8_dtype(plan::DeviceKind device);
};

// docs/design/sfa.md §2.2: the forward's cache tuple, the main part followed by the indexer part.
struct ComposedKvCache {
  std::vector<at::Tensor> caches;   // the composed tuple
  int32_t indexer_k_index = -1;     // -1: the layer has no indexer (it reuses top-k)
  int32_t indexer_scale_index = -1; // -1: no indexer scale cache (LI C8 off or no indexer)
  int32_t num_main = 0;             // caches[0 .. num_main) are the main part
};

// Composes a layer's cache tuple (docs/design/sfa.md §2.2 table):
//   SFA C8 | LI C8 | main part            | indexer part        | tuple | k | scale
//   no     | no    | (k_nope, k_pe)       | (idx_k)             | 3     | 2 | -
//   yes    | no    | (packed)             | (idx_k)             | 2     | 1 | -
//   no     | yes   | (k_nope, k_pe)       | (idx_k, idx_scale)  | 4     | 2 | 3
//   yes    | yes   | (packed)             | (idx_k, idx_scale)  | 3     | 1 | 2
// An empty indexer part (a layer without an indexer) gives the main tuple.
// Checked (a ValueError naming main_kv_cache / indexer_kv_cache and the entry):
// tuple lengths; 4-D tensors with a head dimension of 1; dtypes (the main
// caches float and equal without SFA C8, int8 / fp8 e4m3 with it: the forward
// routes by dtype, docs/design/sfa.md §4.1; the indexer key float without LI C8, int8 / fp8
// with it, its scale (nb, bs, 1, 1) fp16 for int8 keys and fp32 for fp8 keys);
// the latent and rope caches' block geometry equal; the indexer's block size
// equal to the main one and its block count a positive multiple of it (DCP
// replicates the indexer cache dcp times, docs/design/sfa.md §2.3). The KV-offload 6-tuple
// (docs/design/sfa.md §2.2) is the offload variant's and is rejected here.
ComposedKvCache compose_kv_cache(const std::vector<at::Tensor>& main_kv_cache,
                                 const std::vector<at::Tensor>& indexer_kv_cache, bool sfa_c8, bool li_c8);

struct IndexerBackend {
  static const char* name();  // "ASCEND_SFA_INDEXER"
  static const std::vector<int64_t>& supported_block_sizes();  // {128}: the main group's block (docs/design/sfa.md §2.3)
  static const char* graph_support();                          // "UNIFORM_BATCH"
  // Same as Backend::kv_cache_shape.
  static std::vector<int64_t> kv_cache_shape(int64_t num_blocks, int64_t block_size, int64_t num_kv_heads,
                                             int64_t head_size);
  static std::vector<int64_t> kv_cache_stride_order(bool include_num_layers_dimension = false);
  // The indexer cache tensors (docs/design/sfa.md §2.3): k (nb * repl, bs, 1, index_head_dim)
  // and, with LI C8, scale (nb * repl, bs, 1, 1); repl = the DCP size (the
  // indexer cache is replicated on every DCP rank, docs/design/sfa.md §2.3), 1 otherwise.
  static std::vector<std::vector<int64_t>> cache_shapes(int64_t num_blocks, int64_t block_size, bool li_c8,
                                                        int64_t repl = 1, int64_t index_head_dim = kIndexHeadDim);
  // k: the model dtype without LI C8, int8 (A2/A3) / fp8 e4m3 (A5) with it;
  // scale: fp16 (A2/A3) / fp32 (A5).
  static std::vector<at::ScalarType> cache_dtypes(bool li_c8, plan::DeviceKind device, at::ScalarType model_dtype);
  // docs/design/sfa.md §2.3: repl * bs * (index_head_dim * sizeof(k dtype) + scale_dim * sizeof(scale dtype)),
  // scale_dim = 1 with LI C8, 0 otherwise.
  static int64_t page_bytes(int64_t block_size, bool li_c8, plan::DeviceKind device, at::ScalarType model_dtype,
                            int64_t repl = 1, int64_t index_head_dim = kIndexHeadDim);
};

}  // namespace aar::sfa
