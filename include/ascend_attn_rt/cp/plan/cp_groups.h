// Context-parallel process-group layout: which ranks form the TP, DCP and PCP groups,
// the checks a TP / DCP / PCP configuration must pass (InvalidArgument, or
// NotSupported for replicated-KV PCP with DCP, naming the first offending field), and
// a rank's place in the layout (the W and r of the KV sharding). Torch-free.
// Design: docs/design/cp.md §1.1.
#pragma once

#include <cstdint>

#include "ascend_attn_rt/plan/span.h"

namespace aar::plan {

// npu_attention_update merges at most this many (out, lse) partitions.
inline constexpr int32_t kMaxCpMergePartitions = 16;

// Where the KV of prefill tokens lives when PCP > 1.
enum class PcpKvMode : int32_t {
  // Legacy model-runner v1 (docs/design/cp.md §6.1 / §6.3 / §6.4): the KV is sharded over all
  // W = Wp * Wd CP ranks, r = rp * Wd + rd. The normative head/tail design.
  Sharded = 0,
  // Model-runner v2 (docs/design/cp.md §6.2 / §6.5): every PCP rank holds the full KV; DCP must be 1.
  Replicated = 1,
};

struct CpLayoutConfig {
  int32_t world_size = 1;
  int32_t data_parallel_size = 1;
  int32_t pipeline_parallel_size = 1;
  int32_t prefill_context_parallel_size = 1;  // Wp
  int32_t tensor_parallel_size = 1;           // TP
  int32_t decode_context_parallel_size = 1;   // Wd, carved out of TP (adds no ranks)
  PcpKvMode pcp_kv_mode = PcpKvMode::Sharded;
  bool use_mla = false;
  int32_t total_num_q_heads = 0;   // model-wide query heads (> 0)
  int32_t total_num_kv_heads = 0;  // model-wide KV heads (> 0 for GQA/MHA, 0 for MLA)
  int32_t block_size = 0;          // physical KV block size B in tokens (> 0)
  int32_t interleave_size = 1;     // cp_kv_cache_interleave_size I
  bool has_kv_connector = false;   // P/D disaggregation or a KV pool
  // An SFA sparse model whose indexer cache is sharded with the KV (every mode
  // but the replicated indexer): I is overridden to B (upstream warns).
  bool sfa_sharded_indexer = false;
};

enum class CpGroupKind : int32_t { Tp = 0, Dcp = 1, Pcp = 2 };

// One rank's place in a validated layout.
struct CpRankPlace {
  int32_t global_rank = 0;
  int32_t tp_rank = 0, tp_size = 1;
  int32_t dcp_rank = 0, dcp_size = 1;  // rd, Wd
  int32_t pcp_rank = 0, pcp_size = 1;  // rp, Wp
  int32_t tp_group = 0, dcp_group = 0, pcp_group = 0;  // group indices (see cp_group_ranks)
  // The KV sharding of docs/design/cp.md §2.1: the token at position x lives on shard rank
  // floor(x / I) mod kv_shard_size. Sharded PCP: W = Wp*Wd, r = rp*Wd + rd;
  // otherwise W = Wd, r = rd.
  int32_t kv_shard_rank = 0, kv_shard_size = 1;
  int32_t block_size = 0;
  int32_t interleave_size = 1;        // effective I (after the SFA override)
  bool interleave_overridden = false;  // the SFA override changed I
  int32_t num_q_heads = 0;            // H per TP rank
  int32_t num_kv_heads = 0;           // Hkv per TP rank (replicated when TP > total KV heads; 1 for MLA)
  int32_t num_gathered_q_heads = 0;   // Wd * H: heads after the DCP all-gather of the query
  int32_t num_decode_partials = 1;    // partials merged per decode row: kv_shard_size
};

// Throws InvalidArgument (or NotSupported for the replicated-KV PCP with DCP)
// naming the first offending field and its value.
void validate_cp_layout(const CpLayoutConfig& cfg);

// validate_cp_layout, then the place of global_rank (0 <= global_rank < world_size).
CpRankPlace cp_rank_place(const CpLayoutConfig& cfg, int32_t global_rank);

// Number of groups of a kind (world / TP, world / Wd, world / Wp) and their size.
int32_t cp_num_groups(const CpLayoutConfig& cfg, CpGroupKind kind);
int32_t cp_group_size(const CpLayoutConfig& cfg, CpGroupKind kind);

// The global ranks of group `group_index` (ascending, group rank order) into
// ranks_out (>= group size entries). Validates the layout first.
void cp_group_ranks(const CpLayoutConfig& cfg, CpGroupKind kind, int32_t group_index, Span<int32_t> ranks_out);

// ceil(max_model_len / (block_size * kv_shard_size)): block-table columns a
// request needs under KV sharding (docs/design/cp.md §2.1, §2.3).
int32_t cp_max_blocks_per_request(int64_t max_model_len, int32_t block_size, int32_t kv_shard_size);

}  // namespace aar::plan
