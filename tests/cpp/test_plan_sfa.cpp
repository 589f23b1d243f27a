// SFA plan layer (docs/design/sfa.md §3.1, §3.2, docs/design/sparse.md §8): plan_sfa_step against hand
// vectors and a naive model over random batches in any order, every bad input
// rejected by name with the buffers untouched, and build_valid_topk_mask.
#include <algorithm>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "ascend_attn_rt/cp/plan/sparse_cp.h"
#include "ascend_attn_rt/plan/attention_state.h"
#include "ascend_attn_rt/sfa/plan/sfa_plan.h"
#include "test_plan_util.h"

using namespace aar::plan;

namespace {

template <typename T>
std::vector<T> first(const std::vector<T>& v, std::size_t n) {
  return std::vector<T>(v.begin(), v.begin() + n);
}

// plan_sfa_step's outputs, pre-filled with -7 so that every write shows.
struct SfaOutputs {
  std::vector<int32_t> qsl_out, cql, kv, bt, pos;
  std::vector<int64_t> slots, cql_list, kv_list;
  int32_t out_stride = 0;

  void size_for(std::size_t reqs, std::size_t tokens, int32_t stride) {
    out_stride = stride;
    qsl_out.assign(reqs + 1, -7);
    for (auto* v : {&cql, &kv}) v->assign(reqs, -7);
    bt.assign(reqs * stride, -7);
    pos.assign(tokens, -7);
    slots.assign(tokens, -7);
    for (auto* v : {&cql_list, &kv_list}) v->assign(reqs, -7);
  }
  SfaStepBuffers buffers() {
    SfaStepBuffers b;
    b.query_start_loc = qsl_out;
    b.cum_query_lens = cql;
    b.seq_lens = kv;
    b.block_table = bt;
    b.block_table_stride = out_stride;
    b.slot_mapping = slots;
    b.positions = pos;
    b.cum_query_lens_list = cql_list;
    b.seq_lens_list = kv_list;
    return b;
  }
  std::vector<int64_t> snapshot() const {
    std::vector<int64_t> all;
    for (const auto* v : {&qsl_out, &cql, &kv, &bt, &pos}) all.insert(all.end(), v->begin(), v->end());
    for (const auto* v : {&slots, &cql_list, &kv_list}) all.insert(all.end(), v->begin(), v->end());
    return all;
  }
};

struct SfaStep : SfaOutputs {
  std::vector<int32_t> qsl, seq, table, spec;
  int32_t stride;
  SfaStepInputs in;

  SfaStep(std::vector<int32_t> q, std::vector<int32_t> s, int32_t bs = 4, int32_t stride_ = 6, int32_t nb = 40,
          std::size_t reqs = 8, std::size_t tokens = 64)
      : qsl(std::move(q)), seq(std::move(s)), stride(stride_) {
    size_for(reqs, tokens, stride);
    table.resize(seq.size() * stride);
    for (std::size_t i = 0; i < table.size(); ++i) table[i] = static_cast<int32_t>((i * 7) % nb);
    in.block_table_stride = stride;
    in.block_size = bs;
    in.num_blocks = nb;
    in.rope_positions = 24;
  }
  SfaStepPlan run(int32_t num_input_tokens = 0) {
    in.query_start_loc = qsl;
    in.seq_lens = seq;
    in.block_table = table;
    in.num_spec_tokens = spec;
    in.num_input_tokens = num_input_tokens;
    return plan_sfa_step(in, buffers());
  }
};

// The formulas of docs/design/sfa.md one request at a time (docs/design/sfa.md §3.1-§3.2 and the padding rule).
struct Naive {
  std::vector<int32_t> cql, kv, bt, pos;
  std::vector<int64_t> slots;
  int32_t bk = 0;
};

Naive naive(const std::vector<int32_t>& qsl, const std::vector<int32_t>& seq, const std::vector<int32_t>& table,
            int32_t in_stride, int32_t out_stride, int32_t bs, int32_t t_in, int32_t thr, bool pad) {
  Naive n;
  const std::size_t b = seq.size();
  int32_t max_q = 0;
  for (std::size_t r = 0; r < b; ++r) {
    const int32_t q = qsl[r + 1] - qsl[r];
    max_q = std::max(max_q, q);
    n.cql.push_back(qsl[r + 1]);
    n.kv.push_back(seq[r]);
    for (int32_t c = 0; c < out_stride; ++c) n.bt.push_back(c < in_stride ? table[r * in_stride + c] : 0);
    for (int32_t j = 0; j < q; ++j) {
      const int32_t p = seq[r] - q + j;
      n.pos.push_back(p);
      n.slots.push_back(static_cast<int64_t>(table[r * in_stride + p / bs]) * bs + p % bs);
    }
  }
  const int32_t t_real = qsl.back();
  n.pos.resize(t_in, 0);
  n.slots.resize(t_in, -1);
  n.bk = static_cast<int32_t>(b);
  if (pad && b > 0 && max_q <= thr && t_in > t_real) {
    for (int32_t end = t_real + thr; end <= t_in; end += thr) {
      n.cql.push_back(end);
      n.kv.push_back(0);
      n.bt.insert(n.bt.end(), out_stride, 0);
      ++n.bk;
    }
  }
  return n;
}

}  // namespace

