// Legacy PCP DualChunkSwap split (docs/design/cp.md §6.1, §6.3, §3.4, §6.4, §9):
// the upstream docstring vector, and a simulation that all-gathers tagged local
// tokens, restores them and checks every real token comes back exactly once, in
// batch order, and that head/tail attention sees exactly the causal keys.
#include <algorithm>
#include <numeric>
#include <random>
#include <tuple>
#include <vector>

#include "ascend_attn_rt/cp/plan/dcp_layout.h"
#include "ascend_attn_rt/cp/plan/pcp_split.h"
#include "test_plan_util.h"

using namespace aar::plan;

namespace {

struct Split {
  std::vector<int32_t> q;
  int32_t num_decodes = 0;
  int32_t wp = 1;
  PcpSplitInputs in() const { return {q, num_decodes, wp}; }
};

struct LocalTokens {
  std::vector<int32_t> lens, pos;
};

LocalTokens local(const Split& s, int32_t rank) {
  const PcpSplitSizes n = pcp_split_sizes(s.in());
  LocalTokens t;
  t.lens.assign(n.num_reqs, -1);
  t.pos.assign(n.local_tokens, -1);
  pcp_local_tokens(s.in(), rank, t.lens, t.pos);
  return t;
}

std::vector<int32_t> argsort(const std::vector<int32_t>& v) {
  std::vector<int32_t> idx(v.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return v[a] < v[b]; });
  return idx;
}

// Brute force from the words of docs/design/cp.md: split [0, P) into 2 Wp chunks of c; rank
// rp takes chunks rp and 2 Wp - 1 - rp.
std::vector<int32_t> brute_positions(const Split& s, int32_t rank) {
  std::vector<int32_t> pos;
  for (std::size_t i = 0; i < s.q.size(); ++i) {
    const int32_t q = s.q[i];
    if (static_cast<int32_t>(i) < s.num_decodes) {
      for (int32_t j = 0; j < q; ++j) pos.push_back(j);
      continue;
    }
    int32_t p = q;
    while (p % (2 * s.wp) != 0) ++p;
    const int32_t c = p / (2 * s.wp);
    std::vector<std::vector<int32_t>> chunks(2 * s.wp);
    for (int32_t x = 0; x < p; ++x) chunks[x / c].push_back(x);
    for (int32_t ch : {rank, 2 * s.wp - 1 - rank}) pos.insert(pos.end(), chunks[ch].begin(), chunks[ch].end());
  }
  return pos;
}

// A tagged token: (request, position, source rank).
using Tag = std::tuple<int32_t, int32_t, int32_t>;

// Simulates the PCP all-gather (rank-major) of the tagged local buffers.
std::vector<Tag> gather(const Split& s) {
  std::vector<Tag> g;
  for (int32_t r = 0; r < s.wp; ++r) {
    const LocalTokens t = local(s, r);
    std::size_t k = 0;
    for (std::size_t i = 0; i < s.q.size(); ++i) {
      for (int32_t j = 0; j < t.lens[i]; ++j, ++k) g.emplace_back(static_cast<int32_t>(i), t.pos[k], r);
    }
  }
  return g;
}

std::vector<int32_t> restore(const Split& s) {
  std::vector<int32_t> out(pcp_split_sizes(s.in()).padded_global_tokens, -1);
  pcp_restore_index(s.in(), out);
  return out;
}

std::vector<uint8_t> unpad(const Split& s) {
  std::vector<uint8_t> out(pcp_split_sizes(s.in()).padded_global_tokens, 9);
  pcp_unpad_mask(s.in(), out);
  return out;
}

std::vector<Split> random_splits(std::mt19937& rng, int count) {
  std::vector<Split> v;
  for (int t = 0; t < count; ++t) {
    Split s;
    s.wp = 1 + static_cast<int32_t>(rng() % 4);
    const int nd = static_cast<int>(rng() % 4), np = static_cast<int>(rng() % 4);
    const int32_t dq = 1 + static_cast<int32_t>(rng() % 3);  // a uniform decode length (MTP when > 1)
    for (int i = 0; i < nd; ++i) s.q.push_back(dq);
    // Prefill lengths that do and do not force padding (q mod 2 Wp != 0).
    for (int i = 0; i < np; ++i) s.q.push_back(static_cast<int32_t>(rng() % 40));
    s.num_decodes = nd;
    v.push_back(s);
  }
  return v;
}

}  // namespace

