// Regression tests for the defects the plan-layer fuzz targets (tests/fuzz/) found. Each test
// names its target; the crashing input is kept in tests/fuzz/corpus/<target>/ as well.
#include <climits>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "ascend_attn_rt/errors.h"
#include "ascend_attn_rt/cp/plan/cp_groups.h"
#include "ascend_attn_rt/cp/plan/dcp_layout.h"
#include "ascend_attn_rt/cp/plan/dcp_step_plan.h"
#include "ascend_attn_rt/mla/plan/mla_plan.h"
#include "ascend_attn_rt/cp/plan/pcp_segments.h"
#include "ascend_attn_rt/cp/plan/pcp_split.h"
#include "ascend_attn_rt/sfa/plan/sfa_offload_plan.h"
#include "ascend_attn_rt/plan/workspace.h"
#include "test_plan_util.h"

using namespace aar::plan;

// fuzz_reorder: mla_reorder_batch wrote the identity into perm_out while it validated, so a
// negative num_scheduled after the first entry was rejected with perm_out half-written.
TEST(FuzzRegression, MlaReorderRejectsBeforeWritingPerm) {
  const std::vector<int32_t> sched = {1, 5, -1, 1};
  std::vector<int32_t> perm(4, -7), swaps(8, -7);
  EXPECT_THROW(mla_reorder_batch(sched, 1, perm, swaps), aar::InvalidArgument);
  EXPECT_EQ(perm, std::vector<int32_t>(4, -7));
  EXPECT_EQ(swaps, std::vector<int32_t>(8, -7));
}

// fuzz_dcp_step: build_dcp_step wrote the slot mapping through a num_input_tokens-long view of
// buffers.slot_mapping without checking its room, so a short buffer was overrun by the pad fill
// (UBSan: a null reference for an empty one). Now rejected by name before any write.
TEST(FuzzRegression, DcpStepChecksSlotMappingRoom) {
  const std::vector<int32_t> qsl = {0, 1, 3}, seq = {5, 9}, table = {0, 1, 2, 3};
  DcpStepInputs in;
  in.query_start_loc = qsl;
  in.seq_lens = seq;
  in.block_table = table;
  in.block_table_stride = 2;
  in.block_size = 16;
  in.num_blocks = 4;
  in.num_input_tokens = 6;  // 3 pads past the 3 real tokens
  in.decode_threshold = 1;
  in.shard = {2, 1, 1};
  std::vector<int32_t> slots(4, -7), dtab(8, -7), ptab(8, -7), cidx(8, -7);
  std::vector<int64_t> dq(8, -7), dkv(8, -7), pq(8, -7), pctx(8, -7);
  DcpStepBuffers buf{slots, dtab, dq, dkv, ptab, pq, pctx, cidx, 2};
  try {
    build_dcp_step(in, buf);
    FAIL() << "a 4-entry slot_mapping for 6 input tokens was accepted";
  } catch (const aar::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("slot_mapping"), std::string::npos) << e.what();
  }
  EXPECT_EQ(slots, std::vector<int32_t>(4, -7));
  EXPECT_EQ(dq, std::vector<int64_t>(8, -7));
  slots.assign(6, -7);
  buf.slot_mapping = slots;
  const DcpStepPlan p = build_dcp_step(in, buf);
  EXPECT_EQ(p.num_input_tokens, 6);
  EXPECT_EQ(slots[5], -1);
}

// fuzz_dcp: build_dcp_mtp_mask computed num_reqs * max_query_len * max_kv_len in size_t, which
// wraps for 5 x 1718039348 x 2147418113 (= 4 mod 2^64): a 4-byte mask passed the room check
// and the fill ran past it. The product is now overflow-checked.
TEST(FuzzRegression, DcpMtpMaskSizeCannotWrap) {
  const std::vector<int32_t> seq(5, 1), q(5, 1);
  DcpMtpMaskInputs in;
  in.seq_lens = seq;
  in.query_lens = q;
  in.shard = {1, 0, 1};
  in.max_query_len = 1718039348;
  in.max_kv_len = 2147418113;
  std::vector<uint8_t> mask(4, 7);
  EXPECT_THROW(build_dcp_mtp_mask(in, mask), aar::InvalidArgument);
  EXPECT_EQ(mask, std::vector<uint8_t>(4, 7));
}

