// CPU twins of npu_lightning_indexer: torch_npu's (namespace ascend_cpu) and
// vllm-ascend's _C_ascend one (ascend_cpu_va); same arguments, same semantics
// (docs/design/sparse.md §4, docs/design/ops.md §4.6). For request b, row i: every visible key
// position s < vis (vis = S_b - q_b + i + 1 under sparse_mode 3, S_b under 0)
// gets score = sum_h w[t, h] * relu(q[t, h] . k[s]) in fp32, k read through
// block_table[b][s / bs] at offset s % bs; the row lists the top min(K, vis)
// positions by descending score, TIES BY ASCENDING POSITION (the kernel's tie
// order is unspecified; this is our documented choice), then -1; a row with
// vis <= 0 is all -1. Positions are within the request, not cache slots.
// layout_query "TND" / layout_key "PA_BSND" only, one key head.
#include <torch/library.h>

#include "../op_signatures.h"
#include "sparse_common.h"

namespace aar::ops::cpu {
namespace {

std::tuple<at::Tensor, at::Tensor> lightning_indexer(const char* op, AAR_LIGHTNING_INDEXER_PARAMS) {
  sparse::check_layouts(op, layout_query, layout_key, "layout_key");
  sparse::check_mode_and_tokens(op, sparse_mode, pre_tokens, next_tokens);
  AAR_CHECK_ARG(sparse_count >= 1, op, ": sparse_count must be >= 1, got ", sparse_count);
  AAR_CHECK_ARG(query.dim() == 3, op, ": query must be (T, n_head, D) for layout \"TND\", got ", query.sizes());
  const int64_t t = query.size(0), heads = query.size(1), d = query.size(2);
  AAR_CHECK_ARG(is_float_dtype(query.scalar_type()) && key.scalar_type() == query.scalar_type(), op,
                ": query and key must share a float dtype (float32/float16/bfloat16), got ", query.scalar_type(),
                " and ", key.scalar_type());
  AAR_CHECK_ARG(key.dim() == 4 && key.size(3) == d, op, ": key must be (num_blocks, block_size, 1, D=", d,
                "), got ", key.sizes());
  AAR_CHECK_ARG(weights.dim() == 2 && weights.size(0) == t && weights.size(1) == heads, op,
                ": weights must be (T=", t, ", n_head=", heads, "), got ", weights.sizes());
  AAR_CHECK_ARG(is_float_dtype(weights.scalar_type()), op, ": weights must be float32/float16/bfloat16, got ",
                weights.scalar_type());
  const sparse::PagedBatch pb = sparse::plan_paged_batch(
      {op, "actual_seq_lengths_query", "actual_seq_lengths_key", "key"}, t, actual_seq_lengths_query,
      actual_seq_lengths_key, block_table, key);
  const at::Tensor qf = query.to(at::kFloat), wf = weights.to(at::kFloat);
  auto scores_of = [&](int64_t b) {
    const at::Tensor k = sparse::gather_rows(key, pb, b).to(at::kFloat);  // (S, D)
    const at::Tensor q = qf.narrow(0, pb.q_start[b], pb.q_len[b]);        // (q, H, D)
    const at::Tensor w = wf.narrow(0, pb.q_start[b], pb.q_len[b]);        // (q, H)
    return at::matmul(q, k.t()).relu_().mul_(w.unsqueeze(2)).sum(1);      // (q, S)
  };
  return sparse::select_top_k(pb, sparse_count, sparse_mode, return_value, scores_of);
}

std::tuple<at::Tensor, at::Tensor> lightning_indexer_npu(AAR_LIGHTNING_INDEXER_PARAMS) {
  return lightning_indexer("npu_lightning_indexer", query, key, weights, actual_seq_lengths_query,
                           actual_seq_lengths_key, block_table, layout_query, layout_key, sparse_count, sparse_mode,
                           pre_tokens, next_tokens, return_value);
}

std::tuple<at::Tensor, at::Tensor> lightning_indexer_va(AAR_LIGHTNING_INDEXER_PARAMS) {
  return lightning_indexer("_C_ascend::npu_lightning_indexer", query, key, weights, actual_seq_lengths_query,
                           actual_seq_lengths_key, block_table, layout_query, layout_key, sparse_count, sparse_mode,
                           pre_tokens, next_tokens, return_value);
}

}  // namespace
}  // namespace aar::ops::cpu

TORCH_LIBRARY_IMPL(ascend_cpu, CPU, m) {
  m.impl("npu_lightning_indexer", TORCH_FN(aar::ops::cpu::lightning_indexer_npu));
}

TORCH_LIBRARY_IMPL(ascend_cpu_va, CPU, m) {
  m.impl("npu_lightning_indexer", TORCH_FN(aar::ops::cpu::lightning_indexer_va));
}
