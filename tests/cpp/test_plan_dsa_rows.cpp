// The shared row lists of a DSA step (plan_dsa_rows) and plan_dsa_group's two
// paths (deriving the rows per group, or taking the step's list; the fast
// folded validation with its per-request fallback for the errors): on random
// batches (decodes, MTP decodes, chunked prefills, graph padding, padded
// token counts) over power-of-two and other ratios and page sizes and both
// slot formats, every output of both overloads equals a brute force written
// here (per raw position: a row completes at (p + 1) % r == 0), and on broken
// tables both throw the same error with every buffer unchanged.
#include <algorithm>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "ascend_attn_rt/dsa/plan/dsa_step_plan.h"
#include "test_plan_util.h"

using namespace aar::plan;

namespace {

constexpr int32_t kSentinel = -555;

struct Batch {
  std::vector<int32_t> qsl{0}, seq;
  int32_t nra = -1, t_in = 0, k = 0;
};

// Decodes (1 + k tokens or fewer) first, then prefills; some graph padding.
Batch random_batch(std::mt19937& rng) {
  Batch bt;
  bt.k = static_cast<int32_t>(rng() % 3);
  const int32_t decodes = static_cast<int32_t>(rng() % 9), prefills = static_cast<int32_t>(rng() % 3);
  auto add = [&](int32_t q, int32_t ctx) {
    bt.qsl.push_back(bt.qsl.back() + q);
    bt.seq.push_back(ctx + q);
  };
  for (int32_t i = 0; i < decodes; ++i) add(1 + static_cast<int32_t>(rng() % (1 + bt.k)), static_cast<int32_t>(rng() % 700));
  for (int32_t i = 0; i < prefills; ++i) add(2 + bt.k + static_cast<int32_t>(rng() % 300), static_cast<int32_t>(rng() % 500));
  const int32_t real = static_cast<int32_t>(bt.seq.size());
  const int32_t pad = rng() % 3 == 0 ? static_cast<int32_t>(rng() % 3) : 0;
  for (int32_t i = 0; i < pad; ++i) add(static_cast<int32_t>(rng() % 2), 0);  // padding: tokens but no KV
  if (pad > 0) bt.nra = real;
  if (rng() % 3 == 0) bt.t_in = bt.qsl.back() + static_cast<int32_t>(rng() % 5);
  return bt;
}

struct Ref {
  std::vector<int32_t> request, index;
};

Ref brute_rows(const Batch& bt, int32_t ratio) {
  const int32_t r = std::max(ratio, 1);
  const int32_t nra = bt.nra < 0 ? static_cast<int32_t>(bt.seq.size()) : bt.nra;
  Ref ref;
  for (int32_t b = 0; b < nra; ++b) {
    const int32_t q = bt.qsl[b + 1] - bt.qsl[b];
    for (int32_t p = bt.seq[b] - q; p < bt.seq[b]; ++p) {
      if ((p + 1) % r != 0) continue;
      ref.request.push_back(b);
      ref.index.push_back((p + 1) / r - 1);
    }
  }
  return ref;
}

struct Out {
  std::vector<int32_t> bt, slots, index, position, request;
  // The row-list overload's optional block-id scratch (its fused, AVX2 where
  // the CPU has it, validation pass); not an output, so not compared.
  std::vector<int32_t> scratch;
  Out(std::size_t bt_size, std::size_t rows, bool with_scratch = false) {
    bt.assign(bt_size, kSentinel);
    slots.assign(2 * rows + 2, kSentinel);
    for (auto* v : {&index, &position, &request}) v->assign(rows + 2, kSentinel);
    if (with_scratch) scratch.assign(rows + 2, kSentinel);
  }
  DsaGroupBuffers buffers() { return {Span<int32_t>(bt), Span<int32_t>(slots), Span<int32_t>(index),
                                      Span<int32_t>(position), Span<int32_t>(request), Span<int32_t>(scratch)}; }
  bool operator==(const Out& o) const {
    return bt == o.bt && slots == o.slots && index == o.index && position == o.position && request == o.request;
  }
};

struct Case {
  Batch bt;
  DsaStepPlan step;
  std::vector<int32_t> start;
};

Case plan_step(const Batch& bt) {
  Case c;
  c.bt = bt;
  c.start.assign(bt.seq.size(), 0);
  DsaStepInputs in;
  in.query_start_loc = CSpan<int32_t>(c.bt.qsl);
  in.seq_lens = CSpan<int32_t>(c.bt.seq);
  in.num_reqs_actual = bt.nra;
  in.num_input_tokens = bt.t_in;
  in.num_speculative_tokens = bt.k;
  c.step = plan_dsa_step(in, Span<int32_t>(c.start));
  return c;
}

}  // namespace

