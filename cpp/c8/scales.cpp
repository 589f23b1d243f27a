#include "ascend_attn_rt/c8/scales.h"

#include <ATen/ATen.h>

#include <cmath>

#include "ascend_attn_rt/errors.h"

namespace aar::c8 {

namespace {

// One raw parameter -> fp32 (1, Nkv, D) for this rank, after validation.
at::Tensor prepare_one(const at::Tensor& raw, const char* name, bool is_scale, int64_t nkv, int64_t d,
                       int64_t tp_rank, int64_t tp_size) {
  AAR_CHECK_ARG(raw.defined(), name, " must be a tensor");
  AAR_CHECK_ARG(at::isFloatingType(raw.scalar_type()), name, " must be a floating tensor, got ", raw.scalar_type());
  const int64_t n = raw.numel();
  AAR_CHECK_ARG(n > 0, name, " is empty");
  const at::Tensor flat = raw.detach().reshape({-1}).to(at::kFloat);
  {
    const at::Tensor host = flat.to(at::kCPU).contiguous();
    const float* p = host.data_ptr<float>();
    for (int64_t i = 0; i < n; ++i) {
      AAR_CHECK_ARG(std::isfinite(p[i]), name, "[", i, "]=", p[i], " is not finite");
      if (is_scale) AAR_CHECK_ARG(p[i] != 0.0f, name, "[", i, "]=0: a zero scale cannot dequantise");
      // An offset past the int8 range would saturate every quantised value of its channel.
      if (!is_scale) {
        AAR_CHECK_ARG(p[i] >= -128.0f && p[i] <= 127.0f, name, "[", i, "]=", p[i],
                      " is outside the int8 range [-128, 127] the cache's values are offset within");
      }
    }
  }
  if (n == 1) return flat.reshape({1, 1, 1}).expand({1, nkv, d}).contiguous();
  if (n == nkv * d) return flat.reshape({1, nkv, d}).contiguous();
  AAR_CHECK_ARG(n % d == 0, name, " has ", n, " elements; expected 1 (per-tensor), num_kv_heads*head_size=", nkv * d,
                " (this rank's heads) or a multiple of head_size=", d, " (all KV heads, TP-sharded)");
  const int64_t total = n / d;
  if (total >= tp_size) {
    AAR_CHECK_ARG(total % tp_size == 0 && total / tp_size == nkv, name, " holds ", total,
                  " KV heads; with tp_size=", tp_size, " each rank needs ", nkv,
                  " (num_kv_heads), so expected ", nkv * tp_size, " heads (", nkv * tp_size * d, " elements)");
  } else {
    AAR_CHECK_ARG(tp_size % total == 0 && nkv == 1, name, " holds ", total, " KV heads for tp_size=", tp_size,
                  ": replication needs tp_size to be a multiple of it and num_kv_heads=1, got num_kv_heads=", nkv);
  }
  const int64_t start = tp_rank * total / tp_size;
  return flat.reshape({total, d}).narrow(0, start, nkv).reshape({1, nkv, d}).contiguous();
}

}  // namespace

Scales prepare_scales(const RawScales& raw, int64_t num_kv_heads, int64_t head_size, int64_t tp_rank,
                      int64_t tp_size) {
  AAR_CHECK_ARG(num_kv_heads > 0, "num_kv_heads must be positive, got ", num_kv_heads);
  AAR_CHECK_ARG(head_size > 0, "head_size must be positive, got ", head_size);
  AAR_CHECK_ARG(tp_size > 0, "tp_size must be positive, got ", tp_size);
  AAR_CHECK_ARG(tp_rank >= 0 && tp_rank < tp_size, "tp_rank=", tp_rank, " must be in [0, tp_size=", tp_size, ")");
  Scales s;
  s.num_kv_heads = num_kv_heads;
  s.head_size = head_size;
  s.k_scale = prepare_one(raw.k_scale, "k_scale", true, num_kv_heads, head_size, tp_rank, tp_size);
  s.k_offset = prepare_one(raw.k_offset, "k_offset", false, num_kv_heads, head_size, tp_rank, tp_size);
  s.v_scale = prepare_one(raw.v_scale, "v_scale", true, num_kv_heads, head_size, tp_rank, tp_size);
  s.v_offset = prepare_one(raw.v_offset, "v_offset", false, num_kv_heads, head_size, tp_rank, tp_size);
  s.k_inv_scale = s.k_scale.reciprocal();
  s.v_inv_scale = s.v_scale.reciprocal();
  s.k_antiquant_scale = s.k_scale.reshape({num_kv_heads, 1, head_size});
  s.v_antiquant_scale = s.v_scale.reshape({num_kv_heads, 1, head_size});
  s.k_antiquant_offset = s.k_offset.neg().reshape({num_kv_heads, 1, head_size});
  s.v_antiquant_offset = s.v_offset.neg().reshape({num_kv_heads, 1, head_size});
  s.has_offset = s.k_offset.ne(0).any().item<bool>() || s.v_offset.ne(0).any().item<bool>();
  return s;
}

Scales Scales::to(c10::Device device) const {
  Scales s = *this;
  for (at::Tensor* t : {&s.k_scale, &s.k_offset, &s.v_scale, &s.v_offset, &s.k_inv_scale, &s.v_inv_scale,
                        &s.k_antiquant_scale, &s.v_antiquant_scale, &s.k_antiquant_offset, &s.v_antiquant_offset}) {
    *t = t->to(device);
  }
  return s;
}

}  // namespace aar::c8