TEST(PlanSfaStep, MixedBatchInAnyOrder) {
  // A prefill of 3 on 10 cached, a decode (seq 6), a fresh prefill of 2: no reorder.
  SfaStep s({0, 3, 4, 6}, {13, 6, 2});
  const SfaStepPlan p = s.run(8);
  EXPECT_EQ(p.state, AttentionState::ChunkedPrefill);
  // The split rule on the order given: the first request is a prefill, so all are.
  EXPECT_EQ(p.split, (SplitResult{0, 3, 0, 6}));
  EXPECT_EQ(p.num_reqs, 3);
  EXPECT_EQ(p.num_kernel_reqs, 3);
  EXPECT_EQ(p.num_actual_tokens, 6);
  EXPECT_EQ(p.num_input_tokens, 8);
  EXPECT_EQ(p.max_query_len, 3);
  EXPECT_EQ(p.max_seq_len, 13);
  EXPECT_FALSE(p.padded);
  EXPECT_EQ(first(s.qsl_out, 4), s.qsl);
  EXPECT_EQ(first(s.cql, 3), (std::vector<int32_t>{3, 4, 6}));
  EXPECT_EQ(first(s.kv, 3), (std::vector<int32_t>{13, 6, 2}));
  EXPECT_EQ(first(s.cql_list, 3), (std::vector<int64_t>{3, 4, 6}));
  EXPECT_EQ(first(s.kv_list, 3), (std::vector<int64_t>{13, 6, 2}));
  EXPECT_EQ(s.cql[3], -7);  // nothing past B_k
  EXPECT_EQ(first(s.pos, 8), (std::vector<int32_t>{10, 11, 12, 5, 0, 1, 0, 0}));
  const auto want = aar_test::naive_slots(s.qsl, s.seq, s.table, s.stride, 4, 8);
  EXPECT_EQ(first(s.slots, 8), std::vector<int64_t>(want.begin(), want.end()));
  EXPECT_EQ(s.slots[6], -1);
  EXPECT_EQ(first(s.bt, 3 * 6), s.table);
  EXPECT_EQ(s.pos[8], -7);
}

TEST(PlanSfaStep, SplitCountsTheLeadingDecodes) {
  SfaStep s({0, 1, 2, 7, 8}, {5, 9, 12, 3});
  const SfaStepPlan p = s.run();
  EXPECT_EQ(p.split, (SplitResult{2, 2, 2, 6}));
  EXPECT_EQ(first(s.pos, 8), (std::vector<int32_t>{4, 8, 7, 8, 9, 10, 11, 2}));
}

TEST(PlanSfaStep, DecodeOnlyFastPath) {
  for (int32_t bs : {4, 3}) {  // power of two or not
    SfaStep s({0, 1, 2, 3}, {5, 1, 9}, bs);
    const SfaStepPlan p = s.run();
    EXPECT_EQ(p.state, AttentionState::DecodeOnly);
    EXPECT_EQ(p.split, (SplitResult{3, 0, 3, 0}));
    EXPECT_EQ(first(s.pos, 3), (std::vector<int32_t>{4, 0, 8}));
    const auto want = aar_test::naive_slots(s.qsl, s.seq, s.table, s.stride, bs, 3);
    EXPECT_EQ(first(s.slots, 3), std::vector<int64_t>(want.begin(), want.end()));
    EXPECT_EQ(first(s.cql, 3), (std::vector<int32_t>{1, 2, 3}));
  }
}

TEST(PlanSfaStep, OptionalOutputsMayBeEmpty) {
  SfaStep s({0, 1, 3}, {4, 7});
  SfaStepBuffers b = s.buffers();
  b.query_start_loc = {};
  b.cum_query_lens_list = {};
  b.seq_lens_list = {};
  s.in.query_start_loc = s.qsl;
  s.in.seq_lens = s.seq;
  s.in.block_table = s.table;
  plan_sfa_step(s.in, b);
  EXPECT_EQ(s.qsl_out[0], -7);
  EXPECT_EQ(s.cql_list[0], -7);
  EXPECT_EQ(first(s.cql, 2), (std::vector<int32_t>{1, 3}));
  // A span that is too short for what it would get is rejected, not truncated.
  b.seq_lens_list = {s.kv_list.data(), 1};
  EXPECT_INVALID(plan_sfa_step(s.in, b), "buffers.seq_lens_list has room for 1 entries, needs 2");
}

TEST(PlanSfaStep, StatesAndSpeculativeDecodes) {
  SfaStep fresh({0, 3, 5}, {3, 2});
  EXPECT_EQ(fresh.run().state, AttentionState::PrefillNoCache);
  SfaStep spec({0, 2, 4}, {7, 3});
  spec.in.decode_threshold = 2;
  spec.in.spec_method = SpecMethod::Mtp;
  spec.spec = {1, 1};
  const SfaStepPlan p = spec.run();
  EXPECT_EQ(p.state, AttentionState::SpecDecoding);
  EXPECT_EQ(p.split, (SplitResult{2, 0, 4, 0}));
  EXPECT_EQ(first(spec.pos, 4), (std::vector<int32_t>{5, 6, 1, 2}));
  SfaStep hit({0, 3, 5}, {9, 2});
  hit.in.chunked_prefill_enabled = false;
  EXPECT_EQ(hit.run().state, AttentionState::PrefillCacheHit);
  hit.in.attn_state = AttentionState::DecodeOnly;
  EXPECT_EQ(hit.run().state, AttentionState::DecodeOnly);
}

TEST(PlanSfaStep, EmptyBatch) {
  SfaStep s({0}, {});
  const SfaStepPlan p = s.run(3);
  EXPECT_EQ(p.state, AttentionState::DecodeOnly);
  EXPECT_EQ(p.num_kernel_reqs, 0);
  EXPECT_EQ(first(s.slots, 3), (std::vector<int64_t>{-1, -1, -1}));
  EXPECT_EQ(first(s.pos, 3), (std::vector<int32_t>{0, 0, 0}));
}

