// Per-layer MLA attention: native or fused decode preprocess, absorbed latent decode
// (FIA v2), un-absorbed prefill with cached context in chunks merged by LSE, W_UV and
// o_proj; W8A8 and FA-quant layers; decode context parallel. forward validates before
// any write and does no host metadata work; layers of one shape and workspace_group
// share a decode workspace and run one at a time; prefill context parallel (PCP, with or
// without DCP).
// Design: docs/design/mla.md §4 (weights), §5 (forward), §6 (DCP); docs/design/cp.md §11 (PCP).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <utility>

#include "ascend_attn_rt/kv_connector.h"
#include "ascend_attn_rt/detail/tensor_binding.h"
#include "ascend_attn_rt/mla/metadata.h"
#include "ascend_attn_rt/latent/weights.h"
#include "ascend_attn_rt/ops/fused_infer_attention.h"
#include "ascend_attn_rt/ops/mla_prolog.h"

namespace aar::graph {
class GraphParams;
}
namespace aar::cp {
class Comm;
class DcpWorkspace;
struct DcpViews;
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
  // The fused decode preprocess npu_mla_prolog_v3 (unquantised or W8A8-dynamic
  // weights): decode-only steps with <= 1024 decode tokens use it. Requires q-LoRA.
  bool enable_prolog = false;
  // W8A8-static layers (upstream enable_mlapo on A2/A3, docs/design/mla.md §4.4 / §5.4):
  // decode-only steps with <= 1024 decode tokens use vllm-ascend's
  // mla_preprocess; other steps the native W8A8 path. Rejected for other
  // weights (upstream silently disables it), for q_norm_eps / kv_norm_eps other
  // than 1e-6 (the kernel takes no epsilon) and for float16 activations (its
  // dequant scales would be int64-packed).
  bool enable_mlapo = false;
  // An FA-quant layer (see above): the int8 latent cache's per-tensor dequant
  // scale (upstream's fak_descale_float), > 0.
  std::optional<double> fa_quant_kv_scale;
  // Caches in FRACTAL_NZ (upstream enable_kv_nz, PD decode nodes): the caches
  // passed to forward are the 5-D NZ tensors of Backend::nz_cache_shape.
  bool enable_kv_nz = false;
  // Graph mode: orders the layer's captured calls (see gqa::ImplConfig).
  int64_t layer_index = -1;
  // Prefill attention in bf16 when the activations are not (docs/design/mla.md §5.5:
  // the NPU's TND MLA kernel takes bf16 only). nullopt: when the operators run
  // on the NPU; the CPU twins attend in any dtype.
  std::optional<bool> prefill_in_bf16;
  // The decode intermediates (projections, padded queries, latent attention
  // output) live in a workspace shared by every Impl of the same shape, dtype,
  // device and group: layers that run one after another share one set of
  // buffers. Impls that may run forward concurrently (two engines on two
  // threads) must use different groups.
  int64_t workspace_group = 0;
  // Decode context parallel (docs/design/mla.md §6, AscendMlaDCPImpl): the DCP group's
  // collectives (not owned; must outlive the layer). Metadata built with
  // dcp_world_size > 1 needs it, with the same size and rank. Under DCP:
  //  * decode: ql_nope | q_pe all-gathered over the group along the heads
  //    (rank-major, W*H heads), latent attention over this rank's KV shard
  //    (FIA v1 BNSD, no head padding, LSE returned), the partials exchanged
  //    (all-to-all) and merged by LSE for this rank's own heads, then W_UV
  //    (docs/design/mla.md §6.2; through the shared exchange of comm/dcp_exchange.h);
  //  * prefill: the new tokens attend locally (no collective); each context
  //    chunk is gathered from this rank's shard (padded local lengths, local
  //    starts), [latent | k_pe] all-gathered over the group and reordered to
  //    each request's tokens, rank-major (docs/design/mla.md §6.3), then as without DCP;
  //  * the KV write is the slot mapping's: this rank's own tokens only;
  //  * graph capture of decode-only buckets (MetadataBuilder
  //    graph_decode_padding pads smaller batches with dummy requests of local
  //    KV length 0): the preprocess and the query gather, the local latent call
  //    (refreshed per step from mla::graph_step_params: block table, local KV
  //    lengths) and the exchange + merge + W_UV + o_proj are recorded; the
  //    intermediates live in the decode workspace and a shared
  //    cp::DcpWorkspace, at stable addresses; the collectives run inside the
  //    recorded prepare calls (captured into the device graph on the NPU).
  // Not with FA-quant layers or NZ caches (docs/design/mla.md §6.2: ND views, no FA-quant).
  cp::Comm* dcp_comm = nullptr;
  // Prefill context parallel, the sharded design (docs/design/cp.md §11): the PCP group's
  // collectives (not owned; must outlive the layer). Metadata built with pcp_world_size > 1
  // needs it, with the same size and rank (and dcp_comm when its dcp_world_size > 1). The
  // forward then takes this rank's rows (Metadata::pcp.num_local_tokens):
  //  * decodes (every PCP rank computes them): the latent attention over this rank's KV shard,
  //    merged over the DCP group as above, then the Wp results all-gathered over PCP and merged;
  //  * prefill rows (head and tail chunks): [latent | k_pe] all-gathered over PCP, restored to
  //    the padded-global order and written through pcp.padded_slot_mapping (this rank's KV
  //    rows only); each chunk attends its own chunk causally and the request's earlier chunks
  //    without a mask (merged by LSE); each context chunk is gathered from the shard and
  //    all-gathered over DCP then PCP, then as without PCP.
  // Eager only (a capture of a PCP forward is refused by name); not with FA-quant layers or NZ
  // caches.
  cp::Comm* pcp_comm = nullptr;
};

