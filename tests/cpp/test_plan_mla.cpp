// MLA plan layer: reorder (docs/design/mla.md §3.2), context chunks (docs/design/mla.md §3.4), graph padding of
// the speculative-decode query lengths (docs/design/mla.md §3.5), with the upstream vectors of docs/design/mla.md §7.
#include <algorithm>
#include <numeric>
#include <vector>

#include "ascend_attn_rt/mla/plan/mla_plan.h"
#include "ascend_attn_rt/plan/split.h"
#include "ascend_attn_rt/plan/workspace.h"
#include "test_plan_util.h"

using namespace aar::plan;

namespace {

struct Chunks {
  std::vector<int32_t> cu, starts, lens;
  std::vector<int64_t> kv_ends, seq_tot, max_seq;
  ContextChunkPlan plan;
};

Chunks chunk(const std::vector<int32_t>& ctx, int64_t w, int32_t bs, int32_t max_chunks = kMaxContextChunks) {
  Chunks c;
  const std::size_t np = ctx.size(), cap = max_chunks;
  c.cu.assign(cap * (np + 1), -7);
  c.starts.assign(cap * np, -7);
  c.lens.assign(cap * np, -7);
  c.kv_ends.assign(cap * np, -7);
  c.seq_tot.assign(cap, -7);
  c.max_seq.assign(cap, -7);
  ContextChunkInputs in;
  in.context_lens = ctx;
  in.workspace_tokens = w;
  in.block_size = bs;
  in.max_chunks = max_chunks;
  c.plan = plan_context_chunks(in, {c.cu, c.starts, c.lens, c.kv_ends, c.seq_tot, c.max_seq});
  return c;
}

template <typename T>
std::vector<T> first(const std::vector<T>& v, std::size_t n) {
  return std::vector<T>(v.begin(), v.begin() + n);
}

}  // namespace

TEST(PlanMla, ReorderUpstreamVector) {
  // docs/design/mla.md §3.2: tokens {0:1, 1:3, 2:1, 3:2}, threshold 1 -> exactly one swap (1, 2).
  std::vector<int32_t> sched = {1, 3, 1, 2}, perm(4), swaps(8);
  EXPECT_EQ(mla_reorder_batch(sched, 1, perm, swaps), 1);
  EXPECT_EQ(swaps[0], 1);
  EXPECT_EQ(swaps[1], 2);
  EXPECT_EQ(perm, (std::vector<int32_t>{0, 2, 1, 3}));
}

TEST(PlanMla, ReorderPairsLastDecodeWithFirstPrefill) {
  // dec = [2, 4, 5], pre = [0, 1, 3]; #dec = 3: 5<->0, 4<->1, then dec[0]=2 < 3 stops.
  std::vector<int32_t> sched = {4, 9, 1, 7, 1, 2}, perm(6), swaps(12);
  EXPECT_EQ(mla_reorder_batch(sched, 2, perm, swaps), 2);
  EXPECT_EQ(first(swaps, 4), (std::vector<int32_t>{0, 5, 1, 4}));
  EXPECT_EQ(perm, (std::vector<int32_t>{5, 4, 2, 3, 1, 0}));
  for (int i = 0; i < 3; ++i) EXPECT_LE(sched[perm[i]], 2);
  for (int i = 3; i < 6; ++i) EXPECT_GT(sched[perm[i]], 2);
}

TEST(PlanMla, ReorderAlreadyOrderedAndErrors) {
  std::vector<int32_t> sched = {1, 1, 5, 6}, perm(4), swaps(8);
  EXPECT_EQ(mla_reorder_batch(sched, 1, perm, swaps), 0);
  EXPECT_EQ(perm, (std::vector<int32_t>{0, 1, 2, 3}));
  std::vector<int32_t> bad = {1, -2}, p2(2), s2(4), small(1);
  EXPECT_INVALID(mla_reorder_batch(bad, 1, p2, s2), "num_scheduled[1]=-2");
  EXPECT_INVALID(mla_reorder_batch(bad, 1, small, s2), "perm_out has 1");
  // A threshold below 1 made every request a prefill without an error.
  std::vector<int32_t> two = {1, 1}, p3 = {-7, -7}, s3(4, -7);
  EXPECT_INVALID(mla_reorder_batch(two, 0, p3, s3), "decode_threshold=0 is out of range [1, 16]");
  EXPECT_INVALID(mla_reorder_batch(two, 17, p3, s3), "decode_threshold=17 is out of range [1, 16]");
  EXPECT_EQ(p3, (std::vector<int32_t>{-7, -7}));
}

TEST(PlanMla, SplitIsTheSharedRule) {
  // 2 decodes then 2 prefills of 5 tokens: qsl [0,1,2,7,12].
  std::vector<int32_t> qsl = {0, 1, 2, 7, 12};
  SplitInputs in;
  in.query_start_loc = qsl;
  in.num_actual_tokens = 12;
  in.max_query_len = 5;
  in.decode_threshold = 1;
  const SplitResult r = split_decodes_and_prefills(in);
  EXPECT_EQ(r, (SplitResult{2, 2, 2, 10}));
}

TEST(PlanMla, ContextChunksWorkedExample) {
  // docs/design/mla.md §3.4: W=1024, BS=128, ctx = [1000, 0, 300].
  Chunks c = chunk({1000, 0, 300}, 1024, 128);
  EXPECT_EQ(c.plan.num_with_context, 2);
  EXPECT_EQ(c.plan.chunk_size, 512);
  ASSERT_EQ(c.plan.num_chunks, 2);
  EXPECT_FALSE(c.plan.bounded);
  EXPECT_EQ(first(c.lens, 6), (std::vector<int32_t>{512, 0, 300, 488, 0, 0}));
  EXPECT_EQ(first(c.cu, 8), (std::vector<int32_t>{0, 512, 512, 812, 0, 488, 488, 488}));
  EXPECT_EQ(first(c.starts, 6), (std::vector<int32_t>{0, 0, 0, 512, 512, 512}));
  EXPECT_EQ(first(c.seq_tot, 2), (std::vector<int64_t>{812, 488}));
  EXPECT_EQ(first(c.max_seq, 2), (std::vector<int64_t>{512, 488}));
  EXPECT_EQ(first(c.kv_ends, 6), (std::vector<int64_t>{512, 512, 812, 488, 488, 488}));
  EXPECT_EQ(c.seq_tot[2], -7);  // nothing written past the chunk count
}

