#include <random>
#include <vector>

#include "ascend_attn_rt/plan/slot_mapping.h"
#include "test_plan_util.h"

using namespace aar::plan;
using aar_test::lens_to_qsl;
using aar_test::naive_slots;

namespace {

using Fixture = aar_test::SlotBatch;

Fixture small() {
  Fixture f;
  f.bs = 16;
  f.stride = 3;
  f.num_blocks = 10;
  f.qsl = {0, 1, 4};        // r0: 1 token, r1: 3 tokens
  f.seq_lens = {17, 33};    // r0 pos 16; r1 pos 30, 31, 32
  f.table = {7, 2, 0,       // r0
             4, 9, 5};      // r1
  return f;
}

}  // namespace

TEST(PlanSlotMapping, HandExample) {
  Fixture f = small();
  std::vector<int32_t> out(6, 123);
  compute_slot_mapping(f.inputs(), out);
  // r0 pos 16 -> block 1 (id 2): 2*16+0 = 32
  // r1 pos 30,31 -> block 1 (id 9): 9*16+14, 9*16+15; pos 32 -> block 2 (id 5): 80
  EXPECT_EQ(out, (std::vector<int32_t>{32, 158, 159, 80, -1, -1}));
  EXPECT_EQ(kPadSlot, -1);
}

TEST(PlanSlotMapping, RandomAgainstNaive) {
  std::mt19937 rng(42);
  for (int32_t bs : {16, 128}) {
    for (int trial = 0; trial < 50; ++trial) {
      const int b = static_cast<int>(rng() % 40);
      const int32_t stride = 1 + static_cast<int32_t>(rng() % 12);
      const int32_t num_blocks = 1000;
      std::vector<int32_t> qlens(b), seq(b);
      for (int r = 0; r < b; ++r) {
        seq[r] = static_cast<int32_t>(rng() % (stride * bs + 1));
        qlens[r] = seq[r] == 0 ? 0 : static_cast<int32_t>(rng() % (std::min(seq[r], 3 * bs) + 1));
      }
      Fixture f;
      f.bs = bs;
      f.stride = stride;
      f.num_blocks = num_blocks;
      f.qsl = lens_to_qsl(qlens);
      f.seq_lens = seq;
      f.table.resize(static_cast<std::size_t>(b) * stride);
      for (int32_t& id : f.table) id = static_cast<int32_t>(rng() % num_blocks);
      const std::size_t out_size = f.qsl.back() + rng() % 7;
      std::vector<int32_t> out(out_size, 99);
      compute_slot_mapping(f.inputs(), out);
      EXPECT_EQ(out, naive_slots(f.qsl, f.seq_lens, f.table, stride, bs, out_size));
    }
  }
}

TEST(PlanSlotMapping, EmptyBatchFillsPad) {
  Fixture f;
  f.qsl = {0};
  std::vector<int32_t> out(4, 5);
  compute_slot_mapping(f.inputs(), out);
  EXPECT_EQ(out, (std::vector<int32_t>(4, -1)));
}

TEST(PlanSlotMapping, OnlyReferencedBlocksAreChecked) {
  // Columns for context positions the new tokens do not touch may hold anything.
  Fixture f = small();
  f.table[0] = -99;   // r0 block 0: context only
  f.table[3] = 5000;  // r1 block 0: context only
  std::vector<int32_t> out(4);
  compute_slot_mapping(f.inputs(), out);
  EXPECT_EQ(out, (std::vector<int32_t>{32, 158, 159, 80}));
}

TEST(PlanSlotMapping, MaxSize) {
  // 1024 requests x 2048 context, block size 128 (16 blocks per request), one new token each.
  const int b = 1024, bs = 128, stride = 16;
  Fixture f;
  f.bs = bs;
  f.stride = stride;
  f.num_blocks = b * stride;
  f.qsl = lens_to_qsl(std::vector<int32_t>(b, 1));
  f.seq_lens.assign(b, 2048);
  f.table.resize(b * stride);
  for (int i = 0; i < b * stride; ++i) f.table[i] = (i * 7919) % (b * stride);
  std::vector<int32_t> out(b + 16, 0);
  compute_slot_mapping(f.inputs(), out);
  EXPECT_EQ(out, naive_slots(f.qsl, f.seq_lens, f.table, stride, bs, out.size()));
}

TEST(PlanSlotMapping, ErrorsLeaveOutputUntouched) {
  auto expect_rejected = [](const Fixture& f, std::size_t out_size, const char* substr) {
    std::vector<int32_t> out(out_size, 777);
    EXPECT_INVALID(compute_slot_mapping(f.inputs(), out), substr);
    for (int32_t v : out) ASSERT_EQ(v, 777);
  };
  Fixture f = small();
  f.qsl = {0, 1};
  expect_rejected(f, 6, "query_start_loc has 2 entries");
  f = small();
  f.qsl = {0, 3, 2};
  f.seq_lens = {17, 33};
  expect_rejected(f, 6, "query_start_loc must be non-decreasing: query_start_loc[2]=2 < query_start_loc[1]=3");
  f = small();
  f.qsl = {1, 2, 4};
  expect_rejected(f, 6, "query_start_loc[0]=1");
  f = small();
  f.seq_lens = {17, 2};
  expect_rejected(f, 6, "seq_lens[1]=2 is smaller than its query length 3");
  f = small();
  f.table[5] = 10;
  expect_rejected(f, 6, "block_table[1][2]=10 is out of range [0, 10)");
  f = small();
  f.table[1] = -1;
  expect_rejected(f, 6, "block_table[0][1]=-1 is out of range [0, 10)");
  f = small();
  f.seq_lens = {17, 49};  // r1 needs block 3 with stride 3
  expect_rejected(f, 6, "block_table_stride=3");
  f = small();
  f.table.resize(5);
  expect_rejected(f, 6, "block_table has 5 entries");
  f = small();
  expect_rejected(f, 3, "slots_out has room for 3");
  f = small();
  f.bs = 0;
  expect_rejected(f, 6, "block_size=0");
  f = small();
  f.stride = -1;
  expect_rejected(f, 6, "block_table_stride=-1");
  f = small();
  f.num_blocks = -2;
  expect_rejected(f, 6, "num_blocks=-2");
  f = small();
  f.num_blocks = 1 << 28;
  f.bs = 128;
  expect_rejected(f, 6, "exceeds the int32 slot range");
}
