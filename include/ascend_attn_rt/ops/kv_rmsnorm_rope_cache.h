// npu_kv_rmsnorm_rope_cache (docs/design/ops.md §4.5): RMSNorm of the latent, RoPE of
// k_pe, both scattered into the paged MLA caches (negative slots skipped).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/string_view.h>

#include <optional>
#include <tuple>

#include "ascend_attn_rt/ops/provider.h"

namespace aar::ops {

// kv (B, 1, S, L+R); gamma (L); cos/sin (B, 1, S, R); index int64 (B*S) flat
// slots; k_cache = rope cache, ckv_cache = latent cache ("PA": (nb, bs, 1, D),
// "PA_NZ": (nb, 1, D/c, bs, c)). Returns (k_cache, ckv_cache, k_rope_out,
// c_kv_out); the last two are (B, 1, S, R) / (B, 1, S, L) when is_output_kv.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> kv_rmsnorm_rope_cache(
    const at::Tensor& kv, const at::Tensor& gamma, const at::Tensor& cos, const at::Tensor& sin,
    const at::Tensor& index, const at::Tensor& k_cache, const at::Tensor& ckv_cache, double epsilon,
    c10::string_view cache_mode, bool is_output_kv, Provider pv = Provider::Auto);

// The same with c_kv_scale (fp32, 1 or L elements): the latent is stored
// quantised in an int8 ckv_cache, saturate_int8(rint(c_kv * c_kv_scale)) (the
// scale multiplies: the reciprocal of the cache's dequant scale); c_kv_out stays
// unquantised. The FA-quant prefill's cache write (mla/impl.h).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> kv_rmsnorm_rope_cache(
    const at::Tensor& kv, const at::Tensor& gamma, const at::Tensor& cos, const at::Tensor& sin,
    const at::Tensor& index, const at::Tensor& k_cache, const at::Tensor& ckv_cache, double epsilon,
    c10::string_view cache_mode, bool is_output_kv, const std::optional<at::Tensor>& c_kv_scale,
    Provider pv = Provider::Auto);

}  // namespace aar::ops
