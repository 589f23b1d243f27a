// CPU twin of vllm-ascend's _C_ascend mla_preprocess (MLAPO), the forms the
// runtime uses (ops/mla_preprocess.h has the maths): quant_mode
// "per_tensor_quant_asymm" (W8A8 static), cache_mode "krope_ctkv" (ND caches
// (nb, bs, 1, D) or (nb, bs, D)) or "nzcache" (NZ (nb, 1, D/c, bs, c)), with
// RoPE (cos and sin given), enable_inner_out. Matmuls are exact on the int8
// operands (float64 accumulation), dequantised in float64 and rounded once to
// the activation dtype; the norms run in fp32 (the q norm's beta is added in
// fp32, as the kernel does). Rejected by name: quant modes
// per_token_quant_symm / per_token_quant_asymm / no_quant (and None, whose
// kernel default is per_token_quant_symm), cache modes kvcache / int8_nzcache,
// RoPE-less calls, int64 (float16-packed) descales, ctkv_scale / q_nope_scale
// other than ones (they act in int8_nzcache only), and kv_cache_out0 /
// kv_cache_out1 other than the kv_cache / kv_cache_rope inputs. Everything is
// validated before the first write.
#include <torch/library.h>

#include "../op_signatures.h"
#include "attention_reference.h"
#include "mla_cache_util.h"