TEST(DsaRows, ListsAndBothGroupPathsMatchBruteForce) {
  std::mt19937 rng(20261201);
  int checked = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const Case cs = plan_step(random_batch(rng));
    const DsaStepPlan& st = cs.step;
    const auto B = static_cast<std::size_t>(st.num_reqs);
    for (int32_t ratio : {0, 1, 3, 4, 128}) {
      const Ref ref = brute_rows(cs.bt, ratio);
      const int32_t num_rows = dsa_num_compressed_tokens(st.num_input_tokens, st.num_reqs, ratio);
      std::vector<int32_t> rq(num_rows + 1, kSentinel), ri(num_rows + 1, kSentinel);
      const DsaRows rows = plan_dsa_rows(st, ratio, {Span<int32_t>(rq), Span<int32_t>(ri)});
      ASSERT_EQ(rows.ratio, std::max(ratio, 1));
      ASSERT_EQ(rows.num_compressed_tokens, num_rows);
      ASSERT_EQ(std::vector<int32_t>(rows.request.begin(), rows.request.end()), ref.request);
      ASSERT_EQ(std::vector<int32_t>(rows.index.begin(), rows.index.end()), ref.index);
      ASSERT_EQ(rows.max_index, ref.index.empty() ? -1 : *std::max_element(ref.index.begin(), ref.index.end()));
      for (int32_t sbs : {1, 8, 32, 100, 128}) {
        for (SlotFormat f : {SlotFormat::BlockOffset, SlotFormat::Flat}) {
          int32_t cols = 1;
          for (int32_t c : ref.index) cols = std::max(cols, c / sbs + 1);
          cols += static_cast<int32_t>(rng() % 2);
          std::vector<int32_t> table(B * cols);
          for (auto& id : table) id = static_cast<int32_t>(rng() % 5000);
          DsaGroupInputs g;
          g.compress_ratio = ratio;
          g.storage_block_size = sbs;
          g.block_table = CSpan<int32_t>(table);
          g.block_table_stride = cols;
          g.num_blocks = 5000;
          g.slot_format = f;
          g.rope_positions = ratio > 1 ? 8192 : 0;
          Out a(B * cols, num_rows), b(B * cols, num_rows), c(B * cols, num_rows, true);
          const DsaGroupPlan pa = plan_dsa_group(st, g, a.buffers());
          const DsaGroupPlan pb = plan_dsa_group(st, g, b.buffers(), rows);
          const DsaGroupPlan pc = plan_dsa_group(st, g, c.buffers(), rows);
          ASSERT_TRUE(a == b) << "ratio " << ratio << " sbs " << sbs;
          ASSERT_TRUE(a == c) << "ratio " << ratio << " sbs " << sbs << " (with block scratch)";
          ASSERT_EQ(pa.num_valid_rows, pb.num_valid_rows);
          ASSERT_EQ(pa.num_valid_rows, pc.num_valid_rows);
          ASSERT_EQ(pa.num_valid_rows, static_cast<int32_t>(ref.index.size()));
          // Brute force of every output.
          const int32_t r = std::max(ratio, 1);
          for (int32_t k = 0; k < num_rows; ++k) {
            const bool v = k < static_cast<int32_t>(ref.index.size());
            const int32_t c = v ? ref.index[k] : -1;
            const int32_t id = v ? table[ref.request[k] * cols + c / sbs] : -1;
            if (f == SlotFormat::BlockOffset) {
              ASSERT_EQ(a.slots[2 * k], v ? id : -1);
              ASSERT_EQ(a.slots[2 * k + 1], v ? c % sbs : sbs - 1);
            } else {
              ASSERT_EQ(a.slots[k], v ? id * sbs + c % sbs : -1);
            }
            ASSERT_EQ(a.index[k], c);
            ASSERT_EQ(a.position[k], v ? c * r : 0);
            ASSERT_EQ(a.request[k], v ? ref.request[k] : -1);
          }
          ASSERT_EQ(a.index[num_rows], kSentinel);
          for (std::size_t i = 0; i < B * cols; ++i) {
            ASSERT_EQ(a.bt[i], i < static_cast<std::size_t>(st.num_reqs_actual) * cols ? table[i] : 0);
          }
          ++checked;
        }
      }
    }
  }
  EXPECT_GT(checked, 10000);
}

