// CPU twin of npu_fusion_attention (FlashAttentionScore forward, docs/design/ops.md §4.3):
// TND layout, cumulative actual_seq_qlen / actual_seq_kvlen, KV heads from the
// key shape, sparse_mode 0 (no mask: full attention per sequence) or 3
// (right-down causal; compressed mask required, its content ignored).
// Returns (attention_out, softmax_max, softmax_sum, softmax_in, seed, offset,
// numels); only attention_out is computed, the others are empty float
// placeholders and zeros.
#include <torch/library.h>

#include "../op_signatures.h"
#include "attention_reference.h"

namespace aar::ops::cpu {

namespace {

constexpr const char* kFusionAttentionOp = "npu_fusion_attention";

sig::FusionAttentionResult fusion_attention(AAR_FUSION_ATTENTION_PARAMS) {
  reject_tensor(kFusionAttentionOp, pse, "pse");
  reject_tensor(kFusionAttentionOp, padding_mask, "padding_mask");
  reject_tensor(kFusionAttentionOp, sink, "sink");
  reject_tensor(kFusionAttentionOp, dropout_mask, "dropout_mask");
  if (keep_prob != 1.0) {
    throw_not_supported(kFusionAttentionOp, ": not supported by the CPU twin: keep_prob=", keep_prob, " (only 1.0, no dropout)");
  }
  if (prefix.has_value()) {
    throw_not_supported(kFusionAttentionOp, ": not supported by the CPU twin: prefix (got a list of ", prefix->size(),
                        " values; pass None)");
  }
  if (input_layout != "TND") {
    throw_not_supported(kFusionAttentionOp, ": not supported by the CPU twin: input_layout=\"", input_layout, "\" (only \"TND\")");
  }
  if (softmax_layout != "" && softmax_layout != "TND") {
    throw_not_supported(kFusionAttentionOp, ": not supported by the CPU twin: softmax_layout=\"", softmax_layout,
                        "\" (only \"\" or \"TND\")");
  }
  if (inner_precise != 0 && inner_precise != 1) {
    throw_not_supported(kFusionAttentionOp, ": not supported by the CPU twin: inner_precise=", inner_precise, " (only 0, 1)");
  }
  MaskSpec mask;
  if (sparse_mode == 0) {
    reject_tensor(kFusionAttentionOp, atten_mask, "atten_mask with sparse_mode=0");
    if (pre_tockens != 2147483647 || next_tockens != 2147483647) {
      throw_not_supported(kFusionAttentionOp, ": not supported by the CPU twin: sparse_mode=0 with pre_tockens=", pre_tockens,
                          ", next_tockens=", next_tockens, " (only the defaults 2147483647)");
    }
  } else if (sparse_mode == 3) {
    check_compressed_mask(kFusionAttentionOp, atten_mask, sparse_mode);  // pre/next_tockens are ignored in mode 3
    mask.sparse_mode = 3;
  } else {
    throw_not_supported(kFusionAttentionOp, ": not supported by the CPU twin: sparse_mode=", sparse_mode, " (only 0, 3)");
  }

  AAR_CHECK_ARG(is_float_dtype(query.scalar_type()), kFusionAttentionOp, ": query dtype must be float16/bfloat16/float32, got ",
                query.scalar_type());
  AAR_CHECK_ARG(key.scalar_type() == query.scalar_type() && value.scalar_type() == query.scalar_type(), kFusionAttentionOp,
                ": key/value dtype (", key.scalar_type(), "/", value.scalar_type(), ") must equal the query dtype ",
                query.scalar_type());
  AAR_CHECK_ARG(query.dim() == 3 && query.size(1) == head_num, kFusionAttentionOp, ": TND query must be (T, head_num=", head_num,
                ", D), got ", query.sizes());
  AAR_CHECK_ARG(key.dim() == 3 && key.size(2) == query.size(2) && key.size(1) > 0, kFusionAttentionOp,
                ": TND key must be (Tkv, Nkv, D=", query.size(2), "), got ", key.sizes());
  AAR_CHECK_ARG(value.dim() == 3 && value.size(0) == key.size(0) && value.size(1) == key.size(1), kFusionAttentionOp,
                ": TND value must be (Tkv=", key.size(0), ", Nkv=", key.size(1), ", Dv), got ", value.sizes());
  const int64_t nkv = key.size(1);
  AAR_CHECK_ARG(head_num % nkv == 0, kFusionAttentionOp, ": key heads ", nkv, " must divide head_num=", head_num);
  AAR_CHECK_ARG(actual_seq_qlen.has_value() && actual_seq_kvlen.has_value(), kFusionAttentionOp,
                ": input_layout TND requires actual_seq_qlen and actual_seq_kvlen (cumulative ends)");
  const std::vector<int64_t> ql = to_vector(actual_seq_qlen), kl = to_vector(actual_seq_kvlen);
  AAR_CHECK_ARG(!ql.empty() && ql.size() == kl.size(), kFusionAttentionOp,
                ": actual_seq_qlen and actual_seq_kvlen must be non-empty and of equal length, got ", ql.size(),
                " and ", kl.size());
  std::vector<int64_t> qs, qn, ks, kn;
  cumulative_to_ranges(kFusionAttentionOp, "actual_seq_qlen", ql, query.size(0), "the query token count T", qs, qn);
  cumulative_to_ranges(kFusionAttentionOp, "actual_seq_kvlen", kl, key.size(0), "the key token count Tkv", ks, kn);

  at::Tensor out = at::zeros({query.size(0), head_num, value.size(2)}, query.options());
  const at::Tensor no_sink;
  for (size_t b = 0; b < ql.size(); ++b) {
    if (qn[b] == 0 || kn[b] == 0) continue;
    attend(query.narrow(0, qs[b], qn[b]), key.narrow(0, ks[b], kn[b]), value.narrow(0, ks[b], kn[b]), mask, scale,
           no_sink, out.narrow(0, qs[b], qn[b]), at::Tensor());
  }
  const auto fopts = query.options().dtype(at::kFloat);
  return {out, at::empty({0}, fopts), at::empty({0}, fopts), at::empty({0}, query.options()), 0, 0, 0};
}

}  // namespace

}  // namespace aar::ops::cpu

TORCH_LIBRARY_IMPL(ascend_cpu, CPU, m) {
  m.impl("npu_fusion_attention", TORCH_FN(aar::ops::cpu::fusion_attention));
}
