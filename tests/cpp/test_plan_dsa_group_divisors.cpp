// plan_dsa_group divides by the compress ratio and the storage block size with
// shifts and masks when they are powers of two and with plain division
// otherwise (cpp/dsa/plan/dsa_step_plan.cpp, NonNegDiv). The DSV4 sizes are all
// powers of two (test_plan_dsa_step.cpp); this checks the other branch and
// its boundary against a brute force written here: every raw position p of
// every real request, a row c = p / r completing at p (p + 1) % r == 0, its
// slot table[b][c / sbs] * sbs + c % sbs.
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "ascend_attn_rt/dsa/plan/dsa_step_plan.h"

using namespace aar::plan;

TEST(DsaGroupDivisors, NonPowerOfTwoRatiosAndPageSizesMatchBruteForce) {
  std::mt19937 rng(1234);
  for (int32_t r : {1, 2, 3, 5, 8, 12, 128}) {
    for (int32_t sbs : {1, 3, 7, 64, 100, 128}) {
      for (int trial = 0; trial < 4; ++trial) {
        const int32_t B = 1 + static_cast<int32_t>(rng() % 5);
        std::vector<int32_t> qsl{0}, seq;
        for (int32_t b = 0; b < B; ++b) {
          const int32_t q = 1 + static_cast<int32_t>(rng() % 40);
          const int32_t ctx = static_cast<int32_t>(rng() % 900);
          qsl.push_back(qsl.back() + q);
          seq.push_back(ctx + q);
        }
        int32_t cols = 0;
        for (int32_t s : seq) cols = std::max(cols, (s / std::max(r, 1)) / sbs + 1);
        std::vector<int32_t> table(static_cast<size_t>(B) * cols);
        for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<int32_t>((i * 7919) % 100000);
        std::vector<int32_t> start(B);
        DsaStepInputs si;
        si.query_start_loc = CSpan<int32_t>(qsl);
        si.seq_lens = CSpan<int32_t>(seq);
        const DsaStepPlan step = plan_dsa_step(si, Span<int32_t>(start));
        DsaGroupInputs gi;
        gi.compress_ratio = r;
        gi.storage_block_size = sbs;
        gi.block_table = CSpan<int32_t>(table);
        gi.block_table_stride = cols;
        gi.slot_format = SlotFormat::BlockOffset;
        const int32_t T = qsl.back();
        std::vector<int32_t> slots(2 * T, -9), idx(T, -9), pos(T, -9), req(T, -9);
        const DsaGroupPlan gp = plan_dsa_group(step, gi, {{}, Span<int32_t>(slots), Span<int32_t>(idx),
                                                          Span<int32_t>(pos), Span<int32_t>(req)});
        std::vector<int32_t> w_slots, w_idx, w_pos, w_req;
        for (int32_t b = 0; b < B; ++b) {
          for (int32_t p = seq[b] - (qsl[b + 1] - qsl[b]); p < seq[b]; ++p) {
            if ((p + 1) % r != 0) continue;
            const int32_t c = p / r;
            w_slots.push_back(table[static_cast<size_t>(b) * cols + c / sbs]);
            w_slots.push_back(c % sbs);
            w_idx.push_back(c);
            w_pos.push_back(c * r);
            w_req.push_back(b);
          }
        }
        const int32_t n = r <= 1 ? T : std::min(T, T / r + B);
        ASSERT_EQ(gp.num_compressed_tokens, n) << r << " " << sbs;
        ASSERT_EQ(gp.num_valid_rows, static_cast<int32_t>(w_idx.size()));
        while (static_cast<int32_t>(w_idx.size()) < n) {
          w_slots.push_back(-1);
          w_slots.push_back(sbs - 1);
          w_idx.push_back(-1);
          w_pos.push_back(0);
          w_req.push_back(-1);
        }
        EXPECT_EQ(std::vector<int32_t>(slots.begin(), slots.begin() + 2 * n), w_slots) << r << " " << sbs;
        EXPECT_EQ(std::vector<int32_t>(idx.begin(), idx.begin() + n), w_idx);
        EXPECT_EQ(std::vector<int32_t>(pos.begin(), pos.begin() + n), w_pos);
        EXPECT_EQ(std::vector<int32_t>(req.begin(), req.begin() + n), w_req);
      }
    }
  }
}
