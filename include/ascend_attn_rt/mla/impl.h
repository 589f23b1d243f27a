// Per-layer MLA attention (spec mla.md section 5): native preprocess or the
// fused npu_mla_prolog_v3 decode preprocess, absorbed latent decode through
// FIA v2, un-absorbed prefill through FIA v1 with the chunked context merged by
// npu_attention_update, o_proj. `forward` does no host metadata work.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <optional>

#include "ascend_attn_rt/detail/tensor_binding.h"
#include "ascend_attn_rt/mla/metadata.h"
#include "ascend_attn_rt/mla/weights.h"
#include "ascend_attn_rt/ops/fused_infer_attention.h"
#include "ascend_attn_rt/ops/mla_prolog.h"

namespace aar::graph {
class GraphParams;
}
namespace aar::mla::detail {
class LatentCore;
struct DecodeViews;
struct LatentQuery;
}

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
  // Graph mode: orders the layer's captured calls (see gqa::ImplConfig).
  int64_t layer_index = -1;
  // Prefill attention in bf16 when the activations are not (spec 5.5 step 1:
  // the NPU's TND MLA kernel takes bf16 only). nullopt: when the operators run
  // on the NPU; the CPU twins attend in any dtype.
  std::optional<bool> prefill_in_bf16;
  // The decode intermediates (projections, padded queries, latent attention
  // output) live in a workspace shared by every Impl of the same shape, dtype,
  // device and group: layers that run one after another share one set of
  // buffers. Impls that may run forward concurrently (two engines on two
  // threads) must use different groups.
  int64_t workspace_group = 0;
};

enum class DecodePath : int32_t { None = 0, Native = 1, Prolog = 2 };
const char* to_string(DecodePath p);

class Impl {
 public:
  // Processes the weights (spec 4): splits kv_b_proj, prepares the prolog weights.
  Impl(const ImplConfig& cfg, const Weights& weights);

  // hidden (T, hidden_size) with T >= metadata.num_actual_tokens; nope_cache
  // (nb, bs, 1, L) and rope_cache (nb, bs, 1, R) (or their NZ forms),
  // contiguous (any storage offset; other strides are rejected by name); output
  // (T, hidden_size), rows past num_actual_tokens get o_proj(0). metadata ==
  // nullptr (profiling run) zero-fills output. Returns output. While a graph
  // capture is open (graph::GraphParams), a decode-only batch of exactly the
  // bucket's tokens is captured instead (the impl must outlive the graph).
  // A decode keeps views of the last caches and metadata it saw (a model's
  // caches live as long as the model; a cache moved in place by set_/resize_
  // gets new views) and its last kernel arguments; release_views() drops them.
  const at::Tensor& forward(const at::Tensor& hidden, const at::Tensor& nope_cache, const at::Tensor& rope_cache,
                            const Metadata* metadata, const at::Tensor& output);

  const ImplConfig& config() const { return cfg_; }
  int64_t num_heads_padded() const { return hp_; }
  const at::Tensor& w_uk_t() const;
  const at::Tensor& w_uv() const;
  DecodePath last_decode_path() const { return last_decode_; }
  // Identity of the decode workspace this layer uses: equal for Impls of the
  // same shape, dtype, device and workspace_group (they share one), different
  // otherwise. For tests and diagnostics; nothing may be read through it.
  const void* decode_workspace_id() const;
  void release_views();
  // Weight reload (spec 9.17): copies the new weights into the tensors the layer
  // holds (those it was built with: the caller's, aliased) and recomputes the
  // derived ones (W_UK_T, W_UV, the prolog weights) in place, so graph-captured
  // addresses stay valid. Shapes, dtype and device must match. A caller that
  // updated the weight tensors in place itself calls refresh_weights().
  void reload_weights(const Weights& weights);
  void refresh_weights();

 private:
  void validate(const at::Tensor& hidden, const at::Tensor& nope_cache, const at::Tensor& rope_cache,
                const Metadata& md, const at::Tensor& output) const;
  // Decode pieces shared by the eager and the graph-capture paths. The
  // preprocess (the MLA family's shared latent core) writes the caches and
  // returns the FIA queries: the workspace's padded buffers, or (heads not
  // padded, !stable) the RoPE result itself.
  detail::LatentQuery decode_preprocess(const detail::DecodeViews& v, const at::Tensor& x,
                                        const at::Tensor& nope_cache, const at::Tensor& rope_cache,
                                        const Metadata& md, bool use_prolog, bool stable);
  void decode_fia_args(const detail::LatentQuery& q, const at::Tensor& nope_cache, const at::Tensor& rope_cache,
                       const Metadata& md, ops::FiaV2Tensors& t, ops::FiaV2Params& p);
  // W_UV, then o_proj into out_rows.
  void decode_post(const detail::DecodeViews& v, const at::Tensor& out_rows);
  // The eager decode up to W_UV (preprocess with cache write, latent FIA, W_UV).
  const at::Tensor& decode_attention(const at::Tensor& x, const at::Tensor& nope_cache, const at::Tensor& rope_cache,
                                     const Metadata& md, bool use_prolog);
  const detail::DecodeViews& decode_views(const Metadata& md);
  void decode_forward(const at::Tensor& hidden, const at::Tensor& nope_cache, const at::Tensor& rope_cache,
                      const Metadata& md, bool use_prolog, const at::Tensor& out_rows);
  void capture_decode(graph::GraphParams& g, const at::Tensor& hidden, const at::Tensor& nope_cache,
                      const at::Tensor& rope_cache, const Metadata& md, const at::Tensor& output, bool use_prolog);
  at::Tensor prefill_attention(const at::Tensor& q_nope, const at::Tensor& q_pe, const at::Tensor& k_nope,
                               const at::Tensor& k_pe, const at::Tensor& value, const at::Tensor& nope_cache,
                               const at::Tensor& rope_cache, const Metadata& md) const;

  ImplConfig cfg_;
  int64_t hp_ = 0;
  // Weights, W_UK_T / W_UV, prolog weights, the preprocess and the decode
  // workspace: the MLA family's shared core (cpp/mla/latent_core.h).
  std::shared_ptr<detail::LatentCore> core_;
  at::Tensor lse_placeholder_;
  // Views of the last caches seen, keyed by their sources: each binding holds
  // its source (so a pointer match means the same tensor) and its memory and
  // geometry (so an in-place set_/resize_ remakes the view).
  struct SeenViews {
    ::aar::detail::TensorBinding nope_src, rope_src;
    at::Tensor key, key_rope;
  } seen_;
  ops::FiaV2Tensors decode_t_;
  ops::FiaV2Params decode_p_;
  DecodePath last_decode_ = DecodePath::None;
};

}  // namespace aar::mla
