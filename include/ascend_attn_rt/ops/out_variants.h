// Out-forms of typed operator wrappers whose schemas return fresh tensors:
// the result lands in a caller-owned tensor (a workspace at a stable address),
// which is what a captured graph needs (every tensor a replay reads or writes
// keeps its address; docs/design/graph.md §1, DESIGN.md "buffers that kernels read in
// graph mode are allocated once").
//
// None of these operators has an out schema (torch_npu
// npu_native_functions_by_codegen.yaml: npu_dynamic_quant,
// npu_transpose_batchmatmul, npu_dynamic_mx_quant, npu_transpose_quant_batchmatmul,
// npu_quant_matmul; third_party/vllm_ascend_ops.txt: compressor,
// npu_vllm_quant_lightning_indexer, npu_sparse_attn_sharedkv,
// npu_kv_quant_sparse_attn_sharedkv and the three metadata operators;
// third_party/cann_ops_transformer_ops.txt: sparse_flash_mla and its metadata), so
// the schemas stay exact: each
// function calls the operator through its wrapper and copies the result into
// `out` (one device copy; under the no-compute provider, nothing). The
// destination's shape and dtype are checked before anything is written to it
// (and, for the compressor, which writes its state cache, before the call).
// Where a plain matmul is the whole operation (the Hadamard rotation) the
// result is computed straight into `out`.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>

#include <optional>

#include "ascend_attn_rt/ops/dsa_compressor.h"
#include "ascend_attn_rt/ops/lightning_indexer.h"
#include "ascend_attn_rt/ops/mx_quant.h"
#include "ascend_attn_rt/ops/provider.h"
#include "ascend_attn_rt/ops/quant.h"
#include "ascend_attn_rt/ops/sparse_attn_sharedkv.h"
#include "ascend_attn_rt/ops/sparse_flash_mla.h"

namespace aar::ops {

// out (min(T, T // cmp_ratio + B), D) in x's dtype (CompressorArgs: T = x
// rows, B = cu_seqlens entries - 1, D = norm_weight's size).
void compressor_out(const CompressorArgs& a, const at::Tensor& out, Provider pv = Provider::Auto);

// q_out: input's shape in the quantised dtype; scale_out: input.shape[:-1] fp32.
void dynamic_quant_out(const DynamicQuantArgs& a, const at::Tensor& q_out, const at::Tensor& scale_out,
                       Provider pv = Provider::Auto);

// The sparse indices (return_value must be false: the values are not kept).
void vllm_quant_lightning_indexer_out(const VllmQuantLightningIndexerArgs& a, const at::Tensor& indices_out,
                                      Provider pv = Provider::Auto);

// out: q's shape and dtype (return_softmax_lse must be false).
void sparse_attn_sharedkv_out(const SparseAttnSharedKvArgs& a, const at::Tensor& out, Provider pv = Provider::Auto);
void kv_quant_sparse_attn_sharedkv_out(const KvQuantSparseAttnSharedKvArgs& a, const at::Tensor& out,
                                       Provider pv = Provider::Auto);

// The DSA metadata blobs (docs/design/dsa.md §3.5) into a builder's address-stable (1024,)
// int32 buffer: the SAS blob of each sparse-attention path and the QLI blob. The copy into `out`
// runs under every provider, the no-compute one included (as the device path's copy launch).
void sparse_attn_sharedkv_metadata_out(const SparseAttnSharedKvMetadataArgs& a, const at::Tensor& out,
                                       Provider pv = Provider::Auto);
void kv_quant_sparse_attn_sharedkv_metadata_out(const KvQuantSparseAttnSharedKvMetadataArgs& a,
                                                const at::Tensor& out, Provider pv = Provider::Auto);
void sparse_flash_mla_metadata_out(const SparseFlashMlaMetadataArgs& a, const at::Tensor& out,
                                   Provider pv = Provider::Auto);
void vllm_quant_lightning_indexer_metadata_out(const VllmQuantLightningIndexerMetadataArgs& a, const at::Tensor& out,
                                               Provider pv = Provider::Auto);

// out: the permuted batched product (transpose_batchmatmul's result shape).
void transpose_batchmatmul_out(const at::Tensor& input, const at::Tensor& weight,
                               std::optional<c10::IntArrayRef> perm_x1, std::optional<c10::IntArrayRef> perm_x2,
                               std::optional<c10::IntArrayRef> perm_y, const at::Tensor& out,
                               Provider pv = Provider::Auto);

// out: q's shape and dtype (return_softmax_lse must be false; docs/design/dsa.md §6, the A5 + BF16 plan).
void sparse_flash_mla_out(const SparseFlashMlaArgs& a, const at::Tensor& out, Provider pv = Provider::Auto);

// y_out: input's shape, float8_e4m3fn; scale_out: the uint8 e8m0 bytes (mx_quant.h's scale shape).
void dynamic_mx_quant_out(const DynamicMxQuantArgs& a, const at::Tensor& y_out, const at::Tensor& scale_out,
                          Provider pv = Provider::Auto);
// out: the permuted quantised batched product in `dtype` (transpose_quant_batchmatmul's result shape).
void transpose_quant_batchmatmul_out(const TransposeQuantBatchMatmulArgs& a, const at::Tensor& out,
                                     Provider pv = Provider::Auto);
// out: (m, n) in output_dtype (npu_quant_matmul's result).
void quant_matmul_out(const QuantMatmulArgs& a, const at::Tensor& out, Provider pv = Provider::Auto);
// x quantised per token into caller-owned rows (x's shape int8, x.shape[:-1] fp32), and the
// W8A8-dynamic matmul of such an input into out (quant.h's two calls, docs/design/dsa.md §5.4).
W8A8DynamicInput quantize_per_token_out(const at::Tensor& x, const at::Tensor& q_out, const at::Tensor& scale_out,
                                        Provider pv = Provider::Auto);
void w8a8_dynamic_matmul_out(const W8A8DynamicInput& x, const at::Tensor& weight_t, const at::Tensor& scale,
                             const at::Tensor& out, Provider pv = Provider::Auto);
// npu_rms_norm_dynamic_quant into caller-owned rows (x's shape int8, x.shape[:-1] fp32).
W8A8DynamicInput rms_norm_dynamic_quant_out(const RmsNormDynamicQuantArgs& a, const at::Tensor& q_out,
                                            const at::Tensor& scale_out, Provider pv = Provider::Auto);

// out = x @ h (x's shape and dtype; a dense::linear_out, h symmetric).
void hadamard_rotate_out(const at::Tensor& out, const at::Tensor& x, const at::Tensor& h);

}  // namespace aar::ops
