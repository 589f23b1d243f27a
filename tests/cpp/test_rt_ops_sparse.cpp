// The sparse-attention operators (issue 10) through their wrappers, for both
// libraries (torch_npu and vllm-ascend's _C_ascend), against float64 references
// written here independently of the twins: the lightning indexer (scores,
// top-k, the tie rule, -1 tails, rows with nothing visible, several requests
// with context, shuffled block tables; its int8 form), sparse flash attention
// over explicit index sets (the scan rule: first -1 stops, entries beyond the
// threshold skipped, duplicates twice, empty sets, sparse_block_size > 1, LSE),
// the KV-quant form over packed 656-byte rows, and the row pack/unpack helpers.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstring>
#include <set>
#include <limits>

#include "ascend_attn_rt/errors.h"
#include "ascend_attn_rt/ops/lightning_indexer.h"
#include "ascend_attn_rt/ops/sfa_c8_rows.h"
#include "ascend_attn_rt/ops/sparse_flash_attention.h"
#include "test_rt_ops_util.h"

namespace ops = aar::ops;
using namespace aar_test;
using ops::OpLibrary;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr OpLibrary kLibs[] = {OpLibrary::TorchNpu, OpLibrary::VllmAscend};

at::Tensor i32(const std::vector<int64_t>& v) {
  std::vector<int32_t> w(v.begin(), v.end());
  return at::tensor(w, at::kInt);
}

// A TND batch: per-request query lengths and KV lengths.
struct Batch {
  std::vector<int64_t> q_lens, kv_lens;
  int64_t tokens() const { return std::accumulate(q_lens.begin(), q_lens.end(), int64_t{0}); }
  int64_t start(size_t b) const { return std::accumulate(q_lens.begin(), q_lens.begin() + b, int64_t{0}); }
  at::Tensor cu() const { return i32(cumsum(q_lens)); }
  at::Tensor kv() const { return i32(kv_lens); }
};

// Rows (S_b, W) per request in a paged (nb, bs, 1, W) cache at shuffled blocks.
PagedKv page(const std::vector<at::Tensor>& rows, int64_t bs, uint32_t seed) {
  std::vector<at::Tensor> r3;
  for (const auto& r : rows) r3.push_back(r.unsqueeze(1));
  return make_paged(r3, r3, bs, seed);
}

// ---------------------------------------------------------------- indexer reference

// Visible keys of row i (docs/design/sparse.md §4): mode 3 right-down causal, mode 0 all.
int64_t ref_visible(int64_t mode, int64_t s, int64_t q, int64_t i) { return mode == 3 ? s - q + i + 1 : s; }

// score(t, s) = sum_h w[t,h] * relu(q[t,h] . k[s]) in float64, for s < vis.
std::vector<double> ref_scores(const at::Tensor& q /*(H, D)*/, const at::Tensor& w /*(H)*/, const at::Tensor& k /*(S, D)*/,
                               int64_t vis) {
  const at::Tensor qd = q.to(at::kDouble).contiguous(), wd = w.to(at::kDouble).contiguous(),
                   kd = k.to(at::kDouble).contiguous();
  const auto qa = qd.accessor<double, 2>();
  const auto wa = wd.accessor<double, 1>();
  const auto ka = kd.accessor<double, 2>();
  std::vector<double> out(std::max<int64_t>(vis, 0), 0.0);
  for (int64_t s = 0; s < vis; ++s) {
    for (int64_t h = 0; h < qd.size(0); ++h) {
      double dot = 0;
      for (int64_t d = 0; d < qd.size(1); ++d) dot += qa[h][d] * ka[s][d];
      out[s] += wa[h] * std::max(0.0, dot);
    }
  }
  return out;
}

// Top min(K, vis) positions by descending score, ties by ascending position, then -1.
std::vector<int32_t> ref_top_k(const std::vector<double>& score, int64_t k) {
  std::vector<int32_t> pos(score.size());
  std::iota(pos.begin(), pos.end(), 0);
  std::stable_sort(pos.begin(), pos.end(), [&](int32_t a, int32_t b) { return score[a] > score[b]; });
  std::vector<int32_t> out(k, -1);
  for (int64_t j = 0; j < std::min<int64_t>(k, pos.size()); ++j) out[j] = pos[j];
  return out;
}

struct IndexerData {
  Batch batch;
  at::Tensor query, weights;  // (T, H, D), (T, H)
  std::vector<at::Tensor> keys;  // (S_b, D)
  PagedKv paged;
  ops::LightningIndexerArgs args;
};

// Integer-valued data make every fp32 sum exact, so the twin's scores equal the
// float64 reference's exactly, ties included (which the tie rule then orders).
IndexerData make_indexer(const Batch& batch, int64_t heads, int64_t dim, int64_t bs, int64_t k, int64_t mode,
                         at::ScalarType dtype, bool integers, uint32_t seed) {
  at::manual_seed(seed);
  IndexerData d;
  d.batch = batch;
  const int64_t t = batch.tokens();
  auto gen = [&](std::vector<int64_t> shape) {
    return integers ? at::randint(-2, 3, shape).to(at::kFloat) : at::randn(shape);
  };
  d.query = gen({t, heads, dim}).to(dtype);
  d.weights = gen({t, heads}).to(dtype);
  for (int64_t s : batch.kv_lens) d.keys.push_back(gen({s, dim}).to(dtype));
  d.paged = page(d.keys, bs, seed + 1);
  d.args.query = d.query;
  d.args.key = d.paged.key_cache;
  d.args.weights = d.weights;
  d.args.actual_seq_lengths_query = batch.cu();
  d.args.actual_seq_lengths_key = batch.kv();
  d.args.block_table = d.paged.block_table;
  d.args.sparse_count = k;
  d.args.sparse_mode = mode;
  return d;
}

// Mixed batch: a decode, a chunked prefill over context, a request whose
// first rows see nothing (S < q), and one with fewer visible keys than K.
Batch indexer_batch() { return Batch{{1, 4, 3, 2}, {21, 12, 2, 5}}; }

void check_indexer_exact(const IndexerData& d, const at::Tensor& idx, int64_t k, int64_t mode) {
  ASSERT_EQ(idx.scalar_type(), at::kInt);
  ASSERT_EQ(idx.sizes(), (c10::IntArrayRef{d.batch.tokens(), 1, k}));
  int64_t all_minus_one = 0, tails = 0;
  for (size_t b = 0; b < d.batch.q_lens.size(); ++b) {
    const int64_t q = d.batch.q_lens[b], s = d.batch.kv_lens[b];
    for (int64_t i = 0; i < q; ++i) {
      const int64_t t = d.batch.start(b) + i;
      const int64_t vis = ref_visible(mode, s, q, i);
      const auto want = ref_top_k(ref_scores(d.query[t], d.weights[t], d.keys[b], vis), k);
      const at::Tensor row = idx[t][0].contiguous();
      const std::vector<int32_t> got(row.data_ptr<int32_t>(), row.data_ptr<int32_t>() + k);
      EXPECT_EQ(got, want) << "request " << b << " row " << i << " (vis " << vis << ")";
      all_minus_one += vis <= 0;
      tails += vis > 0 && vis < k;
    }
  }
  if (mode == 3) EXPECT_GT(all_minus_one, 0) << "the batch should have a row that sees nothing";
  EXPECT_GT(tails, 0) << "the batch should have a row with a -1 tail";
}

}  // namespace

