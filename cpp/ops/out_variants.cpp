// Out-forms of operators without an out schema: see ops/out_variants.h.
#include "ascend_attn_rt/ops/out_variants.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <array>

#include "ascend_attn_rt/errors.h"
#include "ascend_attn_rt/ops/dense.h"
#include "ascend_attn_rt/ops/hadamard.h"
#include "ascend_attn_rt/ops/transpose_batchmatmul.h"

namespace aar::ops {

namespace {

void check_out(const char* op, const char* name, const at::Tensor& out, c10::IntArrayRef sizes,
               at::ScalarType dtype, c10::Device device) {
  AAR_CHECK_ARG(out.defined(), op, ": ", name, " must be given");
  AAR_CHECK_ARG(out.sizes() == sizes && out.scalar_type() == dtype && out.device() == device, op, ": ", name,
                " must be ", sizes, " ", dtype, " on ", device, ", got ", out.sizes(), " ", out.scalar_type(), " on ",
                out.device());
}

void check_like(const char* op, const char* name, const at::Tensor& out, const at::Tensor& result) {
  check_out(op, name, out, result.sizes(), result.scalar_type(), result.device());
}

// An operator's result into `out` (checked against the result first).
void land(const char* op, const char* name, const at::Tensor& out, const at::Tensor& result) {
  check_like(op, name, out, result);
  dense::copy(out, result);
}

// A metadata blob into its builder's buffer: the copy runs under every provider, the no-compute one
// included (its bytes are the no-compute operator's), so a host-time benchmark of a build times it as the
// device path's copy launch (a few KiB).
void land_blob(const char* op, const at::Tensor& out, const at::Tensor& result) {
  check_like(op, "out", out, result);
  at::Tensor o = out;
  o.copy_(result);
}

}  // namespace

void compressor_out(const CompressorArgs& a, const at::Tensor& out, Provider pv) {
  AAR_CHECK_ARG(a.x.defined() && a.x.dim() == 2 && a.norm_weight.defined() && a.cu_seqlens.has_value() &&
                    a.cu_seqlens->dim() == 1 && a.cu_seqlens->size(0) >= 1 && a.cmp_ratio > 0,
                "compressor_out: x (T, H), norm_weight, cu_seqlens (B + 1) and cmp_ratio > 0 are required");
  const int64_t T = a.x.size(0), B = a.cu_seqlens->size(0) - 1;
  const int64_t rows = std::min<int64_t>(T, T / a.cmp_ratio + B);
  const std::array<int64_t, 2> shape{rows, a.norm_weight.size(0)};
  // Checked before the call: the operator writes the state cache.
  check_out("compressor_out", "out", out, shape, a.x.scalar_type(), a.x.device());
  const at::Tensor r = compressor(a, pv);
  land("compressor_out", "out", out, r);
}

void dynamic_quant_out(const DynamicQuantArgs& a, const at::Tensor& q_out, const at::Tensor& scale_out, Provider pv) {
  const auto [q, s] = dynamic_quant(a, pv);
  check_like("dynamic_quant_out", "q_out", q_out, q);
  check_like("dynamic_quant_out", "scale_out", scale_out, s);
  dense::copy(q_out, q);
  dense::copy(scale_out, s);
}

void vllm_quant_lightning_indexer_out(const VllmQuantLightningIndexerArgs& a, const at::Tensor& indices_out,
                                      Provider pv) {
  AAR_CHECK_ARG(!a.quant.base.return_value, "vllm_quant_lightning_indexer_out: return_value=True is not supported "
                "(the out form keeps the sparse indices only)");
  const at::Tensor idx = std::get<0>(vllm_quant_lightning_indexer(a, pv));
  land("vllm_quant_lightning_indexer_out", "indices_out", indices_out, idx);
}

void sparse_attn_sharedkv_out(const SparseAttnSharedKvArgs& a, const at::Tensor& out, Provider pv) {
  AAR_CHECK_ARG(!a.return_softmax_lse, "sparse_attn_sharedkv_out: return_softmax_lse=True is not supported (the "
                "out form keeps the attention output only)");
  const at::Tensor o = std::get<0>(sparse_attn_sharedkv(a, pv));
  land("sparse_attn_sharedkv_out", "out", out, o);
}

void kv_quant_sparse_attn_sharedkv_out(const KvQuantSparseAttnSharedKvArgs& a, const at::Tensor& out, Provider pv) {
  AAR_CHECK_ARG(!a.base.return_softmax_lse, "kv_quant_sparse_attn_sharedkv_out: return_softmax_lse=True is not "
                "supported (the out form keeps the attention output only)");
  const at::Tensor o = std::get<0>(kv_quant_sparse_attn_sharedkv(a, pv));
  land("kv_quant_sparse_attn_sharedkv_out", "out", out, o);
}

void sparse_attn_sharedkv_metadata_out(const SparseAttnSharedKvMetadataArgs& a, const at::Tensor& out,
                                       Provider pv) {
  const at::Tensor m = sparse_attn_sharedkv_metadata(a, pv);
  land_blob("sparse_attn_sharedkv_metadata_out", out, m);
}

void kv_quant_sparse_attn_sharedkv_metadata_out(const KvQuantSparseAttnSharedKvMetadataArgs& a,
                                                const at::Tensor& out, Provider pv) {
  const at::Tensor m = kv_quant_sparse_attn_sharedkv_metadata(a, pv);
  land_blob("kv_quant_sparse_attn_sharedkv_metadata_out", out, m);
}

void sparse_flash_mla_metadata_out(const SparseFlashMlaMetadataArgs& a, const at::Tensor& out, Provider pv) {
  const at::Tensor m = sparse_flash_mla_metadata(a, pv);
  land_blob("sparse_flash_mla_metadata_out", out, m);
}

void vllm_quant_lightning_indexer_metadata_out(const VllmQuantLightningIndexerMetadataArgs& a, const at::Tensor& out,
                                               Provider pv) {
  const at::Tensor m = vllm_quant_lightning_indexer_metadata(a, pv);
  land_blob("vllm_quant_lightning_indexer_metadata_out", out, m);
}

void transpose_batchmatmul_out(const at::Tensor& input, const at::Tensor& weight,
                               std::optional<c10::IntArrayRef> perm_x1, std::optional<c10::IntArrayRef> perm_x2,
                               std::optional<c10::IntArrayRef> perm_y, const at::Tensor& out, Provider pv) {
  const at::Tensor y = transpose_batchmatmul(input, weight, perm_x1, perm_x2, perm_y, pv);
  land("transpose_batchmatmul_out", "out", out, y);
}

void sparse_flash_mla_out(const SparseFlashMlaArgs& a, const at::Tensor& out, Provider pv) {
  AAR_CHECK_ARG(!a.return_softmax_lse, "sparse_flash_mla_out: return_softmax_lse=True is not supported (the out "
                "form keeps the attention output only)");
  const at::Tensor o = std::get<0>(sparse_flash_mla(a, pv));
  land("sparse_flash_mla_out", "out", out, o);
}

void dynamic_mx_quant_out(const DynamicMxQuantArgs& a, const at::Tensor& y_out, const at::Tensor& scale_out,
                          Provider pv) {
  const auto [y, s] = dynamic_mx_quant(a, pv);
  check_like("dynamic_mx_quant_out", "y_out", y_out, y);
  check_like("dynamic_mx_quant_out", "scale_out", scale_out, s);
  dense::copy(y_out, y);
  dense::copy(scale_out, s);
}

void transpose_quant_batchmatmul_out(const TransposeQuantBatchMatmulArgs& a, const at::Tensor& out, Provider pv) {
  const at::Tensor y = transpose_quant_batchmatmul(a, pv);
  land("transpose_quant_batchmatmul_out", "out", out, y);
}

void quant_matmul_out(const QuantMatmulArgs& a, const at::Tensor& out, Provider pv) {
  const at::Tensor y = quant_matmul(a, pv);
  land("quant_matmul_out", "out", out, y);
}

W8A8DynamicInput rms_norm_dynamic_quant_out(const RmsNormDynamicQuantArgs& a, const at::Tensor& q_out,
                                            const at::Tensor& scale_out, Provider pv) {
  const W8A8DynamicInput r = rms_norm_dynamic_quant(a, pv);
  check_like("rms_norm_dynamic_quant_out", "q_out", q_out, r.q);
  check_like("rms_norm_dynamic_quant_out", "scale_out", scale_out, r.scale);
  dense::copy(q_out, r.q);
  dense::copy(scale_out, r.scale);
  return {q_out, scale_out};
}

W8A8DynamicInput quantize_per_token_out(const at::Tensor& x, const at::Tensor& q_out, const at::Tensor& scale_out,
                                        Provider pv) {
  DynamicQuantArgs q;
  q.input = x;
  dynamic_quant_out(q, q_out, scale_out, pv);
  return {q_out, scale_out};
}

void w8a8_dynamic_matmul_out(const W8A8DynamicInput& x, const at::Tensor& weight_t, const at::Tensor& scale,
                             const at::Tensor& out, Provider pv) {
  QuantMatmulArgs a;
  a.x1 = x.q;
  a.x2 = weight_t;
  a.scale = scale;
  a.pertoken_scale = x.scale;
  a.output_dtype = static_cast<int64_t>(out.scalar_type());
  quant_matmul_out(a, out, pv);
}

void hadamard_rotate_out(const at::Tensor& out, const at::Tensor& x, const at::Tensor& h) {
  AAR_CHECK_ARG(h.dim() == 2 && h.size(0) == h.size(1), "hadamard_rotate_out: h must be a square matrix, got ",
                h.sizes());
  AAR_CHECK_ARG(x.dim() >= 1 && x.size(-1) == h.size(0), "hadamard_rotate_out: x must be (..., ", h.size(0),
                "), got ", x.sizes());
  check_out("hadamard_rotate_out", "out", out, x.sizes(), x.scalar_type(), x.device());
  dense::linear_out(out, x, h);
}

}  // namespace aar::ops