TEST(PlanPcpSplit, UpstreamDocstringVector) {
  // update_tokens_for_pcp: tokens [1,5,8], request 0 a decode, Wp=2.
  const Split s{{1, 5, 8}, 1, 2};
  const PcpSplitSizes n = pcp_split_sizes(s.in());
  EXPECT_EQ(n.num_decode_tokens, 1);
  EXPECT_EQ(n.local_tokens, 9);
  EXPECT_EQ(n.local_prefill_tokens, 8);
  EXPECT_EQ(n.padded_global_tokens, 18);
  const LocalTokens r0 = local(s, 0), r1 = local(s, 1);
  EXPECT_EQ(r0.lens, (std::vector<int32_t>{1, 4, 4}));
  EXPECT_EQ(r1.lens, (std::vector<int32_t>{1, 4, 4}));
  EXPECT_EQ(r0.pos, (std::vector<int32_t>{0, 0, 1, 6, 7, 0, 1, 6, 7}));
  EXPECT_EQ(r1.pos, (std::vector<int32_t>{0, 2, 3, 4, 5, 2, 3, 4, 5}));
  std::vector<int32_t> pads(3, -1);
  pcp_pad_counts(s.in(), pads);
  EXPECT_EQ(pads, (std::vector<int32_t>{1, 3, 0}));
  EXPECT_EQ(restore(s), (std::vector<int32_t>{0, 9, 1, 2, 10, 11, 12, 13, 3, 4, 5, 6, 14, 15, 16, 17, 7, 8}));
  // The construction of docs/design/cp.md: argsort of the concatenated padded-global indices.
  EXPECT_EQ(restore(s), argsort({0, 2, 3, 8, 9, 10, 11, 16, 17, 1, 4, 5, 6, 7, 12, 13, 14, 15}));
  EXPECT_EQ(unpad(s), (std::vector<uint8_t>{1, 0, 1, 1, 1, 1, 1, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1}));
}

TEST(PlanPcpSplit, PositionsAgainstBruteForce) {
  std::mt19937 rng(21);
  for (const Split& s : random_splits(rng, 200)) {
    for (int32_t r = 0; r < s.wp; ++r) {
      const LocalTokens t = local(s, r);
      ASSERT_EQ(t.pos, brute_positions(s, r));
      int64_t sum = 0;
      for (std::size_t i = 0; i < s.q.size(); ++i) {
        const bool dec = static_cast<int32_t>(i) < s.num_decodes;
        ASSERT_EQ(t.lens[i], dec ? s.q[i] : 2 * ((s.q[i] + 2 * s.wp - 1) / (2 * s.wp)));
        sum += t.lens[i];
      }
      ASSERT_EQ(sum, pcp_split_sizes(s.in()).local_tokens);  // equal on every rank
    }
  }
}

TEST(PlanPcpSplit, RestoreAndUnpadGiveBackTheBatch) {
  // docs/design/cp.md §6.1: mixed batches, multi-token decodes, q values forcing padding.
  std::mt19937 rng(22);
  std::vector<Split> cases = random_splits(rng, 300);
  cases.push_back({{2, 2, 7}, 2, 2});  // MTP decodes
  cases.push_back({{3, 1}, 0, 3});     // PCP 3, prefills shorter than 2 Wp
  cases.push_back({{}, 0, 2});         // empty batch
  for (const Split& s : cases) {
    const std::vector<Tag> g = gather(s);
    const std::vector<int32_t> rs = restore(s);
    const std::vector<uint8_t> mask = unpad(s);
    ASSERT_EQ(rs.size(), g.size());
    // restore is a permutation of G's rows.
    std::vector<int32_t> sorted = rs;
    std::sort(sorted.begin(), sorted.end());
    for (std::size_t i = 0; i < sorted.size(); ++i) ASSERT_EQ(sorted[i], static_cast<int32_t>(i));
    // padded_global = G[restore]: prefill regions in position order, decode
    // token i's Wp copies adjacent (rank rp's at i*Wp + rp).
    std::size_t slot = 0;
    std::vector<Tag> real;
    for (std::size_t i = 0; i < s.q.size(); ++i) {
      const int32_t req = static_cast<int32_t>(i);
      if (req < s.num_decodes) {
        for (int32_t j = 0; j < s.q[i]; ++j) {
          for (int32_t r = 0; r < s.wp; ++r, ++slot) {
            ASSERT_EQ(g[rs[slot]], Tag(req, j, r));
            ASSERT_EQ(mask[slot], r == 0 ? 1 : 0);
          }
        }
        continue;
      }
      const int32_t len = 2 * s.wp * ((s.q[i] + 2 * s.wp - 1) / (2 * s.wp));
      for (int32_t x = 0; x < len; ++x, ++slot) {
        ASSERT_EQ(std::get<0>(g[rs[slot]]), req);
        ASSERT_EQ(std::get<1>(g[rs[slot]]), x);
        ASSERT_EQ(mask[slot], x < s.q[i] ? 1 : 0);
      }
    }
    ASSERT_EQ(slot, g.size());
    // The unpadded rows are the batch's scheduled tokens, each once, in order.
    std::vector<std::pair<int32_t, int32_t>> got, want;
    for (std::size_t k = 0; k < rs.size(); ++k) {
      if (mask[k]) got.emplace_back(std::get<0>(g[rs[k]]), std::get<1>(g[rs[k]]));
    }
    for (std::size_t i = 0; i < s.q.size(); ++i) {
      for (int32_t j = 0; j < s.q[i]; ++j) want.emplace_back(static_cast<int32_t>(i), j);
    }
    ASSERT_EQ(got, want);
  }
}