// fuzz_pcp: pcp_split_sizes accepted any pcp_size >= 1, so an empty batch with pcp_size =
// INT32_MAX reached `2 * pcp_size` (signed overflow) in pcp_restore_index / pcp_local_tokens.
// The sharded layout's Wp is now bounded by kMaxCpMergePartitions (cp_groups.h).
TEST(FuzzRegression, PcpSplitBoundsPcpSize) {
  const std::vector<int32_t> q = {};
  std::vector<int32_t> restore(4, -7);
  EXPECT_THROW(pcp_split_sizes({q, 0, INT32_MAX}), aar::InvalidArgument);
  EXPECT_THROW(pcp_restore_index({q, 0, INT32_MAX}, restore), aar::InvalidArgument);
  EXPECT_EQ(restore, std::vector<int32_t>(4, -7));
  EXPECT_EQ(pcp_split_sizes({q, 0, kMaxCpMergePartitions}).padded_global_tokens, 0);
}

// fuzz_pcp_segments: the per-rank chunk arithmetic ran in int32: pcp_size = INT32_MAX
// overflowed 2 * pcp_size, and a split request of q near INT32_MAX overflowed q + chunks - 1.
// pcp_size is bounded (65536) and the chunk offsets are computed in int64.
TEST(FuzzRegression, PcpSegmentsChunkArithmetic) {
  const std::vector<int32_t> qsl0 = {0}, comp0 = {};
  const std::vector<uint8_t> pre0 = {};
  EXPECT_THROW(pcp_padded_local_tokens({qsl0, comp0, pre0, INT32_MAX}), aar::InvalidArgument);
  const std::vector<int32_t> qsl = {0, INT32_MAX}, comp = {0};
  const std::vector<uint8_t> pre = {1};
  // 4 ranks, chunk = ceil((2^31 - 1) / 8) = 2^28: the largest rank holds two chunks.
  EXPECT_EQ(pcp_padded_local_tokens({qsl, comp, pre, 4}), 1 << 29);
  std::vector<PcpSegment> segs(2);
  EXPECT_EQ(pcp_rank_segments({qsl, comp, pre, 4}, 0, segs), 2);
  EXPECT_EQ(segs[0].token_begin, 7 * (1 << 28));  // the tail chunk (context-free head moves last)
  EXPECT_EQ(segs[0].num_tokens, (1 << 28) - 1);
  EXPECT_EQ(segs[1].start_pos, 0);
}

// fuzz_dcp_step (a timeout): compute_dcp_slot_mapping's column check walks every rank of the
// shard, so a shard of world = INT32_MAX (valid otherwise) ran for minutes. world is bounded by
// kMaxCpMergePartitions, as cp_groups bounds a KV shard.
TEST(FuzzRegression, DcpSlotMappingBoundsWorld) {
  const std::vector<int32_t> qsl = {0, 1}, seq = {1}, table = {0};
  const SlotMappingInputs in{qsl, seq, table, 1, 16, 1};
  std::vector<int32_t> slots(1, -7);
  EXPECT_THROW(compute_dcp_slot_mapping(in, {INT32_MAX, 0, 1}, slots), aar::InvalidArgument);
  EXPECT_EQ(slots, std::vector<int32_t>(1, -7));
  EXPECT_EQ(compute_dcp_slot_mapping(in, {kMaxCpMergePartitions, 0, 1}, slots), 1);
  EXPECT_EQ(slots[0], 0);
}