TEST(RtOpsSparse, IndexerTopKEqualsReferenceOnExactScoresIncludingTies) {
  for (const auto dtype : {at::kFloat, at::kBFloat16}) {
    for (const int64_t mode : {3, 0}) {
      const int64_t k = 8;
      const IndexerData d = make_indexer(indexer_batch(), 4, 8, 4, k, mode, dtype, /*integers=*/true, 11);
      for (const OpLibrary lib : kLibs) {
        const auto [idx, values] = ops::lightning_indexer(d.args, lib);
        check_indexer_exact(d, idx, k, mode);
        EXPECT_EQ(values.numel(), 0);
      }
    }
  }
}

TEST(RtOpsSparse, IndexerTieRuleIsAscendingPosition) {
  // All keys equal: every visible score ties, so the selection is 0, 1, 2, ...
  Batch batch{{2}, {6}};
  IndexerData d = make_indexer(batch, 2, 4, 4, 4, 3, at::kFloat, true, 3);
  d.keys[0] = at::ones({6, 4});
  d.paged = page(d.keys, 4, 5);
  d.args.key = d.paged.key_cache;
  d.args.block_table = d.paged.block_table;
  d.args.query = at::ones({2, 2, 4});
  d.args.weights = at::ones({2, 2});
  const at::Tensor idx = std::get<0>(ops::lightning_indexer(d.args, OpLibrary::TorchNpu));
  EXPECT_TRUE(at::equal(idx[0][0], i32({0, 1, 2, 3})));  // row 0 sees 5 keys: the first 4
  EXPECT_TRUE(at::equal(idx[1][0], i32({0, 1, 2, 3})));  // row 1 sees 6
}

TEST(RtOpsSparse, IndexerOnFloatDataSelectsTheReferenceScores) {
  // Random data: fp32 and float64 scores differ in the last bits, so compare
  // the score of each selected position with the reference's j-th best.
  for (const auto dtype : {at::kFloat, at::kBFloat16}) {
    const int64_t k = 6;
    Batch batch{{3, 1, 5}, {40, 17, 9}};
    IndexerData d = make_indexer(batch, 4, 16, 8, k, 3, dtype, false, 21);
    d.args.return_value = true;
    for (const OpLibrary lib : kLibs) {
      const auto [idx, values] = ops::lightning_indexer(d.args, lib);
      ASSERT_EQ(values.sizes(), idx.sizes());
      ASSERT_EQ(values.scalar_type(), at::kFloat);
      for (size_t b = 0; b < batch.q_lens.size(); ++b) {
        const int64_t q = batch.q_lens[b], s = batch.kv_lens[b];
        for (int64_t i = 0; i < q; ++i) {
          const int64_t t = batch.start(b) + i;
          const int64_t vis = ref_visible(3, s, q, i);
          const auto score = ref_scores(d.query[t], d.weights[t], d.keys[b], vis);
          std::vector<double> sorted = score;
          std::sort(sorted.rbegin(), sorted.rend());
          std::set<int32_t> seen;
          for (int64_t j = 0; j < k; ++j) {
            const int32_t p = idx[t][0][j].item<int32_t>();
            const float v = values[t][0][j].item<float>();
            if (j >= vis) {
              EXPECT_EQ(p, -1);
              EXPECT_EQ(v, -std::numeric_limits<float>::infinity());
              continue;
            }
            ASSERT_GE(p, 0);
            ASSERT_LT(p, vis);
            EXPECT_TRUE(seen.insert(p).second) << "duplicate position " << p;
            EXPECT_NEAR(score[p], sorted[j], 1e-4 * (1 + std::abs(sorted[j])));
            EXPECT_NEAR(v, score[p], 1e-4 * (1 + std::abs(score[p])));
          }
        }
      }
    }
  }
}

namespace {

// Symmetric int8 quantisation written here: scale = amax / 127, q = nearbyint(x / scale).
std::pair<at::Tensor, at::Tensor> quantise_rows(const at::Tensor& x /*(..., D) float*/) {
  const at::Tensor xd = x.to(at::kDouble);
  at::Tensor scale = xd.abs().amax(-1, true) / 127.0;
  at::Tensor q = (xd / scale.clamp_min(1e-300)).round().clamp(-127, 127).to(at::kChar);
  return {q, scale.squeeze(-1).to(at::kFloat)};
}

}  // namespace

TEST(RtOpsSparse, QuantIndexerMatchesDequantisedReference) {
  Batch batch{{2, 3}, {30, 14}};
  const int64_t heads = 4, dim = 32, bs = 8, k = 8;
  at::manual_seed(5);
  const int64_t t = batch.tokens();
  const at::Tensor qf = at::randn({t, heads, dim});
  std::vector<at::Tensor> kf;
  for (int64_t s : batch.kv_lens) kf.push_back(at::randn({s, dim}));
  const at::Tensor w = at::randn({t, heads}).to(at::kHalf);
  const auto [qq, qs] = quantise_rows(qf);  // (T, H, D) int8, (T, H)
  std::vector<at::Tensor> kq, ks;
  for (const auto& x : kf) {
    auto [a, b] = quantise_rows(x);
    kq.push_back(a);
    ks.push_back(b.unsqueeze(1));  // (S, 1)
  }
  const PagedKv pk = page(kq, bs, 7);
  // The scale cache shares the block ids: build it from the same block table.
  at::Tensor ks_cache = at::rand({pk.key_cache.size(0), bs, 1});
  const auto bt = pk.block_table.accessor<int32_t, 2>();
  for (size_t b = 0; b < ks.size(); ++b) {
    for (int64_t s = 0; s < batch.kv_lens[b]; ++s) ks_cache[bt[b][s / bs]][s % bs][0] = ks[b][s][0];
  }
  for (const auto scale_dtype : {at::kHalf, at::kFloat}) {
    ops::QuantLightningIndexerArgs a;
    a.base.query = qq;
    a.base.key = pk.key_cache;
    a.base.weights = w;
    a.base.actual_seq_lengths_query = batch.cu();
    a.base.actual_seq_lengths_key = batch.kv();
    a.base.block_table = pk.block_table;
    a.base.sparse_count = k;
    a.query_dequant_scale = qs.to(scale_dtype);
    a.key_dequant_scale = ks_cache.to(scale_dtype);
    for (const OpLibrary lib : kLibs) {
      const at::Tensor idx = ops::quant_lightning_indexer(a, lib);
      ASSERT_EQ(idx.sizes(), (c10::IntArrayRef{t, 1, k}));
      int64_t overlap = 0, total = 0;
      for (size_t b = 0; b < batch.q_lens.size(); ++b) {
        const int64_t q = batch.q_lens[b], s = batch.kv_lens[b];
        // Dequantised operands (with the scales as the operator sees them), and the unquantised ones.
        const at::Tensor kdeq = kq[b].to(at::kDouble) * ks[b].to(scale_dtype).to(at::kDouble);
        for (int64_t i = 0; i < q; ++i) {
          const int64_t r = batch.start(b) + i;
          const int64_t vis = ref_visible(3, s, q, i);
          const at::Tensor qdeq = qq[r].to(at::kDouble) * qs[r].to(scale_dtype).to(at::kDouble).unsqueeze(1);
          const auto score = ref_scores(qdeq, w[r], kdeq, vis);
          std::vector<double> sorted = score;
          std::sort(sorted.rbegin(), sorted.rend());
          const auto exact = ref_top_k(ref_scores(qf[r], w[r], kf[b], vis), k);
          for (int64_t j = 0; j < k; ++j) {
            const int32_t p = idx[r][0][j].item<int32_t>();
            if (j >= vis) {
              EXPECT_EQ(p, -1);
              continue;
            }
            ASSERT_GE(p, 0);
            ASSERT_LT(p, vis);
            EXPECT_NEAR(score[p], sorted[j], 1e-4 * (1 + std::abs(sorted[j])))
                << "request " << b << " row " << i << " slot " << j;
            overlap += std::count(exact.begin(), exact.end(), p);
            ++total;
          }
        }
      }
      // Within quantisation error of the unquantised selection.
      EXPECT_GE(overlap, total * 8 / 10) << "only " << overlap << " of " << total << " match the float selection";
    }
  }
}

