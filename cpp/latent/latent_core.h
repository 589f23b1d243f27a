// Internal: the latent-space core shared by the MLA family's backends (MLA
// decode, SFA). It owns what those layers have in common:
//  * the weights and their processing (docs/design/mla.md §4: kv_b_proj split into W_UK_T
//    and W_UV; the fused preprocess's weights: npu_mla_prolog_v3 / v2, MLAPO),
//    and their reload in place;
//  * the projections, unquantised or W8A8 (latent/quant.h: dynamic or static, the
//    quantised fused_qkv_a_proj and q_proj through npu_dynamic_quant /
//    npu_quantize and npu_quant_matmul);
//  * the absorbed-query preprocess (docs/design/mla.md §5.2 / §5.4, docs/design/sfa.md §4.2 / §4.1):
//    a token's hidden state to the latent-space query (ql_nope = q_nope W_UK_T,
//    q_pe = RoPE(q_rope)), with the token's latent and rope cache rows written at
//    its slot, natively or through one fused operator:
//      PrologV3 npu_mla_prolog_v3 (unquantised, or W8A8 dynamic: weight_quant_mode 2)
//      Mlapo    vllm-ascend mla_preprocess (W8A8 static, krope_ctkv / nzcache)
//      PrologV2 npu_mla_prolog_v2, fully quantised with an int8 latent cache
//               (the MLA FA-quant decode: an int8 query with per-(token, head)
//               dequant scales)
//    Every path writes the same cache rows (up to quantisation) in the same
//    half-split RoPE order (docs/design/mla.md §1.3) and returns q_c when asked (query_norm,
//    SFA's indexer input);
//  * the intermediates' workspace (decode_workspace.h), shared by every layer of
//    one shape and group, and the views of the step's tensors kept between
//    calls so that a steady-state call makes none;
//  * W_UV on a latent attention output (docs/design/mla.md §5.3 / docs/design/sfa.md §4.4).
// A backend adds its attention call and its own metadata around it.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>

#include "ascend_attn_rt/detail/tensor_binding.h"
#include "ascend_attn_rt/latent/weights.h"
#include "ascend_attn_rt/ops/mla_preprocess.h"
#include "ascend_attn_rt/ops/mla_prolog.h"
#include "decode_workspace.h"

namespace aar::mla::detail {

// The fused preprocess a layer may take (its weights are prepared once).
enum class Fused : int32_t { None = 0, PrologV3 = 1, Mlapo = 2, PrologV2 = 3 };
const char* to_string(Fused f);

struct LatentConfig {
  Dims dims;
  double q_norm_eps = 1e-6;
  double kv_norm_eps = 1e-6;
  Fused fused = Fused::None;
  // Caches in FRACTAL_NZ (cache_mode PA_NZ / nzcache).
  bool kv_nz = false;
  // The fused paths also return q_c (query_norm_flag / enable_inner_out).
  bool query_norm = false;
  // PrologV2 (FA-quant): the int8 latent cache's per-tensor dequant scale: rows
  // hold saturate_int8(rint(c_kv / kv_cache_scale)).
  double kv_cache_scale = 0.0;
  // PrologV3 on an SFA C8 layer: the latent key goes into the packed 656-byte
  // rows (kv_cache_quant_mode 3, ckvkr_repo_mode 1, quant_scale_repo_mode 1,
  // tile 128, k_nope_clip_alpha 1.0); the caller passes the packed cache as the
  // nope cache and an empty rope cache.
  bool sfa_c8_rows = false;
  // Query heads as the attention kernel takes them: the MLA decode kernel pads
  // to a power of two; SFA takes the real heads.
  int64_t heads_padded = 0;
  int64_t workspace_group = 0;
  // DSA-CP (docs/design/sparse_cp.md §7): o_proj is one rank's row-parallel shard of this many.
  int64_t o_proj_shards = 1;
};

// One call's per-token inputs (td tokens).
struct LatentStep {
  at::Tensor x;         // (td, hidden)
  at::Tensor cos, sin;  // (td, R) RoPE rows, MLA half layout
  at::Tensor slots;     // int64 (td) cache slots (-1: not written)
};

// The latent key of a step's tokens when the caller stores it itself (SFA C8,
// docs/design/sfa.md §5: packed into quantised rows): not written to any cache.
struct LatentKv {
  at::Tensor k_nope;  // (td, L) RMSNorm(kv[:L]) * gamma, in the weights' dtype
  at::Tensor k_rope;  // (td, 1, 1, R) interleave->half RoPE(kv[L:]): the caches' half layout
};

// The latent-space query: in the workspace's layout-specific buffers, or (heads
// not padded and a call that needs no stable address) the operators' results.
struct LatentQuery {
  at::Tensor qn;  // ql_nope (td, H(p), L) in the workspace layout (PrologV2: int8)
  at::Tensor qr;  // q_pe    (td, H(p), R) in the workspace layout
  at::Tensor qc;  // q_c (td, Q) when the path produced it (native q-LoRA; fused with query_norm)
  at::Tensor qc_scale;         // (td, 1) fp32 when qc is int8 (W8A8-dynamic prolog's query_norm)
  at::Tensor dequant_scale_q;  // PrologV2: the int8 qn's scales, laid out like qn without its last dim
};

// The native projections of tokens x (new tensors): q_c (T, Q) (x itself
// without q-LoRA), kv_raw (T, L+R), q (T, H*(P+R)).
struct Projections {
  at::Tensor q_c, kv_raw, q;
};

class LatentCore {
 public:
  LatentCore(const LatentConfig& cfg, const Weights& weights);