// fuzz_cp_groups: cp_max_blocks_per_request rounded up with max_model_len + vb - 1, a signed
// overflow for a length near INT64_MAX; now rejected as beyond int32 like any other huge length.
TEST(FuzzRegression, CpMaxBlocksNoOverflow) {
  EXPECT_THROW(cp_max_blocks_per_request(INT64_MAX - 7, 128, 1), aar::InvalidArgument);
  EXPECT_EQ(cp_max_blocks_per_request(int64_t{INT32_MAX} * 128, 128, 1), INT32_MAX);
  EXPECT_EQ(cp_max_blocks_per_request(257, 128, 2), 2);
  EXPECT_EQ(cp_max_blocks_per_request(0, 128, 2), 0);
}

// fuzz_sfa_offload: write_sfa_offload_step trusted its split argument; num_decodes = -1 with
// num_prefills = B + 1 passed the "nd + np == B" check in size_t arithmetic and indexed
// query_start_loc at -1. The split is now checked against the batch before any write.
TEST(FuzzRegression, SfaOffloadWriteChecksSplit) {
  const std::vector<int32_t> qsl = {0, 1, 4}, seq = {5, 9};
  const std::vector<uint64_t> ids = {7, 8};
  const std::vector<uint8_t> pre = {0, 1};
  SfaOffloadInputs in;
  in.query_start_loc = qsl;
  in.seq_lens = seq;
  in.req_ids = ids;
  in.is_prefilling = pre;
  const SplitResult good = check_sfa_offload_step(in);
  ASSERT_EQ(good.num_decodes, 1);
  std::vector<uint64_t> rid(2, 7);
  std::vector<int32_t> ttr(4, -7), pcq(2, -7), dsl(4, -7), dsp(4, -7);
  std::vector<uint64_t> dri(4, 7);
  const SfaOffloadBuffers buf{rid, ttr, pcq, dri, dsl, dsp};
  for (SplitResult bad : {SplitResult{-1, 3, 0, 4}, SplitResult{1, 1, 3, 1}, SplitResult{2, 1, 4, 0}}) {
    EXPECT_THROW(write_sfa_offload_step(in, bad, 4, buf), aar::InvalidArgument);
    EXPECT_EQ(rid, std::vector<uint64_t>(2, 7));
    EXPECT_EQ(ttr, std::vector<int32_t>(4, -7));
  }
  write_sfa_offload_step(in, good, 4, buf);
  EXPECT_EQ(ttr, (std::vector<int32_t>{0, 1, 1, 1}));
  EXPECT_EQ(dsp[0], 4);
}

// fuzz_sfa_offload (found by CI's fuzz smoke): a leading zero-token request can be counted with
// the decodes or with the prefills without changing any token count, so a split that moved it
// passed the count checks and wrote prefill_cum_query_lens for the wrong requests. The writer now
// requires exactly the batch's own split.
TEST(FuzzRegression, SfaOffloadWriteRefusesAMovedZeroTokenRequest) {
  const std::vector<int32_t> qsl = {0, 0, 12, 14}, seq = {0, 12, 2};
  const std::vector<uint64_t> ids = {1, 2, 3};
  const std::vector<uint8_t> pre = {0, 1, 1};
  SfaOffloadInputs in;
  in.query_start_loc = qsl;
  in.seq_lens = seq;
  in.req_ids = ids;
  in.is_prefilling = pre;
  const SplitResult good = check_sfa_offload_step(in);
  const int32_t nd = good.num_decodes == 1 ? 0 : 1;
  const SplitResult moved{nd, 3 - nd, 0, 14};
  ASSERT_FALSE(moved == good);
  std::vector<uint64_t> rid(3, 7);
  std::vector<int32_t> ttr(14, -7), pcq(3, -7), dsl(14, -7), dsp(14, -7);
  std::vector<uint64_t> dri(14, 7);
  const SfaOffloadBuffers buf{rid, ttr, pcq, dri, dsl, dsp};
  EXPECT_THROW(write_sfa_offload_step(in, moved, 14, buf), aar::InvalidArgument);
  EXPECT_EQ(rid, std::vector<uint64_t>(3, 7));
  EXPECT_EQ(pcq, std::vector<int32_t>(3, -7));
  write_sfa_offload_step(in, good, 14, buf);
  EXPECT_EQ(rid, (std::vector<uint64_t>{1, 2, 3}));
}

