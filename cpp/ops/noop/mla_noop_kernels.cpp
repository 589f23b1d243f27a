// No-compute kernels (namespace ascend_noop) of the MLA operators: correctly
// shaped outputs from a small per-thread cache, in-place writes skipped.
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <array>

#include "../attention_update_check.h"
#include "../op_signatures.h"
#include "output_cache.h"
#include "ascend_attn_rt/errors.h"

namespace aar::ops::noop {

namespace {

at::Tensor empty_of(at::ScalarType dtype, const at::Tensor& like) {
  static const std::array<int64_t, 1> z{0};
  return cached(c10::IntArrayRef(z.data(), 1), dtype, like.device());
}

at::Tensor one_of(at::ScalarType dtype, const at::Tensor& like) {
  static const std::array<int64_t, 1> o{1};
  return cached(c10::IntArrayRef(o.data(), 1), dtype, like.device());
}

at::Tensor interleave_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  return cached(x.sizes(), x.scalar_type(), x.device());
}

at::Tensor rotary_mul(const at::Tensor& x, const at::Tensor& r1, const at::Tensor& r2, c10::string_view mode,
                      const std::optional<at::Tensor>& rotate) {
  return cached(x.sizes(), x.scalar_type(), x.device());
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> kv_rmsnorm_rope_cache(AAR_KV_RMSNORM_ROPE_CACHE_PARAMS) {
  if (!is_output_kv) return {k_cache, ckv_cache, empty_of(kv.scalar_type(), kv), empty_of(kv.scalar_type(), kv)};
  const int64_t r = k_cache.size(-1) * (k_cache.dim() == 5 ? k_cache.size(2) : 1);
  const std::array<int64_t, 4> rs{kv.size(0), 1, kv.size(2), r};
  const std::array<int64_t, 4> cs{kv.size(0), 1, kv.size(2), kv.size(3) - r};
  return {k_cache, ckv_cache, cached(rs, kv.scalar_type(), kv.device()), cached(cs, kv.scalar_type(), kv.device())};
}

void gather_pa_kv_cache(const at::Tensor& key_cache, const at::Tensor& value_cache, const at::Tensor& block_tables,
                        const at::Tensor& seq_lens, at::Tensor& key, at::Tensor& value, sig::OptT seq_offset,
                        bool is_seq_lens_cumsum) {}

std::tuple<at::Tensor, at::Tensor> attention_update(at::TensorList lse, at::TensorList local_out,
                                                    int64_t update_type) {
  detail::check_attention_update_args(lse, local_out, update_type, "ascend_noop npu_attention_update");
  const at::Tensor& o0 = local_out[0];
  const at::Tensor l = update_type == 1 ? cached(lse[0].sizes(), at::kFloat, o0.device()) : empty_of(at::kFloat, o0);
  return {cached(o0.sizes(), o0.scalar_type(), o0.device()), l};
}

std::array<int64_t, 3> perm3(c10::IntArrayRef s, at::OptionalIntArrayRef p) {
  std::array<int64_t, 3> r{s[0], s[1], s[2]};
  if (p.has_value()) {
    for (int i = 0; i < 3; ++i) r[i] = s[(*p)[i]];
  }
  return r;
}

at::Tensor transpose_batchmatmul(const at::Tensor& input, const at::Tensor& weight, sig::OptT bias, sig::OptT scale,
                                 at::OptionalIntArrayRef perm_x1, at::OptionalIntArrayRef perm_x2,
                                 at::OptionalIntArrayRef perm_y, sig::OptInt batch_split_factor) {
  AAR_CHECK_ARG(input.dim() == 3 && weight.dim() == 3, "ascend_noop npu_transpose_batchmatmul: 3-D inputs");
  const auto x = perm3(input.sizes(), perm_x1);
  const auto w = perm3(weight.sizes(), perm_x2);
  const std::array<int64_t, 3> y{x[0], x[1], w[2]};
  const auto out = perm3(y, perm_y);
  return cached(out, input.scalar_type(), input.device());
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> mla_prolog_v3(AAR_MLA_PROLOG_V3_PARAMS) {
  const int64_t T = token_x.numel() / token_x.size(-1);
  const int64_t N = weight_uk.size(0);
  const int64_t dr = kr_cache.size(-1) * (kr_cache.dim() == 5 ? kr_cache.size(2) : 1);
  const std::array<int64_t, 3> qs{T, N, weight_uk.size(2)}, rs{T, N, dr};
  // The activation dtype (token_x is int8 in the quantised forms).
  const auto dt = rmsnorm_gamma_cq.scalar_type();
  const c10::Device dev = token_x.device();
  if (!query_norm_flag) {
    return {cached(qs, dt, dev), cached(rs, dt, dev), one_of(at::kFloat, token_x), one_of(dt, token_x),
            one_of(at::kFloat, token_x)};
  }
  // query_norm: c_q (T, Hcq), int8 with its (T, 1) scale under weight_quant_mode 2.
  const bool q8 = weight_quant_mode == 2;
  const std::array<int64_t, 2> ns{T, weight_dq.size(-1)}, ds{T, 1};
  return {cached(qs, dt, dev), cached(rs, dt, dev), one_of(at::kFloat, token_x),
          cached(ns, q8 ? at::kChar : dt, dev), q8 ? cached(ds, at::kFloat, dev) : one_of(at::kFloat, token_x)};
}

}  // namespace
}  // namespace aar::ops::noop

namespace aar::ops::noop {
namespace {
void register_mla_kernels(torch::Library& m) {
  m.impl("npu_interleave_rope", TORCH_FN(interleave_rope));
  m.impl("npu_rotary_mul", TORCH_FN(rotary_mul));
  m.impl("npu_kv_rmsnorm_rope_cache", TORCH_FN(kv_rmsnorm_rope_cache));
  m.impl("npu_gather_pa_kv_cache", TORCH_FN(gather_pa_kv_cache));
  m.impl("npu_attention_update", TORCH_FN(attention_update));
  m.impl("npu_transpose_batchmatmul", TORCH_FN(transpose_batchmatmul));
  m.impl("npu_mla_prolog_v3", TORCH_FN(mla_prolog_v3));
}
}  // namespace
}  // namespace aar::ops::noop

TORCH_LIBRARY_IMPL(ascend_noop, CPU, m) { aar::ops::noop::register_mla_kernels(m); }
TORCH_LIBRARY_IMPL(ascend_noop, Meta, m) { aar::ops::noop::register_mla_kernels(m); }
