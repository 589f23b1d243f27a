#include <algorithm>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "ascend_attn_rt/gqa/plan/step_plan.h"
#include "test_plan_util.h"

using namespace aar::plan;
using aar_test::lens_to_qsl;
using aar_test::naive_slots;

namespace {

constexpr int32_t kSentinel = -12345;

// Owns the inputs and the caller buffers of one build_step call.
struct Step {
  std::vector<int32_t> qsl, seq_lens, table, spec;
  std::vector<uint8_t> is_prefilling;
  StepInputs in;
  int32_t buf_stride = 0;
  std::vector<int32_t> b_qsl, b_seq, b_slots, b_table;
  std::vector<int64_t> b_q_ends, b_kv;

  // Buffers sized for `max_reqs` requests (+ dummy) and `max_tokens` tokens.
  void alloc(std::size_t max_reqs, std::size_t max_tokens, int32_t stride) {
    buf_stride = stride;
    b_qsl.assign(max_reqs + 2, kSentinel);
    b_seq.assign(max_reqs + 1, kSentinel);
    b_slots.assign(max_tokens, kSentinel);
    b_table.assign((max_reqs + 1) * stride, kSentinel);
    b_q_ends.assign(max_reqs + 1, kSentinel);
    b_kv.assign(max_reqs + 1, kSentinel);
  }
  StepBuffers buffers() {
    StepBuffers b;
    b.query_start_loc = b_qsl;
    b.seq_lens = b_seq;
    b.slot_mapping = b_slots;
    b.block_table = b_table;
    b.block_table_stride = buf_stride;
    b.q_ends = b_q_ends;
    b.kv_lens = b_kv;
    return b;
  }
  StepPlan build() {
    in.query_start_loc = qsl;
    in.seq_lens = seq_lens;
    if (in.block_table.data() != b_table.data()) in.block_table = table;
    in.num_spec_tokens = spec;
    in.is_prefilling = is_prefilling;
    return build_step(in, buffers());
  }
  bool untouched() const {
    auto all = [](const auto& v) {
      for (auto x : v)
        if (x != kSentinel) return false;
      return true;
    };
    return all(b_qsl) && all(b_seq) && all(b_slots) && all(b_table) && all(b_q_ends) && all(b_kv);
  }
};

// Mixed batch: two decodes, one chunked-prefill continuation, one fresh prefill.
Step mixed() {
  Step s;
  s.qsl = lens_to_qsl({1, 1, 6, 5});
  s.seq_lens = {20, 33, 40, 5};
  s.in.block_size = 16;
  s.in.block_table_stride = 3;
  s.in.num_blocks = 64;
  s.table = {3, 1, 0,    //
             8, 9, 10,   //
             11, 12, 13, //
             14, 0, 0};
  s.alloc(8, 64, 4);
  return s;
}

}  // namespace

TEST(PlanStep, MixedBatchNoPadding) {
  Step s = mixed();
  StepPlan p = s.build();
  EXPECT_EQ(p.state, AttentionState::ChunkedPrefill);
  EXPECT_EQ(p.split, (SplitResult{2, 2, 2, 11}));
  EXPECT_EQ(p.num_reqs, 4);
  EXPECT_EQ(p.num_actual_tokens, 13);
  EXPECT_EQ(p.num_input_tokens, 13);
  EXPECT_EQ(p.max_query_len, 6);
  EXPECT_EQ(p.max_seq_len, 40);
  EXPECT_EQ(p.fia.num_reqs, 4);
  EXPECT_EQ(p.fia.num_tokens, 13);
  EXPECT_FALSE(p.fia.added_dummy);

  EXPECT_EQ(std::vector<int32_t>(s.b_qsl.begin(), s.b_qsl.begin() + 5), s.qsl);
  EXPECT_EQ(s.b_qsl[5], kSentinel);
  EXPECT_EQ(std::vector<int32_t>(s.b_seq.begin(), s.b_seq.begin() + 4), s.seq_lens);
  EXPECT_EQ(s.b_seq[4], kSentinel);
  EXPECT_EQ(std::vector<int64_t>(s.b_q_ends.begin(), s.b_q_ends.begin() + 4), (std::vector<int64_t>{1, 2, 8, 13}));
  EXPECT_EQ(std::vector<int64_t>(s.b_kv.begin(), s.b_kv.begin() + 4), (std::vector<int64_t>{20, 33, 40, 5}));
  EXPECT_EQ(s.b_q_ends[4], kSentinel);
  // Staged table: 4 columns, the extra column zero-filled; no dummy row.
  const std::vector<int32_t> staged = {3, 1, 0, 0, 8, 9, 10, 0, 11, 12, 13, 0, 14, 0, 0, 0};
  EXPECT_EQ(std::vector<int32_t>(s.b_table.begin(), s.b_table.begin() + 16), staged);
  EXPECT_EQ(s.b_table[16], kSentinel);
  const auto ref = naive_slots(s.qsl, s.seq_lens, s.table, 3, 16, 13);
  EXPECT_EQ(std::vector<int32_t>(s.b_slots.begin(), s.b_slots.begin() + 13), ref);
  EXPECT_EQ(s.b_slots[13], kSentinel);
  // Spot check: request 0 token at pos 19 -> block 1 (id 1) -> 16 + 3.
  EXPECT_EQ(s.b_slots[0], 19);
}

