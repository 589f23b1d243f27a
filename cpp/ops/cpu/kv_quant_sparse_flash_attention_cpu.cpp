// CPU twins of npu_kv_quant_sparse_flash_attention (docs/design/sfa.md §5):
// torch_npu's (ascend_cpu; returns the output only) and vllm-ascend's
// _C_ascend one (ascend_cpu_va; (out, softmax_max, softmax_sum)). query
// (T, N, 576) = [q_nope 512 | q_rope 64] in fp16/bf16; key / value are packed
// int8 (A2/A3) or float8_e4m3fn (A5) rows (nb, bs, 1, 656) = [k_nope x512 in
// the rows' dtype | k_rope x64 in the query's dtype (128 B) | 4 fp32 scales
// (16 B)], k_nope[d] = q[d] * scale[d / 128]
// (sfa_c8_rows.h). V is the dequantised 512-wide nope part of value's rows.
// Otherwise exactly npu_sparse_flash_attention (sparse_flash_attention_cpu.cpp).
// Implemented: key/value_quant_mode 2 (per tile), quant_scale_repo_mode 1
// (scales inside the rows), tile_size 128, rope_head_dim 64, attention_mode 2;
// the reserved key/value_dequant_scale and torch_npu's key/value_dtype must be None.
#include <torch/library.h>

#include "../op_signatures.h"
#include "ascend_attn_rt/ops/sfa_c8_rows.h"
#include "sparse_common.h"

namespace aar::ops::cpu {
namespace {

sig::SfaResult kv_quant_sfa(const char* op, bool want_lse, AAR_KVQ_SFA_COMMON_PARAMS) {
  sparse::check_layouts(op, layout_query, layout_kv, "layout_kv");
  sparse::check_mode_and_tokens(op, sparse_mode, pre_tokens, next_tokens);
  reject_int(op, attention_mode, 2, "attention_mode");
  reject_int(op, key_quant_mode, 2, "key_quant_mode");
  reject_int(op, value_quant_mode, 2, "value_quant_mode");
  reject_int(op, quant_scale_repo_mode, 1, "quant_scale_repo_mode");
  reject_int(op, tile_size, kSfaC8Tile, "tile_size");
  reject_int(op, rope_head_dim, kSfaC8RopeDim, "rope_head_dim");
  reject_tensor(op, key_dequant_scale, "key_dequant_scale");
  reject_tensor(op, value_dequant_scale, "value_dequant_scale");
  AAR_CHECK_ARG(sparse_block_size >= 1, op, ": sparse_block_size must be >= 1, got ", sparse_block_size);
  const int64_t qd = kSfaC8NopeDim + kSfaC8RopeDim;
  AAR_CHECK_ARG(query.dim() == 3 && query.size(2) == qd, op, ": query must be (T, N, ", qd,
                ") = [q_nope | q_rope] for layout \"TND\", got ", query.sizes());
  const auto dt = query.scalar_type();
  AAR_CHECK_ARG(dt == at::kHalf || dt == at::kBFloat16, op,
                ": query must be float16 or bfloat16 (the packed rows hold k_rope in the query's dtype), got ", dt);
  const auto kt = key.scalar_type();
  AAR_CHECK_ARG((kt == at::kChar || kt == at::kFloat8_e4m3fn) && value.scalar_type() == kt, op,
                ": key and value must be the packed rows, both int8 (A2/A3) or both float8_e4m3fn (A5), got ", kt,
                " and ", value.scalar_type());
  AAR_CHECK_ARG(key.dim() == 4 && key.size(3) == kSfaC8RowBytes, op, ": key must be (num_blocks, block_size, 1, ",
                kSfaC8RowBytes, ") packed rows, got ", key.sizes());
  AAR_CHECK_ARG(value.sizes() == key.sizes(), op, ": value must have key's shape ", key.sizes(), ", got ",
                value.sizes());
  const int64_t t = query.size(0);
  sparse::check_sparse_indices(op, sparse_indices, t);
  const sparse::PagedBatch pb = sparse::plan_paged_batch(
      {op, "actual_seq_lengths_query", "actual_seq_lengths_kv", "key"}, t, actual_seq_lengths_query,
      actual_seq_lengths_kv, block_table, key);
  const bool v_is_k = value.is_same(key);
  auto kv_of = [&](int64_t b) {
    const SfaC8Unpacked k = unpack_sfa_c8_rows(sparse::gather_rows(key, pb, b), dt);
    sparse::SfaKv kv;
    kv.k_nope = k.k_nope;
    kv.k_rope = k.k_rope.to(at::kFloat);
    kv.v = v_is_k ? k.k_nope : unpack_sfa_c8_rows(sparse::gather_rows(value, pb, b), dt).k_nope;
    return kv;
  };
  const at::Tensor qf = query.to(at::kFloat);
  return sparse::sfa_scan_attention(op, pb, qf.narrow(2, 0, kSfaC8NopeDim), qf.narrow(2, kSfaC8NopeDim, kSfaC8RopeDim),
                                    sparse_indices, scale_value, sparse_mode, sparse_block_size, kSfaC8NopeDim, dt,
                                    want_lse, kv_of);
}

#define AAR_KVQ_FORWARD                                                                                       \
  query, key, value, sparse_indices, scale_value, key_quant_mode, value_quant_mode, key_dequant_scale,       \
      value_dequant_scale, block_table, actual_seq_lengths_query, actual_seq_lengths_kv, sparse_block_size,  \
      layout_query, layout_kv, sparse_mode, pre_tokens, next_tokens, attention_mode, quant_scale_repo_mode, \
      tile_size, rope_head_dim

at::Tensor kv_quant_sfa_npu(AAR_KVQ_SFA_NPU_PARAMS) {
  constexpr const char* kKvQuantSparseFlashAttentionOp = "npu_kv_quant_sparse_flash_attention";
  reject_opt_int(kKvQuantSparseFlashAttentionOp, key_dtype, "key_dtype");
  reject_opt_int(kKvQuantSparseFlashAttentionOp, value_dtype, "value_dtype");
  return std::get<0>(kv_quant_sfa(kKvQuantSparseFlashAttentionOp, /*want_lse=*/false, AAR_KVQ_FORWARD));
}

sig::SfaResult kv_quant_sfa_va(AAR_KVQ_SFA_VA_PARAMS) {
  return kv_quant_sfa("_C_ascend::npu_kv_quant_sparse_flash_attention", return_softmax_lse, AAR_KVQ_FORWARD);
}

#undef AAR_KVQ_FORWARD

}  // namespace
}  // namespace aar::ops::cpu

TORCH_LIBRARY_IMPL(ascend_cpu, CPU, m) {
  m.impl("npu_kv_quant_sparse_flash_attention", TORCH_FN(aar::ops::cpu::kv_quant_sfa_npu));
}

TORCH_LIBRARY_IMPL(ascend_cpu_va, CPU, m) {
  m.impl("npu_kv_quant_sparse_flash_attention", TORCH_FN(aar::ops::cpu::kv_quant_sfa_va));
}
