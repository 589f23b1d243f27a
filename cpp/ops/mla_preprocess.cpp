// Typed wrapper of vllm-ascend's _C_ascend mla_preprocess (MLAPO).
#include "ascend_attn_rt/ops/mla_preprocess.h"

#include "op_handle.h"
#include "op_signatures.h"

namespace aar::ops {

namespace {
detail::OpHandle<sig::MlaPreprocess> g_mlapo("mla_preprocess", "", OpLibrary::VllmAscend);
}  // namespace

void mla_preprocess(const MlaPreprocessArgs& a, at::Tensor& kv_cache, at::Tensor& kv_cache_rope, at::Tensor& q_out0,
                    at::Tensor& q_out1, at::Tensor& inner_out, Provider pv) {
  const Provider p = detail::pick_provider(pv, a.hidden_state);
  const auto& op = g_mlapo.get(p);
  detail::DispatchGuard guard(p);
  op.call(a.hidden_state, a.wdqkv, a.descale0, a.gamma1, a.beta1, a.wuq, a.descale1, a.gamma2, a.cos, a.sin, a.wuk,
          kv_cache, kv_cache_rope, a.slotmapping, a.quant_scale0, a.quant_offset0, a.bias0, a.quant_scale1,
          a.quant_offset1, a.bias1, a.ctkv_scale, a.q_nope_scale, a.cache_mode, a.quant_mode, a.enable_inner_out,
          q_out0, kv_cache, q_out1, kv_cache_rope, inner_out);
}

}  // namespace aar::ops
