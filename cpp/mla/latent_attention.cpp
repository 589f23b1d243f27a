// MLA attention without the projections (latent_attention.h).
#include "ascend_attn_rt/mla/latent_attention.h"

#include <ATen/ATen.h>

#include <cmath>

#include "ascend_attn_rt/build_stamp.h"
#include "ascend_attn_rt/comm/comm.h"
#include "ascend_attn_rt/comm/dcp_exchange.h"
#include "ascend_attn_rt/errors.h"
#include "ascend_attn_rt/graph/graph_params.h"
#include "ascend_attn_rt/graph_calls/fused_attention_calls.h"
#include "ascend_attn_rt/mla/backend.h"
#include "ascend_attn_rt/ops/dense.h"
#include "ascend_attn_rt/ops/fused_infer_attention.h"
#include "ascend_attn_rt/ops/kv_cache_write.h"
#include "../latent/dcp_query.h"
#include "../latent/decode_workspace.h"
#include "latent_ops.h"
#include "../common/impl_checks.h"
#include "../common/kv_cache.h"
#include "../graph/exclusive_scope.h"
#include "../common/inference_scope.h"

namespace aar::mla {

namespace {

// k_pe as (T, R): accepts (T, R) and vLLM's (T, 1, R).
at::Tensor rope_rows(const at::Tensor& k_pe, int64_t R, const char* name) {
  AAR_CHECK_ARG(k_pe.defined() && ((k_pe.dim() == 2 && k_pe.size(1) == R) ||
                                   (k_pe.dim() == 3 && k_pe.size(1) == 1 && k_pe.size(2) == R)),
                name, " must have shape (T, qk_rope_head_dim=", R, ") or (T, 1, ", R, "), got ",
                k_pe.defined() ? k_pe.sizes() : c10::IntArrayRef{});
  return k_pe.dim() == 2 ? k_pe : k_pe.select(1, 0);
}

void check_shape(const at::Tensor& t, const char* name, std::initializer_list<int64_t> want, const char* dims) {
  AAR_CHECK_ARG(t.defined() && t.sizes() == c10::IntArrayRef(want), name, " must have shape ", dims, " = ",
                c10::IntArrayRef(want), ", got ", t.defined() ? t.sizes() : c10::IntArrayRef{});
}

// A profiling run (no metadata): the output is all the call writes.
void zero_for_profiling(const at::Tensor& out) {
  AAR_CHECK_ARG(out.defined(), "out must be given");
  out.zero_();
}

// `t` must have the dtype and device of `ref` (named `ref_name`: the caches, or the query the forward takes
// them from).
void check_like(const at::Tensor& t, const char* name, at::ScalarType dtype, c10::Device device, const char* ref_name) {
  AAR_CHECK_ARG(t.scalar_type() == dtype, name, " dtype ", t.scalar_type(), " must be ", ref_name, "'s ", dtype);
  AAR_CHECK_ARG(t.device() == device, name, " is on ", t.device(), " but ", ref_name, " is on ", device);
}

}  // namespace

LatentAttention::LatentAttention(const LatentAttentionConfig& cfg) : cfg_(cfg) {
  for (const auto& [v, name] : {std::pair<int64_t, const char*>{cfg.num_heads, "num_heads"},
                                {cfg.kv_lora_rank, "kv_lora_rank"},
                                {cfg.qk_nope_head_dim, "qk_nope_head_dim"},
                                {cfg.qk_rope_head_dim, "qk_rope_head_dim"},
                                {cfg.v_head_dim, "v_head_dim"}}) {
    AAR_CHECK_ARG(internal::dim_in_range(v), name, " must be in [1, ", internal::kMaxModelDim, "], got ", v);
  }
  AAR_CHECK_ARG(cfg.num_heads <= Backend::kMaxHeads, "num_heads=", cfg.num_heads,
                " exceeds the MLA decode kernel's ", Backend::kMaxHeads, " heads");
  internal::check_softmax_scale(cfg.scale);
  if (cfg_.scale == 0.0) cfg_.scale = 1.0 / std::sqrt(static_cast<double>(cfg.qk_nope_head_dim + cfg.qk_rope_head_dim));
  hp_ = Backend::num_heads_padded(cfg.num_heads);
  if (cfg.dcp_comm != nullptr && cfg.dcp_comm->size() > 1) {
    // The DCP merge (npu_attention_update) takes a head dim that is a multiple of 8 in [8, 512].
    AAR_CHECK_ARG(cfg.kv_lora_rank % 8 == 0 && cfg.kv_lora_rank <= 512, "kv_lora_rank=", cfg.kv_lora_rank,
                  ": DCP merges the latent partials through npu_attention_update, which takes a multiple of 8 in "
                  "[8, 512]");
  }
}

LatentAttention::~LatentAttention() = default;

std::pair<at::Tensor, at::Tensor> LatentAttention::split_kv_cache(const at::Tensor& kv, int64_t L) {
  AAR_CHECK_ARG(kv.defined() && kv.dim() == 3 && L > 0 && kv.size(2) > L,
                "kv_cache must have shape (num_blocks, block_size, kv_lora_rank + qk_rope_head_dim) with "
                "kv_lora_rank=", L, " < its last dimension, got ", kv.defined() ? kv.sizes() : c10::IntArrayRef{});
  AAR_CHECK_ARG(kv.is_contiguous(), "kv_cache must be contiguous to be split into the latent and rope caches, got "
                "strides ", kv.strides());
  const int64_t nb = kv.size(0), bs = kv.size(1), R = kv.size(2) - L;
  const at::Tensor flat = kv.view({-1});
  return {flat.narrow(0, 0, nb * bs * L).view({nb, bs, 1, L}), flat.narrow(0, nb * bs * L, nb * bs * R).view({nb, bs, 1, R})};
}

void LatentAttention::write_kv(const at::Tensor& kv_c, const at::Tensor& k_pe, const at::Tensor& slots,
                               const at::Tensor& nope, const at::Tensor& rope) const {
  const int64_t L = cfg_.kv_lora_rank, R = cfg_.qk_rope_head_dim;
  for (const auto& [c, name, w] : {std::tuple<const at::Tensor*, const char*, int64_t>{&nope, "nope_cache", L},
                                   {&rope, "rope_cache", R}}) {
    AAR_CHECK_ARG(c->defined() && c->dim() == 4 && c->size(2) == 1 && c->size(3) == w, name,
                  " must have shape (num_blocks, block_size, 1, ", w, "), got ",
                  c->defined() ? c->sizes() : c10::IntArrayRef{});
    AAR_CHECK_ARG(c->is_contiguous(), name, " must be contiguous, got strides ", c->strides());
  }
  AAR_CHECK_ARG(nope.size(0) == rope.size(0) && nope.size(1) == rope.size(1), "nope_cache ", nope.sizes(),
                " and rope_cache ", rope.sizes(), " must have the same (num_blocks, block_size)");
  AAR_CHECK_ARG(rope.scalar_type() == nope.scalar_type() && rope.device() == nope.device(), "rope_cache (",
                rope.scalar_type(), ", ", rope.device(), ") must match nope_cache (", nope.scalar_type(), ", ",
                nope.device(), ")");
  AAR_CHECK_ARG(kv_c.defined() && kv_c.dim() == 2 && kv_c.size(1) == L, "kv_c must have shape (T, kv_lora_rank=", L,
                "), got ", kv_c.defined() ? kv_c.sizes() : c10::IntArrayRef{});
  const at::Tensor pe = rope_rows(k_pe, R, "k_pe");
  AAR_CHECK_ARG(pe.size(0) == kv_c.size(0), "k_pe has ", pe.size(0), " rows but kv_c has ", kv_c.size(0));
  check_like(kv_c, "kv_c", nope.scalar_type(), nope.device(), "nope_cache");
  check_like(pe, "k_pe", nope.scalar_type(), nope.device(), "nope_cache");
  aar::detail::check_caches_disjoint(nope, rope, "nope_cache", "rope_cache");
  AAR_CHECK_ARG(slots.defined() && slots.dim() == 1 && (slots.scalar_type() == at::kLong || slots.scalar_type() == at::kInt),
                "slot_mapping must be a 1-D int64 or int32 tensor, got ",
                slots.defined() ? slots.scalar_type() : at::ScalarType::Undefined, " ",
                slots.defined() ? slots.sizes() : c10::IntArrayRef{});
  AAR_CHECK_ARG(slots.size(0) <= kv_c.size(0), "slot_mapping has ", slots.size(0), " entries but kv_c has only ",
                kv_c.size(0), " rows");
  AAR_CHECK_ARG(slots.device() == nope.device(), "slot_mapping is on ", slots.device(), " but the caches are on ",
                nope.device());
  const int64_t n = slots.size(0);
  if (n == 0) return;
  // The operator validates every slot before its first write (a rejected call writes nothing).
  auto write = [kv_c, pe, slots, nc = nope, rc = rope, n]() {
    at::Tensor nope_cache = nc, rope_cache = rc;
    ops::scatter_pa_kv_cache(kv_c.narrow(0, 0, n).unsqueeze(1).contiguous(),
                             pe.narrow(0, 0, n).unsqueeze(1).contiguous(), nope_cache, rope_cache,
                             slots.scalar_type() == at::kLong ? slots : slots.to(at::kLong), "Norm");
  };
  if (graph::GraphParams* g = graph::GraphParams::current()) {
    // Inside a capture (vLLM's graph capture through the adapter, docs/design/vllm_sparse.md §6): the
    // write is a prepare call over the caller's tensors, which a captured graph keeps at stable
    // addresses (vLLM's persistent slot mapping, its static activations); the checks above ran now.
    g->capture_call(std::make_unique<graph::ClosureCall>(-1, 0, std::move(write)));
    return;
  }
  write();
}

void LatentAttention::check_step(const Metadata& md, const at::Tensor& nope, const at::Tensor& rope,
                                 at::ScalarType dtype, c10::Device device, const char* what) const {
  check_current(md.stamp, "metadata");
  // DCP (docs/design/mla.md §5.8): the layer's comm must be the metadata's group and rank.
  cp::check_comm_matches(cfg_.dcp_comm, md.dcp.world_size, md.dcp.rank, "DCP", "dcp_comm", "dcp_world_size");
  if (md.pcp.world_size > 1) {
    throw_not_supported("mla.LatentAttention.", what, " with metadata built for PCP (pcp_world_size=",
                        md.pcp.world_size, "): use mla::Impl, which gathers the prefill keys over PCP");
  }
  detail::check_latent_cache(nope, /*is_nope=*/true, cfg_.kv_lora_rank, md, /*nz=*/false, dtype, " (the query dtype)");
  detail::check_latent_cache(rope, /*is_nope=*/false, cfg_.qk_rope_head_dim, md, /*nz=*/false, dtype,
                             " (the query dtype)");
  AAR_CHECK_ARG(nope.device() == device && rope.device() == device, "the caches are on ", nope.device(), " / ",
                rope.device(), " but the query is on ", device);
  aar::detail::check_caches_disjoint(nope, rope, "nope_cache", "rope_cache");
}

void LatentAttention::forward_decode(const at::Tensor& ql_nope, const at::Tensor& q_pe, const at::Tensor& nope,
                                     const at::Tensor& rope, const Metadata* md_ptr, const at::Tensor& out) {
  if (md_ptr == nullptr) {
    graph::refuse_if_capturing("mla.LatentAttention.forward_decode without metadata (profiling run)");
    zero_for_profiling(out);
    return;
  }
  const Metadata& md = *md_ptr;
  // Shared workspaces used below are held for this forward (one thread at a time).
  graph::ForwardScope exclusive_scope;

  const int64_t H = cfg_.num_heads, L = cfg_.kv_lora_rank, R = cfg_.qk_rope_head_dim;
  AAR_CHECK_ARG(md.num_decodes > 0, "forward_decode: the metadata schedules no decode tokens");
  if (md.decode.num_kernel_tokens != md.num_decode_tokens) {
    throw_not_supported("mla.LatentAttention.forward_decode with graph decode padding (", md.decode.num_kernel_tokens,
                        " kernel tokens for ", md.num_decode_tokens, " decode tokens)");
  }
  const int64_t td = md.num_decode_tokens;
  check_shape(ql_nope, "ql_nope", {td, H, L}, "(num_decode_tokens, num_heads, kv_lora_rank)");
  check_shape(q_pe, "q_pe", {td, H, R}, "(num_decode_tokens, num_heads, qk_rope_head_dim)");
  check_shape(out, "out", {td, H, L}, "(num_decode_tokens, num_heads, kv_lora_rank)");
  const at::ScalarType dt = ql_nope.scalar_type();
  const c10::Device dev = ql_nope.device();
  check_like(q_pe, "q_pe", dt, dev, "ql_nope");
  check_like(out, "out", dt, dev, "ql_nope");
  AAR_CHECK_ARG(out.is_contiguous(), "out must be contiguous, got strides ", out.strides());
  check_step(md, nope, rope, dt, dev, "forward_decode");
  const internal::OutputApart apart(out);
  apart.check(nope, "nope_cache");
  apart.check(rope, "rope_cache");
  const aar::detail::InferenceScope inference;
  if (md.dcp.world_size > 1) {
    forward_decode_dcp(ql_nope, q_pe, nope, rope, md, out);
    return;
  }

  const Dims d{H, 0, std::nullopt, L, cfg_.qk_nope_head_dim, R, cfg_.v_head_dim};
  const detail::DecodeShape sh = detail::decode_shape_of(d, hp_, cfg_.workspace_group, dev, dt);
  if (!ws_ || !(ws_->shape() == sh)) ws_ = detail::DecodeWorkspace::shared(sh);
  const detail::DecodeLayout layout = detail::decode_layout_of(md, /*kv_nz=*/false);
  const detail::DecodeViews& v = ws_->views(td, layout);
  if (!lse_.defined() || lse_.device() != dev) lse_ = at::zeros({1}, ql_nope.options().dtype(at::kFloat));
  ops::FiaV2Tensors t;
  ops::FiaV2Params p;
  const int64_t bs = md.block_size;
  // (nb, bs, 1, D) -> (nb, 1, bs, D): a reinterpretation (one KV head) of the validated contiguous caches.
  t.key = nope.view({nope.size(0), 1, bs, L});
  t.value = t.key;
  t.key_rope = rope.view({rope.size(0), 1, bs, R});
  t.query = v.fia_qn;
  t.query_rope = v.fia_qr;
  detail::set_latent_decode_params(md, layout, hp_, cfg_.scale, t, p);
  at::Tensor attn = v.attn;
  if (graph::GraphParams* g = graph::GraphParams::current()) {
    // Inside a capture: the MLA decode's three calls (docs/design/graph.md §4.2) without the
    // projections: the queries into the workspace (prepare), the latent attention (a fused call
    // refreshed per step: block table, KV lengths, the query ends in the speculative TND layout),
    // the output out of it (prepare). The workspace views and the caller's tensors are held by the
    // closures; the capture-time metadata's lists are what an update replaces.
    const int64_t n = g->capturing_bucket();
    if (md.num_prefills != 0 || td != n) {
      throw_not_supported("mla.LatentAttention.forward_decode graph capture of bucket ", n,
                          " takes decode-only batches of ", n, " decode tokens (got ", td, " decode tokens, ",
                          md.num_prefills, " prefills)");
    }
    g->capture_call(std::make_unique<graph::ClosureCall>(-1, 0, [v, ql_nope, q_pe]() {
      ops::dense::copy(v.qn_heads, ql_nope);
      ops::dense::copy(v.qr_heads, q_pe);
    }));
    graph_calls::capture_fia_v2(*g, {-1, 0}, {/*paged=*/true, /*q_lens=*/md.speculative}, std::move(t), p, attn,
                                lse_);
    g->capture_call(std::make_unique<graph::ClosureCall>(
        -1, 0, [v, o = at::Tensor(out)]() { ops::dense::copy(o, v.attn_heads.transpose(0, 1)); }));
    return;
  }
  // The real heads of the zero-padded queries.
  ops::dense::copy(v.qn_heads, ql_nope);
  ops::dense::copy(v.qr_heads, q_pe);
  ops::fused_infer_attention_score_v2_out(t, p, std::nullopt, attn, lse_);
  ops::dense::copy(out, v.attn_heads.transpose(0, 1));
}

void LatentAttention::forward_decode_dcp(const at::Tensor& ql_nope, const at::Tensor& q_pe, const at::Tensor& nope,
                                         const at::Tensor& rope, const Metadata& md, const at::Tensor& out) {
  // docs/design/mla.md §6.2 without the projections: [ql_nope | q_pe] gathered along the heads over
  // the group, the latent call over this rank's shard (one row per decode token, its local KV
  // length), the partials exchanged and merged by LSE into this rank's heads, straight into out.
  const int64_t td = md.num_decode_tokens, L = cfg_.kv_lora_rank, R = cfg_.qk_rope_head_dim;
  cp::Comm* comm = cfg_.dcp_comm;
  graph::GraphParams* g = graph::GraphParams::current();
  if (g != nullptr && (md.num_prefills != 0 || td != g->capturing_bucket())) {
    throw_not_supported("mla.LatentAttention.forward_decode DCP graph capture of bucket ", g->capturing_bucket(),
                        " takes decode-only batches of ", g->capturing_bucket(), " decode tokens (got ", td,
                        " decode tokens, ", md.num_prefills, " prefills)");
  }
  const cp::DcpViews& w =
      detail::latent_dcp_views(*comm, {cfg_.num_heads, L, R, cfg_.workspace_group}, ql_nope, td, dcp_ws_);
  auto [qn, qr] = detail::latent_dcp_split_query(w, L, R);
  ops::FiaTensors t;
  ops::FiaParams p;
  detail::set_latent_shard_params(qn, qr, nope, rope, md, cfg_.scale, t, p);
  const int64_t N = w.gathered_query.size(1);
  at::Tensor part = w.partial_out.view({td, N, 1, L});
  at::Tensor lse = w.partial_lse.view({td, N, 1, 1});
  if (g != nullptr) {
    // Inside a capture (vLLM's graph mode through the adapter, docs/design/vllm_sparse.md §7): the three
    // calls of mla::Impl's DCP capture (docs/design/graph.md §4.2) without the projections: the query
    // gather (prepare; the collective runs inside each replay), the shard's latent call (refreshed per
    // update: block table, local KV lengths), the exchange and merge into out (prepare). The closures
    // hold copies of the views (the shared DcpWorkspace's buffers) and the caller's tensors.
    g->capture_call(std::make_unique<graph::ClosureCall>(
        -1, 0, [comm, w, ql_nope, q_pe]() { detail::latent_dcp_stage_query(*comm, w, ql_nope, q_pe); }));
    graph_calls::capture_fia(*g, {-1, 0}, {/*paged=*/true, /*q_lens=*/false}, std::move(t), p, part, lse);
    g->capture_call(std::make_unique<graph::ClosureCall>(-1, 0, [comm, w, o = at::Tensor(out)]() {
      at::Tensor merged = o;
      cp::combine_partials(*comm, w.partial_out, w.partial_lse, merged, std::nullopt, &w);
    }));
    return;
  }
  detail::latent_dcp_stage_query(*comm, w, ql_nope, q_pe);
  ops::fused_infer_attention_score_out(t, p, std::nullopt, part, lse);
  at::Tensor merged = out;
  cp::combine_partials(*comm, w.partial_out, w.partial_lse, merged, std::nullopt, &w);
}

void LatentAttention::forward_prefill(const at::Tensor& q, const at::Tensor& kv_c, const at::Tensor& k_pe,
                                      const at::Tensor& nope, const at::Tensor& rope, const Metadata* md_ptr,
                                      const at::Tensor& out, const at::Tensor& kv_b_proj) const {
  graph::refuse_if_capturing("mla.LatentAttention.forward_prefill");
  if (md_ptr == nullptr) {
    zero_for_profiling(out);
    return;
  }
  const Metadata& md = *md_ptr;
  const int64_t H = cfg_.num_heads, L = cfg_.kv_lora_rank, P = cfg_.qk_nope_head_dim, R = cfg_.qk_rope_head_dim,
                V = cfg_.v_head_dim;
  AAR_CHECK_ARG(md.num_prefills > 0, "forward_prefill: the metadata schedules no prefill tokens");
  const int64_t tp = md.num_prefill_tokens;
  check_shape(q, "q", {tp, H, P + R}, "(num_prefill_tokens, num_heads, qk_nope_head_dim + qk_rope_head_dim)");
  check_shape(kv_c, "kv_c", {tp, L}, "(num_prefill_tokens, kv_lora_rank)");
  const at::Tensor pe = rope_rows(k_pe, R, "k_pe");
  AAR_CHECK_ARG(pe.size(0) == tp, "k_pe has ", pe.size(0), " rows but the metadata schedules ", tp,
                " prefill tokens");
  check_shape(kv_b_proj, "kv_b_proj", {H * (P + V), L}, "(num_heads * (qk_nope_head_dim + v_head_dim), kv_lora_rank)");
  check_shape(out, "out", {tp, H * V}, "(num_prefill_tokens, num_heads * v_head_dim)");
  const at::ScalarType dt = q.scalar_type();
  const c10::Device dev = q.device();
  check_like(kv_c, "kv_c", dt, dev, "q");
  check_like(pe, "k_pe", dt, dev, "q");
  check_like(kv_b_proj, "kv_b_proj", dt, dev, "q");
  check_like(out, "out", dt, dev, "q");
  AAR_CHECK_ARG(out.stride(1) == 1 && out.stride(0) == H * V, "out must hold row-major rows (strides (", H * V,
                ", 1)), got strides ", out.strides());
  check_step(md, nope, rope, dt, dev, "forward_prefill");
  const internal::OutputApart apart(out);
  apart.check(nope, "nope_cache");
  apart.check(rope, "rope_cache");
  const aar::detail::InferenceScope inference;

  const at::Tensor kv = ops::dense::linear(kv_c, kv_b_proj).view({tp, H, P + V});
  detail::PrefillSpec s;
  s.heads = H;
  s.heads_padded = hp_;
  s.kv_lora_rank = L;
  s.nope_dim = P;
  s.rope_dim = R;
  s.v_head_dim = V;
  s.scale = cfg_.scale;
  s.kv_b_proj = kv_b_proj;
  s.in_bf16 = cfg_.prefill_in_bf16;
  s.dcp_comm = cfg_.dcp_comm;  // the context chunks' gather (docs/design/mla.md §6.3)
  const at::Tensor res = detail::latent_prefill_attention(
      s, q.narrow(-1, 0, P).contiguous(), q.narrow(-1, P, R).contiguous(), kv.narrow(-1, 0, P).contiguous(),
      pe.unsqueeze(1).expand({tp, H, R}), kv.narrow(-1, P, V).contiguous(), nope, rope, md);
  ops::dense::copy(out, res);
}

}  // namespace aar::mla