TEST(RtOpsSparse, QuantIndexerExactOnIntegerScores) {
  // Unit scales and small integers: the dequantised scores are exact integers.
  Batch batch{{1, 3}, {9, 5}};
  const int64_t k = 4;
  at::manual_seed(9);
  const int64_t t = batch.tokens();
  const at::Tensor q = at::randint(-3, 4, {t, 2, 8}).to(at::kChar);
  std::vector<at::Tensor> keys;
  for (int64_t s : batch.kv_lens) keys.push_back(at::randint(-3, 4, {s, 8}).to(at::kChar));
  const PagedKv pk = page(keys, 4, 3);
  const at::Tensor w = at::randint(-2, 3, {t, 2}).to(at::kHalf);
  ops::QuantLightningIndexerArgs a;
  a.base.query = q;
  a.base.key = pk.key_cache;
  a.base.weights = w;
  a.base.actual_seq_lengths_query = batch.cu();
  a.base.actual_seq_lengths_key = batch.kv();
  a.base.block_table = pk.block_table;
  a.base.sparse_count = k;
  a.query_dequant_scale = at::ones({t, 2}, at::kHalf);
  a.key_dequant_scale = at::ones({pk.key_cache.size(0), 4, 1}, at::kHalf);
  for (const OpLibrary lib : kLibs) {
    const at::Tensor idx = ops::quant_lightning_indexer(a, lib);
    for (size_t b = 0; b < 2; ++b) {
      for (int64_t i = 0; i < batch.q_lens[b]; ++i) {
        const int64_t r = batch.start(b) + i;
        const auto want = ref_top_k(
            ref_scores(q[r], w[r], keys[b], ref_visible(3, batch.kv_lens[b], batch.q_lens[b], i)), k);
        const at::Tensor row = idx[r][0].contiguous();
        EXPECT_EQ(std::vector<int32_t>(row.data_ptr<int32_t>(), row.data_ptr<int32_t>() + k), want);
      }
    }
  }
}

// ---------------------------------------------------------------- SFA reference

namespace {

// The scan rule of docs/design/sparse.md §5, written out plainly: threshold, valid_count,
// stop at the first -1, skip entries at or beyond the threshold, expand blocks.
std::vector<int64_t> ref_tokens(const std::vector<int64_t>& row, int64_t th, int64_t sbs) {
  std::vector<int64_t> toks;
  if (th <= 0) return toks;
  const int64_t valid = std::min<int64_t>(row.size(), (th + sbs - 1) / sbs);
  for (int64_t j = 0; j < valid; ++j) {
    if (row[j] == -1) break;
    const int64_t first = row[j] * sbs;
    if (first >= th) continue;
    for (int64_t p = first; p < std::min(first + sbs, th); ++p) toks.push_back(p);
  }
  return toks;
}

struct RefRow {
  at::Tensor out;            // (N, Dv) double
  std::vector<double> lse;   // per head, -inf when empty
};

// Attention of one query token over an explicit token list (duplicates count),
// float64: logits = scale * (q . k + qr . kr), V = v rows.
RefRow ref_attend(const at::Tensor& q /*(N, D)*/, const at::Tensor& qr /*(N, R) or undefined*/,
                  const at::Tensor& k /*(S, D)*/, const at::Tensor& kr, const at::Tensor& v /*(S, Dv)*/,
                  const std::vector<int64_t>& toks, double scale) {
  const int64_t n = q.size(0), dv = v.size(1);
  RefRow r{at::zeros({n, dv}, at::kDouble), std::vector<double>(n, -kInf)};
  if (toks.empty()) return r;
  const at::Tensor sel = at::tensor(toks, at::kLong);
  at::Tensor logits = at::matmul(q.to(at::kDouble), k.to(at::kDouble).index_select(0, sel).t());
  if (qr.defined()) logits += at::matmul(qr.to(at::kDouble), kr.to(at::kDouble).index_select(0, sel).t());
  logits *= scale;
  const at::Tensor vs = v.to(at::kDouble).index_select(0, sel);
  for (int64_t h = 0; h < n; ++h) {
    const double m = logits[h].max().item<double>();
    const at::Tensor e = at::exp(logits[h] - m);
    const double z = e.sum().item<double>();
    r.out[h] = at::matmul(e, vs) / z;
    r.lse[h] = m + std::log(z);
  }
  return r;
}

struct SfaData {
  Batch batch;
  at::Tensor q, qr;                       // (T, N, D), (T, N, R)
  std::vector<at::Tensor> k, kr;          // (S_b, D), (S_b, R)
  PagedKv pk, pr;
  at::Tensor indices;                     // (T, 1, K)
  ops::SparseFlashAttentionArgs args;
};

SfaData make_sfa(const Batch& batch, int64_t n, int64_t d, int64_t r, int64_t bs, at::ScalarType dtype,
                 uint32_t seed) {
  at::manual_seed(seed);
  SfaData x;
  x.batch = batch;
  const int64_t t = batch.tokens();
  x.q = at::randn({t, n, d}).to(dtype);
  x.qr = at::randn({t, n, r}).to(dtype);
  for (int64_t s : batch.kv_lens) {
    x.k.push_back(at::randn({s, d}).to(dtype));
    x.kr.push_back(at::randn({s, r}).to(dtype));
  }
  x.pk = page(x.k, bs, seed + 1);
  x.pr = page(x.kr, bs, seed + 1);  // same seed: the same block ids
  EXPECT_TRUE(at::equal(x.pk.block_table, x.pr.block_table));
  x.args.query = x.q;
  x.args.key = x.pk.key_cache;
  x.args.query_rope = x.qr;
  x.args.key_rope = x.pr.key_cache;
  x.args.block_table = x.pk.block_table;
  x.args.actual_seq_lengths_query = batch.cu();
  x.args.actual_seq_lengths_kv = batch.kv();
  x.args.scale_value = 1.0 / std::sqrt(static_cast<double>(d + r));
  return x;
}

std::vector<int64_t> row_of(const at::Tensor& indices, int64_t t) {
  const at::Tensor r = indices[t][0].to(at::kLong).contiguous();
  return std::vector<int64_t>(r.data_ptr<int64_t>(), r.data_ptr<int64_t>() + r.numel());
}

// Checks (out, max, sum) against the float64 reference over ref_tokens.
void check_sfa(const SfaData& x, const std::tuple<at::Tensor, at::Tensor, at::Tensor>& got, int64_t mode, int64_t sbs,
               bool lse, double tol, bool with_rope = true) {
  const auto& [out, smax, ssum] = got;
  const int64_t t = x.batch.tokens(), n = x.q.size(1), dv = x.k[0].size(1);
  ASSERT_EQ(out.sizes(), (c10::IntArrayRef{t, n, dv}));
  EXPECT_EQ(out.scalar_type(), x.q.scalar_type());
  if (lse) {
    ASSERT_EQ(smax.sizes(), (c10::IntArrayRef{1, t, n}));
    ASSERT_EQ(ssum.sizes(), (c10::IntArrayRef{1, t, n}));
    EXPECT_EQ(smax.scalar_type(), at::kFloat);
  } else {
    EXPECT_EQ(smax.numel(), 0);
    EXPECT_EQ(ssum.numel(), 0);
  }
  for (size_t b = 0; b < x.batch.q_lens.size(); ++b) {
    const int64_t q = x.batch.q_lens[b], s = x.batch.kv_lens[b];
    for (int64_t i = 0; i < q; ++i) {
      const int64_t tt = x.batch.start(b) + i;
      const int64_t th = mode == 3 ? s - q + i + 1 : s;
      const auto toks = ref_tokens(row_of(x.indices, tt), th, sbs);
      const RefRow ref = ref_attend(x.q[tt], with_rope ? x.qr[tt] : at::Tensor(), x.k[b], x.kr[b], x.k[b], toks,
                                    x.args.scale_value);
      expect_close(out[tt], ref.out, tol, "out row " + std::to_string(tt));
      if (lse) {
        const at::Tensor l = smax[0][tt].to(at::kDouble) + at::log(ssum[0][tt].to(at::kDouble));
        expect_close(l, at::tensor(ref.lse, at::kDouble), 1e-5, "lse row " + std::to_string(tt));
      }
    }
  }
}

}  // namespace