  const LatentConfig& config() const { return cfg_; }
  const Dims& dims() const { return cfg_.dims; }
  const Weights& weights() const { return w_; }
  // The o_proj tensor handle itself: the DSA-CP full-weight switch (sparse/oproj_switch.h) swaps
  // it for the prefill computation and restores it.
  at::Tensor& o_proj_slot() { return w_.o_proj; }
  QuantType quant() const { return quant_type(w_); }
  at::ScalarType dtype() const { return activation_dtype(w_); }
  c10::Device device() const { return weights_device(w_); }
  const at::Tensor& w_uk_t() const { return w_uk_t_; }
  const at::Tensor& w_uv() const { return w_uv_; }
  Fused fused() const { return cfg_.fused; }
  const DecodeWorkspace* workspace() const { return ws_.get(); }
  // FA-quant (PrologV2): the latent cache's quant multiplier (1, L) and dequant scale (1).
  const at::Tensor& kv_quant_scale() const { return kv_qscale_; }
  const at::Tensor& kv_dequant_scale() const { return kv_dqscale_; }

  // The workspace views for td tokens in `layout`.
  const DecodeViews& views(int64_t td, DecodeLayout layout) { return ws_->views(td, layout); }

  // The absorbed-query preprocess of s.x through `path` (None: native; else
  // the layer's fused path): writes the latent and rope cache rows at s.slots
  // and returns the queries: the workspace's (padded) buffers in the layout of
  // `v` (always when the heads are padded or `stable`: a graph capture needs
  // stable addresses), else the operators' results viewed in that layout.
  // PrologV2's int8 query (never padded) comes in stable buffers of its own
  // when `stable`.
  LatentQuery preprocess(const DecodeViews& v, const LatentStep& s, const at::Tensor& nope_cache,
                         const at::Tensor& rope_cache, Fused path, bool stable);

  // The native projections (quantised or not) of x, as new tensors.
  Projections project(const at::Tensor& x) const;

  // The native preprocess of s.x without cache writes (SFA C8, 
  // docs/design/sfa.md §4.1 / §5): the same queries as preprocess (always in the
  // workspace's buffers, stable addresses), and the latent key in `kv`, which
  // the caller quantises and stores (s.slots is not read). With q-LoRA the
  // normed q-LoRA activations are left in v.qc.
  LatentQuery preprocess_unwritten(const DecodeViews& v, const LatentStep& s, LatentKv& kv);