TEST(PlanSfaStep, ZeroCopyStagedTable) {
  SfaStep s({0, 1, 2}, {5, 9});
  s.in.pad_decode_batch = true;
  // The engine keeps its rows in the staging table itself.
  std::copy(s.table.begin(), s.table.end(), s.bt.begin());
  s.in.query_start_loc = s.qsl;
  s.in.seq_lens = s.seq;
  s.in.block_table = {s.bt.data(), s.table.size()};
  s.in.num_input_tokens = 4;
  s.bt[2 * 6] = 77;  // a stale row past the batch: becomes the dummy's zero row
  const SfaStepPlan p = plan_sfa_step(s.in, s.buffers());
  EXPECT_EQ(p.num_kernel_reqs, 4);
  EXPECT_EQ(first(s.bt, 12), s.table);
  EXPECT_EQ(std::vector<int32_t>(s.bt.begin() + 12, s.bt.begin() + 24), std::vector<int32_t>(12, 0));
  const auto want = aar_test::naive_slots(s.qsl, s.seq, s.table, s.stride, 4, 4);
  EXPECT_EQ(first(s.slots, 4), std::vector<int64_t>(want.begin(), want.end()));
  // Zero copy with another stride is rejected.
  s.in.block_table_stride = 5;
  EXPECT_INVALID(plan_sfa_step(s.in, s.buffers()), "is the staged buffer (zero copy) but block_table_stride=5");
}

TEST(PlanSfaStep, NarrowerInputRowsAreZeroPadded) {
  SfaStep s({0, 2}, {6}, 4, 2);
  s.size_for(4, 16, 5);
  s.run();
  EXPECT_EQ(first(s.bt, 5), (std::vector<int32_t>{s.table[0], s.table[1], 0, 0, 0}));
}

TEST(PlanSfaStep, GraphDecodePaddingAddsDummyRequests) {
  SfaStep s({0, 1, 2}, {5, 9});
  s.in.pad_decode_batch = true;
  const SfaStepPlan p = s.run(5);
  EXPECT_TRUE(p.padded);
  EXPECT_EQ(p.num_reqs, 2);
  EXPECT_EQ(p.num_kernel_reqs, 5);
  EXPECT_EQ(p.split, (SplitResult{2, 0, 2, 0}));
  EXPECT_EQ(first(s.cql, 5), (std::vector<int32_t>{1, 2, 3, 4, 5}));
  EXPECT_EQ(first(s.kv, 5), (std::vector<int32_t>{5, 9, 0, 0, 0}));
  EXPECT_EQ(first(s.cql_list, 5), (std::vector<int64_t>{1, 2, 3, 4, 5}));
  EXPECT_EQ(first(s.kv_list, 5), (std::vector<int64_t>{5, 9, 0, 0, 0}));
  EXPECT_EQ(std::vector<int32_t>(s.bt.begin() + 12, s.bt.begin() + 30), std::vector<int32_t>(18, 0));
  EXPECT_EQ(first(s.pos, 5), (std::vector<int32_t>{4, 8, 0, 0, 0}));
  EXPECT_EQ(std::vector<int64_t>(s.slots.begin() + 2, s.slots.begin() + 5), std::vector<int64_t>(3, -1));
  EXPECT_EQ(s.cql[5], -7);
}

TEST(PlanSfaStep, GraphDecodePaddingSpeculativeDummiesTakeTheDecodeLength) {
  SfaStep s({0, 2, 3}, {7, 3});  // q = 2 and 1: both decodes with threshold 2
  s.in.pad_decode_batch = true;
  s.in.decode_threshold = 2;
  const SfaStepPlan p = s.run(7);
  EXPECT_EQ(p.num_kernel_reqs, 4);
  EXPECT_EQ(first(s.cql, 4), (std::vector<int32_t>{2, 3, 5, 7}));
  EXPECT_EQ(first(s.kv, 4), (std::vector<int32_t>{7, 3, 0, 0}));
  SfaStep odd({0, 2, 4}, {7, 3});
  odd.in.pad_decode_batch = true;
  odd.in.decode_threshold = 2;
  const auto before = odd.snapshot();
  EXPECT_INVALID(odd.run(7), "graph decode padding: num_input_tokens=7 pads 4 decode tokens by 3, not a multiple "
                             "of the decode length 2");
  EXPECT_EQ(odd.snapshot(), before);
}

TEST(PlanSfaStep, GraphDecodePaddingOnlyPadsDecodeOnlySteps) {
  SfaStep s({0, 1, 4}, {5, 9});
  s.in.pad_decode_batch = true;
  const SfaStepPlan p = s.run(7);
  EXPECT_FALSE(p.padded);
  EXPECT_EQ(p.num_kernel_reqs, 2);
  EXPECT_EQ(s.cql[2], -7);
  EXPECT_EQ(std::vector<int64_t>(s.slots.begin() + 4, s.slots.begin() + 7), std::vector<int64_t>(3, -1));
  // Without the flag a decode-only step is not padded either.
  SfaStep d({0, 1, 2}, {5, 9});
  EXPECT_EQ(d.run(5).num_kernel_reqs, 2);
}

TEST(PlanSfaStep, GraphDecodePaddingBeyondTheRoomIsRejected) {
  SfaStep s({0, 1, 2}, {5, 9}, 4, 6, 40, /*reqs=*/4);
  s.in.pad_decode_batch = true;
  const auto before = s.snapshot();
  EXPECT_INVALID(s.run(7), "graph decode padding: 2 decodes + 5 dummy requests (num_input_tokens=7) exceed the room "
                           "for 4 requests");
  EXPECT_EQ(s.snapshot(), before);
  EXPECT_EQ(s.run(4).num_kernel_reqs, 4);
}