TEST(RtOpsSparse, SfaScanRuleOnExplicitIndexSets) {
  // One request, q = 4 rows over S = 10 (context 6): thresholds 7, 8, 9, 10.
  Batch batch{{4}, {10}};
  for (const auto dtype : {at::kFloat, at::kBFloat16}) {
    SfaData x = make_sfa(batch, 4, 32, 8, 4, dtype, 17);
    x.indices = at::tensor(std::vector<int32_t>{
                               3, 8, 3, -1, 5, 1,   // row 0 (Th 7): 3, skip 8, 3 again, stop: {3, 3}
                               -1, 0, 1, 2, 3, 4,   // row 1: -1 first: empty -> 0 row
                               0, 2, 4, 6, 8, 9,    // row 2 (Th 9): 9 >= 9 skipped: {0,2,4,6,8}
                               9, 9, 0, 12, 1, 5},  // row 3 (Th 10): {9, 9, 0, 1, 5}
                           at::kInt)
                    .view({4, 1, 6});
    x.args.sparse_indices = x.indices;
    x.args.return_softmax_lse = true;
    for (const OpLibrary lib : kLibs) {
      const auto got = ops::sparse_flash_attention(x.args, lib);
      check_sfa(x, got, 3, 1, true, tol_for(dtype));
      // The empty row: out 0, max -inf, sum 0.
      EXPECT_EQ(std::get<0>(got)[1].abs().max().item<double>(), 0.0);
      EXPECT_TRUE(at::all(std::get<1>(got)[0][1] == -std::numeric_limits<float>::infinity()).item<bool>());
      EXPECT_TRUE(at::all(std::get<2>(got)[0][1] == 0).item<bool>());
      // Duplicates count twice: row 0 over {3, 3} equals row 0 over {3} only in output (a softmax of
      // two equal logits), so check the sum instead: exp(0) twice.
      EXPECT_NEAR(std::get<2>(got)[0][0][0].item<float>(), 2.0f, 1e-6);
    }
  }
}

TEST(RtOpsSparse, SfaValidCountLimitsTheScan) {
  // Row 0 of q = 3 over S = 3 has Th = 1: valid_count = min(K, 1) = 1, so only
  // the first entry is read even though a later one (0) would be in range.
  Batch batch{{3}, {3}};
  SfaData x = make_sfa(batch, 2, 16, 4, 2, at::kFloat, 23);
  x.indices = at::tensor(std::vector<int32_t>{2, 0, 1, 1, 2, 0, 0, 1, 2}, at::kInt).view({3, 1, 3});
  x.args.sparse_indices = x.indices;
  const auto got = ops::sparse_flash_attention(x.args, OpLibrary::TorchNpu);
  check_sfa(x, got, 3, 1, false, 1e-5);
  EXPECT_EQ(std::get<0>(got)[0].abs().max().item<double>(), 0.0);  // entry 2 >= Th 1, nothing else read
}

TEST(RtOpsSparse, SfaSparseBlockSizeAboveOne) {
  Batch batch{{2, 1}, {10, 7}};
  for (const int64_t sbs : {2, 4}) {
    SfaData x = make_sfa(batch, 2, 16, 4, 4, at::kFloat, 31);
    // Request 0 rows: Th 9, 10; request 1: Th 7 (mode 3).
    x.indices = at::tensor(std::vector<int32_t>{2, 0, 3, -1, 1, 2, 2, 0, 9, 1, 1, 0}, at::kInt).view({3, 1, 4});
    x.args.sparse_indices = x.indices;
    x.args.sparse_block_size = sbs;
    x.args.return_softmax_lse = true;
    for (const OpLibrary lib : kLibs) check_sfa(x, ops::sparse_flash_attention(x.args, lib), 3, sbs, true, 1e-5);
  }
}

TEST(RtOpsSparse, SfaRandomBatchesBothModesAndDtypes) {
  Batch batch{{1, 5, 3, 1}, {37, 20, 3, 1}};
  for (const auto dtype : {at::kFloat, at::kBFloat16}) {
    for (const int64_t mode : {3, 0}) {
      SfaData x = make_sfa(batch, 8, 64, 16, 8, dtype, 41);
      const int64_t k = 12;
      std::mt19937 rng(7);
      std::vector<int32_t> all;
      for (size_t b = 0; b < batch.q_lens.size(); ++b) {
        for (int64_t i = 0; i < batch.q_lens[b]; ++i) {
          // Valid-looking positions first (some beyond the threshold, some repeated), then -1.
          const int64_t n_valid = std::uniform_int_distribution<int64_t>(0, k)(rng);
          for (int64_t j = 0; j < k; ++j) {
            all.push_back(j < n_valid ? std::uniform_int_distribution<int32_t>(0, batch.kv_lens[b])(rng) : -1);
          }
        }
      }
      x.indices = at::tensor(all, at::kInt).view({batch.tokens(), 1, k});
      x.args.sparse_indices = x.indices;
      x.args.sparse_mode = mode;
      x.args.return_softmax_lse = true;
      for (const OpLibrary lib : kLibs) check_sfa(x, ops::sparse_flash_attention(x.args, lib), mode, 1, true,
                                                  tol_for(dtype));
      x.args.return_softmax_lse = false;
      check_sfa(x, ops::sparse_flash_attention(x.args, OpLibrary::VllmAscend), mode, 1, false, tol_for(dtype));
    }
  }
}

TEST(RtOpsSparse, SfaWithoutRopeAndWithSeparateValue) {
  Batch batch{{2}, {6}};
  SfaData x = make_sfa(batch, 2, 16, 4, 4, at::kFloat, 43);
  x.indices = at::tensor(std::vector<int32_t>{0, 4, 2, 1, 5, 3}, at::kInt).view({2, 1, 3});
  x.args.sparse_indices = x.indices;
  x.args.query_rope.reset();
  x.args.key_rope.reset();
  check_sfa(x, ops::sparse_flash_attention(x.args, OpLibrary::TorchNpu), 3, 1, false, 1e-5, /*with_rope=*/false);
  // An explicit value equal to the key gives the same result.
  x.args.value = x.args.key.clone();
  check_sfa(x, ops::sparse_flash_attention(x.args, OpLibrary::VllmAscend), 3, 1, false, 1e-5, false);
}