// fuzz_sizes: round_up multiplied past int64 near the limits (and INT64_MIN / -1 trapped);
// chunked_prefill_workspace_size overflowed max_num_seqs * block_size and 8 * max_model_len.
// Both now refuse what int64 cannot hold and are exact below it.
TEST(FuzzRegression, WorkspaceSizesNoOverflow) {
  EXPECT_THROW(round_up(INT64_MAX, 2), aar::InvalidArgument);
  EXPECT_EQ(round_up(INT64_MIN, -1), INT64_MIN);
  EXPECT_EQ(round_up(INT64_MAX - 1, 2), INT64_MAX - 1);
  EXPECT_EQ(round_up(-5, 4), -4);
  EXPECT_THROW(chunked_prefill_workspace_size(16, int64_t{1} << 40, int64_t{1} << 30), aar::InvalidArgument);
  EXPECT_EQ(chunked_prefill_workspace_size(INT64_MAX, 1, 128), 131072);
  EXPECT_EQ(chunked_prefill_workspace_size(4096, int64_t{1} << 20, 128), int64_t{1} << 27);
}

// fuzz_sizes: plan_context_chunks wrapped its int32 chunk_size: a workspace past INT32_MAX
// tokens per request, and (bounded) a context of INT32_MAX tokens with max_chunks = 1, whose
// ceil(max_context / max_chunks) also overflowed int32. The first is capped at the largest int32
// multiple of the block, the second refused.
TEST(FuzzRegression, ContextChunksSizeFitsInt32) {
  std::vector<int32_t> cu(2, -7), st(1, -7), ln(1, -7);
  std::vector<int64_t> ke(1, -7), tot(1, -7), mx(1, -7);
  const ContextChunkBuffers buf{cu, st, ln, ke, tot, mx};
  const std::vector<int32_t> ctx = {1000};
  ContextChunkPlan p = plan_context_chunks({ctx, int64_t{1} << 40, 128, 1}, buf);
  EXPECT_EQ(p.num_chunks, 1);
  EXPECT_EQ(p.chunk_size, INT32_MAX / 128 * 128);
  EXPECT_EQ(ln[0], 1000);
  const std::vector<int32_t> huge = {INT32_MAX};
  cu.assign(2, -7);
  EXPECT_THROW(plan_context_chunks({huge, 1024, 128, 1}, buf), aar::InvalidArgument);
  EXPECT_EQ(cu, std::vector<int32_t>(2, -7));
}

// fuzz_dcp (a timeout): build_dcp_mtp_mask walked max_query_len rows even when the mask is
// empty (max_kv_len = 0): a huge max_query_len took minutes. An empty mask returns at once.
TEST(FuzzRegression, DcpMtpEmptyMaskReturnsAtOnce) {
  const std::vector<int32_t> seq = {0, 0}, q = {0, 0};
  DcpMtpMaskInputs in;
  in.seq_lens = seq;
  in.query_lens = q;
  in.shard = {2, 1, 1};
  in.max_query_len = INT32_MAX;
  in.max_kv_len = 0;
  std::vector<uint8_t> mask;
  build_dcp_mtp_mask(in, mask);  // would loop 2 x 2^31 rows before the fix
  SUCCEED();
}

