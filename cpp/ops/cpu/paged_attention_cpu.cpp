// CPU twin of ATB _npu_paged_attention (docs/design/ops.md §4.2): one query token per
// request attends, without mask, to the first context_lens[b] tokens of its
// paged KV (caches (nb, bs, Nkv, D)); writes `out` in place. Also the workspace
// query (a small deterministic uint8 tensor).
#include <torch/library.h>

#include "../op_signatures.h"
#include "attention_reference.h"

namespace aar::ops::cpu {

namespace {

constexpr const char* kPagedAttentionOp = "_npu_paged_attention";

std::vector<int64_t> check_paged_attention(AAR_PAGED_ATTENTION_PARAMS) {
  AAR_CHECK_ARG(is_float_dtype(query.scalar_type()), kPagedAttentionOp, ": query dtype must be float16/bfloat16/float32, got ",
                query.scalar_type());
  AAR_CHECK_ARG(query.dim() == 3 && query.size(1) == num_heads, kPagedAttentionOp, ": query must be (B, num_heads=", num_heads,
                ", D), got ", query.sizes());
  AAR_CHECK_ARG(num_heads > 0 && num_kv_heads > 0 && num_heads % num_kv_heads == 0, kPagedAttentionOp, ": num_kv_heads=",
                num_kv_heads, " must be positive and divide num_heads=", num_heads);
  const int64_t batch = query.size(0), d = query.size(2);
  if (key_cache.scalar_type() == at::kChar) {
    throw_not_supported(kPagedAttentionOp, ": int8 key_cache is not supported by the CPU twin");
  }
  AAR_CHECK_ARG(key_cache.scalar_type() == query.scalar_type() && value_cache.scalar_type() == query.scalar_type(),
                kPagedAttentionOp, ": key_cache/value_cache dtype (", key_cache.scalar_type(), "/", value_cache.scalar_type(),
                ") must equal the query dtype ", query.scalar_type());
  AAR_CHECK_ARG(key_cache.dim() == 4 && key_cache.size(2) == num_kv_heads && key_cache.size(3) == d, kPagedAttentionOp,
                ": key_cache must be (num_blocks, block_size, num_kv_heads=", num_kv_heads, ", D=", d, "), got ",
                key_cache.sizes());
  AAR_CHECK_ARG(value_cache.dim() == 4 && value_cache.size(0) == key_cache.size(0) &&
                    value_cache.size(1) == key_cache.size(1) && value_cache.size(2) == num_kv_heads,
                kPagedAttentionOp, ": value_cache must be (num_blocks, block_size, num_kv_heads, Dv) like key_cache, got ",
                value_cache.sizes());
  AAR_CHECK_ARG(out.dim() == 3 && out.size(0) == batch && out.size(1) == num_heads &&
                    out.size(2) == value_cache.size(3),
                kPagedAttentionOp, ": out must be (B=", batch, ", num_heads=", num_heads, ", Dv=", value_cache.size(3), "), got ",
                out.sizes());
  AAR_CHECK_ARG(out.scalar_type() == query.scalar_type(), kPagedAttentionOp, ": out dtype ", out.scalar_type(),
                " must equal the query dtype ", query.scalar_type());
  AAR_CHECK_ARG(context_lens.scalar_type() == at::kInt && context_lens.dim() == 1 && context_lens.size(0) == batch,
                kPagedAttentionOp, ": context_lens must be an int32 (B=", batch, ",) tensor, got ", context_lens.scalar_type(), " ",
                context_lens.sizes());
  AAR_CHECK_ARG(context_lens.device().is_cpu(), kPagedAttentionOp, ": context_lens must be a host tensor, got ",
                context_lens.device());
  const at::Tensor lens = context_lens.contiguous();
  std::vector<int64_t> kv_len(lens.data_ptr<int32_t>(), lens.data_ptr<int32_t>() + batch);
  check_block_table(kPagedAttentionOp, block_table, batch, kv_len, key_cache.size(1), key_cache.size(0), "context_lens");
  return kv_len;
}

void paged_attention(AAR_PAGED_ATTENTION_PARAMS, sig::OptT workspace) {
  const std::vector<int64_t> kv_len = check_paged_attention(
      query, key_cache, value_cache, num_kv_heads, num_heads, scale_value, block_table, context_lens, out);
  const int64_t bs = key_cache.size(1), d = query.size(2), dv = value_cache.size(3);
  const at::Tensor no_sink;
  for (int64_t b = 0; b < query.size(0); ++b) {
    at::Tensor out_b = out.narrow(0, b, 1);
    if (kv_len[b] == 0) {
      out_b.zero_();
      continue;
    }
    const at::Tensor k = gather_paged(key_cache, PagedLayout::Nd4D, block_table, b, kv_len[b], bs, num_kv_heads, d);
    const at::Tensor v = gather_paged(value_cache, PagedLayout::Nd4D, block_table, b, kv_len[b], bs, num_kv_heads, dv);
    attend(query.narrow(0, b, 1), k, v, MaskSpec{}, scale_value, no_sink, out_b, at::Tensor());
  }
}

at::Tensor paged_attention_workspace(AAR_PAGED_ATTENTION_PARAMS) {
  const std::vector<int64_t> kv_len = check_paged_attention(
      query, key_cache, value_cache, num_kv_heads, num_heads, scale_value, block_table, context_lens, out);
  int64_t total = 0;
  for (int64_t n : kv_len) total += n;
  return at::zeros({64 + total * num_heads}, query.options().dtype(at::kByte));
}

}  // namespace

}  // namespace aar::ops::cpu

TORCH_LIBRARY_IMPL(ascend_cpu, CPU, m) {
  m.impl("_npu_paged_attention", TORCH_FN(aar::ops::cpu::paged_attention));
  m.impl("_npu_paged_attention_get_workspace", TORCH_FN(aar::ops::cpu::paged_attention_workspace));
}
