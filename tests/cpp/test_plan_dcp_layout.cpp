// DCP token placement (docs/design/cp.md §2.1, §2.2, §3.1, §3.4, §3.3, §9) against
// brute-force definitions written here: tokens are dealt to the ranks in turn,
// I at a time, and each rank's local sequence is what it was dealt, in order.
#include <algorithm>
#include <random>
#include <vector>

#include "ascend_attn_rt/cp/plan/dcp_layout.h"
#include "test_plan_util.h"

using namespace aar::plan;
using aar_test::lens_to_qsl;

namespace {

// Brute-force dealing of positions 0..len-1: owner and local index of each.
struct Dealt {
  std::vector<int32_t> owner, local;
  std::vector<std::vector<int32_t>> seq;  // per rank: global positions in local order
};

Dealt deal(int32_t len, int32_t world, int32_t interleave) {
  Dealt d;
  d.seq.resize(world);
  int32_t rank = 0, in_group = 0;
  for (int32_t x = 0; x < len; ++x) {
    d.owner.push_back(rank);
    d.local.push_back(static_cast<int32_t>(d.seq[rank].size()));
    d.seq[rank].push_back(x);
    if (++in_group == interleave) {
      in_group = 0;
      rank = (rank + 1) % world;
    }
  }
  return d;
}

// The DCP tests' batches default to block size 4.
struct Batch : aar_test::SlotBatch {
  Batch() { bs = 4; }
};

// Expected local slots from the dealing: the owner writes local index li at
// table[li / bs] * bs + li % bs, everybody else writes nothing.
std::vector<int32_t> brute_slots(const Batch& b, int32_t world, int32_t rank, int32_t interleave,
                                 std::size_t out_size) {
  std::vector<int32_t> out(out_size, -1);
  for (std::size_t r = 0; r + 1 < b.qsl.size(); ++r) {
    const Dealt d = deal(b.seq_lens[r], world, interleave);
    const int32_t q = b.qsl[r + 1] - b.qsl[r];
    for (int32_t j = 0; j < q; ++j) {
      const int32_t pos = b.seq_lens[r] - q + j;
      if (d.owner[pos] != rank) continue;
      const int32_t li = d.local[pos];
      out[b.qsl[r] + j] = b.table[r * b.stride + li / b.bs] * b.bs + li % b.bs;
    }
  }
  return out;
}

const int32_t kBlockSizes[] = {4, 16};
const int32_t kWorlds[] = {1, 2, 4};

std::vector<int32_t> interleaves_for(int32_t bs) { return {1, 2, bs}; }

}  // namespace

TEST(PlanDcpLayout, LocalLenUpstreamTables) {
  // docs/design/cp.md §2.2 (each row is an upstream test vector).
  struct Case {
    int32_t w, i;
    std::vector<int32_t> lens;
    std::vector<int32_t> expected;  // row-major [N, W]
  };
  const std::vector<int32_t> lens6 = {1, 2, 128, 129, 256, 257};
  const Case cases[] = {
      {2, 4, {1, 4, 5, 8, 9}, {1, 0, 4, 0, 4, 1, 4, 4, 5, 4}},
      {2, 1, lens6, {1, 0, 1, 1, 64, 64, 65, 64, 128, 128, 129, 128}},
      {2, 128, lens6, {1, 0, 2, 0, 128, 0, 128, 1, 128, 128, 129, 128}},
      {4, 128, lens6, {1, 0, 0, 0, 2, 0, 0, 0, 128, 0, 0, 0, 128, 1, 0, 0, 128, 128, 0, 0, 128, 128, 1, 0}},
  };
  for (const Case& c : cases) {
    std::vector<int32_t> out(c.lens.size() * c.w, -7);
    dcp_local_seq_lens(c.lens, c.w, c.i, out);
    EXPECT_EQ(out, c.expected) << "W=" << c.w << " I=" << c.i;
  }
  // docs/design/cp.md §2.2 step by step: L=9, W=2, I=4 -> rank 0: 5, rank 1: 4.
  EXPECT_EQ(dcp_local_len(9, 2, 4, 0), 5);
  EXPECT_EQ(dcp_local_len(9, 2, 4, 1), 4);
}

