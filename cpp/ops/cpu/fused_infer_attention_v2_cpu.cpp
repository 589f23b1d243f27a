// CPU twin of npu_fused_infer_attention_score_v2, its .out variant and
// _npu_fused_infer_attention_score_v2_get_max_workspace. Same core as v1
// (fia_common.cpp) plus learnable_sink: exp(sink_h - m') joins the softmax
// denominator only (no value row); the returned lse includes the sink's mass.
#include <torch/library.h>

#include "../op_signatures.h"
#include "fia_common.h"
#include "fia_mla.h"

namespace aar::ops::cpu {

namespace {

constexpr FiaNames kNamesV2{"npu_fused_infer_attention_score_v2", "actual_seq_qlen", "actual_seq_kvlen",
                            "num_query_heads"};

FiaInputs v2_inputs(AAR_FIA_V2_PARAMS) {
  const char* op = kNamesV2.op;
  reject_tensor(op, query_rope, "query_rope");
  reject_tensor(op, key_rope, "key_rope");
  reject_tensor(op, pse_shift, "pse_shift");
  reject_tensor(op, dequant_scale_query, "dequant_scale_query");
  reject_tensor(op, dequant_scale_key, "dequant_scale_key");
  reject_tensor(op, dequant_offset_key, "dequant_offset_key");
  reject_tensor(op, dequant_scale_value, "dequant_scale_value");
  reject_tensor(op, dequant_offset_value, "dequant_offset_value");
  reject_tensor(op, dequant_scale_key_rope, "dequant_scale_key_rope");
  reject_tensor(op, quant_scale_out, "quant_scale_out");
  reject_tensor(op, quant_offset_out, "quant_offset_out");
  reject_tensor(op, quant_scale_p, "quant_scale_p");
  reject_int(op, query_quant_mode, 0, "query_quant_mode");
  reject_int(op, key_quant_mode, 0, "key_quant_mode");
  reject_int(op, value_quant_mode, 0, "value_quant_mode");
  reject_opt_int(op, query_dtype, "query_dtype");
  reject_opt_int(op, key_dtype, "key_dtype");
  reject_opt_int(op, value_dtype, "value_dtype");
  reject_opt_int(op, query_rope_dtype, "query_rope_dtype");
  reject_opt_int(op, key_rope_dtype, "key_rope_dtype");
  reject_opt_int(op, key_shared_prefix_dtype, "key_shared_prefix_dtype");
  reject_opt_int(op, value_shared_prefix_dtype, "value_shared_prefix_dtype");
  reject_opt_int(op, dequant_scale_query_dtype, "dequant_scale_query_dtype");
  reject_opt_int(op, dequant_scale_key_dtype, "dequant_scale_key_dtype");
  reject_opt_int(op, dequant_scale_value_dtype, "dequant_scale_value_dtype");
  reject_opt_int(op, dequant_scale_key_rope_dtype, "dequant_scale_key_rope_dtype");
  reject_opt_int(op, out_dtype, "out_dtype");
  return FiaInputs{query,           key,          value,        atten_mask,   block_table,
                   learnable_sink,  actual_seq_qlen, actual_seq_kvlen, num_query_heads,
                   num_key_value_heads, softmax_scale, pre_tokens, next_tokens, input_layout,
                   sparse_mode,     inner_precise, block_size,  kNamesV2};
}

// MLA arguments (query_rope / key_rope, the _NBSD / _NTD / BSND layouts) are
// folded first, see fia_mla.h.
std::tuple<at::Tensor, at::Tensor> fia_v2(AAR_FIA_V2_PARAMS) {
  const MlaFold f = fold_mla(kNamesV2.op, query, key, query_rope, key_rope, input_layout, block_table.has_value());
  {
    AAR_FIA_MLA_SHADOW(f)
    return f.finish(fia_functional(v2_inputs(AAR_FIA_V2_ARGS), return_softmax_lse));
  }
}

std::tuple<at::Tensor&, at::Tensor&> fia_v2_out(AAR_FIA_V2_PARAMS, AAR_OUT_TAIL_PARAMS) {
  const MlaFold f = fold_mla(kNamesV2.op, query, key, query_rope, key_rope, input_layout, block_table.has_value());
  {
    AAR_FIA_MLA_SHADOW(f)
    f.out(kNamesV2.op, v2_inputs(AAR_FIA_V2_ARGS), return_softmax_lse, attention_out, softmax_lse);
  }
  return {attention_out, softmax_lse};
}

at::Tensor fia_v2_workspace(AAR_FIA_V2_PARAMS) {
  const MlaFold f = fold_mla(kNamesV2.op, query, key, query_rope, key_rope, input_layout, block_table.has_value());
  {
    AAR_FIA_MLA_SHADOW(f)
    return fia_workspace(v2_inputs(AAR_FIA_V2_ARGS));
  }
}

}  // namespace

}  // namespace aar::ops::cpu

TORCH_LIBRARY_IMPL(ascend_cpu, CPU, m) {
  m.impl("npu_fused_infer_attention_score_v2", TORCH_FN(aar::ops::cpu::fia_v2));
  m.impl("npu_fused_infer_attention_score_v2.out", TORCH_FN(aar::ops::cpu::fia_v2_out));
  m.impl("_npu_fused_infer_attention_score_v2_get_max_workspace", TORCH_FN(aar::ops::cpu::fia_v2_workspace));
}