TEST(PlanSfaStep, EveryBadInputIsRejectedByNameWithoutWriting) {
  SfaStep s({0, 1, 4}, {6, 13});
  const auto before = s.snapshot();
  auto expect_bad = [&](const std::string& want, int32_t t_in = 0) {
    EXPECT_INVALID(s.run(t_in), want);
    EXPECT_EQ(s.snapshot(), before) << want;
  };
  s.table[1] = 40;
  expect_bad("block_table[0][1]=40 is out of range [0, 40)");
  s.table[1] = -1;
  expect_bad("block_table[0][1]=-1 is out of range [0, 40)");
  s.table[1] = 3;
  s.in.rope_positions = 12;
  expect_bad("seq_lens[1]=13 exceeds the RoPE table length 12");
  s.in.rope_positions = 24;
  expect_bad("num_input_tokens=2 is smaller than query_start_loc[2]=4", 2);
  expect_bad("num_input_tokens=-1 is negative", -1);
  s.seq[0] = 0;
  expect_bad("seq_lens[0]=0 is smaller than its query length 1");
  s.seq[0] = -3;
  expect_bad("seq_lens[0]=-3 is smaller than its query length 1");
  s.seq[0] = 25;
  expect_bad("seq_lens[0]=25 needs 7 blocks but block_table_stride=6");
  s.seq[0] = 6;
  s.qsl = {0, 2, 1};
  expect_bad("query_start_loc must be non-decreasing");
  s.qsl = {1, 2, 4};
  expect_bad("query_start_loc[0]=1 must be 0");
  s.qsl = {0, 1};
  expect_bad("query_start_loc has 2 entries, expected seq_lens.size()+1 = 3");
  s.qsl = {0, 1, 4};
  s.spec = {0};
  expect_bad("num_spec_tokens has 1 entries, expected 0 or 2");
  s.spec = {0, 4};
  expect_bad("num_spec_tokens[1]=4 is out of range [0, query length 3]");
  s.spec = {-1, 0};
  expect_bad("num_spec_tokens[0]=-1 is out of range");
  s.spec = {};
  s.in.decode_threshold = 17;
  expect_bad("decode_threshold=17 is out of range [1, 16]");
  s.in.decode_threshold = 0;
  expect_bad("decode_threshold=0 is out of range [1, 16]");
  s.in.decode_threshold = 1;
  s.in.spec_method = static_cast<SpecMethod>(5);
  expect_bad("spec_method=5 is not a SpecMethod");
  s.in.spec_method = SpecMethod::None;
  s.in.attn_state = static_cast<AttentionState>(9);
  expect_bad("state=9 is not an AttentionState");
  s.in.attn_state.reset();
  s.in.block_size = 0;
  expect_bad("block_size=0 must be positive");
  s.in.block_size = 4;
  s.in.num_blocks = -1;
  expect_bad("num_blocks=-1 is negative");
  s.in.num_blocks = 1 << 30;
  expect_bad("exceeds the int32 slot range");
  s.in.num_blocks = 40;
  s.in.block_table_stride = 7;
  expect_bad("block_table has 12 entries, fewer than num_reqs*block_table_stride = 2*7 = 14");
  s.in.block_table_stride = 6;
  // Room in every required buffer.
  SfaStepBuffers b = s.buffers();
  s.in.query_start_loc = s.qsl;
  s.in.seq_lens = s.seq;
  s.in.block_table = s.table;
  s.in.num_input_tokens = 0;
  auto expect_room = [&](SfaStepBuffers bad, const std::string& want) {
    EXPECT_INVALID(plan_sfa_step(s.in, bad), want);
    EXPECT_EQ(s.snapshot(), before) << want;
  };
  SfaStepBuffers x = b;
  x.cum_query_lens = {s.cql.data(), 1};
  expect_room(x, "buffers.cum_query_lens has room for 1 entries, needs 2");
  x = b;
  x.seq_lens = {s.kv.data(), 1};
  expect_room(x, "buffers.seq_lens has room for 1 entries, needs 2");
  x = b;
  x.block_table = {s.bt.data(), 11};
  expect_room(x, "buffers.block_table has room for 11 entries, needs 12");
  x = b;
  x.block_table_stride = 5;
  expect_room(x, "buffers.block_table_stride=5 is smaller than block_table_stride=6");
  x = b;
  x.slot_mapping = {s.slots.data(), 3};
  expect_room(x, "buffers.slot_mapping has room for 3 entries, needs 4");
  x = b;
  x.positions = {s.pos.data(), 3};
  expect_room(x, "buffers.positions has room for 3 entries, needs 4");
  x = b;
  x.query_start_loc = {s.qsl_out.data(), 2};
  expect_room(x, "buffers.query_start_loc has room for 2 entries, needs 3");
  x = b;
  x.cum_query_lens_list = {s.cql_list.data(), 1};
  expect_room(x, "buffers.cum_query_lens_list has room for 1 entries, needs 2");
  // Then a good call writes.
  s.run();
  EXPECT_NE(s.snapshot(), before);
}

TEST(PlanSfaStep, StaleIdsPastARowsNeededBlocksAreNotRead) {
  SfaStep s({0, 1, 2}, {5, 4});
  for (int c = 2; c < 6; ++c) s.table[c] = -9;       // request 0 reads 2 blocks
  for (int c = 1; c < 6; ++c) s.table[6 + c] = 999;  // request 1 reads 1 block
  s.run();
  const auto want = aar_test::naive_slots(s.qsl, s.seq, s.table, s.stride, 4, 2);
  EXPECT_EQ(first(s.slots, 2), std::vector<int64_t>(want.begin(), want.end()));
}

TEST(PlanSfaStep, DecodeSlotsPastTheScanStash) {
  // More one-token requests than the scan stashes (1024): the tail gathers.
  const std::size_t b = 1500;
  std::vector<int32_t> qsl(b + 1), seq(b);
  std::iota(qsl.begin(), qsl.end(), 0);
  for (std::size_t r = 0; r < b; ++r) seq[r] = static_cast<int32_t>(1 + (r * 37) % 64);
  SfaStep s(qsl, seq, 16, 4, 64, b, b);
  s.in.rope_positions = 0;
  s.run();
  const auto want = aar_test::naive_slots(s.qsl, s.seq, s.table, s.stride, 16, b);
  EXPECT_EQ(s.slots, std::vector<int64_t>(want.begin(), want.end()));
  for (std::size_t r = 0; r < b; ++r) ASSERT_EQ(s.pos[r], seq[r] - 1);
}

