// Dense tensor work a backend does besides the NPU operators (projections,
// norms, padding, buffer fills). On a device these are ordinary aten kernels;
// they go through here so that the no-compute provider covers them too: under
// Provider::NoCompute they return correctly shaped outputs from the no-compute
// cache and write nothing, so a host-time benchmark measures host work only.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

namespace aar::ops::dense {

// Whether the no-compute provider is selected (the glue outside this file that computes with aten
// checks it the same way).
bool no_compute();

// x (..., in) @ w.T, w (out, in).
at::Tensor linear(const at::Tensor& x, const at::Tensor& w);
void linear_out(const at::Tensor& out, const at::Tensor& x, const at::Tensor& w);
// (b, n, k) @ (b, k, m).
at::Tensor bmm(const at::Tensor& a, const at::Tensor& b);
// out may be a strided view (e.g. the transposed real heads of a padded buffer).
void bmm_out(const at::Tensor& out, const at::Tensor& a, const at::Tensor& b);
// RMSNorm over the last dim, computed in fp32, returned in x's dtype.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& gamma, double eps);
// LayerNorm over the last dimension with gamma and beta, computed in fp32 and
// cast back to x's dtype.
at::Tensor layer_norm(const at::Tensor& x, const at::Tensor& gamma, const at::Tensor& beta, double eps);
// out = layer_norm(x) (out may be x: the result is computed before it is written).
void layer_norm_out(const at::Tensor& out, const at::Tensor& x, const at::Tensor& gamma, const at::Tensor& beta,
                    double eps);
void rms_norm_out(const at::Tensor& out, const at::Tensor& x, const at::Tensor& gamma, double eps);
// (T, H, D) -> (T, Hp, D) with zero heads appended (x itself when Hp == H).
at::Tensor pad_dim1(const at::Tensor& x, int64_t size);
at::Tensor zeros(c10::IntArrayRef shape, const at::TensorOptions& options);
at::Tensor full(c10::IntArrayRef shape, double value, const at::TensorOptions& options);
void copy(const at::Tensor& dst, const at::Tensor& src);
// x itself when contiguous, else a contiguous copy.
at::Tensor contiguous(const at::Tensor& x);
// x's slices along dim at index (1-D int64 / int32), as Tensor::index_select (x of at most 8 dims).
at::Tensor index_select(const at::Tensor& x, int64_t dim, const at::Tensor& index);
// x converted to dtype (x itself when it already has it).
at::Tensor cast(const at::Tensor& x, at::ScalarType dtype);
// x_q * scale in dtype: int8 rows (T, C) with their dequant scales (T, 1).
at::Tensor dequant_rows(const at::Tensor& x_q, const at::Tensor& scale, at::ScalarType dtype);
// [a | b] along the last dimension (the leading dimensions equal).
at::Tensor cat_last(const at::Tensor& a, const at::Tensor& b);
void zero(const at::Tensor& dst);
void fill(const at::Tensor& dst, double value);
// out = -x (out may be a view of a stable buffer: the inverse RoPE's -sin rows).
void neg_out(const at::Tensor& out, const at::Tensor& x);
// out = (x >= 0), bool of x's shape.
void nonneg_out(const at::Tensor& out, const at::Tensor& x);
// out = where(cond, a, b), broadcasting.
void where_out(const at::Tensor& out, const at::Tensor& cond, const at::Tensor& a, const at::Tensor& b);
// out = x[i0, i1]: the rows at index pairs over x's first two dims (i0, i1 1-D int32 / int64 of equal length).
void index2_out(const at::Tensor& out, const at::Tensor& x, const at::Tensor& i0, const at::Tensor& i1);

}  // namespace aar::ops::dense