TEST(PlanStep, FiaPaddingAddsDummy) {
  // docs/design/gqa.md §2.5 mixed case: 13 real tokens padded to 16 -> one dummy request [13, 16).
  Step s = mixed();
  s.in.num_input_tokens = 16;
  StepPlan p = s.build();
  EXPECT_EQ(p.num_input_tokens, 16);
  EXPECT_EQ(p.num_actual_tokens, 13);
  EXPECT_EQ(p.num_reqs, 4);
  EXPECT_TRUE(p.fia.added_dummy);
  EXPECT_EQ(p.fia.num_reqs, 5);
  EXPECT_EQ(p.fia.num_tokens, 16);
  EXPECT_EQ(p.split, (SplitResult{2, 2, 2, 11}));  // the split covers real requests only
  EXPECT_EQ(std::vector<int32_t>(s.b_qsl.begin(), s.b_qsl.begin() + 6), (std::vector<int32_t>{0, 1, 2, 8, 13, 16}));
  EXPECT_EQ(s.b_qsl[6], kSentinel);
  EXPECT_EQ(std::vector<int32_t>(s.b_seq.begin(), s.b_seq.begin() + 5), (std::vector<int32_t>{20, 33, 40, 5, 1}));
  EXPECT_EQ(std::vector<int64_t>(s.b_q_ends.begin(), s.b_q_ends.begin() + 5),
            (std::vector<int64_t>{1, 2, 8, 13, 16}));
  EXPECT_EQ(std::vector<int64_t>(s.b_kv.begin(), s.b_kv.begin() + 5), (std::vector<int64_t>{20, 33, 40, 5, 1}));
  for (int c = 0; c < 4; ++c) EXPECT_EQ(s.b_table[4 * 4 + c], 0);  // dummy row -> block 0
  EXPECT_EQ(s.b_table[5 * 4], kSentinel);
  for (int t = 13; t < 16; ++t) EXPECT_EQ(s.b_slots[t], -1);
  EXPECT_EQ(s.b_slots[16], kSentinel);
}

TEST(PlanStep, NoFiaPaddingLeavesTailUnattended) {
  Step s = mixed();
  s.in.num_input_tokens = 16;
  s.in.pad_fia_batch = false;
  StepPlan p = s.build();
  EXPECT_FALSE(p.fia.added_dummy);
  EXPECT_EQ(p.fia.num_reqs, 4);
  EXPECT_EQ(p.fia.num_tokens, 13);
  EXPECT_EQ(p.num_input_tokens, 16);
  EXPECT_EQ(s.b_qsl[5], kSentinel);
  EXPECT_EQ(s.b_seq[4], kSentinel);
  EXPECT_EQ(s.b_q_ends[4], kSentinel);
  EXPECT_EQ(s.b_table[16], kSentinel);
  for (int t = 13; t < 16; ++t) EXPECT_EQ(s.b_slots[t], -1);
  EXPECT_EQ(s.b_slots[16], kSentinel);
}

TEST(PlanStep, NumInputTokensEqualToRealAddsNoDummy) {
  Step s = mixed();
  s.in.num_input_tokens = 13;
  StepPlan p = s.build();
  EXPECT_FALSE(p.fia.added_dummy);
  EXPECT_EQ(p.fia.num_reqs, 4);
}

