// Typed wrappers for FIA v1/v2 (functional, .out, get_max_workspace). Each call:
// pick the provider, fetch the cached typed handle, call it unboxed under
// InferenceMode. Arguments the runtime never uses are passed as None/defaults.
#include "ascend_attn_rt/ops/fused_infer_attention.h"

#include "op_handle.h"
#include "op_signatures.h"

namespace aar::ops {

namespace {

detail::OpHandle<sig::FiaV1> g_fia_v1("npu_fused_infer_attention_score", "", OpLibrary::TorchNpu);
detail::OpHandle<sig::FiaV1Out> g_fia_v1_out("npu_fused_infer_attention_score", "out", OpLibrary::TorchNpu);
detail::OpHandle<sig::FiaV1Ws> g_fia_v1_ws("_npu_fused_infer_attention_score_get_max_workspace", "", OpLibrary::TorchNpu);
detail::OpHandle<sig::FiaV2> g_fia_v2("npu_fused_infer_attention_score_v2", "", OpLibrary::TorchNpu);
detail::OpHandle<sig::FiaV2Out> g_fia_v2_out("npu_fused_infer_attention_score_v2", "out", OpLibrary::TorchNpu);
detail::OpHandle<sig::FiaV2Ws> g_fia_v2_ws("_npu_fused_infer_attention_score_v2_get_max_workspace", "", OpLibrary::TorchNpu);

inline at::OptionalSymIntArrayRef sym_list(bool has, c10::IntArrayRef v) {
  if (!has) return std::nullopt;
  return at::OptionalSymIntArrayRef(c10::fromIntArrayRefUnchecked(v));
}

// Expands to the full FIA v1 argument list for handle.call(...).
#define AAR_FIA_V1_CALL_ARGS(t, p, none)                                                                    \
  t.query, t.key, t.value, none /*pse_shift*/, t.atten_mask,                                                \
      sym_list(p.has_actual_seq_lengths, p.actual_seq_lengths),                                             \
      sym_list(p.has_actual_seq_lengths_kv, p.actual_seq_lengths_kv), none /*dequant_scale1*/,             \
      none /*quant_scale1*/, none /*dequant_scale2*/, none /*quant_scale2*/, none /*quant_offset2*/,         \
      none /*antiquant_scale*/, none /*antiquant_offset*/, t.key_antiquant_scale, t.key_antiquant_offset,   \
      t.value_antiquant_scale, t.value_antiquant_offset, t.block_table, none /*query_padding_size*/,        \
      none /*kv_padding_size*/, none /*key_shared_prefix*/, none /*value_shared_prefix*/,                   \
      at::OptionalSymIntArrayRef() /*actual_shared_prefix_len*/, t.query_rope, t.key_rope,                  \
      none /*key_rope_antiquant_scale*/, p.num_heads, p.scale, p.pre_tokens, p.next_tokens, p.input_layout, \
      p.num_key_value_heads, p.sparse_mode, p.inner_precise, p.block_size, p.antiquant_mode,                \
      p.key_antiquant_mode, p.value_antiquant_mode, p.softmax_lse_flag

#define AAR_FIA_V2_CALL_ARGS(t, p, none)                                                                   \
  t.query, t.key, t.value, t.query_rope, t.key_rope, none /*pse_shift*/, t.atten_mask,                     \
      sym_list(p.has_actual_seq_qlen, p.actual_seq_qlen), sym_list(p.has_actual_seq_kvlen, p.actual_seq_kvlen), \
      t.block_table, t.dequant_scale_query, t.dequant_scale_key, t.dequant_offset_key,                      \
      t.dequant_scale_value, t.dequant_offset_value, none /*dequant_scale_key_rope*/,                      \
      none /*quant_scale_out*/, none /*quant_offset_out*/, none /*quant_scale_p*/, t.learnable_sink,       \
      p.num_query_heads, p.num_key_value_heads, p.softmax_scale, p.pre_tokens, p.next_tokens,              \
      p.input_layout, p.sparse_mode, p.block_size, p.query_quant_mode, p.key_quant_mode,                   \
      p.value_quant_mode, p.inner_precise, p.return_softmax_lse, std::nullopt, std::nullopt, std::nullopt, \
      std::nullopt, std::nullopt, std::nullopt, std::nullopt, std::nullopt, std::nullopt, std::nullopt,    \
      std::nullopt, std::nullopt /*query_dtype ... out_dtype*/

}  // namespace

std::tuple<at::Tensor, at::Tensor> fused_infer_attention_score(const FiaTensors& t, const FiaParams& p,
                                                               Provider pv) {
  const Provider prov = detail::pick_provider(pv, t.query);
  const auto& op = g_fia_v1.get(prov);
  const auto& none = detail::none_tensor();
  detail::DispatchGuard guard(prov);
  return op.call(AAR_FIA_V1_CALL_ARGS(t, p, none));
}

void fused_infer_attention_score_out(const FiaTensors& t, const FiaParams& p,
                                     const std::optional<at::Tensor>& workspace, at::Tensor& attention_out,
                                     at::Tensor& softmax_lse, Provider pv) {
  const Provider prov = detail::pick_provider(pv, t.query);
  const auto& op = g_fia_v1_out.get(prov);
  const auto& none = detail::none_tensor();
  detail::DispatchGuard guard(prov);
  op.call(AAR_FIA_V1_CALL_ARGS(t, p, none), workspace, attention_out, softmax_lse);
}

at::Tensor fused_infer_attention_score_get_max_workspace(const FiaTensors& t, const FiaParams& p, Provider pv) {
  const Provider prov = detail::pick_provider(pv, t.query);
  const auto& op = g_fia_v1_ws.get(prov);
  const auto& none = detail::none_tensor();
  detail::DispatchGuard guard(prov);
  return op.call(AAR_FIA_V1_CALL_ARGS(t, p, none));
}

std::tuple<at::Tensor, at::Tensor> fused_infer_attention_score_v2(const FiaV2Tensors& t, const FiaV2Params& p,
                                                                  Provider pv) {
  const Provider prov = detail::pick_provider(pv, t.query);
  const auto& op = g_fia_v2.get(prov);
  const auto& none = detail::none_tensor();
  detail::DispatchGuard guard(prov);
  return op.call(AAR_FIA_V2_CALL_ARGS(t, p, none));
}

void fused_infer_attention_score_v2_out(const FiaV2Tensors& t, const FiaV2Params& p,
                                        const std::optional<at::Tensor>& workspace, at::Tensor& attention_out,
                                        at::Tensor& softmax_lse, Provider pv) {
  const Provider prov = detail::pick_provider(pv, t.query);
  const auto& op = g_fia_v2_out.get(prov);
  const auto& none = detail::none_tensor();
  detail::DispatchGuard guard(prov);
  op.call(AAR_FIA_V2_CALL_ARGS(t, p, none), workspace, attention_out, softmax_lse);
}

at::Tensor fused_infer_attention_score_v2_get_max_workspace(const FiaV2Tensors& t, const FiaV2Params& p,
                                                            Provider pv) {
  const Provider prov = detail::pick_provider(pv, t.query);
  const auto& op = g_fia_v2_ws.get(prov);
  const auto& none = detail::none_tensor();
  detail::DispatchGuard guard(prov);
  return op.call(AAR_FIA_V2_CALL_ARGS(t, p, none));
}

}  // namespace aar::ops