TEST(PlanDcpLayout, LocalLenAgainstBruteForceOwnership) {
  // docs/design/cp.md §9: every L <= 300, I in {1, 2, B}, W in {1, 2, 4}, B in {4, 16}.
  for (int32_t bs : kBlockSizes) {
    for (int32_t il : interleaves_for(bs)) {
      for (int32_t w : kWorlds) {
        const Dealt d = deal(300, w, il);
        std::vector<int32_t> lens(301);
        for (int32_t l = 0; l <= 300; ++l) lens[l] = l;
        std::vector<int32_t> table(lens.size() * w);
        dcp_local_seq_lens(lens, w, il, table);
        std::vector<int32_t> count(w, 0);
        for (int32_t l = 0; l <= 300; ++l) {
          int64_t sum = 0;
          for (int32_t k = 0; k < w; ++k) {
            ASSERT_EQ(dcp_local_len(l, w, il, k), count[k]) << "L=" << l << " W=" << w << " I=" << il << " k=" << k;
            ASSERT_EQ(table[l * w + k], count[k]);
            if (k > 0) {
              ASSERT_LE(count[k], count[k - 1]);  // non-increasing in k
            }
            sum += count[k];
          }
          ASSERT_EQ(sum, l);
          if (l < 300) ++count[d.owner[l]];
        }
        for (int32_t x = 0; x < 300; ++x) {
          ASSERT_EQ(dcp_owner(x, w, il), d.owner[x]);
          ASSERT_EQ(dcp_local_index(x, w, il), d.local[x]);
        }
        // The per-rank column equals the table's column.
        for (int32_t k = 0; k < w; ++k) {
          std::vector<int32_t> col(lens.size(), -1);
          dcp_local_seq_lens_of_rank(lens, {w, k, il}, col);
          for (std::size_t i = 0; i < lens.size(); ++i) ASSERT_EQ(col[i], table[i * w + k]);
        }
      }
    }
  }
}

TEST(PlanDcpLayout, VirtualBlockFormAgreesWithLocalForm) {
  std::mt19937 rng(7);
  for (int32_t bs : kBlockSizes) {
    for (int32_t il : interleaves_for(bs)) {
      for (int32_t w : kWorlds) {
        const int32_t cols = 300 / (bs * w) + 1;
        std::vector<int32_t> bt(cols);
        for (int32_t& id : bt) id = static_cast<int32_t>(rng() % 1000);
        for (int32_t x = 0; x < 300; ++x) {
          const DcpVirtualPosition v = dcp_virtual_position(x, bs, w, il);
          ASSERT_EQ(v.owner, dcp_owner(x, w, il));
          const int64_t li = dcp_local_index(x, w, il);
          ASSERT_EQ(bt[v.virtual_block] * bs + v.local_offset, bt[li / bs] * bs + li % bs)
              << "x=" << x << " B=" << bs << " W=" << w << " I=" << il;
          ASSERT_EQ(v.virtual_block, x / (bs * w));
        }
      }
    }
  }
  EXPECT_INVALID(dcp_virtual_position(5, 6, 2, 4), "block_size=6 is not a multiple of interleave=4");
}

