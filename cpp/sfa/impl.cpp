// Per-layer SFA forward (spec sparse.md section 3).
#include "ascend_attn_rt/sfa/impl.h"

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <cmath>
#include <utility>

#include "../common/kv_cache.h"
#include "../mla/latent_core.h"
#include "ascend_attn_rt/errors.h"
#include "ascend_attn_rt/graph/graph_params.h"
#include "ascend_attn_rt/ops/dense.h"
#include "ascend_attn_rt/ops/lightning_indexer.h"
#include "ascend_attn_rt/ops/quant.h"
#include "ascend_attn_rt/ops/rotary_mul.h"
#include "ascend_attn_rt/ops/sparse_flash_attention.h"
#include "ascend_attn_rt/sfa/backend.h"

namespace aar::sfa {

const char* to_string(TopkSource s) {
  switch (s) {
    case TopkSource::None: return "none";
    case TopkSource::Indexer: return "indexer";
    case TopkSource::Reused: return "reused";
  }
  return "unknown";
}

namespace {

using mla::detail::LatentCore;

// The layout every SFA cache is read in (contiguous, spec 3.1).
constexpr const char* kCacheLayout = "(num_blocks, block_size, 1, head_dim)";

void check_cache(const at::Tensor& c, const char* name, int64_t width, const Metadata& md, at::ScalarType dtype,
                 c10::Device device) {
  AAR_CHECK_ARG(c.defined() && c.dim() == 4 && c.size(1) == md.block_size && c.size(2) == 1 && c.size(3) == width,
                name, " must have shape (num_blocks, block_size=", md.block_size, ", 1, ", width, "), got ",
                c.defined() ? c.sizes() : c10::IntArrayRef{});
  AAR_CHECK_ARG(c.size(0) >= md.num_blocks, name, " has ", c.size(0), " blocks, fewer than the metadata's ",
                md.num_blocks);
  AAR_CHECK_ARG(c.scalar_type() == dtype, name, " dtype ", c.scalar_type(), " differs from hidden_states dtype ",
                dtype);
  AAR_CHECK_ARG(c.device() == device, name, " is on ", c.device(), " but the layer's weights are on ", device);
  ::aar::detail::check_kv_cache_layout(c, name, kCacheLayout);
}

}  // namespace

Impl::Impl(const ImplConfig& cfg, const mla::Weights& weights, const std::optional<IndexerWeights>& iw)
    : cfg_(cfg), iw_(iw) {
  const mla::Dims& d = cfg_.dims;
  if (cfg_.scale == 0.0) cfg_.scale = 1.0 / std::sqrt(static_cast<double>(d.qk_nope_head_dim + d.qk_rope_head_dim));
  AAR_CHECK_ARG(cfg_.indexer.has_value() == iw_.has_value(),
                cfg_.indexer.has_value() ? "the layer has an indexer config but no indexer_weights"
                                         : "indexer_weights were given but the layer has no indexer config");
  AAR_CHECK_ARG(!cfg_.use_index_cache || cfg_.indexer.has_value(),
                "use_index_cache writes the layer's top-k for later layers: it needs an indexer");
  if (cfg_.indexer.has_value()) {
    const IndexerConfig& ic = *cfg_.indexer;
    AAR_CHECK_ARG(ic.n_head > 0 && ic.head_dim > 0 && ic.topk > 0, "indexer n_head, head_dim and topk must be "
                  "positive, got ", ic.n_head, ", ", ic.head_dim, ", ", ic.topk);
    AAR_CHECK_ARG(d.qk_rope_head_dim <= ic.head_dim && d.qk_rope_head_dim % 2 == 0, "the indexer RoPE rotates the "
                  "first qk_rope_head_dim=", d.qk_rope_head_dim, " dims of each ", ic.head_dim, "-dim head: it must "
                  "be even and at most head_dim");
    const at::Tensor& ref = weights.kv_b_proj;
    const int64_t q_in = d.q_lora_rank.value_or(d.hidden_size);
    auto check = [&](const at::Tensor& t, const char* name, std::vector<int64_t> shape) {
      AAR_CHECK_ARG(t.defined() && t.sizes() == c10::IntArrayRef(shape), "indexer weight ", name, " must have shape ",
                    c10::IntArrayRef(shape), ", got ", t.defined() ? t.sizes() : c10::IntArrayRef{});
      AAR_CHECK_ARG(t.scalar_type() == ref.scalar_type() && t.device() == ref.device(), "indexer weight ", name,
                    " is ", t.scalar_type(), " on ", t.device(), "; the layer's weights are ", ref.scalar_type(),
                    " on ", ref.device());
    };
    check(iw_->wq_b, "wq_b", {ic.n_head * ic.head_dim, q_in});
    check(iw_->wk, "wk", {ic.head_dim, d.hidden_size});
    check(iw_->weights_proj, "weights_proj", {ic.n_head, d.hidden_size});
    check(iw_->k_norm_weight, "k_norm_weight", {ic.head_dim});
    check(iw_->k_norm_bias, "k_norm_bias", {ic.head_dim});
  }
  // Spec 3.2: the preprocess, once.
  PreprocessConfig pc = cfg_.preprocess;
  pc.has_q_lora = d.q_lora_rank.has_value();
  AAR_CHECK_ARG(pc.quant == mla::quant_type(weights), "preprocess quant type \"", mla::to_string(pc.quant),
                "\" differs from the weights' \"", mla::to_string(mla::quant_type(weights)), "\"");
  if (pc.quant == mla::QuantType::MxFp8) {
    throw_not_supported("quant type \"mxfp8\" (W8A8-MXFP8 dynamic fused_qkv_a_proj, A5) is not implemented");
  }
  if (pc.enable_sparse_sfa_c8) {
    throw_not_supported("enable_sparse_sfa_c8: the SFA C8 cache (packed 656-byte rows, and PROLOG_V3's "
                        "kv_cache_quant_mode 3 writing them) is not implemented by this layer");
  }
  if (pc.dsa_cp) throw_not_supported("dsa_cp: DSA context parallel is not implemented by this layer");
  if (pc.dcp_size > 1) throw_not_supported("dcp_size=", pc.dcp_size, ": DCP is not implemented by this layer");
  if (pc.kv_offload) throw_not_supported("kv_offload: sparse KV offload is not implemented by this layer");
  choice_ = resolve_preprocess(pc);
  if (choice_.kind == Preprocess::Mlapo && (cfg_.q_norm_eps != 1e-6 || cfg_.kv_norm_eps != 1e-6)) {
    throw_not_supported("MLAPO (", choice_.reason, ") with q_norm_eps=", cfg_.q_norm_eps, ", kv_norm_eps=",
                        cfg_.kv_norm_eps, ": mla_preprocess takes no epsilon (its kernel uses 1e-6)");
  }
  mla::detail::LatentConfig lc;
  lc.fused = choice_.kind == Preprocess::PrologV3 ? mla::detail::Fused::PrologV3
             : choice_.kind == Preprocess::Mlapo  ? mla::detail::Fused::Mlapo
                                                  : mla::detail::Fused::None;
  // The indexer reads q_c: the fused paths return it (query_norm_flag / enable_inner_out).
  lc.query_norm = cfg_.indexer.has_value();
  lc.dims = d;
  lc.q_norm_eps = cfg_.q_norm_eps;
  lc.kv_norm_eps = cfg_.kv_norm_eps;
  lc.heads_padded = d.num_heads;  // the SFA kernel takes the real heads
  lc.workspace_group = cfg_.workspace_group;
  core_ = std::make_shared<LatentCore>(lc, weights);
}

Impl::~Impl() = default;

const at::Tensor& Impl::w_uk_t() const { return core_->w_uk_t(); }
const at::Tensor& Impl::w_uv() const { return core_->w_uv(); }

void Impl::release_views() {
  seen_ = Seen{};
  core_->release_views();
  last_topk_rows_.reset();
}

void Impl::reload_weights(const mla::Weights& weights) { core_->reload_weights(weights); }

Impl::Caches Impl::validate(const at::Tensor& hidden, const std::vector<at::Tensor>& kv, const Metadata& md,
                            TopkBuffer* topk, const at::Tensor& output) const {
  const mla::Dims& d = cfg_.dims;
  const auto dtype = core_->dtype();
  const c10::Device dev = core_->device();
  AAR_CHECK_ARG(hidden.defined() && hidden.dim() == 2 && hidden.size(1) == d.hidden_size,
                "hidden_states must have shape (T, hidden_size=", d.hidden_size, "), got ",
                hidden.defined() ? hidden.sizes() : c10::IntArrayRef{});
  AAR_CHECK_ARG(hidden.scalar_type() == dtype, "hidden_states dtype ", hidden.scalar_type(),
                " differs from the weights' dtype ", dtype);
  AAR_CHECK_ARG(hidden.device() == dev, "hidden_states is on ", hidden.device(), " but the layer's weights are on ",
                dev);
  const int64_t tk = md.cum_query_lens_list.empty() ? 0 : md.cum_query_lens_list.back();
  AAR_CHECK_ARG(hidden.size(0) >= tk, "hidden_states has ", hidden.size(0), " rows but the metadata's kernels read ",
                tk, " tokens (num_input_tokens=", md.num_input_tokens, ")");
  AAR_CHECK_ARG(output.defined() && output.sizes() == hidden.sizes() && output.scalar_type() == dtype &&
                    output.device() == dev,
                "output must be a ", dtype, " tensor of shape ", hidden.sizes(), " on ", dev, ", got ",
                output.defined() ? output.sizes() : c10::IntArrayRef{});
  AAR_CHECK_ARG(output.is_contiguous(), "output must be contiguous (o_proj writes it in place), got strides ",
                output.strides());
  const bool has_idx = cfg_.indexer.has_value();
  const size_t want = has_idx ? 3 : 2;
  AAR_CHECK_ARG(kv.size() == want, "kv_cache must be the layer's composed tuple of ", want,
                " tensors (latent, rope", has_idx ? ", indexer k" : "", ": compose_kv_cache; SFA C8 and LI C8 caches "
                "are not supported by this layer), got ", kv.size());
  Caches c{kv[0], kv[1], has_idx ? kv[2] : at::Tensor()};
  check_cache(c.nope, "kv_cache[0] (latent)", d.kv_lora_rank, md, dtype, dev);
  check_cache(c.rope, "kv_cache[1] (rope)", d.qk_rope_head_dim, md, dtype, dev);
  if (has_idx) {
    check_cache(c.index_k, "kv_cache[2] (indexer k)", cfg_.indexer->head_dim, md, dtype, dev);
  }
  const bool needs_buffer = !has_idx || cfg_.use_index_cache;
  if (needs_buffer) {
    AAR_CHECK_ARG(topk != nullptr, has_idx ? "use_index_cache writes the top-k into the model's TopkBuffer"
                                           : "a layer without an indexer reads the top-k from the model's TopkBuffer",
                  ": topk must be given");
    const int64_t K = has_idx ? cfg_.indexer->topk : topk->index_topk();
    AAR_CHECK_ARG(topk->index_topk() == K, "topk buffer holds ", topk->index_topk(),
                  " indices per token but the layer's indexer selects ", K);
    AAR_CHECK_ARG(topk->max_num_tokens() >= tk, "topk buffer has ", topk->max_num_tokens(),
                  " rows, fewer than the step's ", tk, " tokens");
    AAR_CHECK_ARG(topk->buffer().device() == dev, "topk buffer is on ", topk->buffer().device(),
                  " but the layer's weights are on ", dev);
  }
  return c;
}

at::Tensor Impl::indexer_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) const {
  // RoPE on the first R dims of each head (spec 1.1.1, indexer): x (tk, heads, D_i).
  const int64_t R = cfg_.dims.qk_rope_head_dim, D = x.size(-1);
  const at::Tensor head = x.narrow(-1, 0, R);
  at::Tensor rot;
  if (!cfg_.indexer->glm_moe_dsa) {
    // neox halves: the MLA tables' rows are [c | c], [s | s], exactly the
    // 'half' rotation's operands.
    rot = ops::rotary_mul(head.unsqueeze(0), cos, sin, "half").squeeze(0);
  } else {
    // GLM-MoE-DSA: pairs (2i, 2i+1). The 'interleave' rotation takes the
    // angles repeated per pair: [c0, c0, c1, c1, ...] from the halves table.
    const at::Tensor ci = cos.narrow(-1, 0, R / 2).repeat_interleave(2, -1);
    const at::Tensor si = sin.narrow(-1, 0, R / 2).repeat_interleave(2, -1);
    rot = ops::rotary_mul(head.unsqueeze(0), ci, si, "interleave").squeeze(0);
  }
  if (R == D) return rot;
  return at::cat({rot, x.narrow(-1, R, D - R)}, -1);
}