TEST(PlanSfaStep, RandomBatchesMatchTheNaiveModel) {
  std::mt19937 rng(1234);
  auto uni = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  for (int it = 0; it < 3000; ++it) {
    const int32_t bs = std::vector<int32_t>{16, 48, 128, 3}[it % 4];
    const int32_t thr = uni(1, 4);
    const int32_t in_stride = uni(1, 6), out_stride = in_stride + uni(0, 2);
    const int32_t nb = uni(1, 70);
    const bool pad = uni(0, 1) == 1, staged = uni(0, 3) == 0, decode_only = uni(0, 2) == 0;
    const std::size_t b = static_cast<std::size_t>(uni(0, 9));
    std::vector<int32_t> q(b), seq(b), spec;
    for (std::size_t r = 0; r < b; ++r) {
      q[r] = decode_only ? uni(1, thr) : (uni(0, 1) ? uni(0, thr) : uni(1, 3 * bs));
      const int32_t cap = in_stride * bs;
      if (q[r] > cap) q[r] = cap;
      seq[r] = std::min(cap, q[r] + std::vector<int32_t>{0, bs, uni(0, cap)}[uni(0, 2)]);
    }
    const bool with_spec = uni(0, 3) == 0;
    if (with_spec) {
      for (std::size_t r = 0; r < b; ++r) spec.push_back(uni(0, q[r]));
    }
    std::vector<int32_t> qsl = aar_test::lens_to_qsl(q);
    const int32_t t_real = qsl.back();
    const int32_t t_in = t_real + (uni(0, 2) == 0 ? 0 : uni(0, 3) * thr);
    const std::size_t reqs = b + static_cast<std::size_t>((t_in - t_real) / thr) + 1;
    SfaOutputs out;
    out.size_for(reqs, static_cast<std::size_t>(t_in) + 2, out_stride);
    std::vector<int32_t> table(b * in_stride);
    for (auto& id : table) id = uni(0, nb - 1);
    SfaStepInputs in;
    in.query_start_loc = qsl;
    in.seq_lens = seq;
    in.block_table_stride = in_stride;
    in.block_size = bs;
    in.num_blocks = nb;
    in.num_input_tokens = t_in;
    in.decode_threshold = thr;
    in.num_spec_tokens = spec;
    in.spec_method = with_spec ? SpecMethod::Mtp : SpecMethod::None;
    in.chunked_prefill_enabled = uni(0, 1) == 1;
    in.pad_decode_batch = pad;
    const int32_t stride_used = staged ? in_stride : out_stride;
    if (staged) {
      out.size_for(reqs, static_cast<std::size_t>(t_in) + 2, in_stride);
      std::copy(table.begin(), table.end(), out.bt.begin());
      in.block_table = {out.bt.data(), table.size()};
    } else {
      in.block_table = table;
    }
    const SfaStepPlan p = plan_sfa_step(in, out.buffers());
    const Naive n = naive(qsl, seq, table, in_stride, stride_used, bs, t_in, thr, pad);
    const std::string ctx = "it=" + std::to_string(it);
    ASSERT_EQ(p.num_kernel_reqs, n.bk) << ctx;
    EXPECT_EQ(first(out.cql, n.bk), n.cql) << ctx;
    EXPECT_EQ(first(out.kv, n.bk), n.kv) << ctx;
    EXPECT_EQ(std::vector<int64_t>(out.cql_list.begin(), out.cql_list.begin() + n.bk),
              std::vector<int64_t>(n.cql.begin(), n.cql.end()))
        << ctx;
    EXPECT_EQ(first(out.bt, n.bk * stride_used), n.bt) << ctx;
    EXPECT_EQ(first(out.slots, t_in), n.slots) << ctx;
    EXPECT_EQ(first(out.pos, t_in), n.pos) << ctx;
    EXPECT_EQ(out.slots[t_in], -7) << ctx;
    EXPECT_EQ(out.cql[n.bk], -7) << ctx;
    EXPECT_EQ(first(out.qsl_out, b + 1), qsl) << ctx;
    // State: the shared selection over computed = seq - q, scheduled = q.
    std::vector<int32_t> computed(b);
    for (std::size_t r = 0; r < b; ++r) computed[r] = seq[r] - q[r];
    StateInputs si;
    si.num_computed_tokens = computed;
    si.num_scheduled_tokens = q;
    si.num_spec_tokens = spec;
    si.spec_method = in.spec_method;
    si.chunked_prefill_enabled = in.chunked_prefill_enabled;
    EXPECT_EQ(p.state, select_attention_state(si)) << ctx;
    // Split: the leading decodes.
    std::size_t nd = 0;
    while (nd < b && q[nd] <= thr) ++nd;
    const int32_t max_q = b ? *std::max_element(q.begin(), q.end()) : 0;
    if (b > 0 && max_q <= thr) nd = b;
    EXPECT_EQ(p.split.num_decodes, static_cast<int32_t>(nd)) << ctx;
    EXPECT_EQ(p.split.num_decode_tokens, qsl[nd]) << ctx;
    EXPECT_EQ(p.split.num_prefills, static_cast<int32_t>(b - nd)) << ctx;
    EXPECT_EQ(p.max_query_len, max_q) << ctx;
    EXPECT_EQ(p.max_seq_len, b ? *std::max_element(seq.begin(), seq.end()) : 0) << ctx;
  }
}

