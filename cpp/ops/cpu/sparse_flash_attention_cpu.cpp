// CPU twins of npu_sparse_flash_attention: torch_npu's (ascend_cpu; value
// optional, `sinks`) and vllm-ascend's _C_ascend one (ascend_cpu_va). Semantics
// of docs/design/sparse.md §5 / docs/design/ops.md §4.6 (MLA-absorbed latent layout,
// attention_mode 2): for query token t (request b, row i), Th = S_b
// (sparse_mode 0) or S_b - q_b + i + 1 (sparse_mode 3); the first
// min(K, ceil(Th / sparse_block_size)) entries of sparse_indices[t, 0, :] are
// scanned, the scan STOPS at the first -1, an entry idx with
// idx * sparse_block_size >= Th is SKIPPED, otherwise it contributes tokens
// [idx * sbs, min(idx * sbs + sbs, Th)) (duplicates count twice); token p is read
// at block_table[b][p / bs], offset p % bs. logits = scale * (q . k + q_rope .
// k_rope) in fp32, softmax in fp32, out = sum_j P_j * v_j (v = value's rows, the
// key itself in MLA); an empty selection gives out 0 (softmax_max -inf,
// softmax_sum 0). softmax_max / softmax_sum are (1, T, N) fp32 when
// return_softmax_lse, empty otherwise. TND / PA_BSND only; sinks NotSupported.
#include <torch/library.h>

#include "../op_signatures.h"
#include "sparse_common.h"

namespace aar::ops::cpu {
namespace {

sig::SfaResult sparse_flash_attention(const char* op, const at::Tensor& query, const at::Tensor& key,
                                      const at::Tensor& value, AAR_SFA_COMMON_PARAMS) {
  sparse::check_layouts(op, layout_query, layout_kv, "layout_kv");
  sparse::check_mode_and_tokens(op, sparse_mode, pre_tokens, next_tokens);
  reject_int(op, attention_mode, 2, "attention_mode");
  AAR_CHECK_ARG(sparse_block_size >= 1, op, ": sparse_block_size must be >= 1, got ", sparse_block_size);
  AAR_CHECK_ARG(query.dim() == 3, op, ": query must be (T, N, D) for layout \"TND\", got ", query.sizes());
  const int64_t t = query.size(0), n = query.size(1), d = query.size(2);
  const auto dt = query.scalar_type();
  AAR_CHECK_ARG(is_float_dtype(dt) && key.scalar_type() == dt && value.scalar_type() == dt, op,
                ": query, key and value must share a float dtype (float32/float16/bfloat16), got ", dt, ", ",
                key.scalar_type(), " and ", value.scalar_type());
  AAR_CHECK_ARG(key.dim() == 4 && key.size(3) == d, op, ": key must be (num_blocks, block_size, 1, D=", d,
                "), got ", key.sizes());
  AAR_CHECK_ARG(value.dim() == 4 && value.size(0) == key.size(0) && value.size(1) == key.size(1) &&
                    value.size(2) == key.size(2),
                op, ": value must be (num_blocks, block_size, 1, Dv) like key ", key.sizes(), ", got ",
                value.sizes());
  const bool has_qr = query_rope.has_value() && query_rope->defined();
  const bool has_kr = key_rope.has_value() && key_rope->defined();
  AAR_CHECK_ARG(has_qr == has_kr, op, ": query_rope and key_rope go together (got ", has_qr ? "query_rope" : "key_rope",
                " only)");
  if (has_qr) {
    const at::Tensor& qr = *query_rope;
    const at::Tensor& kr = *key_rope;
    AAR_CHECK_ARG(qr.dim() == 3 && qr.size(0) == t && qr.size(1) == n, op, ": query_rope must be (T=", t, ", N=", n,
                  ", R), got ", qr.sizes());
    AAR_CHECK_ARG(kr.dim() == 4 && kr.size(0) == key.size(0) && kr.size(1) == key.size(1) && kr.size(2) == 1 &&
                      kr.size(3) == qr.size(2),
                  op, ": key_rope must be (num_blocks, block_size, 1, R=", qr.size(2), ") like key ", key.sizes(),
                  ", got ", kr.sizes());
    AAR_CHECK_ARG(qr.scalar_type() == dt && kr.scalar_type() == dt, op, ": query_rope and key_rope must be ", dt,
                  " like query, got ", qr.scalar_type(), " and ", kr.scalar_type());
  }
  sparse::check_sparse_indices(op, sparse_indices, t);
  const sparse::PagedBatch pb = sparse::plan_paged_batch(
      {op, "actual_seq_lengths_query", "actual_seq_lengths_kv", "key"}, t, actual_seq_lengths_query,
      actual_seq_lengths_kv, block_table, key);
  const bool v_is_k = value.is_same(key);
  auto kv_of = [&](int64_t b) {
    sparse::SfaKv kv;
    kv.k_nope = sparse::gather_rows(key, pb, b).to(at::kFloat);
    if (has_kr) kv.k_rope = sparse::gather_rows(*key_rope, pb, b).to(at::kFloat);
    kv.v = v_is_k ? kv.k_nope : sparse::gather_rows(value, pb, b).to(at::kFloat);
    return kv;
  };
  return sparse::sfa_scan_attention(op, pb, query.to(at::kFloat), has_qr ? query_rope->to(at::kFloat) : at::Tensor(),
                                    sparse_indices, scale_value, sparse_mode, sparse_block_size, value.size(3), dt,
                                    return_softmax_lse, kv_of);
}

sig::SfaResult sparse_flash_attention_npu(AAR_SFA_NPU_PARAMS) {
  constexpr const char* kSparseFlashAttentionOp = "npu_sparse_flash_attention";
  reject_tensor(kSparseFlashAttentionOp, sinks, "sinks");
  const at::Tensor& v = value.has_value() && value->defined() ? *value : key;
  return sparse_flash_attention(kSparseFlashAttentionOp, query, key, v, sparse_indices, scale_value, block_table, actual_seq_lengths_query,
                                actual_seq_lengths_kv, query_rope, key_rope, sparse_block_size, layout_query,
                                layout_kv, sparse_mode, pre_tokens, next_tokens, attention_mode, return_softmax_lse);
}

sig::SfaResult sparse_flash_attention_va(AAR_SFA_VA_PARAMS) {
  return sparse_flash_attention("_C_ascend::npu_sparse_flash_attention", query, key, value, sparse_indices,
                                scale_value, block_table, actual_seq_lengths_query, actual_seq_lengths_kv, query_rope,
                                key_rope, sparse_block_size, layout_query, layout_kv, sparse_mode, pre_tokens,
                                next_tokens, attention_mode, return_softmax_lse);
}

}  // namespace
}  // namespace aar::ops::cpu

TORCH_LIBRARY_IMPL(ascend_cpu, CPU, m) {
  m.impl("npu_sparse_flash_attention", TORCH_FN(aar::ops::cpu::sparse_flash_attention_npu));
}

TORCH_LIBRARY_IMPL(ascend_cpu_va, CPU, m) {
  m.impl("npu_sparse_flash_attention", TORCH_FN(aar::ops::cpu::sparse_flash_attention_va));
}
