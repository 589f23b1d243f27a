// CPU twin of npu_kv_rmsnorm_rope_cache (docs/design/ops.md §4.5), cache modes "PA"
// (ND caches) and "PA_NZ". c = kv[..., :L], r = kv[..., L:]:
// c_n = c / sqrt(mean(c^2) + eps) * gamma (fp32, cast to kv dtype),
// r_e = interleave_rope(r). ckv_cache.flat[index[t]] = c_n[t], k_cache.flat[index[t]] = r_e[t];
// negative indices (PAD_SLOT_ID) are skipped. Everything is validated before
// the first write. c_kv_scale (fp32, one element or L) quantises the latent
// into an int8 ckv_cache: saturate_int8(rint(c_n * c_kv_scale)) (the scale is the
// multiplier, the reciprocal of the dequant scale: upstream's A5 FA-quant passes
// fak_descale_reciprocal [verify on hardware]); is_output_kv still returns the
// unquantised c_n. k_rope_scale, the offsets and `v` are rejected.
#include <torch/library.h>

#include "../op_signatures.h"
#include "attention_reference.h"
#include "mla_cache_util.h"

namespace aar::ops::cpu {

at::Tensor rope_half_split(const at::Tensor& u, const at::Tensor& cos, const at::Tensor& sin);
at::Tensor deinterleave(const at::Tensor& x);

namespace {

constexpr const char* kKvRmsnormRopeCacheOp = "npu_kv_rmsnorm_rope_cache";

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> kv_rmsnorm_rope_cache(AAR_KV_RMSNORM_ROPE_CACHE_PARAMS) {
  reject_tensor(kKvRmsnormRopeCacheOp, k_rope_scale, "k_rope_scale");
  reject_tensor(kKvRmsnormRopeCacheOp, k_rope_offset, "k_rope_offset");
  reject_tensor(kKvRmsnormRopeCacheOp, c_kv_offset, "c_kv_offset");
  reject_tensor(kKvRmsnormRopeCacheOp, v, "v");
  bool nz = false;
  if (cache_mode == "PA_NZ") {
    nz = true;
  } else if (cache_mode != "PA" && cache_mode != "PA_BNSD") {
    throw_not_supported(kKvRmsnormRopeCacheOp, ": not supported by the CPU twin: cache_mode=\"", cache_mode,
                        "\" (only \"PA\", \"PA_BNSD\" and \"PA_NZ\")");
  }
  const MlaCacheView kc = MlaCacheView::make(kKvRmsnormRopeCacheOp, "k_cache", k_cache, nz);
  const MlaCacheView cc = MlaCacheView::make(kKvRmsnormRopeCacheOp, "ckv_cache", ckv_cache, nz);
  const int64_t L = cc.dim, R = kc.dim;
  AAR_CHECK_ARG(is_float_dtype(kv.scalar_type()), kKvRmsnormRopeCacheOp, ": kv must be float16/bfloat16/float32, got ",
                kv.scalar_type());
  AAR_CHECK_ARG(kv.dim() == 4 && kv.size(1) == 1 && kv.size(3) == L + R, kKvRmsnormRopeCacheOp, ": kv must be (B, 1, S, L+R=", L + R,
                ") for ckv_cache width L=", L, " and k_cache width R=", R, ", got ", kv.sizes());
  AAR_CHECK_ARG(R % 2 == 0, kKvRmsnormRopeCacheOp, ": k_cache width must be even, got ", R);
  AAR_CHECK_ARG(kc.num_blocks == cc.num_blocks && kc.block_size == cc.block_size, kKvRmsnormRopeCacheOp,
                ": k_cache and ckv_cache must have the same blocks, got ", k_cache.sizes(), " and ", ckv_cache.sizes());
  const bool quant = c_kv_scale.has_value() && c_kv_scale->defined();
  AAR_CHECK_ARG(k_cache.scalar_type() == kv.scalar_type(), kKvRmsnormRopeCacheOp, ": k_cache dtype must equal the kv dtype ",
                kv.scalar_type(), ", got ", k_cache.scalar_type());
  AAR_CHECK_ARG(ckv_cache.scalar_type() == (quant ? at::kChar : kv.scalar_type()), kKvRmsnormRopeCacheOp, ": ckv_cache must be ",
                quant ? "int8 with c_kv_scale" : "of the kv dtype (int8 needs c_kv_scale)", ", got ",
                ckv_cache.scalar_type());
  if (quant) {
    AAR_CHECK_ARG(c_kv_scale->scalar_type() == at::kFloat && (c_kv_scale->numel() == 1 || c_kv_scale->numel() == L),
                  kKvRmsnormRopeCacheOp, ": c_kv_scale must be float32 with 1 or L=", L, " elements, got ", c_kv_scale->scalar_type(),
                  " ", c_kv_scale->sizes());
  }
  AAR_CHECK_ARG(gamma.dim() == 1 && gamma.size(0) == L, kKvRmsnormRopeCacheOp, ": gamma must be (L=", L, "), got ", gamma.sizes());
  const int64_t b = kv.size(0), s = kv.size(2), n = b * s;
  for (const at::Tensor* t : {&cos, &sin}) {
    AAR_CHECK_ARG(t->dim() == 4 && t->size(0) == b && t->size(1) == 1 && t->size(2) == s && t->size(3) == R, kKvRmsnormRopeCacheOp,
                  ": ", t == &cos ? "cos" : "sin", " must be (B=", b, ", 1, S=", s, ", R=", R, "), got ",
                  t->sizes());
  }
  AAR_CHECK_ARG(index.scalar_type() == at::kLong || index.scalar_type() == at::kInt, kKvRmsnormRopeCacheOp,
                ": index must be int64 (or int32), got ", index.scalar_type());
  AAR_CHECK_ARG(index.numel() == n, kKvRmsnormRopeCacheOp, ": index must have B*S=", n, " slots, got ", index.numel());
  const at::Tensor idx = index.reshape({n}).to(at::kLong).contiguous();
  const int64_t* ip = idx.data_ptr<int64_t>();
  const int64_t num_slots = kc.num_blocks * kc.block_size;
  for (int64_t t = 0; t < n; ++t) {
    AAR_CHECK_ARG(ip[t] < num_slots, kKvRmsnormRopeCacheOp, ": index[", t, "]=", ip[t], " is out of range [0, ", num_slots,
                  ") (num_blocks * block_size); negative slots are skipped");
  }

  const at::Tensor kvf = kv.to(at::kFloat);
  const at::Tensor c = kvf.narrow(-1, 0, L);
  const at::Tensor c_n = (c * at::rsqrt(c.pow(2).mean(-1, true) + epsilon) * gamma.to(at::kFloat)).to(kv.scalar_type());
  const at::Tensor r_e = rope_half_split(deinterleave(kv.narrow(-1, L, R)), cos, sin).to(kv.scalar_type());
  at::Tensor c2 = c_n.reshape({n, L});
  const at::Tensor r2 = r_e.reshape({n, R});
  if (quant) {
    c2 = (c2.to(at::kFloat) * c_kv_scale->to(at::kFloat).reshape({-1})).round_().clamp_(-128, 127).to(at::kChar);
  }
  for (int64_t t = 0; t < n; ++t) {
    if (ip[t] < 0) continue;
    cc.write(ip[t], c2[t]);
    kc.write(ip[t], r2[t]);
  }
  if (is_output_kv) return {k_cache, ckv_cache, r_e, c_n};
  const at::Tensor empty = at::empty({0}, kv.options());
  return {k_cache, ckv_cache, empty, empty};
}

}  // namespace
}  // namespace aar::ops::cpu

TORCH_LIBRARY_IMPL(ascend_cpu, CPU, m) {
  m.impl("npu_kv_rmsnorm_rope_cache", TORCH_FN(aar::ops::cpu::kv_rmsnorm_rope_cache));
}
