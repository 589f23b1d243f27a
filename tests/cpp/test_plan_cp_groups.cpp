// Context-parallel process-group layout (docs/design/cp.md §1.1): the groups against an
// explicit arange(world).reshape(ext, DP, PP, PCP, TP) grid, the rank places,
// and every configuration check.
#include <algorithm>
#include <set>
#include <vector>

#include "ascend_attn_rt/cp/plan/cp_groups.h"
#include "test_plan_util.h"

using namespace aar::plan;

namespace {

CpLayoutConfig gqa(int32_t tp, int32_t dcp, int32_t pcp = 1, int32_t q_heads = 32, int32_t kv_heads = 2) {
  CpLayoutConfig c;
  c.tensor_parallel_size = tp;
  c.decode_context_parallel_size = dcp;
  c.prefill_context_parallel_size = pcp;
  c.world_size = tp * pcp;
  c.total_num_q_heads = q_heads;
  c.total_num_kv_heads = kv_heads;
  c.block_size = 128;
  c.interleave_size = 1;
  return c;
}

std::vector<int32_t> members(const CpLayoutConfig& c, CpGroupKind kind, int32_t g) {
  std::vector<int32_t> out(cp_group_size(c, kind), -1);
  cp_group_ranks(c, kind, g, out);
  return out;
}

// The groups as upstream builds them, from the explicit 5-D grid.
std::vector<std::vector<int32_t>> grid_groups(const CpLayoutConfig& c, CpGroupKind kind) {
  const int32_t dp = c.data_parallel_size, pp = c.pipeline_parallel_size, pcp = c.prefill_context_parallel_size;
  const int32_t tp = c.tensor_parallel_size;
  const int32_t ext = c.world_size / (dp * pp * pcp * tp);
  // rank[e][d][p][q][t] = ((((e*dp + d)*pp + p)*pcp + q)*tp + t), enumerated in the
  // memory order of the tensor that reshape(-1, size) rows are cut from.
  std::vector<int32_t> flat;
  for (int32_t e = 0; e < ext; ++e)
    for (int32_t d = 0; d < dp; ++d)
      for (int32_t p = 0; p < pp; ++p) {
        if (kind == CpGroupKind::Pcp) {  // transpose(PCP, TP): TP outer, PCP inner
          for (int32_t t = 0; t < tp; ++t)
            for (int32_t q = 0; q < pcp; ++q) flat.push_back((((e * dp + d) * pp + p) * pcp + q) * tp + t);
        } else {
          for (int32_t q = 0; q < pcp; ++q)
            for (int32_t t = 0; t < tp; ++t) flat.push_back((((e * dp + d) * pp + p) * pcp + q) * tp + t);
        }
      }
  const int32_t size = kind == CpGroupKind::Tp ? tp : kind == CpGroupKind::Dcp ? c.decode_context_parallel_size : pcp;
  std::vector<std::vector<int32_t>> groups;
  for (std::size_t i = 0; i < flat.size(); i += size) groups.emplace_back(flat.begin() + i, flat.begin() + i + size);
  return groups;
}

}  // namespace