// Decode steps (every real request one token: the list's vector path at
// power-of-two ratios, four requests at a time) of 0..40 requests whose
// lengths make every block of four emit, emit nothing, or mix, at every
// ratio; some with graph padding: the list equals the brute force, the
// entries past it are untouched, and max_index is the largest row.
TEST(DsaRows, DecodeListsOfEveryEmitPattern) {
  std::mt19937 rng(4128);
  int checked = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const int32_t n = static_cast<int32_t>(rng() % 41);
    const int32_t r = std::vector<int32_t>{4, 128, 2, 3}[rng() % 4];
    const int pattern = static_cast<int>(rng() % 3);  // 0 all emit, 1 none, 2 mixed
    Batch bt;
    for (int32_t b = 0; b < n; ++b) {
      int32_t s = r * (1 + static_cast<int32_t>(rng() % 300));  // emits at r
      if (pattern == 1 || (pattern == 2 && rng() % 2 == 0)) s -= 1 + static_cast<int32_t>(rng() % (r - 1));
      bt.qsl.push_back(bt.qsl.back() + 1);
      bt.seq.push_back(s);
    }
    if (n > 0 && rng() % 4 == 0) {
      bt.nra = static_cast<int32_t>(rng() % (n + 1));  // the rest is graph padding
    }
    const Case cs = plan_step(bt);
    for (int32_t ratio : {r, 1}) {
      const Ref ref = brute_rows(cs.bt, ratio);
      const int32_t num_rows = dsa_num_compressed_tokens(cs.step.num_input_tokens, cs.step.num_reqs, ratio);
      std::vector<int32_t> rq(num_rows + 4, kSentinel), ri(num_rows + 4, kSentinel);
      const DsaRows rows = plan_dsa_rows(cs.step, ratio, {Span<int32_t>(rq.data(), num_rows),
                                                          Span<int32_t>(ri.data(), num_rows)});
      ASSERT_EQ(std::vector<int32_t>(rows.request.begin(), rows.request.end()), ref.request)
          << "ratio " << ratio << " n " << n << " pattern " << pattern;
      ASSERT_EQ(std::vector<int32_t>(rows.index.begin(), rows.index.end()), ref.index);
      ASSERT_EQ(rows.max_index, ref.index.empty() ? -1 : *std::max_element(ref.index.begin(), ref.index.end()));
      for (int32_t k = num_rows; k < num_rows + 4; ++k) {
        ASSERT_EQ(rq[k], kSentinel);
        ASSERT_EQ(ri[k], kSentinel);
      }
      ++checked;
    }
  }
  EXPECT_EQ(checked, 800);
}

