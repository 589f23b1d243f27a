// CPU twins of the quantised lightning indexer (docs/design/sparse.md §4):
// torch_npu's npu_quant_lightning_indexer (ascend_cpu) and vllm-ascend's
// _C_ascend::npu_lightning_indexer_quant (ascend_cpu_va). Query and key are int8
// (or float8_e4m3fn), dequantised per (token, head) / per key position:
//   score(t, s) = sum_h w[t, h] * relu(q_scale[t, h] * k_scale[s] * (q_q[t, h] . k_q[s]))
// with the dot product exact (integer for int8) and the rest in fp32; selection
// as the plain indexer (lightning_indexer_cpu.cpp: ties by ascending position).
// Quant modes other than 0 (per token-head) and torch_npu's query_dtype /
// key_dtype are rejected by name.
//
// Also the DeepSeek-V4 _C_ascend::npu_vllm_quant_lightning_indexer (docs/design/dsa.md §1.3
// , docs/design/ops.md §4.6): the same score over the request's COMPRESSED key rows. With raw
// KV length S_b (actual_seq_lengths_key) request b has floor(S_b / cmp_ratio)
// cache rows (read through block_table, which must cover them), and row i of
// q_b sees rows c < floor((S_b - q_b + i + 1) / cmp_ratio) (sparse_mode 3) or
// c < floor(S_b / cmp_ratio) (sparse_mode 0). Outputs: (sparse_indices
// (T, 1, K) int32 compressed-row ids, sparse_values: with return_value the
// selected fp32 scores, -inf at -1 entries (the plain indexer twin's
// convention), else an empty fp32 tensor). cmp_ratio must be >= 1. `metadata`,
// when given, must be the (1024,) int32 blob; it is not read (device tiling).
//
// npu_vllm_quant_lightning_indexer_metadata returns a deterministic (1024,)
// int32 blob that is OPAQUE: nothing reads it on CPU. Its layout, for debugging
// only: [0] 0x514C494D ("QLIM"), [1] 1 (version), [2..6] num_heads_q,
// num_heads_k, head_dim, query_quant_mode, key_quant_mode, [7..9] batch_size,
// max_seqlen_q, max_seqlen_k, [10..12] sparse_count, sparse_mode, cmp_ratio,
// [13] actual_seq_lengths_query's last entry or -1, [14] the sum of
// actual_seq_lengths_key or -1; the rest 0. The arguments are validated as the
// indexer validates them (quant modes 0, layouts "TND"/"PA_BSND", sparse_mode 0
// or 3, default pre/next_tokens, sparse_count >= 1, cmp_ratio >= 1, lengths
// int32 1-D of batch_size entries, query ends non-decreasing, key lengths >= 0);
// `device` is not interpreted.
#include <torch/library.h>

#include <limits>
#include <vector>

#include "../op_signatures.h"
#include "sparse_common.h"