TEST(PlanDcpLayout, WorkedExampleOfSpec) {
  // docs/design/cp.md §2.1: B=4, W=2, I=2, BT=[7,3]; positions 0..11.
  Batch b;
  b.bs = 4;
  b.stride = 2;
  b.num_blocks = 8;
  b.qsl = {0, 12};
  b.seq_lens = {12};
  b.table = {7, 3};
  std::vector<int32_t> owners;
  for (int32_t x = 0; x < 12; ++x) owners.push_back(dcp_owner(x, 2, 2));
  EXPECT_EQ(owners, (std::vector<int32_t>{0, 0, 1, 1, 0, 0, 1, 1, 0, 0, 1, 1}));
  std::vector<int32_t> s0(12, 99), s1(12, 99);
  EXPECT_EQ(compute_dcp_slot_mapping(b.inputs(), {2, 0, 2}, s0), 6);
  EXPECT_EQ(compute_dcp_slot_mapping(b.inputs(), {2, 1, 2}, s1), 6);
  // Rank 0 stores x=0,1,4,5,8,9 in 28,29,30,31,12,13; rank 1 x=2,3,6,7,10,11 in the same slots.
  EXPECT_EQ(s0, (std::vector<int32_t>{28, 29, -1, -1, 30, 31, -1, -1, 12, 13, -1, -1}));
  EXPECT_EQ(s1, (std::vector<int32_t>{-1, -1, 28, 29, -1, -1, 30, 31, -1, -1, 12, 13}));
}

TEST(PlanDcpLayout, SlotMappingRandomAgainstBruteForce) {
  std::mt19937 rng(11);
  for (int32_t bs : kBlockSizes) {
    for (int32_t il : interleaves_for(bs)) {
      for (int32_t w : kWorlds) {
        for (int trial = 0; trial < 8; ++trial) {
          const int nreq = static_cast<int>(rng() % 9);
          Batch b;
          b.bs = bs;
          b.stride = 300 / (bs * w) + 1;
          b.num_blocks = 500;
          std::vector<int32_t> qlens(nreq);
          b.seq_lens.resize(nreq);
          for (int r = 0; r < nreq; ++r) {
            b.seq_lens[r] = static_cast<int32_t>(rng() % 300);
            const int kind = static_cast<int>(rng() % 3);  // decode, short extend, prefill
            const int32_t cap = kind == 0 ? 1 : kind == 1 ? 5 : b.seq_lens[r];
            qlens[r] = b.seq_lens[r] == 0 ? 0 : static_cast<int32_t>(rng() % (std::min(cap, b.seq_lens[r]) + 1));
          }
          b.qsl = lens_to_qsl(qlens);
          b.table.resize(static_cast<std::size_t>(nreq) * b.stride);
          for (int32_t& id : b.table) id = static_cast<int32_t>(rng() % b.num_blocks);
          const std::size_t out_size = b.qsl.back() + rng() % 4;
          int32_t owned_total = 0;
          for (int32_t k = 0; k < w; ++k) {
            std::vector<int32_t> out(out_size, 55);
            const int32_t owned = compute_dcp_slot_mapping(b.inputs(), {w, k, il}, out);
            ASSERT_EQ(out, brute_slots(b, w, k, il, out_size)) << "B=" << bs << " I=" << il << " W=" << w;
            ASSERT_EQ(owned, std::count_if(out.begin(), out.end(), [](int32_t s) { return s >= 0; }));
            owned_total += owned;
          }
          ASSERT_EQ(owned_total, b.qsl.back());  // every token is written by exactly one rank
        }
      }
    }
  }
}