TEST(PlanPcpSplit, PaddedSlotMapping) {
  // docs/design/cp.md §6.3: batch-order slots scattered to the padded-global layout through
  // the unpad mask; decode slots at stride Wp in the first Wp*Td entries.
  const Split s{{2, 1, 5}, 2, 2};
  const std::vector<int32_t> tok = {10, 11, 12, 20, 21, 22, 23, 24};
  std::vector<int32_t> out(pcp_split_sizes(s.in()).padded_global_tokens, 0);
  pcp_padded_slot_mapping(s.in(), tok, out);
  // Decodes: 2*2 + 1*2 slots; the prefill P=8.
  EXPECT_EQ(out, (std::vector<int32_t>{10, -1, 11, -1, 12, -1, 20, 21, 22, 23, 24, -1, -1, -1}));
  const std::vector<uint8_t> mask = unpad(s);
  std::vector<int32_t> real;
  for (std::size_t k = 0; k < out.size(); ++k) {
    if (mask[k]) real.push_back(out[k]);
    else EXPECT_EQ(out[k], -1);
  }
  EXPECT_EQ(real, tok);
  std::vector<int32_t> keep(out.size(), 5);
  EXPECT_INVALID(pcp_padded_slot_mapping(s.in(), std::vector<int32_t>(7, 0), keep),
                 "token_slots has 7 entries, expected sum(query_lens)=8");
  EXPECT_INVALID(pcp_padded_slot_mapping(s.in(), tok, Span<int32_t>(keep.data(), 13)), "slots_out has room for 13");
  EXPECT_EQ(keep, std::vector<int32_t>(out.size(), 5));
}

TEST(PlanPcpSplit, ChunkRestoreIndicesAgainstArgsort) {
  // docs/design/cp.md §6.4: kv_inverse = argsort(restore[Wp*Td:]), recover = argsort(kv_inverse).
  std::mt19937 rng(23);
  std::vector<Split> cases = random_splits(rng, 200);
  cases.push_back({{1, 5, 8}, 1, 2});
  for (const Split& s : cases) {
    const PcpSplitSizes n = pcp_split_sizes(s.in());
    const std::vector<int32_t> rs = restore(s);
    const std::vector<int32_t> tail(rs.begin() + s.wp * n.num_decode_tokens, rs.end());
    const std::vector<int32_t> inverse = argsort(tail), recover = argsort(inverse);
    const std::size_t rows = static_cast<std::size_t>(n.local_prefill_tokens) * s.wp;
    std::vector<int32_t> rec(rows, -1), inv(rows, -1);
    pcp_chunk_restore_index(s.in(), rec, inv);
    ASSERT_EQ(rec, recover);
    ASSERT_EQ(inv, inverse);
  }
}