TEST(RtOpsSparse, IndexerAndSfaReadCachesThatAreStridedViews) {
  // Caches owned by the caller may be views (here a column slice of wider rows): read through them.
  const IndexerData d = make_indexer(indexer_batch(), 4, 8, 4, 8, 3, at::kFloat, true, 11);
  const at::Tensor wide = at::randn({d.paged.key_cache.size(0), 4, 1, 12});
  at::Tensor view = wide.narrow(3, 2, 8);
  view.copy_(d.paged.key_cache);
  ASSERT_FALSE(view.is_contiguous());
  ops::LightningIndexerArgs a = d.args;
  a.key = view;
  check_indexer_exact(d, std::get<0>(ops::lightning_indexer(a, OpLibrary::TorchNpu)), 8, 3);

  Batch batch{{2}, {6}};
  SfaData x = make_sfa(batch, 2, 16, 4, 4, at::kFloat, 43);
  x.indices = at::tensor(std::vector<int32_t>{0, 4, 2, 1, 5, 3}, at::kInt).view({2, 1, 3});
  x.args.sparse_indices = x.indices;
  const at::Tensor kw = at::randn({x.pk.key_cache.size(0), 4, 1, 20});
  at::Tensor kv = kw.narrow(3, 4, 16);
  kv.copy_(x.pk.key_cache);
  x.args.key = kv;
  check_sfa(x, ops::sparse_flash_attention(x.args, OpLibrary::VllmAscend), 3, 1, false, 1e-5);
}

// ---------------------------------------------------------------- SFA C8 rows

namespace {

// 656-byte rows packed here, byte by byte: per 128-column tile scale = amax/127
// (fp32), q = nearbyint(x / scale); then the rope bytes and the scale bytes.
at::Tensor test_pack(const at::Tensor& nope /*(M, 512) float*/, const at::Tensor& rope /*(M, 64) 2-byte*/) {
  const int64_t m = nope.size(0);
  at::Tensor rows = at::zeros({m, 656}, at::kChar);
  const at::Tensor x = nope.to(at::kFloat).contiguous();
  const at::Tensor rc = rope.contiguous();
  for (int64_t r = 0; r < m; ++r) {
    int8_t* out = rows[r].data_ptr<int8_t>();
    const float* xr = x[r].data_ptr<float>();
    float scales[4];
    for (int tile = 0; tile < 4; ++tile) {
      float amax = 0;
      for (int d = 0; d < 128; ++d) amax = std::max(amax, std::fabs(xr[tile * 128 + d]));
      scales[tile] = amax / 127.0f;
      for (int d = 0; d < 128; ++d) {
        const float v = scales[tile] == 0 ? 0.0f : std::nearbyint(xr[tile * 128 + d] / scales[tile]);
        out[tile * 128 + d] = static_cast<int8_t>(std::max(-127.0f, std::min(127.0f, v)));
      }
    }
    std::memcpy(out + 512, static_cast<const char*>(rc.data_ptr()) + r * 128, 128);
    std::memcpy(out + 640, scales, 16);
  }
  return rows;
}

// Dequantised (M, 512) float64 and rope (M, 64) float64 read back from the bytes here.
std::pair<at::Tensor, at::Tensor> test_unpack(const at::Tensor& rows, at::ScalarType rope_dtype) {
  const int64_t m = rows.size(0);
  at::Tensor nope = at::zeros({m, 512}, at::kDouble);
  at::Tensor rope = at::zeros({m, 64}, rope_dtype);
  const at::Tensor rc = rows.contiguous();
  for (int64_t r = 0; r < m; ++r) {
    const int8_t* in = rc[r].data_ptr<int8_t>();
    float scales[4];
    std::memcpy(scales, in + 640, 16);
    for (int d = 0; d < 512; ++d) nope[r][d] = static_cast<double>(in[d]) * scales[d / 128];
    std::memcpy(rope[r].data_ptr(), in + 512, 128);
  }
  return {nope, rope.to(at::kDouble)};
}

}  // namespace

TEST(RtOpsSparse, C8RowPackUnpackRoundTrip) {
  at::manual_seed(3);
  for (const auto rope_dtype : {at::kBFloat16, at::kHalf}) {
    at::Tensor nope = at::randn({5, 512}) * at::rand({5, 1}) * 4;
    nope[2].narrow(0, 128, 128).zero_();  // an all-zero tile: scale 0, q 0
    nope[3][7] = 127.0f * 3;              // amax tile: that element quantises to 127
    const at::Tensor rope = at::randn({5, 64}).to(rope_dtype);
    const at::Tensor rows = ops::pack_sfa_c8_rows(nope, rope);
    ASSERT_EQ(rows.sizes(), (c10::IntArrayRef{5, 656}));
    ASSERT_EQ(rows.scalar_type(), at::kChar);
    EXPECT_TRUE(at::equal(rows, test_pack(nope, rope))) << "rows differ from the byte-level packing";
    const auto u = ops::unpack_sfa_c8_rows(rows, rope_dtype);
    EXPECT_TRUE(at::equal(u.k_rope, rope));
    EXPECT_EQ(u.k_nope_q[3][7].item<int8_t>(), 127);
    EXPECT_EQ(u.scale[2][1].item<float>(), 0.0f);
    const auto [nd, rd] = test_unpack(rows, rope_dtype);
    expect_close(u.k_nope, nd, 1e-7, "k_nope vs byte-level dequantisation");
    // Within half a quantisation step of the input, tile by tile.
    const at::Tensor step = u.scale.to(at::kDouble).repeat_interleave(128, 1);
    EXPECT_TRUE(at::all((u.k_nope.to(at::kDouble) - nope.to(at::kDouble)).abs() <= step * 0.5 + 1e-6).item<bool>());
  }
  // Leading dims are kept: (nb, bs, 1, 512) -> (nb, bs, 1, 656).
  const at::Tensor r4 = ops::pack_sfa_c8_rows(at::randn({2, 3, 1, 512}), at::randn({2, 3, 1, 64}).to(at::kBFloat16));
  EXPECT_EQ(r4.sizes(), (c10::IntArrayRef{2, 3, 1, 656}));
  expect_throw_with<aar::InvalidArgument>(
      [] { ops::pack_sfa_c8_rows(at::randn({2, 500}), at::randn({2, 64}).to(at::kBFloat16)); }, "k_nope");
  expect_throw_with<aar::InvalidArgument>([] { ops::pack_sfa_c8_rows(at::randn({2, 512}), at::randn({2, 64})); },
                                          "k_rope");
  expect_throw_with<aar::InvalidArgument>(
      [] { ops::unpack_sfa_c8_rows(at::zeros({2, 656}, at::kByte), at::kBFloat16); }, "int8");
  // The row dtype: int8 is the default; A5's float8_e4m3fn rows ask npu_dynamic_block_quant for the fp8
  // dst_type (its ScalarType value): scale amax / 448, the nearest e4m3 value; they unpack to within half an
  // e4m3 step (2^-4 relative) of the input. Other dtypes are invalid.
  const at::Tensor n2 = at::randn({2, 512}), r2 = at::randn({2, 64}).to(at::kBFloat16);
  EXPECT_TRUE(at::equal(ops::pack_sfa_c8_rows(n2, r2, at::kChar), ops::pack_sfa_c8_rows(n2, r2)));
  const at::Tensor f8 = ops::pack_sfa_c8_rows(n2, r2, at::kFloat8_e4m3fn);
  EXPECT_EQ(f8.scalar_type(), at::kFloat8_e4m3fn);
  const ops::SfaC8Unpacked u8 = ops::unpack_sfa_c8_rows(f8, at::kBFloat16);
  EXPECT_EQ(u8.k_nope_q.scalar_type(), at::kFloat8_e4m3fn);
  EXPECT_DOUBLE_EQ(u8.k_nope_q.to(at::kFloat).abs().max().item<double>(), 448.0);
  EXPECT_TRUE(at::equal(u8.k_rope, r2));
  const at::Tensor tol8 = n2.abs() * (1.0 / 16) + u8.scale.repeat_interleave(128, -1) * (1.0 / 1024) + 1e-7;
  EXPECT_TRUE(at::all((u8.k_nope - n2).abs() <= tol8).item<bool>());
  expect_throw_with<aar::InvalidArgument>([&] { ops::pack_sfa_c8_rows(n2, r2, at::kByte); }, "row_dtype");
}

