#include "sparse_common.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>

namespace aar::ops::cpu::sparse {

namespace {

constexpr int64_t kNoLimit = std::numeric_limits<int64_t>::max();

std::vector<int64_t> read_int32_lengths(const char* op, const std::optional<at::Tensor>& t, const char* name,
                                        const char* why) {
  if (!t.has_value() || !t->defined()) {
    throw_invalid(op, ": ", name, " is required (", why, ")");
  }
  AAR_CHECK_ARG(t->scalar_type() == at::kInt, op, ": ", name, " must be int32, got ", t->scalar_type());
  AAR_CHECK_ARG(t->dim() == 1, op, ": ", name, " must be 1-D (batch), got shape ", t->sizes());
  AAR_CHECK_ARG(t->device().is_cpu(), op, ": the CPU twin needs ", name, " on the CPU, got ", t->device());
  const at::Tensor c = t->contiguous();
  const int32_t* p = c.data_ptr<int32_t>();
  return std::vector<int64_t>(p, p + c.numel());
}

}  // namespace

void check_layouts(const char* op, c10::string_view layout_query, c10::string_view layout_kv,
                   const char* layout_kv_name) {
  if (layout_query != "TND") {
    throw_not_supported(op, ": not supported by the CPU twin: layout_query=\"", layout_query, "\" (only \"TND\")");
  }
  if (layout_kv != "PA_BSND") {
    throw_not_supported(op, ": not supported by the CPU twin: ", layout_kv_name, "=\"", layout_kv,
                        "\" (only \"PA_BSND\", the paged cache)");
  }
}

void check_mode_and_tokens(const char* op, int64_t sparse_mode, int64_t pre_tokens, int64_t next_tokens) {
  if (sparse_mode != 0 && sparse_mode != 3) {
    throw_not_supported(op, ": not supported: sparse_mode=", sparse_mode, " (only 0 and 3)");
  }
  if (pre_tokens != kNoLimit) {
    throw_not_supported(op, ": not supported by the CPU twin: pre_tokens=", pre_tokens, " (only ", kNoLimit, ")");
  }
  if (next_tokens != kNoLimit) {
    throw_not_supported(op, ": not supported by the CPU twin: next_tokens=", next_tokens, " (only ", kNoLimit, ")");
  }
}

PagedBatch plan_paged_batch(const PagedNames& nm, int64_t tokens, const std::optional<at::Tensor>& q_lens,
                            const std::optional<at::Tensor>& kv_lens, const std::optional<at::Tensor>& block_table,
                            const at::Tensor& cache, int64_t cmp_ratio) {
  const char* op = nm.op;
  AAR_CHECK_ARG(cache.dim() == 4, op, ": ", nm.cache, " must be the paged cache (num_blocks, block_size, 1, D), got ",
                cache.sizes());
  if (cache.size(2) != 1) {
    throw_not_supported(op, ": not supported: ", nm.cache, " with ", cache.size(2),
                        " KV heads (shape ", cache.sizes(), "); only 1");
  }
  AAR_CHECK_ARG(cache.size(1) >= 1, op, ": ", nm.cache, " block size must be positive, got ", cache.sizes());
  AAR_CHECK_ARG(cache.device().is_cpu(), op, ": the CPU twin needs ", nm.cache, " on the CPU, got ",
                cache.device());
  PagedBatch pb;
  pb.tokens = tokens;
  pb.block_size = cache.size(1);
  pb.num_blocks = cache.size(0);
  const std::vector<int64_t> ends =
      read_int32_lengths(op, q_lens, nm.q_lens, "cumulative query ends, layout_query \"TND\"");
  pb.kv_len = read_int32_lengths(op, kv_lens, nm.kv_lens, "per-request KV lengths of the paged cache");
  AAR_CHECK_ARG(ends.size() == pb.kv_len.size(), op, ": ", nm.q_lens, " has ", ends.size(), " entries but ",
                nm.kv_lens, " has ", pb.kv_len.size(), " (one per request each)");
  pb.batch = static_cast<int64_t>(ends.size());
  AAR_CHECK_ARG(pb.batch >= 1, op, ": ", nm.q_lens, " is empty (at least one request)");
  cumulative_to_ranges(op, nm.q_lens, ends, tokens, "the query's token count T", pb.q_start, pb.q_len);
  if (!block_table.has_value() || !block_table->defined()) {
    throw_invalid(op, ": block_table is required (layout \"PA_BSND\" reads the cache through it)");
  }
  pb.cmp_ratio = cmp_ratio;
  pb.raw_kv_len = pb.kv_len;
  std::string rows_name = nm.kv_lens;
  if (cmp_ratio != 1) {
    for (size_t b = 0; b < pb.kv_len.size(); ++b) {
      AAR_CHECK_ARG(pb.kv_len[b] >= 0, op, ": ", nm.kv_lens, "[", b, "]=", pb.kv_len[b], " is negative");
      pb.kv_len[b] /= cmp_ratio;
    }
    rows_name = std::string("the compressed row count floor(") + nm.kv_lens + " / cmp_ratio=" +
                std::to_string(cmp_ratio) + ")";
  }
  check_block_table(op, *block_table, pb.batch, pb.kv_len, pb.block_size, pb.num_blocks, rows_name.c_str());
  pb.block_table = *block_table;
  return pb;
}

at::Tensor gather_rows(const at::Tensor& cache, const PagedBatch& pb, int64_t b) {
  const int64_t s = pb.kv_len[b];
  const int64_t nblk = (s + pb.block_size - 1) / pb.block_size;
  const at::Tensor ids = pb.block_table.select(0, b).narrow(0, 0, nblk).to(at::kLong);
  return cache.index_select(0, ids).reshape({nblk * pb.block_size, cache.size(3)}).narrow(0, 0, s);
}

int64_t visible_rows(const PagedBatch& pb, int64_t sparse_mode, int64_t b, int64_t row) {
  const int64_t raw = visible(sparse_mode, pb.raw_kv_len[b], pb.q_len[b], row);
  if (raw <= 0) return 0;
  return std::min(raw / pb.cmp_ratio, pb.kv_len[b]);
}

std::tuple<at::Tensor, at::Tensor> select_top_k(const PagedBatch& pb, int64_t sparse_count, int64_t sparse_mode,
                                                bool return_value,
                                                const std::function<at::Tensor(int64_t)>& scores_of) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const int64_t k = sparse_count;
  at::Tensor indices = at::full({pb.tokens, 1, k}, -1, at::kInt);
  at::Tensor values = return_value ? at::full({pb.tokens, 1, k}, kNegInf, at::kFloat) : at::empty({0}, at::kFloat);
  int32_t* idx = indices.data_ptr<int32_t>();
  float* val = return_value ? values.data_ptr<float>() : nullptr;
  std::vector<int32_t> order;
  for (int64_t b = 0; b < pb.batch; ++b) {
    const int64_t q = pb.q_len[b], s = pb.kv_len[b];
    if (q == 0) continue;
    const at::Tensor sc = scores_of(b).contiguous();  // (q, s) fp32
    const float* base = sc.data_ptr<float>();
    for (int64_t i = 0; i < q; ++i) {
      const int64_t vis = visible_rows(pb, sparse_mode, b, i);
      if (vis <= 0) continue;  // the whole row stays -1
      const float* row = base + i * s;
      // Descending score, ties by ascending position; NaN sorts below every number.
      auto before = [row](int32_t a, int32_t c) {
        const float x = row[a], y = row[c];
        const bool xn = std::isnan(x), yn = std::isnan(y);
        if (xn != yn) return yn;
        if (!xn && x != y) return x > y;
        return a < c;
      };
      order.resize(vis);
      std::iota(order.begin(), order.end(), 0);
      const int64_t n = std::min(k, vis);
      std::partial_sort(order.begin(), order.begin() + n, order.end(), before);
      int32_t* out = idx + (pb.q_start[b] + i) * k;
      std::copy(order.begin(), order.begin() + n, out);
      if (val != nullptr) {
        float* vout = val + (pb.q_start[b] + i) * k;
        for (int64_t j = 0; j < n; ++j) vout[j] = row[order[j]];
      }
    }
  }
  return {indices, values};
}