TEST(PlanMla, NoContextMeansNoChunks) {
  Chunks c = chunk({0, 0}, 1024, 128);
  EXPECT_EQ(c.plan.num_chunks, 0);
  EXPECT_EQ(c.cu[0], -7);
  Chunks e = chunk({}, 1024, 128);
  EXPECT_EQ(e.plan.num_chunks, 0);
}

TEST(PlanMla, ChunkCountIsBoundedBy15) {
  // W/1 = 256 tokens per chunk would need ceil(10000/256) = 40 chunks; bounded:
  // chunk = round_up(ceil(10000/15), 128) = 768, 14 chunks.
  Chunks c = chunk({10000, 50}, 512, 128);
  EXPECT_TRUE(c.plan.bounded);
  EXPECT_EQ(c.plan.chunk_size, 768);
  EXPECT_EQ(c.plan.num_chunks, 14);
  int64_t total = 0;
  for (int ch = 0; ch < c.plan.num_chunks; ++ch) total += c.lens[ch * 2];
  EXPECT_EQ(total, 10000);
  EXPECT_EQ(c.lens[1], 50);
  EXPECT_EQ(c.lens[3], 0);
  // A smaller bound works the same way.
  Chunks d = chunk({1000}, 128, 16, 3);
  EXPECT_EQ(d.plan.num_chunks, 3);
  EXPECT_EQ(d.plan.chunk_size, 336);
}

TEST(PlanMla, ChunksCoverEveryContextToken) {
  for (int32_t bs : {16, 128}) {
    for (int64_t w : {700, 1000, 4096}) {
      std::vector<int32_t> ctx = {0, 1, 17, 300, 4097, 129};
      Chunks c = chunk(ctx, w, bs);
      ASSERT_LE(c.plan.num_chunks, kMaxContextChunks);
      EXPECT_EQ(c.plan.chunk_size % bs, 0);
      for (std::size_t b = 0; b < ctx.size(); ++b) {
        int64_t got = 0;
        for (int ch = 0; ch < c.plan.num_chunks; ++ch) got += c.lens[ch * ctx.size() + b];
        EXPECT_EQ(got, ctx[b]) << "bs=" << bs << " w=" << w << " b=" << b;
      }
    }
  }
}

TEST(PlanMla, ChunkErrors) {
  EXPECT_INVALID(chunk({10, -1}, 1024, 128), "context_lens[1]=-1");
  EXPECT_INVALID(chunk({10, 10}, 128, 128), "workspace_tokens=128 is too small");
  EXPECT_INVALID(chunk({10}, 1024, 0), "block_size must be positive");
  EXPECT_INVALID(chunk({10}, 1024, 16, 16), "max_chunks must be in [1, 15]");
}

TEST(PlanMla, WorkspaceIsTheSharedRule) {
  EXPECT_EQ(chunked_prefill_workspace_size(4096, 256, 128), 131072);
}

TEST(PlanMla, InterpRoundsHalfToEven) {
  std::vector<int64_t> out(4);
  interp_round_half_even(5, 8, 4, out);  // 5.75, 6.5, 7.25, 8
  EXPECT_EQ(out, (std::vector<int64_t>{6, 6, 7, 8}));
  std::vector<int64_t> o2(2);
  interp_round_half_even(1, 4, 2, o2);  // 2.5, 4
  EXPECT_EQ(o2, (std::vector<int64_t>{2, 4}));
}

TEST(PlanMla, DisablePadUpstreamVector) {
  // docs/design/mla.md §3.5 / §7: actual_q [1,2,4,5], num_reqs 4, graph_pad_size 8 -> [1,2,4,5,6,6,7,8].
  std::vector<int64_t> q = {1, 2, 4, 5}, out(8);
  EXPECT_EQ(pad_actual_q_disable_mode(q, 4, 8, out), 8);
  EXPECT_EQ(out, (std::vector<int64_t>{1, 2, 4, 5, 6, 6, 7, 8}));
  std::vector<int64_t> o2(4);
  EXPECT_EQ(pad_actual_q_disable_mode(q, 4, 4, o2), 4);  // no padding
  EXPECT_EQ(o2, q);
}

TEST(PlanMla, EnablePadUpstreamVectors) {
  std::vector<int64_t> q = {2, 4, 6}, out(4);
  std::vector<int64_t> ref1 = {2, 4, 6, 8};
  EXPECT_EQ(pad_actual_q_enable_mode(q, 3, 1, ref1, out), 4);
  EXPECT_EQ(out, (std::vector<int64_t>{2, 4, 6, 8}));
  std::vector<int64_t> ref2 = {2, 4, 6, 100};
  EXPECT_EQ(pad_actual_q_enable_mode(q, 3, 1, ref2, out), 4);
  EXPECT_EQ(out, (std::vector<int64_t>{2, 4, 6, 100}));
  // More than 16 tokens to the next reference with two padded requests: interp.
  std::vector<int64_t> ref3 = {2, 4, 6, 40, 60}, o3(5);
  EXPECT_EQ(pad_actual_q_enable_mode(q, 3, 2, ref3, o3), 5);
  EXPECT_EQ(o3, (std::vector<int64_t>{2, 4, 6, 33, 60}));
  EXPECT_EQ(pad_actual_q_enable_mode(q, 3, 0, ref3, o3), 3);
  EXPECT_INVALID(pad_actual_q_enable_mode(q, 3, 3, ref1, o3), "needs 6");
}

TEST(PlanMla, NextPowerOfTwo) {
  EXPECT_EQ(next_power_of_two(1), 1);
  EXPECT_EQ(next_power_of_two(20), 32);
  EXPECT_EQ(next_power_of_two(128), 128);
  EXPECT_EQ(next_power_of_two(256), 256);
  EXPECT_INVALID(next_power_of_two(0), "n must be in");
}

// ---------------------------------------------------------------- plan_mla_step

