// Internal: shared pieces of the sparse-attention CPU twins (lightning indexer,
// sparse flash attention and their quantised forms; docs/design/sparse.md §4, §5, docs/design/ops.md §4.6):
// validation of the TND / PA_BSND batch (lengths arrive as int32 tensors),
// paged row gathers, top-k selection and the SFA scan-rule attention.
#pragma once

#include <ATen/ATen.h>
#include <c10/util/string_view.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <tuple>
#include <vector>

#include "attention_reference.h"

namespace aar::ops::cpu::sparse {

// Layouts: query "TND", key/value "PA_BSND" only (BSND / TND keys: NotSupported).
void check_layouts(const char* op, c10::string_view layout_query, c10::string_view layout_kv,
                   const char* layout_kv_name);
// sparse_mode 0 or 3; pre_tokens / next_tokens at their INT64_MAX defaults only.
void check_mode_and_tokens(const char* op, int64_t sparse_mode, int64_t pre_tokens, int64_t next_tokens);

// A validated TND query batch over a paged cache (nb, bs, 1, W).
struct PagedBatch {
  int64_t batch = 0, tokens = 0, block_size = 0, num_blocks = 0;
  std::vector<int64_t> q_start, q_len, kv_len;  // per request; kv_len = cache rows (compressed when cmp_ratio > 1)
  at::Tensor block_table;                       // (B, max_blocks) int32, CPU
  // DSV4 compressed keys (docs/design/dsa.md §1.3): the lengths tensor holds the RAW
  // lengths raw_kv_len[b]; the cache holds kv_len[b] = floor(raw / cmp_ratio) rows.
  int64_t cmp_ratio = 1;
  std::vector<int64_t> raw_kv_len;
};

struct PagedNames {
  const char* op;
  const char* q_lens;   // "actual_seq_lengths_query"
  const char* kv_lens;  // "actual_seq_lengths_key" / "actual_seq_lengths_kv"
  const char* cache;    // "key"
};

// Checks the lengths (int32 1-D CPU tensors of one length B: cumulative query
// ends, non-decreasing and ending at `tokens`; KV lengths >= 0), the cache
// ((nb, bs, 1, W), one KV head) and the block table (int32 (B, >= ceil(S_b/bs))
// with every block a request reads in [0, nb)). With cmp_ratio > 1 (>= 1, the
// caller checks it) the KV lengths are raw token counts and the cache and block
// table hold floor(S_b / cmp_ratio) compressed rows per request.
PagedBatch plan_paged_batch(const PagedNames& nm, int64_t tokens, const std::optional<at::Tensor>& q_lens,
                            const std::optional<at::Tensor>& kv_lens, const std::optional<at::Tensor>& block_table,
                            const at::Tensor& cache, int64_t cmp_ratio = 1);

// The S_b token rows (S_b, W) of request b, read through its block table row:
// token s at block_table[b][s / bs], offset s % bs. Same dtype as the cache.
at::Tensor gather_rows(const at::Tensor& cache, const PagedBatch& pb, int64_t b);

// Visible keys (indexer) / threshold (SFA) of row i of a request with q query
// and S KV tokens: S - q + i + 1 under sparse_mode 3, S under sparse_mode 0.
inline int64_t visible(int64_t sparse_mode, int64_t kv_len, int64_t q_len, int64_t row) {
  return sparse_mode == 3 ? kv_len - q_len + row + 1 : kv_len;
}

// Visible cache rows of row i of request b: visible() over the raw lengths,
// divided by cmp_ratio rounding down (<= 0: none), at most kv_len[b].
int64_t visible_rows(const PagedBatch& pb, int64_t sparse_mode, int64_t b, int64_t row);

// Lightning-indexer selection. `scores_of(b)` returns request b's fp32 scores
// (q_len[b], kv_len[b]). Each row emits the top min(K, vis) positions of
// [0, vis) (vis = visible_rows) by descending score, ties by ascending position
// (NaN below -inf), then -1; all -1 when vis <= 0. Returns (indices (T, 1, K) int32, values
// (T, 1, K) fp32 with -inf at -1 entries, or an empty fp32 tensor).
std::tuple<at::Tensor, at::Tensor> select_top_k(const PagedBatch& pb, int64_t sparse_count, int64_t sparse_mode,
                                                bool return_value,
                                                const std::function<at::Tensor(int64_t)>& scores_of);

// Checks sparse_indices: int32 (T, 1, K), K >= 1, CPU.
void check_sparse_indices(const char* op, const at::Tensor& sparse_indices, int64_t tokens);

// One request's K/V for the SFA scan: fp32 rows (S, Dn), (S, R) or undefined,
// (S, Dv).
struct SfaKv {
  at::Tensor k_nope, k_rope, v;
};

// Sparse flash attention with the scan rule of docs/design/sparse.md §5 over q_nope (T, N, Dn)
// fp32 and q_rope (T, N, R) fp32 or undefined; V is v_dim wide. Returns (out (T, N, Dv) in
// out_dtype, softmax_max (1, T, N), softmax_sum (1, T, N)) or, without LSE, two
// empty fp32 tensors. Rows with an empty selection: out 0, max -inf, sum 0.
std::tuple<at::Tensor, at::Tensor, at::Tensor> sfa_scan_attention(
    const char* op, const PagedBatch& pb, const at::Tensor& q_nope, const at::Tensor& q_rope,
    const at::Tensor& sparse_indices, double scale, int64_t sparse_mode, int64_t sparse_block_size,
    int64_t v_dim, at::ScalarType out_dtype, bool want_lse, const std::function<SfaKv(int64_t)>& kv_of);

}  // namespace aar::ops::cpu::sparse