TEST(PlanStep, ZeroCopyBlockTable) {
  Step s = mixed();
  s.alloc(8, 64, 3);
  std::copy(s.table.begin(), s.table.end(), s.b_table.begin());
  s.in.block_table = CSpan<int32_t>(s.b_table.data(), s.table.size());
  s.in.num_input_tokens = 15;
  StepPlan p = s.build();
  EXPECT_TRUE(p.fia.added_dummy);
  EXPECT_EQ(std::vector<int32_t>(s.b_table.begin(), s.b_table.begin() + 12), s.table);
  for (int c = 0; c < 3; ++c) EXPECT_EQ(s.b_table[12 + c], 0);
  EXPECT_EQ(s.b_table[15], kSentinel);
  EXPECT_EQ(std::vector<int32_t>(s.b_slots.begin(), s.b_slots.begin() + 15),
            naive_slots(s.qsl, s.seq_lens, s.table, 3, 16, 15));

  // Zero copy needs matching strides.
  Step t = mixed();
  std::copy(t.table.begin(), t.table.end(), t.b_table.begin());
  t.in.block_table = CSpan<int32_t>(t.b_table.data(), t.table.size());
  EXPECT_INVALID(t.build(), "zero copy");
}

TEST(PlanStep, EmptyBatch) {
  Step s;
  s.qsl = {0};
  s.in.block_table_stride = 4;
  s.in.num_blocks = 8;
  s.alloc(0, 8, 4);
  StepPlan p = s.build();
  EXPECT_EQ(p.state, AttentionState::DecodeOnly);
  EXPECT_EQ(p.split, (SplitResult{0, 0, 0, 0}));
  EXPECT_EQ(p.num_reqs, 0);
  EXPECT_EQ(p.num_actual_tokens, 0);
  EXPECT_EQ(p.num_input_tokens, 0);
  EXPECT_EQ(p.max_query_len, 0);
  EXPECT_EQ(p.max_seq_len, 0);
  EXPECT_EQ(p.fia.num_reqs, 0);
  EXPECT_EQ(p.fia.num_tokens, 0);
  EXPECT_EQ(s.b_qsl[0], 0);
  EXPECT_EQ(s.b_qsl[1], kSentinel);
  EXPECT_EQ(s.b_slots[0], kSentinel);

  // Padded empty batch: one dummy request over all padded tokens.
  Step d;
  d.qsl = {0};
  d.in.block_table_stride = 2;
  d.alloc(0, 8, 2);
  d.in.num_input_tokens = 4;
  p = d.build();
  EXPECT_EQ(p.state, AttentionState::DecodeOnly);
  EXPECT_EQ(p.fia.num_reqs, 1);
  EXPECT_EQ(p.fia.num_tokens, 4);
  EXPECT_EQ(d.b_qsl[0], 0);
  EXPECT_EQ(d.b_qsl[1], 4);
  EXPECT_EQ(d.b_seq[0], 1);
  EXPECT_EQ(d.b_q_ends[0], 4);
  EXPECT_EQ(d.b_kv[0], 1);
  EXPECT_EQ(d.b_table[0], 0);
  EXPECT_EQ(d.b_table[1], 0);
  for (int t = 0; t < 4; ++t) EXPECT_EQ(d.b_slots[t], -1);
  EXPECT_EQ(d.b_slots[4], kSentinel);

  // Explicit state is kept even for an empty batch.
  Step e;
  e.qsl = {0};
  e.alloc(0, 0, 0);
  e.in.attn_state = AttentionState::ChunkedPrefill;
  EXPECT_EQ(e.build().state, AttentionState::ChunkedPrefill);
}

TEST(PlanStep, SingleDecodeRequest) {
  Step s;
  s.qsl = {0, 1};
  s.seq_lens = {129};
  s.table = {5, 6};
  s.in.block_size = 128;
  s.in.block_table_stride = 2;
  s.in.num_blocks = 7;
  s.alloc(1, 4, 2);
  StepPlan p = s.build();
  EXPECT_EQ(p.state, AttentionState::DecodeOnly);
  EXPECT_EQ(p.split, (SplitResult{1, 0, 1, 0}));
  EXPECT_EQ(s.b_slots[0], 6 * 128 + 0);
  EXPECT_EQ(p.max_seq_len, 129);
  EXPECT_EQ(p.max_query_len, 1);
}