namespace {

// plan_mla_step's output buffers, pre-filled with -7 so that every write shows.
struct MlaOutputs {
  std::vector<int32_t> s_qsl, s_bt, dpos, ppos, pbt, cu, starts, lens;
  std::vector<int64_t> q_ends, kv, slots, pq, kv_ends, tot, mx;

  // reqs rows of `stride` columns, `tokens` token slots, `lists` entries in
  // the per-request length lists.
  void size_for(std::size_t reqs, std::size_t tokens, std::size_t stride, std::size_t lists) {
    s_qsl.assign(reqs + 1, -7);
    for (auto* v : {&s_bt, &pbt}) v->assign(reqs * stride, -7);
    for (auto* v : {&dpos, &ppos}) v->assign(tokens, -7);
    cu.assign(kMaxContextChunks * (reqs + 1), -7);
    for (auto* v : {&starts, &lens}) v->assign(kMaxContextChunks * reqs, -7);
    for (auto* v : {&q_ends, &kv, &pq}) v->assign(lists, -7);
    kv_ends.assign(kMaxContextChunks * reqs, -7);
    slots.assign(tokens, -7);
    for (auto* v : {&tot, &mx}) v->assign(kMaxContextChunks, -7);
  }
  MlaStepBuffers buffers(int32_t stride) {
    MlaStepBuffers b;
    b.query_start_loc = s_qsl;
    b.block_table = s_bt;
    b.block_table_stride = stride;
    b.q_ends = q_ends;
    b.kv_lens = kv;
    b.slot_mapping = slots;
    b.decode_positions = dpos;
    b.prefill_positions = ppos;
    b.prefill_block_table = pbt;
    b.prefill_q_ends = pq;
    b.chunks = {cu, starts, lens, kv_ends, tot, mx};
    return b;
  }
  // Every output buffer, to check that a rejected call wrote nothing.
  std::vector<int64_t> snapshot() const {
    std::vector<int64_t> all;
    for (const auto* v : {&s_qsl, &s_bt, &dpos, &ppos, &pbt, &cu, &starts, &lens}) {
      all.insert(all.end(), v->begin(), v->end());
    }
    for (const auto* v : {&q_ends, &kv, &slots, &pq, &kv_ends, &tot, &mx}) all.insert(all.end(), v->begin(), v->end());
    return all;
  }
};

struct MlaStep : MlaOutputs {
  static constexpr int kR = 8, kT = 64, kStride = 6;
  std::vector<int32_t> qsl, seq, table;
  MlaStepInputs in;

  MlaStep(std::vector<int32_t> q, std::vector<int32_t> s, int32_t bs = 4) : qsl(std::move(q)), seq(std::move(s)) {
    size_for(kR, kT, kStride, kR);
    table.resize(seq.size() * kStride);
    for (std::size_t i = 0; i < table.size(); ++i) table[i] = static_cast<int32_t>((i * 7) % 40);
    in.block_table_stride = kStride;
    in.block_size = bs;
    in.num_blocks = 40;
    in.rope_positions = 24;
    in.workspace_tokens = 8;
  }
  MlaStepBuffers buffers() { return MlaOutputs::buffers(kStride); }
  MlaStepPlan run(int32_t num_input_tokens = 0) {
    in.query_start_loc = qsl;
    in.seq_lens = seq;
    in.block_table = table;
    in.num_input_tokens = num_input_tokens;
    return plan_mla_step(in, buffers());
  }
};

}  // namespace