TEST(PlanDcpLayout, WriteThenGatherRoundTrip) {
  // docs/design/cp.md §9 in pure form: requests grow over a prefill step and decode steps;
  // each rank scatters the global values (req*1000 + pos) of the step's tokens
  // into its own paged cache through its local slots. Reading every rank's local
  // sequence back through the block table and local_len, and interleaving the
  // ranks by ownership, must give every request's global sequence.
  for (int32_t bs : kBlockSizes) {
    for (int32_t il : interleaves_for(bs)) {
      for (int32_t w : kWorlds) {
        const std::vector<int32_t> prompt = {1, 7, 33, 64, 65};
        const int32_t nreq = static_cast<int32_t>(prompt.size());
        const int32_t steps = 9;  // decode steps after the prefill
        Batch b;
        b.bs = bs;
        b.stride = (65 + steps) / (bs * w) + 1;
        b.num_blocks = nreq * b.stride;
        b.table.resize(nreq * b.stride);
        for (int32_t i = 0; i < nreq * b.stride; ++i) b.table[i] = (i * 37 + 5) % b.num_blocks;  // a permutation
        std::vector<std::vector<int32_t>> cache(w, std::vector<int32_t>(b.num_blocks * bs, -1));
        std::vector<int32_t> lens(nreq, 0);
        for (int32_t step = 0; step <= steps; ++step) {
          std::vector<int32_t> q(nreq);
          for (int32_t r = 0; r < nreq; ++r) q[r] = step == 0 ? prompt[r] : 1;
          for (int32_t r = 0; r < nreq; ++r) lens[r] += q[r];
          b.qsl = lens_to_qsl(q);
          b.seq_lens = lens;
          for (int32_t k = 0; k < w; ++k) {
            std::vector<int32_t> slots(b.qsl.back());
            compute_dcp_slot_mapping(b.inputs(), {w, k, il}, slots);
            for (int32_t r = 0; r < nreq; ++r) {
              for (int32_t t = b.qsl[r]; t < b.qsl[r + 1]; ++t) {
                const int32_t pos = lens[r] - q[r] + (t - b.qsl[r]);
                if (slots[t] >= 0) cache[k][slots[t]] = r * 1000 + pos;
              }
            }
          }
        }
        for (int32_t r = 0; r < nreq; ++r) {
          std::vector<std::vector<int32_t>> local(w);
          for (int32_t k = 0; k < w; ++k) {
            const int64_t n = dcp_local_len(lens[r], w, il, k);
            for (int64_t li = 0; li < n; ++li) {
              local[k].push_back(cache[k][b.table[r * b.stride + li / bs] * bs + li % bs]);
            }
          }
          std::vector<std::size_t> next(w, 0);
          for (int32_t x = 0; x < lens[r]; ++x) {
            const int32_t k = dcp_owner(x, w, il);
            ASSERT_LT(next[k], local[k].size());
            ASSERT_EQ(local[k][next[k]++], r * 1000 + x) << "req " << r << " x=" << x << " B=" << bs << " I=" << il
                                                          << " W=" << w;
          }
          for (int32_t k = 0; k < w; ++k) ASSERT_EQ(next[k], local[k].size());
        }
      }
    }
  }
}

TEST(PlanDcpLayout, KernelBlockSplitGivesTheSameSlots) {
  // docs/design/cp.md §2.1: physical B=16, kernel Bk=8, the table in logical ids phys*2+j.
  std::mt19937 rng(3);
  for (int32_t il : {1, 2, 16}) {
    for (int32_t w : {2, 4}) {
      Batch phys;
      phys.bs = 16;
      phys.stride = 6;
      phys.num_blocks = 40;
      phys.seq_lens = {150, 37, 1};
      phys.qsl = lens_to_qsl({150, 3, 1});
      phys.table.resize(3 * phys.stride);
      for (int32_t& id : phys.table) id = static_cast<int32_t>(rng() % phys.num_blocks);
      Batch kern = phys;
      kern.bs = 8;
      kern.stride = 2 * phys.stride;
      kern.num_blocks = 2 * phys.num_blocks;
      kern.table.clear();
      for (int32_t id : phys.table) {
        kern.table.push_back(2 * id);
        kern.table.push_back(2 * id + 1);
      }
      for (int32_t k = 0; k < w; ++k) {
        std::vector<int32_t> a(154), c(154);
        compute_dcp_slot_mapping(phys.inputs(), {w, k, il}, a);
        compute_dcp_slot_mapping(kern.inputs(), {w, k, il}, c);
        ASSERT_EQ(a, c) << "I=" << il << " W=" << w << " rank " << k;
      }
    }
  }
}

