#include <vector>

#include "ascend_attn_rt/plan/workspace.h"
#include "test_plan_util.h"

using namespace aar::plan;

TEST(PlanWorkspace, RoundUp) {
  EXPECT_EQ(round_up(5, 0), 0);
  EXPECT_EQ(round_up(0, 0), 0);
  EXPECT_EQ(round_up(0, 16), 0);
  EXPECT_EQ(round_up(1, 16), 16);
  EXPECT_EQ(round_up(16, 16), 16);
  EXPECT_EQ(round_up(17, 16), 32);
  EXPECT_EQ(round_up(129, 128), 256);
  EXPECT_EQ(round_up(7, 1), 7);
  // Integer ceiling for negative values too (ceil(-5/4) = -1).
  EXPECT_EQ(round_up(-5, 4), -4);
  EXPECT_EQ(round_up(-8, 4), -8);
  EXPECT_EQ(round_up(int64_t{1} << 40, 3), ((int64_t{1} << 40) + 2) / 3 * 3);
}

TEST(PlanWorkspace, ChunkedPrefillWorkspaceSize) {
  // max(min(max(8L, 4SB), 131072), SB)
  EXPECT_EQ(chunked_prefill_workspace_size(4096, 256, 128), 131072);   // 4SB hits the cap
  EXPECT_EQ(chunked_prefill_workspace_size(32768, 16, 128), 131072);   // 8L capped
  EXPECT_EQ(chunked_prefill_workspace_size(2048, 4, 16), 16384);       // 8L below the cap
  EXPECT_EQ(chunked_prefill_workspace_size(100, 64, 16), 4096);        // 4SB wins, below cap
  EXPECT_EQ(chunked_prefill_workspace_size(1024, 2048, 128), 262144);  // SB exceeds the cap
  EXPECT_EQ(chunked_prefill_workspace_size(0, 0, 0), 0);
  EXPECT_INVALID(chunked_prefill_workspace_size(-1, 1, 1), "max_model_len=-1");
  EXPECT_INVALID(chunked_prefill_workspace_size(1, -1, 1), "max_num_seqs=-1");
  EXPECT_INVALID(chunked_prefill_workspace_size(1, 1, -1), "block_size=-1");
}

TEST(PlanWorkspace, UsingPagedAttentionTable) {
  std::vector<int32_t> shapes = {1, 8, 32};
  PagedAttentionRule rule;
  rule.pa_shape_list = shapes;
  rule.full_decode_only_graph = true;

  // Row 5: membership.
  EXPECT_TRUE(using_paged_attention(8, rule));
  EXPECT_FALSE(using_paged_attention(16, rule));
  rule.device = DeviceKind::A3;
  EXPECT_TRUE(using_paged_attention(32, rule));

  // Row 4: not FULL_DECODE_ONLY.
  rule.full_decode_only_graph = false;
  EXPECT_FALSE(using_paged_attention(8, rule));
  // Row 3 beats row 4: head 512 forces PA on A2/A3 even in eager mode.
  EXPECT_TRUE(using_paged_attention(1, rule, 512));
  rule.device = DeviceKind::A2;
  EXPECT_TRUE(using_paged_attention(1, PagedAttentionRule{}, 512));  // upstream test vector
  EXPECT_FALSE(using_paged_attention(1, PagedAttentionRule{}, 128));
  EXPECT_FALSE(using_paged_attention(1, PagedAttentionRule{}));

  // Row 2: A5 never uses PA.
  rule.device = DeviceKind::A5;
  rule.full_decode_only_graph = true;
  EXPECT_FALSE(using_paged_attention(8, rule));
  EXPECT_FALSE(using_paged_attention(8, rule, 512));

  // Row 1: speculative config wins over everything.
  rule.device = DeviceKind::A2;
  rule.has_speculative_config = true;
  EXPECT_FALSE(using_paged_attention(8, rule));
  EXPECT_FALSE(using_paged_attention(8, rule, 512));

  // Default (empty) pa_shape_list.
  PagedAttentionRule empty;
  empty.full_decode_only_graph = true;
  EXPECT_FALSE(using_paged_attention(1, empty));
}