// fuzz_dcp_step: build_dcp_step took the query lengths' maximum before it checked
// query_start_loc[0] == 0, so qsl = [INT32_MIN, 2] overflowed 2 - INT32_MIN. qsl[0] is now
// checked first.
TEST(FuzzRegression, DcpStepChecksQslStartFirst) {
  const std::vector<int32_t> qsl = {INT32_MIN, 2}, seq = {2}, table = {0};
  DcpStepInputs in;
  in.query_start_loc = qsl;
  in.seq_lens = seq;
  in.block_table = table;
  in.block_table_stride = 1;
  in.block_size = 16;
  in.num_blocks = 1;
  std::vector<int32_t> slots(4, -7), i32(4, -7);
  std::vector<int64_t> i64(4, -7);
  try {
    build_dcp_step(in, {slots, i32, i64, i64, i32, i64, i64, i32, 1});
    FAIL() << "query_start_loc[0] = INT32_MIN was accepted";
  } catch (const aar::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("query_start_loc[0]"), std::string::npos) << e.what();
  }
  EXPECT_EQ(slots, std::vector<int32_t>(4, -7));
}

// fuzz_mla_dcp_step: plan_mla_step under DCP, two defects.
//  1. It wrote the DCP scratch (dcp_block_lens, the derived dcp_is_prefilling) before its scan
//     could reject the batch, so a rejected step changed caller buffers. A block id out of range
//     is rejected now with both buffers as they were.
//  2. The context-chunk alignment block_size * W overflowed int32 for a huge block size (UBSan);
//     it is refused, naming the block size and the DCP world.
namespace {
struct MlaDcpBuffers {
  std::vector<int32_t> qsl = std::vector<int32_t>(8, -7), table = std::vector<int32_t>(32, -7),
                       dpos = std::vector<int32_t>(16, -7), ppos = std::vector<int32_t>(16, -7),
                       ptable = std::vector<int32_t>(32, -7), blens = std::vector<int32_t>(4, -7);
  std::vector<int64_t> q_ends = std::vector<int64_t>(8, -7), kv = std::vector<int64_t>(8, -7),
                       slots = std::vector<int64_t>(16, -7), pq = std::vector<int64_t>(8, -7);
  std::vector<uint8_t> pre = std::vector<uint8_t>(4, 0xAB);
  MlaStepBuffers spans(int32_t stride) {
    MlaStepBuffers b{qsl, table, stride, q_ends, kv, slots, dpos, ppos, ptable, pq, {}};
    b.dcp_block_lens = blens;
    b.dcp_is_prefilling = pre;
    return b;
  }
};

}  // namespace

TEST(FuzzRegression, MlaDcpRejectionLeavesScratchUnchanged) {
  const std::vector<int32_t> qsl = {0, 1, 5}, seq = {9, 4}, table = {0, 99, 2, 3};  // 99: out of range
  MlaStepInputs in = aar_test::mla_dcp_inputs(qsl, seq, table, 2, 4, 8, DcpShard{2, 0, 1});
  MlaDcpBuffers o;
  try {
    plan_mla_step(in, o.spans(2));
    FAIL() << "block id 99 of 8 blocks was accepted";
  } catch (const aar::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("99"), std::string::npos) << e.what();
  }
  EXPECT_EQ(o.blens, std::vector<int32_t>(4, -7));
  EXPECT_EQ(o.pre, std::vector<uint8_t>(4, 0xAB));
  // The same batch with a valid id: the scratch holds rank 0's local lengths and the flags.
  const std::vector<int32_t> good = {0, 1, 2, 3};
  in.block_table = good;
  plan_mla_step(in, o.spans(2));
  EXPECT_EQ(o.blens[0], 5);  // positions 0, 2, 4, 6, 8 of 9
  EXPECT_EQ(o.blens[1], 2);
  EXPECT_EQ(o.pre[0], 0);
  EXPECT_EQ(o.pre[1], 1);  // seq_len == query length: still prefilling
}

