// CPU twin of npu_fused_infer_attention_score (FIA v1), its .out variant and
// _npu_fused_infer_attention_score_get_max_workspace. Semantics: docs/design/ops.md §4.1.
// Supported: layouts TND / BNSD; dense or paged KV; sparse_mode 0 / 3 / 4;
// GQA; softmax_lse_flag (lse shape (T, N, 1) for TND, (B, N, S, 1) for BNSD;
// [1] zero placeholder when the flag is off); int8 KV with key/value_antiquant_scale
// (+ optional offsets), modes 0 (per-channel (Nkv,1,D) or per-tensor):
// k = (k_int8 + offset) * scale. Everything else raises NotSupported
// naming the argument.
#include <torch/library.h>

#include "../op_signatures.h"
#include "fia_common.h"
#include "fia_mla.h"

namespace aar::ops::cpu {

namespace {

constexpr FiaNames kNamesV1{"npu_fused_infer_attention_score", "actual_seq_lengths", "actual_seq_lengths_kv",
                            "num_heads"};

FiaInputs v1_inputs(AAR_FIA_V1_PARAMS) {
  const char* op = kNamesV1.op;
  reject_tensor(op, pse_shift, "pse_shift");
  reject_tensor(op, dequant_scale1, "dequant_scale1");
  reject_tensor(op, quant_scale1, "quant_scale1");
  reject_tensor(op, dequant_scale2, "dequant_scale2");
  reject_tensor(op, quant_scale2, "quant_scale2");
  reject_tensor(op, quant_offset2, "quant_offset2");
  reject_tensor(op, antiquant_scale, "antiquant_scale");
  reject_tensor(op, antiquant_offset, "antiquant_offset");
  // key/value_antiquant_scale/offset: int8 KV antiquant, handled in fia_common (plan_fia).
  reject_tensor(op, query_padding_size, "query_padding_size");
  reject_tensor(op, kv_padding_size, "kv_padding_size");
  reject_tensor(op, key_shared_prefix, "key_shared_prefix");
  reject_tensor(op, value_shared_prefix, "value_shared_prefix");
  if (actual_shared_prefix_len.has_value()) {
    throw_not_supported(op, ": not supported by the CPU twin: actual_shared_prefix_len (got a list of ",
                        actual_shared_prefix_len->size(), " values; pass None)");
  }
  reject_tensor(op, query_rope, "query_rope");
  reject_tensor(op, key_rope, "key_rope");
  reject_tensor(op, key_rope_antiquant_scale, "key_rope_antiquant_scale");
  reject_int(op, antiquant_mode, 0, "antiquant_mode");
  reject_int(op, key_antiquant_mode, 0, "key_antiquant_mode");
  reject_int(op, value_antiquant_mode, 0, "value_antiquant_mode");
  FiaInputs in{query,       key,         value,        atten_mask,          block_table,
                   no_tensor(),        actual_seq_lengths, actual_seq_lengths_kv, num_heads,
                   num_key_value_heads,       scale,       pre_tokens,   next_tokens,         input_layout,
                   sparse_mode, inner_precise, block_size,  kNamesV1};
  in.key_antiquant_scale = &key_antiquant_scale;
  in.key_antiquant_offset = &key_antiquant_offset;
  in.value_antiquant_scale = &value_antiquant_scale;
  in.value_antiquant_offset = &value_antiquant_offset;
  return in;
}

// MLA arguments (query_rope / key_rope, the _NBSD / _NTD / BSND layouts) are
// folded first, see fia_mla.h.
std::tuple<at::Tensor, at::Tensor> fia_v1(AAR_FIA_V1_PARAMS) {
  const MlaFold f = fold_mla(kNamesV1.op, query, key, query_rope, key_rope, input_layout, block_table.has_value());
  {
    AAR_FIA_MLA_SHADOW(f)
    return f.finish(fia_functional(v1_inputs(AAR_FIA_V1_ARGS), softmax_lse_flag));
  }
}

std::tuple<at::Tensor&, at::Tensor&> fia_v1_out(AAR_FIA_V1_PARAMS, AAR_OUT_TAIL_PARAMS) {
  const MlaFold f = fold_mla(kNamesV1.op, query, key, query_rope, key_rope, input_layout, block_table.has_value());
  {
    AAR_FIA_MLA_SHADOW(f)
    f.out(kNamesV1.op, v1_inputs(AAR_FIA_V1_ARGS), softmax_lse_flag, attention_out, softmax_lse);
  }
  return {attention_out, softmax_lse};
}

at::Tensor fia_v1_workspace(AAR_FIA_V1_PARAMS) {
  const MlaFold f = fold_mla(kNamesV1.op, query, key, query_rope, key_rope, input_layout, block_table.has_value());
  {
    AAR_FIA_MLA_SHADOW(f)
    return fia_workspace(v1_inputs(AAR_FIA_V1_ARGS));
  }
}

}  // namespace

}  // namespace aar::ops::cpu

TORCH_LIBRARY_IMPL(ascend_cpu, CPU, m) {
  m.impl("npu_fused_infer_attention_score", TORCH_FN(aar::ops::cpu::fia_v1));
  m.impl("npu_fused_infer_attention_score.out", TORCH_FN(aar::ops::cpu::fia_v1_out));
  m.impl("_npu_fused_infer_attention_score_get_max_workspace", TORCH_FN(aar::ops::cpu::fia_v1_workspace));
}