TEST(PlanDcpLayout, SlotMappingChecksAreRankIndependent) {
  // W=2, I=4, B=4: request of 9 tokens, 2 new (positions 7, 8). Rank 1 writes
  // position 7 (local index 3, column 0); rank 0 writes position 8 (local 4,
  // column 1). A bad column 0 must be rejected by both ranks, and nothing written.
  Batch b;
  b.bs = 4;
  b.stride = 2;
  b.num_blocks = 10;
  b.qsl = {0, 2};
  b.seq_lens = {9};
  b.table = {12, 3};
  for (int32_t k = 0; k < 2; ++k) {
    std::vector<int32_t> out(2, 777);
    EXPECT_INVALID(compute_dcp_slot_mapping(b.inputs(), {2, k, 4}, out), "block_table[0][0]=12 is out of range");
    EXPECT_EQ(out, (std::vector<int32_t>{777, 777}));
  }
  b.table = {2, 3};
  std::vector<int32_t> out0(2), out1(2);
  compute_dcp_slot_mapping(b.inputs(), {2, 0, 4}, out0);
  compute_dcp_slot_mapping(b.inputs(), {2, 1, 4}, out1);
  EXPECT_EQ(out0, (std::vector<int32_t>{-1, 12}));
  EXPECT_EQ(out1, (std::vector<int32_t>{11, -1}));
  // Context-only columns are not checked: 17 tokens, 1 new (position 16, rank 0,
  // local 8, column 2); columns 0 and 1 may hold anything.
  b.stride = 3;
  b.qsl = {0, 1};
  b.seq_lens = {17};
  b.table = {-5, 99, 4};
  std::vector<int32_t> one(1);
  compute_dcp_slot_mapping(b.inputs(), {2, 1, 4}, one);
  EXPECT_EQ(one, (std::vector<int32_t>{-1}));
  compute_dcp_slot_mapping(b.inputs(), {2, 0, 4}, one);
  EXPECT_EQ(one, (std::vector<int32_t>{16}));
}

TEST(PlanDcpLayout, SlotMappingErrorsLeaveOutputUntouched) {
  Batch good;
  good.bs = 4;
  good.stride = 2;
  good.num_blocks = 8;
  good.qsl = {0, 12};
  good.seq_lens = {12};
  good.table = {7, 3};
  auto rejected = [](const Batch& b, DcpShard s, std::size_t n, const char* msg) {
    std::vector<int32_t> out(n, 777);
    EXPECT_INVALID(compute_dcp_slot_mapping(b.inputs(), s, out), msg);
    for (int32_t v : out) ASSERT_EQ(v, 777);
  };
  rejected(good, {0, 0, 1}, 12, "world=0 must be >= 1");
  rejected(good, {2, 2, 1}, 12, "rank=2 is out of range [0, world=2)");
  rejected(good, {2, -1, 1}, 12, "rank=-1 is out of range");
  rejected(good, {2, 0, 0}, 12, "interleave=0 must be >= 1");
  rejected(good, {2, 0, 2}, 11, "slots_out has room for 11");
  Batch b = good;
  b.seq_lens = {11};
  rejected(b, {2, 0, 2}, 12, "seq_lens[0]=11 is smaller than its query length 12");
  b = good;
  b.seq_lens = {17};
  b.qsl = {0, 1};
  // Position 16: virtual block 2, beyond the 2 columns.
  rejected(b, {2, 1, 2}, 1, "block_table_stride=2");
  b = good;
  b.table = {7, 8};
  rejected(b, {2, 1, 2}, 12, "block_table[0][1]=8 is out of range [0, 8)");
  b = good;
  b.qsl = {0, 13, 12};
  b.seq_lens = {13, 13};
  rejected(b, {2, 0, 2}, 13, "query_start_loc must be non-decreasing");
  b = good;
  b.qsl = {0};
  rejected(b, {2, 0, 2}, 12, "query_start_loc has 1 entries");
  b = good;
  b.table = {7};
  rejected(b, {2, 0, 2}, 12, "block_table has 1 entries");
  b = good;
  b.bs = 0;
  rejected(b, {2, 0, 2}, 12, "block_size=0");
}