void check_sparse_indices(const char* op, const at::Tensor& sparse_indices, int64_t tokens) {
  AAR_CHECK_ARG(sparse_indices.scalar_type() == at::kInt, op, ": sparse_indices must be int32, got ",
                sparse_indices.scalar_type());
  AAR_CHECK_ARG(sparse_indices.dim() == 3 && sparse_indices.size(0) == tokens, op,
                ": sparse_indices must be (T=", tokens, ", 1, K), got ", sparse_indices.sizes());
  if (sparse_indices.size(1) != 1) {
    throw_not_supported(op, ": not supported: sparse_indices with ", sparse_indices.size(1),
                        " KV heads (shape ", sparse_indices.sizes(), "); only 1");
  }
  AAR_CHECK_ARG(sparse_indices.size(2) >= 1, op, ": sparse_indices must select K >= 1 entries per row, got ",
                sparse_indices.sizes());
  AAR_CHECK_ARG(sparse_indices.device().is_cpu(), op, ": the CPU twin needs sparse_indices on the CPU, got ",
                sparse_indices.device());
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> sfa_scan_attention(
    const char* op, const PagedBatch& pb, const at::Tensor& q_nope, const at::Tensor& q_rope,
    const at::Tensor& sparse_indices, double scale, int64_t sparse_mode, int64_t sparse_block_size,
    int64_t v_dim, at::ScalarType out_dtype, bool want_lse, const std::function<SfaKv(int64_t)>& kv_of) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  const int64_t t_total = q_nope.size(0), n = q_nope.size(1);
  const int64_t k = sparse_indices.size(2), sbs = sparse_block_size;
  const at::Tensor ind = sparse_indices.contiguous();
  const int32_t* ip = ind.data_ptr<int32_t>();
  at::Tensor out = at::zeros({t_total, n, v_dim}, at::kFloat);
  at::Tensor smax = at::full({1, t_total, n}, kNegInf, at::kFloat);
  at::Tensor ssum = at::zeros({1, t_total, n}, at::kFloat);
  std::vector<int64_t> toks;
  for (int64_t b = 0; b < pb.batch; ++b) {
    const int64_t q = pb.q_len[b], s = pb.kv_len[b];
    if (q == 0) continue;
    const SfaKv kv = kv_of(b);
    for (int64_t i = 0; i < q; ++i) {
      const int64_t t = pb.q_start[b] + i;
      const int64_t th = visible(sparse_mode, s, q, i);
      toks.clear();
      if (th > 0) {
        const int64_t valid = std::min(k, (th + sbs - 1) / sbs);
        const int32_t* row = ip + t * k;
        for (int64_t j = 0; j < valid; ++j) {
          const int64_t idx = row[j];
          if (idx == -1) break;  // the scan stops at the first -1
          AAR_CHECK_ARG(idx >= 0, op, ": sparse_indices[", t, ", 0, ", j, "]=", idx,
                        " is negative and not the -1 end marker");
          const int64_t first = idx * sbs;
          if (first >= th) continue;  // beyond the row's threshold: skipped
          for (int64_t p = first; p < std::min(first + sbs, th); ++p) toks.push_back(p);
        }
      }
      if (toks.empty()) continue;  // out 0, max -inf, sum 0
      const at::Tensor sel = at::tensor(toks, at::kLong);
      at::Tensor logits = at::matmul(q_nope[t], kv.k_nope.index_select(0, sel).t());  // (N, M)
      if (q_rope.defined()) logits.add_(at::matmul(q_rope[t], kv.k_rope.index_select(0, sel).t()));
      logits.mul_(scale);
      const at::Tensor m = std::get<0>(logits.max(1, /*keepdim=*/true));  // (N, 1)
      const at::Tensor e = (logits - m).exp_();
      const at::Tensor z = e.sum(1, /*keepdim=*/true);
      out[t].copy_(at::matmul(e, kv.v.index_select(0, sel)).div_(z));
      smax[0][t].copy_(m.squeeze(1));
      ssum[0][t].copy_(z.squeeze(1));
    }
  }
  if (!want_lse) return {out.to(out_dtype), at::empty({0}, at::kFloat), at::empty({0}, at::kFloat)};
  return {out.to(out_dtype), smax, ssum};
}

}  // namespace aar::ops::cpu::sparse