at::Tensor Impl::indexer_topk(const at::Tensor& x, const at::Tensor& q_c, const Caches& c, const Metadata& md,
                              int64_t tk) {
  // Spec 1.2 / 3.4: keys (LayerNorm, RoPE) written into the indexer cache at
  // the step's full slot mapping, weights, queries (RoPE), then the indexer.
  const IndexerConfig& ic = *cfg_.indexer;
  const IndexerWeights& w = *iw_;
  const int64_t D = ic.head_dim, R = cfg_.dims.qk_rope_head_dim;
  const at::Tensor cos = md.cos.narrow(0, 0, tk).view({1, tk, 1, R});
  const at::Tensor sin = md.sin.narrow(0, 0, tk).view({1, tk, 1, R});
  at::Tensor k = ops::dense::layer_norm(ops::dense::linear(x, w.wk), w.k_norm_weight, w.k_norm_bias, ic.k_norm_eps);
  k = indexer_rope(k.view({tk, 1, D}), cos, sin);                           // (tk, 1, D)
  const at::Tensor weights = ops::dense::linear(x, w.weights_proj);         // (tk, n_head)
  const at::Tensor q = indexer_rope(ops::dense::linear(q_c, w.wq_b).view({tk, ic.n_head, D}), cos, sin);
  // The indexer cache as rows of D (a view of the validated contiguous cache).
  const at::Tensor& rows = LatentCore::view_of(c.index_k, c.index_k.size(0), seen_.idx_src, seen_.idx_rows,
                                               [&] { return c.index_k.view({-1, D}); });
  at::Tensor rows_w = rows;
  ops::scatter_nd_update_(rows_w, md.slot_mapping.narrow(0, 0, tk).view({tk, 1}), k.view({tk, D}));
  ops::LightningIndexerArgs a;
  a.query = q;
  a.key = c.index_k;
  a.weights = weights;
  a.actual_seq_lengths_query = md.cum_query_lens;
  a.actual_seq_lengths_key = md.seq_lens;
  a.block_table = md.block_table;
  a.layout_query = "TND";
  a.layout_key = "PA_BSND";
  a.sparse_count = ic.topk;
  a.sparse_mode = 3;
  // Spec 3.4's dispatch: glm_moe_dsa and A5 take torch_npu's indexer, the rest vllm-ascend's.
  const ops::OpLibrary lib = ic.glm_moe_dsa || cfg_.device_kind == plan::DeviceKind::A5 ? ops::OpLibrary::TorchNpu
                                                                                         : ops::OpLibrary::VllmAscend;
  return std::get<0>(ops::lightning_indexer(a, lib));
}

