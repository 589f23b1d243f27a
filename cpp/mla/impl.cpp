// Per-layer MLA forward (docs/design/mla.md §5).
#include "ascend_attn_rt/mla/impl.h"

#include <ATen/ATen.h>

#include <cmath>
#include <tuple>
#include <utility>

#include "../common/rope_gather.h"
#include "../common/kv_cache.h"
#include "ascend_attn_rt/comm/comm.h"
#include "ascend_attn_rt/comm/dcp_exchange.h"
#include "../latent/dcp_query.h"
#include "ascend_attn_rt/errors.h"
#include "ascend_attn_rt/graph/graph_params.h"
#include "ascend_attn_rt/graph_calls/fused_attention_calls.h"
#include "ascend_attn_rt/mla/backend.h"
#include "ascend_attn_rt/ops/dense.h"
#include "ascend_attn_rt/ops/fused_infer_attention.h"
#include "ascend_attn_rt/ops/interleave_rope.h"
#include "ascend_attn_rt/ops/kv_cache_write.h"
#include "ascend_attn_rt/ops/kv_rmsnorm_rope_cache.h"
#include "ascend_attn_rt/ops/mla_prolog.h"
#include "ascend_attn_rt/ops/transpose_batchmatmul.h"
#include "../latent/latent_core.h"
#include "latent_ops.h"
#include "../common/impl_checks.h"
#include "../graph/exclusive_scope.h"
#include "../common/inference_scope.h"

