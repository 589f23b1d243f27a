// No-compute kernels of vllm-ascend's DSA compressor operators (issue 12;
// namespace ascend_noop_va): correctly shaped outputs from the per-thread cache
// (output_cache.h), no arithmetic; the in-place epilogs and the state update of
// the compressor do nothing. Registered for the CPU and the Meta dispatch keys.
//   compressor           -> (min(T, T // r + B), D) in x's dtype, B = cu_seqlens
//                           rows - 1 (else start_pos / seqused rows), D = norm_weight's
//   compressor_metadata  -> cos / sin (num_compressed_tokens, 1, 1, R) in rope_cos's
//                           dtype, slots int32 (rows, 2) (format 2) or (rows) (format 1)
//   compressor_metadata_out -> its three buffers, untouched
#include <torch/library.h>

#include <algorithm>
#include <array>

#include "../op_signatures.h"
#include "ascend_attn_rt/errors.h"
#include "output_cache.h"

namespace aar::ops::noop {
namespace {

at::Tensor compressor(AAR_COMPRESSOR_PARAMS) {
  constexpr const char* op = "ascend_noop_va compressor";
  AAR_CHECK_ARG(x.dim() == 2 && norm_weight.dim() == 1 && cmp_ratio >= 1, op, ": x ", x.sizes(), ", norm_weight ",
                norm_weight.sizes(), ", cmp_ratio ", cmp_ratio);
  int64_t b = 0;
  if (cu_seqlens.has_value() && cu_seqlens->defined()) {
    b = std::max<int64_t>(cu_seqlens->size(0) - 1, 0);
  } else if (start_pos.has_value() && start_pos->defined()) {
    b = start_pos->size(0);
  } else if (seqused.has_value() && seqused->defined()) {
    b = seqused->size(0);
  }
  const int64_t t = x.size(0);
  const std::array<int64_t, 2> s{std::min(t, t / cmp_ratio + b), norm_weight.size(0)};
  return cached(s, x.scalar_type(), x.device());
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> compressor_metadata(AAR_COMPRESSOR_METADATA_PARAMS) {
  constexpr const char* op = "ascend_noop_va compressor_metadata";
  AAR_CHECK_ARG(rope_cos.dim() == 2 && num_compressed_tokens >= 0 &&
                    (slot_mapping_format == 1 || slot_mapping_format == 2),
                op, ": rope_cos ", rope_cos.sizes(), ", num_compressed_tokens ", num_compressed_tokens,
                ", slot_mapping_format ", slot_mapping_format);
  const int64_t rows = num_compressed_tokens;
  const std::array<int64_t, 4> cs{rows, 1, 1, rope_cos.size(1)};
  const at::Tensor cos = cached(cs, rope_cos.scalar_type(), rope_cos.device());
  const at::Tensor sin = cached(cs, rope_cos.scalar_type(), rope_cos.device());
  const std::array<int64_t, 2> ss{rows, 2};
  const at::Tensor slots = cached(c10::IntArrayRef(ss.data(), slot_mapping_format == 2 ? 2 : 1), at::kInt,
                                  rope_cos.device());
  return {cos, sin, slots};
}

std::tuple<at::Tensor&, at::Tensor&, at::Tensor&> compressor_metadata_out(AAR_COMPRESSOR_METADATA_OUT_PARAMS) {
  return {compress_cos, compress_sin, slot_mapping};
}

void kv_compress_epilog(AAR_KV_COMPRESS_EPILOG_PARAMS) {}

void indexer_compress_epilog_v2(AAR_INDEXER_COMPRESS_EPILOG_PARAMS) {}

void register_all(torch::Library& m) {
  m.impl("compressor", TORCH_FN(compressor));
  m.impl("compressor_metadata", TORCH_FN(compressor_metadata));
  m.impl("compressor_metadata_out", TORCH_FN(compressor_metadata_out));
  m.impl("kv_compress_epilog", TORCH_FN(kv_compress_epilog));
  m.impl("indexer_compress_epilog_v2", TORCH_FN(indexer_compress_epilog_v2));
}

}  // namespace
}  // namespace aar::ops::noop

TORCH_LIBRARY_IMPL(ascend_noop_va, CPU, m) { aar::ops::noop::register_all(m); }
TORCH_LIBRARY_IMPL(ascend_noop_va, Meta, m) { aar::ops::noop::register_all(m); }