namespace {

struct HeadTail {
  PcpHeadTailCounts n;
  std::vector<int32_t> qh, qt, hnm, hm, tnm, tm, qfull;
  std::vector<int64_t> mask_ends, head_ends, tail_ends;
};

HeadTail head_tail(const Split& s, int32_t rank) {
  HeadTail h;
  const PcpHeadTailCounts n = pcp_head_tail_counts(s.in(), rank);
  h.qh.assign(n.chunk_tokens, -1);
  h.qt.assign(n.chunk_tokens, -1);
  h.hnm.assign(n.head_nomask_tokens, -1);
  h.hm.assign(n.chunk_tokens, -1);
  h.tnm.assign(n.tail_nomask_tokens, -1);
  h.tm.assign(n.chunk_tokens, -1);
  h.qfull.assign(2 * n.chunk_tokens, -1);
  h.mask_ends.assign(n.num_prefills, -1);
  h.head_ends.assign(n.num_prefills, -1);
  h.tail_ends.assign(n.num_prefills, -1);
  h.n = pcp_head_tail_indices(s.in(), rank,
                              {h.qh, h.qt, h.hnm, h.hm, h.tnm, h.tm, h.qfull, h.mask_ends, h.head_ends, h.tail_ends});
  return h;
}

std::vector<int32_t> range(int32_t a, int32_t b) {
  std::vector<int32_t> v;
  for (int32_t i = a; i < b; ++i) v.push_back(i);
  return v;
}

}  // namespace

TEST(PlanPcpSplit, HeadTailSpecExample) {
  // docs/design/cp.md §6.4: Wp=2, one prefill with local length 4 (c=2, P=8).
  const Split s{{8}, 0, 2};
  const HeadTail a = head_tail(s, 0), b = head_tail(s, 1);
  EXPECT_EQ(a.qh, range(0, 2));
  EXPECT_EQ(a.hnm, range(0, 0));
  EXPECT_EQ(a.hm, range(0, 2));
  EXPECT_EQ(a.qt, range(2, 4));
  EXPECT_EQ(a.tnm, range(0, 6));
  EXPECT_EQ(a.tm, range(6, 8));
  EXPECT_EQ(b.hnm, range(0, 2));
  EXPECT_EQ(b.hm, range(2, 4));
  EXPECT_EQ(b.tnm, range(0, 4));
  EXPECT_EQ(b.tm, range(4, 6));
  EXPECT_EQ(a.mask_ends, (std::vector<int64_t>{2}));
  EXPECT_EQ(a.head_ends, (std::vector<int64_t>{0}));
  EXPECT_EQ(a.tail_ends, (std::vector<int64_t>{6}));
  EXPECT_EQ(b.head_ends, (std::vector<int64_t>{2}));
  EXPECT_EQ(b.tail_ends, (std::vector<int64_t>{4}));
  EXPECT_EQ(a.qfull, range(0, 4));
}

