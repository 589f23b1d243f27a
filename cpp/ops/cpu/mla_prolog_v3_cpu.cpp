// CPU twin of npu_mla_prolog_v3, non-quantized form (weight/kv/query quant
// modes 0), cache modes "PA_BSND" (ND (nb, bs, 1, D) caches) and "PA_NZ":
//   c_q   = RMSNorm(x @ weight_dq) * gamma_cq
//   [q_n | q_r] per head = c_q @ weight_uq_qr           (N, D + Dr)
//   query      = q_n @ weight_uk[n]                      (N, Hckv)
//   query_rope = rotate_half RoPE(q_r, cos, sin)
//   [c | k_r]  = x @ weight_dkv_kr;  kv_cache[slot] = RMSNorm(c) * gamma_ckv,
//                kr_cache[slot] = rotate_half RoPE(k_r, cos, sin)
// The RoPE is rotate-half on the columns as the weights order them: weights
// prepared with trans_rope_weight (half-split rope columns) make it equal to
// npu_interleave_rope of the unpermuted projection (spec mla.md 4.2, 6.1).
// Negative cache_index entries are skipped (the kernel documents no check; the
// runtime pads graph batches with -1 slots). Matmul results are rounded to the
// input dtype at the same points as the unfused path.
#include <torch/library.h>

#include "../op_signatures.h"
#include "attention_reference.h"
#include "mla_cache_util.h"