void Impl::run(const at::Tensor& hidden, const Caches& c, const Metadata& md, TopkBuffer* topk,
               const at::Tensor& output, int64_t tk, bool stable) {
  const int64_t rows = hidden.size(0);
  if (tk == 0) {
    ops::dense::zero(output);
    last_topk_ = TopkSource::None;
    return;
  }
  const at::Tensor x = rows == tk ? hidden : hidden.narrow(0, 0, tk);
  // The MLA family's preprocess: latent and rope cache rows written at the
  // slots, ql_nope (tk, H, L) and q_pe (tk, H, R) token-major (TND, real heads).
  const mla::detail::DecodeViews& v = core_->views(tk, mla::detail::DecodeLayout::TND);
  mla::detail::LatentStep s;
  s.x = x;
  s.cos = md.cos;
  s.sin = md.sin;
  s.slots = md.slot_mapping;
  // Spec 3.2: the resolved preprocess, downgraded to NATIVE outside
  // DecodeOnly / SpecDecoding steps and for MLAPO above 1024 input tokens.
  last_pre_ = runtime_preprocess(choice_.kind, md.attn_state, md.num_input_tokens);
  const mla::detail::Fused path = last_pre_ == Preprocess::PrologV3 ? mla::detail::Fused::PrologV3
                                  : last_pre_ == Preprocess::Mlapo  ? mla::detail::Fused::Mlapo
                                                                    : mla::detail::Fused::None;
  const mla::detail::LatentQuery q = core_->preprocess(v, s, c.nope, c.rope, path, stable);
  // Top-k: this layer's indexer, or the selection an earlier layer left.
  if (cfg_.indexer.has_value()) {
    // q_c: the native path's normed q-LoRA activations, or what the fused
    // operator returned (query_norm / inner_out); x without q-LoRA.
    if (q.qc_scale.defined()) {
      // A W8A8-dynamic PROLOG_V3 (SFA C8 only, rejected at construction here)
      // returns q_c quantised per token: the indexer would need its quant matmul.
      throw_not_supported("the indexer on an int8 q_c (W8A8-dynamic PROLOG_V3's query_norm) is not implemented");
    }
    const at::Tensor q_c = q.qc.defined() ? q.qc : x;
    last_topk_rows_ = indexer_topk(x, q_c, c, md, tk);
    if (cfg_.use_index_cache) last_topk_rows_ = topk->store(last_topk_rows_);
    last_topk_ = TopkSource::Indexer;
  } else {
    last_topk_rows_ = topk->view(tk);
    last_topk_ = TopkSource::Reused;
  }
  ops::SparseFlashAttentionArgs a;
  a.query = q.qn;
  a.key = c.nope;
  a.value = c.nope;  // the latent is both key (with the rope part) and value
  a.sparse_indices = last_topk_rows_;
  a.scale_value = cfg_.scale;
  a.block_table = md.block_table;
  a.actual_seq_lengths_query = md.cum_query_lens;
  a.actual_seq_lengths_kv = md.seq_lens;
  a.query_rope = q.qr;
  a.key_rope = c.rope;
  a.sparse_block_size = 1;
  a.layout_query = "TND";
  a.layout_kv = "PA_BSND";
  a.sparse_mode = 3;
  a.attention_mode = 2;
  const at::Tensor attn = std::get<0>(ops::sparse_flash_attention(a, ops::OpLibrary::VllmAscend));  // (tk, H, L)
  const at::Tensor& y = core_->w_uv_out_token_major(attn, tk);                                         // (tk, H*V)
  if (rows == tk) {
    ops::dense::linear_out(output, y, core_->weights().o_proj);
  } else {
    ops::dense::linear_out(output.narrow(0, 0, tk), y, core_->weights().o_proj);
    ops::dense::zero(output.narrow(0, tk, rows - tk));
  }
}