TEST(PlanDcpLayout, LocalSeqLensShapesAndErrors) {
  // A 2-D [2, 2] input is the call over its 4 entries: [2, 2, W] row-major.
  std::vector<int32_t> lens = {1, 4, 5, 8};
  std::vector<int32_t> out(8, -1);
  dcp_local_seq_lens(lens, 2, 4, out);
  EXPECT_EQ(out, (std::vector<int32_t>{1, 0, 4, 0, 4, 1, 4, 4}));
  std::vector<int32_t> empty_out;
  dcp_local_seq_lens({}, 4, 1, empty_out);

  std::vector<int32_t> small(7, 3);
  EXPECT_INVALID(dcp_local_seq_lens(lens, 2, 4, small), "out has room for 7 entries");
  EXPECT_EQ(small, std::vector<int32_t>(7, 3));
  std::vector<int32_t> neg = {3, -2};
  std::vector<int32_t> o4(4, 3);
  EXPECT_INVALID(dcp_local_seq_lens(neg, 2, 1, o4), "seq_lens[1]=-2 is negative");
  EXPECT_EQ(o4, std::vector<int32_t>(4, 3));
  EXPECT_INVALID(dcp_local_seq_lens(lens, 0, 1, out), "world=0");
  EXPECT_INVALID(dcp_local_seq_lens(lens, 2, -1, out), "interleave=-1");
  EXPECT_INVALID(dcp_local_seq_lens_of_rank(lens, {2, 3, 1}, out), "rank=3 is out of range");
  EXPECT_INVALID(dcp_local_len(-1, 2, 1, 0), "len=-1 is negative");
  EXPECT_INVALID(dcp_owner(-3, 2, 1), "x=-3 is negative");
  EXPECT_INVALID(dcp_local_index(4, 2, 0), "interleave=0");
}

TEST(PlanDcpLayout, ContextLensCountNewTokensOnlyForDecodes) {
  // docs/design/cp.md §3.1: decode rows use seq_len (this step's KV is written first),
  // prefill rows the cached context seq_len - q. W=2, I=1.
  std::vector<int32_t> qsl = lens_to_qsl({1, 2, 5, 3});
  std::vector<int32_t> seq = {9, 10, 5, 11};
  std::vector<int32_t> out(8, -1);
  dcp_context_lens(qsl, seq, 2, 2, 1, out);
  // decodes: 9 -> [5,4], 10 -> [5,5]; prefills: ctx 0 -> [0,0], ctx 8 -> [4,4].
  EXPECT_EQ(out, (std::vector<int32_t>{5, 4, 5, 5, 0, 0, 4, 4}));
  std::vector<int32_t> keep(8, 9);
  EXPECT_INVALID(dcp_context_lens(qsl, seq, 5, 2, 1, keep), "num_decodes=5 is out of range [0, 4]");
  std::vector<int32_t> bad_seq = {9, 1, 5, 11};
  EXPECT_INVALID(dcp_context_lens(qsl, bad_seq, 2, 2, 1, keep), "seq_lens[1]=1 is smaller than its query length 2");
  EXPECT_INVALID(dcp_context_lens(qsl, seq, 2, 2, 1, Span<int32_t>(keep.data(), 7)), "out has room for 7");
  EXPECT_EQ(keep, std::vector<int32_t>(8, 9));
}

