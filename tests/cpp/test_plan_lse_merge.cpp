// LSE merge (docs/design/cp.md §7, §9) against attention computed here in long double
// over the full key set: shards of any shape (contiguous, interleaved, empty)
// merge back to the unsharded result; -inf / +inf / NaN partials; all-empty rows.
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "ascend_attn_rt/cp/plan/lse_merge.h"
#include "test_plan_util.h"

using namespace aar::plan;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNan = std::numeric_limits<double>::quiet_NaN();

// Attention of every (token, head) row over the keys in `keys` (indices into
// the key axis), long double: out [rows, D], lse [rows]; an empty key set gives
// out 0, lse -inf. Q [T, H, D], K/V [S, H, D].
struct Attn {
  std::vector<double> out, lse;
};

Attn attend(const std::vector<double>& q, const std::vector<double>& k, const std::vector<double>& v, int t, int h,
            int d, const std::vector<int>& keys, double scale) {
  Attn a;
  a.out.assign(static_cast<std::size_t>(t) * h * d, 0.0);
  a.lse.assign(static_cast<std::size_t>(t) * h, -kInf);
  for (int ti = 0; ti < t; ++ti) {
    for (int hi = 0; hi < h; ++hi) {
      if (keys.empty()) continue;
      std::vector<long double> s;
      for (int j : keys) {
        long double dot = 0;
        for (int x = 0; x < d; ++x) dot += (long double)q[(ti * h + hi) * d + x] * k[(j * h + hi) * d + x];
        s.push_back(dot * scale);
      }
      const long double m = *std::max_element(s.begin(), s.end());
      long double z = 0;
      for (long double e : s) z += std::exp(e - m);
      const std::size_t row = static_cast<std::size_t>(ti) * h + hi;
      for (std::size_t n = 0; n < keys.size(); ++n) {
        const long double w = std::exp(s[n] - m) / z;
        for (int x = 0; x < d; ++x) a.out[row * d + x] += static_cast<double>(w * v[(keys[n] * h + hi) * d + x]);
      }
      a.lse[row] = static_cast<double>(m + std::log(z));
    }
  }
  return a;
}

std::vector<double> randn(std::mt19937& rng, std::size_t n) {
  std::normal_distribution<double> nd(0.0, 1.0);
  std::vector<double> v(n);
  for (double& x : v) x = nd(rng);
  return v;
}

template <typename T>
void merge_parts(const std::vector<std::vector<T>>& outs, const std::vector<std::vector<T>>& lses, int64_t rows,
           int64_t d, std::vector<T>& out, std::vector<T>& lse) {
  std::vector<CSpan<T>> o, l;
  for (const auto& x : outs) o.emplace_back(x.data(), x.size());
  for (const auto& x : lses) l.emplace_back(x.data(), x.size());
  out.assign(rows * d, T(-99));
  lse.assign(rows, T(-99));
  merge_attention_partials(CSpan<CSpan<T>>(o.data(), o.size()), CSpan<CSpan<T>>(l.data(), l.size()), rows, d,
                           Span<T>(out), Span<T>(lse));
}

}  // namespace

TEST(PlanLseMerge, UpstreamExample) {
  // test_attention_cp: outputs [1,3] and [5,7] with LSE [0, ln 3] -> [4,6], LSE ln 4.
  std::vector<double> out, lse;
  merge_parts<double>({{1, 3}, {5, 7}}, {{0.0}, {std::log(3.0)}}, 1, 2, out, lse);
  EXPECT_NEAR(out[0], 4.0, 1e-12);
  EXPECT_NEAR(out[1], 6.0, 1e-12);
  EXPECT_NEAR(lse[0], std::log(4.0), 1e-12);
  std::vector<float> fo, fl;
  merge_parts<float>({{1, 3}, {5, 7}}, {{0.0f}, {std::log(3.0f)}}, 1, 2, fo, fl);
  EXPECT_NEAR(fo[0], 4.0f, 1e-6);
  EXPECT_NEAR(fo[1], 6.0f, 1e-6);
  EXPECT_NEAR(fl[0], std::log(4.0f), 1e-6);
}

