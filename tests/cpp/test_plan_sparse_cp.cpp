// The sparse families' CP planning (docs/design/sparse_cp.md §2, §3, §4) against brute-force
// definitions written here: positions and replicated columns are dealt to the ranks in turn, and
// a rank's local sequence is what it was dealt, in order; the token shard counts tokens one by one.
// Also the worked examples of the design page, the cross-rank invariants, and one rejected call
// per check (each leaving every output buffer as it was).
#include <algorithm>
#include <climits>
#include <cstdint>
#include <functional>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "ascend_attn_rt/cp/plan/sparse_cp.h"
#include "test_plan_util.h"

using namespace aar::plan;
using aar_test::lens_to_qsl;

namespace {

constexpr int32_t kSentinel = 0x5A5A5A5A;

// Positions 0..len-1 dealt to `world` ranks, `interleave` at a time: the owner of each and its
// index among the positions its owner was dealt before it; per rank, the positions in local order.
struct Dealt {
  std::vector<int32_t> owner, local;
  std::vector<std::vector<int32_t>> seq;
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

// The replicated view, dealt block by block: replicated column j of a request goes to the next
// rank in turn and is the next column of that rank's local table; the replicated cache keeps
// rank r's local block lb at lb * W + r. Entries past the request's columns are 0.
std::vector<int32_t> brute_replicated_table(const std::vector<int32_t>& table, int32_t stride,
                                            const std::vector<int32_t>& seq_lens, int32_t world, int32_t bs,
                                            int32_t out_stride) {
  std::vector<int32_t> out(seq_lens.size() * out_stride, 0);
  for (std::size_t b = 0; b < seq_lens.size(); ++b) {
    const int32_t cols = (seq_lens[b] + bs - 1) / bs;
    const Dealt d = deal(cols, world, 1);
    for (int32_t j = 0; j < cols; ++j) {
      const int32_t lb = table[b * stride + d.local[j]];
      out[b * out_stride + j] = lb * world + d.owner[j];
    }
  }
  return out;
}

std::vector<int64_t> to64(const std::vector<int32_t>& v) { return std::vector<int64_t>(v.begin(), v.end()); }

// Remap by the definition: keep the valid entries this rank was dealt, as their local index, in
// top-k order, then -1.
std::vector<int32_t> brute_remap(const std::vector<int32_t>& topk, int32_t K, const Dealt& d, int32_t rank) {
  std::vector<int32_t> out;
  for (std::size_t r = 0; r < topk.size(); r += K) {
    std::vector<int32_t> row;
    for (int32_t j = 0; j < K; ++j) {
      const int32_t x = topk[r + j];
      if (x >= 0 && d.owner.at(x) == rank) row.push_back(d.local.at(x));
    }
    row.resize(K, -1);
    out.insert(out.end(), row.begin(), row.end());
  }
  return out;
}

// The token shard by counting: token t of the padded stream belongs to rank floor(t / tpr).
struct BruteShard {
  std::vector<int32_t> cum, seq;
  std::vector<int64_t> slots;
  int32_t tpr = 0, local_tokens = 0;
};

BruteShard brute_shard(const std::vector<int32_t>& qsl, const std::vector<int32_t>& seq_lens,
                       const std::vector<int64_t>& slot_mapping, int32_t num_input, int32_t world, int32_t rank) {
  BruteShard s;
  int32_t pad = num_input;
  while (pad % world != 0) ++pad;
  s.tpr = pad / world;
  auto mine = [&](int32_t t) { return t / s.tpr == rank; };
  int32_t cum = 0;
  for (std::size_t b = 0; b + 1 < qsl.size(); ++b) {
    int32_t count = 0, after_last = 0;  // local tokens, and the request's tokens after the last of them
    for (int32_t t = qsl[b]; t < qsl[b + 1]; ++t) {
      if (mine(t)) {
        ++count;
        after_last = 0;
      } else if (count > 0) {
        ++after_last;
      }
    }
    cum += count;
    s.cum.push_back(cum);
    s.seq.push_back(count > 0 ? std::max(seq_lens[b] - after_last, 0) : 0);
  }
  for (int32_t t = 0; t < pad; ++t) {
    if (!mine(t)) continue;
    s.slots.push_back(static_cast<std::size_t>(t) < slot_mapping.size() ? slot_mapping[t] : -1);
    if (t < qsl.back()) ++s.local_tokens;
  }
  return s;
}

// Random distinct positions in [0, range) with -1 scattered anywhere, K per row.
std::vector<int32_t> random_topk(std::mt19937& rng, int32_t rows, int32_t K, int32_t range) {
  std::vector<int32_t> out;
  std::vector<int32_t> pool(range);
  std::iota(pool.begin(), pool.end(), 0);
  std::uniform_int_distribution<int32_t> pct(0, 99);
  const int32_t invalid_pct = pct(rng) < 30 ? 0 : pct(rng) / 2;
  for (int32_t r = 0; r < rows; ++r) {
    std::shuffle(pool.begin(), pool.end(), rng);
    for (int32_t j = 0; j < K; ++j) out.push_back(pct(rng) < invalid_pct ? -1 : pool[j]);
  }
  return out;
}

const int32_t kWorlds[] = {1, 2, 3, 4, 8};
const int32_t kInterleaves[] = {1, 2, 4, 16};

// ---- a valid call of each function, mutated by the rejection cases ----

struct ReplicatedCase {
  std::vector<int32_t> table = {3, 1, 2, 0}, seq_lens = {9, 0};  // 2 rows, stride 2
  DcpReplicatedInputs in() const {
    DcpReplicatedInputs in;
    in.block_table = table;
    in.block_table_stride = 2;
    in.seq_lens = seq_lens;
    in.world = 2;
    in.block_size = 4;
    in.num_blocks = 4;
    return in;
  }
};

struct SlotCase {
  std::vector<int32_t> qsl = {0, 3, 4}, seq_lens = {9, 5};
  std::vector<int32_t> rep = {6, 7, 2, 0, 0, 0, 4, 5, 0, 0, 0, 0};  // 2 rows, stride 6
  int32_t stride = 6, bs = 4;
};

struct ShardCase {
  std::vector<int32_t> qsl = {0, 3, 5}, seq_lens = {3, 5};
  std::vector<int64_t> slots = {0, 1, 2, 3, 4};
  int32_t num_input = 5, world = 2, rank = 1;
  TokenShardInputs in() const {
    TokenShardInputs in;
    in.query_start_loc = qsl;
    in.seq_lens = seq_lens;
    in.num_input_tokens = num_input;
    in.world = world;
    in.rank = rank;
    return in;
  }
};

}  // namespace

// ---- §2: the replicated indexer views ----

TEST(PlanSparseCp, ReplicatedTableWorkedExample) {
  // Local table [10, 11, 12, 13], W = 2: the replicated view of a request of 8 blocks.
  const int32_t bs = 4;
  std::vector<int32_t> table = {10, 11, 12, 13, 5, 6, 7, 8};
  std::vector<int32_t> seq_lens = {8 * bs, 0};
  DcpReplicatedInputs in;
  in.block_table = table;
  in.block_table_stride = 4;
  in.seq_lens = seq_lens;
  in.world = 2;
  in.block_size = bs;
  in.num_blocks = 14;
  std::vector<int32_t> out(2 * 9, kSentinel);
  dcp_replicated_block_table(in, out, 9);
  EXPECT_EQ(out, (std::vector<int32_t>{20, 21, 22, 23, 24, 25, 26, 27, 0,  // the extra column is 0
                                       0, 0, 0, 0, 0, 0, 0, 0, 0}));      // seq_len 0: all 0

  // A partial last block still takes its column; nothing past it.
  seq_lens = {3 * bs + 1, 1};
  dcp_replicated_block_table(in, out, 9);
  EXPECT_EQ(out, (std::vector<int32_t>{20, 21, 22, 23, 0, 0, 0, 0, 0, 10, 0, 0, 0, 0, 0, 0, 0, 0}));
}

TEST(PlanSparseCp, ReplicatedTableRandomAgainstDealing) {
  std::mt19937 rng(281);
  for (int iter = 0; iter < 400; ++iter) {
    const int32_t worlds[] = {1, 2, 3, 4, 8, 16};
    const int32_t world = worlds[rng() % 6];
    const int32_t bs = std::vector<int32_t>{1, 4, 16, 128}[rng() % 4];
    const int32_t rows = static_cast<int32_t>(rng() % 21);
    const int32_t stride = static_cast<int32_t>(rng() % 6);
    const int32_t num_blocks = 1 + static_cast<int32_t>(rng() % 50);
    const int32_t out_stride = stride * world + static_cast<int32_t>(rng() % 3);
    std::vector<int32_t> table(rows * stride), seq_lens(rows);
    for (auto& v : table) v = static_cast<int32_t>(rng() % num_blocks);
    for (auto& s : seq_lens) {
      // Any length whose replicated columns fit the table (stride * world of them), 0 included.
      const int32_t max_len = stride * world * bs;
      s = static_cast<int32_t>(rng() % (max_len + 1));
    }
    DcpReplicatedInputs in;
    in.block_table = table;
    in.block_table_stride = stride;
    in.seq_lens = seq_lens;
    in.world = world;
    in.block_size = bs;
    in.num_blocks = num_blocks;
    const std::size_t extra = rng() % 3;  // entries past rows * out_stride stay as they were
    std::vector<int32_t> out(rows * out_stride + extra, kSentinel);
    dcp_replicated_block_table(in, out, out_stride);
    std::vector<int32_t> want = brute_replicated_table(table, stride, seq_lens, world, bs, out_stride);
    want.resize(out.size(), kSentinel);
    ASSERT_EQ(out, want) << "iter " << iter << " W=" << world << " bs=" << bs;
    // Every id is a block of the replicated cache, num_blocks * W of them, and names its rank.
    for (int32_t v : out) {
      if (v != kSentinel) ASSERT_LT(v, num_blocks * world);
    }
  }
}

TEST(PlanSparseCp, ReplicatedSlotMappingWorkedExample) {
  // The table of the worked example, one request of 32 keys whose last 3 are new: positions
  // 29..31 sit in replicated column 7 (block 27), offsets 1..3.
  std::vector<int32_t> rep = {20, 21, 22, 23, 24, 25, 26, 27};
  std::vector<int32_t> qsl = {0, 3}, seq_lens = {32};
  std::vector<int64_t> out(5, kSentinel);
  dcp_replicated_slot_mapping(qsl, seq_lens, rep, 8, 4, out);
  EXPECT_EQ(out, (std::vector<int64_t>{109, 110, 111, -1, -1}));
}

TEST(PlanSparseCp, ReplicatedSlotMappingRandomAgainstNaive) {
  std::mt19937 rng(282);
  for (int iter = 0; iter < 400; ++iter) {
    const int32_t world = kWorlds[rng() % 5];
    const int32_t bs = std::vector<int32_t>{1, 4, 16}[rng() % 3];
    const int32_t rows = static_cast<int32_t>(rng() % 16);
    const int32_t stride = 1 + static_cast<int32_t>(rng() % 5);
    const int32_t num_blocks = 1 + static_cast<int32_t>(rng() % 40);
    std::vector<int32_t> table(rows * stride), seq_lens(rows), q(rows);
    for (auto& v : table) v = static_cast<int32_t>(rng() % num_blocks);
    for (int32_t b = 0; b < rows; ++b) {
      seq_lens[b] = static_cast<int32_t>(rng() % (stride * world * bs + 1));
      q[b] = seq_lens[b] == 0 ? 0 : static_cast<int32_t>(rng() % (std::min(seq_lens[b], 9) + 1));
    }
    const std::vector<int32_t> qsl = lens_to_qsl(q);
    const int32_t rep_stride = stride * world;
    DcpReplicatedInputs in;
    in.block_table = table;
    in.block_table_stride = stride;
    in.seq_lens = seq_lens;
    in.world = world;
    in.block_size = bs;
    in.num_blocks = num_blocks;
    std::vector<int32_t> rep(rows * rep_stride, kSentinel);
    dcp_replicated_block_table(in, rep, rep_stride);
    const std::size_t size = qsl.back() + rng() % 4;
    std::vector<int64_t> out(size, kSentinel);
    dcp_replicated_slot_mapping(qsl, seq_lens, rep, rep_stride, bs, out);
    const std::vector<int32_t> rep_brute = brute_replicated_table(table, stride, seq_lens, world, bs, rep_stride);
    ASSERT_EQ(out, to64(aar_test::naive_slots(qsl, seq_lens, rep_brute, rep_stride, bs, size))) << "iter " << iter;
    // Each slot decodes to (rank, local block, offset) of the position's dealt block.
    for (int32_t b = 0; b < rows; ++b) {
      const Dealt d = deal((seq_lens[b] + bs - 1) / bs, world, 1);
      for (int32_t t = qsl[b]; t < qsl[b + 1]; ++t) {
        const int32_t p = seq_lens[b] - (qsl[b + 1] - t);
        const int64_t block = out[t] / bs;
        ASSERT_EQ(out[t] % bs, p % bs);
        ASSERT_EQ(block % world, d.owner[p / bs]);
        ASSERT_EQ(block / world, table[b * stride + d.local[p / bs]]);
      }
    }
  }
}

// ---- §3: the top-k remap ----

TEST(PlanSparseCp, RemapWorkedExample) {
  const std::vector<int32_t> x = {0, 2, 1, 3, 4, 6, -1, 5};
  const std::vector<std::vector<int32_t>> want = {{0, 1, 2, 3, -1, -1, -1, -1}, {0, 1, 2, -1, -1, -1, -1, -1}};
  for (int32_t rank = 0; rank < 2; ++rank) {
    std::vector<int32_t> out(8, kSentinel);
    remap_sparse_indices(x, 8, {2, rank, 2}, out);
    EXPECT_EQ(out, want[rank]) << "rank " << rank;
    std::vector<int32_t> in_place = x;
    remap_sparse_indices(in_place, 8, {2, rank, 2}, in_place);
    EXPECT_EQ(in_place, want[rank]) << "rank " << rank << " in place";
  }
}

TEST(PlanSparseCp, RemapRandomAgainstBruteForce) {
  std::mt19937 rng(283);
  for (int iter = 0; iter < 300; ++iter) {
    const int32_t world = kWorlds[rng() % 5];
    const int32_t il = kInterleaves[rng() % 4];
    const int32_t K = 1 + static_cast<int32_t>(rng() % 64);
    const int32_t rows = static_cast<int32_t>(rng() % 51);
    const int32_t range = K + static_cast<int32_t>(rng() % 2000);
    const std::vector<int32_t> topk = random_topk(rng, rows, K, range);
    const Dealt d = deal(range, world, il);
    // Per row, the valid global positions the ranks give back, through their local sequences.
    std::vector<std::multiset<int32_t>> back(rows);
    for (int32_t rank = 0; rank < world; ++rank) {
      const std::vector<int32_t> want = brute_remap(topk, K, d, rank);
      const std::size_t extra = rng() % 3;
      std::vector<int32_t> out(topk.size() + extra, kSentinel);
      remap_sparse_indices(topk, K, {world, rank, il}, out);
      ASSERT_EQ(std::vector<int32_t>(out.begin(), out.begin() + topk.size()), want)
          << "iter " << iter << " W=" << world << " I=" << il << " K=" << K << " rank " << rank;
      for (std::size_t i = topk.size(); i < out.size(); ++i) ASSERT_EQ(out[i], kSentinel);
      std::vector<int32_t> in_place = topk;
      remap_sparse_indices(in_place, K, {world, rank, il}, in_place);
      ASSERT_EQ(in_place, want) << "iter " << iter << " in place, rank " << rank;
      for (int32_t r = 0; r < rows; ++r) {
        bool seen_invalid = false;
        for (int32_t j = 0; j < K; ++j) {
          const int32_t li = out[r * K + j];
          if (li < 0) {
            seen_invalid = true;
            continue;
          }
          ASSERT_FALSE(seen_invalid) << "a kept entry after a -1: the kernel's scan would miss it";
          back[r].insert(d.seq[rank].at(li));
        }
      }
    }
    for (int32_t r = 0; r < rows; ++r) {
      std::multiset<int32_t> valid;
      for (int32_t j = 0; j < K; ++j) {
        if (topk[r * K + j] >= 0) valid.insert(topk[r * K + j]);
      }
      ASSERT_EQ(back[r], valid) << "iter " << iter << " row " << r;
    }
  }
}

TEST(PlanSparseCp, RemapTreatsEveryNegativeAsInvalid) {
  const std::vector<int32_t> x = {-2, 7, INT32_MIN, 5, -1, INT32_MAX};
  std::vector<int32_t> out(6, kSentinel);
  remap_sparse_indices(x, 6, {1, 0, 1}, out);  // W = 1: identity on the valid entries, compacted
  EXPECT_EQ(out, (std::vector<int32_t>{7, 5, INT32_MAX, -1, -1, -1}));
  // INT32_MAX = 2^31 - 1 with W = 2, I = 1: the odd rank, local index 2^30 - 1.
  remap_sparse_indices(x, 3, {2, 1, 1}, out);
  EXPECT_EQ(out, (std::vector<int32_t>{3, -1, -1, 2, (1 << 30) - 1, -1}));
}

TEST(PlanSparseCp, RemapEmptyTopk) {
  std::vector<int32_t> out(2, kSentinel);
  remap_sparse_indices({}, 4, {2, 1, 1}, out);
  EXPECT_EQ(out, (std::vector<int32_t>{kSentinel, kSentinel}));
}

// ---- §4: the DSA-CP token shard ----

TEST(PlanSparseCp, TokenShardWorkedExample) {
  const ShardCase c;
  std::vector<int32_t> cum(2, kSentinel), seq(2, kSentinel);
  std::vector<int64_t> local(3, kSentinel);
  TokenShardBuffers buf{cum, seq, c.slots, local};
  const TokenShard s = plan_token_shard(c.in(), buf);
  EXPECT_EQ(cum, (std::vector<int32_t>{0, 2}));
  EXPECT_EQ(seq, (std::vector<int32_t>{0, 5}));
  EXPECT_EQ(local, (std::vector<int64_t>{3, 4, -1}));
  EXPECT_EQ(s.num_actual_tokens, 5);
  EXPECT_EQ(s.num_tokens_pad, 6);
  EXPECT_EQ(s.tokens_per_rank, 3);
  EXPECT_EQ(s.local_start, 3);
  EXPECT_EQ(s.local_end, 5);
  EXPECT_EQ(s.local_end_with_pad, 6);
  EXPECT_EQ(s.num_local_tokens, 2);

  // Rank 0 of the same step: exactly the first request.
  ShardCase c0;
  c0.rank = 0;
  const TokenShard s0 = plan_token_shard(c0.in(), buf);
  EXPECT_EQ(cum, (std::vector<int32_t>{3, 3}));
  EXPECT_EQ(seq, (std::vector<int32_t>{3, 0}));
  EXPECT_EQ(local, (std::vector<int64_t>{0, 1, 2}));
  EXPECT_EQ(s0.num_local_tokens, 3);
}

TEST(PlanSparseCp, TokenShardPaddingRequests) {
  // Graph padding: a request of 4 tokens and no KV straddles the boundary of ranks 0 and 1
  // (tpr 4), and one of 2 tokens with 1 key straddles ranks 1 and 2; a request without tokens
  // follows. Local lengths never go negative; a rank with no token of a request gives it 0.
  const std::vector<int32_t> qsl = {0, 3, 7, 9, 9}, seq_lens = {3, 0, 1, 0};
  const int32_t world = 3, num_input = 10;  // T_pad 12, tpr 4
  const std::vector<std::vector<int32_t>> want_cum = {{3, 4, 4, 4}, {0, 3, 4, 4}, {0, 0, 1, 1}};
  const std::vector<std::vector<int32_t>> want_seq = {{3, 0, 0, 0}, {0, 0, 0, 0}, {0, 0, 1, 0}};
  for (int32_t rank = 0; rank < world; ++rank) {
    TokenShardInputs in;
    in.query_start_loc = qsl;
    in.seq_lens = seq_lens;
    in.num_input_tokens = num_input;
    in.world = world;
    in.rank = rank;
    std::vector<int32_t> cum(4, kSentinel), seq(4, kSentinel);
    TokenShardBuffers buf{cum, seq, {}, {}};
    const TokenShard s = plan_token_shard(in, buf);
    EXPECT_EQ(cum, want_cum[rank]) << "rank " << rank;
    EXPECT_EQ(seq, want_seq[rank]) << "rank " << rank;
    EXPECT_EQ(s.tokens_per_rank, 4);
    EXPECT_EQ(s.num_local_tokens, rank < 2 ? 4 : 1);
  }

  // Ranks whose range is all padding: their end is their start, no local token.
  TokenShardInputs in;
  const std::vector<int32_t> q1 = {0, 3}, s1 = {3};
  in.query_start_loc = q1;
  in.seq_lens = s1;
  in.num_input_tokens = 10;
  in.world = 2;
  in.rank = 1;
  std::vector<int32_t> cum(1, kSentinel), seq(1, kSentinel);
  const std::vector<int64_t> slots = {7, 8, 9};
  std::vector<int64_t> local(5, kSentinel);
  const TokenShard s = plan_token_shard(in, TokenShardBuffers{cum, seq, slots, local});
  EXPECT_EQ(s.local_start, 5);
  EXPECT_EQ(s.local_end, 5);
  EXPECT_EQ(s.local_end_with_pad, 10);
  EXPECT_EQ(s.num_local_tokens, 0);
  EXPECT_EQ(cum, std::vector<int32_t>{0});
  EXPECT_EQ(seq, std::vector<int32_t>{0});
  EXPECT_EQ(local, std::vector<int64_t>(5, -1));
}

TEST(PlanSparseCp, TokenShardEmptyStep) {
  TokenShardInputs in;
  const std::vector<int32_t> qsl = {0};
  in.query_start_loc = qsl;
  in.world = 4;
  in.rank = 3;
  const TokenShard s = plan_token_shard(in, TokenShardBuffers{});
  EXPECT_EQ(s.num_tokens_pad, 0);
  EXPECT_EQ(s.tokens_per_rank, 0);
  EXPECT_EQ(s.local_start, 0);
  EXPECT_EQ(s.local_end, 0);
  EXPECT_EQ(s.num_local_tokens, 0);
}

TEST(PlanSparseCp, TokenShardRandomAgainstCounting) {
  std::mt19937 rng(284);
  for (int iter = 0; iter < 400; ++iter) {
    const int32_t world = kWorlds[rng() % 5];
    const int32_t reqs = static_cast<int32_t>(rng() % 12);
    std::vector<int32_t> q(reqs), seq_lens(reqs);
    for (int32_t b = 0; b < reqs; ++b) {
      q[b] = static_cast<int32_t>(rng() % 9);
      const uint32_t kind = rng() % 4;  // a quarter are padding requests, KV shorter than their tokens
      seq_lens[b] = kind == 0 ? static_cast<int32_t>(rng() % (q[b] + 1)) : q[b] + static_cast<int32_t>(rng() % 50);
    }
    const std::vector<int32_t> qsl = lens_to_qsl(q);
    const int32_t total = qsl.back();
    const int32_t num_input = total + static_cast<int32_t>(rng() % (2 * world + 1));
    // The step's slot mapping covers the real tokens, sometimes the graph padding too.
    std::vector<int64_t> slots(rng() % 2 ? total : num_input);
    for (std::size_t t = 0; t < slots.size(); ++t) {
      slots[t] = t < static_cast<std::size_t>(total) ? 1000 + static_cast<int64_t>(t) : int64_t{-1};
    }
    std::vector<int64_t> padded(slots);
    int32_t pad = num_input;
    while (pad % world != 0) ++pad;
    padded.resize(pad, -1);

    std::vector<int64_t> concat;
    int32_t sum_local = 0, sum_tokens = 0;
    for (int32_t rank = 0; rank < world; ++rank) {
      TokenShardInputs in;
      in.query_start_loc = qsl;
      in.seq_lens = seq_lens;
      in.num_input_tokens = num_input;
      in.world = world;
      in.rank = rank;
      const BruteShard want = brute_shard(qsl, seq_lens, slots, num_input, world, rank);
      std::vector<int32_t> cum(reqs + 1, kSentinel), seq(reqs + 1, kSentinel);
      std::vector<int64_t> local(want.tpr + 1, kSentinel);
      const TokenShard s = plan_token_shard(in, TokenShardBuffers{cum, seq, slots, local});
      ASSERT_EQ(s.tokens_per_rank, want.tpr);
      ASSERT_EQ(s.num_tokens_pad, pad);
      ASSERT_EQ(s.num_actual_tokens, total);
      ASSERT_EQ(s.local_start, rank * want.tpr);
      ASSERT_EQ(s.local_end_with_pad, (rank + 1) * want.tpr);
      ASSERT_EQ(s.num_local_tokens, want.local_tokens);
      ASSERT_EQ(s.local_end, s.local_start + s.num_local_tokens);
      ASSERT_EQ(std::vector<int32_t>(cum.begin(), cum.begin() + reqs), want.cum) << "iter " << iter << " rank " << rank;
      ASSERT_EQ(std::vector<int32_t>(seq.begin(), seq.begin() + reqs), want.seq) << "iter " << iter << " rank " << rank;
      ASSERT_EQ(cum[reqs], kSentinel);  // B entries, no more
      ASSERT_EQ(seq[reqs], kSentinel);
      ASSERT_EQ(std::vector<int64_t>(local.begin(), local.begin() + want.tpr), want.slots);
      ASSERT_EQ(local[want.tpr], kSentinel);  // tpr entries, no more
      concat.insert(concat.end(), local.begin(), local.begin() + want.tpr);
      sum_local += reqs > 0 ? cum[reqs - 1] : 0;
      sum_tokens += s.num_local_tokens;
      for (int32_t b = 0; b < reqs; ++b) ASSERT_GE(seq[b], 0);
    }
    // Across ranks: every real token once, the slot mapping back whole.
    ASSERT_EQ(sum_local, total) << "iter " << iter;
    ASSERT_EQ(sum_tokens, total) << "iter " << iter;
    ASSERT_EQ(concat, padded) << "iter " << iter;
  }
}

// ---- rejections: one call per check, the outputs untouched, the same on every rank ----

TEST(PlanSparseCp, ReplicatedTableRejectionsWriteNothing) {
  auto rejected = [](const ReplicatedCase& c, const std::function<void(DcpReplicatedInputs&)>& bad,
                     int32_t out_stride, std::size_t out_size, const char* msg) {
    DcpReplicatedInputs in = c.in();
    bad(in);
    std::vector<int32_t> out(out_size, kSentinel);
    EXPECT_INVALID(dcp_replicated_block_table(in, out, out_stride), msg);
    EXPECT_EQ(out, std::vector<int32_t>(out_size, kSentinel)) << msg;
  };
  const ReplicatedCase good;
  auto none = [](DcpReplicatedInputs&) {};
  {  // the good call itself: row 0 has 3 replicated columns (local columns 0, 1), row 1 none
    std::vector<int32_t> out(10, kSentinel);
    dcp_replicated_block_table(good.in(), out, 5);
    EXPECT_EQ(out, (std::vector<int32_t>{6, 7, 2, 0, 0, 0, 0, 0, 0, 0}));
  }
  rejected(good, [](auto& in) { in.world = 0; }, 5, 10, "world=0 is out of range [1, 16]");
  rejected(good, [](auto& in) { in.world = 17; }, 40, 80, "world=17 is out of range [1, 16]");
  rejected(good, [](auto& in) { in.block_size = 0; }, 5, 10, "block_size=0 must be positive");
  rejected(good, [](auto& in) { in.num_blocks = -1; }, 5, 10, "num_blocks=-1 is negative");
  rejected(good, [](auto& in) { in.num_blocks = INT32_MAX / 2 + 1; }, 5, 10, "do not fit int32 block ids");
  rejected(good, [](auto& in) { in.block_table_stride = -1; }, 5, 10, "block_table_stride=-1 is negative");
  rejected(good, [](auto& in) { in.block_table_stride = 3; }, 6, 12, "block_table has 4 entries, expected 2 x 3");
  rejected(good, none, 3, 10, "out_stride=3 is smaller than block_table_stride*world = 2*2");
  rejected(good, none, 5, 9, "out has room for 9 entries, needs rows*out_stride = 2*5 = 10");
  ReplicatedCase c = good;
  c.seq_lens = {9, -1};
  rejected(c, none, 5, 10, "seq_lens[1]=-1 is negative");
  c = good;
  c.seq_lens = {17, 0};  // 5 replicated columns: local column 2
  rejected(c, none, 5, 10, "needs 5 replicated columns, local column 2 of the block table, but block_table_stride=2");
  c = good;
  c.table = {3, 4, 2, 0};
  rejected(c, none, 5, 10, "block_table[0][1]=4 is out of range [0, num_blocks=4)");
  c = good;
  c.table = {3, 1, -2, 0};
  c.seq_lens = {0, 1};
  rejected(c, none, 5, 10, "block_table[1][0]=-2 is out of range");
  c = good;
  c.table = {3, 1, 2, 9};  // row 1 column 1 is never read (row 1 has 1 column): accepted
  c.seq_lens = {9, 4};
  std::vector<int32_t> out(10, kSentinel);
  dcp_replicated_block_table(c.in(), out, 5);
  EXPECT_EQ(out, (std::vector<int32_t>{6, 7, 2, 0, 0, 4, 0, 0, 0, 0}));
}

TEST(PlanSparseCp, ReplicatedSlotMappingRejectionsWriteNothing) {
  auto rejected = [](const SlotCase& c, std::size_t out_size, const char* msg) {
    std::vector<int64_t> out(out_size, kSentinel);
    EXPECT_INVALID(dcp_replicated_slot_mapping(c.qsl, c.seq_lens, c.rep, c.stride, c.bs, out), msg);
    EXPECT_EQ(out, std::vector<int64_t>(out_size, kSentinel)) << msg;
  };
  const SlotCase good;
  {  // the good call: request 0 positions 6..8 (column 1 offsets 2, 3; column 2 offset 0), request 1 position 4
    std::vector<int64_t> out(5, kSentinel);
    dcp_replicated_slot_mapping(good.qsl, good.seq_lens, good.rep, good.stride, good.bs, out);
    EXPECT_EQ(out, (std::vector<int64_t>{30, 31, 8, 20, -1}));
  }
  SlotCase c = good;
  c.bs = 0;
  rejected(c, 5, "block_size=0 must be positive");
  c = good;
  c.stride = -1;
  rejected(c, 5, "rep_stride=-1 is negative");
  c = good;
  c.qsl = {0, 3};
  rejected(c, 5, "query_start_loc has 2 entries, expected seq_lens.size()+1 = 3");
  c = good;
  c.qsl = {1, 3, 4};
  rejected(c, 5, "query_start_loc[0]=1 must be 0");
  c = good;
  c.qsl = {0, 3, 2};
  rejected(c, 5, "query_start_loc must be non-decreasing");
  c = good;
  c.rep.resize(11);
  rejected(c, 5, "rep has 11 entries, expected 2 x 6");
  rejected(good, 3, "out has room for 3 entries, needs query_start_loc[B]=4");
  c = good;
  c.seq_lens = {2, 5};
  rejected(c, 5, "seq_lens[0]=2 is smaller than its query length 3");
  c = good;
  c.stride = 2;  // position 8 is in column 2
  rejected(c, 5, "seq_lens[0]=9 needs replicated column 2 but rep_stride=2");
  c = good;
  c.rep[6 + 1] = -1;  // row 1, column 1: position 4
  rejected(c, 5, "rep[1][1]=-1 is negative");
}

TEST(PlanSparseCp, RemapRejectionsWriteNothing) {
  const std::vector<int32_t> topk = {0, 5, -1, 3, 2, 9};
  auto rejected = [&](int32_t K, DcpShard shard, std::size_t out_size, const char* msg) {
    std::vector<int32_t> out(out_size, kSentinel);
    EXPECT_INVALID(remap_sparse_indices(topk, K, shard, out), msg);
    EXPECT_EQ(out, std::vector<int32_t>(out_size, kSentinel)) << msg;
  };
  rejected(0, {2, 0, 1}, 6, "K=0 must be positive");
  rejected(-3, {2, 0, 1}, 6, "K=-3 must be positive");
  rejected(4, {2, 0, 1}, 8, "topk has 6 entries, not a multiple of K=4");
  rejected(3, {0, 0, 1}, 6, "world=0 must be >= 1");
  rejected(3, {2, 0, 0}, 6, "interleave=0 must be >= 1");
  rejected(3, {2, 2, 1}, 6, "rank=2 is out of range [0, world=2)");
  rejected(3, {2, -1, 1}, 6, "rank=-1 is out of range [0, world=2)");
  rejected(3, {2, 1, 1}, 5, "out has room for 5 entries, needs topk.size()=6");

  // Overlap other than in place: a shifted view of the same storage, either direction.
  for (std::ptrdiff_t shift : {1, -1}) {
    std::vector<int32_t> store(8, kSentinel);
    std::copy(topk.begin(), topk.end(), store.begin() + 1);
    const CSpan<int32_t> src(store.data() + 1, 6);
    const Span<int32_t> dst(store.data() + 1 + shift, 6);
    const std::vector<int32_t> before = store;
    EXPECT_INVALID(remap_sparse_indices(src, 3, {2, 0, 1}, dst), "out overlaps topk without starting at it");
    EXPECT_EQ(store, before);
  }
  // Adjacent buffers do not overlap.
  std::vector<int32_t> store(12, kSentinel);
  std::copy(topk.begin(), topk.end(), store.begin());
  remap_sparse_indices(CSpan<int32_t>(store.data(), 6), 3, {2, 1, 1}, Span<int32_t>(store.data() + 6, 6));
  EXPECT_EQ(std::vector<int32_t>(store.begin() + 6, store.end()), (std::vector<int32_t>{2, -1, -1, 1, 4, -1}));
}

TEST(PlanSparseCp, TokenShardRejectionsWriteNothing) {
  auto rejected = [](const ShardCase& c, std::size_t cum_size, std::size_t seq_size, std::size_t local_size,
                     const std::vector<int64_t>& slots, const char* msg) {
    std::vector<int32_t> cum(cum_size, kSentinel), seq(seq_size, kSentinel);
    std::vector<int64_t> local(local_size, kSentinel);
    EXPECT_INVALID(plan_token_shard(c.in(), TokenShardBuffers{cum, seq, slots, local}), msg);
    EXPECT_EQ(cum, std::vector<int32_t>(cum_size, kSentinel)) << msg;
    EXPECT_EQ(seq, std::vector<int32_t>(seq_size, kSentinel)) << msg;
    EXPECT_EQ(local, std::vector<int64_t>(local_size, kSentinel)) << msg;
  };
  const ShardCase good;
  ShardCase c = good;
  c.world = 0;
  c.rank = 0;
  rejected(c, 2, 2, 3, good.slots, "world=0 must be >= 1");
  c = good;
  c.rank = 2;
  rejected(c, 2, 2, 3, good.slots, "rank=2 is out of range [0, world=2)");
  c = good;
  c.rank = -1;
  rejected(c, 2, 2, 3, good.slots, "rank=-1 is out of range [0, world=2)");
  c = good;
  c.qsl = {0, 3, 5, 5};
  rejected(c, 3, 3, 3, good.slots, "query_start_loc has 4 entries, expected seq_lens.size()+1 = 3");
  c = good;
  c.qsl = {2, 3, 5};
  rejected(c, 2, 2, 3, good.slots, "query_start_loc[0]=2 must be 0");
  c = good;
  c.qsl = {0, 4, 3};
  rejected(c, 2, 2, 3, good.slots, "query_start_loc must be non-decreasing");
  c = good;
  c.seq_lens = {3, -5};
  rejected(c, 2, 2, 3, good.slots, "seq_lens[1]=-5 is negative");
  c = good;
  c.num_input = 4;
  rejected(c, 2, 2, 3, good.slots, "num_input_tokens=4 is smaller than query_start_loc[B]=5");
  c = good;
  c.num_input = INT32_MAX;  // rounded up to a multiple of 2: 2^31
  rejected(c, 2, 2, 3, good.slots, "num_input_tokens=2147483647 rounded up to a multiple of world=2 is 2147483648");
  rejected(good, 1, 2, 3, good.slots, "local_cum_query_lens has room for 1 entries, needs B=2");
  rejected(good, 2, 1, 3, good.slots, "local_seq_lens has room for 1 entries, needs B=2");
  rejected(good, 2, 2, 2, good.slots, "local_slot_mapping has room for 2 entries, needs tokens_per_rank=3");
  rejected(good, 2, 2, 3, {0, 1, 2, 3}, "slot_mapping has 4 entries, fewer than query_start_loc[B]=5");

  // Without a local slot buffer the slot mapping is not read: any size passes.
  std::vector<int32_t> cum(2, kSentinel), seq(2, kSentinel);
  plan_token_shard(good.in(), TokenShardBuffers{cum, seq, {}, {}});
  EXPECT_EQ(cum, (std::vector<int32_t>{0, 2}));
}

TEST(PlanSparseCp, ChecksAreRankIndependent) {
  // A rejected batch is rejected on every rank of the group, an accepted one on none, whatever
  // the rank's share: no rank can be left waiting in a collective.
  const std::vector<int32_t> topk = {0, 5, -1, 3, 2, 9};
  const ShardCase good;
  for (int32_t rank = 0; rank < 4; ++rank) {
    std::vector<int32_t> out(5, kSentinel);
    EXPECT_INVALID(remap_sparse_indices(topk, 3, {4, rank, 2}, out), "out has room for 5");
    ShardCase c = good;
    c.world = 4;
    c.rank = rank;  // tpr 2: ranks 0..2 hold real tokens, rank 3 only padding
    c.seq_lens = {3, -1};
    std::vector<int32_t> cum(2), seq(2);
    std::vector<int64_t> local(2);
    EXPECT_INVALID(plan_token_shard(c.in(), TokenShardBuffers{cum, seq, good.slots, local}), "seq_lens[1]=-1");
    c = good;
    c.world = 4;
    c.rank = rank;
    const std::vector<int64_t> short_slots = {0, 1, 2, 3};
    EXPECT_INVALID(plan_token_shard(c.in(), TokenShardBuffers{cum, seq, short_slots, local}), "slot_mapping has 4");
  }
}

TEST(PlanSparseCp, DsaDcpCapturedCmpWidthHoldsEveryLimit) {
  // docs/design/sparse_cp.md §12.5: against the definition, every position p < P a step builder
  // accepts has its limit floor((p + 1) / r) within the width, and the width is the largest such
  // limit (at least 1).
  for (int32_t r : {2, 4, 128}) {
    for (int64_t P = 1; P <= 600; ++P) {
      int64_t most = 0;
      for (int64_t p = 0; p < P; ++p) most = std::max(most, (p + 1) / r);
      EXPECT_EQ(dsa_dcp_captured_cmp_width(P, r), std::max<int64_t>(most, 1)) << "P " << P << " r " << r;
    }
  }
  EXPECT_EQ(dsa_dcp_captured_cmp_width(int64_t{1} << 20, 128), 8192);
  EXPECT_INVALID(dsa_dcp_captured_cmp_width(0, 128), "rope_positions=0");
  EXPECT_INVALID(dsa_dcp_captured_cmp_width(64, 1), "ratio=1");
}