namespace aar::mla {

const char* to_string(DecodePath p) {
  switch (p) {
    case DecodePath::None: return "none";
    case DecodePath::Native: return "native";
    case DecodePath::Prolog: return "prolog";
    case DecodePath::Mlapo: return "mlapo";
    case DecodePath::FaQuant: return "fa_quant";
  }
  return "unknown";
}

Impl::Impl(const ImplConfig& cfg, const Weights& weights) : cfg_(cfg) {
  const Dims& d = cfg_.dims;
  hp_ = Backend::num_heads_padded(d.num_heads);
  internal::check_softmax_scale(cfg_.scale);
  if (cfg_.scale == 0.0) cfg_.scale = 1.0 / std::sqrt(static_cast<double>(d.qk_nope_head_dim + d.qk_rope_head_dim));
  detail::LatentConfig lc;
  lc.dims = d;
  lc.q_norm_eps = cfg_.q_norm_eps;
  lc.kv_norm_eps = cfg_.kv_norm_eps;
  const int n_fused = int(cfg_.enable_prolog) + int(cfg_.enable_mlapo) + int(fa_quant());
  AAR_CHECK_ARG(n_fused <= 1, "enable_prolog, enable_mlapo and fa_quant_kv_scale each choose the layer's fused decode "
                "preprocess: give at most one");
  AAR_CHECK_ARG(!cfg_.enable_prolog || d.q_lora_rank.has_value(),
                "enable_prolog needs q-LoRA (q_lora_rank): npu_mla_prolog_v3 takes the q down-projection");
  lc.fused = cfg_.enable_prolog ? detail::Fused::PrologV3
             : cfg_.enable_mlapo ? detail::Fused::Mlapo
             : fa_quant()        ? detail::Fused::PrologV2
                                 : detail::Fused::None;
  const QuantType qt = quant_type(weights);
  if (qt == QuantType::MxFp8 && n_fused > 0) {
    // docs/design/mla.md §5.4: A5's MLAPO and FA-quant are npu_mla_prolog_v3 with weight_quant_mode 3.
    throw_not_supported(cfg_.enable_mlapo ? "enable_mlapo" : fa_quant() ? "an FA-quant layer (fa_quant_kv_scale)"
                                                                        : "enable_prolog",
                        " with MXFP8 weights (A5 ", cfg_.enable_mlapo ? "MLAPO" : fa_quant() ? "FA-quant" : "PROLOG_V3",
                        "): upstream runs npu_mla_prolog_v3 with weight_quant_mode 3 there, which torch_npu 2.14.0's "
                        "documentation of the operator does not describe (it lists weight_quant_mode 0, 1 and 2), so "
                        "there are no documented semantics to build and check it against; the native preprocess takes "
                        "MXFP8 weights");
  }
  if (cfg_.enable_mlapo) {
    AAR_CHECK_ARG(qt == QuantType::W8A8Static, "enable_mlapo needs W8A8-static weights (mla_preprocess is the "
                  "W8A8-static kernel; docs/design/mla.md §4.1 disables MLAPO for other layers), got quant type ", to_string(qt));
    if (cfg_.q_norm_eps != 1e-6 || cfg_.kv_norm_eps != 1e-6) {
      throw_not_supported("enable_mlapo with q_norm_eps=", cfg_.q_norm_eps, ", kv_norm_eps=", cfg_.kv_norm_eps,
                          ": mla_preprocess takes no epsilon (its kernel uses 1e-6)");
    }
  }
  if (fa_quant()) {
    AAR_CHECK_ARG(*cfg_.fa_quant_kv_scale > 0.0, "fa_quant_kv_scale (the int8 latent cache's dequant scale) must be "
                  "positive, got ", *cfg_.fa_quant_kv_scale);
    AAR_CHECK_ARG(qt == QuantType::W8A8Dynamic, "an FA-quant layer (fa_quant_kv_scale) needs W8A8-dynamic weights "
                  "(npu_mla_prolog_v2 quantises the hidden states per token), got quant type ", to_string(qt));
    AAR_CHECK_ARG(cfg_.enable_kv_nz, "an FA-quant layer (fa_quant_kv_scale) keeps its int8 latent cache in "
                  "FRACTAL_NZ (docs/design/mla.md §5.3 row C): set enable_kv_nz");
    if (hp_ != d.num_heads) {
      throw_not_supported("an FA-quant layer with ", d.num_heads, " heads: its int8 query is not padded to ", hp_,
                          " heads (use a power-of-two head count)");
    }
    lc.kv_cache_scale = *cfg_.fa_quant_kv_scale;
  }
  if (cfg_.dcp_comm != nullptr && cfg_.dcp_comm->size() > 1) {
    if (fa_quant()) throw_not_supported("an FA-quant layer (fa_quant_kv_scale) with DCP (docs/design/mla.md §6.2)");
    if (cfg_.enable_kv_nz) throw_not_supported("enable_kv_nz with DCP (docs/design/mla.md §6.2: DCP reads ND caches)");
  }
  if (cfg_.pcp_comm != nullptr && cfg_.pcp_comm->size() > 1) {
    if (fa_quant()) throw_not_supported("an FA-quant layer (fa_quant_kv_scale) with PCP (docs/design/cp.md §11)");
    if (cfg_.enable_kv_nz) throw_not_supported("enable_kv_nz with PCP (docs/design/cp.md §11: PCP reads ND caches)");
    // The PCP merges (npu_attention_update) take head dims that are multiples of 8 in [8, 512].
    for (const auto& [v, name] : {std::pair<int64_t, const char*>{d.kv_lora_rank, "kv_lora_rank"},
                                  {d.v_head_dim, "v_head_dim"}}) {
      AAR_CHECK_ARG(v % 8 == 0 && v >= 8 && v <= 512, name, "=", v, ": PCP merges partials through "
                    "npu_attention_update, which takes a multiple of 8 in [8, 512]");
    }
  }
  lc.kv_nz = cfg_.enable_kv_nz;
  lc.heads_padded = hp_;  // the decode kernel's head count
  lc.workspace_group = cfg_.workspace_group;
  core_ = std::make_shared<detail::LatentCore>(lc, weights);
}

const at::Tensor& Impl::w_uk_t() const { return core_->w_uk_t(); }
const at::Tensor& Impl::w_uv() const { return core_->w_uv(); }
const void* Impl::decode_workspace_id() const { return core_->workspace(); }

DecodePath Impl::fused_decode_path() const {
  switch (core_->fused()) {
    case detail::Fused::PrologV3: return DecodePath::Prolog;
    case detail::Fused::Mlapo: return DecodePath::Mlapo;
    case detail::Fused::PrologV2: return DecodePath::FaQuant;
    case detail::Fused::None: break;
  }
  return DecodePath::None;
}
void Impl::refresh_weights() { core_->reload_weights(core_->weights()); }

void Impl::validate(const at::Tensor& hidden, const at::Tensor& nope, const at::Tensor& rope, const Metadata& md,
                    const at::Tensor& output) const {
  const Dims& d = cfg_.dims;
  AAR_CHECK_ARG(hidden.defined() && hidden.dim() == 2 && hidden.size(1) == d.hidden_size,
                "hidden_states must have shape (T, hidden_size=", d.hidden_size, "), got ",
                hidden.defined() ? hidden.sizes() : c10::IntArrayRef{});
  if (md.pcp.world_size > 1) {
    AAR_CHECK_ARG(hidden.size(0) == md.pcp.num_local_tokens, "hidden_states has ", hidden.size(0),
                  " rows but the PCP metadata gives this rank ", md.pcp.num_local_tokens,
                  " (pcp.num_local_tokens: the decodes, then its head and tail chunks of every prefill)");
  } else {
    AAR_CHECK_ARG(hidden.size(0) >= md.num_actual_tokens, "hidden_states has ", hidden.size(0),
                  " rows but the metadata schedules ", md.num_actual_tokens, " tokens");
    AAR_CHECK_ARG(md.num_decodes == 0 || hidden.size(0) >= md.decode.num_kernel_tokens, "hidden_states has ",
                  hidden.size(0), " rows but the padded decode batch has ", md.decode.num_kernel_tokens,
                  " tokens (graph decode padding: pass num_input_tokens rows)");
  }
  // Checked here, before the decode part of a mixed step writes the caches.
  // FA-quant layers prefill into their NZ caches (see impl.h).
  AAR_CHECK_ARG(md.num_prefills == 0 || !cfg_.enable_kv_nz || fa_quant(), "a step with ", md.num_prefills,
                " prefills and enable_kv_nz: NZ caches are for decode-only (PD decode) nodes");
  AAR_CHECK_ARG(hidden.scalar_type() == core_->dtype(), "hidden_states dtype ", hidden.scalar_type(),
                " differs from the weights' dtype ", core_->dtype());
  const c10::Device dev = core_->device();
  for (const auto& [t, name] : {std::pair<const at::Tensor*, const char*>{&hidden, "hidden_states"},
                                {&output, "output"}, {&nope, "nope_cache"}, {&rope, "rope_cache"}}) {
    AAR_CHECK_ARG(!t->defined() || t->device() == dev, name, " is on ", t->device(), " but the layer's weights are on ",
                  dev);
  }
  AAR_CHECK_ARG(output.defined() && output.sizes() == hidden.sizes() && output.scalar_type() == hidden.scalar_type(),
                "output must be a ", hidden.scalar_type(), " tensor of shape ", hidden.sizes(), ", got ",
                output.defined() ? output.scalar_type() : hidden.scalar_type(), " ",
                output.defined() ? output.sizes() : c10::IntArrayRef{});
  AAR_CHECK_ARG(output.is_contiguous(), "output must be contiguous (o_proj writes it in place), got strides ",
                output.strides());
  const internal::OutputApart apart(output);
  apart.check(hidden, "hidden_states");
  apart.check(nope, "nope_cache");
  apart.check(rope, "rope_cache");
  // FA-quant layers: the int8 latent cache.
  detail::check_latent_cache(nope, /*is_nope=*/true, d.kv_lora_rank, md, cfg_.enable_kv_nz,
                             fa_quant() ? at::kChar : hidden.scalar_type(),
                             fa_quant() ? " (the FA-quant layer's int8 latent cache)" : " (the hidden_states dtype)");
  detail::check_latent_cache(rope, /*is_nope=*/false, d.qk_rope_head_dim, md, cfg_.enable_kv_nz, hidden.scalar_type(),
                             " (the hidden_states dtype)");
  aar::detail::check_caches_disjoint(nope, rope, "nope_cache", "rope_cache");
  // The builder's rope tables set the rows' width; a table of another width fails deep in the rope.
  aar::detail::check_rope_rows_width(md.decode.cos, d.qk_rope_head_dim);
  aar::detail::check_rope_rows_width(md.prefill.cos, d.qk_rope_head_dim);
}

namespace {

constexpr int64_t kMaxPrologTokens = 1024;

detail::Fused fused_of(DecodePath p) {
  switch (p) {
    case DecodePath::Prolog: return detail::Fused::PrologV3;
    case DecodePath::Mlapo: return detail::Fused::Mlapo;
    case DecodePath::FaQuant: return detail::Fused::PrologV2;
    default: return detail::Fused::None;
  }
}

using detail::LatentCore;

}  // namespace

void Impl::release_views() {
  seen_ = SeenViews{};
  dcp_args_ = CpDecodeArgs{};
  pcp_args_ = CpDecodeArgs{};
  core_->release_views();
  decode_t_ = ops::FiaV2Tensors{};
}

void Impl::reload_weights(const Weights& nw) { core_->reload_weights(nw); }

const detail::DecodeViews& Impl::decode_views(const Metadata& md) {
  return core_->views(md.decode.num_kernel_tokens, detail::decode_layout_of(md, cfg_.enable_kv_nz));
}

void Impl::decode_fia_args(const detail::LatentQuery& q, const at::Tensor& nope, const at::Tensor& rope, const Metadata& md,
                           ops::FiaV2Tensors& t, ops::FiaV2Params& p) {
  const Dims& d = cfg_.dims;
  const int64_t L = d.kv_lora_rank, R = d.qk_rope_head_dim, bs = md.block_size;
  if (cfg_.enable_kv_nz) {
    t.key = nope;
    t.key_rope = rope;
  } else {
    // (nb, bs, 1, D) -> (nb, 1, bs, D): a pure reinterpretation since Nkv = 1,
    // made with view() on the validated (contiguous) cache, so it aliases it.
    detail::assign(t.key, LatentCore::view_of(nope, nope.sizes()[0], seen_.nope_src, seen_.key,
                       [&] { return nope.view({nope.size(0), 1, bs, L}); }));
    detail::assign(t.key_rope, LatentCore::view_of(rope, rope.sizes()[0], seen_.rope_src, seen_.key_rope,
                            [&] { return rope.view({rope.size(0), 1, bs, R}); }));
  }
  detail::assign(t.value, t.key);
  detail::assign(t.query, q.qn);
  detail::assign(t.query_rope, q.qr);
  if (fa_quant()) {
    // docs/design/mla.md §5.3: the fully quantised decode (int8 query with per-(token, head)
    // scales, the per-tensor dequant scale of the int8 latent).
    detail::assign(t.dequant_scale_query, q.dequant_scale_q);
    detail::assign(t.dequant_scale_key, core_->kv_dequant_scale());
    detail::assign(t.dequant_scale_value, core_->kv_dequant_scale());
    p.query_quant_mode = 3;
    p.key_quant_mode = 0;
    p.value_quant_mode = 0;
  }
  detail::set_latent_decode_params(md, detail::decode_layout_of(md, cfg_.enable_kv_nz), hp_, cfg_.scale, t, p);
}

void Impl::decode_post(const detail::DecodeViews& v, const at::Tensor& out_rows) {
  ops::dense::linear_out(out_rows, core_->w_uv_out(v, out_rows.sizes()[0]), core_->weights().o_proj);
}

const cp::DcpViews& Impl::dcp_views(int64_t td, const at::Tensor& like) {
  const Dims& d = cfg_.dims;
  // DCP alone merges straight into the W_UV input (H, td, L): the head-major merge order (docs/design/cp.md
  // §11.7). Under PCP x DCP the DCP merge feeds the token-major PCP wire.
  const bool head_major = cfg_.pcp_comm == nullptr;
  return detail::latent_dcp_views(*cfg_.dcp_comm,
                                  {d.num_heads, d.kv_lora_rank, d.qk_rope_head_dim, cfg_.workspace_group, head_major},
                                  like, td, dcp_ws_);
}

void Impl::dcp_stage_query(const cp::DcpViews& w, const detail::DecodeViews& v) {
  // docs/design/mla.md §6.2 reorg_decode_q: [ql_nope | q_pe] gathered along the heads.
  detail::latent_dcp_stage_query(*cfg_.dcp_comm, w, v.qn_heads, v.qr_heads);
}

void Impl::dcp_fia_args(const cp::DcpViews& w, const at::Tensor& nope, const at::Tensor& rope, const Metadata& md,
                        ops::FiaTensors& t, ops::FiaParams& p) {
  const Dims& d = cfg_.dims;
  auto [qn, qr] = detail::latent_dcp_split_query(w, d.kv_lora_rank, d.qk_rope_head_dim);
  shard_fia_args(qn, qr, nope, rope, md, t, p);
}

void Impl::shard_fia_args(const at::Tensor& qn, const at::Tensor& qr, const at::Tensor& nope, const at::Tensor& rope,
                          const Metadata& md, ops::FiaTensors& t, ops::FiaParams& p) {
  detail::set_latent_shard_params(qn, qr, nope, rope, md, cfg_.scale, t, p);
}

void Impl::dcp_combine(const cp::DcpViews& w, const detail::DecodeViews& v) {
  at::Tensor merged = v.attn_heads.transpose(0, 1);  // (td, H, L) view of the W_UV input
  cp::combine_partials(*cfg_.dcp_comm, w.partial_out, w.partial_lse, merged, std::nullopt, &w);
}

const at::Tensor& Impl::dcp_decode_attention(const at::Tensor& x, const at::Tensor& nope, const at::Tensor& rope,
                                             const Metadata& md, DecodePath path) {
  const int64_t td = md.decode.num_kernel_tokens;
  // The preprocess into the workspace (stable: the real heads are then in
  // qn_heads / qr_heads whatever the padding); it writes this rank's own
  // tokens (the local slot mapping).
  const detail::DecodeViews& v = core_->views(td, detail::DecodeLayout::BNSD);
  decode_preprocess(v, x, nope, rope, md, path, /*stable=*/true);
  if (md.pcp.world_size > 1) {
    pcp_decode_combine(v, nope, rope, md);
    return core_->w_uv_out(v, td);
  }
  const cp::DcpViews& w = dcp_views(td, v.qn_heads);
  dcp_stage_query(w, v);
  // docs/design/cp.md §11.7: the shard call's arguments and targets, and the merge's target, kept
  // while the workspace views are the same tensors.
  CpDecodeArgs& a = dcp_args_;
  if (!a.src_part.is_same(w.partial_out) || !a.src_attn.is_same(v.attn_heads)) {
    a = CpDecodeArgs{};
    const Dims& d = cfg_.dims;
    const int64_t N = w.gathered_query.size(1), L = d.kv_lora_rank;
    auto [qn, qr] = detail::latent_dcp_split_query(w, L, d.qk_rope_head_dim);
    a.t.query = qn;
    a.t.query_rope = qr;
    a.out = w.partial_out.view({td, N, 1, L});
    a.lse = w.partial_lse.view({td, N, 1, 1});
    a.merged = v.attn_heads.view({-1, L});  // the W_UV input's (H td, L) rows: the head-major merge order
    a.src_part = w.partial_out;
    a.src_attn = v.attn_heads;
  }
  refresh_shard_args(a, nope, rope, md);
  ops::fused_infer_attention_score_out(a.t, a.p, std::nullopt, a.out, a.lse);
  cp::combine_partials(*cfg_.dcp_comm, w, a.merged);
  return core_->w_uv_out(v, td);
}

void Impl::refresh_shard_args(CpDecodeArgs& a, const at::Tensor& nope, const at::Tensor& rope, const Metadata& md) {
  // What set_latent_shard_params sets, with the caches' (nb, 1, bs, D) views kept like the
  // single-rank decode's (decode_fia_args) and nothing re-assigned that did not change.
  const int64_t L = nope.sizes()[3], R = rope.sizes()[3], bs = md.block_size;
  detail::assign(a.t.key, LatentCore::view_of(nope, nope.sizes()[0], seen_.nope_src, seen_.key,
                                              [&] { return nope.view({nope.size(0), 1, bs, L}); }));
  detail::assign(a.t.key_rope, LatentCore::view_of(rope, rope.sizes()[0], seen_.rope_src, seen_.key_rope,
                                                   [&] { return rope.view({rope.size(0), 1, bs, R}); }));
  detail::assign(a.t.value, a.t.key);
  detail::assign(a.t.block_table, md.decode.block_table);
  ops::FiaParams& p = a.p;
  p.num_heads = a.t.query.sizes()[1];
  p.num_key_value_heads = 1;
  p.scale = cfg_.scale;
  p.input_layout = "BNSD";
  p.sparse_mode = 0;
  p.block_size = bs;
  p.has_actual_seq_lengths = false;
  p.actual_seq_lengths_kv = md.decode.seq_lens_list;  // this rank's local lengths
  p.softmax_lse_flag = true;
}

const cp::DcpViews& Impl::pcp_wire_views(int64_t td, const at::Tensor& like) {
  const Dims& d = cfg_.dims;
  // Merged straight into the W_UV input (H, td, L): the head-major merge order (docs/design/cp.md §11.7).
  return cp::pcp_wire_views(*cfg_.pcp_comm, d.num_heads, d.kv_lora_rank, like.device(), cfg_.workspace_group, td,
                            pcp_ws_, /*head_major=*/true);
}

const cp::DcpViews& Impl::pcp_stage_views(int64_t td, const at::Tensor& like) {
  // PCP alone: a DcpWorkspace of one rank (no collective touches it) keyed like the DCP one; its
  // split query halves are the shard call's contiguous (td, H, 1, L) / (td, H, 1, R) queries and its
  // partial_out the kernel's output when the model dtype is not the wire's fp32.
  const Dims& d = cfg_.dims;
  cp::DcpWorkspaceShape sh;
  sh.device = like.device();
  sh.q_dtype = sh.out_dtype = like.scalar_type();
  sh.world = 1;
  sh.heads = d.num_heads;
  sh.q_dim = d.kv_lora_rank + d.qk_rope_head_dim;
  sh.out_dim = d.kv_lora_rank;
  sh.regroup = true;
  sh.q_split = d.kv_lora_rank;
  sh.comm = cfg_.pcp_comm;
  sh.workspace_group = cfg_.workspace_group;
  if (!pcp_stage_ws_ || !(pcp_stage_ws_->shape() == sh)) pcp_stage_ws_ = cp::DcpWorkspace::shared(sh);
  return pcp_stage_ws_->views(td);
}

void Impl::pcp_shard_call(const cp::DcpViews& s, const cp::DcpViews& pw, const detail::DecodeViews& v,
                          const at::Tensor& nope, const at::Tensor& rope, const Metadata& md, ops::FiaTensors& t,
                          ops::FiaParams& p, at::Tensor& out, at::Tensor& lse) {
  // PCP alone: the real heads staged contiguous, the LSE written by the kernel into the wire's LSE
  // column, the output into the wire's output columns when the model dtype is fp32 (else into the
  // staging workspace, cast into the wire after the call: the kernel's output takes the query dtype).
  shard_fia_args(s.staged_a4, s.staged_b4, nope, rope, md, t, p);
  out = v.qn_heads.scalar_type() == at::kFloat ? pw.wire_out4 : s.partial_out.unsqueeze(2);
  lse = pw.wire_lse4;
}

void Impl::pcp_decode_combine(const detail::DecodeViews& v, const at::Tensor& nope, const at::Tensor& rope,
                              const Metadata& md) {
  // docs/design/cp.md §11, §11.5 (legacy PCP x DCP decode): this rank's partial over its KV shard in
  // the wire layout (td, H, L+1) fp32 of the PCP merge workspace, merged over the DCP group first when
  // there is one, then gathered over PCP and merged into the W_UV input.
  const int64_t td = md.decode.num_kernel_tokens, L = cfg_.dims.kv_lora_rank;
  const cp::DcpViews& pw = pcp_wire_views(td, v.qn_heads);
  // docs/design/cp.md §11.7: the shard call's arguments and targets and the merge's target are kept
  // while the workspace views (the DCP exchange's or the PCP-alone staging, the wire, the W_UV input)
  // are the same tensors.
  CpDecodeArgs& a = pcp_args_;
  if (md.dcp.world_size > 1) {
    const cp::DcpViews& w = dcp_views(td, v.qn_heads);
    dcp_stage_query(w, v);
    if (!a.src_part.is_same(w.partial_out) || !a.src_attn.is_same(v.attn_heads) || !a.src_wire.is_same(pw.wire)) {
      a = CpDecodeArgs{};
      const int64_t N = w.gathered_query.size(1);
      auto [qn, qr] = detail::latent_dcp_split_query(w, L, cfg_.dims.qk_rope_head_dim);
      a.t.query = qn;
      a.t.query_rope = qr;
      a.out = w.partial_out.view({td, N, 1, L});
      a.lse = w.partial_lse.view({td, N, 1, 1});
      a.merged = v.attn_heads.view({-1, L});  // the W_UV input's (H td, L) rows: the PCP merge's order
      a.src_part = w.partial_out;
      a.src_attn = v.attn_heads;
      a.src_wire = pw.wire;
    }
    refresh_shard_args(a, nope, rope, md);
    ops::fused_infer_attention_score_out(a.t, a.p, std::nullopt, a.out, a.lse);
    at::Tensor merged = pw.wire_out;
    cp::combine_partials(*cfg_.dcp_comm, w.partial_out, w.partial_lse, merged, pw.wire_lse, &w);
  } else {
    const cp::DcpViews& s = pcp_stage_views(td, v.qn_heads);
    ops::dense::copy(s.staged_a, v.qn_heads);
    ops::dense::copy(s.staged_b, v.qr_heads);
    if (!a.src_part.is_same(s.staged_a4) || !a.src_attn.is_same(v.attn_heads) || !a.src_wire.is_same(pw.wire)) {
      a = CpDecodeArgs{};
      pcp_shard_call(s, pw, v, nope, rope, md, a.t, a.p, a.out, a.lse);
      a.merged = v.attn_heads.view({-1, L});  // the W_UV input's (H td, L) rows: the PCP merge's order
      a.src_part = s.staged_a4;
      a.src_attn = v.attn_heads;
      a.src_wire = pw.wire;
    }
    refresh_shard_args(a, nope, rope, md);
    ops::fused_infer_attention_score_out(a.t, a.p, std::nullopt, a.out, a.lse);
    if (v.qn_heads.scalar_type() != at::kFloat) ops::dense::copy(pw.wire_out, s.partial_out);
  }
  cp::pcp_gather_merge_rows(*cfg_.pcp_comm, pw, a.merged);
}

void Impl::pcp_merge_wire(const cp::DcpViews& pw, const detail::DecodeViews& v) {
  // Every PCP rank's shard: the Wp wire blocks of the same rows, gathered and merged straight into
  // the W_UV input (its (td, H, L) view).
  cp::pcp_gather_merge(*cfg_.pcp_comm, pw, v.attn_heads.transpose(0, 1));
}

void Impl::capture_pcp_decode(graph::GraphParams& g, const at::Tensor& hidden, const at::Tensor& nope,
                              const at::Tensor& rope, const Metadata& md, const at::Tensor& output, DecodePath path) {
  // docs/design/cp.md §11.4: the eager PCP decode (pcp_decode_combine) in three recorded calls,
  // the collectives inside them (on the NPU captured into the device graph); every
  // intermediate is the decode workspace's or a DcpWorkspace's (the DCP exchange, the PCP wire and
  // merge, the PCP-alone query staging), whose views the closures hold: stable addresses.
  const int64_t n = g.capturing_bucket(), L = cfg_.dims.kv_lora_rank;
  const detail::DecodeViews v = core_->views(n, detail::DecodeLayout::BNSD);
  const cp::DcpViews pw = pcp_wire_views(n, v.qn_heads);
  ops::FiaTensors t;
  ops::FiaParams p;
  if (md.dcp.world_size > 1) {
    const cp::DcpViews w = dcp_views(n, v.qn_heads);
    g.capture_call(std::make_unique<graph::ClosureCall>(
        cfg_.layer_index, 0, [this, v, w, hidden, nope, rope, md_at_capture = md, path]() {
          decode_preprocess(v, hidden, nope, rope, md_at_capture, path, /*stable=*/true);
          dcp_stage_query(w, v);
        }));
    dcp_fia_args(w, nope, rope, md, t, p);
    const int64_t N = w.gathered_query.size(1);
    graph_calls::capture_fia(g, {cfg_.layer_index, 0}, {/*paged=*/true, /*q_lens=*/false}, std::move(t), p,
                             w.partial_out.view({n, N, 1, L}), w.partial_lse.view({n, N, 1, 1}));
    g.capture_call(std::make_unique<graph::ClosureCall>(
        cfg_.layer_index, 0, [this, v, w, pw, out = at::Tensor(output)]() {
          at::Tensor merged = pw.wire_out;
          cp::combine_partials(*cfg_.dcp_comm, w.partial_out, w.partial_lse, merged, pw.wire_lse, &w);
          pcp_merge_wire(pw, v);
          decode_post(v, out);
        }));
    return;
  }
  // PCP alone: the queries staged into the one-rank workspace's (n, H, 1, D) halves.
  const cp::DcpViews s = pcp_stage_views(n, v.qn_heads);
  g.capture_call(std::make_unique<graph::ClosureCall>(
      cfg_.layer_index, 0, [this, v, s, hidden, nope, rope, md_at_capture = md, path]() {
        decode_preprocess(v, hidden, nope, rope, md_at_capture, path, /*stable=*/true);
        ops::dense::copy(s.staged_a, v.qn_heads);
        ops::dense::copy(s.staged_b, v.qr_heads);
      }));
  at::Tensor part, lse;
  pcp_shard_call(s, pw, v, nope, rope, md, t, p, part, lse);
  graph_calls::capture_fia(g, {cfg_.layer_index, 0}, {/*paged=*/true, /*q_lens=*/false}, std::move(t), p, part, lse);
  const bool cast = v.qn_heads.scalar_type() != at::kFloat;
  g.capture_call(std::make_unique<graph::ClosureCall>(
      cfg_.layer_index, 0, [this, v, s, pw, cast, out = at::Tensor(output)]() {
        if (cast) ops::dense::copy(pw.wire_out, s.partial_out);
        pcp_merge_wire(pw, v);
        decode_post(v, out);
      }));
}

std::pair<at::Tensor, at::Tensor> Impl::pcp_gather_prefill_kv(const at::Tensor& c, const at::Tensor& k_pe,
                                                              const at::Tensor& nope, const at::Tensor& rope,
                                                              const Metadata& md) {
  // docs/design/cp.md §11 / §6.3: the ranks' local prefill rows gathered (rank-major), put in
  // the padded-global order and written through its slot mapping (this rank's KV rows only;
  // pads and other ranks' rows are -1).
  const int64_t L = c.size(1), R = k_pe.size(1), tp = c.size(0);
  const int64_t Wp = md.pcp.world_size, td = md.num_decode_tokens;
  const at::Tensor all = cfg_.pcp_comm->all_gather(at::cat({c, k_pe}, -1), 0);  // (Wp tp, L+R)
  const at::Tensor full = all.index_select(0, md.pcp.prefill_restore_idx);
  const at::Tensor fc = full.narrow(-1, 0, L), fr = full.narrow(-1, L, R);
  at::Tensor nc = nope, rc = rope;
  ops::scatter_pa_kv_cache(fc.unsqueeze(1).contiguous(), fr.unsqueeze(1).contiguous(), nc, rc,
                           md.pcp.padded_slot_mapping.narrow(0, Wp * td, Wp * tp), "Norm");
  return {fc, fr};
}

const at::Tensor& Impl::decode_attention(const at::Tensor& x, const at::Tensor& nope, const at::Tensor& rope,
                                         const Metadata& md, DecodePath path) {
  if (md.dcp.world_size > 1 || md.pcp.world_size > 1) return dcp_decode_attention(x, nope, rope, md, path);
  const detail::DecodeViews& v = decode_views(md);
  const detail::LatentQuery q = decode_preprocess(v, x, nope, rope, md, path, /*stable=*/false);
  // The eager decode's FIA arguments persist between calls: a steady-state step
  // re-assigns nothing but what changed.
  decode_fia_args(q, nope, rope, md, decode_t_, decode_p_);
  at::Tensor attn = v.attn;
  ops::fused_infer_attention_score_v2_out(decode_t_, decode_p_, std::nullopt, attn, lse_placeholder_);
  return core_->w_uv_out(v, md.decode.num_kernel_tokens);
}

void Impl::decode_forward(const at::Tensor& hidden, const at::Tensor& nope, const at::Tensor& rope,
                          const Metadata& md, DecodePath path, const at::Tensor& out_rows) {
  const Weights& W = core_->weights();
  const int64_t td = md.decode.num_kernel_tokens;
  ops::dense::linear_out(
      out_rows, decode_attention(hidden.sizes()[0] == td ? hidden : hidden.narrow(0, 0, td), nope, rope, md, path),
      W.o_proj);
}

at::Tensor Impl::prefill_attention(const at::Tensor& q_nope, const at::Tensor& q_pe, const at::Tensor& k_nope,
                                   const at::Tensor& k_pe, const at::Tensor& value, const at::Tensor& nope,
                                   const at::Tensor& rope, const Metadata& md) const {
  const Dims& d = cfg_.dims;
  detail::PrefillSpec s;
  s.heads = d.num_heads;
  s.heads_padded = hp_;
  s.kv_lora_rank = d.kv_lora_rank;
  s.nope_dim = d.qk_nope_head_dim;
  s.rope_dim = d.qk_rope_head_dim;
  s.v_head_dim = d.v_head_dim;
  s.scale = cfg_.scale;
  s.kv_b_proj = core_->weights().kv_b_proj;
  s.kv_cache_scale = cfg_.fa_quant_kv_scale;
  s.in_bf16 = cfg_.prefill_in_bf16;
  s.dcp_comm = cfg_.dcp_comm;
  s.pcp_comm = cfg_.pcp_comm;
  return detail::latent_prefill_attention(s, q_nope, q_pe, k_nope, k_pe, value, nope, rope, md);
}

detail::LatentQuery Impl::decode_preprocess(const detail::DecodeViews& v, const at::Tensor& x,
                                            const at::Tensor& nope, const at::Tensor& rope, const Metadata& md,
                                            DecodePath path, bool stable) {
  // The decode rows as the kernels see them (padded with graph decode padding).
  detail::LatentStep s;
  s.x = x;
  s.cos = md.decode.cos;
  s.sin = md.decode.sin;
  s.slots = md.slot_mapping;
  return core_->preprocess(v, s, nope, rope, fused_of(path), stable);
}

void Impl::capture_decode(graph::GraphParams& g, const at::Tensor& hidden, const at::Tensor& nope,
                          const at::Tensor& rope, const Metadata& md, const at::Tensor& output, DecodePath path) {
  // docs/design/graph.md §4.2 (MLA decode): the projections, RoPE and cache write (prepare), the
  // absorbed latent attention (a fused call refreshed per step: block table, KV
  // lengths, and the query ends in the speculative TND layout), then W_UV and
  // o_proj (prepare). The device graph captures the prepare work as plain
  // kernels; the CPU recording provider replays the closures in order. The
  // intermediates are the decode workspace's buffers, at stable addresses.
  const int64_t n = g.capturing_bucket();
  const int64_t td = md.num_decodes > 0 ? md.decode.num_kernel_tokens : 0;
  if (md.num_prefills != 0 || td != n || md.num_input_tokens != n || hidden.sizes()[0] != n) {
    throw_not_supported("MLA graph capture of bucket ", n, " takes decode-only batches of ", n,
                        " kernel tokens (got ", md.num_decodes, " decodes with ", td, " kernel tokens, ",
                        md.num_prefills, " prefills, num_input_tokens=", md.num_input_tokens,
                        "; pad smaller decode batches with MetadataBuilder graph_decode_padding)");
  }
  if (md.pcp.world_size > 1) {
    capture_pcp_decode(g, hidden, nope, rope, md, output, path);
    return;
  }
  if (md.dcp.world_size > 1) {
    capture_dcp_decode(g, hidden, nope, rope, md, output, path);
    return;
  }
  // The closures hold copies of the views (and so the buffers) they use.
  const detail::DecodeViews v = decode_views(md);
  // The closure keeps the capture-time metadata: its tensors are views of the
  // builder's persistent buffers, which every later build refills in place.
  g.capture_call(std::make_unique<graph::ClosureCall>(
      cfg_.layer_index, 0, [this, v, hidden, nope, rope, md_at_capture = md, path]() {
        decode_preprocess(v, hidden, nope, rope, md_at_capture, path, /*stable=*/true);
      }));

  // The queries the prepare call leaves at stable addresses: the workspace's
  // (padded) buffers, or the FA-quant int8 query's own buffers.
  const detail::LatentQuery q = path == DecodePath::FaQuant ? core_->fa_query_buffers(n, v.layout)
                                                            : detail::LatentQuery{v.fia_qn, v.fia_qr};
  ops::FiaV2Tensors t;
  ops::FiaV2Params p;
  decode_fia_args(q, nope, rope, md, t, p);
  // BNSD/BSND layouts take no query-length list; the speculative TND one does.
  graph_calls::capture_fia_v2(g, {cfg_.layer_index, 0}, {/*paged=*/true, /*q_lens=*/md.speculative}, std::move(t), p,
                              v.attn, lse_placeholder_);

  g.capture_call(std::make_unique<graph::ClosureCall>(cfg_.layer_index, 0,
                                                      [this, v, out = at::Tensor(output)]() { decode_post(v, out); }));
}

void Impl::capture_dcp_decode(graph::GraphParams& g, const at::Tensor& hidden, const at::Tensor& nope,
                              const at::Tensor& rope, const Metadata& md, const at::Tensor& output, DecodePath path) {
  // The DCP decode of docs/design/mla.md §6.2 in three recorded calls: the preprocess (cache
  // write of this rank's own tokens) with the query gather (prepare; on the NPU
  // the collective is captured into the device graph), the latent attention
  // over the local shard (FIA v1 BNSD, refreshed per step: block table and
  // local KV lengths), the exchange + merge, W_UV and o_proj (prepare). Every
  // intermediate lives in the decode workspace or the shared DcpWorkspace.
  const int64_t n = g.capturing_bucket();
  const detail::DecodeViews v = core_->views(n, detail::DecodeLayout::BNSD);
  const cp::DcpViews w = dcp_views(n, v.qn_heads);
  g.capture_call(std::make_unique<graph::ClosureCall>(
      cfg_.layer_index, 0, [this, v, w, hidden, nope, rope, md_at_capture = md, path]() {
        decode_preprocess(v, hidden, nope, rope, md_at_capture, path, /*stable=*/true);
        dcp_stage_query(w, v);
      }));

  ops::FiaTensors t;
  ops::FiaParams p;
  dcp_fia_args(w, nope, rope, md, t, p);
  const int64_t N = w.gathered_query.size(1), L = cfg_.dims.kv_lora_rank;
  // BNSD: one query row per request, no query-length list.
  graph_calls::capture_fia(g, {cfg_.layer_index, 0}, {/*paged=*/true, /*q_lens=*/false}, std::move(t), p,
                           w.partial_out.view({n, N, 1, L}), w.partial_lse.view({n, N, 1, 1}));

  g.capture_call(std::make_unique<graph::ClosureCall>(cfg_.layer_index, 0, [this, v, w, out = at::Tensor(output)]() {
    dcp_combine(w, v);
    decode_post(v, out);
  }));
}

const at::Tensor& Impl::forward(const at::Tensor& hidden, const at::Tensor& nope, const at::Tensor& rope,
                                const Metadata* md_ptr, const at::Tensor& output) {
  // Shared workspaces used below are held for this forward (one thread at a time).
  graph::ForwardScope exclusive_scope;
  const Weights& W = core_->weights();
  last_decode_ = DecodePath::None;
  if (md_ptr == nullptr) {
    graph::refuse_if_capturing("an MLA forward without metadata (profiling run)");
    return internal::zero_profiling_output(output, hidden, "hidden_states");
  }
  const Metadata& md = *md_ptr;
  check_current(md.stamp, "metadata");
  validate(hidden, nope, rope, md, output);
  cp::check_comm_matches(cfg_.dcp_comm, md.dcp.world_size, md.dcp.rank, "DCP", "dcp_comm", "dcp_world_size");
  cp::check_comm_matches(cfg_.pcp_comm, md.pcp.world_size, md.pcp.rank, "PCP", "pcp_comm", "pcp_world_size");
  if (md.pcp.world_size > 1 && md.num_prefills > 0) {
    // docs/design/cp.md §11.4: a step with prefills (their head/tail split, the PCP gathers of
    // the prefill keys and context chunks) is eager only.
    graph::refuse_if_capturing("an MLA PCP forward of a step with prefills (PCP capture of prefill steps is not "
                               "supported; only decode-only buckets are captured)");
  }
  const KvHookScope<Metadata> kv_scope(kv_hooks, nope, rope, md.num_decode_tokens + md.num_prefill_tokens > 0, md,
                                       "mla");
  const Dims& d = cfg_.dims;
  const int64_t H = d.num_heads, L = d.kv_lora_rank, P = d.qk_nope_head_dim, R = d.qk_rope_head_dim,
                V = d.v_head_dim;
  // PCP: this rank's prefill rows (its head and tail chunks).
  const int64_t td = md.num_decode_tokens,
                tp = md.pcp.world_size > 1 ? md.pcp.num_local_prefill_tokens : md.num_prefill_tokens;
  // The dense work runs without autograd; serving engines usually run the
  // model under inference mode already (entering it costs two TLS writes).
  const aar::detail::InferenceScope inference;
  if (!lse_placeholder_.defined() || lse_placeholder_.device() != hidden.device()) {
    lse_placeholder_ = at::zeros({1}, hidden.options().dtype(at::kFloat));
  }
  // The decode's preprocess: the layer's fused one where upstream allows it
  // (docs/design/mla.md §5.1: decode-only steps of <= 1024 decode tokens; FA-quant: always,
  // see impl.h), else native.
  DecodePath path = DecodePath::Native;
  const DecodePath fused = fused_decode_path();
  if (fused == DecodePath::FaQuant) {
    path = fused;
  } else if (fused != DecodePath::None && md.num_prefills == 0 && td > 0 &&
             md.decode.num_kernel_tokens <= kMaxPrologTokens) {
    path = fused;
  }
  if (graph::GraphParams* g = graph::GraphParams::current()) {
    graph::note_layer_life(life_, "mla.Impl", cfg_.layer_index);  // recorded closures call this layer
    capture_decode(*g, hidden, nope, rope, md, output, path);
    g->note_metadata(0, md.stamp);  // docs/design/graph.md §1.2
    last_decode_ = path;
    return output;
  }
  const int64_t rows = hidden.sizes()[0];
  if (tp == 0) {
    // Decode-only: o_proj straight from the decode rows (the padded bucket with
    // graph decode padding, whose dummy rows attend nothing); rows past them
    // get o_proj(0) = 0 (o_proj has no bias).
    const int64_t tk = td > 0 ? md.decode.num_kernel_tokens : 0;
    if (tk > 0 && tk == rows) {  // (an empty step has no decode to run)
      decode_forward(hidden, nope, rope, md, path, output);
    } else {
      if (tk > 0) decode_forward(hidden, nope, rope, md, path, output.narrow(0, 0, tk));
      ops::dense::zero(output.narrow(0, tk, rows - tk));
    }
    if (td > 0) last_decode_ = path;
    return output;
  }
  at::Tensor o_in = ops::dense::zeros({rows, H * V}, hidden.options());
  if (td > 0) {
    // Mixed step: the decode rows' o_proj input goes into o_in like the prefill's.
    ops::dense::copy(o_in.narrow(0, 0, td), decode_attention(hidden.narrow(0, 0, td), nope, rope, md, path));
    last_decode_ = path;
  }
  if (tp > 0) {
    const at::Tensor x = hidden.narrow(0, td, tp);
    // The projections (W8A8 linears for quantised layers).
    const detail::Projections pj = core_->project(x);
    const at::Tensor kv_raw = pj.kv_raw.contiguous();
    const at::Tensor q = pj.q.view({tp, H, P + R});
    const at::Tensor cos = md.prefill.cos.view({tp, 1, 1, R}), sin = md.prefill.sin.view({tp, 1, 1, R});
    const at::Tensor q_pe =
        ops::interleave_rope(q.narrow(-1, P, R).reshape({tp, H, 1, R}), cos, sin).view({tp, H, R});
    // FA-quant layers write their int8 NZ latent cache quantised like the
    // prolog does (impl.h); the returned rows stay unquantised.
    auto kvr = fa_quant() ? ops::kv_rmsnorm_rope_cache(kv_raw.view({tp, 1, 1, L + R}), W.kv_a_layernorm, cos, sin,
                                                       md.slot_mapping.narrow(0, td, tp), rope, nope,
                                                       cfg_.kv_norm_eps, "PA_NZ", /*is_output_kv=*/true,
                                                       core_->kv_quant_scale())
                          : ops::kv_rmsnorm_rope_cache(kv_raw.view({tp, 1, 1, L + R}), W.kv_a_layernorm, cos, sin,
                                                       md.slot_mapping.narrow(0, td, tp), rope, nope,
                                                       cfg_.kv_norm_eps, "PA", /*is_output_kv=*/true);
    // PCP: the slots above are -1 (the local rows are written after the gather); the keys are
    // then every PCP rank's restored prefill rows.
    at::Tensor c_kv = std::get<3>(kvr).view({tp, L}), k_rope = std::get<2>(kvr).view({tp, R});
    if (md.pcp.world_size > 1) std::tie(c_kv, k_rope) = pcp_gather_prefill_kv(c_kv, k_rope, nope, rope, md);
    const int64_t nk = c_kv.size(0);
    const at::Tensor k_pe = k_rope.view({nk, 1, R}).expand({nk, H, R});
    const at::Tensor kv = ops::dense::linear(c_kv, W.kv_b_proj).view({nk, H, P + V});
    const at::Tensor out = prefill_attention(q.narrow(-1, 0, P).contiguous(), q_pe, kv.narrow(-1, 0, P).contiguous(),
                                             k_pe, kv.narrow(-1, P, V).contiguous(), nope, rope, md);
    ops::dense::copy(o_in.narrow(0, td, tp), out);
  }
  ops::dense::linear_out(output, o_in, W.o_proj);
  return output;
}

}  // namespace aar::mla