TEST(PlanStep, AllPrefillAndStates) {
  Step s;
  s.qsl = lens_to_qsl({7, 3});
  s.seq_lens = {7, 3};
  s.table = {0, 1};
  s.in.block_table_stride = 1;
  s.in.num_blocks = 2;
  s.alloc(2, 10, 1);
  StepPlan p = s.build();
  EXPECT_EQ(p.state, AttentionState::PrefillNoCache);
  EXPECT_EQ(p.split, (SplitResult{0, 2, 0, 10}));

  // Prefix-cache hit without chunked prefill.
  Step h = s;
  h.alloc(2, 10, 1);
  h.seq_lens = {9, 3};
  h.in.chunked_prefill_enabled = false;
  EXPECT_EQ(h.build().state, AttentionState::PrefillCacheHit);
  h.in.chunked_prefill_enabled = true;
  EXPECT_EQ(h.build().state, AttentionState::ChunkedPrefill);
  // Explicit state wins over derivation.
  h.in.attn_state = AttentionState::SpecDecoding;
  EXPECT_EQ(h.build().state, AttentionState::SpecDecoding);
}

TEST(PlanStep, SpecDecodeBatch) {
  // Uniform speculative decode: 1 + 3 drafts each, threshold 4.
  Step s;
  s.qsl = lens_to_qsl({4, 4, 4});
  s.seq_lens = {10, 20, 30};
  s.table = {0, 1, 2};
  s.spec = {3, 3, 3};
  s.in.block_size = 128;
  s.in.block_table_stride = 1;
  s.in.num_blocks = 3;
  s.in.decode_threshold = 4;
  s.in.spec_method = SpecMethod::Mtp;
  s.alloc(3, 12, 1);
  StepPlan p = s.build();
  EXPECT_EQ(p.state, AttentionState::SpecDecoding);
  EXPECT_EQ(p.split, (SplitResult{3, 0, 12, 0}));
  s.in.spec_method = SpecMethod::Other;  // post-rule
  EXPECT_EQ(s.build().state, AttentionState::ChunkedPrefill);
  s.in.spec_method = SpecMethod::Mtp;
  s.qsl = lens_to_qsl({1, 1, 1});
  s.spec = {0, 0, 0};
  EXPECT_EQ(s.build().state, AttentionState::SpecDecoding);  // row 2 with MTP
  s.in.spec_method = SpecMethod::None;
  s.spec.clear();
  EXPECT_EQ(s.build().state, AttentionState::DecodeOnly);
}

TEST(PlanStep, ShortExtendsAsPrefills) {
  Step s;
  s.qsl = lens_to_qsl({1, 1, 1});
  s.seq_lens = {5, 6, 7};
  s.table = {0, 1, 2};
  s.is_prefilling = {0, 1, 1};
  s.in.block_table_stride = 1;
  s.in.num_blocks = 3;
  s.alloc(3, 3, 1);
  EXPECT_EQ(s.build().split, (SplitResult{3, 0, 3, 0}));
  s.in.treat_short_extends_as_decodes = false;
  EXPECT_EQ(s.build().split, (SplitResult{1, 2, 1, 2}));
  // is_prefilling needed but missing: rejected before any write.
  Step t = s;
  t.alloc(3, 3, 1);
  t.is_prefilling.clear();
  EXPECT_INVALID(t.build(), "is_prefilling");
  EXPECT_TRUE(t.untouched());
}

