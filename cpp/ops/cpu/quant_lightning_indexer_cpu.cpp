// CPU twins of the quantised lightning indexer (spec sparse.md 1.2.1):
// torch_npu's npu_quant_lightning_indexer (ascend_cpu) and vllm-ascend's
// _C_ascend::npu_lightning_indexer_quant (ascend_cpu_va). Query and key are int8
// (or float8_e4m3fn), dequantised per (token, head) / per key position:
//   score(t, s) = sum_h w[t, h] * relu(q_scale[t, h] * k_scale[s] * (q_q[t, h] . k_q[s]))
// with the dot product exact (integer for int8) and the rest in fp32; selection
// as the plain indexer (lightning_indexer_cpu.cpp: ties by ascending position).
// Quant modes other than 0 (per token-head) and torch_npu's query_dtype /
// key_dtype are rejected by name.
#include <torch/library.h>

#include "../op_signatures.h"
#include "sparse_common.h"

namespace aar::ops::cpu {
namespace {

bool is_quant_dtype(at::ScalarType t) { return t == at::kChar || t == at::kFloat8_e4m3fn; }

at::Tensor quant_lightning_indexer(const char* op, const at::Tensor& query, const at::Tensor& key,
                                   const at::Tensor& weights, const at::Tensor& query_dequant_scale,
                                   const at::Tensor& key_dequant_scale, int64_t query_quant_mode,
                                   int64_t key_quant_mode, sig::OptT actual_seq_lengths_query,
                                   sig::OptT actual_seq_lengths_key, sig::OptT block_table, sig::Str layout_query,
                                   sig::Str layout_key, int64_t sparse_count, int64_t sparse_mode, int64_t pre_tokens,
                                   int64_t next_tokens) {
  sparse::check_layouts(op, layout_query, layout_key, "layout_key");
  sparse::check_mode_and_tokens(op, sparse_mode, pre_tokens, next_tokens);
  reject_int(op, query_quant_mode, 0, "query_quant_mode");
  reject_int(op, key_quant_mode, 0, "key_quant_mode");
  AAR_CHECK_ARG(sparse_count >= 1, op, ": sparse_count must be >= 1, got ", sparse_count);
  AAR_CHECK_ARG(query.dim() == 3, op, ": query must be (T, n_head, D) for layout \"TND\", got ", query.sizes());
  const int64_t t = query.size(0), heads = query.size(1), d = query.size(2);
  AAR_CHECK_ARG(is_quant_dtype(query.scalar_type()) && key.scalar_type() == query.scalar_type(), op,
                ": query and key must share a quantised dtype (int8 or float8_e4m3fn), got ", query.scalar_type(),
                " and ", key.scalar_type());
  AAR_CHECK_ARG(key.dim() == 4 && key.size(3) == d, op, ": key must be (num_blocks, block_size, 1, D=", d,
                "), got ", key.sizes());
  AAR_CHECK_ARG(weights.dim() == 2 && weights.size(0) == t && weights.size(1) == heads, op,
                ": weights must be (T=", t, ", n_head=", heads, "), got ", weights.sizes());
  AAR_CHECK_ARG(is_float_dtype(weights.scalar_type()), op, ": weights must be float16/bfloat16/float32, got ",
                weights.scalar_type());
  AAR_CHECK_ARG(query_dequant_scale.dim() == 2 && query_dequant_scale.size(0) == t &&
                    query_dequant_scale.size(1) == heads,
                op, ": query_dequant_scale must be (T=", t, ", n_head=", heads, "), got ",
                query_dequant_scale.sizes());
  AAR_CHECK_ARG(is_float_dtype(query_dequant_scale.scalar_type()), op,
                ": query_dequant_scale must be float16/bfloat16/float32, got ", query_dequant_scale.scalar_type());
  AAR_CHECK_ARG(key.dim() == 4 && key_dequant_scale.dim() == 3 && key_dequant_scale.size(0) == key.size(0) &&
                    key_dequant_scale.size(1) == key.size(1) && key_dequant_scale.size(2) == key.size(2),
                op, ": key_dequant_scale must be (num_blocks, block_size, 1) like key ", key.sizes(), ", got ",
                key_dequant_scale.sizes());
  AAR_CHECK_ARG(is_float_dtype(key_dequant_scale.scalar_type()), op,
                ": key_dequant_scale must be float16/bfloat16/float32, got ", key_dequant_scale.scalar_type());
  const sparse::PagedBatch pb = sparse::plan_paged_batch(
      {op, "actual_seq_lengths_query", "actual_seq_lengths_key", "key"}, t, actual_seq_lengths_query,
      actual_seq_lengths_key, block_table, key);
  // int8 x int8 dot products of any realistic D are exact in float64.
  const at::Tensor qd = query.to(at::kDouble), wf = weights.to(at::kFloat);
  const at::Tensor qs = query_dequant_scale.to(at::kFloat);
  const at::Tensor ks = key_dequant_scale.unsqueeze(-1);  // (nb, bs, 1, 1): gathered like a 1-wide cache
  auto scores_of = [&](int64_t b) {
    const int64_t s0 = pb.q_start[b], q = pb.q_len[b];
    const at::Tensor k = sparse::gather_rows(key, pb, b).to(at::kDouble);              // (S, D)
    const at::Tensor sk = sparse::gather_rows(ks, pb, b).to(at::kFloat).squeeze(1);    // (S)
    const at::Tensor dot = at::matmul(qd.narrow(0, s0, q), k.t()).to(at::kFloat);     // (q, H, S)
    const at::Tensor deq = dot.mul_(qs.narrow(0, s0, q).unsqueeze(2)).mul_(sk.view({1, 1, -1}));
    return deq.relu_().mul_(wf.narrow(0, s0, q).unsqueeze(2)).sum(1);                  // (q, S)
  };
  return std::get<0>(sparse::select_top_k(pb, sparse_count, sparse_mode, /*return_value=*/false, scores_of));
}

at::Tensor quant_lightning_indexer_npu(AAR_QUANT_LIGHTNING_INDEXER_NPU_PARAMS) {
  constexpr const char* kOp = "npu_quant_lightning_indexer";
  reject_opt_int(kOp, query_dtype, "query_dtype");
  reject_opt_int(kOp, key_dtype, "key_dtype");
  return quant_lightning_indexer(kOp, query, key, weights, query_dequant_scale, key_dequant_scale, query_quant_mode,
                                 key_quant_mode, actual_seq_lengths_query, actual_seq_lengths_key, block_table,
                                 layout_query, layout_key, sparse_count, sparse_mode, pre_tokens, next_tokens);
}

at::Tensor lightning_indexer_quant_va(AAR_LIGHTNING_INDEXER_QUANT_VA_PARAMS) {
  constexpr int64_t kNoLimit = std::numeric_limits<int64_t>::max();
  return quant_lightning_indexer("_C_ascend::npu_lightning_indexer_quant", query, key, weights, query_dequant_scale,
                                 key_dequant_scale, query_quant_mode, key_quant_mode, actual_seq_lengths_query,
                                 actual_seq_lengths_key, block_table, layout_query, layout_key, sparse_count,
                                 sparse_mode, kNoLimit, kNoLimit);
}

}  // namespace
}  // namespace aar::ops::cpu

TORCH_LIBRARY_IMPL(ascend_cpu, CPU, m) {
  m.impl("npu_quant_lightning_indexer", TORCH_FN(aar::ops::cpu::quant_lightning_indexer_npu));
}

TORCH_LIBRARY_IMPL(ascend_cpu_va, CPU, m) {
  m.impl("npu_lightning_indexer_quant", TORCH_FN(aar::ops::cpu::lightning_indexer_quant_va));
}