TEST(RtOpsSparse, KvQuantSfaOnPackedRowsMatchesDequantisedReference) {
  Batch batch{{1, 4, 2}, {30, 12, 2}};
  const int64_t n = 4, bs = 8, k = 10;
  for (const auto dtype : {at::kBFloat16, at::kHalf}) {
    for (const int64_t mode : {3, 0}) {
      at::manual_seed(51);
      const int64_t t = batch.tokens();
      const at::Tensor q = at::randn({t, n, 576}).to(dtype);
      std::vector<at::Tensor> rows, nope, rope;
      for (int64_t s : batch.kv_lens) {
        nope.push_back(at::randn({s, 512}));
        rope.push_back(at::randn({s, 64}).to(dtype));
        rows.push_back(test_pack(nope.back(), rope.back()));
      }
      const PagedKv pk = page(rows, bs, 9);
      std::mt19937 rng(13);
      std::vector<int32_t> all;
      for (size_t b = 0; b < batch.q_lens.size(); ++b) {
        for (int64_t i = 0; i < batch.q_lens[b]; ++i) {
          const int64_t n_valid = std::uniform_int_distribution<int64_t>(0, k)(rng);
          for (int64_t j = 0; j < k; ++j) {
            all.push_back(j < n_valid ? std::uniform_int_distribution<int32_t>(0, batch.kv_lens[b] - 1)(rng) : -1);
          }
        }
      }
      const at::Tensor indices = at::tensor(all, at::kInt).view({t, 1, k});
      ops::KvQuantSparseFlashAttentionArgs a;
      a.query = q;
      a.key = pk.key_cache;
      a.value = pk.key_cache;
      a.sparse_indices = indices;
      a.scale_value = 1.0 / std::sqrt(576.0);
      a.block_table = pk.block_table;
      a.actual_seq_lengths_query = batch.cu();
      a.actual_seq_lengths_kv = batch.kv();
      a.sparse_mode = mode;
      for (const OpLibrary lib : kLibs) {
        a.return_softmax_lse = lib == OpLibrary::VllmAscend;
        const auto [out, smax, ssum] = ops::kv_quant_sparse_flash_attention(a, lib);
        ASSERT_EQ(out.sizes(), (c10::IntArrayRef{t, n, 512}));
        EXPECT_EQ(out.scalar_type(), dtype);
        if (lib == OpLibrary::TorchNpu) {
          EXPECT_FALSE(smax.defined());
          EXPECT_FALSE(ssum.defined());
        } else {
          ASSERT_EQ(smax.sizes(), (c10::IntArrayRef{1, t, n}));
        }
        for (size_t b = 0; b < batch.q_lens.size(); ++b) {
          const auto [kd, rd] = test_unpack(rows[b], dtype);
          for (int64_t i = 0; i < batch.q_lens[b]; ++i) {
            const int64_t tt = batch.start(b) + i;
            const int64_t th = mode == 3 ? batch.kv_lens[b] - batch.q_lens[b] + i + 1 : batch.kv_lens[b];
            const auto toks = ref_tokens(row_of(indices, tt), th, 1);
            const at::Tensor qd = q[tt].to(at::kDouble);
            const RefRow deq = ref_attend(qd.narrow(1, 0, 512), qd.narrow(1, 512, 64), kd, rd, kd, toks, a.scale_value);
            expect_close(out[tt], deq.out, 1e-2, "C8 out row " + std::to_string(tt));
            // And within quantisation error of the unquantised latent.
            const RefRow fl = ref_attend(qd.narrow(1, 0, 512), qd.narrow(1, 512, 64), nope[b], rope[b], nope[b], toks,
                                         a.scale_value);
            expect_close(out[tt], fl.out, 5e-2, "C8 out row vs float " + std::to_string(tt));
            if (lib == OpLibrary::VllmAscend) {
              const at::Tensor l = smax[0][tt].to(at::kDouble) + at::log(ssum[0][tt].to(at::kDouble));
              expect_close(l, at::tensor(deq.lse, at::kDouble), 1e-4, "C8 lse row " + std::to_string(tt));
            }
          }
        }
      }
    }
  }
}

TEST(RtOpsSparse, KvQuantSfaPackedThroughTheHelperEqualsTheFloatSfaOfItsDequantisation) {
  // The backend's path: pack with the helper, attend with the C8 operator; the
  // plain SFA over the helper's dequantised latent gives the same result.
  Batch batch{{2}, {9}};
  at::manual_seed(61);
  const at::Tensor nope = at::randn({9, 512}), rope = at::randn({9, 64}).to(at::kBFloat16);
  const at::Tensor rows = ops::pack_sfa_c8_rows(nope, rope);
  const auto u = ops::unpack_sfa_c8_rows(rows, at::kBFloat16);
  const PagedKv pc8 = page({rows}, 4, 2), pn = page({u.k_nope}, 4, 2), pr = page({u.k_rope.to(at::kFloat)}, 4, 2);
  const at::Tensor q = at::randn({2, 2, 576}).to(at::kBFloat16);
  const at::Tensor idx = at::tensor(std::vector<int32_t>{0, 3, 7, -1, 8, 1, 2, 5}, at::kInt).view({2, 1, 4});
  ops::KvQuantSparseFlashAttentionArgs a;
  a.query = q;
  a.key = a.value = pc8.key_cache;
  a.sparse_indices = idx;
  a.block_table = pc8.block_table;
  a.actual_seq_lengths_query = batch.cu();
  a.actual_seq_lengths_kv = batch.kv();
  a.scale_value = 0.05;
  const at::Tensor c8 = std::get<0>(ops::kv_quant_sparse_flash_attention(a, OpLibrary::VllmAscend));
  ops::SparseFlashAttentionArgs f;
  f.query = q.narrow(2, 0, 512).to(at::kFloat);
  f.query_rope = q.narrow(2, 512, 64).to(at::kFloat);
  f.key = pn.key_cache;
  f.key_rope = pr.key_cache;
  f.sparse_indices = idx;
  f.block_table = pn.block_table;
  f.actual_seq_lengths_query = batch.cu();
  f.actual_seq_lengths_kv = batch.kv();
  f.scale_value = 0.05;
  const at::Tensor fl = std::get<0>(ops::sparse_flash_attention(f, OpLibrary::TorchNpu));
  expect_close(c8, fl, 1e-2, "C8 vs float SFA over the dequantised latent");
}

// ---------------------------------------------------------------- bad input