namespace aar::ops::cpu {
namespace {

bool is_quant_dtype(at::ScalarType t) { return t == at::kChar || t == at::kFloat8_e4m3fn; }

std::tuple<at::Tensor, at::Tensor> quant_lightning_indexer(const char* op, const at::Tensor& query, const at::Tensor& key,
                                   const at::Tensor& weights, const at::Tensor& query_dequant_scale,
                                   const at::Tensor& key_dequant_scale, int64_t query_quant_mode,
                                   int64_t key_quant_mode, sig::OptT actual_seq_lengths_query,
                                   sig::OptT actual_seq_lengths_key, sig::OptT block_table, sig::Str layout_query,
                                   sig::Str layout_key, int64_t sparse_count, int64_t sparse_mode, int64_t pre_tokens,
                                   int64_t next_tokens, int64_t cmp_ratio = 1, bool return_value = false) {
  AAR_CHECK_ARG(cmp_ratio >= 1, op, ": cmp_ratio must be >= 1, got ", cmp_ratio);
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
      actual_seq_lengths_key, block_table, key, cmp_ratio);
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
  return sparse::select_top_k(pb, sparse_count, sparse_mode, return_value, scores_of);
}

at::Tensor quant_lightning_indexer_npu(AAR_QUANT_LIGHTNING_INDEXER_NPU_PARAMS) {
  constexpr const char* kQuantLightningIndexerOp = "npu_quant_lightning_indexer";
  reject_opt_int(kQuantLightningIndexerOp, query_dtype, "query_dtype");
  reject_opt_int(kQuantLightningIndexerOp, key_dtype, "key_dtype");
  return std::get<0>(quant_lightning_indexer(kQuantLightningIndexerOp, query, key, weights, query_dequant_scale, key_dequant_scale,
                                             query_quant_mode, key_quant_mode, actual_seq_lengths_query,
                                             actual_seq_lengths_key, block_table, layout_query, layout_key,
                                             sparse_count, sparse_mode, pre_tokens, next_tokens));
}

at::Tensor lightning_indexer_quant_va(AAR_LIGHTNING_INDEXER_QUANT_VA_PARAMS) {
  constexpr int64_t kNoLimit = std::numeric_limits<int64_t>::max();
  return std::get<0>(quant_lightning_indexer("_C_ascend::npu_lightning_indexer_quant", query, key, weights,
                                             query_dequant_scale, key_dequant_scale, query_quant_mode, key_quant_mode,
                                             actual_seq_lengths_query, actual_seq_lengths_key, block_table,
                                             layout_query, layout_key, sparse_count, sparse_mode, kNoLimit, kNoLimit));
}

constexpr const char* kVqliOp = "_C_ascend::npu_vllm_quant_lightning_indexer";
constexpr const char* kVqliMdOp = "_C_ascend::npu_vllm_quant_lightning_indexer_metadata";
constexpr int64_t kMetadataInts = 1024;

std::tuple<at::Tensor, at::Tensor> vllm_quant_lightning_indexer(AAR_VLLM_QUANT_LIGHTNING_INDEXER_PARAMS) {
  if (metadata.has_value() && metadata->defined()) {
    AAR_CHECK_ARG(metadata->scalar_type() == at::kInt && metadata->dim() == 1 && metadata->numel() == kMetadataInts,
                  kVqliOp, ": metadata must be the (1024,) int32 blob of npu_vllm_quant_lightning_indexer_metadata, got ",
                  metadata->scalar_type(), " ", metadata->sizes());
  }
  return quant_lightning_indexer(kVqliOp, query, key, weights, query_dequant_scale, key_dequant_scale,
                                 query_quant_mode, key_quant_mode, actual_seq_lengths_query, actual_seq_lengths_key,
                                 block_table, layout_query, layout_key, sparse_count, sparse_mode, pre_tokens,
                                 next_tokens, cmp_ratio, return_value);
}

std::vector<int64_t> read_lengths(const char* op, const std::optional<at::Tensor>& t, const char* name,
                                  int64_t batch_size) {
  if (!t.has_value() || !t->defined()) return {};
  AAR_CHECK_ARG(t->scalar_type() == at::kInt && t->dim() == 1, op, ": ", name, " must be int32 1-D, got ",
                t->scalar_type(), " ", t->sizes());
  AAR_CHECK_ARG(t->device().is_cpu(), op, ": the CPU twin needs ", name, " on the CPU, got ", t->device());
  AAR_CHECK_ARG(t->numel() == batch_size, op, ": ", name, " must have batch_size=", batch_size, " entries, got ",
                t->numel());
  const at::Tensor c = t->contiguous();
  const int32_t* p = c.data_ptr<int32_t>();
  return std::vector<int64_t>(p, p + c.numel());
}

at::Tensor vllm_quant_lightning_indexer_metadata(AAR_VLLM_QUANT_LIGHTNING_INDEXER_METADATA_PARAMS) {
  const char* op = kVqliMdOp;
  AAR_CHECK_ARG(num_heads_q >= 1, op, ": num_heads_q must be >= 1, got ", num_heads_q);
  AAR_CHECK_ARG(head_dim >= 1, op, ": head_dim must be >= 1, got ", head_dim);
  if (num_heads_k != 1) throw_not_supported(op, ": not supported: num_heads_k=", num_heads_k, " (only 1)");
  reject_int(op, query_quant_mode, 0, "query_quant_mode");
  reject_int(op, key_quant_mode, 0, "key_quant_mode");
  sparse::check_layouts(op, layout_query, layout_key, "layout_key");
  sparse::check_mode_and_tokens(op, sparse_mode, pre_tokens, next_tokens);
  AAR_CHECK_ARG(sparse_count >= 1, op, ": sparse_count must be >= 1, got ", sparse_count);
  AAR_CHECK_ARG(cmp_ratio >= 1, op, ": cmp_ratio must be >= 1, got ", cmp_ratio);
  AAR_CHECK_ARG(batch_size >= 0, op, ": batch_size must be >= 0, got ", batch_size);
  AAR_CHECK_ARG(max_seqlen_q >= 0 && max_seqlen_k >= 0, op, ": max_seqlen_q / max_seqlen_k must be >= 0, got ",
                max_seqlen_q, " / ", max_seqlen_k);
  int64_t total_q = -1, total_k = -1;
  const std::vector<int64_t> ends = read_lengths(op, actual_seq_lengths_query, "actual_seq_lengths_query", batch_size);
  if (actual_seq_lengths_query.has_value() && actual_seq_lengths_query->defined()) {
    int64_t prev = 0;
    for (size_t b = 0; b < ends.size(); ++b) {
      AAR_CHECK_ARG(ends[b] >= prev, op, ": actual_seq_lengths_query (cumulative ends) must be >= 0 and ",
                    "non-decreasing, got ", ends[b], " at ", b, " after ", prev);
      prev = ends[b];
    }
    total_q = prev;
  }
  const std::vector<int64_t> kl = read_lengths(op, actual_seq_lengths_key, "actual_seq_lengths_key", batch_size);
  if (actual_seq_lengths_key.has_value() && actual_seq_lengths_key->defined()) {
    total_k = 0;
    for (size_t b = 0; b < kl.size(); ++b) {
      AAR_CHECK_ARG(kl[b] >= 0, op, ": actual_seq_lengths_key[", b, "]=", kl[b], " is negative");
      total_k += kl[b];
    }
  }
  const std::vector<int64_t> fields = {0x514C494D,   1,           num_heads_q, num_heads_k,  head_dim,
                                       query_quant_mode, key_quant_mode, batch_size, max_seqlen_q, max_seqlen_k,
                                       sparse_count, sparse_mode, cmp_ratio,   total_q,      total_k};
  at::Tensor blob = at::zeros({kMetadataInts}, at::kInt);
  int32_t* w = blob.data_ptr<int32_t>();
  for (size_t i = 0; i < fields.size(); ++i) {
    AAR_CHECK_ARG(fields[i] >= std::numeric_limits<int32_t>::min() && fields[i] <= std::numeric_limits<int32_t>::max(),
                  op, ": a scalar argument does not fit int32 (metadata field ", i, " = ", fields[i], ")");
    w[i] = static_cast<int32_t>(fields[i]);
  }
  return blob;
}

}  // namespace
}  // namespace aar::ops::cpu

TORCH_LIBRARY_IMPL(ascend_cpu, CPU, m) {
  m.impl("npu_quant_lightning_indexer", TORCH_FN(aar::ops::cpu::quant_lightning_indexer_npu));
}

TORCH_LIBRARY_IMPL(ascend_cpu_va, CPU, m) {
  m.impl("npu_lightning_indexer_quant", TORCH_FN(aar::ops::cpu::lightning_indexer_quant_va));
  m.impl("npu_vllm_quant_lightning_indexer", TORCH_FN(aar::ops::cpu::vllm_quant_lightning_indexer));
  m.impl("npu_vllm_quant_lightning_indexer_metadata", TORCH_FN(aar::ops::cpu::vllm_quant_lightning_indexer_metadata));
}

// The metadata operator may be called with no tensor at all (both length
// tensors are optional): the dispatcher then runs the CompositeExplicitAutograd
// kernel (the same function).
TORCH_LIBRARY_IMPL(ascend_cpu_va, CompositeExplicitAutograd, m) {
  m.impl("npu_vllm_quant_lightning_indexer_metadata", TORCH_FN(aar::ops::cpu::vllm_quant_lightning_indexer_metadata));
}