TEST(PlanPcpSplit, HeadTailAttentionSeesExactlyTheCausalKeys) {
  // For every local prefill query: the keys of its nomask range (all visible)
  // plus the causal part of its mask block must be exactly the padded-global
  // positions <= its own position in its request. The cumulative ends cut the
  // lists per request, and q_full_idx restores the local order.
  std::mt19937 rng(24);
  std::vector<Split> cases = random_splits(rng, 200);
  cases.push_back({{1, 5, 8}, 1, 2});
  cases.push_back({{13, 0, 3}, 0, 3});
  for (const Split& s : cases) {
    const PcpSplitSizes n = pcp_split_sizes(s.in());
    for (int32_t r = 0; r < s.wp; ++r) {
      const HeadTail h = head_tail(s, r);
      const LocalTokens t = local(s, r);
      const std::vector<int32_t> ppos(t.pos.begin() + n.num_decode_tokens, t.pos.end());  // prefill-local positions
      // Per prefill request: first padded-global prefill index and first local prefill query.
      std::vector<int32_t> kv_begin, q_begin, chunk;
      int32_t ko = 0, qo = 0;
      for (std::size_t i = s.num_decodes; i < s.q.size(); ++i) {
        const int32_t c = (s.q[i] + 2 * s.wp - 1) / (2 * s.wp);
        kv_begin.push_back(ko);
        q_begin.push_back(qo);
        chunk.push_back(c);
        ko += 2 * c * s.wp;
        qo += 2 * c;
      }
      ASSERT_EQ(h.n.num_prefills, static_cast<int32_t>(chunk.size()));
      int64_t c_sum = 0, h_sum = 0, t_sum = 0;
      for (std::size_t p = 0; p < chunk.size(); ++p) {
        const int32_t c = chunk[p];
        const int32_t head = r, tail = 2 * s.wp - 1 - r;
        const std::pair<const std::vector<int32_t>*, const std::vector<int32_t>*> lists[2] = {{&h.hnm, &h.hm},
                                                                                             {&h.tnm, &h.tm}};
        const int64_t nm_begin[2] = {h_sum, t_sum};
        const int64_t nm_len[2] = {static_cast<int64_t>(head) * c, static_cast<int64_t>(tail) * c};
        for (int side = 0; side < 2; ++side) {
          const std::vector<int32_t>& qidx = side == 0 ? h.qh : h.qt;
          for (int32_t i = 0; i < c; ++i) {
            const int32_t qi = qidx[c_sum + i];
            ASSERT_EQ(qi, q_begin[p] + side * c + i);
            const int32_t pos = ppos[qi];
            std::vector<int32_t> seen;
            for (int64_t k = 0; k < nm_len[side]; ++k) seen.push_back((*lists[side].first)[nm_begin[side] + k]);
            for (int32_t k = 0; k <= i; ++k) seen.push_back((*lists[side].second)[c_sum + k]);  // causal block
            std::sort(seen.begin(), seen.end());
            ASSERT_EQ(seen, range(kv_begin[p], kv_begin[p] + pos + 1)) << "rank " << r << " query pos " << pos;
          }
        }
        c_sum += c;
        h_sum += nm_len[0];
        t_sum += nm_len[1];
        ASSERT_EQ(h.mask_ends[p], c_sum);
        ASSERT_EQ(h.head_ends[p], h_sum);
        ASSERT_EQ(h.tail_ends[p], t_sum);
      }
      // concat(head outputs, tail outputs)[q_full_idx] is the local order.
      std::vector<int32_t> cat = h.qh;
      cat.insert(cat.end(), h.qt.begin(), h.qt.end());
      ASSERT_EQ(h.qfull, argsort(cat));
      std::vector<int32_t> restored;
      for (int32_t k : h.qfull) restored.push_back(cat[k]);
      ASSERT_EQ(restored, range(0, n.local_prefill_tokens));
    }
  }
}

TEST(PlanPcpSplit, LegacyWritePathShardsTheKvOverAllCpRanks) {
  // docs/design/cp.md §6.3 / §6.4 write path, Wp x Wd ranks: each rank computes the batch's
  // slots with W = Wp*Wd, r = rp*Wd + rd (pre-split global positions), scatters
  // them to the padded-global layout, all-gathers the tagged K rows, restores
  // them and writes every row with a slot. Two steps (fresh prefills, then
  // decodes and a chunked-prefill continuation); afterwards each rank's local
  // sequence, interleaved by ownership, must be every request's full sequence.
  for (int32_t wp : {2, 3}) {
    for (int32_t wd : {1, 2}) {
      for (int32_t il : {1, 2, 4}) {
        const int32_t w = wp * wd, bs = 4, nreq = 4;
        const std::vector<std::vector<int32_t>> step_q = {{1, 6, 13, 9}, {1, 2, 1, 11}};
        const int32_t stride = 40 / (bs * w) + 1;
        std::vector<int32_t> table(nreq * stride);
        for (int32_t i = 0; i < nreq * stride; ++i) table[i] = i;  // distinct blocks
        std::vector<std::vector<int32_t>> cache(w, std::vector<int32_t>(nreq * stride * bs, -1));
        std::vector<int32_t> lens(nreq, 0);
        for (std::size_t step = 0; step < step_q.size(); ++step) {
          const std::vector<int32_t>& q = step_q[step];
          // Step 1: all fresh prefills; step 2: requests 0-2 decode (1-2 tokens), request 3 continues.
          const Split sp{q, step == 0 ? 0 : 3, wp};
          std::vector<int32_t> qsl = {0};
          for (int32_t x : q) qsl.push_back(qsl.back() + x);
          for (int32_t r = 0; r < nreq; ++r) lens[r] += q[r];
          SlotMappingInputs in;
          in.query_start_loc = qsl;
          in.seq_lens = lens;
          in.block_table = table;
          in.block_table_stride = stride;
          in.block_size = bs;
          in.num_blocks = nreq * stride;
          const std::vector<Tag> g = gather(sp);
          const std::vector<int32_t> rs = restore(sp);
          for (int32_t rp = 0; rp < wp; ++rp) {
            for (int32_t rd = 0; rd < wd; ++rd) {
              const int32_t rank = rp * wd + rd;
              std::vector<int32_t> tok(qsl.back()), padded(rs.size());
              compute_dcp_slot_mapping(in, {w, rank, il}, tok);
              pcp_padded_slot_mapping(sp.in(), tok, padded);
              for (std::size_t k = 0; k < rs.size(); ++k) {
                if (padded[k] < 0) continue;
                const Tag& t = g[rs[k]];
                const int32_t req = std::get<0>(t);
                cache[rank][padded[k]] = req * 1000 + lens[req] - q[req] + std::get<1>(t);
              }
            }
          }
        }
        for (int32_t r = 0; r < nreq; ++r) {
          std::vector<std::size_t> next(w, 0);
          for (int32_t x = 0; x < lens[r]; ++x) {
            const int32_t k = dcp_owner(x, w, il);
            const std::size_t li = next[k]++;
            ASSERT_EQ(cache[k][table[r * stride + li / bs] * bs + li % bs], r * 1000 + x)
                << "Wp=" << wp << " Wd=" << wd << " I=" << il << " req " << r << " x=" << x;
          }
          for (int32_t k = 0; k < w; ++k) ASSERT_EQ(next[k], static_cast<std::size_t>(dcp_local_len(lens[r], w, il, k)));
        }
      }
    }
  }
}