TEST(PlanLseMerge, ThreeContiguousShardsFloat64) {
  // test_attention_cp_precision: Q [5,3,8], K/V [12,3,8] in 3 contiguous shards, 1e-10.
  std::mt19937 rng(1);
  const int t = 5, h = 3, d = 8, s = 12;
  const auto q = randn(rng, t * h * d), k = randn(rng, s * h * d), v = randn(rng, s * h * d);
  const double scale = 1.0 / std::sqrt(8.0);
  std::vector<int> all(s);
  std::iota(all.begin(), all.end(), 0);
  const Attn full = attend(q, k, v, t, h, d, all, scale);
  std::vector<std::vector<double>> outs, lses;
  for (int shard = 0; shard < 3; ++shard) {
    const Attn a = attend(q, k, v, t, h, d, std::vector<int>(all.begin() + 4 * shard, all.begin() + 4 * shard + 4), scale);
    outs.push_back(a.out);
    lses.push_back(a.lse);
  }
  std::vector<double> out, lse;
  merge_parts<double>(outs, lses, t * h, d, out, lse);
  for (std::size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], full.out[i], 1e-10);
  for (std::size_t i = 0; i < lse.size(); ++i) ASSERT_NEAR(lse[i], full.lse[i], 1e-10);
}

TEST(PlanLseMerge, InterleavedAndEmptyShardsMatchFullAttention) {
  // DCP-style shards: key j on shard floor(j / I) mod W, with sequences shorter
  // than the group so some shards are empty (LSE -inf, output 0). fp64 to 1e-10,
  // fp32 (partials rounded to float) to 1e-5.
  std::mt19937 rng(2);
  const int t = 3, h = 4, d = 16;
  for (int w : {1, 2, 4, 7}) {
    for (int il : {1, 2, 16}) {
      for (int s : {1, 3, 17, 40}) {
        const auto q = randn(rng, t * h * d), k = randn(rng, s * h * d), v = randn(rng, s * h * d);
        std::vector<int> all(s);
        std::iota(all.begin(), all.end(), 0);
        const Attn full = attend(q, k, v, t, h, d, all, 0.25);
        std::vector<std::vector<double>> outs, lses;
        std::vector<std::vector<float>> fouts, flses;
        for (int r = 0; r < w; ++r) {
          std::vector<int> keys;
          for (int j = 0; j < s; ++j) {
            if (j / il % w == r) keys.push_back(j);
          }
          const Attn a = attend(q, k, v, t, h, d, keys, 0.25);
          outs.push_back(a.out);
          lses.push_back(a.lse);
          fouts.emplace_back(a.out.begin(), a.out.end());
          flses.emplace_back(a.lse.begin(), a.lse.end());
        }
        std::vector<double> out, lse;
        merge_parts<double>(outs, lses, t * h, d, out, lse);
        std::vector<float> fout, flse;
        merge_parts<float>(fouts, flses, t * h, d, fout, flse);
        for (std::size_t i = 0; i < out.size(); ++i) {
          ASSERT_NEAR(out[i], full.out[i], 1e-10) << "W=" << w << " I=" << il << " S=" << s;
          ASSERT_NEAR(fout[i], full.out[i], 1e-5);
        }
        for (std::size_t i = 0; i < lse.size(); ++i) {
          ASSERT_NEAR(lse[i], full.lse[i], 1e-10);
          ASSERT_NEAR(flse[i], full.lse[i], 1e-5);
        }
      }
    }
  }
}