namespace aar::ops::cpu {

at::Tensor rope_half_split(const at::Tensor& u, const at::Tensor& cos, const at::Tensor& sin);

namespace {

constexpr const char* kMlaPreprocessOp = "mla_preprocess";

int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

// The ND (rows, cols) int8 weight from its 4-D NZ staging form (1, C'/32, R', 32)
// (transdata, docs/design/mla.md §4.3), checking the padded sizes.
at::Tensor from_nz(const at::Tensor& z, const char* name, int64_t rows, int64_t cols) {
  AAR_CHECK_ARG(z.scalar_type() == at::kChar, kMlaPreprocessOp, ": ", name, " must be int8 (W8A8), got ", z.scalar_type());
  const int64_t rp = round_up(rows, 16), cp = round_up(cols, 32);
  AAR_CHECK_ARG(z.dim() == 4 && z.size(0) == 1 && z.size(1) == cp / 32 && z.size(2) == rp && z.size(3) == 32, kMlaPreprocessOp,
                ": ", name, " must be the NZ staging layout (1, ", cp / 32, ", ", rp, ", 32) of a (", rows, ", ", cols,
                ") weight, got ", z.sizes());
  return z.select(0, 0).permute({1, 0, 2}).reshape({rp, cp}).narrow(0, 0, rows).narrow(1, 0, cols);
}

const at::Tensor& need(const std::optional<at::Tensor>& t, const char* name) {
  AAR_CHECK_ARG(t.has_value() && t->defined(), kMlaPreprocessOp, ": ", name, " is required (quant_mode per_tensor_quant_asymm)");
  return *t;
}

void check_vec(const at::Tensor& t, const char* name, int64_t n, at::ScalarType dt) {
  AAR_CHECK_ARG(t.dim() == 1 && t.size(0) == n && t.scalar_type() == dt, kMlaPreprocessOp, ": ", name, " must be ", dt, " (", n,
                "), got ", t.scalar_type(), " ", t.sizes());
}

void check_descale(const std::optional<at::Tensor>& t, const char* name, int64_t n) {
  const at::Tensor& d = need(t, name);
  if (d.scalar_type() == at::kLong) {
    throw_not_supported(kMlaPreprocessOp, ": not supported by the CPU twin: an int64 ", name, " (the float16 kernel's packed "
                        "form; pass float32)");
  }
  check_vec(d, name, n, at::kFloat);
}

void check_unit(const std::optional<at::Tensor>& t, const char* name) {
  if (!t.has_value() || !t->defined()) return;
  if (!at::all(t->to(at::kFloat).eq(1.0f)).item<bool>()) {
    throw_not_supported(kMlaPreprocessOp, ": not supported by the CPU twin: ", name, " other than ones (it scales the int8 "
                        "cache of cache_mode int8_nzcache only)");
  }
}

// x -> saturate_int8(rint(x * (1 / scale) + offset)), the reciprocal taken in the activation dtype.
at::Tensor quant_per_tensor(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& offset) {
  const at::Tensor inv = scale.reciprocal().to(at::kFloat);
  return (x.to(at::kFloat) * inv + offset.to(at::kFloat)).round_().clamp_(-128, 127).to(at::kChar);
}

at::Tensor dequant_matmul(const at::Tensor& xq, const at::Tensor& w_nd, const at::Tensor& bias,
                          const at::Tensor& descale) {
  const at::Tensor acc = at::matmul(xq.to(at::kDouble), w_nd.t().to(at::kDouble)) + bias.to(at::kDouble);
  return (acc * descale.to(at::kDouble)).to(at::kFloat);
}

at::Tensor rms(const at::Tensor& x, const at::Tensor& gamma, double eps) {
  const at::Tensor f = x.to(at::kFloat);
  return f * at::rsqrt(f.pow(2).mean(-1, true) + eps) * gamma.to(at::kFloat);
}

bool same_tensor(const at::Tensor& a, const at::Tensor& b) {
  return a.is_same(b) || (a.defined() && b.defined() && a.data_ptr() == b.data_ptr() && a.sizes() == b.sizes() &&
                          a.strides() == b.strides() && a.scalar_type() == b.scalar_type());
}

// The ND view (nb, bs, 1, D) of a krope_ctkv cache given as (nb, bs, 1, D) or (nb, bs, D).
at::Tensor nd4(const at::Tensor& c, const char* name) {
  if (c.dim() == 3) return c.unsqueeze(2);
  AAR_CHECK_ARG(c.dim() == 4 && c.size(2) == 1, kMlaPreprocessOp, ": ", name,
                " must be (num_blocks, block_size, 1, D) or (num_blocks, block_size, D) (cache_mode krope_ctkv), got ",
                c.sizes());
  return c;
}

sig::MlaPreprocessResult mla_preprocess(AAR_MLA_PREPROCESS_PARAMS) {
  const c10::string_view qm = quant_mode.value_or("per_token_quant_symm");
  if (qm != "per_tensor_quant_asymm") {
    throw_not_supported(kMlaPreprocessOp, ": not supported by the CPU twin: quant_mode=\"", qm,
                        "\" (only \"per_tensor_quant_asymm\", W8A8 static)");
  }
  const c10::string_view cm = cache_mode.value_or("krope_ctkv");
  bool nz = false;
  if (cm == "nzcache") {
    nz = true;
  } else if (cm != "krope_ctkv") {
    throw_not_supported(kMlaPreprocessOp, ": not supported by the CPU twin: cache_mode=\"", cm,
                        "\" (only \"krope_ctkv\" and \"nzcache\")");
  }
  if (!cos.has_value() || !sin.has_value() || !cos->defined() || !sin->defined()) {
    throw_not_supported(kMlaPreprocessOp, ": not supported by the CPU twin: a call without RoPE (cos / sin None)");
  }
  check_unit(ctkv_scale, "ctkv_scale");
  check_unit(q_nope_scale, "q_nope_scale");
  AAR_CHECK_ARG(same_tensor(kv_cache_out0, kv_cache) && same_tensor(kv_cache_out1, kv_cache_rope), kMlaPreprocessOp,
                ": kv_cache_out0 / kv_cache_out1 must be the kv_cache / kv_cache_rope inputs (the caches are "
                "written in place)");
  const bool inner = enable_inner_out.value_or(false);

  const auto dt = hiddenState.scalar_type();
  AAR_CHECK_ARG(is_float_dtype(dt), kMlaPreprocessOp, ": hiddenState must be float16/bfloat16/float32, got ", dt);
  AAR_CHECK_ARG(hiddenState.dim() == 2, kMlaPreprocessOp, ": hiddenState must be (T, He), got ", hiddenState.sizes());
  const int64_t T = hiddenState.size(0), He = hiddenState.size(1);
  AAR_CHECK_ARG(wuk.dim() == 3 && wuk.scalar_type() == dt, kMlaPreprocessOp, ": wuk must be ", dt, " (H, P, L), got ",
                wuk.scalar_type(), " ", wuk.sizes());
  const int64_t H = wuk.size(0), P = wuk.size(1), L = wuk.size(2);
  AAR_CHECK_ARG(cos->dim() == 2 && cos->size(0) == T && sin->sizes() == cos->sizes(), kMlaPreprocessOp,
                ": cos / sin must be (T=", T, ", R), got ", cos->sizes(), " / ", sin->sizes());
  // The kernel takes them in the activation dtype; the twin accepts any floating dtype (RoPE in fp32).
  AAR_CHECK_ARG(at::isFloatingType(cos->scalar_type()) && at::isFloatingType(sin->scalar_type()), kMlaPreprocessOp,
                ": cos / sin must be floating point, got ", cos->scalar_type(), " / ", sin->scalar_type());
  const int64_t R = cos->size(1);
  AAR_CHECK_ARG(R % 2 == 0, kMlaPreprocessOp, ": the rope dim must be even, got ", R);
  check_vec(gamma1, "gamma1", gamma1.size(0), dt);
  const int64_t Q = gamma1.size(0);
  check_vec(gamma2, "gamma2", L, dt);
  if (beta1.has_value() && beta1->defined()) check_vec(*beta1, "beta1", Q, dt);
  const int64_t Nqkv = L + R + Q, Nq = H * (P + R);
  const at::Tensor w0 = from_nz(wdqkv, "wdqkv", Nqkv, He);
  const at::Tensor w1 = from_nz(wuq, "wuq", Nq, Q);
  check_descale(descale0, "descale0", Nqkv);
  check_descale(descale1, "descale1", Nq);
  check_vec(need(bias0, "bias0"), "bias0", Nqkv, at::kInt);
  check_vec(need(bias1, "bias1"), "bias1", Nq, at::kInt);
  check_vec(need(quant_scale0, "quant_scale0"), "quant_scale0", 1, dt);
  check_vec(need(quant_scale1, "quant_scale1"), "quant_scale1", 1, dt);
  check_vec(need(quant_offset0, "quant_offset0"), "quant_offset0", 1, at::kChar);
  check_vec(need(quant_offset1, "quant_offset1"), "quant_offset1", 1, at::kChar);

  const MlaCacheView kvc = MlaCacheView::make(kMlaPreprocessOp, "kv_cache", nz ? kv_cache : nd4(kv_cache, "kv_cache"), nz);
  const MlaCacheView krc =
      MlaCacheView::make(kMlaPreprocessOp, "kv_cache_rope", nz ? kv_cache_rope : nd4(kv_cache_rope, "kv_cache_rope"), nz);
  AAR_CHECK_ARG(kvc.dim == L && krc.dim == R, kMlaPreprocessOp, ": kv_cache / kv_cache_rope widths ", kvc.dim, " / ", krc.dim,
                " must be L=", L, " (wuk) / R=", R, " (cos)");
  AAR_CHECK_ARG(kvc.num_blocks == krc.num_blocks && kvc.block_size == krc.block_size, kMlaPreprocessOp,
                ": kv_cache and kv_cache_rope must have the same blocks");
  AAR_CHECK_ARG(kv_cache.scalar_type() == dt && kv_cache_rope.scalar_type() == dt, kMlaPreprocessOp,
                ": the caches must be ", dt, " (krope_ctkv / nzcache hold the activation dtype)");
  auto check_out = [&](const at::Tensor& o, const char* name, std::initializer_list<int64_t> shape) {
    AAR_CHECK_ARG(o.defined() && o.sizes() == c10::IntArrayRef(shape) && o.scalar_type() == dt, kMlaPreprocessOp, ": ", name,
                  " must be ", dt, " ", c10::IntArrayRef(shape), ", got ", o.defined() ? o.scalar_type() : dt, " ",
                  o.defined() ? o.sizes() : c10::IntArrayRef{});
  };
  check_out(q_out0, "q_out0", {T, H, L});
  check_out(q_out1, "q_out1", {T, H, R});
  if (inner) check_out(inner_out, "inner_out", {T, Q});
  AAR_CHECK_ARG(slotmapping.numel() == T && (slotmapping.scalar_type() == at::kInt ||
                                             slotmapping.scalar_type() == at::kLong),
                kMlaPreprocessOp, ": slotmapping must be int32/int64 with T=", T, " entries, got ", slotmapping.scalar_type(), " ",
                slotmapping.sizes());
  const at::Tensor slots = slotmapping.reshape({T}).to(at::kLong).contiguous();
  const int64_t* sp = slots.data_ptr<int64_t>();
  const int64_t num_slots = kvc.num_blocks * kvc.block_size;
  for (int64_t t = 0; t < T; ++t) {
    AAR_CHECK_ARG(sp[t] < num_slots, kMlaPreprocessOp, ": slotmapping[", t, "]=", sp[t], " is out of range [0, ", num_slots, ")");
  }

  // Down projection (kv | q), norms, RoPE.
  const at::Tensor x_q = quant_per_tensor(hiddenState, *quant_scale0, *quant_offset0);
  const at::Tensor y = dequant_matmul(x_q, w0, *bias0, *descale0).to(dt);
  const at::Tensor c_kv = rms(y.narrow(1, 0, L), gamma2, 1e-6).to(dt);
  const at::Tensor k_pe = rope_half_split(y.narrow(1, L, R), *cos, *sin).to(dt);
  at::Tensor c_q = rms(y.narrow(1, L + R, Q), gamma1, 1e-6);
  if (beta1.has_value() && beta1->defined()) c_q = c_q + beta1->to(at::kFloat);
  c_q = c_q.to(dt);
  // Up projection, absorption, RoPE.
  const at::Tensor cq_q = quant_per_tensor(c_q, *quant_scale1, *quant_offset1);
  const at::Tensor q = dequant_matmul(cq_q, w1, *bias1, *descale1).to(dt).view({T, H, P + R});
  const at::Tensor qn =
      at::bmm(q.narrow(-1, 0, P).transpose(0, 1).to(at::kFloat), wuk.to(at::kFloat)).transpose(0, 1).to(dt);
  const at::Tensor qr = rope_half_split(q.narrow(-1, P, R), cos->unsqueeze(1), sin->unsqueeze(1)).to(dt);
  q_out0.copy_(qn);
  q_out1.copy_(qr);
  if (inner) inner_out.copy_(c_q);
  for (int64_t t = 0; t < T; ++t) {
    if (sp[t] < 0) continue;
    kvc.write(sp[t], c_kv[t]);
    krc.write(sp[t], k_pe[t]);
  }
  return {q_out0, kv_cache_out0, q_out1, kv_cache_out1, inner_out};
}

}  // namespace
}  // namespace aar::ops::cpu

TORCH_LIBRARY_IMPL(ascend_cpu_va, CPU, m) { m.impl("mla_preprocess", TORCH_FN(aar::ops::cpu::mla_preprocess)); }
