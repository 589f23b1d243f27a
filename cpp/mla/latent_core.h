// Internal: the latent-space core shared by the MLA family's backends (MLA
// decode, SFA). It owns what those layers have in common:
//  * the weights and their processing (spec mla 4: kv_b_proj split into W_UK_T
//    and W_UV, the npu_mla_prolog_v3 weights), and their reload in place;
//  * the absorbed-query preprocess (spec mla 5.2 / 5.4, sparse 3.3 step 3 and
//    3.2 PROLOG_V3): a token's hidden state to the latent-space query
//    (ql_nope = q_nope W_UK_T, q_pe = RoPE(q_rope)), with the token's latent and
//    rope cache rows written at its slot, natively or through the fused prolog;
//  * the intermediates' workspace (decode_workspace.h), shared by every layer of
//    one shape and group, and the views of the step's tensors kept between
//    calls so that a steady-state call makes none;
//  * W_UV on a latent attention output (spec mla 5.3 / sparse 3.7).
// A backend adds its attention call and its own metadata around it.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <optional>

#include "ascend_attn_rt/detail/tensor_binding.h"
#include "ascend_attn_rt/mla/weights.h"
#include "ascend_attn_rt/ops/mla_prolog.h"
#include "decode_workspace.h"

namespace aar::mla::detail {

struct LatentConfig {
  Dims dims;
  double q_norm_eps = 1e-6;
  double kv_norm_eps = 1e-6;
  // npu_mla_prolog_v3 may be used (requires q-LoRA).
  bool enable_prolog = false;
  // Caches in FRACTAL_NZ (cache_mode PA_NZ).
  bool kv_nz = false;
  // Query heads as the attention kernel takes them: the MLA decode kernel pads
  // to a power of two; SFA takes the real heads.
  int64_t heads_padded = 0;
  int64_t workspace_group = 0;
};

// One call's per-token inputs (td tokens).
struct LatentStep {
  at::Tensor x;         // (td, hidden)
  at::Tensor cos, sin;  // (td, R) RoPE rows, MLA half layout
  at::Tensor slots;     // int64 (td) cache slots (-1: not written)
};

// The latent key of a step's tokens when the caller stores it itself (SFA C8,
// spec sparse 3.5: packed into quantised rows): not written to any cache.
struct LatentKv {
  at::Tensor k_nope;  // (td, L) RMSNorm(kv[:L]) * gamma, in the weights' dtype
  at::Tensor k_rope;  // (td, 1, 1, R) interleave->half RoPE(kv[L:]): the caches' half layout
};

// The latent-space query: in the workspace's layout-specific buffers, or (heads
// not padded and a call that needs no stable address) the operators' results.
struct LatentQuery {
  at::Tensor qn;  // ql_nope (td, H(p), L) in the workspace layout
  at::Tensor qr;  // q_pe    (td, H(p), R) in the workspace layout
};

class LatentCore {
 public:
  LatentCore(const LatentConfig& cfg, const Weights& weights);

  const LatentConfig& config() const { return cfg_; }
  const Dims& dims() const { return cfg_.dims; }
  const Weights& weights() const { return w_; }
  const at::Tensor& w_uk_t() const { return w_uk_t_; }
  const at::Tensor& w_uv() const { return w_uv_; }
  bool has_prolog() const { return prolog_.has_value(); }
  const DecodeWorkspace* workspace() const { return ws_.get(); }

  // The workspace views for td tokens in `layout`.
  const DecodeViews& views(int64_t td, DecodeLayout layout) { return ws_->views(td, layout); }

  // The absorbed-query preprocess of s.x: writes the latent and rope cache rows
  // at s.slots and returns the queries: the workspace's (padded) buffers in the
  // layout of `v` (always when the heads are padded or `stable`: a graph capture
  // needs stable addresses), else the RoPE result viewed in that layout. With
  // q-LoRA the native path also leaves the normed q-LoRA activations in v.qc.
  LatentQuery preprocess(const DecodeViews& v, const LatentStep& s, const at::Tensor& nope_cache,
                         const at::Tensor& rope_cache, bool use_prolog, bool stable);

  // The native preprocess of s.x without cache writes (SFA C8, spec sparse
  // 3.3 step 3 / 3.5): the same queries as preprocess (always in the
  // workspace's buffers, stable addresses), and the latent key in `kv`, which
  // the caller quantises and stores (s.slots is not read). With q-LoRA the
  // normed q-LoRA activations are left in v.qc.
  LatentQuery preprocess_unwritten(const DecodeViews& v, const LatentStep& s, LatentKv& kv);

  // W_UV on the real heads of v.attn_heads, as (td, H*V); valid until the next call.
  const at::Tensor& w_uv_out(const DecodeViews& v, int64_t td);
  // W_UV on a token-major latent output (td, H, L), as (td, H*V) (spec sparse
  // 3.7): vllm-ascend's batch_matmul_transpose into the workspace's v.y for
  // fp16/bf16 and at most 1024 tokens, npu_transpose_batchmatmul otherwise
  // (the same maths).
  const at::Tensor& w_uv_out_token_major(const DecodeViews& v, const at::Tensor& attn, int64_t td);

  // Spec mla 9.17: copies new weights into the layer's tensors and recomputes
  // the derived ones in place (captured graphs keep valid addresses).
  void reload_weights(const Weights& weights);

  // Drops the views of the last step's tensors (caches and metadata stay alive
  // while a view holds them).
  void release_views() { seen_ = Seen{}; }

  // A view of `rows` leading rows made from `src`, remade only when `src` is
  // another tensor, describes other memory, or the rows differ.
  template <typename Make>
  static const at::Tensor& view_of(const at::Tensor& src, int64_t rows, ::aar::detail::TensorBinding& seen_src,
                                   at::Tensor& seen_view, Make make) {
    if (!seen_src.same(src) || !seen_view.defined() || seen_view.sizes()[0] != rows) {
      seen_view = make();
      seen_src.bind(src);
    }
    return seen_view;
  }

 private:
  LatentConfig cfg_;
  Weights w_;
  at::Tensor w_uk_t_, w_uv_;
  std::optional<PrologWeights> prolog_;
  ops::MlaPrologArgs prolog_args_;
  std::shared_ptr<DecodeWorkspace> ws_;
  struct Seen {
    ::aar::detail::TensorBinding cos_src, sin_src, slots_src, y_src, qn_src, qr_src;
    at::Tensor cos4, sin4, slots, y2d, qn, qr;
  } seen_;
};

}  // namespace aar::mla::detail