TEST(PlanStep, MaxSizes) {
  // 1024 requests x 2048 context, block size 128.
  const int b = 1024, bs = 128, stride = 16;
  Step s;
  s.qsl = lens_to_qsl(std::vector<int32_t>(b, 1));
  s.seq_lens.assign(b, 2048);
  s.table.resize(b * stride);
  std::mt19937 rng(7);
  for (int32_t& id : s.table) id = static_cast<int32_t>(rng() % (b * stride));
  s.in.block_size = bs;
  s.in.block_table_stride = stride;
  s.in.num_blocks = b * stride;
  s.in.num_input_tokens = 1040;
  s.alloc(b, 1040, stride);
  StepPlan p = s.build();
  EXPECT_EQ(p.state, AttentionState::DecodeOnly);
  EXPECT_EQ(p.split, (SplitResult{b, 0, b, 0}));
  EXPECT_EQ(p.max_seq_len, 2048);
  EXPECT_EQ(p.fia.num_reqs, b + 1);
  EXPECT_EQ(p.fia.num_tokens, 1040);
  EXPECT_EQ(s.b_slots, naive_slots(s.qsl, s.seq_lens, s.table, stride, bs, 1040));
  EXPECT_EQ(std::vector<int32_t>(s.b_table.begin(), s.b_table.begin() + b * stride), s.table);

  // Every request a fresh 2048-token prompt: 2M tokens.
  Step f = s;
  f.qsl = lens_to_qsl(std::vector<int32_t>(b, 2048));
  f.in.num_input_tokens = 0;
  f.alloc(b, static_cast<std::size_t>(b) * 2048, stride);
  p = f.build();
  EXPECT_EQ(p.state, AttentionState::PrefillNoCache);
  EXPECT_EQ(p.split, (SplitResult{0, b, 0, b * 2048}));
  EXPECT_EQ(p.num_actual_tokens, b * 2048);
  EXPECT_EQ(p.max_query_len, 2048);
  EXPECT_FALSE(p.fia.added_dummy);
  EXPECT_EQ(f.b_slots, naive_slots(f.qsl, f.seq_lens, f.table, stride, bs, f.b_slots.size()));
}

