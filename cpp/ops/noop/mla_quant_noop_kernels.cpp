// No-compute kernels of the quantised MLA-family preprocess operators (issue
// 10): torch_npu's npu_mla_prolog_v2, npu_quantize and npu_quant_matmul
// (namespace ascend_noop) and vllm-ascend's mla_preprocess (ascend_noop_va).
// Correctly shaped outputs from the per-thread cache, no arithmetic; cache and
// out arguments are returned as they are, unwritten. CPU and Meta keys.
#include <c10/util/SmallVector.h>
#include <torch/library.h>

#include <array>
#include <vector>

#include "../op_signatures.h"
#include "ascend_attn_rt/errors.h"
#include "output_cache.h"

namespace aar::ops::noop {

namespace {

int64_t cache_width(const at::Tensor& c) { return c.size(-1) * (c.dim() == 5 ? c.size(2) : 1); }

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> mla_prolog_v2(AAR_MLA_PROLOG_V2_PARAMS) {
  AAR_CHECK_ARG(token_x.dim() >= 1 && weight_uk.dim() == 3, "ascend_noop npu_mla_prolog_v2: token_x ",
                token_x.sizes(), ", weight_uk ", weight_uk.sizes());
  const int64_t T = token_x.numel() / token_x.size(-1);
  const int64_t N = weight_uk.size(0);
  const auto act = rope_cos.scalar_type();
  const c10::Device dev = token_x.device();
  // Full quantisation with an int8 kv_cache: an int8 query and its per-(token, head) dequant scale.
  const bool q_int8 = kv_cache.scalar_type() == at::kChar;
  const std::array<int64_t, 3> qs{T, N, weight_uk.size(2)}, rs{T, N, cache_width(kr_cache)}, ds{T, N, 1};
  const std::array<int64_t, 1> one{1};
  return {cached(qs, q_int8 ? at::kChar : act, dev), cached(rs, act, dev), kv_cache, kr_cache,
          q_int8 ? cached(ds, at::kFloat, dev) : cached(one, at::kFloat, dev)};
}

at::Tensor quantize(const at::Tensor& self, const at::Tensor& scales, sig::OptT zero_points, int64_t dtype,
                    int64_t axis, bool div_mode) {
  return cached(self.sizes(), at::kChar, self.device());
}

at::Tensor quant_matmul(AAR_QUANT_MATMUL_PARAMS) {
  AAR_CHECK_ARG(x1.dim() >= 1 && x2.dim() >= 1, "ascend_noop npu_quant_matmul: x1 ", x1.sizes(), ", x2 ",
                x2.sizes());
  c10::SmallVector<int64_t, 6> s(x1.sizes().begin(), x1.sizes().end());
  s.back() = x2.size(-1);
  const auto out = output_dtype.has_value() ? static_cast<at::ScalarType>(*output_dtype) : at::kChar;
  return cached(s, out, x1.device());
}

sig::MlaPreprocessResult mla_preprocess(AAR_MLA_PREPROCESS_PARAMS) {
  return {q_out0, kv_cache_out0, q_out1, kv_cache_out1, inner_out};
}

void register_mla_quant_torch_npu(torch::Library& m) {
  m.impl("npu_mla_prolog_v2", TORCH_FN(mla_prolog_v2));
  m.impl("npu_quantize", TORCH_FN(quantize));
  m.impl("npu_quant_matmul", TORCH_FN(quant_matmul));
}

void register_mla_quant_vllm_ascend(torch::Library& m) { m.impl("mla_preprocess", TORCH_FN(mla_preprocess)); }

}  // namespace
}  // namespace aar::ops::noop

TORCH_LIBRARY_IMPL(ascend_noop, CPU, m) { aar::ops::noop::register_mla_quant_torch_npu(m); }
TORCH_LIBRARY_IMPL(ascend_noop, Meta, m) { aar::ops::noop::register_mla_quant_torch_npu(m); }
TORCH_LIBRARY_IMPL(ascend_noop_va, CPU, m) { aar::ops::noop::register_mla_quant_vllm_ascend(m); }
TORCH_LIBRARY_IMPL(ascend_noop_va, Meta, m) { aar::ops::noop::register_mla_quant_vllm_ascend(m); }
