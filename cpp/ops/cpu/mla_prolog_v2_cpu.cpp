// CPU twin of npu_mla_prolog_v2 (maths: mla_prolog_common.h), the form the
// runtime uses: the A2/A3 FA-quant decode preprocess (docs/design/mla.md §5.4) -- full
// quantisation (token_x int8 with its per-token dequant_scale_x, int8
// weight_dq / weight_uq_qr / weight_dkv_kr with per-channel dequant scales)
// and a quantised int8 kv_cache (quant_scale_ckv), kr_cache unquantised,
// cache modes "PA_BSND" and "PA_NZ". The query comes out int8, quantised per
// (token, head), with dequant_scale_q_nope (T, N, 1). The caches are written in
// place (the schema does not mark them mutable; torch_npu documents the
// in-place write) and returned. Rejected by name: the unquantised and the
// partially quantised forms, an unquantised kv_cache with quantised inputs,
// smooth_scales_cq and quant_scale_ckr (an int8 kr_cache).
#include <torch/library.h>

#include "../op_signatures.h"
#include "attention_reference.h"
#include "mla_prolog_common.h"

namespace aar::ops::cpu {

namespace {

constexpr const char* kMlaPrologV2Op = "npu_mla_prolog_v2";

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> mla_prolog_v2(AAR_MLA_PROLOG_V2_PARAMS) {
  reject_tensor(kMlaPrologV2Op, smooth_scales_cq, "smooth_scales_cq");
  reject_tensor(kMlaPrologV2Op, quant_scale_ckr, "quant_scale_ckr");
  if (token_x.scalar_type() != at::kChar) {
    throw_not_supported(kMlaPrologV2Op, ": not supported by the CPU twin: a ", token_x.scalar_type(), " token_x (the CPU "
                        "twin implements the fully quantised form with an int8 kv_cache, the FA-quant decode; "
                        "npu_mla_prolog_v3 covers the unquantised one)");
  }
  if (kv_cache.scalar_type() != at::kChar) {
    throw_not_supported(kMlaPrologV2Op, ": not supported by the CPU twin: a ", kv_cache.scalar_type(), " kv_cache with the "
                        "quantised inputs (only an int8 kv_cache with quant_scale_ckv)");
  }
  prolog::Mode m;
  m.op = kMlaPrologV2Op;
  if (cache_mode == "PA_NZ") {
    m.nz = true;
  } else if (cache_mode != "PA_BSND") {
    throw_not_supported(kMlaPrologV2Op, ": not supported by the CPU twin: cache_mode=\"", cache_mode,
                        "\" (only \"PA_BSND\" and \"PA_NZ\")");
  }
  m.full_quant = true;
  m.kv = prolog::KvQuant::Channel;
  prolog::Inputs in{&token_x, &weight_dq, &weight_uq_qr, &weight_uk, &weight_dkv_kr, &rmsnorm_gamma_cq,
                    &rmsnorm_gamma_ckv, &rope_sin, &rope_cos, &kv_cache, &kr_cache};
  in.cache_index = cache_index;
  in.dequant_scale_x = dequant_scale_x;
  in.dequant_scale_w_dq = dequant_scale_w_dq;
  in.dequant_scale_w_uq_qr = dequant_scale_w_uq_qr;
  in.dequant_scale_w_dkv_kr = dequant_scale_w_dkv_kr;
  in.quant_scale_ckv = quant_scale_ckv;
  in.eps_cq = rmsnorm_epsilon_cq;
  in.eps_ckv = rmsnorm_epsilon_ckv;
  auto [query, query_rope, ds_q_nope, qn, ds_qn] = prolog::run(m, in);
  return {query, query_rope, kv_cache, kr_cache, ds_q_nope};
}

}  // namespace
}  // namespace aar::ops::cpu

TORCH_LIBRARY_IMPL(ascend_cpu, CPU, m) {
  m.impl("npu_mla_prolog_v2", TORCH_FN(aar::ops::cpu::mla_prolog_v2));
}