TEST(PlanMlaStep, DecodeOnlyFastPath) {
  MlaStep s({0, 1, 2, 3}, {5, 1, 9});
  const MlaStepPlan p = s.run(5);
  EXPECT_EQ(p.state, AttentionState::DecodeOnly);
  EXPECT_EQ(p.split, (SplitResult{3, 0, 3, 0}));
  EXPECT_EQ(p.num_input_tokens, 5);
  EXPECT_EQ(p.decode_max_seq_len, 9);
  EXPECT_EQ(first(s.q_ends, 3), (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(first(s.kv, 3), (std::vector<int64_t>{5, 1, 9}));
  EXPECT_EQ(first(s.dpos, 3), (std::vector<int32_t>{4, 0, 8}));
  const auto want = aar_test::naive_slots(s.qsl, s.seq, s.table, MlaStep::kStride, 4, 5);
  EXPECT_EQ(first(s.slots, 5), std::vector<int64_t>(want.begin(), want.end()));
  EXPECT_EQ(first(s.s_bt, 3 * MlaStep::kStride), s.table);
  EXPECT_EQ(s.ppos[0], -7);  // nothing written for prefills
}

TEST(PlanMlaStep, MixedBatchPositionsPrefillRowsAndChunks) {
  // 1 decode (seq 6), 2 prefills: 3 new on 10 cached, 2 new on 0 cached. W=8, bs=4 -> chunk 8.
  MlaStep s({0, 1, 4, 6}, {6, 13, 2});
  const MlaStepPlan p = s.run();
  EXPECT_EQ(p.split, (SplitResult{1, 2, 1, 5}));
  EXPECT_EQ(p.prefill_max_query_len, 3);
  EXPECT_EQ(p.prefill_max_seq_len, 13);
  EXPECT_EQ(s.dpos[0], 5);
  EXPECT_EQ(first(s.ppos, 5), (std::vector<int32_t>{10, 11, 12, 0, 1}));
  EXPECT_EQ(first(s.pq, 2), (std::vector<int64_t>{3, 5}));
  EXPECT_EQ(first(s.pbt, 2 * MlaStep::kStride),
            std::vector<int32_t>(s.table.begin() + MlaStep::kStride, s.table.end()));
  const auto want = aar_test::naive_slots(s.qsl, s.seq, s.table, MlaStep::kStride, 4, 6);
  EXPECT_EQ(s.slots.size() >= 6, true);
  EXPECT_EQ(first(s.slots, 6), std::vector<int64_t>(want.begin(), want.end()));
  EXPECT_EQ(p.chunks.num_chunks, 2);
  EXPECT_EQ(p.chunks.chunk_size, 8);
  EXPECT_EQ(first(s.lens, 4), (std::vector<int32_t>{8, 0, 2, 0}));
  EXPECT_EQ(first(s.cu, 6), (std::vector<int32_t>{0, 8, 8, 0, 2, 2}));
  EXPECT_EQ(first(s.tot, 2), (std::vector<int64_t>{8, 2}));
}

TEST(PlanMlaStep, SpeculativeDecodePositions) {
  MlaStep s({0, 2, 4}, {7, 3});
  s.in.decode_threshold = 2;
  s.in.spec_method = SpecMethod::Mtp;
  const MlaStepPlan p = s.run();
  EXPECT_EQ(p.split, (SplitResult{2, 0, 4, 0}));
  EXPECT_EQ(first(s.dpos, 4), (std::vector<int32_t>{5, 6, 1, 2}));
  EXPECT_EQ(first(s.q_ends, 2), (std::vector<int64_t>{2, 4}));
}

TEST(PlanMlaStep, RejectedCallWritesNothing) {
  MlaStep s({0, 1, 4}, {6, 13});
  const auto before = s.snapshot();
  s.table[1] = 40;  // needed block of request 0 (seq 6 -> 2 blocks) out of range
  EXPECT_INVALID(s.run(), "block_table[0][1]=40 is out of range [0, 40)");
  s.table[1] = 3;
  s.in.rope_positions = 12;
  EXPECT_INVALID(s.run(), "seq_lens[1]=13 exceeds the RoPE table length 12");
  s.in.rope_positions = 24;
  s.in.chunked_prefill_enabled = false;
  EXPECT_INVALID(s.run(), "request 1 has 10 cached context tokens but chunked_prefill_enabled is false");
  s.in.chunked_prefill_enabled = true;
  s.in.workspace_tokens = 3;
  EXPECT_INVALID(s.run(), "workspace_tokens=3 is too small");
  s.in.workspace_tokens = 8;
  EXPECT_INVALID(s.run(0 + 2), "num_input_tokens=2 is smaller than query_start_loc[2]=4");
  s.seq[0] = 0;
  EXPECT_INVALID(s.run(), "seq_lens[0]=0 is smaller than its query length 1");
  s.seq[0] = 6;
  s.qsl = {0, 2, 1};
  EXPECT_INVALID(s.run(), "query_start_loc must be non-decreasing");
  EXPECT_EQ(s.snapshot(), before);
  s.qsl = {0, 1, 4};
  s.run();
  EXPECT_NE(s.snapshot(), before);
}

// ---------------------------------------------------------------- plan_mla_step: block-id scan

namespace {

// A step of any size. Columns past a row's needed blocks hold stale ids (out of
// range on purpose): the kernels never read them, so they must not be rejected.
struct Step : MlaOutputs {
  int32_t stride, bs, nb;
  std::vector<int32_t> qsl, seq, table;
  MlaStepInputs in;

  Step(std::vector<int32_t> q, std::vector<int32_t> s, int32_t stride_, int32_t bs_, int32_t nb_)
      : stride(stride_), bs(bs_), nb(nb_), qsl(std::move(q)), seq(std::move(s)) {
    const std::size_t b = seq.size(), t = static_cast<std::size_t>(qsl.back()) + 1;
    table.resize(b * stride);
    for (std::size_t r = 0; r < b; ++r) {
      const int32_t need = (seq[r] + bs - 1) / bs;
      for (int32_t c = 0; c < stride; ++c) {
        const std::size_t i = r * stride + c;
        table[i] = c < need ? static_cast<int32_t>((i * 7919) % nb) : (c % 2 ? -5 : nb + 3);
      }
    }
    size_for(b, t, stride, kMaxContextChunks * b);
    in.block_table_stride = stride;
    in.block_size = bs;
    in.num_blocks = nb;
    in.workspace_tokens = 1 << 20;
  }
  MlaStepPlan run() {
    in.query_start_loc = qsl;
    in.seq_lens = seq;
    in.block_table = table;
    return plan_mla_step(in, buffers(stride));
  }
  // Slots of every real token against the naive reference, and the staged table.
  void expect_matches_reference() const {
    const std::size_t t = static_cast<std::size_t>(qsl.back());
    const auto want = aar_test::naive_slots(qsl, seq, table, stride, bs, t);
    EXPECT_EQ(first(slots, t), std::vector<int64_t>(want.begin(), want.end()));
    EXPECT_EQ(first(s_bt, table.size()), table);
  }
};

std::vector<int32_t> decode_qsl(std::size_t b) {
  std::vector<int32_t> q(b + 1);
  std::iota(q.begin(), q.end(), 0);
  return q;
}

// Every needed id of every row, replaced in turn by each kind of bad value, is
// rejected with its own coordinates, and nothing is written.
void expect_each_bad_id_rejected(Step& s) {
  const auto before = s.snapshot();
  for (std::size_t r = 0; r < s.seq.size(); ++r) {
    const int32_t need = (s.seq[r] + s.bs - 1) / s.bs;
    for (int32_t c = 0; c < need; ++c) {
      int32_t& id = s.table[r * s.stride + c];
      const int32_t good = id;
      for (const int32_t bad : {-1, s.nb, s.nb + 1000, INT32_MIN, INT32_MAX}) {
        id = bad;
        const std::string want = "block_table[" + std::to_string(r) + "][" + std::to_string(c) + "]=" +
                                 std::to_string(bad) + " is out of range [0, " + std::to_string(s.nb) + ")";
        EXPECT_INVALID(s.run(), want);
      }
      id = good;
    }
  }
  EXPECT_EQ(s.snapshot(), before);
}

}  // namespace

TEST(PlanMlaStep, DecodeBatchOfShortRowsRejectsEveryBadNeededId) {
  // At most 8 blocks per row (one masked chunk per row), stride 10.
  std::vector<int32_t> seq;
  for (int32_t r = 0; r < 37; ++r) seq.push_back(1 + (r * 5) % 32);  // 1..8 blocks of 4
  Step s(decode_qsl(seq.size()), seq, 10, 4, 50);
  expect_each_bad_id_rejected(s);
  const MlaStepPlan p = s.run();
  EXPECT_EQ(p.state, AttentionState::DecodeOnly);
  EXPECT_EQ(p.decode_max_seq_len, 32);
  s.expect_matches_reference();
}

TEST(PlanMlaStep, LongRowsAndAStrideThatIsNotAMultipleOf8) {
  // Up to 13 blocks per row: full unmasked chunks, masked remainders, and rows
  // whose remainder runs past the last multiple of 8 of the stride (13) take
  // the scalar tail.
  std::vector<int32_t> seq;
  for (int32_t r = 0; r < 29; ++r) seq.push_back(1 + (r * 11) % 52);
  Step s(decode_qsl(seq.size()), seq, 13, 4, 64);
  expect_each_bad_id_rejected(s);
  s.run();
  s.expect_matches_reference();
}

TEST(PlanMlaStep, MixedBatchRejectsBadIdsAndIgnoresStaleOnes) {
  // 3 decodes, then prefills with and without context.
  Step s(aar_test::lens_to_qsl({1, 1, 1, 7, 3, 12}), {9, 30, 2, 40, 3, 12}, 11, 4, 40);
  expect_each_bad_id_rejected(s);
  const MlaStepPlan p = s.run();
  EXPECT_EQ(p.split, (SplitResult{3, 3, 3, 22}));
  s.expect_matches_reference();
}

TEST(PlanMlaStep, DecodeSlotsPastTheScanStash) {
  // The scan keeps the last block id of the first 1024 rows; later rows read
  // the table again.
  std::vector<int32_t> seq;
  for (int32_t r = 0; r < 1100; ++r) seq.push_back(1 + (r * 13) % 32);
  Step s(decode_qsl(seq.size()), seq, 3, 16, 5000);
  s.run();
  s.expect_matches_reference();
  EXPECT_EQ(first(s.dpos, 3), (std::vector<int32_t>{0, 13, 26}));
  EXPECT_EQ(s.q_ends[1099], 1100);
  s.table[1099 * 3] = 5000;
  EXPECT_INVALID(s.run(), "block_table[1099][0]=5000 is out of range [0, 5000)");
}

TEST(PlanMlaStep, DecodeBatchWithABlockSizeThatIsNotAPowerOfTwo) {
  Step s(decode_qsl(6), {1, 3, 4, 9, 10, 17}, 6, 3, 30);
  expect_each_bad_id_rejected(s);
  s.run();
  s.expect_matches_reference();
  EXPECT_EQ(first(s.dpos, 6), (std::vector<int32_t>{0, 2, 3, 8, 9, 16}));
}

TEST(PlanMlaStep, EmptyCacheRejectsAnyNeededBlock) {
  Step s(decode_qsl(2), {3, 5}, 4, 4, 1);
  s.in.num_blocks = 0;
  const auto before = s.snapshot();
  EXPECT_INVALID(s.run(), "block_table[0][0]=0 is out of range [0, 0)");
  EXPECT_EQ(s.snapshot(), before);
}

TEST(PlanMlaStep, EmptyRequestsNeedNoBlockTable) {
  // Requests with no tokens and no context read no block id, even from an empty table.
  Step s({0, 0, 0}, {0, 0}, 0, 4, 10);
  ASSERT_TRUE(s.table.empty());
  const MlaStepPlan p = s.run();
  EXPECT_EQ(p.num_actual_tokens, 0);
  EXPECT_EQ(p.max_seq_len, 0);
}

// docs/design/mla.md §3.5 "enable-pad": a decode-only step padded to a graph bucket.
TEST(PlanMlaStep, GraphDecodePaddingAddsDummyRequests) {
  MlaStep s({0, 1, 2, 3}, {5, 1, 9});
  s.in.pad_decode_batch = true;
  const MlaStepPlan p = s.run(6);
  EXPECT_EQ(p.split, (SplitResult{3, 0, 3, 0}));  // the real batch
  EXPECT_EQ(p.decode_kernel_reqs, 6);
  EXPECT_EQ(p.decode_kernel_tokens, 6);
  EXPECT_EQ(first(s.q_ends, 6), (std::vector<int64_t>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(first(s.kv, 6), (std::vector<int64_t>{5, 1, 9, 0, 0, 0}));
  EXPECT_EQ(first(s.dpos, 6), (std::vector<int32_t>{4, 0, 8, 0, 0, 0}));
  EXPECT_EQ(first(s.slots, 6), (std::vector<int64_t>{s.slots[0], s.slots[1], s.slots[2], -1, -1, -1}));
  EXPECT_EQ(first(s.s_bt, 3 * MlaStep::kStride), s.table);
  EXPECT_EQ(std::vector<int32_t>(s.s_bt.begin() + 3 * MlaStep::kStride, s.s_bt.begin() + 6 * MlaStep::kStride),
            std::vector<int32_t>(3 * MlaStep::kStride, 0));
  EXPECT_EQ(s.s_bt[6 * MlaStep::kStride], -7);  // nothing past the dummies
}

TEST(PlanMlaStep, GraphDecodePaddingSpeculativeDummiesTakeTheDecodeLength) {
  // 2 requests of 2 tokens (1 speculative) padded to 8 tokens: 2 dummies of 2.
  MlaStep s({0, 2, 4}, {7, 3});
  s.in.decode_threshold = 2;
  s.in.spec_method = SpecMethod::Mtp;
  s.in.pad_decode_batch = true;
  const MlaStepPlan p = s.run(8);
  EXPECT_EQ(p.decode_kernel_reqs, 4);
  EXPECT_EQ(p.decode_kernel_tokens, 8);
  EXPECT_EQ(first(s.q_ends, 4), (std::vector<int64_t>{2, 4, 6, 8}));
  EXPECT_EQ(first(s.kv, 4), (std::vector<int64_t>{7, 3, 0, 0}));
  EXPECT_EQ(first(s.dpos, 8), (std::vector<int32_t>{5, 6, 1, 2, 0, 0, 0, 0}));
}

TEST(PlanMlaStep, GraphDecodePaddingOnlyPadsDecodeOnlySteps) {
  MlaStep mixed({0, 1, 4}, {6, 13});
  mixed.in.pad_decode_batch = true;
  const MlaStepPlan p = mixed.run(7);
  EXPECT_EQ(p.decode_kernel_reqs, 1);
  EXPECT_EQ(p.decode_kernel_tokens, 1);
  EXPECT_EQ(mixed.q_ends[2], -7);
  MlaStep off({0, 1, 2}, {5, 9});  // padding not asked for: the kernels see the real batch
  const MlaStepPlan q = off.run(4);
  EXPECT_EQ(q.decode_kernel_reqs, 2);
  EXPECT_EQ(q.decode_kernel_tokens, 2);
  EXPECT_EQ(off.q_ends[2], -7);
}

TEST(PlanMlaStep, GraphDecodePaddingRejectsWithoutWriting) {
  MlaStep s({0, 2, 4}, {7, 3});
  s.in.decode_threshold = 2;
  s.in.spec_method = SpecMethod::Mtp;
  s.in.pad_decode_batch = true;
  const auto before = s.snapshot();
  EXPECT_INVALID(s.run(7), "pads 4 decode tokens by 3, not a multiple of the decode length 2");
  MlaStep t({0, 1, 2}, {5, 9});
  t.in.pad_decode_batch = true;
  const auto t_before = t.snapshot();
  EXPECT_INVALID(t.run(12), "2 decodes + 10 dummy requests (num_input_tokens=12) exceed the room for 8 requests");
  EXPECT_EQ(s.snapshot(), before);
  EXPECT_EQ(t.snapshot(), t_before);
}

TEST(PlanMlaStep, PadOnlyDecodeBucketsRefusesAPaddedStepWithPrefillsWithoutWriting) {
  // MLA PCP (docs/design/cp.md §11.4): a step with prefills keeps its real token count.
  MlaStep mixed({0, 1, 4}, {6, 13});
  mixed.in.pad_decode_batch = true;
  mixed.in.pad_only_decode_buckets = true;
  const auto before = mixed.snapshot();
  EXPECT_INVALID(mixed.run(7), "num_input_tokens=7: only a decode-only step is padded to a graph bucket here (this "
                               "one has 1 prefills");
  EXPECT_EQ(mixed.snapshot(), before);
  const MlaStepPlan exact = mixed.run(4);  // unpadded: planned as usual
  EXPECT_EQ(exact.split.num_prefills, 1);
  MlaStep dec({0, 1, 2}, {5, 9});  // a decode-only step is padded as without the flag
  dec.in.pad_decode_batch = true;
  dec.in.pad_only_decode_buckets = true;
  const MlaStepPlan p = dec.run(4);
  EXPECT_EQ(p.decode_kernel_reqs, 4);
  EXPECT_EQ(p.decode_kernel_tokens, 4);
}

// docs/design/mla.md §3.5 / §7 "disable-pad" vector: graph_pad_size 8, 4 requests, qsl [0,1,2,4,5], 1 spec token.
TEST(PlanMlaStep, GraphDecodePaddingDisablePadModeInterpolatesQueryEnds) {
  MlaStep s({0, 1, 2, 4, 5}, {3, 5, 7, 2});
  s.in.decode_threshold = 2;
  s.in.spec_method = SpecMethod::Mtp;
  s.in.pad_decode_batch = true;
  s.in.pad_interpolated = true;
  const MlaStepPlan p = s.run(8);
  EXPECT_EQ(p.split, (SplitResult{4, 0, 5, 0}));
  EXPECT_EQ(p.decode_kernel_reqs, 8);
  EXPECT_EQ(p.decode_kernel_tokens, 8);
  EXPECT_EQ(first(s.q_ends, 8), (std::vector<int64_t>{1, 2, 4, 5, 6, 6, 7, 8}));
  EXPECT_EQ(first(s.kv, 8), (std::vector<int64_t>{3, 5, 7, 2, 0, 0, 0, 0}));
  EXPECT_EQ(std::vector<int32_t>(s.s_bt.begin() + 4 * MlaStep::kStride, s.s_bt.begin() + 8 * MlaStep::kStride),
            std::vector<int32_t>(4 * MlaStep::kStride, 0));
  EXPECT_EQ(first(s.dpos, 8), (std::vector<int32_t>{2, 4, 5, 6, 1, 0, 0, 0}));
  EXPECT_EQ(std::vector<int64_t>(s.slots.begin() + 5, s.slots.begin() + 8), (std::vector<int64_t>{-1, -1, -1}));
}

TEST(PlanMlaStep, GraphDecodePaddingDisablePadModePadsRowsEvenWhenTokensFill) {
  // 2 requests of 2 tokens fill a 4-token bucket but not its 4 rows: [2, 4] + interp(4, 4, 2) = [2, 4, 4, 4].
  MlaStep s({0, 2, 4}, {7, 3});
  s.in.decode_threshold = 2;
  s.in.spec_method = SpecMethod::Mtp;
  s.in.pad_decode_batch = true;
  s.in.pad_interpolated = true;
  const MlaStepPlan p = s.run(4);
  EXPECT_EQ(p.decode_kernel_reqs, 4);
  EXPECT_EQ(p.decode_kernel_tokens, 4);
  EXPECT_EQ(first(s.q_ends, 4), (std::vector<int64_t>{2, 4, 4, 4}));
  EXPECT_EQ(first(s.kv, 4), (std::vector<int64_t>{7, 3, 0, 0}));
}

// ---------------------------------------------------------------- plan_mla_step under DCP

namespace {

// The DCP context-chunk scratch of plan_mla_step (ContextChunkBuffers' DCP
// part), `fill` in every entry, attached to a step's buffers with the DCP
// lengths / flags scratch.
struct DcpChunkScratch {
  std::vector<int32_t> plens;
  std::vector<int64_t> ltot, reorg, offs;
  DcpChunkScratch(std::size_t reqs, std::size_t reorg_rows, int64_t fill)
      : plens(kMaxContextChunks * reqs, static_cast<int32_t>(fill)), ltot(kMaxContextChunks, fill),
        reorg(reorg_rows, fill), offs(kMaxContextChunks + 1, fill) {}
  void attach(MlaStepBuffers& b, std::vector<int32_t>& blens, std::vector<uint8_t>& pre) {
    b.chunks.padded_chunk_seq_lens = plens;
    b.chunks.local_seq_tot = ltot;
    b.chunks.reorg_index = reorg;
    b.chunks.reorg_offsets = offs;
    b.dcp_block_lens = blens;
    b.dcp_is_prefilling = pre;
  }
};

}  // namespace

TEST(PlanMlaStep, DcpContextChunksSpecExample) {
  // docs/design/mla.md §6.1's example (dcp=2, I=1, chunk=512, ctx=[1000,0,300]): pad_ctx=[500,0,150],
  // Cl=256, plen=[[256,0,150],[244,0,0]], local seq_tot=[406,244]; the global fields stay global.
  constexpr int32_t kStride = 4;
  MlaOutputs o;
  o.size_for(4, 16, kStride, 4);
  std::vector<int32_t> blens(4), qsl{0, 4, 8, 12}, seq{1004, 4, 304};
  DcpChunkScratch dc(3, 1300, -7);
  const std::vector<int32_t>& plens = dc.plens;
  const std::vector<int64_t>&ltot = dc.ltot, &reorg = dc.reorg, &offs = dc.offs;
  std::vector<uint8_t> pre(4);
  std::vector<int32_t> table(3 * kStride);
  for (std::size_t i = 0; i < table.size(); ++i) table[i] = static_cast<int32_t>(i);
  for (int32_t rank = 0; rank < 2; ++rank) {
    MlaStepInputs in = aar_test::mla_dcp_inputs(qsl, seq, table, kStride, 128, 16, DcpShard{2, rank, 1});
    in.workspace_tokens = 1024;
    MlaStepBuffers b = o.buffers(kStride);
    dc.attach(b, blens, pre);
    const MlaStepPlan p = plan_mla_step(in, b);
    ASSERT_EQ(p.split.num_prefills, 3);
    ASSERT_EQ(p.chunks.num_chunks, 2);
    EXPECT_EQ(p.chunks.chunk_size, 512);
    EXPECT_EQ(p.local_chunk_size, 256);
    EXPECT_EQ(std::vector<int32_t>(plens.begin(), plens.begin() + 6), (std::vector<int32_t>{256, 0, 150, 244, 0, 0}));
    EXPECT_EQ(std::vector<int32_t>(o.starts.begin(), o.starts.begin() + 6), (std::vector<int32_t>{0, 0, 0, 256, 256, 256}));
    EXPECT_EQ(std::vector<int64_t>(ltot.begin(), ltot.begin() + 2), (std::vector<int64_t>{406, 244}));
    EXPECT_EQ(std::vector<int64_t>(o.tot.begin(), o.tot.begin() + 2), (std::vector<int64_t>{812, 488}));
    EXPECT_EQ(std::vector<int32_t>(o.lens.begin(), o.lens.begin() + 6), (std::vector<int32_t>{512, 0, 300, 488, 0, 0}));
    // Reorg rows: chunk 0 request 0: rank 0's 256 rows then rank 1's (from 406), request 2 from 256 / 662.
    EXPECT_EQ(offs[0], 0);
    EXPECT_EQ(offs[1], 812);
    EXPECT_EQ(offs[2], 1300);
    EXPECT_EQ(reorg[0], 0);
    EXPECT_EQ(reorg[256], 406);
    EXPECT_EQ(reorg[512], 256);
    EXPECT_EQ(reorg[662], 662);
    EXPECT_EQ(reorg[811], 811);
    EXPECT_EQ(reorg[812], 0);
    EXPECT_EQ(reorg[812 + 244], 244);
    // Local slots: token t of request r at position ctx + t is on rank (pos % 2).
    for (int32_t t = 0; t < 12; ++t) {
      const int32_t r = t / 4, pos = seq[r] - 4 + t % 4;
      const bool mine = pos % 2 == rank;
      EXPECT_EQ(o.slots[t] >= 0, mine) << "token " << t;
      if (mine) {
        const int32_t li = pos / 2;
        EXPECT_EQ(o.slots[t], int64_t{table[r * kStride + li / 128]} * 128 + li % 128);
      }
    }
    EXPECT_EQ(o.kv[0], rank == 0 ? 502 : 502);
    EXPECT_EQ(o.kv[2], 152);
  }
}

namespace aar::plan {
namespace {

// docs/design/cp.md §3.1 / §3.2 under MLA DCP: a short request still in its prompt (the
// last prompt token recomputed on the decode node) is a prefill by
// is_prefilling, a decode with the P/D recompute scheduler; the derived flags
// are all false then (the split reads none).
TEST(PlanMlaStep, DcpPdRecomputeSchedulerTreatsShortExtendsAsDecodes) {
  constexpr int32_t kStride = 4;
  std::vector<int32_t> qsl{0, 1, 2, 5}, seq{9, 7, 3}, blens(3);
  std::vector<int32_t> table(3 * kStride);
  for (std::size_t i = 0; i < table.size(); ++i) table[i] = static_cast<int32_t>(i + 1);
  const std::vector<uint8_t> flags{0, 1, 1};
  for (const bool pd : {false, true})
    for (const bool given : {false, true}) {
      MlaOutputs o;
      o.size_for(3, 8, kStride, 4);
      std::vector<uint8_t> pre(3, 9);
      MlaStepInputs in = aar_test::mla_dcp_inputs(qsl, seq, table, kStride, 16, 16, DcpShard{2, 1, 1});
      in.workspace_tokens = 256;
      in.pd_recompute_scheduler = pd;
      if (given) in.is_prefilling = flags;
      MlaStepBuffers b = o.buffers(kStride);
      DcpChunkScratch dc(3, 64, 0);
      dc.attach(b, blens, pre);
      const MlaStepPlan p = plan_mla_step(in, b);
      // Without the flags a request is prefilling when nothing of it is computed, so only the
      // fresh prompt; with the flags the recomputed request is prefilling too, unless pd.
      const int32_t nd = (pd || !given) ? 2 : 1;
      EXPECT_EQ(p.split.num_decodes, nd) << pd << given;
      EXPECT_EQ(p.split.num_prefills, 3 - nd) << pd << given;
      if (!given) {
        EXPECT_EQ(pre, (pd ? std::vector<uint8_t>{0, 0, 0} : std::vector<uint8_t>{0, 0, 1})) << pd;
      }
      if (nd == 2) {
        EXPECT_EQ(o.kv[0], 4);  // local_len(9, rank 1) with W 2, I 1
        EXPECT_EQ(o.kv[1], 3);  // local_len(7, rank 1)
      }
    }
}

}  // namespace
}  // namespace aar::plan

// ------------------------------------------- docs/design/cp.md §11.7: the DCP pass's multiply-high divisions

#include "../../cpp/cp/plan/dcp_internal.h"

namespace {

TEST(PlanMlaDcpFast, FastDivEqualsDivisionForEveryDivisorShape) {
  // Brute force against the hardware division: small divisors (the interleave, W * I, block sizes),
  // powers of two and their neighbours, large ones; numerators at the edges and random.
  std::vector<uint32_t> ds;
  for (uint32_t d = 1; d <= 300; ++d) ds.push_back(d);
  for (int s = 9; s < 32; ++s) {
    for (int64_t e : {-1, 0, 1}) ds.push_back(static_cast<uint32_t>((int64_t{1} << s) + e));
  }
  ds.push_back(0xFFFFFFFFu);
  uint64_t x = 0x9E3779B97F4A7C15ull;
  auto rnd = [&] {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    return static_cast<uint32_t>(x);
  };
  for (uint32_t d : ds) {
    const aar::plan::detail::dcp::FastDiv f(d);
    std::vector<uint32_t> ns{0, 1, d - 1, d, d + 1, 2 * d - 1, 2 * d, 0x7FFFFFFFu, 0x80000000u, 0xFFFFFFFFu};
    for (int i = 0; i < 2000; ++i) ns.push_back(rnd() >> (i % 32));
    for (uint32_t n : ns) ASSERT_EQ(f.div(n), n / d) << n << " / " << d;
  }
}

TEST(PlanMlaDcpFast, LocalLensEqualTheDefinition) {
  for (int64_t w = 1; w <= 4; ++w)
    for (int64_t il : {1, 2, 4, 16, 128})
      for (int64_t len = 0; len < 3 * w * il + 5; ++len)
        for (int64_t r = 0; r < w; ++r) {
          const aar::plan::detail::dcp::FastDiv f(static_cast<uint32_t>(w * il));
          const auto got = aar::plan::detail::dcp::local_lens_fast(len, f, w, il, r);
          // Definition: the positions x < len with (x / il) % w == rank.
          int64_t mine = 0, first = 0;
          for (int64_t x = 0; x < len; ++x) {
            mine += (x / il) % w == r;
            first += (x / il) % w == 0;
          }
          ASSERT_EQ(got.mine, mine) << len << " " << w << " " << il << " " << r;
          ASSERT_EQ(got.first, first) << len << " " << w << " " << il << " " << r;
        }
}

TEST(PlanMlaDcpFast, RandomStepsMatchTheBruteForceShard) {
  // plan_mla_step under a DCP shard (random batches of decodes and prefills, interleave 1 / 2 / the
  // block size, worlds 1-4, every rank) against the placement's definition: token at position p is
  // rank (p / I) % W's, at local index (p / (W I)) I + p % I, slot table[li / bs] bs + li % bs, -1 on
  // other ranks; kv_lens the count of the request's positions the rank holds; block lens rank 0's.
  uint64_t x = 12345;
  auto rnd = [&](int32_t lo, int32_t hi) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    return lo + static_cast<int32_t>(x % static_cast<uint64_t>(hi - lo + 1));
  };
  for (int iter = 0; iter < 300; ++iter) {
    const int32_t bs = std::vector<int32_t>{16, 24, 128}[iter % 3];
    const int32_t w = 1 + iter % 4;
    const int32_t il = std::vector<int32_t>{1, 2, bs}[(iter / 4) % 3];
    const int32_t nreq = rnd(1, 12), nd = rnd(0, nreq);
    std::vector<int32_t> q(nreq), seq(nreq);
    for (int32_t r = 0; r < nreq; ++r) {
      q[r] = r < nd ? 1 : rnd(2, 40);
      seq[r] = q[r] + (r < nd ? rnd(0, 600) : rnd(0, 300));
    }
    const std::vector<int32_t> qsl = aar_test::lens_to_qsl(q);
    const int32_t stride = (600 + 41) / bs + 2, nblocks = 1000;
    std::vector<int32_t> table(static_cast<std::size_t>(nreq) * stride);
    for (auto& t : table) t = rnd(0, nblocks - 1);
    for (int32_t rank = 0; rank < w; ++rank) {
      MlaOutputs o;
      o.size_for(nreq, qsl.back(), stride, nreq);
      std::vector<int32_t> blens(nreq);
      std::vector<uint8_t> pre(nreq);
      DcpChunkScratch dc(nreq, 8000, 0);
      MlaStepInputs in = aar_test::mla_dcp_inputs(qsl, seq, table, stride, bs, nblocks, DcpShard{w, rank, il});
      in.workspace_tokens = 1 << 20;
      in.chunked_prefill_enabled = true;
      in.pd_recompute_scheduler = true;  // q == 1 requests are decodes
      MlaStepBuffers b = o.buffers(stride);
      dc.attach(b, blens, pre);
      const MlaStepPlan p = plan_mla_step(in, b);
      ASSERT_EQ(p.split.num_decodes, nd);
      for (int32_t r = 0; r < nreq; ++r) {
        int64_t mine = 0, first = 0;
        for (int64_t pos = 0; pos < seq[r]; ++pos) {
          mine += (pos / il) % w == rank;
          first += (pos / il) % w == 0;
        }
        ASSERT_EQ(o.kv[r], w > 1 ? mine : seq[r]) << iter << " r" << r;
        if (w > 1) ASSERT_EQ(blens[r], first) << iter << " r" << r;
        for (int32_t t = qsl[r]; t < qsl[r + 1]; ++t) {
          const int64_t pos = seq[r] - q[r] + (t - qsl[r]);
          int64_t want = -1;
          if ((pos / il) % w == rank || w == 1) {
            const int64_t li = w == 1 ? pos : (pos / (int64_t{w} * il)) * il + pos % il;
            want = int64_t{table[r * stride + li / bs]} * bs + li % bs;
          }
          ASSERT_EQ(o.slots[t], want) << iter << " t" << t << " rank " << rank << " W " << w << " I " << il;
        }
      }
    }
  }
}

}  // namespace
