// The shared maths of the npu_mla_prolog_v2 / v3 CPU twins (mla_prolog_common.h).
#include "mla_prolog_common.h"

#include "ascend_attn_rt/errors.h"
#include "ascend_attn_rt/ops/sfa_c8_rows.h"
#include "attention_reference.h"
#include "mla_cache_util.h"

namespace aar::ops::cpu {

at::Tensor rope_half_split(const at::Tensor& u, const at::Tensor& cos, const at::Tensor& sin);

namespace prolog {
namespace {

at::Tensor rms(const at::Tensor& x, const at::Tensor& gamma, double eps) {
  const at::Tensor f = x.to(at::kFloat);
  return f * at::rsqrt(f.pow(2).mean(-1, true) + eps) * gamma.to(at::kFloat);
}

void check_2d(const char* op, const at::Tensor& t, const char* name, int64_t r, int64_t c) {
  AAR_CHECK_ARG(t.dim() == 2 && t.size(0) == r && t.size(1) == c, op, ": ", name, " must be (", r, ", ", c,
                "), got ", t.sizes());
}

// A float32 (r, c) dequant / quant scale that the mode requires.
const at::Tensor& need_scale(const char* op, const std::optional<at::Tensor>& t, const char* name, int64_t r,
                             int64_t c, const char* why) {
  AAR_CHECK_ARG(t.has_value() && t->defined(), op, ": ", name, " is required ", why);
  check_2d(op, *t, name, r, c);
  AAR_CHECK_ARG(t->scalar_type() == at::kFloat, op, ": ", name, " must be float32, got ", t->scalar_type());
  return *t;
}

void forbid(const char* op, const std::optional<at::Tensor>& t, const char* name, const char* why) {
  AAR_CHECK_ARG(!(t.has_value() && t->defined()), op, ": ", name, " must be None ", why);
}

// Exact int8 x int8 matmul (float64 accumulation of integers).
at::Tensor int_matmul(const at::Tensor& a, const at::Tensor& b) {
  return at::matmul(a.to(at::kDouble), b.to(at::kDouble));
}

// Per-row symmetric int8: scale = amax(|x|) / 127, q = rint(x / scale) (npu_dynamic_quant's rule).
std::pair<at::Tensor, at::Tensor> quant_rows(const at::Tensor& x) {
  const at::Tensor f = x.to(at::kFloat);
  const at::Tensor scale = f.abs().amax(-1, true).div_(127.0f);
  const at::Tensor safe = at::where(scale.eq(0), at::ones_like(scale), scale);
  return {(f / safe).round_().clamp_(-127, 127).to(at::kChar), scale};
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> run(const Mode& m, const Inputs& in) {
  const char* op = m.op;
  const at::Tensor& token_x = *in.token_x;
  const auto dt = in.gamma_cq->scalar_type();
  AAR_CHECK_ARG(is_float_dtype(dt), op, ": rmsnorm_gamma_cq must be float16/bfloat16/float32, got ", dt);
  if (m.full_quant) {
    AAR_CHECK_ARG(token_x.scalar_type() == at::kChar, op, ": token_x must be int8 in the quantised form, got ",
                  token_x.scalar_type());
  } else {
    AAR_CHECK_ARG(token_x.scalar_type() == dt, op, ": token_x must have the activation dtype ", dt,
                  " (rmsnorm_gamma_cq's) in the unquantised form, got ", token_x.scalar_type());
  }
  AAR_CHECK_ARG(token_x.dim() == 2 || token_x.dim() == 3, op, ": token_x must be (T, He) or (B, S, He), got ",
                token_x.sizes());
  const at::Tensor x = token_x.reshape({-1, token_x.size(-1)});
  const int64_t T = x.size(0), He = x.size(1);
  const at::Tensor& w_dq = *in.weight_dq;
  AAR_CHECK_ARG(w_dq.dim() == 2 && w_dq.size(0) == He, op, ": weight_dq must be (He=", He, ", Hcq), got ",
                w_dq.sizes());
  const int64_t Hcq = w_dq.size(1);
  const at::Tensor& w_uk = *in.weight_uk;
  AAR_CHECK_ARG(w_uk.dim() == 3, op, ": weight_uk must be (N, D, Hckv), got ", w_uk.sizes());
  const int64_t N = w_uk.size(0), D = w_uk.size(1), Hckv = w_uk.size(2);
  AAR_CHECK_ARG(w_uk.scalar_type() == dt, op, ": weight_uk must have the activation dtype ", dt, ", got ",
                w_uk.scalar_type());
  AAR_CHECK_ARG(in.rope_cos->dim() >= 1 && in.rope_sin->dim() >= 1, op, ": rope_cos / rope_sin must not be scalars");
  const int64_t Dr = in.rope_cos->size(-1);
  const at::Tensor cos = in.rope_cos->reshape({-1, Dr}), sin = in.rope_sin->reshape({-1, in.rope_sin->size(-1)});
  check_2d(op, cos, "rope_cos", T, Dr);
  check_2d(op, sin, "rope_sin", T, Dr);
  // The kernel takes them in the activation dtype; the twin accepts any floating
  // dtype (its RoPE computes in fp32 and rounds to the activation dtype).
  AAR_CHECK_ARG(at::isFloatingType(cos.scalar_type()) && at::isFloatingType(sin.scalar_type()), op,
                ": rope_cos / rope_sin must be floating point, got ", cos.scalar_type(), " / ", sin.scalar_type());
  AAR_CHECK_ARG(Dr % 2 == 0, op, ": the rope dim must be even, got ", Dr);
  check_2d(op, *in.weight_uq_qr, "weight_uq_qr", Hcq, N * (D + Dr));
  check_2d(op, *in.weight_dkv_kr, "weight_dkv_kr", He, Hckv + Dr);
  AAR_CHECK_ARG(in.gamma_cq->dim() == 1 && in.gamma_cq->size(0) == Hcq, op, ": rmsnorm_gamma_cq must be (Hcq=", Hcq,
                "), got ", in.gamma_cq->sizes());
  AAR_CHECK_ARG(in.gamma_ckv->dim() == 1 && in.gamma_ckv->size(0) == Hckv, op, ": rmsnorm_gamma_ckv must be (Hckv=",
                Hckv, "), got ", in.gamma_ckv->sizes());
  const auto wdt = m.full_quant ? at::kChar : dt;
  for (auto [w, name] : {std::pair<const at::Tensor*, const char*>{in.weight_dq, "weight_dq"},
                         {in.weight_uq_qr, "weight_uq_qr"},
                         {in.weight_dkv_kr, "weight_dkv_kr"}}) {
    AAR_CHECK_ARG(w->scalar_type() == wdt, op, ": ", name, " must be ", wdt,
                  m.full_quant ? " in the quantised form" : " (the activation dtype)", ", got ", w->scalar_type());
  }
  at::Tensor dsx, dsw_dq, dsw_uq, dsw_dkv;
  if (m.full_quant) {
    const char* why = "in the quantised form";
    dsx = need_scale(op, in.dequant_scale_x, "dequant_scale_x", T, 1, why);
    dsw_dq = need_scale(op, in.dequant_scale_w_dq, "dequant_scale_w_dq", 1, Hcq, why);
    dsw_uq = need_scale(op, in.dequant_scale_w_uq_qr, "dequant_scale_w_uq_qr", 1, N * (D + Dr), why);
    dsw_dkv = need_scale(op, in.dequant_scale_w_dkv_kr, "dequant_scale_w_dkv_kr", 1, Hckv + Dr, why);
  } else {
    const char* why = "in the unquantised form";
    forbid(op, in.dequant_scale_x, "dequant_scale_x", why);
    forbid(op, in.dequant_scale_w_dq, "dequant_scale_w_dq", why);
    forbid(op, in.dequant_scale_w_uq_qr, "dequant_scale_w_uq_qr", why);
    forbid(op, in.dequant_scale_w_dkv_kr, "dequant_scale_w_dkv_kr", why);
  }

  // Caches.
  const at::Tensor& kv_cache = *in.kv_cache;
  const at::Tensor& kr_cache = *in.kr_cache;
  MlaCacheView kvc, krc;
  at::Tensor qs_ckv;
  int64_t num_slots = 0;
  switch (m.kv) {
    case KvQuant::None:
    case KvQuant::Channel: {
      kvc = MlaCacheView::make(op, "kv_cache", kv_cache, m.nz);
      krc = MlaCacheView::make(op, "kr_cache", kr_cache, m.nz);
      AAR_CHECK_ARG(kvc.dim == Hckv, op, ": kv_cache width ", kvc.dim, " must equal Hckv=", Hckv, " (weight_uk)");
      AAR_CHECK_ARG(krc.dim == Dr, op, ": kr_cache width ", krc.dim, " must equal Dr=", Dr, " (rope_cos)");
      AAR_CHECK_ARG(kvc.num_blocks == krc.num_blocks && kvc.block_size == krc.block_size, op,
                    ": kv_cache and kr_cache must have the same blocks");
      const auto kvdt = m.kv == KvQuant::Channel ? at::kChar : dt;
      AAR_CHECK_ARG(kv_cache.scalar_type() == kvdt, op, ": kv_cache must be ", kvdt, ", got ",
                    kv_cache.scalar_type());
      AAR_CHECK_ARG(kr_cache.scalar_type() == dt, op, ": kr_cache must have the activation dtype ", dt, ", got ",
                    kr_cache.scalar_type());
      if (m.kv == KvQuant::Channel) {
        qs_ckv = need_scale(op, in.quant_scale_ckv, "quant_scale_ckv", 1, Hckv, "with an int8 kv_cache");
      }
      num_slots = kvc.num_blocks * kvc.block_size;
      break;
    }
    case KvQuant::Tile: {
      AAR_CHECK_ARG(!m.nz, op, ": the per-tile quantised (packed) kv_cache is ND (cache_mode \"PA_BSND\")");
      AAR_CHECK_ARG(Hckv == kSfaC8NopeDim && Dr == kSfaC8RopeDim, op, ": the packed per-tile kv_cache row is laid "
                    "out for Hckv=", kSfaC8NopeDim, ", Dr=", kSfaC8RopeDim, ", got Hckv=", Hckv, ", Dr=", Dr);
      AAR_CHECK_ARG(kv_cache.dim() == 4 && kv_cache.size(2) == 1 && kv_cache.size(3) == kSfaC8RowBytes &&
                        (kv_cache.scalar_type() == at::kChar || kv_cache.scalar_type() == at::kFloat8_e4m3fn),
                    op, ": kv_cache must be the packed int8 (A2/A3) or float8_e4m3fn (A5) cache (num_blocks, block_size, 1, ", kSfaC8RowBytes,
                    "), got ", kv_cache.scalar_type(), " ", kv_cache.sizes());
      AAR_CHECK_ARG(dt == at::kHalf || dt == at::kBFloat16, op, ": the packed row stores the rope bytes of a "
                    "float16/bfloat16 activation, got ", dt);
      num_slots = kv_cache.size(0) * kv_cache.size(1);
      break;
    }
  }
  at::Tensor idx;
  if (in.cache_index.has_value() && in.cache_index->defined()) {
    AAR_CHECK_ARG(in.cache_index->numel() == T, op, ": cache_index must have T=", T, " entries, got ",
                  in.cache_index->numel());
    AAR_CHECK_ARG(in.cache_index->scalar_type() == at::kLong || in.cache_index->scalar_type() == at::kInt, op,
                  ": cache_index must be int64, got ", in.cache_index->scalar_type());
    idx = in.cache_index->reshape({T}).to(at::kLong).contiguous();
    const int64_t* ip = idx.data_ptr<int64_t>();
    for (int64_t t = 0; t < T; ++t) {
      AAR_CHECK_ARG(ip[t] < num_slots, op, ": cache_index[", t, "]=", ip[t], " is out of range [0, ", num_slots, ")");
    }
  }

  // The query path.
  const auto f32 = x.options().dtype(at::kFloat);
  at::Tensor cq_raw, q;
  if (m.full_quant) {
    cq_raw = (int_matmul(x, w_dq) * dsx.to(at::kDouble) * dsw_dq.to(at::kDouble)).to(at::kFloat);
  } else {
    cq_raw = at::matmul(x, w_dq);
  }
  const at::Tensor cq = rms(cq_raw, *in.gamma_cq, in.eps_cq).to(dt);
  at::Tensor cq_q, cq_scale;
  if (m.full_quant) {
    std::tie(cq_q, cq_scale) = quant_rows(cq);
    q = (int_matmul(cq_q, *in.weight_uq_qr) * cq_scale.to(at::kDouble) * dsw_uq.to(at::kDouble)).to(dt);
  } else {
    q = at::matmul(cq, *in.weight_uq_qr);
  }
  q = q.view({T, N, D + Dr});
  at::Tensor query =
      at::bmm(q.narrow(-1, 0, D).transpose(0, 1).to(at::kFloat), w_uk.to(at::kFloat)).transpose(0, 1).to(dt);
  const at::Tensor query_rope = rope_half_split(q.narrow(-1, D, Dr), cos.unsqueeze(1), sin.unsqueeze(1)).to(dt);
  at::Tensor ds_q_nope = at::zeros({1}, f32);
  if (m.kv == KvQuant::Channel) {
    auto [qq, s] = quant_rows(query);  // per (token, head) over Hckv
    query = qq;
    ds_q_nope = s;  // (T, N, 1)
  }

  // The key path.
  at::Tensor ckr;
  if (m.full_quant) {
    ckr = (int_matmul(x, *in.weight_dkv_kr) * dsx.to(at::kDouble) * dsw_dkv.to(at::kDouble)).to(at::kFloat);
  } else {
    ckr = at::matmul(x, *in.weight_dkv_kr);
  }
  const at::Tensor c = rms(ckr.narrow(-1, 0, Hckv), *in.gamma_ckv, in.eps_ckv).to(dt);
  const at::Tensor kr = rope_half_split(ckr.narrow(-1, Hckv, Dr), cos, sin).to(dt);
  if (idx.defined()) {
    const int64_t* ip = idx.data_ptr<int64_t>();
    switch (m.kv) {
      case KvQuant::None:
        for (int64_t t = 0; t < T; ++t) {
          if (ip[t] < 0) continue;
          kvc.write(ip[t], c[t]);
          krc.write(ip[t], kr[t]);
        }
        break;
      case KvQuant::Channel: {
        const at::Tensor c8 = (c.to(at::kFloat) * qs_ckv.view({Hckv})).round_().clamp_(-128, 127).to(at::kChar);
        for (int64_t t = 0; t < T; ++t) {
          if (ip[t] < 0) continue;
          kvc.write(ip[t], c8[t]);
          krc.write(ip[t], kr[t]);
        }
        break;
      }
      case KvQuant::Tile: {
        // (T, 656) in the cache's dtype: int8 (A2/A3) or float8_e4m3fn (A5), refused otherwise by name.
        const at::Tensor rows = pack_sfa_c8_rows(c, kr, kv_cache.scalar_type());
        const at::Tensor flat = kv_cache.view({-1, kSfaC8RowBytes});
        for (int64_t t = 0; t < T; ++t) {
          if (ip[t] < 0) continue;
          flat.select(0, ip[t]).copy_(rows[t]);
        }
        break;
      }
    }
  }

  std::vector<int64_t> lead(token_x.sizes().begin(), token_x.sizes().end() - 1);
  std::vector<int64_t> qs = lead, rs = lead;
  qs.insert(qs.end(), {N, Hckv});
  rs.insert(rs.end(), {N, Dr});
  at::Tensor qn_out = at::zeros({1}, x.options().dtype(dt)), ds_qn_out = at::zeros({1}, f32);
  if (m.query_norm) {
    if (m.full_quant) {
      qn_out = cq_q;
      ds_qn_out = cq_scale;  // (T, 1)
    } else {
      qn_out = cq;
    }
  }
  return {query.reshape(qs), query_rope.reshape(rs), ds_q_nope, qn_out, ds_qn_out};
}

}  // namespace prolog
}  // namespace aar::ops::cpu
