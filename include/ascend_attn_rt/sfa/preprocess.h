// SFA's preprocess selection (docs/design/sfa.md §4.2): NATIVE, PROLOG_V3
// (npu_mla_prolog_v3) or MLAPO (vllm-ascend's mla_preprocess), resolved once per
// layer from an explicit configuration, then downgraded per call. Pure: no
// tensors, usable (and tested) on its own.
//
//   | condition (in order)                                              | candidate |
//   | is_kv_consumer and (qt == w8a8_dynamic and enable_sparse_sfa_c8    | PROLOG_V3 |
//   |                     or qt == mxfp8 or qt == none)                  |           |
//   | qt == w8a8_static and enable_mlapo (forced off by dcp_size > 1)    | MLAPO     |
//   | otherwise                                                         | NATIVE    |
// A candidate is rejected (falls through to the next row) when: the layer has
// no q_a_layernorm / fused_qkv_a_proj (no q-LoRA); PROLOG_V3: the worker is a
// KV producer, qt is none with SFA C8, or q_proj is chunked; MLAPO: SFA C8 is
// on. DSA-CP rejects both; KV offload forces NATIVE.
// Per call: NATIVE unless attn_state is DecodeOnly or SpecDecoding; MLAPO with
// more than 1024 input tokens also falls back to NATIVE.
#pragma once

#include <cstdint>
#include <string>

#include "ascend_attn_rt/latent/quant.h"
#include "ascend_attn_rt/plan/attention_state.h"

namespace aar::sfa {

enum class Preprocess : int32_t { Native = 0, PrologV3 = 1, Mlapo = 2 };
const char* to_string(Preprocess p);  // "native", "prolog_v3", "mlapo"

struct PreprocessConfig {
  mla::QuantType quant = mla::QuantType::None;  // fused_qkv_a_proj's quant method type (qt)
  bool has_q_lora = true;         // q_a_layernorm and fused_qkv_a_proj exist
  bool is_kv_consumer = false;    // PD disaggregation role (both may hold: kv_both)
  bool is_kv_producer = false;
  bool enable_mlapo = false;
  bool enable_sparse_sfa_c8 = false;
  bool chunked_q_proj = false;    // upstream's chunked (layer-sharded) q_proj
  bool dsa_cp = false;            // DSA context parallel
  int64_t dcp_size = 1;           // decode context parallel world size
  bool kv_offload = false;        // sparse KV offload
};

struct PreprocessChoice {
  Preprocess kind = Preprocess::Native;
  std::string reason;  // which row chose it and why earlier candidates were rejected
};

// The construction-time choice. dcp_size < 1 is rejected by name.
PreprocessChoice resolve_preprocess(const PreprocessConfig& c);

// MLAPO's input-token limit (docs/design/sfa.md §4.2, docs/design/mla.md §5.1).
constexpr int64_t kMlapoMaxTokens = 1024;

// The per-call path of a layer that resolved to `resolved`.
Preprocess runtime_preprocess(Preprocess resolved, plan::AttentionState state, int64_t num_input_tokens);

}  // namespace aar::sfa