namespace {

// Brute-force MTP mask over global positions: rank r's local key k is the k-th
// position it was dealt; query j (global position h + j) may see it iff that
// position is <= h + j. Upstream's quirk: a query with no visible local key
// (but k_len > 0) sees every local key.
std::vector<uint8_t> brute_mtp_mask(const std::vector<int32_t>& seq, const std::vector<int32_t>& ql, int32_t w,
                                    int32_t r, int32_t il, int32_t s, int32_t kmax, bool quirk) {
  std::vector<uint8_t> m(seq.size() * s * kmax, 0);
  for (std::size_t b = 0; b < seq.size(); ++b) {
    const Dealt d = deal(seq[b], w, il);
    const std::vector<int32_t>& keys = d.seq[r];
    const int32_t h = seq[b] - ql[b];
    for (int32_t j = 0; j < ql[b]; ++j) {
      const int32_t p = h + j;
      const bool none_visible = !keys.empty() && keys[0] > p;
      for (std::size_t k = 0; k < keys.size(); ++k) {
        if (keys[k] > p && !(quirk && none_visible)) m[(b * s + j) * kmax + k] = 1;
      }
    }
  }
  return m;
}

std::vector<uint8_t> mtp_mask(const std::vector<int32_t>& seq, const std::vector<int32_t>& ql, DcpShard sh,
                              int32_t s, int32_t kmax, bool quirk) {
  DcpMtpMaskInputs in;
  in.seq_lens = seq;
  in.query_lens = ql;
  in.shard = sh;
  in.max_query_len = s;
  in.max_kv_len = kmax;
  in.reproduce_upstream_unmasked_rows = quirk;
  std::vector<uint8_t> out(seq.size() * s * kmax, 7);  // garbage: every entry must be written
  build_dcp_mtp_mask(in, out);
  return out;
}

}  // namespace

TEST(PlanDcpLayout, MtpMaskUpstreamVector) {
  // docs/design/cp.md §3.3: Wd=2, I=1, h=5, n=4: k_len = (9+1-r)//2, the row of position p masks k >= (p+2-r)//2.
  const int32_t kmax = 8, s = 4;
  for (int32_t r = 0; r < 2; ++r) {
    const std::vector<uint8_t> m = mtp_mask({9}, {4}, {2, r, 1}, s, kmax, false);
    const int32_t k_len = (9 + 1 - r) / 2;
    for (int32_t j = 0; j < 4; ++j) {
      const int32_t p = 5 + j;
      for (int32_t k = 0; k < kmax; ++k) {
        const bool want = k < k_len && k >= (p + 2 - r) / 2;
        ASSERT_EQ(m[j * kmax + k], want ? 1 : 0) << "r=" << r << " p=" << p << " k=" << k;
      }
    }
  }
}

TEST(PlanDcpLayout, MtpMaskQuirkRowIsMaskedNotOpen) {
  // docs/design/cp.md §3.3: I=1, Wd=4, h=1, n=4 (L=5), rank 3 holds position 3 only.
  // Query 0 (p=1) and query 1 (p=2) have no local key at or before p: we mask
  // the key (the partial is empty); upstream leaves it visible, a future key.
  const std::vector<uint8_t> ours = mtp_mask({5}, {4}, {4, 3, 1}, 4, 2, false);
  EXPECT_EQ(ours, (std::vector<uint8_t>{1, 0, 1, 0, 0, 0, 0, 0}));
  const std::vector<uint8_t> upstream = mtp_mask({5}, {4}, {4, 3, 1}, 4, 2, true);
  EXPECT_EQ(upstream, (std::vector<uint8_t>(8, 0)));
}

TEST(PlanDcpLayout, MtpMaskAgainstBruteForce) {
  std::mt19937 rng(5);
  for (int32_t bs : kBlockSizes) {
    for (int32_t il : interleaves_for(bs)) {
      for (int32_t w : kWorlds) {
        for (int trial = 0; trial < 4; ++trial) {
          const int32_t s = 1 + static_cast<int32_t>(rng() % 4);
          const int nreq = 1 + static_cast<int>(rng() % 5);
          std::vector<int32_t> seq(nreq), ql(nreq);
          for (int b = 0; b < nreq; ++b) {
            ql[b] = static_cast<int32_t>(rng() % (s + 1));
            seq[b] = ql[b] + static_cast<int32_t>(rng() % 40);  // short histories reach the quirk rows
          }
          const int32_t kmax = 45;
          for (int32_t r = 0; r < w; ++r) {
            for (bool quirk : {false, true}) {
              ASSERT_EQ(mtp_mask(seq, ql, {w, r, il}, s, kmax, quirk),
                        brute_mtp_mask(seq, ql, w, r, il, s, kmax, quirk))
                  << "I=" << il << " W=" << w << " r=" << r << " quirk=" << quirk;
            }
          }
        }
      }
    }
  }
}