TEST(PlanSfaStep, RandomBadBlockIdsAreNamed) {
  std::mt19937 rng(99);
  auto uni = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  for (int it = 0; it < 500; ++it) {
    const std::size_t b = static_cast<std::size_t>(uni(1, 12));
    std::vector<int32_t> q(b), seq(b);
    for (std::size_t r = 0; r < b; ++r) {
      q[r] = uni(0, 2) ? 1 : uni(1, 20);
      seq[r] = q[r] + uni(0, 40);
    }
    SfaStep s(aar_test::lens_to_qsl(q), seq, 16, 4, std::vector<int32_t>{32, 40}[it % 2], b, 200);
    s.in.rope_positions = 0;
    const std::size_t r = static_cast<std::size_t>(uni(0, static_cast<int>(b) - 1));
    const int32_t need = (seq[r] + 15) / 16;
    if (need == 0) continue;
    const int32_t c = uni(0, need - 1);
    const int32_t bad = std::vector<int32_t>{-1, s.in.num_blocks, INT32_MIN, INT32_MAX}[uni(0, 3)];
    s.table[r * 4 + c] = bad;
    const auto before = s.snapshot();
    EXPECT_INVALID(s.run(), "block_table[" + std::to_string(r) + "][" + std::to_string(c) + "]=" +
                                std::to_string(bad) + " is out of range");
    EXPECT_EQ(s.snapshot(), before);
  }
}

// ---------------------------------------------------------------- build_valid_topk_mask

TEST(PlanSfaTopkMask, SpecFormula) {
  // Two rows of K = 4, thresholds 3 and 0.
  const std::vector<int32_t> topk = {0, 2, 3, -1, 0, 1, -1, 7};
  const std::vector<int32_t> thr = {3, 0};
  std::vector<uint8_t> out(8, 9);
  build_valid_topk_mask(topk, 4, thr, out);
  EXPECT_EQ(out, (std::vector<uint8_t>{1, 1, 0, 0, 0, 0, 0, 0}));
  // Extremes: INT32_MIN / INT32_MAX indices, an INT32_MAX threshold.
  const std::vector<int32_t> t2 = {INT32_MIN, INT32_MAX, 5, 0};
  const std::vector<int32_t> th2 = {INT32_MAX};
  std::vector<uint8_t> o2(4);
  build_valid_topk_mask(t2, 4, th2, o2);
  EXPECT_EQ(o2, (std::vector<uint8_t>{0, 0, 1, 1}));
}

TEST(PlanSfaTopkMask, RandomAgainstTheFormula) {
  std::mt19937 rng(5);
  auto uni = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  for (int it = 0; it < 200; ++it) {
    const int32_t K = uni(1, 33);
    const std::size_t rows = static_cast<std::size_t>(uni(0, 9));
    std::vector<int32_t> topk(rows * K), thr(rows);
    for (auto& x : topk) x = uni(-3, 50);
    for (auto& x : thr) x = uni(0, 60);
    std::vector<uint8_t> out(topk.size() + 1, 9);
    build_valid_topk_mask(topk, K, thr, out);
    for (std::size_t i = 0; i < topk.size(); ++i) {
      ASSERT_EQ(out[i], static_cast<uint8_t>(topk[i] >= 0 && topk[i] < thr[i / K])) << it << " " << i;
    }
    EXPECT_EQ(out[topk.size()], 9);
  }
}

TEST(PlanSfaTopkMask, BadInputIsRejectedWithoutWriting) {
  const std::vector<int32_t> topk = {0, 1, 2, 3, 4, 5};
  std::vector<uint8_t> out(6, 9);
  const std::vector<int32_t> thr2 = {3, 3}, thr1 = {3}, neg = {3, -1};
  EXPECT_INVALID(build_valid_topk_mask(topk, 0, thr2, out), "K (index_topk) must be positive, got 0");
  EXPECT_INVALID(build_valid_topk_mask(topk, 4, thr2, out), "topk has 6 entries, not a multiple of K=4");
  EXPECT_INVALID(build_valid_topk_mask(topk, 3, thr1, out), "thresholds_per_row has 1 entries, expected one per");
  EXPECT_INVALID(build_valid_topk_mask(topk, 3, neg, out), "thresholds_per_row[1]=-1 is negative");
  std::vector<uint8_t> small(5, 9);
  EXPECT_INVALID(build_valid_topk_mask(topk, 3, thr2, small), "out has room for 5 entries, needs 6");
  EXPECT_EQ(out, std::vector<uint8_t>(6, 9));
  EXPECT_EQ(small, std::vector<uint8_t>(5, 9));
}

// SFA DCP with the replicated indexer (docs/design/sparse_cp.md §2): the step's local slots and lengths and the
// replicated indexer views equal the shared CP plan functions' (and the layout's formulas), over random batches;
// graph padding rows are empty; a rejected step writes nothing.

namespace {

struct SfaDcpOutputs {
  std::vector<int32_t> blens, dseq, rep;
  std::vector<int64_t> dseq_list, rslots;
  int32_t rstride = 0;
  void size_for(std::size_t reqs, std::size_t tokens, int32_t stride, int32_t world) {
    rstride = stride * world;
    blens.assign(reqs, -7);
    dseq.assign(reqs, -7);
    dseq_list.assign(reqs, -7);
    rep.assign(reqs * rstride, -7);
    rslots.assign(tokens, -7);
  }
  void add_to(SfaStepBuffers& b) {
    b.dcp_block_lens = blens;
    b.dcp_seq_lens = dseq;
    b.dcp_seq_lens_list = dseq_list;
    b.replicated_block_table = rep;
    b.replicated_stride = rstride;
    b.replicated_slot_mapping = rslots;
  }
};

}  // namespace

