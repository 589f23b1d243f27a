// Typed wrappers for the MLA operators: npu_interleave_rope,
// npu_kv_rmsnorm_rope_cache, npu_gather_pa_kv_cache, npu_attention_update,
// npu_transpose_batchmatmul, npu_mla_prolog_v3, npu_mla_prolog_v2 (namespace
// `npu` on the NPU).
#include "ascend_attn_rt/ops/attention_update.h"
#include "ascend_attn_rt/ops/gather_pa_kv_cache.h"
#include "ascend_attn_rt/ops/interleave_rope.h"
#include "ascend_attn_rt/ops/rotary_mul.h"
#include "ascend_attn_rt/ops/kv_rmsnorm_rope_cache.h"
#include "ascend_attn_rt/ops/mla_prolog.h"
#include "ascend_attn_rt/ops/transpose_batchmatmul.h"
#include "attention_update_check.h"
#include "op_handle.h"
#include "op_signatures.h"

namespace aar::ops {

namespace {
detail::OpHandle<sig::InterleaveRope> g_interleave_rope("npu_interleave_rope", "", OpLibrary::TorchNpu);
detail::OpHandle<sig::RotaryMul> g_rotary_mul("npu_rotary_mul", "", OpLibrary::TorchNpu);
detail::OpHandle<sig::KvRmsnormRopeCache> g_kv_rmsnorm("npu_kv_rmsnorm_rope_cache", "", OpLibrary::TorchNpu);
detail::OpHandle<sig::GatherPaKvCache> g_gather("npu_gather_pa_kv_cache", "", OpLibrary::TorchNpu);
detail::OpHandle<sig::AttentionUpdate> g_attn_update("npu_attention_update", "", OpLibrary::TorchNpu);
detail::OpHandle<sig::TransposeBatchMatmul> g_tbmm("npu_transpose_batchmatmul", "", OpLibrary::TorchNpu);
detail::OpHandle<sig::MlaPrologV3> g_prolog_v3("npu_mla_prolog_v3", "", OpLibrary::TorchNpu);
detail::OpHandle<sig::MlaPrologV2> g_prolog_v2("npu_mla_prolog_v2", "", OpLibrary::TorchNpu);

at::OptionalIntArrayRef opt_list(const std::optional<c10::IntArrayRef>& v) {
  if (!v.has_value()) return std::nullopt;
  return at::OptionalIntArrayRef(*v);
}
}  // namespace

at::Tensor rotary_mul(const at::Tensor& x, const at::Tensor& r1, const at::Tensor& r2, c10::string_view rotary_mode,
                      Provider pv) {
  const Provider p = detail::pick_provider(pv, x);
  const auto& op = g_rotary_mul.get(p);
  detail::DispatchGuard guard(p);
  return op.call(x, r1, r2, rotary_mode, detail::none_tensor());
}

at::Tensor interleave_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, Provider pv) {
  const Provider p = detail::pick_provider(pv, x);
  const auto& op = g_interleave_rope.get(p);
  detail::DispatchGuard guard(p);
  return op.call(x, cos, sin);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> kv_rmsnorm_rope_cache(
    const at::Tensor& kv, const at::Tensor& gamma, const at::Tensor& cos, const at::Tensor& sin,
    const at::Tensor& index, const at::Tensor& k_cache, const at::Tensor& ckv_cache, double epsilon,
    c10::string_view cache_mode, bool is_output_kv, Provider pv) {
  const Provider p = detail::pick_provider(pv, kv);
  const auto& op = g_kv_rmsnorm.get(p);
  const auto& none = detail::none_tensor();
  detail::DispatchGuard guard(p);
  return op.call(kv, gamma, cos, sin, index, k_cache, ckv_cache, none, none, none, none, none, epsilon, cache_mode,
                 is_output_kv);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> kv_rmsnorm_rope_cache(
    const at::Tensor& kv, const at::Tensor& gamma, const at::Tensor& cos, const at::Tensor& sin,
    const at::Tensor& index, const at::Tensor& k_cache, const at::Tensor& ckv_cache, double epsilon,
    c10::string_view cache_mode, bool is_output_kv, const std::optional<at::Tensor>& c_kv_scale, Provider pv) {
  const Provider p = detail::pick_provider(pv, kv);
  const auto& op = g_kv_rmsnorm.get(p);
  const auto& none = detail::none_tensor();
  detail::DispatchGuard guard(p);
  return op.call(kv, gamma, cos, sin, index, k_cache, ckv_cache, none, c_kv_scale, none, none, none, epsilon,
                 cache_mode, is_output_kv);
}

void gather_pa_kv_cache(const at::Tensor& key_cache, const at::Tensor& value_cache, const at::Tensor& block_tables,
                        const at::Tensor& seq_lens, at::Tensor& key, at::Tensor& value,
                        const std::optional<at::Tensor>& seq_offset, Provider pv) {
  const Provider p = detail::pick_provider(pv, key_cache);
  const auto& op = g_gather.get(p);
  detail::DispatchGuard guard(p);
  op.call(key_cache, value_cache, block_tables, seq_lens, key, value, seq_offset, false);
}

std::tuple<at::Tensor, at::Tensor> attention_update(at::TensorList lse, at::TensorList local_out,
                                                    int64_t update_type, Provider pv) {
  detail::check_attention_update_args(lse, local_out, update_type, "attention_update");
  const Provider p = detail::pick_provider(pv, lse[0]);
  const auto& op = g_attn_update.get(p);
  detail::DispatchGuard guard(p);
  return op.call(lse, local_out, update_type);
}

at::Tensor transpose_batchmatmul(const at::Tensor& input, const at::Tensor& weight,
                                 std::optional<c10::IntArrayRef> perm_x1, std::optional<c10::IntArrayRef> perm_x2,
                                 std::optional<c10::IntArrayRef> perm_y, Provider pv) {
  const Provider p = detail::pick_provider(pv, input);
  const auto& op = g_tbmm.get(p);
  const auto& none = detail::none_tensor();
  detail::DispatchGuard guard(p);
  return op.call(input, weight, none, none, opt_list(perm_x1), opt_list(perm_x2), opt_list(perm_y), int64_t{1});
}

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