enum class DecodePath : int32_t { None = 0, Native = 1, Prolog = 2, Mlapo = 3, FaQuant = 4 };
const char* to_string(DecodePath p);

// Thread safety: one thread at a time per layer. Layers of one shape, dtype, device and
// workspace_group share a decode workspace (ImplConfig::workspace_group): run them one at a
// time (one model's layers in order); layers that may run concurrently (engines on
// different threads) need different groups. (tests/cpp/test_concurrency.cpp)
class Impl {
 public:
  // KV-connector hooks of this layer (kv_connector.h); none by default.
  KvHooks kv_hooks;

  // Processes the weights (docs/design/mla.md §4): splits kv_b_proj, prepares the prolog weights.
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
  // The fused decode preprocess this layer prepared (none / prolog / mlapo / fa_quant).
  DecodePath fused_decode_path() const;
  const at::Tensor& w_uk_t() const;
  const at::Tensor& w_uv() const;
  DecodePath last_decode_path() const { return last_decode_; }
  // Identity of the decode workspace this layer uses: equal for Impls of the
  // same shape, dtype, device and workspace_group (they share one), different
  // otherwise. For tests and diagnostics; nothing may be read through it.
  const void* decode_workspace_id() const;
  void release_views();
  // Weight reload (docs/design/mla.md §4.6): copies the new weights into the tensors the layer
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
                                        const Metadata& md, DecodePath path, bool stable);
  void decode_fia_args(const detail::LatentQuery& q, const at::Tensor& nope_cache, const at::Tensor& rope_cache,
                       const Metadata& md, ops::FiaV2Tensors& t, ops::FiaV2Params& p);
  // W_UV, then o_proj into out_rows.
  void decode_post(const detail::DecodeViews& v, const at::Tensor& out_rows);
  // The DCP decode up to W_UV (docs/design/mla.md §6.2), in the stages a graph capture
  // records: the gathered, split query; the local latent call's arguments; the
  // exchange and merge into the W_UV input.
  const cp::DcpViews& dcp_views(int64_t td, const at::Tensor& like);
  void dcp_stage_query(const cp::DcpViews& w, const detail::DecodeViews& v);
  void dcp_fia_args(const cp::DcpViews& w, const at::Tensor& nope_cache, const at::Tensor& rope_cache,
                    const Metadata& md, ops::FiaTensors& t, ops::FiaParams& p);
  // The latent call over this rank's KV shard (FIA v1 BNSD, LSE returned) for the queries
  // qn (td, N, 1, L) and qr (td, N, 1, R).
  void shard_fia_args(const at::Tensor& qn, const at::Tensor& qr, const at::Tensor& nope_cache,
                      const at::Tensor& rope_cache, const Metadata& md, ops::FiaTensors& t, ops::FiaParams& p);
  // PCP decode (docs/design/cp.md §11): the shard's partial (merged over DCP) merged over the
  // PCP group into the W_UV input of v.
  void pcp_decode_combine(const detail::DecodeViews& v, const at::Tensor& nope_cache, const at::Tensor& rope_cache,
                          const Metadata& md);
  // The PCP merge workspace's views for td rows (docs/design/cp.md §11.5: this rank's (td, H, L + 1)
  // fp32 wire, its all-gather destination and the merge's inputs) and, PCP alone, the one-rank
  // workspace whose split query halves and partial output the shard call uses.
  const cp::DcpViews& pcp_wire_views(int64_t td, const at::Tensor& like);
  const cp::DcpViews& pcp_stage_views(int64_t td, const at::Tensor& like);
  // PCP alone: the shard call's arguments over the staged query, its out= targets (the wire's columns,
  // or s.partial_out when the model dtype is not fp32).
  void pcp_shard_call(const cp::DcpViews& s, const cp::DcpViews& pw, const detail::DecodeViews& v,
                      const at::Tensor& nope_cache, const at::Tensor& rope_cache, const Metadata& md,
                      ops::FiaTensors& t, ops::FiaParams& p, at::Tensor& out, at::Tensor& lse);
  // The PCP all-gather of this rank's wire partial and the merge of the Wp partials into the W_UV
  // input of v.
  void pcp_merge_wire(const cp::DcpViews& pw, const detail::DecodeViews& v);
  // A decode-only PCP bucket (docs/design/cp.md §11.4): preprocess (+ DCP query gather), the
  // shard's latent call (refreshed per step), then the DCP merge, PCP gather + merge, W_UV, o_proj.
  void capture_pcp_decode(graph::GraphParams& g, const at::Tensor& hidden, const at::Tensor& nope_cache,
                          const at::Tensor& rope_cache, const Metadata& md, const at::Tensor& output,
                          DecodePath path);
  // PCP prefill: the local rows' latent c (tp, L) and k_pe (tp, R) all-gathered over PCP,
  // restored and written to the caches; returns the restored rows (Wp * tp).
  std::pair<at::Tensor, at::Tensor> pcp_gather_prefill_kv(const at::Tensor& c, const at::Tensor& k_pe,
                                                          const at::Tensor& nope_cache, const at::Tensor& rope_cache,
                                                          const Metadata& md);
  void dcp_combine(const cp::DcpViews& w, const detail::DecodeViews& v);
  void capture_dcp_decode(graph::GraphParams& g, const at::Tensor& hidden, const at::Tensor& nope_cache,
                          const at::Tensor& rope_cache, const Metadata& md, const at::Tensor& output,
                          DecodePath path);
  const at::Tensor& dcp_decode_attention(const at::Tensor& x, const at::Tensor& nope_cache,
                                         const at::Tensor& rope_cache, const Metadata& md, DecodePath path);
  // The eager decode up to W_UV (preprocess with cache write, latent FIA, W_UV).
  const at::Tensor& decode_attention(const at::Tensor& x, const at::Tensor& nope_cache, const at::Tensor& rope_cache,
                                     const Metadata& md, DecodePath path);
  const detail::DecodeViews& decode_views(const Metadata& md);
  void decode_forward(const at::Tensor& hidden, const at::Tensor& nope_cache, const at::Tensor& rope_cache,
                      const Metadata& md, DecodePath path, const at::Tensor& out_rows);
  void capture_decode(graph::GraphParams& g, const at::Tensor& hidden, const at::Tensor& nope_cache,
                      const at::Tensor& rope_cache, const Metadata& md, const at::Tensor& output, DecodePath path);
  at::Tensor prefill_attention(const at::Tensor& q_nope, const at::Tensor& q_pe, const at::Tensor& k_nope,
                               const at::Tensor& k_pe, const at::Tensor& value, const at::Tensor& nope_cache,
                               const at::Tensor& rope_cache, const Metadata& md) const;

  ImplConfig cfg_;
  // Held weakly by the graph buckets that recorded calls reaching this object (graph::note_layer_life):
  // update / replay of such a bucket refuse it by name once the object is gone.
  std::shared_ptr<const int> life_ = std::make_shared<const int>(0);
  int64_t hp_ = 0;
  // Weights, W_UK_T / W_UV, prolog weights, the preprocess and the decode
  // workspace: the MLA family's shared core (cpp/latent/latent_core.h).
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
  std::shared_ptr<cp::DcpWorkspace> dcp_ws_;  // DCP decode intermediates, shared by the layers of one shape
  // PCP decode: the wire / gather / merge workspace and, PCP alone, the query staging (both shared by shape).
  std::shared_ptr<cp::DcpWorkspace> pcp_ws_, pcp_stage_ws_;
  // The eager CP decode's per-shape views and shard-call arguments (docs/design/cp.md §11.7): made
  // again only when the workspace views they derive from are other tensors (another row count, a
  // grown or replaced workspace); each holds its sources, so a match by identity is the same tensor.
  struct CpDecodeArgs {
    at::Tensor src_part, src_attn, src_wire;  // the views they were made from
    at::Tensor out, lse;                       // the shard call's out= targets
    at::Tensor merged;                         // the W_UV input's (H td, L) rows (the merges' head-major order)
    ops::FiaTensors t;
    ops::FiaParams p;
  };
  CpDecodeArgs dcp_args_, pcp_args_;
  // The shard call's per-step arguments (block table, local KV lengths) and the caches' key views into
  // the kept arguments `a.t` / `a.p` (the queries and targets were set when `a` was made).
  void refresh_shard_args(CpDecodeArgs& a, const at::Tensor& nope_cache, const at::Tensor& rope_cache,
                          const Metadata& md);
  bool fa_quant() const { return cfg_.fa_quant_kv_scale.has_value(); }
};

}  // namespace aar::mla