TEST(PlanSfaStep, DcpViewsEqualTheSharedFunctions) {
  std::mt19937 rng(11);
  for (int iter = 0; iter < 200; ++iter) {
    const int32_t W = 1 + static_cast<int32_t>(rng() % 4) + 1;  // 2..5
    const int32_t bs = 8, I = std::vector<int32_t>{1, 2, 4, 8}[rng() % 4];
    const std::size_t B = 1 + rng() % 6;
    // Every other iteration a decode step of one token per request (the plan's one-token pass).
    const bool one_token = iter % 2 == 0;
    std::vector<int32_t> qsl{0}, seq;
    for (std::size_t r = 0; r < B; ++r) {
      const int32_t s = 1 + static_cast<int32_t>(rng() % 60);
      const int32_t q = one_token ? 1 : 1 + static_cast<int32_t>(rng() % std::min(s, 5));
      seq.push_back(s);
      qsl.push_back(qsl.back() + q);
    }
    const int32_t stride = 8, nb = 64;
    std::vector<int32_t> table(B * stride);
    for (auto& v : table) v = static_cast<int32_t>(rng() % nb);
    const int32_t t_real = qsl.back(), t_in = t_real + static_cast<int32_t>(rng() % 3);
    for (int32_t rank = 0; rank < W; ++rank) {
      SfaOutputs o;
      o.size_for(8, 64, stride);
      SfaDcpOutputs d;
      d.size_for(8, 64, stride, W);
      SfaStepInputs in;
      in.query_start_loc = qsl;
      in.seq_lens = seq;
      in.block_table = table;
      in.block_table_stride = stride;
      in.block_size = bs;
      in.num_blocks = nb;
      in.num_input_tokens = t_in;
      in.dcp = DcpShard{W, rank, I};
      SfaStepBuffers buf = o.buffers();
      d.add_to(buf);
      const SfaStepPlan p = plan_sfa_step(in, buf);
      ASSERT_EQ(p.num_kernel_reqs, static_cast<int32_t>(B));
      // main cache: the local slots of compute_dcp_slot_mapping, the local lengths
      std::vector<int32_t> want_slots(t_in);
      SlotMappingInputs si{qsl, seq, table, stride, bs, nb};
      compute_dcp_slot_mapping(si, DcpShard{W, rank, I}, want_slots);
      for (int32_t t = 0; t < t_in; ++t) ASSERT_EQ(o.slots[t], want_slots[t]) << "token " << t;
      for (std::size_t r = 0; r < B; ++r) {
        ASSERT_EQ(d.dseq[r], dcp_local_len(seq[r], W, I, rank));
        ASSERT_EQ(d.dseq_list[r], d.dseq[r]);
        ASSERT_EQ(o.kv[r], seq[r]);  // the indexer's global lengths
      }
      // indexer: the replicated views of the shared functions
      std::vector<int32_t> rep(B * d.rstride, -9);
      std::vector<int64_t> rslots(t_in, -9);
      DcpReplicatedInputs ri;
      ri.block_table = table;
      ri.block_table_stride = stride;
      ri.seq_lens = seq;
      ri.world = W;
      ri.block_size = bs;
      ri.num_blocks = nb;
      dcp_replicated_block_table(ri, rep, d.rstride);
      dcp_replicated_slot_mapping(qsl, seq, rep, d.rstride, bs, rslots);
      ASSERT_EQ(first(d.rep, rep.size()), rep);
      ASSERT_EQ(first(d.rslots, rslots.size()), rslots);
    }
  }
}

TEST(PlanSfaStep, DcpPaddingAndRejections) {
  SfaStep s({0, 1, 2}, {9, 17}, /*bs=*/4, /*stride=*/6);
  SfaDcpOutputs d;
  d.size_for(8, 64, 6, 2);
  s.in.dcp = DcpShard{2, 1, 2};
  s.in.pad_decode_batch = true;
  s.in.query_start_loc = s.qsl;
  s.in.seq_lens = s.seq;
  s.in.block_table = s.table;
  s.in.num_input_tokens = 4;
  SfaStepBuffers buf = s.buffers();
  d.add_to(buf);
  const SfaStepPlan p = plan_sfa_step(s.in, buf);
  EXPECT_EQ(p.num_kernel_reqs, 4);
  const auto local9 = static_cast<int32_t>(dcp_local_len(9, 2, 2, 1));
  const auto local17 = static_cast<int32_t>(dcp_local_len(17, 2, 2, 1));
  EXPECT_EQ(first(d.dseq, 4), (std::vector<int32_t>{local9, local17, 0, 0}));
  EXPECT_EQ(d.rslots[2], -1);
  EXPECT_EQ(d.rslots[3], -1);
  for (int32_t c = 0; c < 12; ++c) EXPECT_EQ(d.rep[2 * 12 + c], 0);
  // Rejections write nothing: an out-of-range block id in a column rank 0 reads, a bad shard, a
  // replicated stride too narrow, DCP outputs without DCP.
  SfaStep r({0, 1, 3}, {9, 17}, 4, 6);
  SfaDcpOutputs rd;
  rd.size_for(8, 64, 6, 2);
  r.table[0] = 99;
  r.in.dcp = DcpShard{2, 0, 2};
  r.in.query_start_loc = r.qsl;
  r.in.seq_lens = r.seq;
  r.in.block_table = r.table;
  SfaStepBuffers rb = r.buffers();
  rd.add_to(rb);
  const auto before = r.snapshot();
  const auto rep_before = rd.rep;
  EXPECT_INVALID(plan_sfa_step(r.in, rb), "block_table[0][0]=99");
  r.table[0] = 1;
  r.in.dcp = DcpShard{2, 2, 2};
  EXPECT_INVALID(plan_sfa_step(r.in, rb), "dcp: rank 2 of world size 2");
  r.in.dcp = DcpShard{2, 0, 3};
  EXPECT_INVALID(plan_sfa_step(r.in, rb), "cp_kv_cache_interleave_size=3 must be positive and divide block_size=4");
  r.in.dcp = DcpShard{2, 0, 2};
  rb.replicated_stride = 11;
  EXPECT_INVALID(plan_sfa_step(r.in, rb), "buffers.replicated_stride=11");
  rb.replicated_stride = 12;
  r.in.dcp = DcpShard{};
  EXPECT_INVALID(plan_sfa_step(r.in, rb), "the DCP outputs are given but dcp.world is 1");
  EXPECT_EQ(r.snapshot(), before);
  EXPECT_EQ(rd.rep, rep_before);
  EXPECT_EQ(rd.dseq, std::vector<int32_t>(8, -7));
}

