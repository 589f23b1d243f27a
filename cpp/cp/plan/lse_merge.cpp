// LSE merge of attention partials (docs/design/cp.md §7.1, §7.3).
#include "ascend_attn_rt/cp/plan/lse_merge.h"

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>

#include "ascend_attn_rt/errors.h"

namespace aar::plan {
namespace {

template <typename A, typename B>
bool overlap(Span<A> a, CSpan<B> b) {
  if (a.empty() || b.empty()) return false;
  const auto a0 = reinterpret_cast<std::uintptr_t>(a.data()), a1 = a0 + a.size() * sizeof(A);
  const auto b0 = reinterpret_cast<std::uintptr_t>(b.data()), b1 = b0 + b.size() * sizeof(B);
  return a0 < b1 && b0 < a1;
}

void check_shape(int64_t rows, int64_t head_dim) {
  AAR_CHECK_ARG(rows >= 0, "rows=", rows, " is negative");
  AAR_CHECK_ARG(head_dim >= 1, "head_dim=", head_dim, " must be >= 1");
}

template <typename T>
void check_outputs(int64_t rows, int64_t head_dim, Span<T> out, Span<T> lse_out) {
  const uint64_t need = static_cast<uint64_t>(rows) * static_cast<uint64_t>(head_dim);
  AAR_CHECK_ARG(out.size() >= need, "out has room for ", out.size(), " entries, needs rows*head_dim = ", rows,
                "*", head_dim, " = ", need);
  AAR_CHECK_ARG(lse_out.empty() || lse_out.size() >= static_cast<uint64_t>(rows), "lse_out has room for ",
                lse_out.size(), " entries, needs rows=", rows, " (or pass an empty span for no LSE)");
  AAR_CHECK_ARG(!overlap(out, CSpan<T>(lse_out.data(), lse_out.size())), "out and lse_out overlap");
}

// The merge itself; part_out(i, m) / part_lse(i, m) address partial i's row m.
template <typename T, typename OutFn, typename LseFn>
void merge_rows(int64_t num_parts, int64_t rows, int64_t head_dim, OutFn part_out, LseFn part_lse, T* out,
                T* lse_out) {
  constexpr double kNegInf = -std::numeric_limits<double>::infinity();
  for (int64_t m = 0; m < rows; ++m) {
    T* o = out + m * head_dim;
    double mx = kNegInf;
    for (int64_t i = 0; i < num_parts; ++i) {
      const double l = static_cast<double>(part_lse(i, m));
      if (std::isfinite(l) && l > mx) mx = l;  // -inf, +inf and NaN mark empty partials
    }
    for (int64_t d = 0; d < head_dim; ++d) o[d] = T(0);
    if (mx == kNegInf) {
      if (lse_out) lse_out[m] = static_cast<T>(kNegInf);
      continue;
    }
    double sum = 0.0;
    for (int64_t i = 0; i < num_parts; ++i) {
      const double l = static_cast<double>(part_lse(i, m));
      if (std::isfinite(l)) sum += std::exp(l - mx);
    }
    const double total = mx + std::log(sum);  // sum >= 1: the maximum contributes exp(0)
    for (int64_t i = 0; i < num_parts; ++i) {
      const double l = static_cast<double>(part_lse(i, m));
      if (!std::isfinite(l)) continue;  // never touch an empty partial's output
      const T w = static_cast<T>(std::exp(l - total));
      const T* src = part_out(i, m);
      for (int64_t d = 0; d < head_dim; ++d) o[d] += w * src[d];
    }
    if (lse_out) lse_out[m] = static_cast<T>(total);
  }
}

template <typename T>
void merge_list(CSpan<CSpan<T>> outs, CSpan<CSpan<T>> lses, int64_t rows, int64_t head_dim, Span<T> out,
                Span<T> lse_out) {
  check_shape(rows, head_dim);
  AAR_CHECK_ARG(outs.size() == lses.size(), "outs has ", outs.size(), " partials, lses has ", lses.size());
  const uint64_t need = static_cast<uint64_t>(rows) * static_cast<uint64_t>(head_dim);
  for (std::size_t i = 0; i < outs.size(); ++i) {
    AAR_CHECK_ARG(outs[i].size() == need, "outs[", i, "] has ", outs[i].size(),
                  " entries, expected rows*head_dim = ", rows, "*", head_dim, " = ", need);
    AAR_CHECK_ARG(lses[i].size() == static_cast<uint64_t>(rows), "lses[", i, "] has ", lses[i].size(),
                  " entries, expected rows=", rows);
  }
  check_outputs(rows, head_dim, out, lse_out);
  for (std::size_t i = 0; i < outs.size(); ++i) {
    AAR_CHECK_ARG(!overlap(out, outs[i]) && !overlap(out, lses[i]), "out overlaps partial ", i,
                  " (the merge does not work in place)");
    AAR_CHECK_ARG(!overlap(lse_out, outs[i]) && !overlap(lse_out, lses[i]), "lse_out overlaps partial ", i,
                  " (the merge does not work in place)");
  }
  merge_rows<T>(
      static_cast<int64_t>(outs.size()), rows, head_dim,
      [&](int64_t i, int64_t m) { return outs[i].data() + m * head_dim; },
      [&](int64_t i, int64_t m) { return lses[i][m]; }, out.data(), lse_out.empty() ? nullptr : lse_out.data());
}

template <typename T>
void merge_stacked(CSpan<T> outs, CSpan<T> lses, int32_t num_parts, int64_t rows, int64_t head_dim, Span<T> out,
                   Span<T> lse_out) {
  check_shape(rows, head_dim);
  AAR_CHECK_ARG(num_parts >= 0, "num_parts=", num_parts, " is negative");
  const uint64_t per = static_cast<uint64_t>(rows) * static_cast<uint64_t>(head_dim);
  AAR_CHECK_ARG(outs.size() == per * num_parts, "outs has ", outs.size(),
                " entries, expected num_parts*rows*head_dim = ", num_parts, "*", rows, "*", head_dim, " = ",
                per * num_parts);
  AAR_CHECK_ARG(lses.size() == static_cast<uint64_t>(rows) * num_parts, "lses has ", lses.size(),
                " entries, expected num_parts*rows = ", num_parts, "*", rows);
  check_outputs(rows, head_dim, out, lse_out);
  AAR_CHECK_ARG(!overlap(out, outs) && !overlap(out, lses), "out overlaps the partials (the merge does not work in place)");
  AAR_CHECK_ARG(!overlap(lse_out, outs) && !overlap(lse_out, lses),
                "lse_out overlaps the partials (the merge does not work in place)");
  merge_rows<T>(
      num_parts, rows, head_dim, [&](int64_t i, int64_t m) { return outs.data() + (i * rows + m) * head_dim; },
      [&](int64_t i, int64_t m) { return lses[i * rows + m]; }, out.data(),
      lse_out.empty() ? nullptr : lse_out.data());
}

}  // namespace

void merge_attention_partials(CSpan<CSpan<float>> outs, CSpan<CSpan<float>> lses, int64_t rows, int64_t head_dim,
                              Span<float> out, Span<float> lse_out) {
  merge_list<float>(outs, lses, rows, head_dim, out, lse_out);
}
void merge_attention_partials(CSpan<CSpan<double>> outs, CSpan<CSpan<double>> lses, int64_t rows,
                              int64_t head_dim, Span<double> out, Span<double> lse_out) {
  merge_list<double>(outs, lses, rows, head_dim, out, lse_out);
}
void merge_attention_partials_stacked(CSpan<float> outs, CSpan<float> lses, int32_t num_parts, int64_t rows,
                                      int64_t head_dim, Span<float> out, Span<float> lse_out) {
  merge_stacked<float>(outs, lses, num_parts, rows, head_dim, out, lse_out);
}
void merge_attention_partials_stacked(CSpan<double> outs, CSpan<double> lses, int32_t num_parts, int64_t rows,
                                      int64_t head_dim, Span<double> out, Span<double> lse_out) {
  merge_stacked<double>(outs, lses, num_parts, rows, head_dim, out, lse_out);
}

}  // namespace aar::plan