TEST(RtOpsSparse, IndexerRejectsBadInputByName) {
  const IndexerData d = make_indexer(indexer_batch(), 2, 4, 4, 4, 3, at::kFloat, true, 1);
  auto run = [&](auto mutate) {
    ops::LightningIndexerArgs a = d.args;
    mutate(a);
    return [a] { ops::lightning_indexer(a, OpLibrary::VllmAscend); };
  };
  expect_throw_with<aar::InvalidArgument>(
      run([](auto& a) { a.actual_seq_lengths_query = i32({1, 5, 4, 10}); }), "actual_seq_lengths_query");
  expect_throw_with<aar::InvalidArgument>(
      run([](auto& a) { a.actual_seq_lengths_query = i32({1, 5, 8, 9}); }), "actual_seq_lengths_query");
  expect_throw_with<aar::InvalidArgument>(
      run([](auto& a) { a.actual_seq_lengths_key = a.actual_seq_lengths_key->to(at::kLong); }),
      "actual_seq_lengths_key must be int32");
  expect_throw_with<aar::InvalidArgument>(run([](auto& a) { a.actual_seq_lengths_key = i32({21, 12, 2}); }),
                                          "actual_seq_lengths_key");
  expect_throw_with<aar::InvalidArgument>(run([](auto& a) { a.actual_seq_lengths_key.reset(); }),
                                          "actual_seq_lengths_key is required");
  expect_throw_with<aar::InvalidArgument>(run([](auto& a) { a.block_table.reset(); }), "block_table is required");
  expect_throw_with<aar::InvalidArgument>(
      run([](auto& a) { a.block_table = a.block_table->clone().fill_(999); }), "block_table");
  expect_throw_with<aar::InvalidArgument>(run([](auto& a) { a.weights = at::ones({10, 3}); }), "weights");
  expect_throw_with<aar::InvalidArgument>(run([](auto& a) { a.key = a.key.to(at::kHalf); }), "query and key");
  expect_throw_with<aar::NotSupported>(run([](auto& a) { a.layout_query = "BSND"; }), "layout_query");
  expect_throw_with<aar::NotSupported>(run([](auto& a) { a.layout_key = "BSND"; }), "layout_key");
  expect_throw_with<aar::NotSupported>(run([](auto& a) { a.sparse_mode = 1; }), "sparse_mode=1");
  expect_throw_with<aar::NotSupported>(run([](auto& a) { a.pre_tokens = 100; }), "pre_tokens=100");
  expect_throw_with<aar::NotSupported>(run([](auto& a) { a.next_tokens = 0; }), "next_tokens=0");
  expect_throw_with<aar::InvalidArgument>(run([](auto& a) { a.sparse_count = 0; }), "sparse_count");
  expect_throw_with<aar::InvalidArgument>([&] { ops::lightning_indexer(d.args, OpLibrary::Atb); }, "lib=Atb");

  ops::QuantLightningIndexerArgs q;
  q.base = d.args;
  q.base.query = d.args.query.to(at::kChar);
  q.base.key = d.args.key.to(at::kChar);
  q.query_dequant_scale = at::ones({10, 2});
  q.key_dequant_scale = at::ones({d.args.key.size(0), 4, 1});
  EXPECT_NO_THROW(ops::quant_lightning_indexer(q, OpLibrary::TorchNpu));
  auto qrun = [&](auto mutate, OpLibrary lib) {
    ops::QuantLightningIndexerArgs a = q;
    mutate(a);
    return [a, lib] { ops::quant_lightning_indexer(a, lib); };
  };
  expect_throw_with<aar::NotSupported>(qrun([](auto& a) { a.query_dtype = 1; }, OpLibrary::TorchNpu), "query_dtype");
  expect_throw_with<aar::NotSupported>(qrun([](auto& a) { a.key_dtype = 1; }, OpLibrary::VllmAscend), "key_dtype");
  expect_throw_with<aar::NotSupported>(qrun([](auto& a) { a.base.pre_tokens = 5; }, OpLibrary::VllmAscend),
                                       "pre_tokens");
  expect_throw_with<aar::NotSupported>(qrun([](auto& a) { a.base.return_value = true; }, OpLibrary::TorchNpu),
                                       "return_value");
  expect_throw_with<aar::NotSupported>(qrun([](auto& a) { a.query_quant_mode = 1; }, OpLibrary::VllmAscend),
                                       "query_quant_mode=1");
  expect_throw_with<aar::InvalidArgument>(
      qrun([](auto& a) { a.key_dequant_scale = at::ones({3, 4}); }, OpLibrary::TorchNpu), "key_dequant_scale");
  expect_throw_with<aar::InvalidArgument>(
      qrun([](auto& a) { a.base.query = a.base.query.to(at::kFloat); }, OpLibrary::TorchNpu), "int8");
}

TEST(RtOpsSparse, SfaRejectsBadInputByName) {
  Batch batch{{2}, {6}};
  SfaData x = make_sfa(batch, 2, 16, 4, 4, at::kFloat, 3);
  x.indices = at::tensor(std::vector<int32_t>{0, 1, 2, 3}, at::kInt).view({2, 1, 2});
  x.args.sparse_indices = x.indices;
  auto run = [&](auto mutate, OpLibrary lib = OpLibrary::TorchNpu) {
    ops::SparseFlashAttentionArgs a = x.args;
    mutate(a);
    return [a, lib] { ops::sparse_flash_attention(a, lib); };
  };
  EXPECT_NO_THROW(run([](auto&) {})());
  expect_throw_with<aar::NotSupported>(run([](auto& a) { a.attention_mode = 0; }), "attention_mode=0");
  expect_throw_with<aar::NotSupported>(run([](auto& a) { a.sinks = at::zeros({2}); }), "sinks");
  expect_throw_with<aar::NotSupported>(run([](auto& a) { a.sinks = at::zeros({2}); }, OpLibrary::VllmAscend), "sinks");
  expect_throw_with<aar::NotSupported>(run([](auto& a) { a.layout_kv = "BSND"; }), "layout_kv");
  expect_throw_with<aar::NotSupported>(run([](auto& a) { a.sparse_mode = 4; }), "sparse_mode=4");
  expect_throw_with<aar::InvalidArgument>(run([](auto& a) { a.sparse_block_size = 0; }), "sparse_block_size");
  expect_throw_with<aar::InvalidArgument>(
      run([](auto& a) { a.sparse_indices = at::tensor(std::vector<int32_t>{0, -2, 2, 3}, at::kInt).view({2, 1, 2}); }),
      "sparse_indices[0, 0, 1]=-2");
  expect_throw_with<aar::InvalidArgument>(run([](auto& a) { a.sparse_indices = a.sparse_indices.to(at::kLong); }),
                                          "sparse_indices must be int32");
  expect_throw_with<aar::InvalidArgument>(run([](auto& a) { a.key_rope.reset(); }), "key_rope");
  expect_throw_with<aar::InvalidArgument>(run([](auto& a) { a.actual_seq_lengths_kv = i32({6, 6}); }),
                                          "actual_seq_lengths_kv");
  expect_throw_with<aar::InvalidArgument>(run([](auto& a) { a.actual_seq_lengths_query = i32({3}); }),
                                          "actual_seq_lengths_query");

  ops::KvQuantSparseFlashAttentionArgs c;
  c.query = at::randn({2, 2, 576}).to(at::kBFloat16);
  c.key = c.value = ops::pack_sfa_c8_rows(at::randn({4, 4, 1, 512}), at::randn({4, 4, 1, 64}).to(at::kBFloat16));
  c.sparse_indices = x.indices;
  c.block_table = i32({0, 1}).view({1, 2});
  c.actual_seq_lengths_query = batch.cu();
  c.actual_seq_lengths_kv = batch.kv();
  auto crun = [&](auto mutate, OpLibrary lib) {
    ops::KvQuantSparseFlashAttentionArgs a = c;
    mutate(a);
    return [a, lib] { ops::kv_quant_sparse_flash_attention(a, lib); };
  };
  EXPECT_NO_THROW(crun([](auto&) {}, OpLibrary::TorchNpu)());
  expect_throw_with<aar::NotSupported>(crun([](auto& a) { a.return_softmax_lse = true; }, OpLibrary::TorchNpu),
                                       "return_softmax_lse");
  expect_throw_with<aar::NotSupported>(crun([](auto& a) { a.key_quant_mode = 1; }, OpLibrary::VllmAscend),
                                       "key_quant_mode=1");
  expect_throw_with<aar::NotSupported>(crun([](auto& a) { a.value_quant_mode = 1; }, OpLibrary::TorchNpu),
                                       "value_quant_mode=1");
  expect_throw_with<aar::NotSupported>(crun([](auto& a) { a.tile_size = 64; }, OpLibrary::VllmAscend), "tile_size=64");
  expect_throw_with<aar::NotSupported>(crun([](auto& a) { a.rope_head_dim = 0; }, OpLibrary::VllmAscend),
                                       "rope_head_dim=0");
  expect_throw_with<aar::NotSupported>(crun([](auto& a) { a.quant_scale_repo_mode = 0; }, OpLibrary::TorchNpu),
                                       "quant_scale_repo_mode=0");
  expect_throw_with<aar::NotSupported>(crun([](auto& a) { a.key_dequant_scale = at::ones({1}); }, OpLibrary::TorchNpu),
                                       "key_dequant_scale");
  expect_throw_with<aar::NotSupported>(crun([](auto& a) { a.key_dtype = 2; }, OpLibrary::TorchNpu), "key_dtype");
  expect_throw_with<aar::NotSupported>(crun([](auto& a) { a.value_dtype = 2; }, OpLibrary::VllmAscend), "value_dtype");
  expect_throw_with<aar::InvalidArgument>(crun([](auto& a) { a.query = a.query.to(at::kFloat); }, OpLibrary::TorchNpu),
                                          "float16 or bfloat16");
  expect_throw_with<aar::InvalidArgument>(
      crun([](auto& a) { a.key = a.value = at::zeros({4, 4, 1, 600}, at::kChar); }, OpLibrary::TorchNpu), "656");
}