// SFA PCP's flags (docs/design/sparse_cp.md §11.1): a padded step must be decode-only by the split (under DCP a
// fresh request is a prefill even with a short query), a capture build must be decode-only; both refused
// before any write.
TEST(PlanSfaStep, PcpPadsAndCapturesDecodeOnlySteps) {
  auto run = [](SfaStep& s, SfaDcpOutputs& d, int32_t n_in) {
    s.in.dcp = DcpShard{2, 1, 2};
    s.in.pad_decode_batch = true;
    s.in.pad_only_decode_buckets = true;
    s.in.query_start_loc = s.qsl;
    s.in.seq_lens = s.seq;
    s.in.block_table = s.table;
    s.in.num_input_tokens = n_in;
    SfaStepBuffers buf = s.buffers();
    d.add_to(buf);
    return plan_sfa_step(s.in, buf);
  };
  // Decode-only: padded to the bucket, and accepted by a capture build.
  SfaStep dec({0, 1, 2}, {9, 17}, 4, 6);
  SfaDcpOutputs dd;
  dd.size_for(8, 64, 6, 2);
  dec.in.capture_decode_only = true;
  const SfaStepPlan p = run(dec, dd, 4);
  EXPECT_TRUE(p.padded);
  EXPECT_EQ(p.num_kernel_reqs, 4);
  // A prefill (query 3 > 1), and a fresh one-token request (the DCP split's prefill): refused padded and at
  // capture, nothing written; unpadded and outside a capture the step is planned.
  for (const auto& [qsl, seq] : {std::pair<std::vector<int32_t>, std::vector<int32_t>>{{0, 1, 4}, {9, 17}},
                                 std::pair<std::vector<int32_t>, std::vector<int32_t>>{{0, 1, 2}, {9, 1}}}) {
    SfaStep s(qsl, seq, 4, 6);
    SfaDcpOutputs d;
    d.size_for(8, 64, 6, 2);
    const auto before = s.snapshot();
    EXPECT_INVALID(run(s, d, qsl.back() + 2), "only a decode-only step is padded to a graph bucket here (this one "
                                              "has 1 prefills");
    s.in.capture_decode_only = true;
    EXPECT_NOT_SUPPORTED(run(s, d, 0), "SFA PCP captures decode-only buckets only; this step has 1 prefills");
    EXPECT_EQ(s.snapshot(), before);
    EXPECT_EQ(d.dseq, std::vector<int32_t>(8, -7));
    s.in.capture_decode_only = false;
    EXPECT_EQ(run(s, d, 0).split.num_prefills, 1);
  }
}

// SfaStepBuffers::replicated_extent: a buffer reused over steps whose requests shrink, grow, get
// padded or disappear, with its extent record kept, holds exactly the replicated table a fresh
// buffer gets (tails zero), and the record says each row's written columns.
TEST(PlanSfaStep, DcpReplicatedExtentKeepsRowsExact) {
  std::mt19937 rng(23);
  const int32_t W = 2, bs = 8, stride = 8, nb = 64, cap = 6;
  SfaOutputs o;
  o.size_for(cap, 64, stride);
  SfaDcpOutputs kept;
  kept.size_for(cap, 64, stride, W);
  for (auto& v : kept.rep) v = 0;  // a zero-filled staging buffer: nothing written yet
  std::vector<int32_t> extent(cap, 0);
  for (int iter = 0; iter < 300; ++iter) {
    const std::size_t B = 1 + rng() % 4;
    std::vector<int32_t> qsl{0}, seq;
    for (std::size_t r = 0; r < B; ++r) {
      const int32_t s = 1 + static_cast<int32_t>(rng() % 120);
      seq.push_back(s);
      qsl.push_back(qsl.back() + 1);
    }
    std::vector<int32_t> table(B * stride);
    for (auto& v : table) v = static_cast<int32_t>(rng() % nb);
    const bool pad = rng() % 3 == 0;
    SfaStepInputs in;
    in.query_start_loc = qsl;
    in.seq_lens = seq;
    in.block_table = table;
    in.block_table_stride = stride;
    in.block_size = bs;
    in.num_blocks = nb;
    in.num_input_tokens = qsl.back() + (pad ? static_cast<int32_t>(rng() % 2) : 0);
    in.pad_decode_batch = pad;
    in.dcp = DcpShard{W, static_cast<int32_t>(iter % W), 1};
    SfaStepBuffers buf = o.buffers();
    kept.add_to(buf);
    buf.replicated_extent = extent;
    const SfaStepPlan p = plan_sfa_step(in, buf);
    SfaOutputs fo;
    fo.size_for(cap, 64, stride);
    SfaDcpOutputs fresh;
    fresh.size_for(cap, 64, stride, W);
    SfaStepBuffers fb = fo.buffers();
    fresh.add_to(fb);
    plan_sfa_step(in, fb);
    const std::size_t rows = static_cast<std::size_t>(p.num_kernel_reqs) * kept.rstride;
    ASSERT_EQ(first(kept.rep, rows), first(fresh.rep, rows)) << "step " << iter;
    ASSERT_EQ(first(kept.rslots, in.num_input_tokens), first(fresh.rslots, in.num_input_tokens));
    for (int32_t r = 0; r < p.num_kernel_reqs; ++r) {
      const int32_t cols = r < static_cast<int32_t>(B) ? (seq[r] + bs - 1) / bs : 0;
      ASSERT_EQ(extent[r], cols);
    }
    // Every row's columns past its record are zero (rows past B_k included).
    for (int32_t r = 0; r < cap; ++r) {
      for (int32_t c = extent[r]; c < kept.rstride; ++c) ASSERT_EQ(kept.rep[r * kept.rstride + c], 0);
    }
  }
}