TEST(PlanCpGroups, GroupsMatchTheUpstreamGrid) {
  struct Shape {
    int32_t ext, dp, pp, pcp, tp, dcp;
  };
  const Shape shapes[] = {{1, 1, 1, 1, 4, 2}, {1, 1, 1, 2, 4, 2}, {2, 2, 1, 3, 2, 2},
                          {1, 2, 2, 2, 8, 4}, {1, 1, 1, 4, 1, 1}, {3, 1, 2, 1, 4, 4}};
  for (const Shape& s : shapes) {
    CpLayoutConfig c = gqa(s.tp, s.dcp, s.pcp, 64, 1);
    c.data_parallel_size = s.dp;
    c.pipeline_parallel_size = s.pp;
    c.world_size = s.ext * s.dp * s.pp * s.pcp * s.tp;
    for (CpGroupKind kind : {CpGroupKind::Tp, CpGroupKind::Dcp, CpGroupKind::Pcp}) {
      const auto want = grid_groups(c, kind);
      ASSERT_EQ(cp_num_groups(c, kind), static_cast<int32_t>(want.size()));
      for (int32_t g = 0; g < cp_num_groups(c, kind); ++g) ASSERT_EQ(members(c, kind, g), want[g]);
    }
    // Each rank's place agrees with the group lists.
    for (int32_t r = 0; r < c.world_size; ++r) {
      const CpRankPlace p = cp_rank_place(c, r);
      ASSERT_EQ(members(c, CpGroupKind::Tp, p.tp_group)[p.tp_rank], r);
      ASSERT_EQ(members(c, CpGroupKind::Dcp, p.dcp_group)[p.dcp_rank], r);
      ASSERT_EQ(members(c, CpGroupKind::Pcp, p.pcp_group)[p.pcp_rank], r);
      // A DCP group lies inside one TP group.
      for (int32_t m : members(c, CpGroupKind::Dcp, p.dcp_group)) ASSERT_EQ(m / s.tp, r / s.tp);
      ASSERT_EQ(p.kv_shard_size, s.pcp * s.dcp);
      ASSERT_EQ(p.kv_shard_rank, p.pcp_rank * s.dcp + p.dcp_rank);
    }
  }
}

TEST(PlanCpGroups, RankPlaceFields) {
  // TP=8, 32 q heads, 2 KV heads (replicated 4x), DCP=4, legacy PCP=2: 16 ranks.
  CpLayoutConfig c = gqa(8, 4, 2);
  c.interleave_size = 64;
  const CpRankPlace p = cp_rank_place(c, 13);  // pcp 1, tp 5, dcp 1
  EXPECT_EQ(p.tp_rank, 5);
  EXPECT_EQ(p.pcp_rank, 1);
  EXPECT_EQ(p.dcp_rank, 1);
  EXPECT_EQ(p.dcp_group, 3);
  EXPECT_EQ(p.pcp_group, 5);
  EXPECT_EQ(p.kv_shard_size, 8);
  EXPECT_EQ(p.kv_shard_rank, 5);
  EXPECT_EQ(p.num_q_heads, 4);
  EXPECT_EQ(p.num_kv_heads, 1);
  EXPECT_EQ(p.num_gathered_q_heads, 16);
  EXPECT_EQ(p.num_decode_partials, 8);
  EXPECT_EQ(p.interleave_size, 64);
  EXPECT_FALSE(p.interleave_overridden);

  // Replicated-KV PCP (MRV2) without DCP: no KV sharding.
  CpLayoutConfig m = gqa(2, 1, 3, 8, 8);
  m.pcp_kv_mode = PcpKvMode::Replicated;
  const CpRankPlace q = cp_rank_place(m, 5);
  EXPECT_EQ(q.pcp_rank, 2);
  EXPECT_EQ(q.kv_shard_size, 1);
  EXPECT_EQ(q.kv_shard_rank, 0);
  EXPECT_EQ(q.num_kv_heads, 4);

  // MLA: one latent head, DCP = TP.
  CpLayoutConfig mla = gqa(4, 4, 1, 128, 0);
  mla.use_mla = true;
  const CpRankPlace ml = cp_rank_place(mla, 2);
  EXPECT_EQ(ml.num_q_heads, 32);
  EXPECT_EQ(ml.num_kv_heads, 1);
  EXPECT_EQ(ml.kv_shard_rank, 2);
  EXPECT_EQ(ml.num_gathered_q_heads, 128);
}

