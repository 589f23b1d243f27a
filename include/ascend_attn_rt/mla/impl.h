// Per-layer MLA attention (spec mla.md section 5): native preprocess or the
// fused npu_mla_prolog_v3 decode preprocess, absorbed latent decode through
// FIA v2, un-absorbed prefill through FIA v1 with the chunked context merged by
// npu_attention_update, o_proj. `forward` does no host metadata work.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>

#include "ascend_attn_rt/mla/metadata.h"
#include "ascend_attn_rt/mla/weights.h"

namespace aar::mla {

struct ImplConfig {
  Dims dims;
  double scale = 0.0;           // 0 = 1/sqrt(P+R); the model normally supplies it
  double q_norm_eps = 1e-6;     // q_a_layernorm
  double kv_norm_eps = 1e-6;    // kv_a_layernorm
  // The fused decode preprocess (upstream enable_mlapo): decode-only steps with
  // <= 1024 decode tokens use npu_mla_prolog_v3. Requires q-LoRA.
  bool enable_prolog = false;
  // Caches in FRACTAL_NZ (upstream enable_kv_nz, PD decode nodes): the caches
  // passed to forward are the 5-D NZ tensors of Backend::nz_cache_shape.
  bool enable_kv_nz = false;
};

enum class DecodePath : int32_t { None = 0, Native = 1, Prolog = 2 };
const char* to_string(DecodePath p);

class Impl {
 public:
  // Processes the weights (spec 4): splits kv_b_proj, prepares the prolog weights.
  Impl(const ImplConfig& cfg, const Weights& weights);

  // hidden (T, hidden_size) with T >= metadata.num_actual_tokens; nope_cache
  // (nb, bs, 1, L) and rope_cache (nb, bs, 1, R) (or their NZ forms); output
  // (T, hidden_size), rows past num_actual_tokens get o_proj(0). metadata ==
  // nullptr (profiling run) zero-fills output. Returns output.
  const at::Tensor& forward(const at::Tensor& hidden, const at::Tensor& nope_cache, const at::Tensor& rope_cache,
                            const Metadata* metadata, const at::Tensor& output);

  const ImplConfig& config() const { return cfg_; }
  int64_t num_heads_padded() const { return hp_; }
  const at::Tensor& w_uk_t() const { return w_uk_t_; }
  const at::Tensor& w_uv() const { return w_uv_; }
  DecodePath last_decode_path() const { return last_decode_; }

 private:
  void validate(const at::Tensor& hidden, const at::Tensor& nope_cache, const at::Tensor& rope_cache,
                const Metadata& md, const at::Tensor& output) const;
  at::Tensor decode_attention(const at::Tensor& ql_nope, const at::Tensor& q_pe, const at::Tensor& nope_cache,
                              const at::Tensor& rope_cache, const Metadata& md) const;
  at::Tensor prefill_attention(const at::Tensor& q_nope, const at::Tensor& q_pe, const at::Tensor& k_nope,
                               const at::Tensor& k_pe, const at::Tensor& value, const at::Tensor& nope_cache,
                               const at::Tensor& rope_cache, const Metadata& md) const;

  ImplConfig cfg_;
  Weights w_;
  at::Tensor w_uk_t_, w_uv_;
  std::optional<PrologWeights> prolog_;
  int64_t hp_ = 0;
  DecodePath last_decode_ = DecodePath::None;
};

}  // namespace aar::mla
