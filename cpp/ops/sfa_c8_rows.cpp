// Packing and unpacking of the SFA C8 656-byte KV rows (sfa_c8_rows.h). Packing
// goes through the npu_dynamic_block_quant wrapper and tensor views only, so it
// runs on any provider (NPU, CPU twin, no-compute / meta).
#include "ascend_attn_rt/ops/sfa_c8_rows.h"

#include <ATen/ATen.h>

#include "ascend_attn_rt/errors.h"
#include "ascend_attn_rt/ops/quant.h"

namespace aar::ops {

namespace {

bool is_rope_dtype(at::ScalarType t) { return t == at::kHalf || t == at::kBFloat16; }

std::vector<int64_t> with_last(c10::IntArrayRef sizes, int64_t last) {
  std::vector<int64_t> s(sizes.begin(), sizes.end());
  s.back() = last;
  return s;
}

}  // namespace

at::Tensor pack_sfa_c8_rows(const at::Tensor& k_nope, const at::Tensor& k_rope, Provider pv) {
  return pack_sfa_c8_rows(k_nope, k_rope, at::kChar, pv);
}

at::Tensor pack_sfa_c8_rows(const at::Tensor& k_nope, const at::Tensor& k_rope, at::ScalarType row_dtype,
                            Provider pv) {
  constexpr const char* kWhat = "pack_sfa_c8_rows";
  AAR_CHECK_ARG(row_dtype == at::kChar || row_dtype == at::kFloat8_e4m3fn, kWhat,
                ": row_dtype must be int8 or float8_e4m3fn, got ", row_dtype);
  AAR_CHECK_ARG(k_nope.defined() && k_rope.defined(), kWhat, ": k_nope and k_rope must be defined");
  AAR_CHECK_ARG(k_nope.dim() >= 1 && k_nope.size(-1) == kSfaC8NopeDim, kWhat, ": k_nope must be (..., ",
                kSfaC8NopeDim, "), got ", k_nope.sizes());
  AAR_CHECK_ARG(k_rope.dim() == k_nope.dim() && k_rope.size(-1) == kSfaC8RopeDim &&
                    k_rope.sizes().slice(0, k_rope.dim() - 1) == k_nope.sizes().slice(0, k_nope.dim() - 1),
                kWhat, ": k_rope must be (", with_last(k_nope.sizes(), kSfaC8RopeDim), ") to match k_nope ",
                k_nope.sizes(), ", got ", k_rope.sizes());
  AAR_CHECK_ARG(is_rope_dtype(k_rope.scalar_type()), kWhat, ": k_rope must be float16 or bfloat16 (its bytes are ",
                "stored as they are, 2 per element), got ", k_rope.scalar_type());
  AAR_CHECK_ARG(k_nope.device() == k_rope.device(), kWhat, ": k_nope is on ", k_nope.device(), " but k_rope on ",
                k_rope.device());
  const int64_t rows = k_nope.numel() / kSfaC8NopeDim;
  // Inputs are read only: reshape is fine here (a copy of a strided input at most).
  // dst_type is a torch ScalarType value (1 = int8, as torch_npu documents).
  const int64_t dst_type = static_cast<int64_t>(row_dtype);
  const auto [q, scale] =
      dynamic_block_quant(k_nope.reshape({rows, kSfaC8NopeDim}), /*row_block_size=*/1, /*col_block_size=*/kSfaC8Tile,
                          dst_type, /*min_scale=*/0.0, "rint", /*dst_type_max=*/0.0, pv);
  const at::Tensor rope_bytes = k_rope.reshape({rows, kSfaC8RopeDim}).contiguous().view(at::kChar).view(row_dtype);
  const at::Tensor scale_bytes = scale.reshape({rows, kSfaC8Scales}).contiguous().view(at::kChar).view(row_dtype);
  return at::cat({q.view({rows, kSfaC8NopeDim}), rope_bytes, scale_bytes}, 1)
      .view(with_last(k_nope.sizes(), kSfaC8RowBytes));
}

SfaC8Unpacked unpack_sfa_c8_rows(const at::Tensor& rows, at::ScalarType rope_dtype) {
  constexpr const char* kWhat = "unpack_sfa_c8_rows";
  AAR_CHECK_ARG(rows.defined() && rows.dim() >= 1 && rows.size(-1) == kSfaC8RowBytes, kWhat,
                ": rows must be (..., ", kSfaC8RowBytes, "), got ", rows.defined() ? rows.sizes() : c10::IntArrayRef{});
  const at::ScalarType row_dtype = rows.scalar_type();
  AAR_CHECK_ARG(row_dtype == at::kChar || row_dtype == at::kFloat8_e4m3fn, kWhat,
                ": rows must be int8 or float8_e4m3fn, got ", row_dtype);
  AAR_CHECK_ARG(is_rope_dtype(rope_dtype), kWhat, ": rope_dtype must be float16 or bfloat16, got ", rope_dtype);
  // The rope and scale bytes are read through an int8 view (the same bytes either way).
  const at::Tensor r = rows.reshape({-1, kSfaC8RowBytes}).view(at::kChar);
  SfaC8Unpacked u;
  u.k_nope_q = r.narrow(1, 0, kSfaC8NopeDim).contiguous().view(row_dtype);
  u.k_rope = r.narrow(1, kSfaC8NopeDim, 2 * kSfaC8RopeDim).contiguous().view(rope_dtype);
  u.scale = r.narrow(1, kSfaC8NopeDim + 2 * kSfaC8RopeDim, 4 * kSfaC8Scales).contiguous().view(at::kFloat);
  u.k_nope = (u.k_nope_q.to(at::kFloat).view({-1, kSfaC8Scales, kSfaC8Tile}) * u.scale.unsqueeze(-1))
                 .view({-1, kSfaC8NopeDim});
  u.k_nope_q = u.k_nope_q.view(with_last(rows.sizes(), kSfaC8NopeDim));
  u.k_rope = u.k_rope.view(with_last(rows.sizes(), kSfaC8RopeDim));
  u.scale = u.scale.view(with_last(rows.sizes(), kSfaC8Scales));
  u.k_nope = u.k_nope.view(with_last(rows.sizes(), kSfaC8NopeDim));
  return u;
}

}  // namespace aar::ops