TEST(PlanCpGroups, GqaKvHeadConstraints) {
  validate_cp_layout(gqa(8, 2, 1, 32, 4));  // replication 2, DCP 2
  validate_cp_layout(gqa(4, 1, 1, 32, 8));  // no DCP: KV heads split over TP
  EXPECT_INVALID(validate_cp_layout(gqa(4, 2, 1, 32, 4)),
                 "tensor_parallel_size=4 must be greater than total_num_kv_heads=4 for decode_context_parallel_size=2");
  EXPECT_INVALID(validate_cp_layout(gqa(8, 4, 1, 32, 4)),
                 "decode_context_parallel_size=4 exceeds tensor_parallel_size / total_num_kv_heads = 8/4 = 2");
  // q per kv = 3, not divisible by 2.
  EXPECT_INVALID(validate_cp_layout(gqa(6, 2, 1, 6, 2)),
                 "total_num_q_heads / total_num_kv_heads = 3 is not divisible by decode_context_parallel_size=2");
  // Passes upstream's three checks (12 > 2, 4 <= 6, 12 % 4 == 0), but the DCP
  // group of ranks 4..7 would hold KV heads 0 (ranks 0..5) and 1: rejected here.
  EXPECT_INVALID(validate_cp_layout(gqa(12, 4, 1, 24, 2)),
                 "does not divide the KV-head replication tensor_parallel_size / total_num_kv_heads = 12/2 = 6");
  EXPECT_INVALID(validate_cp_layout(gqa(8, 2, 1, 30, 2)), "total_num_q_heads=30 is not divisible by tensor_parallel_size=8");
  EXPECT_INVALID(validate_cp_layout(gqa(8, 1, 1, 32, 3)), "total_num_q_heads=32 is not divisible by total_num_kv_heads=3");
  EXPECT_INVALID(validate_cp_layout(gqa(8, 1, 1, 48, 3)), "tensor_parallel_size=8 is not divisible by total_num_kv_heads=3");
  EXPECT_INVALID(validate_cp_layout(gqa(4, 1, 1, 48, 6)), "total_num_kv_heads=6 is not divisible by tensor_parallel_size=4");
  EXPECT_INVALID(validate_cp_layout(gqa(4, 1, 1, 32, 0)), "total_num_kv_heads=0 must be >= 1 (GQA/MHA)");
  EXPECT_INVALID(validate_cp_layout(gqa(4, 1, 1, 0, 1)), "total_num_q_heads=0 must be >= 1");
  CpLayoutConfig mla = gqa(4, 2, 1, 16, 16);
  mla.use_mla = true;
  EXPECT_INVALID(validate_cp_layout(mla), "total_num_kv_heads=16 must be 0 for MLA");
}

TEST(PlanCpGroups, SizeChecks) {
  EXPECT_INVALID(validate_cp_layout(gqa(8, 3, 1, 48, 1)), "decode_context_parallel_size=3 must divide tensor_parallel_size=8");
  CpLayoutConfig c = gqa(4, 2);
  c.world_size = 6;
  EXPECT_INVALID(validate_cp_layout(c), "world_size=6 is not a multiple of");
  c = gqa(4, 2);
  c.decode_context_parallel_size = 0;
  EXPECT_INVALID(validate_cp_layout(c), "decode_context_parallel_size=0 must be >= 1");
  c = gqa(4, 2);
  c.prefill_context_parallel_size = -1;
  EXPECT_INVALID(validate_cp_layout(c), "prefill_context_parallel_size=-1 must be >= 1");
  c = gqa(4, 2);
  c.data_parallel_size = 0;
  EXPECT_INVALID(validate_cp_layout(c), "data_parallel_size=0");
  c = gqa(4, 2);
  c.pcp_kv_mode = static_cast<PcpKvMode>(7);
  EXPECT_INVALID(validate_cp_layout(c), "pcp_kv_mode=7 is not a PcpKvMode");
  // Replicated PCP with DCP: NotSupported, as upstream HEAD.
  c = gqa(4, 2, 2);
  c.pcp_kv_mode = PcpKvMode::Replicated;
  EXPECT_THROW(validate_cp_layout(c), aar::NotSupported);
  // npu_attention_update merges at most 16 partials: legacy PCP 4 x DCP 8 is 32.
  CpLayoutConfig big = gqa(8, 8, 4, 64, 1);
  EXPECT_INVALID(validate_cp_layout(big), "the KV is sharded over 32 ranks");
  validate_cp_layout(gqa(8, 4, 4, 64, 1));  // 16 is fine
  EXPECT_INVALID(cp_rank_place(gqa(4, 2), 4), "global_rank=4 is out of range [0, 4)");
  std::vector<int32_t> two(2);
  EXPECT_INVALID(cp_group_ranks(gqa(4, 2), CpGroupKind::Dcp, 2, two), "group_index=2 is out of range [0, 2)");
  std::vector<int32_t> one(1);
  EXPECT_INVALID(cp_group_ranks(gqa(4, 2), CpGroupKind::Dcp, 0, one), "ranks_out has room for 1 entries, the group has 2");
}