namespace aar::ops::cpu {

at::Tensor rope_half_split(const at::Tensor& u, const at::Tensor& cos, const at::Tensor& sin);

namespace {

constexpr const char* kOp = "npu_mla_prolog_v3";

at::Tensor rms(const at::Tensor& x, const at::Tensor& gamma, double eps) {
  const at::Tensor f = x.to(at::kFloat);
  return f * at::rsqrt(f.pow(2).mean(-1, true) + eps) * gamma.to(at::kFloat);
}

void check_2d(const at::Tensor& t, const char* name, int64_t r, int64_t c) {
  AAR_CHECK_ARG(t.dim() == 2 && t.size(0) == r && t.size(1) == c, kOp, ": ", name, " must be (", r, ", ", c,
                "), got ", t.sizes());
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> mla_prolog_v3(AAR_MLA_PROLOG_V3_PARAMS) {
  for (auto [t, name] : {std::pair<sig::OptT, const char*>{dequant_scale_x, "dequant_scale_x"},
                         {dequant_scale_w_dq, "dequant_scale_w_dq"},
                         {dequant_scale_w_uq_qr, "dequant_scale_w_uq_qr"},
                         {dequant_scale_w_dkv_kr, "dequant_scale_w_dkv_kr"},
                         {quant_scale_ckv, "quant_scale_ckv"},
                         {quant_scale_ckr, "quant_scale_ckr"},
                         {smooth_scales_cq, "smooth_scales_cq"},
                         {actual_seq_len, "actual_seq_len"},
                         {k_nope_clip_alpha, "k_nope_clip_alpha"}}) {
    reject_tensor(kOp, t, name);
  }
  if (query_norm_flag) throw_not_supported(kOp, ": not supported by the CPU twin: query_norm_flag=True");
  reject_int(kOp, weight_quant_mode, 0, "weight_quant_mode");
  reject_int(kOp, kv_cache_quant_mode, 0, "kv_cache_quant_mode");
  reject_int(kOp, query_quant_mode, 0, "query_quant_mode");
  reject_int(kOp, ckvkr_repo_mode, 0, "ckvkr_repo_mode");
  reject_int(kOp, quant_scale_repo_mode, 0, "quant_scale_repo_mode");
  if (qc_qr_scale != 1.0 || kc_scale != 1.0) {
    throw_not_supported(kOp, ": not supported by the CPU twin: qc_qr_scale=", qc_qr_scale, ", kc_scale=", kc_scale,
                        " (only 1.0)");
  }
  for (auto [v, name] : {std::pair<sig::OptInt, const char*>{token_x_dtype, "token_x_dtype"},
                         {weight_dq_dtype, "weight_dq_dtype"},
                         {weight_uq_qr_dtype, "weight_uq_qr_dtype"},
                         {weight_dkv_kr_dtype, "weight_dkv_kr_dtype"},
                         {kv_cache_dtype, "kv_cache_dtype"}}) {
    reject_opt_int(kOp, v, name);
  }
  bool nz = false;
  if (cache_mode == "PA_NZ") {
    nz = true;
  } else if (cache_mode != "PA_BSND") {
    throw_not_supported(kOp, ": not supported by the CPU twin: cache_mode=\"", cache_mode,
                        "\" (only \"PA_BSND\" and \"PA_NZ\")");
  }
  const auto dt = token_x.scalar_type();
  AAR_CHECK_ARG(is_float_dtype(dt), kOp, ": token_x must be float16/bfloat16/float32 (int8 is the quantized form), got ",
                dt);
  AAR_CHECK_ARG(token_x.dim() == 2 || token_x.dim() == 3, kOp, ": token_x must be (T, He) or (B, S, He), got ",
                token_x.sizes());
  const at::Tensor x = token_x.reshape({-1, token_x.size(-1)});
  const int64_t T = x.size(0), He = x.size(1);
  AAR_CHECK_ARG(weight_dq.dim() == 2 && weight_dq.size(0) == He, kOp, ": weight_dq must be (He=", He,
                ", Hcq), got ", weight_dq.sizes());
  const int64_t Hcq = weight_dq.size(1);
  AAR_CHECK_ARG(weight_uk.dim() == 3, kOp, ": weight_uk must be (N, D, Hckv), got ", weight_uk.sizes());
  const int64_t N = weight_uk.size(0), D = weight_uk.size(1), Hckv = weight_uk.size(2);
  const MlaCacheView kvc = MlaCacheView::make(kOp, "kv_cache", kv_cache, nz);
  const MlaCacheView krc = MlaCacheView::make(kOp, "kr_cache", kr_cache, nz);
  const int64_t Dr = krc.dim;
  AAR_CHECK_ARG(kvc.dim == Hckv, kOp, ": kv_cache width ", kvc.dim, " must equal Hckv=", Hckv, " (weight_uk)");
  AAR_CHECK_ARG(kvc.num_blocks == krc.num_blocks && kvc.block_size == krc.block_size, kOp,
                ": kv_cache and kr_cache must have the same blocks");
  check_2d(weight_uq_qr, "weight_uq_qr", Hcq, N * (D + Dr));
  check_2d(weight_dkv_kr, "weight_dkv_kr", He, Hckv + Dr);
  AAR_CHECK_ARG(rmsnorm_gamma_cq.dim() == 1 && rmsnorm_gamma_cq.size(0) == Hcq, kOp,
                ": rmsnorm_gamma_cq must be (Hcq=", Hcq, "), got ", rmsnorm_gamma_cq.sizes());
  AAR_CHECK_ARG(rmsnorm_gamma_ckv.dim() == 1 && rmsnorm_gamma_ckv.size(0) == Hckv, kOp,
                ": rmsnorm_gamma_ckv must be (Hckv=", Hckv, "), got ", rmsnorm_gamma_ckv.sizes());
  const at::Tensor cos = rope_cos.reshape({-1, rope_cos.size(-1)}), sin = rope_sin.reshape({-1, rope_sin.size(-1)});
  check_2d(cos, "rope_cos", T, Dr);
  check_2d(sin, "rope_sin", T, Dr);
  for (const at::Tensor* w : std::initializer_list<const at::Tensor*>{&weight_dq, &weight_uq_qr, &weight_uk, &weight_dkv_kr, &kv_cache, &kr_cache}) {
    AAR_CHECK_ARG(w->scalar_type() == dt, kOp, ": weights and caches must have the token_x dtype ", dt, ", got ",
                  w->scalar_type());
  }
  at::Tensor idx;
  if (cache_index.has_value() && cache_index->defined()) {
    AAR_CHECK_ARG(cache_index->numel() == T, kOp, ": cache_index must have T=", T, " entries, got ",
                  cache_index->numel());
    idx = cache_index->reshape({T}).to(at::kLong).contiguous();
    const int64_t num_slots = kvc.num_blocks * kvc.block_size;
    for (int64_t t = 0; t < T; ++t) {
      AAR_CHECK_ARG(idx.data_ptr<int64_t>()[t] < num_slots, kOp, ": cache_index[", t, "]=",
                    idx.data_ptr<int64_t>()[t], " is out of range [0, ", num_slots, ")");
    }
  }

  const at::Tensor cq = rms(at::matmul(x, weight_dq), rmsnorm_gamma_cq, rmsnorm_epsilon_cq).to(dt);
  const at::Tensor q = at::matmul(cq, weight_uq_qr).view({T, N, D + Dr});
  const at::Tensor query =
      at::bmm(q.narrow(-1, 0, D).transpose(0, 1).to(at::kFloat), weight_uk.to(at::kFloat)).transpose(0, 1).to(dt);
  const at::Tensor query_rope = rope_half_split(q.narrow(-1, D, Dr), cos.unsqueeze(1), sin.unsqueeze(1)).to(dt);
  const at::Tensor ckr = at::matmul(x, weight_dkv_kr);
  const at::Tensor c = rms(ckr.narrow(-1, 0, Hckv), rmsnorm_gamma_ckv, rmsnorm_epsilon_ckv).to(dt);
  const at::Tensor kr = rope_half_split(ckr.narrow(-1, Hckv, Dr), cos, sin).to(dt);
  if (idx.defined()) {
    const int64_t* ip = idx.data_ptr<int64_t>();
    for (int64_t t = 0; t < T; ++t) {
      if (ip[t] < 0) continue;
      kvc.write(ip[t], c[t]);
      krc.write(ip[t], kr[t]);
    }
  }
  std::vector<int64_t> qshape(token_x.sizes().begin(), token_x.sizes().end() - 1);
  std::vector<int64_t> qs = qshape, rs = qshape;
  qs.insert(qs.end(), {N, Hckv});
  rs.insert(rs.end(), {N, Dr});
  const auto f32 = x.options().dtype(at::kFloat);
  return {query.reshape(qs), query_rope.reshape(rs), at::zeros({1}, f32), at::zeros({1}, x.options()),
          at::zeros({1}, f32)};
}

}  // namespace
}  // namespace aar::ops::cpu

TORCH_LIBRARY_IMPL(ascend_cpu, CPU, m) {
  m.impl("npu_mla_prolog_v3", TORCH_FN(aar::ops::cpu::mla_prolog_v3));
}
