// Context-parallel process-group layout and its checks (docs/design/cp.md §1.1).
#include "ascend_attn_rt/cp/plan/cp_groups.h"

#include <cstdint>

#include "ascend_attn_rt/errors.h"

namespace aar::plan {
namespace {

void check_positive(int32_t v, const char* name) { AAR_CHECK_ARG(v >= 1, name, "=", v, " must be >= 1"); }

struct Derived {
  int32_t kv_shard_size = 1;
  int32_t interleave = 1;
  bool overridden = false;
  int32_t num_q_heads = 0;
  int32_t num_kv_heads = 0;
};

Derived check_layout(const CpLayoutConfig& c) {
  check_positive(c.world_size, "world_size");
  check_positive(c.data_parallel_size, "data_parallel_size");
  check_positive(c.pipeline_parallel_size, "pipeline_parallel_size");
  check_positive(c.prefill_context_parallel_size, "prefill_context_parallel_size");
  check_positive(c.tensor_parallel_size, "tensor_parallel_size");
  check_positive(c.decode_context_parallel_size, "decode_context_parallel_size");
  const int32_t tp = c.tensor_parallel_size, wd = c.decode_context_parallel_size;
  const int32_t wp = c.prefill_context_parallel_size;
  const int64_t inner = static_cast<int64_t>(c.data_parallel_size) * c.pipeline_parallel_size * wp * tp;
  AAR_CHECK_ARG(c.world_size % inner == 0, "world_size=", c.world_size,
                " is not a multiple of data_parallel_size*pipeline_parallel_size*prefill_context_parallel_size*"
                "tensor_parallel_size = ",
                inner);
  // DCP reuses the TP ranks: one TP group splits into TP / Wd DCP groups.
  AAR_CHECK_ARG(tp % wd == 0, "decode_context_parallel_size=", wd, " must divide tensor_parallel_size=", tp);
  const bool mode_ok = c.pcp_kv_mode == PcpKvMode::Sharded || c.pcp_kv_mode == PcpKvMode::Replicated;
  AAR_CHECK_ARG(mode_ok, "pcp_kv_mode=", static_cast<int32_t>(c.pcp_kv_mode), " is not a PcpKvMode");
  if (wp > 1 && wd > 1 && c.pcp_kv_mode == PcpKvMode::Replicated) {
    throw_not_supported("pcp_kv_mode=Replicated (model-runner v2 PCP) with decode_context_parallel_size=", wd,
                        " > 1 is not supported (upstream raises NotImplementedError); use PcpKvMode::Sharded");
  }

  Derived d;
  AAR_CHECK_ARG(c.total_num_q_heads >= 1, "total_num_q_heads=", c.total_num_q_heads, " must be >= 1");
  AAR_CHECK_ARG(c.total_num_q_heads % tp == 0, "total_num_q_heads=", c.total_num_q_heads,
                " is not divisible by tensor_parallel_size=", tp);
  d.num_q_heads = c.total_num_q_heads / tp;
  if (c.use_mla) {
    AAR_CHECK_ARG(c.total_num_kv_heads == 0, "total_num_kv_heads=", c.total_num_kv_heads,
                  " must be 0 for MLA (one latent KV head shared by every TP rank)");
    d.num_kv_heads = 1;
  } else {
    const int32_t kv = c.total_num_kv_heads;
    AAR_CHECK_ARG(kv >= 1, "total_num_kv_heads=", kv, " must be >= 1 (GQA/MHA)");
    AAR_CHECK_ARG(c.total_num_q_heads % kv == 0, "total_num_q_heads=", c.total_num_q_heads,
                  " is not divisible by total_num_kv_heads=", kv);
    if (tp >= kv) {
      AAR_CHECK_ARG(tp % kv == 0, "tensor_parallel_size=", tp, " is not divisible by total_num_kv_heads=", kv,
                    " (KV heads are replicated over TP ranks)");
    } else {
      AAR_CHECK_ARG(kv % tp == 0, "total_num_kv_heads=", kv, " is not divisible by tensor_parallel_size=", tp);
    }
    d.num_kv_heads = tp >= kv ? 1 : kv / tp;
    if (wd > 1) {
      // DCP shards the sequence in place of replicating a KV head: every rank of
      // a DCP group must hold the same KV head.
      AAR_CHECK_ARG(tp > kv, "tensor_parallel_size=", tp, " must be greater than total_num_kv_heads=", kv,
                    " for decode_context_parallel_size=", wd, " > 1 (GQA/MQA)");
      const int32_t replicas = tp / kv;
      AAR_CHECK_ARG(wd <= replicas, "decode_context_parallel_size=", wd,
                    " exceeds tensor_parallel_size / total_num_kv_heads = ", tp, "/", kv, " = ", replicas);
      const int32_t q_per_kv = c.total_num_q_heads / kv;
      AAR_CHECK_ARG(q_per_kv % wd == 0, "total_num_q_heads / total_num_kv_heads = ", q_per_kv,
                    " is not divisible by decode_context_parallel_size=", wd);
      AAR_CHECK_ARG(replicas % wd == 0, "decode_context_parallel_size=", wd,
                    " does not divide the KV-head replication tensor_parallel_size / total_num_kv_heads = ", tp,
                    "/", kv, " = ", replicas, ": a DCP group would span two KV heads");
    }
  }

  AAR_CHECK_ARG(c.block_size >= 1, "block_size=", c.block_size, " must be >= 1");
  AAR_CHECK_ARG(c.interleave_size >= 1, "interleave_size=", c.interleave_size, " must be >= 1");
  AAR_CHECK_ARG(c.interleave_size <= c.block_size, "interleave_size=", c.interleave_size,
                " exceeds block_size=", c.block_size);
  AAR_CHECK_ARG(c.block_size % c.interleave_size == 0, "block_size=", c.block_size,
                " is not a multiple of interleave_size=", c.interleave_size);
  const bool any_cp = static_cast<int64_t>(wd) * wp > 1;
  d.interleave = c.interleave_size;
  if (any_cp && c.sfa_sharded_indexer && d.interleave != c.block_size) {
    d.interleave = c.block_size;
    d.overridden = true;
  }
  AAR_CHECK_ARG(!(any_cp && c.has_kv_connector && d.interleave != c.block_size), "interleave_size=",
                d.interleave, " must equal block_size=", c.block_size,
                " with a KV connector and context parallelism (decode_context_parallel_size=", wd,
                ", prefill_context_parallel_size=", wp, ")");

  d.kv_shard_size = c.pcp_kv_mode == PcpKvMode::Sharded ? wp * wd : wd;
  AAR_CHECK_ARG(d.kv_shard_size <= kMaxCpMergePartitions, "the KV is sharded over ", d.kv_shard_size,
                " ranks (prefill_context_parallel_size=", wp, " x decode_context_parallel_size=", wd,
                "), more than the ", kMaxCpMergePartitions, " partials npu_attention_update merges");
  return d;
}

}  // namespace

void validate_cp_layout(const CpLayoutConfig& cfg) { (void)check_layout(cfg); }

CpRankPlace cp_rank_place(const CpLayoutConfig& cfg, int32_t global_rank) {
  const Derived d = check_layout(cfg);
  AAR_CHECK_ARG(global_rank >= 0 && global_rank < cfg.world_size, "global_rank=", global_rank,
                " is out of range [0, ", cfg.world_size, ")");
  const int32_t tp = cfg.tensor_parallel_size, wd = cfg.decode_context_parallel_size;
  const int32_t wp = cfg.prefill_context_parallel_size;
  CpRankPlace p;
  p.global_rank = global_rank;
  p.tp_size = tp;
  p.tp_rank = global_rank % tp;
  p.dcp_size = wd;
  p.dcp_rank = p.tp_rank % wd;  // == global_rank % wd, because wd | tp
  p.pcp_size = wp;
  p.pcp_rank = (global_rank / tp) % wp;
  p.tp_group = global_rank / tp;
  p.dcp_group = global_rank / wd;
  // transpose(PCP, TP).reshape(-1, Wp): one group per (outer index, TP index).
  p.pcp_group = (global_rank / (tp * wp)) * tp + p.tp_rank;
  p.kv_shard_size = d.kv_shard_size;
  p.kv_shard_rank = cfg.pcp_kv_mode == PcpKvMode::Sharded ? p.pcp_rank * wd + p.dcp_rank : p.dcp_rank;
  p.block_size = cfg.block_size;
  p.interleave_size = d.interleave;
  p.interleave_overridden = d.overridden;
  p.num_q_heads = d.num_q_heads;
  p.num_kv_heads = d.num_kv_heads;
  p.num_gathered_q_heads = d.num_q_heads * wd;
  p.num_decode_partials = d.kv_shard_size;
  return p;
}

int32_t cp_group_size(const CpLayoutConfig& cfg, CpGroupKind kind) {
  switch (kind) {
    case CpGroupKind::Tp: return cfg.tensor_parallel_size;
    case CpGroupKind::Dcp: return cfg.decode_context_parallel_size;
    case CpGroupKind::Pcp: return cfg.prefill_context_parallel_size;
  }
  throw_invalid("kind=", static_cast<int32_t>(kind), " is not a CpGroupKind");
}

int32_t cp_num_groups(const CpLayoutConfig& cfg, CpGroupKind kind) {
  validate_cp_layout(cfg);
  return cfg.world_size / cp_group_size(cfg, kind);
}

void cp_group_ranks(const CpLayoutConfig& cfg, CpGroupKind kind, int32_t group_index, Span<int32_t> ranks_out) {
  const int32_t n = cp_num_groups(cfg, kind);
  const int32_t size = cp_group_size(cfg, kind);
  AAR_CHECK_ARG(group_index >= 0 && group_index < n, "group_index=", group_index, " is out of range [0, ", n,
                ")");
  AAR_CHECK_ARG(ranks_out.size() >= static_cast<std::size_t>(size), "ranks_out has room for ", ranks_out.size(),
                " entries, the group has ", size);
  const int32_t tp = cfg.tensor_parallel_size, wp = cfg.prefill_context_parallel_size;
  if (kind == CpGroupKind::Pcp) {
    const int32_t outer = group_index / tp, t = group_index % tp;
    for (int32_t k = 0; k < size; ++k) ranks_out[k] = outer * wp * tp + k * tp + t;
  } else {
    for (int32_t k = 0; k < size; ++k) ranks_out[k] = group_index * size + k;
  }
}

int32_t cp_max_blocks_per_request(int64_t max_model_len, int32_t block_size, int32_t kv_shard_size) {
  AAR_CHECK_ARG(max_model_len >= 0, "max_model_len=", max_model_len, " is negative");
  AAR_CHECK_ARG(block_size >= 1, "block_size=", block_size, " must be >= 1");
  AAR_CHECK_ARG(kv_shard_size >= 1, "kv_shard_size=", kv_shard_size, " must be >= 1");
  const int64_t vb = static_cast<int64_t>(block_size) * kv_shard_size;
  // Ceil division without max_model_len + vb - 1, which overflows near INT64_MAX (fuzz_cp_groups).
  const int64_t blocks = max_model_len / vb + (max_model_len % vb != 0);
  AAR_CHECK_ARG(blocks <= INT32_MAX, "max_model_len=", max_model_len, " needs ", blocks,
                " blocks, beyond int32");
  return static_cast<int32_t>(blocks);
}

}  // namespace aar::plan