// ---------------------------------------------------------------- DSV4 quantised indexer (issue 12)

// _C_ascend::npu_vllm_quant_lightning_indexer through its wrapper: compressed
// keys (cmp_ratio 4) over raw lengths, integer data and unit scales so the
// twin's scores are exact and the float64 reference's order (ties included) is
// reproduced exactly; return_value scores; the no-compute provider's shapes;
// the metadata wrapper with and without a length tensor.
TEST(RtOpsSparse, VllmQuantIndexerCompressedKeys) {
  constexpr int64_t kR = 4, kHeads = 2, kDim = 8, kBs = 4, kK = 5;
  Batch batch{{1, 3, 2, 4}, {17, 10, 8, 3}};  // raw lengths; 4, 2, 2, 0 compressed rows
  at::manual_seed(21);
  const int64_t t = batch.tokens();
  const at::Tensor q = at::randint(-3, 4, {t, kHeads, kDim}).to(at::kChar);
  const at::Tensor w = at::randint(-2, 3, {t, kHeads}).to(at::kHalf);
  std::vector<at::Tensor> rows;
  for (int64_t s : batch.kv_lens) rows.push_back(at::randint(-3, 4, {std::max<int64_t>(s / kR, 1), kDim}).to(at::kChar));
  const PagedKv pk = page(rows, kBs, 5);
  ops::VllmQuantLightningIndexerArgs a;
  a.quant.base.query = q;
  a.quant.base.key = pk.key_cache;
  a.quant.base.weights = w;
  a.quant.base.actual_seq_lengths_query = batch.cu();
  a.quant.base.actual_seq_lengths_key = batch.kv();
  a.quant.base.block_table = pk.block_table;
  a.quant.base.sparse_count = kK;
  a.quant.base.return_value = true;
  a.quant.query_dequant_scale = at::ones({t, kHeads}, at::kHalf);
  a.quant.key_dequant_scale = at::ones({pk.key_cache.size(0), kBs, 1}, at::kHalf);
  a.cmp_ratio = kR;
  const auto [idx, val] = ops::vllm_quant_lightning_indexer(a);
  ASSERT_EQ(idx.sizes(), (c10::IntArrayRef{t, 1, kK}));
  ASSERT_EQ(val.sizes(), (c10::IntArrayRef{t, 1, kK}));
  for (size_t b = 0; b < batch.q_lens.size(); ++b) {
    const int64_t ql = batch.q_lens[b], s = batch.kv_lens[b];
    for (int64_t i = 0; i < ql; ++i) {
      const int64_t r = batch.start(b) + i, lim = s - ql + i + 1;
      const int64_t vis = lim <= 0 ? 0 : std::min(lim / kR, s / kR);
      const auto score = ref_scores(q[r], w[r], rows[b], vis);
      const auto want = ref_top_k(score, kK);
      const at::Tensor row = idx[r][0].contiguous();
      EXPECT_EQ(std::vector<int32_t>(row.data_ptr<int32_t>(), row.data_ptr<int32_t>() + kK), want)
          << "request " << b << " row " << i;
      for (int64_t j = 0; j < kK; ++j) {
        const double v = val[r][0][j].item<double>();
        if (want[j] < 0) {
          EXPECT_EQ(v, -kInf);
        } else {
          EXPECT_EQ(v, score[want[j]]);
        }
      }
    }
  }
  // No-compute provider: shapes only.
  const auto [nidx, nval] = ops::vllm_quant_lightning_indexer(a, ops::Provider::NoCompute);
  EXPECT_EQ(nidx.sizes(), idx.sizes());
  EXPECT_EQ(nval.sizes(), val.sizes());
  // Arguments not in this schema are rejected by name.
  ops::VllmQuantLightningIndexerArgs bad = a;
  bad.quant.query_dtype = 1;
  expect_throw_with<aar::NotSupported>([&] { ops::vllm_quant_lightning_indexer(bad); }, "query_dtype");
  bad = a;
  bad.cmp_ratio = 0;
  expect_throw_with<aar::InvalidArgument>([&] { ops::vllm_quant_lightning_indexer(bad); }, "cmp_ratio");

  // Metadata: from the lengths' device, deterministic, accepted by the indexer.
  ops::VllmQuantLightningIndexerMetadataArgs m;
  m.actual_seq_lengths_query = batch.cu();
  m.actual_seq_lengths_key = batch.kv();
  m.batch_size = 4;
  m.cmp_ratio = kR;
  m.sparse_count = kK;
  const at::Tensor blob = ops::vllm_quant_lightning_indexer_metadata(m);
  ASSERT_EQ(blob.sizes(), (c10::IntArrayRef{1024}));
  EXPECT_EQ(blob.scalar_type(), at::kInt);
  EXPECT_TRUE(at::equal(blob, ops::vllm_quant_lightning_indexer_metadata(m)));
  a.metadata = blob;
  EXPECT_TRUE(at::equal(std::get<0>(ops::vllm_quant_lightning_indexer(a)), idx));
  ops::VllmQuantLightningIndexerMetadataArgs none;  // no tensor: needs an explicit provider
  expect_throw_with<aar::InvalidArgument>([&] { ops::vllm_quant_lightning_indexer_metadata(none); }, "pv=Auto");
  EXPECT_EQ(ops::vllm_quant_lightning_indexer_metadata(none, ops::Provider::Cpu).numel(), 1024);
  EXPECT_EQ(ops::vllm_quant_lightning_indexer_metadata(none, ops::Provider::NoCompute).numel(), 1024);
}
