// No-compute kernels of the sparse-attention and quantisation operators (issue
// 10), for both libraries: torch_npu's (namespace ascend_noop) and vllm-ascend's
// _C_ascend ones (ascend_noop_va). Correctly shaped outputs from the per-thread
// cache (output_cache.h), no arithmetic; in-place operators do nothing.
// Registered for the CPU and the Meta dispatch keys.
#include <c10/util/SmallVector.h>
#include <torch/library.h>

#include <array>
#include <vector>

#include "../op_signatures.h"
#include "ascend_attn_rt/errors.h"
#include "output_cache.h"

namespace aar::ops::noop {

namespace {

at::Tensor empty_f32(const at::Tensor& like) {
  static const std::array<int64_t, 1> z{0};
  return cached(c10::IntArrayRef(z.data(), 1), at::kFloat, like.device());
}

// Indices (TND: (T, N2, K); BSND: (B, S, N2, K)); N2 = the key's head count.
c10::SmallVector<int64_t, 6> indices_shape(const at::Tensor& query, const at::Tensor& key, int64_t sparse_count) {
  AAR_CHECK_ARG(query.dim() == 3 || query.dim() == 4, "ascend_noop lightning indexer: query must be 3-D or 4-D, got ",
                query.sizes());
  c10::SmallVector<int64_t, 6> s(query.sizes().begin(), query.sizes().end() - 2);
  s.push_back(key.dim() >= 2 ? key.size(-2) : 1);
  s.push_back(sparse_count);
  return s;
}

std::tuple<at::Tensor, at::Tensor> lightning_indexer(AAR_LIGHTNING_INDEXER_PARAMS) {
  const auto s = indices_shape(query, key, sparse_count);
  const at::Tensor idx = cached(s, at::kInt, query.device());
  return {idx, return_value ? cached(s, at::kFloat, query.device()) : empty_f32(query)};
}

at::Tensor quant_lightning_indexer_npu(AAR_QUANT_LIGHTNING_INDEXER_NPU_PARAMS) {
  return cached(indices_shape(query, key, sparse_count), at::kInt, query.device());
}

at::Tensor lightning_indexer_quant_va(AAR_LIGHTNING_INDEXER_QUANT_VA_PARAMS) {
  return cached(indices_shape(query, key, sparse_count), at::kInt, query.device());
}

std::tuple<at::Tensor, at::Tensor> vllm_quant_lightning_indexer(AAR_VLLM_QUANT_LIGHTNING_INDEXER_PARAMS) {
  const auto s = indices_shape(query, key, sparse_count);
  const at::Tensor idx = cached(s, at::kInt, query.device());
  return {idx, return_value ? cached(s, at::kFloat, query.device()) : empty_f32(query)};
}

// The (1024,) int32 tiling blob, on the device of the first length tensor given (CPU without one).
at::Tensor vllm_quant_lightning_indexer_metadata(AAR_VLLM_QUANT_LIGHTNING_INDEXER_METADATA_PARAMS) {
  c10::Device dev(c10::kCPU);
  for (const auto* t : {&actual_seq_lengths_query, &actual_seq_lengths_key}) {
    if (t->has_value() && (*t)->defined()) {
      dev = (*t)->device();
      break;
    }
  }
  static const std::array<int64_t, 1> s{1024};
  return cached(c10::IntArrayRef(s.data(), 1), at::kInt, dev);
}

// Attention output: the query's shape with V's width; LSE (TND: (N2, T, N/N2);
// BSND: (B, N2, S, N/N2)) fp32 when requested, empty otherwise.
sig::SfaResult sfa_outputs(const at::Tensor& query, const at::Tensor& key, int64_t v_dim, bool lse) {
  AAR_CHECK_ARG(query.dim() == 3 || query.dim() == 4, "ascend_noop sparse flash attention: query must be 3-D or 4-D, got ",
                query.sizes());
  c10::SmallVector<int64_t, 6> o(query.sizes().begin(), query.sizes().end());
  o.back() = v_dim;
  const at::Tensor out = cached(o, query.scalar_type(), query.device());
  if (!lse) return {out, empty_f32(query), empty_f32(query)};
  const int64_t n2 = key.dim() >= 2 ? key.size(-2) : 1;
  const int64_t n = query.size(-2);
  c10::SmallVector<int64_t, 6> l;
  if (query.dim() == 3) {
    l = {n2, query.size(0), n / n2};
  } else {
    l = {query.size(0), n2, query.size(1), n / n2};
  }
  const at::Tensor m = cached(l, at::kFloat, query.device());
  return {out, m, m};
}

sig::SfaResult sfa_npu(AAR_SFA_NPU_PARAMS) {
  const at::Tensor& v = value.has_value() && value->defined() ? *value : key;
  return sfa_outputs(query, key, v.size(-1), return_softmax_lse);
}

sig::SfaResult sfa_va(AAR_SFA_VA_PARAMS) { return sfa_outputs(query, key, value.size(-1), return_softmax_lse); }

at::Tensor kvq_sfa_npu(AAR_KVQ_SFA_NPU_PARAMS) {
  return std::get<0>(sfa_outputs(query, key, query.size(-1) - rope_head_dim, false));
}

sig::SfaResult kvq_sfa_va(AAR_KVQ_SFA_VA_PARAMS) {
  return sfa_outputs(query, key, query.size(-1) - rope_head_dim, return_softmax_lse);
}

at::Tensor& scatter_nd_update_(at::Tensor& self, const at::Tensor& indices, const at::Tensor& updates) { return self; }

std::tuple<at::Tensor, at::Tensor> dynamic_quant(AAR_DYNAMIC_QUANT_PARAMS) {
  AAR_CHECK_ARG(input.dim() >= 1, "ascend_noop npu_dynamic_quant: input must have dims, got ", input.sizes());
  const at::ScalarType q = dst_type.has_value() && *dst_type == static_cast<int64_t>(at::kFloat8_e4m3fn)
                               ? at::kFloat8_e4m3fn
                               : at::kChar;
  return {cached(input.sizes(), q, input.device()),
          cached(input.sizes().slice(0, input.dim() - 1), at::kFloat, input.device())};
}

std::tuple<at::Tensor, at::Tensor> dynamic_block_quant(AAR_DYNAMIC_BLOCK_QUANT_PARAMS) {
  AAR_CHECK_ARG(x.dim() >= 1 && col_block_size >= 1, "ascend_noop npu_dynamic_block_quant: x ", x.sizes(),
                ", col_block_size ", col_block_size);
  c10::SmallVector<int64_t, 6> s(x.sizes().begin(), x.sizes().end());
  s.back() = (s.back() + col_block_size - 1) / col_block_size;
  return {cached(x.sizes(), at::kChar, x.device()), cached(s, at::kFloat, x.device())};
}

void batch_matmul_transpose(const at::Tensor& tensor_a, const at::Tensor& tensor_b, const at::Tensor& tensor_c,
                            std::optional<c10::string_view> format_mode, std::optional<c10::string_view> quant_mode) {}

void register_sparse_torch_npu(torch::Library& m) {
  m.impl("npu_lightning_indexer", TORCH_FN(lightning_indexer));
  m.impl("npu_quant_lightning_indexer", TORCH_FN(quant_lightning_indexer_npu));
  m.impl("npu_sparse_flash_attention", TORCH_FN(sfa_npu));
  m.impl("npu_kv_quant_sparse_flash_attention", TORCH_FN(kvq_sfa_npu));
  m.impl("npu_scatter_nd_update_", TORCH_FN(scatter_nd_update_));
  m.impl("npu_dynamic_quant", TORCH_FN(dynamic_quant));
  m.impl("npu_dynamic_block_quant", TORCH_FN(dynamic_block_quant));
}

void register_sparse_vllm_ascend(torch::Library& m) {
  m.impl("npu_lightning_indexer", TORCH_FN(lightning_indexer));
  m.impl("npu_lightning_indexer_quant", TORCH_FN(lightning_indexer_quant_va));
  m.impl("npu_vllm_quant_lightning_indexer", TORCH_FN(vllm_quant_lightning_indexer));
  m.impl("npu_vllm_quant_lightning_indexer_metadata", TORCH_FN(vllm_quant_lightning_indexer_metadata));
  m.impl("npu_sparse_flash_attention", TORCH_FN(sfa_va));
  m.impl("npu_kv_quant_sparse_flash_attention", TORCH_FN(kvq_sfa_va));
  m.impl("batch_matmul_transpose", TORCH_FN(batch_matmul_transpose));
}

}  // namespace
}  // namespace aar::ops::noop

TORCH_LIBRARY_IMPL(ascend_noop, CPU, m) { aar::ops::noop::register_sparse_torch_npu(m); }
TORCH_LIBRARY_IMPL(ascend_noop, Meta, m) { aar::ops::noop::register_sparse_torch_npu(m); }
TORCH_LIBRARY_IMPL(ascend_noop_va, CPU, m) { aar::ops::noop::register_sparse_vllm_ascend(m); }
TORCH_LIBRARY_IMPL(ascend_noop_va, Meta, m) { aar::ops::noop::register_sparse_vllm_ascend(m); }

// The metadata operator may get no tensor at all: the dispatcher then runs the
// CompositeExplicitAutograd kernel (the same function).
TORCH_LIBRARY_IMPL(ascend_noop_va, CompositeExplicitAutograd, m) {
  m.impl("npu_vllm_quant_lightning_indexer_metadata",
         TORCH_FN(aar::ops::noop::vllm_quant_lightning_indexer_metadata));
}
