// Typed wrapper for vllm-ascend's _C_ascend batch_matmul_transpose.
#include "ascend_attn_rt/ops/batch_matmul_transpose.h"

#include "op_handle.h"
#include "op_signatures.h"

namespace aar::ops {

namespace {
detail::OpHandle<sig::BatchMatmulTranspose> g_bmt("batch_matmul_transpose", "", OpLibrary::VllmAscend);
}  // namespace

void batch_matmul_transpose(const at::Tensor& a, const at::Tensor& b, at::Tensor& c,
                            std::optional<c10::string_view> format_mode, std::optional<c10::string_view> quant_mode,
                            Provider pv) {
  const Provider p = detail::pick_provider(pv, a);
  const auto& op = g_bmt.get(p);
  detail::DispatchGuard guard(p);
  op.call(a, b, c, format_mode, quant_mode);
}

}  // namespace aar::ops
