// Per-layer SFA attention (DeepSeek-V3.2 sparse attention, spec sparse.md
// section 3): the MLA family's absorbed-query preprocess (shared with the MLA
// backend: cpp/mla/latent_core.h), the lightning indexer (spec 1.2, 3.4) and
// its cache write, top-k selection (or its reuse from an earlier layer),
// sparse flash attention over the selected positions (1.3), W_UV (3.7) and
// o_proj. Every query token goes the same way (SFA has no decode/prefill
// split). `forward` does no host metadata work: lengths, block table, slots and
// RoPE rows are the build's (sfa::MetadataBuilder), at stable addresses.
//
// The preprocess (spec 3.2, sfa/preprocess.h) is chosen once at construction
// from ImplConfig::preprocess: NATIVE (unquantised or W8A8 projections),
// PROLOG_V3 (npu_mla_prolog_v3, query_norm_flag returning q_c for the indexer)
// or MLAPO (mla_preprocess on W8A8-static weights, enable_inner_out returning
// q_c), and downgraded to NATIVE per call outside DecodeOnly / SpecDecoding
// steps and for MLAPO above 1024 input tokens. All three write the same cache
// rows and give the same queries up to quantisation. Not implemented (rejected
// at construction by name): SFA C8 (the packed 656-byte cache; its PROLOG_V3
// form, kv_cache_quant_mode 3, is what a W8A8-dynamic layer would take), MXFP8,
// DSA-CP, DCP and KV offload.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ascend_attn_rt/detail/tensor_binding.h"
#include "ascend_attn_rt/mla/weights.h"
#include "ascend_attn_rt/plan/workspace.h"
#include "ascend_attn_rt/sfa/metadata.h"
#include "ascend_attn_rt/sfa/preprocess.h"
#include "ascend_attn_rt/sfa/topk_buffer.h"

namespace aar::mla::detail {
class LatentCore;
}
namespace aar::graph {
class GraphParams;
}

namespace aar::sfa {

// The lightning indexer's weights (spec 1.2), torch layout (out, in).
struct IndexerWeights {
  at::Tensor wq_b;           // (n_head * head_dim, q_lora_rank) (hidden_size without q-LoRA): q_li = c_q W^T
  at::Tensor wk;             // (head_dim, hidden_size): the indexer key
  at::Tensor weights_proj;   // (n_head, hidden_size): the per-head score weights (no extra scaling, spec 11.7)
  at::Tensor k_norm_weight;  // (head_dim) LayerNorm gamma of the key
  at::Tensor k_norm_bias;    // (head_dim) LayerNorm beta
};

struct IndexerConfig {
  int64_t n_head = 64;
  int64_t head_dim = 128;
  int64_t topk = 2048;        // index_topk K
  double k_norm_eps = 1e-6;
  // GLM-MoE-DSA: the indexer RoPE rotates interleaved pairs (2i, 2i+1) instead
  // of the neox halves (spec 1.1.1), and A2/A3 call torch_npu's indexer.
  bool glm_moe_dsa = false;
};

struct ImplConfig {
  mla::Dims dims;
  double scale = 0.0;  // 0 = 1/sqrt(P+R); DeepSeek-V3.2 passes its YaRN-scaled one
  double q_norm_eps = 1e-6, kv_norm_eps = 1e-6;
  // The layer's indexer; absent: the layer reuses the top-k the last indexer
  // layer left in the model's TopkBuffer (skip_topk, spec 3.3 step 6).
  std::optional<IndexerConfig> indexer;
  // A layer with an indexer also writes its top-k into the TopkBuffer for the
  // layers without one (use_index_cache).
  bool use_index_cache = false;
  plan::DeviceKind device_kind = plan::DeviceKind::A2;
  int64_t layer_index = -1;
  int64_t workspace_group = 0;
  // The preprocess selection inputs (spec 3.2). `quant` must equal the weights'
  // quant type (mla::Weights::quant); `has_q_lora` is taken from dims.
  PreprocessConfig preprocess;
};

enum class TopkSource : int32_t { None = 0, Indexer = 1, Reused = 2 };
const char* to_string(TopkSource s);

class Impl {
 public:
  Impl(const ImplConfig& cfg, const mla::Weights& weights, const std::optional<IndexerWeights>& indexer_weights);
  ~Impl();
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  // hidden (T, hidden_size), T >= the metadata's kernel tokens (its padded
  // query ends); kv_cache the layer's composed cache tuple (compose_kv_cache):
  // (latent (nb, bs, 1, L), rope (nb, bs, 1, R)[, indexer k (nb', bs, 1, D_i)]),
  // contiguous; topk the model's TopkBuffer (needed by layers without an
  // indexer and with use_index_cache; may be null otherwise); output (T,
  // hidden_size): rows past the kernel tokens get o_proj(0) = 0. metadata ==
  // nullptr (profiling run) zero-fills output. While a graph capture is open
  // the layer is captured (every length it reads lives in the builder's stable
  // buffers, so an update re-issues nothing for it).
  const at::Tensor& forward(const at::Tensor& hidden, const std::vector<at::Tensor>& kv_cache, const Metadata* metadata,
                            TopkBuffer* topk, const at::Tensor& output);

  const ImplConfig& config() const { return cfg_; }
  const at::Tensor& w_uk_t() const;
  const at::Tensor& w_uv() const;
  TopkSource last_topk_source() const { return last_topk_; }
  // The top-k rows (T, 1, K) of the last forward (the indexer's result, or the
  // reused buffer view). For tests and tracing.
  const at::Tensor& last_topk() const { return last_topk_rows_; }
  // The preprocess resolved at construction (and why), and the one the last
  // forward took (after the per-call downgrade). For tests and tracing.
  Preprocess preprocess() const { return choice_.kind; }
  const std::string& preprocess_reason() const { return choice_.reason; }
  Preprocess last_preprocess() const { return last_pre_; }
  void release_views();
  void reload_weights(const mla::Weights& weights);

 private:
  struct Caches {
    at::Tensor nope, rope, index_k;
  };
  Caches validate(const at::Tensor& hidden, const std::vector<at::Tensor>& kv_cache, const Metadata& md,
                  TopkBuffer* topk, const at::Tensor& output) const;
  // The layer's work on the first tk tokens, without host metadata work; what
  // a graph capture records.
  void run(const at::Tensor& hidden, const Caches& c, const Metadata& md, TopkBuffer* topk, const at::Tensor& output,
           int64_t tk, bool stable);
  at::Tensor indexer_topk(const at::Tensor& x, const at::Tensor& q_c, const Caches& c, const Metadata& md, int64_t tk);
  at::Tensor indexer_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) const;

  ImplConfig cfg_;
  std::shared_ptr<mla::detail::LatentCore> core_;
  std::optional<IndexerWeights> iw_;
  TopkSource last_topk_ = TopkSource::None;
  PreprocessChoice choice_;
  Preprocess last_pre_ = Preprocess::Native;
  at::Tensor last_topk_rows_;
  struct Seen {
    ::aar::detail::TensorBinding nope_src, rope_src, idx_src;
    at::Tensor nope, rope, idx_rows;  // the SFA kernel's cache views, the indexer cache as (rows, D_i)
  } seen_;
};

}  // namespace aar::sfa