// Every way a table can be wrong: both overloads throw the same message (the
// per-request definition's) and write nothing.
TEST(DsaRows, BothGroupPathsRejectAlikeAndWriteNothing) {
  std::mt19937 rng(7);
  int rejected = 0;
  for (int trial = 0; trial < 200; ++trial) {
    const Case cs = plan_step(random_batch(rng));
    const DsaStepPlan& st = cs.step;
    const auto B = static_cast<std::size_t>(st.num_reqs);
    const int32_t ratio = std::vector<int32_t>{1, 4, 128, 3}[rng() % 4];
    const int32_t sbs = std::vector<int32_t>{8, 128, 100}[rng() % 3];
    const Ref ref = brute_rows(cs.bt, ratio);
    if (ref.index.empty()) continue;
    const int32_t num_rows = dsa_num_compressed_tokens(st.num_input_tokens, st.num_reqs, ratio);
    std::vector<int32_t> rq(num_rows), ri(num_rows);
    const DsaRows rows = plan_dsa_rows(st, ratio, {Span<int32_t>(rq), Span<int32_t>(ri)});
    int32_t cols = 1;
    for (int32_t c : ref.index) cols = std::max(cols, c / sbs + 1);
    std::vector<int32_t> table(B * cols, 3);
    DsaGroupInputs g;
    g.compress_ratio = ratio;
    g.storage_block_size = sbs;
    g.block_table_stride = cols;
    g.num_blocks = 100;
    g.slot_format = SlotFormat::BlockOffset;
    // One fault of a random kind, at a random emitted row.
    const std::size_t k = rng() % ref.index.size();
    const std::size_t at = static_cast<std::size_t>(ref.request[k]) * cols + ref.index[k] / sbs;
    switch (rng() % 5) {
      case 0: table[at] = -1; break;
      case 1: table[at] = 100; break;
      case 2: g.block_table_stride = cols - 1; break;  // too narrow (stride 0 included)
      case 3: g.rope_positions = static_cast<int64_t>(ref.index[k]) * std::max(ratio, 1); break;
      case 4:
        g.slot_format = SlotFormat::Flat;
        g.num_blocks = 0;
        table[at] = static_cast<int32_t>(std::numeric_limits<int32_t>::max() / sbs);
        break;
    }
    g.block_table = CSpan<int32_t>(table);
    const std::size_t bt_size = B * std::max(g.block_table_stride, 0);
    auto message = [&](bool with_rows, Out& o) {
      try {
        if (with_rows) {
          plan_dsa_group(st, g, o.buffers(), rows);
        } else {
          plan_dsa_group(st, g, o.buffers());
        }
      } catch (const aar::InvalidArgument& e) {
        return std::string(e.what());
      }
      return std::string();
    };
    Out a(bt_size, num_rows), b(bt_size, num_rows), c(bt_size, num_rows, true);
    const Out untouched(bt_size, num_rows);
    const std::string ma = message(false, a), mb = message(true, b), mc = message(true, c);
    if (ma.empty()) {
      // A fault that is no fault (e.g. the narrower table still fits): all accept, same outputs.
      ASSERT_TRUE(mb.empty()) << mb;
      ASSERT_TRUE(mc.empty()) << mc;
      ASSERT_TRUE(a == b);
      ASSERT_TRUE(a == c);
      continue;
    }
    ASSERT_EQ(ma, mb);
    ASSERT_EQ(ma, mc);
    ASSERT_EQ(ma.find("internal"), std::string::npos) << ma;
    ASSERT_TRUE(a == untouched) << ma;
    ASSERT_TRUE(b == untouched) << mb;
    ASSERT_TRUE(c == untouched) << mc;
    ++rejected;
  }
  EXPECT_GT(rejected, 100);
}

TEST(DsaRows, Errors) {
  const Case cs = plan_step([] {
    Batch b;
    b.qsl = {0, 1, 5};
    b.seq = {10, 300};
    return b;
  }());
  std::vector<int32_t> rq(8), ri(8), small(1);
  EXPECT_INVALID(plan_dsa_rows(cs.step, -1, {Span<int32_t>(rq), Span<int32_t>(ri)}), "ratio=-1");
  EXPECT_INVALID(plan_dsa_rows(cs.step, 1, {Span<int32_t>(small), Span<int32_t>(ri)}),
                 "need num_compressed_tokens=5");
  const DsaRows r4 = plan_dsa_rows(cs.step, 4, {Span<int32_t>(rq), Span<int32_t>(ri)});
  std::vector<int32_t> table(2 * 4, 0), slots(16), idx(8), pos(8), req(8);
  DsaGroupInputs g;
  g.compress_ratio = 1;
  g.storage_block_size = 128;
  g.block_table = CSpan<int32_t>(table);
  g.block_table_stride = 4;
  const DsaGroupBuffers buf{{}, Span<int32_t>(slots), Span<int32_t>(idx), Span<int32_t>(pos), Span<int32_t>(req)};
  EXPECT_INVALID(plan_dsa_group(cs.step, g, buf, r4), "rows are not plan_dsa_rows of this step at ratio 1");
  // A list naming a request the step does not have.
  std::vector<int32_t> bad_rq{0, 7}, bad_ri{9, 296};
  DsaRows foreign = plan_dsa_rows(cs.step, 1, {Span<int32_t>(rq), Span<int32_t>(ri)});
  foreign.request = CSpan<int32_t>(bad_rq);
  foreign.index = CSpan<int32_t>(bad_ri);
  EXPECT_INVALID(plan_dsa_group(cs.step, g, buf, foreign), "rows.request[1]=7 is not a real request");
  // A step whose lengths changed after planning.
  std::vector<int32_t> seq{10, 2};
  DsaStepPlan changed = cs.step;
  changed.seq_lens = CSpan<int32_t>(seq);
  EXPECT_INVALID(plan_dsa_rows(changed, 1, {Span<int32_t>(rq), Span<int32_t>(ri)}),
                 "step: seq_lens[1]=2 and query length 4 are not a validated request");
}

