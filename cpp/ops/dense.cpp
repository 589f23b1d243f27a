#include "ascend_attn_rt/ops/dense.h"

#include <ATen/ATen.h>

#include <array>

#include "ascend_attn_rt/ops/provider.h"
#include "noop/output_cache.h"

namespace aar::ops::dense {

bool no_compute() { return provider_override() == Provider::NoCompute; }

namespace {

template <size_t N>
c10::IntArrayRef dims(std::array<int64_t, N>& a, c10::IntArrayRef lead, int64_t last) {
  std::copy(lead.begin(), lead.end(), a.begin());
  a[lead.size()] = last;
  return c10::IntArrayRef(a.data(), lead.size() + 1);
}
}  // namespace

at::Tensor linear(const at::Tensor& x, const at::Tensor& w) {
  if (no_compute()) {
    std::array<int64_t, 6> a{};
    return noop::cached(dims(a, x.sizes().slice(0, x.dim() - 1), w.sizes()[0]), x.scalar_type(), x.device());
  }
  return at::linear(x, w);
}

void linear_out(const at::Tensor& out, const at::Tensor& x, const at::Tensor& w) {
  if (no_compute()) return;
  at::Tensor o = out;
  at::linear_out(o, x, w);
}

at::Tensor bmm(const at::Tensor& a, const at::Tensor& b) {
  if (no_compute()) {
    const std::array<int64_t, 3> s{a.sizes()[0], a.sizes()[1], b.sizes()[2]};
    return noop::cached(c10::IntArrayRef(s.data(), 3), a.scalar_type(), a.device());
  }
  return at::bmm(a, b);
}

void bmm_out(const at::Tensor& out, const at::Tensor& a, const at::Tensor& b) {
  if (no_compute()) return;
  at::Tensor o = out;
  at::bmm_out(o, a, b);
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& gamma, double eps) {
  if (no_compute()) return noop::cached(x.sizes(), x.scalar_type(), x.device());
  const at::Tensor f = x.to(at::kFloat);
  return (f * at::rsqrt(f.pow(2).mean(-1, true) + eps) * gamma.to(at::kFloat)).to(x.scalar_type());
}

at::Tensor layer_norm(const at::Tensor& x, const at::Tensor& gamma, const at::Tensor& beta, double eps) {
  if (no_compute()) return noop::cached(x.sizes(), x.scalar_type(), x.device());
  const int64_t d = x.sizes().back();
  return at::layer_norm(x.to(at::kFloat), {d}, gamma.to(at::kFloat), beta.to(at::kFloat), eps).to(x.scalar_type());
}

void layer_norm_out(const at::Tensor& out, const at::Tensor& x, const at::Tensor& gamma, const at::Tensor& beta,
                    double eps) {
  if (no_compute()) return;
  at::Tensor o = out;
  o.copy_(layer_norm(x, gamma, beta, eps));
}

void rms_norm_out(const at::Tensor& out, const at::Tensor& x, const at::Tensor& gamma, double eps) {
  if (no_compute()) return;
  at::Tensor o = out;
  o.copy_(rms_norm(x, gamma, eps));
}

at::Tensor pad_dim1(const at::Tensor& x, int64_t size) {
  const int64_t h = x.sizes()[1];
  if (h == size) return x;
  if (no_compute()) {
    const std::array<int64_t, 3> s{x.sizes()[0], size, x.sizes()[2]};
    return noop::cached(c10::IntArrayRef(s.data(), 3), x.scalar_type(), x.device());
  }
  return at::constant_pad_nd(x, {0, 0, 0, size - h});
}

at::Tensor zeros(c10::IntArrayRef shape, const at::TensorOptions& options) {
  if (no_compute()) return noop::cached(shape, c10::typeMetaToScalarType(options.dtype()), options.device());
  return at::zeros(shape, options);
}

at::Tensor full(c10::IntArrayRef shape, double value, const at::TensorOptions& options) {
  if (no_compute()) return noop::cached(shape, c10::typeMetaToScalarType(options.dtype()), options.device());
  return at::full(shape, value, options);
}

at::Tensor contiguous(const at::Tensor& x) {
  if (x.is_contiguous()) return x;
  if (no_compute()) return noop::cached(x.sizes(), x.scalar_type(), x.device());
  return x.contiguous();
}

at::Tensor index_select(const at::Tensor& x, int64_t dim, const at::Tensor& index) {
  if (no_compute()) {
    std::array<int64_t, 8> a{};
    const int64_t nd = x.dim(), k = dim < 0 ? dim + nd : dim;
    std::copy(x.sizes().begin(), x.sizes().end(), a.begin());
    a[k] = index.numel();
    return noop::cached(c10::IntArrayRef(a.data(), nd), x.scalar_type(), x.device());
  }
  return x.index_select(dim, index);
}

void copy(const at::Tensor& dst, const at::Tensor& src) {
  if (no_compute()) return;
  at::Tensor d = dst;
  d.copy_(src);
}

at::Tensor cast(const at::Tensor& x, at::ScalarType dtype) {
  if (x.scalar_type() == dtype) return x;
  if (no_compute()) return noop::cached(x.sizes(), dtype, x.device());
  return x.to(dtype);
}

at::Tensor dequant_rows(const at::Tensor& x_q, const at::Tensor& scale, at::ScalarType dtype) {
  if (no_compute()) return noop::cached(x_q.sizes(), dtype, x_q.device());
  return (x_q.to(at::kFloat) * scale.to(at::kFloat)).to(dtype);
}

at::Tensor cat_last(const at::Tensor& a, const at::Tensor& b) {
  if (no_compute()) {
    std::array<int64_t, 6> s{};
    return noop::cached(dims(s, a.sizes().slice(0, a.dim() - 1), a.sizes().back() + b.sizes().back()),
                        a.scalar_type(), a.device());
  }
  return at::cat({a, b}, -1);
}

void fill(const at::Tensor& dst, double value) {
  if (no_compute() || dst.numel() == 0) return;
  at::Tensor d = dst;
  d.fill_(value);
}

void zero(const at::Tensor& dst) {
  if (no_compute() || dst.numel() == 0) return;
  at::Tensor d = dst;
  d.zero_();
}

void neg_out(const at::Tensor& out, const at::Tensor& x) {
  if (no_compute()) return;
  at::Tensor o = out;
  at::neg_out(o, x);
}

void nonneg_out(const at::Tensor& out, const at::Tensor& x) {
  if (no_compute()) return;
  at::Tensor o = out;
  at::ge_out(o, x, 0);
}

void where_out(const at::Tensor& out, const at::Tensor& cond, const at::Tensor& a, const at::Tensor& b) {
  if (no_compute()) return;
  at::Tensor o = out;
  at::where_out(o, cond, a, b);
}

void index2_out(const at::Tensor& out, const at::Tensor& x, const at::Tensor& i0, const at::Tensor& i1) {
  if (no_compute()) return;
  at::Tensor o = out;
  c10::List<std::optional<at::Tensor>> idx;
  idx.push_back(i0);
  idx.push_back(i1);
  at::index_out(o, x, idx);
}

}  // namespace aar::ops::dense