const at::Tensor& Impl::forward(const at::Tensor& hidden, const std::vector<at::Tensor>& kv_cache,
                                const Metadata* md_ptr, TopkBuffer* topk, const at::Tensor& output) {
  if (md_ptr == nullptr) {
    graph::refuse_if_capturing("an SFA forward without metadata (profiling run)");
    AAR_CHECK_ARG(output.defined(), "output must be given");
    output.zero_();
    last_topk_ = TopkSource::None;
    return output;
  }
  const Metadata& md = *md_ptr;
  check_current(md.stamp, "metadata");
  const Caches c = validate(hidden, kv_cache, md, topk, output);
  const int64_t tk = md.cum_query_lens_list.empty() ? 0 : md.cum_query_lens_list.back();
  std::optional<c10::InferenceMode> guard;
  if (!c10::InferenceMode::is_enabled()) guard.emplace();
  if (graph::GraphParams* g = graph::GraphParams::current()) {
    // Every operator of the layer reads only tensors at stable addresses (the
    // builder's buffers, the caches, the workspace, the top-k buffer): the
    // device graph captures them as they are and an update has nothing to
    // refresh; the CPU recording provider replays the closure.
    AAR_CHECK_ARG(hidden.size(0) == g->capturing_bucket(), "SFA graph capture of bucket ", g->capturing_bucket(),
                  " needs hidden_states of that many rows, got ", hidden.size(0));
    if (md.attn_state != plan::AttentionState::DecodeOnly && md.attn_state != plan::AttentionState::SpecDecoding) {
      throw_not_supported("SFA graph capture takes DecodeOnly and SpecDecoding batches (spec 2.3), got ",
                          plan::to_string(md.attn_state));
    }
    graph::CapturedCall call;
    call.kind = graph::CallKind::Prepare;
    call.layer_index = cfg_.layer_index;
    call.prepare = [this, hidden, c, md_at_capture = md, topk, out = at::Tensor(output), tk]() {
      run(hidden, c, md_at_capture, topk, out, tk, /*stable=*/true);
    };
    g->capture_call(std::move(call));
    return output;
  }
  run(hidden, c, md, topk, output, tk, /*stable=*/false);
  return output;
}

}  // namespace aar::sfa