// The several-ratio form: each result equals the single-ratio call, and one
// ratio without room (or a count mismatch) rejects the call before any list
// is written.
TEST(DsaRows, SeveralRatiosAtOnce) {
  std::mt19937 rng(31);
  for (int trial = 0; trial < 100; ++trial) {
    const Case cs = plan_step(random_batch(rng));
    const int32_t ratios[3] = {1, 4, 128};
    std::vector<int32_t> lists[6], singles[6];
    DsaRowBuffers bufs[3];
    DsaRows got[3];
    for (int k = 0; k < 3; ++k) {
      const auto n = static_cast<std::size_t>(
          dsa_num_compressed_tokens(cs.step.num_input_tokens, cs.step.num_reqs, ratios[k]));
      for (int j : {2 * k, 2 * k + 1}) {
        lists[j].assign(n, kSentinel);
        singles[j].assign(n, kSentinel);
      }
      bufs[k] = {Span<int32_t>(lists[2 * k]), Span<int32_t>(lists[2 * k + 1])};
    }
    plan_dsa_rows(cs.step, CSpan<int32_t>(ratios, 3), CSpan<DsaRowBuffers>(bufs, 3), Span<DsaRows>(got, 3));
    for (int k = 0; k < 3; ++k) {
      const DsaRows one =
          plan_dsa_rows(cs.step, ratios[k], {Span<int32_t>(singles[2 * k]), Span<int32_t>(singles[2 * k + 1])});
      ASSERT_EQ(lists[2 * k], singles[2 * k]);
      ASSERT_EQ(lists[2 * k + 1], singles[2 * k + 1]);
      ASSERT_EQ(got[k].ratio, one.ratio);
      ASSERT_EQ(got[k].num_compressed_tokens, one.num_compressed_tokens);
      ASSERT_EQ(got[k].max_index, one.max_index);
      ASSERT_EQ(got[k].index.size(), one.index.size());
      ASSERT_EQ(got[k].index.data(), lists[2 * k + 1].data());
    }
  }
  // No room at ratio 128 (the last): the lists of ratios 1 and 4 stay unwritten.
  const Case cs = plan_step([] {
    Batch b;
    b.qsl = {0, 1, 2, 3};
    b.seq = {128, 256, 9};
    return b;
  }());
  const int32_t ratios[3] = {1, 4, 128};
  std::vector<int32_t> a(8, kSentinel), b(8, kSentinel), c(8, kSentinel), d(8, kSentinel), e(2, kSentinel),
      f(2, kSentinel);
  const DsaRowBuffers bufs[3] = {{Span<int32_t>(a), Span<int32_t>(b)}, {Span<int32_t>(c), Span<int32_t>(d)},
                                 {Span<int32_t>(e), Span<int32_t>(f)}};
  DsaRows got[3];
  EXPECT_INVALID(plan_dsa_rows(cs.step, CSpan<int32_t>(ratios, 3), CSpan<DsaRowBuffers>(bufs, 3),
                               Span<DsaRows>(got, 3)),
                 "need num_compressed_tokens=3 at ratio 128");
  for (const auto* v : {&a, &b, &c, &d, &e, &f}) {
    ASSERT_TRUE(std::all_of(v->begin(), v->end(), [](int32_t x) { return x == kSentinel; }));
  }
  EXPECT_INVALID(plan_dsa_rows(cs.step, CSpan<int32_t>(ratios, 3), CSpan<DsaRowBuffers>(bufs, 2),
                               Span<DsaRows>(got, 3)),
                 "3 ratios need as many row buffers (got 2)");
  EXPECT_INVALID(plan_dsa_rows(cs.step, CSpan<int32_t>(ratios, 3), CSpan<DsaRowBuffers>(bufs, 3),
                               Span<DsaRows>(got, 2)),
                 "results (room for 2)");
}
