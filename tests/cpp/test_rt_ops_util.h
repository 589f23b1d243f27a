// Shared helpers for the ops-layer tests: an independent float64 attention
// reference (explicit boolean mask, per-head loops) and a paged-cache builder.
#pragma once

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "ascend_attn_rt/errors.h"

namespace aar_test {

constexpr int64_t kIntMax = 2147483647;

// Allowed(i, j) for query row i of Sq, key j of Skv (right-down aligned), written out
// independently of the twin.
inline bool ref_allowed(int mode, int64_t i, int64_t j, int64_t sq, int64_t skv, int64_t pre, int64_t next) {
  const int64_t p = i + skv - sq;
  if (mode == 0) return true;
  if (mode == 3) return j <= p;
  return j >= p - pre && j <= p + next;  // mode 4: inclusive band
}

struct RefResult {
  at::Tensor out;  // (Sq, N, Dv) double
  at::Tensor lse;  // (Sq, N) double
};

// q (Sq, N, D), k (Skv, Nkv, D), v (Skv, Nkv, Dv): any dtype, computed in float64.
inline RefResult ref_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int mode, int64_t pre,
                               int64_t next, double scale, const std::vector<double>& sink = {}) {
  const int64_t sq = q.size(0), n = q.size(1), skv = k.size(0), nkv = k.size(1), dv = v.size(2);
  const int64_t g = n / nkv;
  const at::Tensor qd = q.to(at::kDouble), kd = k.to(at::kDouble), vd = v.to(at::kDouble);
  RefResult r{at::zeros({sq, n, dv}, at::kDouble),
              at::full({sq, n}, -std::numeric_limits<double>::infinity(), at::kDouble)};
  for (int64_t h = 0; h < n; ++h) {
    const int64_t kvh = h / g;
    const at::Tensor s = at::matmul(qd.select(1, h), kd.select(1, kvh).t()).mul(scale).contiguous();  // (Sq, Skv)
    const auto sa = s.accessor<double, 2>();
    for (int64_t i = 0; i < sq; ++i) {
      double m = -std::numeric_limits<double>::infinity();
      bool any = false;
      for (int64_t j = 0; j < skv; ++j) {
        if (ref_allowed(mode, i, j, sq, skv, pre, next)) {
          m = std::max(m, sa[i][j]);
          any = true;
        }
      }
      const bool has_sink = !sink.empty();
      if (has_sink) m = std::max(m, sink[h]);
      if (!any && !has_sink) continue;  // output 0, lse -inf
      at::Tensor w = at::zeros({skv}, at::kDouble);
      auto wa = w.accessor<double, 1>();
      double z = has_sink ? std::exp(sink[h] - m) : 0.0;
      for (int64_t j = 0; j < skv; ++j) {
        if (ref_allowed(mode, i, j, sq, skv, pre, next)) {
          wa[j] = std::exp(sa[i][j] - m);
          z += wa[j];
        }
      }
      r.out[i][h].copy_(at::matmul(w, vd.select(1, kvh)) / z);
      r.lse[i][h] = m + std::log(z);
    }
  }
  return r;
}

inline void expect_close(const at::Tensor& got, const at::Tensor& want, double tol, const std::string& what) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  const at::Tensor g = got.to(at::kDouble), w = want.to(at::kDouble);
  const at::Tensor finite = at::isfinite(w);
  // -inf must match -inf (rows without keys); finite values within tolerance.
  EXPECT_TRUE(at::equal(at::isfinite(g), finite)) << what << ": non-finite pattern differs";
  const at::Tensor diff = (g - w).abs().masked_fill(finite.logical_not(), 0.0);
  const at::Tensor bound = w.abs().masked_fill(finite.logical_not(), 0.0) * tol + tol;
  const double worst = (diff - bound).max().item<double>();
  EXPECT_LE(worst, 0.0) << what << ": max abs diff " << diff.max().item<double>() << " (tol " << tol << ")";
}

inline double tol_for(at::ScalarType t) { return t == at::kFloat ? 1e-5 : 1e-2; }

// Paged caches (nb, bs, Nkv, D) holding per-request K/V at shuffled block ids;
// unused slots hold random garbage so a wrong gather shows.
struct PagedKv {
  at::Tensor key_cache, value_cache;  // (nb, bs, Nkv, D)
  at::Tensor block_table;             // (B, max_blocks) int32
};

inline PagedKv make_paged(const std::vector<at::Tensor>& ks, const std::vector<at::Tensor>& vs, int64_t bs,
                          uint32_t seed, int64_t extra_blocks = 3, int64_t extra_cols = 1) {
  const int64_t b = static_cast<int64_t>(ks.size());
  const int64_t nkv = ks[0].size(1), d = ks[0].size(2), dv = vs[0].size(2);
  std::vector<int64_t> need(b);
  int64_t total = 0, most = 0;
  for (int64_t i = 0; i < b; ++i) {
    need[i] = (ks[i].size(0) + bs - 1) / bs;
    total += need[i];
    most = std::max(most, need[i]);
  }
  const int64_t nb = total + extra_blocks;
  std::vector<int32_t> ids(nb);
  std::iota(ids.begin(), ids.end(), 0);
  std::mt19937 rng(seed);
  std::shuffle(ids.begin(), ids.end(), rng);
  PagedKv p;
  p.key_cache = at::randn({nb, bs, nkv, d}).to(ks[0].scalar_type());
  p.value_cache = at::randn({nb, bs, nkv, dv}).to(vs[0].scalar_type());
  p.block_table = at::zeros({b, most + extra_cols}, at::kInt);
  auto bt = p.block_table.accessor<int32_t, 2>();
  int64_t next = 0;
  for (int64_t i = 0; i < b; ++i) {
    for (int64_t blk = 0; blk < need[i]; ++blk) bt[i][blk] = ids[next++];
    for (int64_t j = 0; j < ks[i].size(0); ++j) {
      const int64_t id = bt[i][j / bs];
      p.key_cache[id][j % bs].copy_(ks[i][j]);
      p.value_cache[id][j % bs].copy_(vs[i][j]);
    }
  }
  return p;
}

template <class Ex>
void expect_throw_with(const std::function<void()>& fn, const std::string& needle) {
  try {
    fn();
    ADD_FAILURE() << "expected an exception mentioning '" << needle << "'";
  } catch (const Ex& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
        << "message '" << e.what() << "' does not mention '" << needle << "'";
  } catch (const std::exception& e) {
    ADD_FAILURE() << "wrong exception type; message: " << e.what();
  }
}

inline std::vector<int64_t> cumsum(const std::vector<int64_t>& v) {
  std::vector<int64_t> r(v.size());
  std::partial_sum(v.begin(), v.end(), r.begin());
  return r;
}

}  // namespace aar_test