TEST(PlanDcpLayout, MtpMaskErrors) {
  DcpMtpMaskInputs in;
  std::vector<int32_t> seq = {9, 3}, ql = {4, 4};
  in.seq_lens = seq;
  in.query_lens = ql;
  in.shard = {2, 0, 1};
  in.max_query_len = 4;
  in.max_kv_len = 5;
  std::vector<uint8_t> out(40, 9);
  EXPECT_INVALID(build_dcp_mtp_mask(in, out), "seq_lens[1]=3 is smaller than query_lens[1]=4");
  seq[1] = 4;
  in.max_query_len = 3;
  EXPECT_INVALID(build_dcp_mtp_mask(in, out), "query_lens[0]=4 is out of range [0, max_query_len=3]");
  in.max_query_len = 4;
  in.max_kv_len = 4;  // rank 0 holds 5 of the 9 tokens
  EXPECT_INVALID(build_dcp_mtp_mask(in, out), "5 local tokens on DCP rank 0, more than max_kv_len=4");
  in.max_kv_len = 5;
  EXPECT_INVALID(build_dcp_mtp_mask(in, Span<uint8_t>(out.data(), 39)), "mask_out has room for 39");
  std::vector<int32_t> ql1 = {4};
  in.query_lens = ql1;
  EXPECT_INVALID(build_dcp_mtp_mask(in, out), "query_lens has 1 entries, seq_lens has 2");
  EXPECT_EQ(out, std::vector<uint8_t>(40, 9));
  in.query_lens = ql;
  build_dcp_mtp_mask(in, out);  // now valid
}

TEST(PlanDcpLayout, ChunkedContextTokenIndices) {
  // docs/design/cp.md §3.4: q = [2,1,3], mask [T,F,T] -> [0,1,3,4,5]; all-False -> empty.
  std::vector<int32_t> q = {2, 1, 3}, ctx = {5, 0, 9}, out(6, -1);
  EXPECT_EQ(chunked_context_token_indices(q, ctx, out), 5);
  EXPECT_EQ(std::vector<int32_t>(out.begin(), out.begin() + 5), (std::vector<int32_t>{0, 1, 3, 4, 5}));
  std::vector<int32_t> none = {0, 0, 0};
  EXPECT_EQ(chunked_context_token_indices(q, none, out), 0);
  // Upstream's chunked mask vector: per-rank local contexts [[0,0],[4,0],[0,7]] -> [F,T,T].
  std::vector<int32_t> global = {0 + 0, 4 + 0, 0 + 7}, q1 = {1, 1, 1}, o3(3);
  EXPECT_EQ(chunked_context_token_indices(q1, global, o3), 2);
  EXPECT_EQ(o3[0], 1);
  EXPECT_EQ(o3[1], 2);
  std::vector<int32_t> keep(5, 4);
  EXPECT_INVALID(chunked_context_token_indices(q, ctx, keep), "out has room for 5 entries");
  EXPECT_INVALID(chunked_context_token_indices(q, std::vector<int32_t>{1, 2}, keep), "context_lens has 2 entries");
  EXPECT_INVALID(chunked_context_token_indices(std::vector<int32_t>{1, -1, 0}, ctx, keep), "query_lens[1]=-1");
  EXPECT_EQ(keep, std::vector<int32_t>(5, 4));
}
