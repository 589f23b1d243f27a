// CPU twin of npu_mla_prolog_v3 (maths: mla_prolog_common.h), the forms the
// runtime uses (docs/design/mla.md §5.4, docs/design/sfa.md §4.2):
//   weight_quant_mode 0 (unquantised) or 2 (token_x int8 with dequant_scale_x,
//     int8 weight_dq / weight_uq_qr / weight_dkv_kr with their per-channel
//     dequant scales: the W8A8-dynamic PROLOG_V3 of SFA);
//   kv_cache_quant_mode 0 (caches in the activation dtype, "PA_BSND" or
//     "PA_NZ") or 3 (SFA C8: the packed per-tile int8 row, with
//     ckvkr_repo_mode 1, quant_scale_repo_mode 1, tile_size 128, "PA_BSND";
//     k_nope_clip_alpha None or 1.0);
//   query_norm_flag: query_norm = c_q (the indexer's input), with
//     dequant_scale_q_norm (T, 1) in the quantised form.
// Rejected by name: weight_quant_mode 1 (partial) and 3 (MXFP8),
// kv_cache_quant_mode 1 / 2, query_quant_mode 1, smooth_scales_cq,
// quant_scale_ckv / quant_scale_ckr, actual_seq_len, qc_qr_scale / kc_scale
// other than 1.0 and the explicit dtype arguments. Negative cache_index
// entries are skipped (the runtime pads graph batches with -1 slots).
#include <torch/library.h>

#include "../op_signatures.h"
#include "attention_reference.h"
#include "mla_prolog_common.h"

namespace aar::ops::cpu {

namespace {

constexpr const char* kMlaPrologV3Op = "npu_mla_prolog_v3";

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> mla_prolog_v3(AAR_MLA_PROLOG_V3_PARAMS) {
  for (auto [t, name] : {std::pair<sig::OptT, const char*>{quant_scale_ckv, "quant_scale_ckv"},
                         {quant_scale_ckr, "quant_scale_ckr"},
                         {smooth_scales_cq, "smooth_scales_cq"},
                         {actual_seq_len, "actual_seq_len"}}) {
    reject_tensor(kMlaPrologV3Op, t, name);
  }
  if (weight_quant_mode != 0 && weight_quant_mode != 2) {
    throw_not_supported(kMlaPrologV3Op, ": not supported by the CPU twin: weight_quant_mode=", weight_quant_mode,
                        " (only 0, unquantised, and 2, W8A8 with a per-token quantised token_x; 1 is the "
                        "partially quantised form, 3 MXFP8)");
  }
  if (kv_cache_quant_mode != 0 && kv_cache_quant_mode != 3) {
    throw_not_supported(kMlaPrologV3Op, ": not supported by the CPU twin: kv_cache_quant_mode=", kv_cache_quant_mode,
                        " (only 0, unquantised, and 3, the per-tile packed SFA C8 row)");
  }
  reject_int(kMlaPrologV3Op, query_quant_mode, 0, "query_quant_mode");
  const bool tile = kv_cache_quant_mode == 3;
  reject_int(kMlaPrologV3Op, ckvkr_repo_mode, tile ? 1 : 0, "ckvkr_repo_mode");
  reject_int(kMlaPrologV3Op, quant_scale_repo_mode, tile ? 1 : 0, "quant_scale_repo_mode");
  if (tile) reject_int(kMlaPrologV3Op, tile_size, 128, "tile_size");
  if (k_nope_clip_alpha.has_value() && k_nope_clip_alpha->defined()) {
    if (!tile) {
      throw_not_supported(kMlaPrologV3Op, ": not supported by the CPU twin: k_nope_clip_alpha without the per-tile kv_cache "
                          "quantisation (kv_cache_quant_mode 3)");
    }
    const at::Tensor a = k_nope_clip_alpha->to(at::kFloat);
    if (a.numel() != 1 || a.item<float>() != 1.0f) {
      throw_not_supported(kMlaPrologV3Op, ": not supported by the CPU twin: k_nope_clip_alpha other than [1.0] (got ",
                          a.numel() == 1 ? std::to_string(a.item<float>()) : "shape " + c10::str(a.sizes()), ")");
    }
  }
  if (qc_qr_scale != 1.0 || kc_scale != 1.0) {
    throw_not_supported(kMlaPrologV3Op, ": not supported by the CPU twin: qc_qr_scale=", qc_qr_scale, ", kc_scale=", kc_scale,
                        " (only 1.0)");
  }
  for (auto [v, name] : {std::pair<sig::OptInt, const char*>{token_x_dtype, "token_x_dtype"},
                         {weight_dq_dtype, "weight_dq_dtype"},
                         {weight_uq_qr_dtype, "weight_uq_qr_dtype"},
                         {weight_dkv_kr_dtype, "weight_dkv_kr_dtype"},
                         {kv_cache_dtype, "kv_cache_dtype"}}) {
    reject_opt_int(kMlaPrologV3Op, v, name);
  }
  prolog::Mode m;
  m.op = kMlaPrologV3Op;
  if (cache_mode == "PA_NZ") {
    m.nz = true;
  } else if (cache_mode != "PA_BSND") {
    throw_not_supported(kMlaPrologV3Op, ": not supported by the CPU twin: cache_mode=\"", cache_mode,
                        "\" (only \"PA_BSND\" and \"PA_NZ\")");
  }
  m.full_quant = weight_quant_mode == 2;
  m.kv = tile ? prolog::KvQuant::Tile : prolog::KvQuant::None;
  m.query_norm = query_norm_flag;
  prolog::Inputs in{&token_x, &weight_dq, &weight_uq_qr, &weight_uk, &weight_dkv_kr, &rmsnorm_gamma_cq,
                    &rmsnorm_gamma_ckv, &rope_sin, &rope_cos, &kv_cache, &kr_cache};
  in.cache_index = cache_index;
  in.dequant_scale_x = dequant_scale_x;
  in.dequant_scale_w_dq = dequant_scale_w_dq;
  in.dequant_scale_w_uq_qr = dequant_scale_w_uq_qr;
  in.dequant_scale_w_dkv_kr = dequant_scale_w_dkv_kr;
  in.eps_cq = rmsnorm_epsilon_cq;
  in.eps_ckv = rmsnorm_epsilon_ckv;
  return prolog::run(m, in);
}

}  // namespace
}  // namespace aar::ops::cpu

TORCH_LIBRARY_IMPL(ascend_cpu, CPU, m) {
  m.impl("npu_mla_prolog_v3", TORCH_FN(aar::ops::cpu::mla_prolog_v3));
}