TEST(FuzzRegression, MlaDcpChunkAlignmentFitsInt32) {
  const std::vector<int32_t> qsl = {0, 1}, seq = {1}, table = {0};
  const MlaStepInputs in = aar_test::mla_dcp_inputs(qsl, seq, table, 1, INT32_MAX, 1, DcpShard{2, 1, 1});
  MlaDcpBuffers o;
  try {
    plan_mla_step(in, o.spans(1));
    FAIL() << "block_size INT32_MAX x DCP 2 was accepted";
  } catch (const aar::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("block_size=2147483647"), std::string::npos) << e.what();
  }
  EXPECT_EQ(o.blens, std::vector<int32_t>(4, -7));
}

// fuzz_mla_pad: the MLA graph-padding helpers.
//  1. pad_actual_q_disable_mode copied actual_q into out, then rejected actual_q.back() >
//     graph_pad_size; pad_actual_q_enable_mode copied it, then rejected a short ref. Both now
//     validate first.
//  2. interp_round_half_even computed b - a in int64 (overflow for ends of opposite sign near
//     the int64 limits) and converted doubles past 2^63 to int64; both ends must now lie in
//     [-2^52, 2^52] (token counts do).
TEST(FuzzRegression, MlaPadHelpersValidateBeforeWriting) {
  const std::vector<int64_t> q = {3, 9};
  std::vector<int64_t> out(8, -7);
  EXPECT_THROW(pad_actual_q_disable_mode(q, 2, 6, out), aar::InvalidArgument);  // 9 > graph_pad_size 6
  EXPECT_EQ(out, std::vector<int64_t>(8, -7));
  const std::vector<int64_t> ref = {1, 2, 3};
  EXPECT_THROW(pad_actual_q_enable_mode(q, 2, 4, ref, out), aar::InvalidArgument);  // ref needs 6 entries
  EXPECT_EQ(out, std::vector<int64_t>(8, -7));
}

TEST(FuzzRegression, MlaInterpEndsAreBounded) {
  std::vector<int64_t> out(3, -7);
  EXPECT_THROW(interp_round_half_even(INT64_MIN, INT64_MAX, 3, out), aar::InvalidArgument);
  EXPECT_THROW(interp_round_half_even(0, (int64_t{1} << 52) + 1, 3, out), aar::InvalidArgument);
  EXPECT_EQ(out, std::vector<int64_t>(3, -7));
  interp_round_half_even(-(int64_t{1} << 52), int64_t{1} << 52, 2, out);
  EXPECT_EQ(out[0], 0);
  EXPECT_EQ(out[1], int64_t{1} << 52);
}

// fuzz_sizes (CI's fuzz smoke of a fresh clone): plan_context_chunks wrote the int32
// cu_seq_lens of a chunk whose tokens over all requests passed INT32_MAX (three contexts of
// 2^30 in one chunk: cu wrapped negative). Refused now, naming the chunk's token count; the same
// check guards plan_mla_step's chunks.
TEST(FuzzRegression, ContextChunksTotalFitsInt32) {
  std::vector<int32_t> cu(4, -7), st(3, -7), ln(3, -7);
  std::vector<int64_t> ke(3, -7), tot(1, -7), mx(1, -7);
  const ContextChunkBuffers buf{cu, st, ln, ke, tot, mx};
  const std::vector<int32_t> ctx = {1 << 30, 1 << 30, 1 << 30};
  try {
    plan_context_chunks({ctx, int64_t{1} << 40, 128, 1}, buf);
    FAIL() << "a chunk of 3 * 2^30 tokens was accepted";
  } catch (const aar::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("3221225472 tokens"), std::string::npos) << e.what();
  }
  EXPECT_EQ(cu, std::vector<int32_t>(4, -7));
  EXPECT_EQ(ke, std::vector<int64_t>(3, -7));
  const std::vector<int32_t> two = {1 << 29, 1 << 29};  // 2^30 tokens: fits
  cu.assign(4, -7);
  plan_context_chunks({two, int64_t{1} << 40, 128, 1}, buf);
  EXPECT_EQ(cu[2], 1 << 30);
}