TEST(PlanStep, RejectedCallsLeaveBuffersUntouched) {
  struct Case {
    const char* what;
    std::function<void(Step&)> mutate;
  };
  const std::vector<Case> cases = {
      {"query_start_loc has 4 entries", [](Step& s) { s.qsl.pop_back(); }},
      {"query_start_loc must be non-decreasing: query_start_loc[3]=1 < query_start_loc[2]=2",
       [](Step& s) { s.qsl[3] = 1; }},
      {"query_start_loc[0]=1", [](Step& s) { s.qsl[0] = 1; }},
      {"seq_lens[2]=3 is smaller than its query length 6", [](Step& s) { s.seq_lens[2] = 3; }},
      {"num_input_tokens=12 is smaller than query_start_loc[4]=13", [](Step& s) { s.in.num_input_tokens = 12; }},
      {"num_input_tokens=-1", [](Step& s) { s.in.num_input_tokens = -1; }},
      {"buffers.query_start_loc", [](Step& s) { s.b_qsl.resize(4); }},
      {"buffers.query_start_loc has room for 5 entries, needs 6",
       [](Step& s) {
         s.b_qsl.resize(5);
         s.in.num_input_tokens = 20;
       }},
      {"buffers.seq_lens", [](Step& s) { s.b_seq.resize(3); }},
      {"buffers.slot_mapping has room for 14 entries, needs 16",
       [](Step& s) {
         s.b_slots.resize(14);
         s.in.num_input_tokens = 16;
       }},
      {"buffers.block_table", [](Step& s) { s.b_table.resize(15); }},
      {"buffers.q_ends", [](Step& s) { s.b_q_ends.resize(3); }},
      {"buffers.kv_lens", [](Step& s) { s.b_kv.resize(3); }},
      {"buffers.block_table_stride=2 is smaller than block_table_stride=3", [](Step& s) { s.buf_stride = 2; }},
      {"block_table has 11 entries", [](Step& s) { s.table.pop_back(); }},
      {"decode_threshold=0", [](Step& s) { s.in.decode_threshold = 0; }},
      {"decode_threshold=17", [](Step& s) { s.in.decode_threshold = 17; }},
      {"block_table[2][1]=64 is out of range [0, 64)", [](Step& s) { s.table[7] = 64; }},
      {"block_table[3][0]=-3 is out of range [0, 64)", [](Step& s) { s.table[9] = -3; }},
      // A context block (not touched by a new token) is checked too.
      {"block_table[1][0]=99 is out of range [0, 64)", [](Step& s) { s.table[3] = 99; }},
      {"seq_lens[2]=49 needs 4 blocks but block_table_stride=3", [](Step& s) { s.seq_lens[2] = 49; }},
      {"block_size=0", [](Step& s) { s.in.block_size = 0; }},
      {"num_blocks=-1", [](Step& s) { s.in.num_blocks = -1; }},
      {"block_table_stride=-1", [](Step& s) { s.in.block_table_stride = -1; }},
      {"is_prefilling has 2 entries", [](Step& s) { s.is_prefilling = {0, 0}; }},
      {"num_spec_tokens has 1 entries", [](Step& s) { s.spec = {0}; }},
      {"num_spec_tokens[0]=2", [](Step& s) { s.spec = {2, 0, 0, 0}; }},
      {"spec_method=9", [](Step& s) { s.in.spec_method = static_cast<SpecMethod>(9); }},
      {"state=11",
       [](Step& s) {
         s.in.attn_state = static_cast<AttentionState>(11);
       }},
      {"is_prefilling is required", [](Step& s) { s.in.treat_short_extends_as_decodes = false; }},
      // An engine-given PrefillNoCache would drop the context of request 0 (20 tokens, 1 new).
      {"attn_state=PrefillNoCache was given, but request 0 has cached tokens (seq_lens[0]=20, query length 1)",
       [](Step& s) { s.in.attn_state = AttentionState::PrefillNoCache; }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    Step s = mixed();
    c.mutate(s);
    EXPECT_INVALID(s.build(), c.what);
    EXPECT_TRUE(s.untouched());
  }
  // The fixture itself is valid.
  Step ok = mixed();
  ok.in.num_input_tokens = 16;
  EXPECT_NO_THROW(ok.build());
  EXPECT_FALSE(ok.untouched());
}

TEST(PlanStep, UniformDecodePaddingAddsOneDummyPerStride) {
  // docs/design/gqa.md §2.5 uniform case: 3 decodes of 2 tokens (1 + 1 spec) padded to 10 tokens
  // -> two dummy requests of 2 tokens each, KV length 2, block 0.
  Step s;
  s.qsl = lens_to_qsl({2, 2, 2});
  s.seq_lens = {9, 17, 4};
  s.in.block_size = 16;
  s.in.block_table_stride = 2;
  s.in.num_blocks = 32;
  s.in.decode_threshold = 2;
  s.table = {1, 2, 3, 4, 5, 6};
  s.alloc(8, 16, 2);
  s.in.num_input_tokens = 10;
  s.in.uniform_decode_len = 2;
  StepPlan p = s.build();
  EXPECT_EQ(p.fia.num_reqs, 5);
  EXPECT_EQ(p.fia.num_tokens, 10);
  EXPECT_EQ(p.num_reqs, 3);
  EXPECT_EQ(std::vector<int32_t>(s.b_qsl.begin(), s.b_qsl.begin() + 6), (std::vector<int32_t>{0, 2, 4, 6, 8, 10}));
  EXPECT_EQ(std::vector<int32_t>(s.b_seq.begin(), s.b_seq.begin() + 5), (std::vector<int32_t>{9, 17, 4, 2, 2}));
  EXPECT_EQ(std::vector<int64_t>(s.b_q_ends.begin(), s.b_q_ends.begin() + 5),
            (std::vector<int64_t>{2, 4, 6, 8, 10}));
  EXPECT_EQ(std::vector<int64_t>(s.b_kv.begin(), s.b_kv.begin() + 5), (std::vector<int64_t>{9, 17, 4, 2, 2}));
  for (int c = 6; c < 10; ++c) EXPECT_EQ(s.b_table[c], 0);  // two dummy rows -> block 0
  EXPECT_EQ(s.b_table[10], kSentinel);
  for (int t = 6; t < 10; ++t) EXPECT_EQ(s.b_slots[t], -1);

  // Not uniform (one request has 1 token): falls back to a single dummy.
  Step m;
  m.qsl = lens_to_qsl({2, 1});
  m.seq_lens = {9, 17};
  m.in.block_size = 16;
  m.in.block_table_stride = 2;
  m.in.num_blocks = 32;
  m.in.decode_threshold = 2;
  m.table = {1, 2, 3, 4};
  m.alloc(8, 16, 2);
  m.in.num_input_tokens = 7;
  m.in.uniform_decode_len = 2;
  StepPlan q = m.build();
  EXPECT_EQ(q.fia.num_reqs, 3);
  EXPECT_EQ(m.b_qsl[3], 7);
}

TEST(PlanStep, StaleIdsPastRowEndsAreNotRejected) {
  // Most of the table is in use (the whole-table scan runs) but the unused tail
  // of each row holds -1 / huge ids: only ids the kernels read are checked.
  Step s;
  s.qsl = lens_to_qsl({1, 1, 1});
  s.seq_lens = {40, 33, 48};  // 3, 3, 3 blocks of 16 in a 4-column table
  s.in.block_size = 16;
  s.in.block_table_stride = 4;
  s.in.num_blocks = 16;
  s.table = {1, 2, 3, -1,  //
             4, 5, 6, 999, //
             7, 8, 9, -7};
  s.alloc(8, 16, 4);
  StepPlan p = s.build();
  EXPECT_EQ(p.num_reqs, 3);
  EXPECT_EQ(s.b_slots[0], 3 * 16 + 7);
  EXPECT_EQ(s.b_slots[1], 6 * 16 + 0);
  EXPECT_EQ(s.b_slots[2], 9 * 16 + 15);
  // ... and an out-of-range id that is read is still rejected, by name.
  Step t = s;
  t.table[5] = 16;
  t.alloc(8, 16, 4);
  EXPECT_INVALID(t.build(), "block_table[1][1]=16");
  EXPECT_TRUE(t.untouched());
}

namespace {

// A decode-only step (one token per request) whose rows need 1..stride blocks;
// columns past a row's needed blocks hold stale, out-of-range ids.
Step decode_step(std::size_t b, int32_t stride, int32_t num_blocks, uint32_t seed) {
  Step s;
  std::mt19937 rng(seed);
  s.in.block_size = 16;
  s.in.block_table_stride = stride;
  s.in.num_blocks = num_blocks;
  s.qsl = lens_to_qsl(std::vector<int32_t>(b, 1));
  s.table.assign(b * stride, 0);
  const int32_t stale[] = {-1, num_blocks, INT32_MAX, INT32_MIN, num_blocks + 12345};
  for (std::size_t r = 0; r < b; ++r) {
    const int32_t seq = 1 + static_cast<int32_t>(rng() % (stride * 16));
    s.seq_lens.push_back(seq);
    const int32_t need = (seq + 15) / 16;
    for (int32_t c = 0; c < stride; ++c) {
      s.table[r * stride + c] =
          c < need ? static_cast<int32_t>(rng() % num_blocks) : stale[rng() % (sizeof stale / sizeof stale[0])];
    }
  }
  s.alloc(b, b, stride);
  return s;
}

}  // namespace

TEST(PlanStep, DecodeFastPathMatchesNaiveSlotsWithStaleTails) {
  // Row widths below, at and past 8 blocks (one masked chunk, full chunks,
  // masked and scalar tails), power-of-two and other cache sizes, host and
  // staged tables, and more rows than the block ids stashed for the slots.
  for (int32_t stride : {1, 3, 8, 12, 16, 20}) {
    for (int32_t nb : {16, 1000, 4096}) {
      for (std::size_t b : {std::size_t{1}, std::size_t{7}, std::size_t{64}, std::size_t{1100}}) {
        for (bool staged : {false, true}) {
          SCOPED_TRACE(::testing::Message() << "stride=" << stride << " nb=" << nb << " b=" << b
                                            << " staged=" << staged);
          Step s = decode_step(b, stride, nb, static_cast<uint32_t>(stride * 131 + nb + b));
          if (staged) {
            std::copy(s.table.begin(), s.table.end(), s.b_table.begin());
            s.in.block_table = CSpan<int32_t>(s.b_table.data(), s.table.size());
          }
          const StepPlan p = s.build();
          EXPECT_EQ(p.state, AttentionState::DecodeOnly);
          EXPECT_EQ(p.split.num_decodes, static_cast<int32_t>(b));
          EXPECT_EQ(p.split.num_prefills, 0);
          const auto want = naive_slots(s.qsl, s.seq_lens, s.table, stride, 16, b);
          ASSERT_EQ(std::vector<int32_t>(s.b_slots.begin(), s.b_slots.begin() + b), want);
        }
      }
    }
  }
}

TEST(PlanStep, DecodeFastPathRejectsEveryBadNeededIdByName) {
  // Every needed id of every row, replaced in turn by each kind of bad value,
  // is rejected with its own coordinates, and nothing is written; the stale
  // tails (also bad) never are.
  for (int32_t stride : {3, 8, 12, 20}) {
    for (int32_t nb : {64, 100}) {
      for (bool staged : {false, true}) {
        const Step base = decode_step(6, stride, nb, static_cast<uint32_t>(stride + nb));
        for (std::size_t r = 0; r < base.seq_lens.size(); ++r) {
          const int32_t need = (base.seq_lens[r] + 15) / 16;
          for (int32_t c = 0; c < need; ++c) {
            for (int32_t bad : {-1, nb, INT32_MAX, INT32_MIN}) {
              Step s = base;
              s.table[r * stride + c] = bad;
              s.alloc(6, 6, stride);
              if (staged) {
                // Staged: the table lives in the caller's buffer, which must
                // still hold it unchanged after the rejection.
                std::copy(s.table.begin(), s.table.end(), s.b_table.begin());
                s.in.block_table = CSpan<int32_t>(s.b_table.data(), s.table.size());
              }
              const std::string what = "block_table[" + std::to_string(r) + "][" + std::to_string(c) +
                                       "]=" + std::to_string(bad) + " is out of range [0, " + std::to_string(nb) +
                                       ")";
              SCOPED_TRACE(what + " stride=" + std::to_string(stride) + (staged ? " staged" : ""));
              EXPECT_INVALID(s.build(), what);
              if (staged) {
                EXPECT_TRUE(std::equal(s.table.begin(), s.table.end(), s.b_table.begin()));
                EXPECT_TRUE(std::all_of(s.b_table.begin() + s.table.size(), s.b_table.end(),
                                        [](int32_t x) { return x == kSentinel; }));
                s.b_table.assign(s.b_table.size(), kSentinel);
              }
              EXPECT_TRUE(s.untouched());
            }
          }
        }
      }
    }
  }
}

TEST(PlanStep, ContextEndIsOnePastTheLastRequestWithContext) {
  // Mixed batch: requests 0..2 have context, request 3 is new.
  Step s = mixed();
  EXPECT_EQ(s.build().context_end, 3);
  // Every request new.
  Step f = mixed();
  f.qsl = lens_to_qsl({4, 6, 5});
  f.seq_lens = {4, 6, 5};
  EXPECT_EQ(f.build().context_end, 0);
  // Only the first request has context; with a spec list (the exact loop) too.
  for (bool spec : {false, true}) {
    Step g = mixed();
    g.qsl = lens_to_qsl({1, 6, 5});
    g.seq_lens = {9, 6, 5};
    if (spec) g.spec = {0, 0, 0};
    EXPECT_EQ(g.build().context_end, 1) << spec;
  }
  // Randomised against the definition, both loops (power-of-two block size and not).
  std::mt19937 rng(7);
  for (int it = 0; it < 500; ++it) {
    Step r;
    const int b = 1 + static_cast<int>(rng() % 9);
    std::vector<int32_t> q(b);
    int32_t want = 0;
    for (int i = 0; i < b; ++i) {
      q[i] = 1 + static_cast<int32_t>(rng() % 4);
      const int32_t ctx = (rng() % 3 == 0) ? static_cast<int32_t>(rng() % 20) : 0;
      r.seq_lens.push_back(q[i] + ctx);
      if (ctx > 0) want = i + 1;
    }
    r.qsl = lens_to_qsl(q);
    r.in.block_size = (it % 2) ? 16 : 24;
    r.in.block_table_stride = 4;
    r.in.num_blocks = 64;
    r.table.assign(b * 4, 1);
    r.alloc(16, 64, 4);
    EXPECT_EQ(r.build().context_end, want);
  }
}

// fuzz_build_step (CI's fuzz smoke, UBSan): a request whose last token fills its last block read
// the next, unvalidated table column and multiplied it by the block size (INT32_MIN * 16
// overflowed). The slot loop now steps to a block only when a token lands in it.
TEST(PlanStep, LastTokenAtABlockEndReadsNoFurtherColumn) {
  Step s;
  s.qsl = lens_to_qsl({16});
  s.seq_lens = {16};
  s.in.block_size = 16;
  s.in.block_table_stride = 2;
  s.in.num_blocks = 64;
  s.table = {3, std::numeric_limits<int32_t>::min()};
  s.alloc(1, 16, 2);
  const StepPlan p = s.build();
  EXPECT_EQ(p.num_actual_tokens, 16);
  for (int32_t t = 0; t < 16; ++t) EXPECT_EQ(s.b_slots[t], 48 + t) << t;
}