TEST(PlanPcpSplit, ErrorsLeaveOutputsUntouched) {
  const Split good{{1, 5, 8}, 1, 2};
  std::vector<int32_t> lens(3, 7), pos(9, 7);
  EXPECT_INVALID(pcp_local_tokens(good.in(), 2, lens, pos), "rank=2 is out of range [0, pcp_size=2)");
  EXPECT_INVALID(pcp_local_tokens(good.in(), 0, Span<int32_t>(lens.data(), 2), pos), "local_lens_out has room for 2");
  EXPECT_INVALID(pcp_local_tokens(good.in(), 0, lens, Span<int32_t>(pos.data(), 8)), "positions_out has room for 8");
  EXPECT_EQ(lens, std::vector<int32_t>(3, 7));
  EXPECT_EQ(pos, std::vector<int32_t>(9, 7));
  EXPECT_INVALID(pcp_split_sizes({good.q, 4, 2}), "num_decodes=4 is out of range [0, 3]");
  EXPECT_INVALID(pcp_split_sizes({good.q, -1, 2}), "num_decodes=-1");
  EXPECT_INVALID(pcp_split_sizes({good.q, 1, 0}), "pcp_size=0 must be >= 1");
  const std::vector<int32_t> neg = {1, -5};
  EXPECT_INVALID(pcp_split_sizes({neg, 1, 2}), "query_lens[1]=-5 is negative");
  std::vector<int32_t> r17(17, 3);
  EXPECT_INVALID(pcp_restore_index(good.in(), r17), "restore_out has room for 17 entries, needs 18");
  EXPECT_EQ(r17, std::vector<int32_t>(17, 3));
  std::vector<uint8_t> m17(17, 3);
  EXPECT_INVALID(pcp_unpad_mask(good.in(), m17), "mask_out has room for 17");
  EXPECT_EQ(m17, std::vector<uint8_t>(17, 3));
  std::vector<int32_t> a(16, 1), b(15, 1);
  EXPECT_INVALID(pcp_chunk_restore_index(good.in(), a, b), "inverse_out has room for 15 entries, needs 16");
  EXPECT_EQ(a, std::vector<int32_t>(16, 1));
  std::vector<int32_t> p2(2, 0);
  EXPECT_INVALID(pcp_pad_counts(good.in(), p2), "pads_out has room for 2");

  HeadTail h = head_tail(good, 1);
  std::vector<int32_t> short_tnm(h.tnm.size() - 1, 4);
  const std::vector<int32_t> qh_before = h.qh;
  std::fill(h.qh.begin(), h.qh.end(), 4);
  EXPECT_INVALID(pcp_head_tail_indices(good.in(), 1,
                                       {h.qh, h.qt, h.hnm, h.hm, short_tnm, h.tm, h.qfull, h.mask_ends, h.head_ends,
                                        h.tail_ends}),
                 "kv_tail_nomask_idx has room for");
  EXPECT_EQ(h.qh, std::vector<int32_t>(qh_before.size(), 4));
  EXPECT_INVALID(pcp_head_tail_counts(good.in(), -1), "rank=-1 is out of range");
}