TEST(PlanLseMerge, EmptyPartialsNeverGiveNaN) {
  // Row 0: partial 1 empty with garbage (NaN) output -> partial 0 alone.
  // Row 1: every partial empty (-inf, +inf, NaN LSE) -> O = 0, LSE = -inf.
  // Row 2: +inf / NaN LSE are normalised to -inf (empty), partial 2 remains.
  const int64_t rows = 3, d = 2;
  std::vector<double> o0 = {1, 2, 9, 9, 3, 3}, o1 = {kNan, kNan, kNan, 5, 4, 4}, o2 = {7, 7, kNan, kNan, 5, 6};
  std::vector<double> l0 = {0.5, -kInf, kInf}, l1 = {-kInf, kInf, kNan}, l2 = {-kInf, kNan, 1.25};
  std::vector<double> out, lse;
  merge_parts<double>({o0, o1, o2}, {l0, l1, l2}, rows, d, out, lse);
  EXPECT_EQ(out, (std::vector<double>{1, 2, 0, 0, 5, 6}));
  EXPECT_DOUBLE_EQ(lse[0], 0.5);
  EXPECT_EQ(lse[1], -kInf);
  EXPECT_DOUBLE_EQ(lse[2], 1.25);
  for (double x : out) EXPECT_FALSE(std::isnan(x));
  // Zero partials: every row is empty.
  std::vector<double> z, zl;
  merge_parts<double>({}, {}, 2, 3, z, zl);
  EXPECT_EQ(z, std::vector<double>(6, 0.0));
  EXPECT_EQ(zl, std::vector<double>(2, -kInf));
  // Float: the same all-empty row.
  std::vector<float> fo, fl;
  merge_parts<float>({{std::nanf(""), 1}}, {{-std::numeric_limits<float>::infinity()}}, 1, 2, fo, fl);
  EXPECT_EQ(fo, (std::vector<float>{0, 0}));
  EXPECT_EQ(fl[0], -std::numeric_limits<float>::infinity());
}

TEST(PlanLseMerge, LargeLseDifferencesStayFinite) {
  // Stable log-sum-exp: lse values near the float range limits.
  std::vector<float> out, lse;
  merge_parts<float>({{1, 1}, {3, 5}}, {{80.0f}, {-80.0f}}, 1, 2, out, lse);
  EXPECT_NEAR(out[0], 1.0f, 1e-6);
  EXPECT_NEAR(out[1], 1.0f, 1e-6);
  EXPECT_NEAR(lse[0], 80.0f, 1e-5);
  merge_parts<float>({{1, 1}, {3, 5}}, {{3000.0f}, {3000.0f}}, 1, 2, out, lse);
  EXPECT_NEAR(out[0], 2.0f, 1e-5);
  EXPECT_NEAR(out[1], 3.0f, 1e-5);
  EXPECT_NEAR(lse[0], 3000.0f + std::log(2.0f), 1e-3);
}

TEST(PlanLseMerge, PermutationInvariant) {
  std::mt19937 rng(3);
  const int n = 5, rows = 7, d = 8;
  std::vector<std::vector<double>> outs, lses;
  std::uniform_real_distribution<double> u(-6.0, 6.0);
  for (int i = 0; i < n; ++i) {
    outs.push_back(randn(rng, rows * d));
    std::vector<double> l(rows);
    for (double& x : l) x = u(rng);
    l[i % rows] = -kInf;  // some empty partials too
    lses.push_back(l);
  }
  std::vector<double> ref, ref_lse;
  merge_parts<double>(outs, lses, rows, d, ref, ref_lse);
  std::vector<int> perm(n);
  std::iota(perm.begin(), perm.end(), 0);
  int count = 0;
  do {
    std::vector<std::vector<double>> po, pl;
    for (int i : perm) {
      po.push_back(outs[i]);
      pl.push_back(lses[i]);
    }
    std::vector<double> out, lse;
    merge_parts<double>(po, pl, rows, d, out, lse);
    for (std::size_t i = 0; i < out.size(); ++i) ASSERT_NEAR(out[i], ref[i], 1e-12);
    for (std::size_t i = 0; i < lse.size(); ++i) ASSERT_NEAR(lse[i], ref_lse[i], 1e-12);
    ++count;
  } while (std::next_permutation(perm.begin(), perm.end()));
  EXPECT_EQ(count, 120);
}

