// Typed wrappers for torch_npu's npu_mla_prolog_v3 and npu_mla_prolog_v2 (namespace
// `npu` on the NPU).
#include "ascend_attn_rt/ops/mla_prolog.h"

#include "op_handle.h"
#include "op_signatures.h"

namespace aar::ops {

namespace {
detail::OpHandle<sig::MlaPrologV3> g_prolog_v3("npu_mla_prolog_v3", "", OpLibrary::TorchNpu);
detail::OpHandle<sig::MlaPrologV2> g_prolog_v2("npu_mla_prolog_v2", "", OpLibrary::TorchNpu);
}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> mla_prolog_v3(const MlaPrologArgs& a,
                                                                                     at::Tensor& kv_cache,
                                                                                     at::Tensor& kr_cache,
                                                                                     Provider pv) {
  const Provider p = detail::pick_provider(pv, a.token_x);
  const auto& op = g_prolog_v3.get(p);
  const auto& none = detail::none_tensor();
  detail::DispatchGuard guard(p);
  return op.call(a.token_x, a.weight_dq, a.weight_uq_qr, a.weight_uk, a.weight_dkv_kr, a.rmsnorm_gamma_cq,
                 a.rmsnorm_gamma_ckv, a.rope_sin, a.rope_cos, kv_cache, kr_cache, a.cache_index, a.dequant_scale_x,
                 a.dequant_scale_w_dq, a.dequant_scale_w_uq_qr, a.dequant_scale_w_dkv_kr, a.quant_scale_ckv,
                 a.quant_scale_ckr, none, none, a.k_nope_clip_alpha, a.rmsnorm_epsilon_cq, a.rmsnorm_epsilon_ckv,
                 a.cache_mode, a.query_norm_flag, a.weight_quant_mode, a.kv_cache_quant_mode, a.query_quant_mode,
                 a.ckvkr_repo_mode, a.quant_scale_repo_mode, a.tile_size, /*qc_qr_scale=*/1.0, /*kc_scale=*/1.0,
                 std::nullopt, std::nullopt, std::nullopt, std::nullopt, std::nullopt);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> mla_prolog_v2(const MlaPrologArgs& a,
                                                                                     const at::Tensor& kv_cache,
                                                                                     const at::Tensor& kr_cache,
                                                                                     Provider pv) {
  AAR_CHECK_ARG(a.cache_index.has_value() && a.cache_index->defined(), "npu_mla_prolog_v2: cache_index is required");
  AAR_CHECK_ARG(!a.query_norm_flag && a.weight_quant_mode == 0 && a.kv_cache_quant_mode == 0 &&
                    a.query_quant_mode == 0 && a.ckvkr_repo_mode == 0 && a.quant_scale_repo_mode == 0 &&
                    !a.k_nope_clip_alpha.has_value(),
                "npu_mla_prolog_v2 has no query_norm_flag / *_quant_mode / *_repo_mode / k_nope_clip_alpha "
                "arguments (npu_mla_prolog_v3 does): leave them at their defaults");
  const Provider p = detail::pick_provider(pv, a.token_x);
  const auto& op = g_prolog_v2.get(p);
  const auto& none = detail::none_tensor();
  detail::DispatchGuard guard(p);
  return op.call(a.token_x, a.weight_dq, a.weight_uq_qr, a.weight_uk, a.weight_dkv_kr, a.rmsnorm_gamma_cq,
                 a.rmsnorm_gamma_ckv, a.rope_sin, a.rope_cos, *a.cache_index, kv_cache, kr_cache, a.dequant_scale_x,
                 a.dequant_scale_w_dq, a.dequant_scale_w_uq_qr, a.dequant_scale_w_dkv_kr, a.quant_scale_ckv,
                 a.quant_scale_ckr, none, a.rmsnorm_epsilon_cq, a.rmsnorm_epsilon_ckv, a.cache_mode);
}

}  // namespace aar::ops