TEST(PlanCpGroups, BlockSizeAndInterleaveRules) {
  CpLayoutConfig c = gqa(4, 2);
  c.block_size = 128;
  for (int32_t il : {1, 2, 64, 128}) {
    c.interleave_size = il;
    validate_cp_layout(c);
  }
  c.interleave_size = 256;
  EXPECT_INVALID(validate_cp_layout(c), "interleave_size=256 exceeds block_size=128");
  c.interleave_size = 48;
  EXPECT_INVALID(validate_cp_layout(c), "block_size=128 is not a multiple of interleave_size=48");
  c.interleave_size = 0;
  EXPECT_INVALID(validate_cp_layout(c), "interleave_size=0 must be >= 1");
  c.interleave_size = 1;
  c.block_size = 0;
  EXPECT_INVALID(validate_cp_layout(c), "block_size=0 must be >= 1");

  // A KV connector with CP needs I == B.
  c = gqa(4, 2);
  c.has_kv_connector = true;
  c.interleave_size = 16;
  EXPECT_INVALID(validate_cp_layout(c), "interleave_size=16 must equal block_size=128 with a KV connector");
  c.interleave_size = 128;
  validate_cp_layout(c);
  CpLayoutConfig no_cp = gqa(4, 1);
  no_cp.has_kv_connector = true;
  no_cp.interleave_size = 16;
  validate_cp_layout(no_cp);  // no context parallelism: no rule

  // SFA with a sharded indexer: I becomes B (which then satisfies a connector).
  CpLayoutConfig s = gqa(4, 2);
  s.sfa_sharded_indexer = true;
  s.has_kv_connector = true;
  s.interleave_size = 1;
  const CpRankPlace p = cp_rank_place(s, 1);
  EXPECT_EQ(p.interleave_size, 128);
  EXPECT_TRUE(p.interleave_overridden);
  s.decode_context_parallel_size = 1;
  s.has_kv_connector = false;
  EXPECT_EQ(cp_rank_place(s, 1).interleave_size, 1);  // no CP: not overridden
}

TEST(PlanCpGroups, MaxBlocksPerRequest) {
  // ceil(max_model_len / (B * W)).
  EXPECT_EQ(cp_max_blocks_per_request(4096, 128, 1), 32);
  EXPECT_EQ(cp_max_blocks_per_request(4096, 128, 4), 8);
  EXPECT_EQ(cp_max_blocks_per_request(4097, 128, 4), 9);
  EXPECT_EQ(cp_max_blocks_per_request(0, 16, 2), 0);
  EXPECT_INVALID(cp_max_blocks_per_request(-1, 16, 2), "max_model_len=-1");
  EXPECT_INVALID(cp_max_blocks_per_request(10, 0, 2), "block_size=0");
  EXPECT_INVALID(cp_max_blocks_per_request(10, 16, 0), "kv_shard_size=0");
}