  // The query half of preprocess_unwritten alone (SFA DSA-CP, docs/design/sparse_cp.md §15): the same
  // queries, and the raw kv_a rows (td, L + R) left in v.kv_raw, neither normed nor rotated (s.slots is
  // not read); write_kv_rows writes such rows later.
  LatentQuery preprocess_query(const DecodeViews& v, const LatentStep& s);
  // The key half of the native preprocess on raw kv_a rows computed elsewhere (a DSA-CP gather):
  // kv4 (n, 1, 1, L + R) normed, rotated and written at slots (n) (-1 skipped) into nope / rope by
  // npu_kv_rmsnorm_rope_cache, as preprocess writes them; cos / sin (n, 1, 1, R).
  void write_kv_rows(const at::Tensor& kv4, const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& slots,
                     const at::Tensor& nope, const at::Tensor& rope);

  // W_UV on the real heads of v.attn_heads, as (td, H*V); valid until the next call.
  const at::Tensor& w_uv_out(const DecodeViews& v, int64_t td);
  // W_UV on a token-major latent output (td, H, L), as (td, H*V)
  // (docs/design/sfa.md §4.4): vllm-ascend's batch_matmul_transpose into the workspace's v.y for
  // fp16/bf16 and at most 1024 tokens, npu_transpose_batchmatmul otherwise
  // (the same maths).
  const at::Tensor& w_uv_out_token_major(const DecodeViews& v, const at::Tensor& attn, int64_t td);

  // docs/design/mla.md §4.6: copies new weights into the layer's tensors and recomputes
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
  // A W8A8 linear ready for npu_quant_matmul: weight (in, out), dequant scale
  // per output channel (input_scale * weight_scale for static), static's int32
  // bias and its per-channel activation quantisation parameters. MXFP8: weight_t
  // the transposed view of the fp8 (out, in) weight, deq_scale the e8m0 pairs
  // (in / 64, out, 2) viewed from (out, in / 64, 2).
  struct QLinear {
    QuantType type = QuantType::None;
    at::Tensor weight_t, deq_scale, bias, inv_scale, offset;
    at::ScalarType act = at::kFloat;
    void prepare(const QuantLinear& l, QuantType t, at::ScalarType act_dtype, bool in_place);
    at::Tensor run(const at::Tensor& x) const;
  };
  void prepare_fused(bool in_place);
  // Token-major results of a fused operator, in the layout of v (see preprocess).
 public:
  // PrologV2's stable query buffers for td tokens (made on first use), viewed
  // in `layout` (qn int8, qr, dequant_scale_q): what a graph capture records.
  LatentQuery fa_query_buffers(int64_t td, DecodeLayout layout);

 private:
  LatentQuery finish(const DecodeViews& v, const at::Tensor& qn, const at::Tensor& qr, int64_t td, bool stable);
  // The step's RoPE rows viewed (td, 1, 1, R), cached per source tensor.
  std::pair<const at::Tensor&, const at::Tensor&> rope_rows(const LatentStep& s, int64_t td);
  // The same rows as (td, R) (the fused operators' operands), cached likewise.
  std::pair<const at::Tensor&, const at::Tensor&> rope_rows_2d(const LatentStep& s, int64_t td);
  // The native projections into the workspace (q_c in v.qc with q-LoRA,
  // kv_raw, ql_nope into the padded query) and q_pe (td, H, 1, R), returned.
  at::Tensor native_query(const DecodeViews& v, const LatentStep& s, const at::Tensor& cos, const at::Tensor& sin);

  LatentConfig cfg_;
  Weights w_;
  at::Tensor w_uk_t_, w_uv_;
  QLinear qkv_a_, q_b_;
  std::optional<PrologWeights> prolog_;
  ops::MlaPrologArgs prolog_args_;
  std::optional<MlapoWeights> mlapo_;
  ops::MlaPreprocessArgs mlapo_args_;
  at::Tensor kv_qscale_, kv_dqscale_;
  std::shared_ptr<DecodeWorkspace> ws_;
  // PrologV2 under graph capture: the int8 query, its rope part and scales at
  // stable addresses, per token count.
  struct FaBuffers {
    at::Tensor qn, qr, dsq;
  };
  std::map<int64_t, FaBuffers> fa_bufs_;
  struct Seen {
    ::aar::detail::TensorBinding cos_src, sin_src, cos2_src, sin2_src, slots_src, y_src, qn_src, qr_src;
    at::Tensor cos4, sin4, cos2, sin2, slots, y2d, qn, qr;
  } seen_;
};

}  // namespace aar::mla::detail
