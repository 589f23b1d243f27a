// SFA preprocess selection (sfa/preprocess.h, docs/design/sfa.md §4.2).
#include "ascend_attn_rt/sfa/preprocess.h"

#include "ascend_attn_rt/errors.h"

namespace aar::sfa {

const char* to_string(Preprocess p) {
  switch (p) {
    case Preprocess::Native: return "native";
    case Preprocess::PrologV3: return "prolog_v3";
    case Preprocess::Mlapo: return "mlapo";
  }
  return "unknown";
}

PreprocessChoice resolve_preprocess(const PreprocessConfig& c) {
  AAR_CHECK_ARG(c.dcp_size >= 1, "dcp_size must be >= 1, got ", c.dcp_size);
  using mla::QuantType;
  PreprocessChoice r;
  if (c.kv_offload) {
    r.reason = "KV offload forces NATIVE";
    return r;
  }
  std::string why;
  auto add = [&](const std::string& s) { why += (why.empty() ? "" : "; ") + s; };
  // Row 1: PROLOG_V3.
  const bool v3 = c.is_kv_consumer && ((c.quant == QuantType::W8A8Dynamic && c.enable_sparse_sfa_c8) ||
                                       c.quant == QuantType::MxFp8 || c.quant == QuantType::None);
  if (v3) {
    std::string no;
    if (!c.has_q_lora) no = "no q_a_layernorm / fused_qkv_a_proj (no q-LoRA)";
    else if (c.is_kv_producer) no = "the worker is a KV producer";
    else if (c.quant == QuantType::None && c.enable_sparse_sfa_c8) no = "an unquantised fused_qkv_a_proj with SFA C8";
    else if (c.quant == QuantType::MxFp8) {
      // docs/design/sfa.md §4.2: upstream's MXFP8 PROLOG_V3 is weight_quant_mode 3, which torch_npu 2.14.0 does
      // not document; the native preprocess runs the MXFP8 projections.
      no = "MXFP8 weights (npu_mla_prolog_v3's weight_quant_mode 3 is not documented in torch_npu 2.14.0)";
    }
    else if (c.chunked_q_proj) no = "q_proj is chunked";
    else if (c.dsa_cp) no = "DSA-CP";
    if (no.empty()) {
      r.kind = Preprocess::PrologV3;
      r.reason = std::string("PROLOG_V3: KV consumer with a ") + mla::to_string(c.quant) + " fused_qkv_a_proj" +
                 (c.enable_sparse_sfa_c8 ? " and SFA C8" : "");
      return r;
    }
    add("PROLOG_V3 rejected: " + no);
  }
  // Row 2: MLAPO (DCP forces enable_mlapo off).
  const bool mlapo_on = c.enable_mlapo && c.dcp_size == 1;
  if (c.enable_mlapo && c.dcp_size > 1 && c.quant == QuantType::W8A8Static) add("MLAPO off: DCP forces enable_mlapo=False");
  if (c.quant == QuantType::W8A8Static && mlapo_on) {
    std::string no;
    if (!c.has_q_lora) no = "no q_a_layernorm / fused_qkv_a_proj (no q-LoRA)";
    else if (c.enable_sparse_sfa_c8) no = "SFA C8 is enabled";
    else if (c.dsa_cp) no = "DSA-CP";
    if (no.empty()) {
      r.kind = Preprocess::Mlapo;
      r.reason = "MLAPO: W8A8-static fused_qkv_a_proj with enable_mlapo";
      if (!why.empty()) r.reason += " (" + why + ")";
      return r;
    }
    add("MLAPO rejected: " + no);
  }
  r.reason = "NATIVE" + (why.empty() ? std::string() : " (" + why + ")");
  return r;
}

Preprocess runtime_preprocess(Preprocess resolved, plan::AttentionState state, int64_t num_input_tokens) {
  if (resolved == Preprocess::Native) return resolved;
  if (state != plan::AttentionState::DecodeOnly && state != plan::AttentionState::SpecDecoding) {
    return Preprocess::Native;
  }
  if (resolved == Preprocess::Mlapo && num_input_tokens > kMlapoMaxTokens) return Preprocess::Native;
  return resolved;
}

}  // namespace aar::sfa