TEST(PlanLseMerge, StackedFormEqualsListForm) {
  std::mt19937 rng(4);
  const int n = 3, rows = 6, d = 4;
  std::vector<std::vector<float>> outs, lses;
  std::vector<float> so, sl;
  for (int i = 0; i < n; ++i) {
    const auto o = randn(rng, rows * d);
    const auto l = randn(rng, rows);
    outs.emplace_back(o.begin(), o.end());
    lses.emplace_back(l.begin(), l.end());
    so.insert(so.end(), o.begin(), o.end());
    sl.insert(sl.end(), l.begin(), l.end());
  }
  sl[rows + 2] = -std::numeric_limits<float>::infinity();
  lses[1][2] = -std::numeric_limits<float>::infinity();
  std::vector<float> out, lse;
  merge_parts<float>(outs, lses, rows, d, out, lse);
  std::vector<float> out2(rows * d), lse2(rows);
  merge_attention_partials_stacked(CSpan<float>(so), CSpan<float>(sl), n, rows, d, Span<float>(out2), Span<float>(lse2));
  EXPECT_EQ(out, out2);
  EXPECT_EQ(lse, lse2);
  // No LSE wanted: an empty lse_out.
  std::vector<float> out3(rows * d);
  merge_attention_partials_stacked(CSpan<float>(so), CSpan<float>(sl), n, rows, d, Span<float>(out3), Span<float>());
  EXPECT_EQ(out3, out);
}

TEST(PlanLseMerge, ErrorsLeaveOutputsUntouched) {
  std::vector<double> a = {1, 2, 3, 4}, b = {5, 6, 7, 8}, la = {0, 0}, lb = {1, 1};
  std::vector<CSpan<double>> outs = {a, b}, lses = {la, lb};
  std::vector<double> out(4, 9), lse(2, 9);
  auto call = [&](int64_t rows, int64_t d, Span<double> o, Span<double> l) {
    merge_attention_partials(CSpan<CSpan<double>>(outs.data(), outs.size()),
                             CSpan<CSpan<double>>(lses.data(), lses.size()), rows, d, o, l);
  };
  EXPECT_INVALID(call(2, 0, out, lse), "head_dim=0 must be >= 1");
  EXPECT_INVALID(call(-1, 2, out, lse), "rows=-1 is negative");
  EXPECT_INVALID(call(2, 3, out, lse), "outs[0] has 4 entries, expected rows*head_dim = 2*3 = 6");
  EXPECT_INVALID(call(2, 2, Span<double>(out.data(), 3), lse), "out has room for 3 entries");
  EXPECT_INVALID(call(2, 2, out, Span<double>(lse.data(), 1)), "lse_out has room for 1 entries");
  EXPECT_INVALID(call(2, 2, Span<double>(a.data(), 4), lse), "out overlaps partial 0");
  EXPECT_INVALID(call(2, 2, out, Span<double>(lb.data(), 2)), "lse_out overlaps partial 1");
  EXPECT_EQ(out, std::vector<double>(4, 9));
  EXPECT_EQ(lse, std::vector<double>(2, 9));
  std::vector<double> both(6, 9);
  EXPECT_INVALID(call(2, 2, Span<double>(both.data(), 4), Span<double>(both.data() + 3, 2)), "out and lse_out overlap");
  lses.pop_back();
  EXPECT_INVALID(call(2, 2, out, lse), "outs has 2 partials, lses has 1");
  lses.push_back(CSpan<double>(la.data(), 1));
  EXPECT_INVALID(call(2, 2, out, lse), "lses[1] has 1 entries, expected rows=2");

  std::vector<float> so_v(8, 1), sl_v(4, 0), fo_v(4, 9), fl_v(2, 9);
  CSpan<float> so(so_v), sl(sl_v);
  Span<float> fo(fo_v), fl(fl_v);
  EXPECT_INVALID(merge_attention_partials_stacked(so, sl, 3, 2, 2, fo, fl), "outs has 8 entries, expected num_parts*rows*head_dim = 3*2*2 = 12");
  EXPECT_INVALID(merge_attention_partials_stacked(so, sl, -1, 2, 2, fo, fl), "num_parts=-1 is negative");
  EXPECT_INVALID(merge_attention_partials_stacked(so, CSpan<float>(sl_v.data(), 3), 2, 2, 2, fo, fl), "lses has 3 entries");
  EXPECT_INVALID(merge_attention_partials_stacked(so, sl, 2, 2, 2, Span<float>(so_v.data(), 4), fl), "out overlaps the partials");
  EXPECT_EQ(fo_v, std::vector<float>(4, 9));
  EXPECT_EQ(fl_v, std::vector<float>(2, 9));
}
