// Per-layer MLA forward (spec mla.md section 5).
#include "ascend_attn_rt/mla/impl.h"

#include <ATen/ATen.h>

#include <cmath>

#include "ascend_attn_rt/errors.h"
#include "ascend_attn_rt/graph/graph_params.h"
#include "ascend_attn_rt/mla/backend.h"
#include "ascend_attn_rt/ops/attention_update.h"
#include "ascend_attn_rt/ops/dense.h"
#include "ascend_attn_rt/ops/fused_infer_attention.h"
#include "ascend_attn_rt/ops/gather_pa_kv_cache.h"
#include "ascend_attn_rt/ops/interleave_rope.h"
#include "ascend_attn_rt/ops/kv_rmsnorm_rope_cache.h"
#include "ascend_attn_rt/ops/mla_prolog.h"
#include "ascend_attn_rt/ops/transpose_batchmatmul.h"

namespace aar::mla {

namespace {

constexpr int64_t kMaxPrologTokens = 1024;

}  // namespace

const char* to_string(DecodePath p) {
  switch (p) {
    case DecodePath::None: return "none";
    case DecodePath::Native: return "native";
    case DecodePath::Prolog: return "prolog";
  }
  return "unknown";
}

Impl::Impl(const ImplConfig& cfg, const Weights& weights) : cfg_(cfg), w_(weights) {
  const Dims& d = cfg_.dims;
  hp_ = Backend::num_heads_padded(d.num_heads);
  validate_weights(d, w_);
  if (cfg_.scale == 0.0) cfg_.scale = 1.0 / std::sqrt(static_cast<double>(d.qk_nope_head_dim + d.qk_rope_head_dim));
  const Absorbed a = split_kv_b_proj(w_.kv_b_proj, d.num_heads, d.qk_nope_head_dim, d.v_head_dim);
  w_uk_t_ = a.w_uk_t;
  w_uv_ = a.w_uv;
  if (cfg_.enable_prolog) {
    AAR_CHECK_ARG(d.q_lora_rank.has_value(),
                  "enable_prolog needs q-LoRA (q_lora_rank): npu_mla_prolog_v3 takes the q down-projection");
    prolog_ = prepare_prolog_weights(d, w_, w_uk_t_);
  }
}

void Impl::validate(const at::Tensor& hidden, const at::Tensor& nope, const at::Tensor& rope, const Metadata& md,
                    const at::Tensor& output) const {
  const Dims& d = cfg_.dims;
  AAR_CHECK_ARG(hidden.defined() && hidden.dim() == 2 && hidden.size(1) == d.hidden_size,
                "hidden_states must have shape (T, hidden_size=", d.hidden_size, "), got ",
                hidden.defined() ? hidden.sizes() : c10::IntArrayRef{});
  AAR_CHECK_ARG(hidden.size(0) >= md.num_actual_tokens, "hidden_states has ", hidden.size(0),
                " rows but the metadata schedules ", md.num_actual_tokens, " tokens");
  AAR_CHECK_ARG(hidden.scalar_type() == w_.q_proj.scalar_type(), "hidden_states dtype ", hidden.scalar_type(),
                " differs from the weights' dtype ", w_.q_proj.scalar_type());
  AAR_CHECK_ARG(output.defined() && output.sizes() == hidden.sizes() && output.scalar_type() == hidden.scalar_type(),
                "output must be a ", hidden.scalar_type(), " tensor of shape ", hidden.sizes(), ", got ",
                output.defined() ? output.sizes() : c10::IntArrayRef{});
  for (const at::Tensor* c : {&nope, &rope}) {
    const bool is_nope = c == &nope;
    const char* name = is_nope ? "nope_cache" : "rope_cache";
    const int64_t width = is_nope ? d.kv_lora_rank : d.qk_rope_head_dim;
    AAR_CHECK_ARG(c->defined(), name, " is missing");
    if (!cfg_.enable_kv_nz) {
      AAR_CHECK_ARG(c->dim() == 4 && c->size(1) == md.block_size && c->size(2) == 1 && c->size(3) == width, name,
                    " must have shape (num_blocks, block_size=", md.block_size, ", 1, ",
                    is_nope ? "kv_lora_rank=" : "qk_rope_head_dim=", width, "), got ", c->sizes());
    } else {
      const auto s = Backend::nz_cache_shape(c->size(0), md.block_size, width, c->element_size());
      AAR_CHECK_ARG(c->sizes() == c10::IntArrayRef(s), name, " must be the NZ cache ", c10::IntArrayRef(s),
                    " (enable_kv_nz), got ", c->sizes());
    }
    AAR_CHECK_ARG(c->size(0) >= md.num_blocks, name, " has ", c->size(0), " blocks, fewer than the metadata's ",
                  md.num_blocks);
    AAR_CHECK_ARG(c->scalar_type() == hidden.scalar_type(), name, " dtype ", c->scalar_type(),
                  " differs from hidden_states dtype ", hidden.scalar_type());
  }
}

void Impl::decode_fia_args(const at::Tensor& qn, const at::Tensor& qr, const at::Tensor& nope,
                           const at::Tensor& rope, const Metadata& md, ops::FiaV2Tensors& t,
                           ops::FiaV2Params& p) const {
  const Dims& d = cfg_.dims;
  const int64_t td = qn.size(0), L = d.kv_lora_rank, R = d.qk_rope_head_dim;
  const int64_t bs = md.block_size;
  if (cfg_.enable_kv_nz) {
    t.key = nope;
    t.key_rope = rope;
  } else {
    // (nb, bs, 1, D) -> (nb, 1, bs, D): a pure reinterpretation since Nkv = 1.
    t.key = nope.view({nope.size(0), 1, bs, L});
    t.key_rope = rope.view({rope.size(0), 1, bs, R});
  }
  t.value = t.key;
  t.block_table = md.decode.block_table;
  p.num_query_heads = hp_;
  p.num_key_value_heads = 1;
  p.softmax_scale = cfg_.scale;
  p.block_size = bs;
  p.actual_seq_kvlen = md.decode.seq_lens_list;
  if (md.speculative) {
    // Row A of spec 5.3. Upstream also requires the state to be one of
    // SpecDecoding/ChunkedPrefill/DecodeOnly/PrefillNoCache and otherwise falls
    // to the BNSD row with a multi-token decode, mismatching block-table rows
    // and batch (spec 9.11); we use TND_NTD whenever decodes may have several tokens.
    t.query = qn;
    t.query_rope = qr;
    t.atten_mask = md.attn_mask;
    p.sparse_mode = 3;
    p.input_layout = "TND_NTD";
    p.actual_seq_qlen = md.decode.actual_seq_lengths_q;
  } else if (cfg_.enable_kv_nz) {
    t.query = qn.view({td, 1, hp_, L});
    t.query_rope = qr.view({td, 1, hp_, R});
    p.input_layout = "BSND_NBSD";
    p.has_actual_seq_qlen = false;
  } else {
    t.query = qn.view({td, hp_, 1, L});
    t.query_rope = qr.view({td, hp_, 1, R});
    p.input_layout = "BNSD_NBSD";
    p.has_actual_seq_qlen = false;
  }
}

at::Tensor Impl::decode_post(const at::Tensor& attn_out, int64_t td) const {
  const Dims& d = cfg_.dims;
  const int64_t H = d.num_heads, L = d.kv_lora_rank;
  // Head-major output (_NBSD / _NTD): drop the padded heads, then W_UV.
  const at::Tensor out = attn_out.narrow(0, 0, H).reshape({H, td, L});
  static const int64_t perm_y[3] = {1, 0, 2};
  return ops::transpose_batchmatmul(out, w_uv_.to(out.scalar_type()), std::nullopt, std::nullopt,
                                    c10::IntArrayRef(perm_y, 3))
      .reshape({td, H * d.v_head_dim});
}

at::Tensor Impl::decode_attention(const at::Tensor& ql_nope, const at::Tensor& q_pe, const at::Tensor& nope,
                                  const at::Tensor& rope, const Metadata& md) const {
  ops::FiaV2Tensors t;
  ops::FiaV2Params p;
  decode_fia_args(ops::dense::pad_dim1(ql_nope, hp_), ops::dense::pad_dim1(q_pe, hp_), nope, rope, md, t, p);
  return decode_post(std::get<0>(ops::fused_infer_attention_score_v2(t, p)), ql_nope.size(0));
}

at::Tensor Impl::prefill_attention(const at::Tensor& q_nope, const at::Tensor& q_pe, const at::Tensor& k_nope,
                                   const at::Tensor& k_pe, const at::Tensor& value, const at::Tensor& nope,
                                   const at::Tensor& rope, const Metadata& md) const {
  const Dims& d = cfg_.dims;
  const int64_t tp = q_nope.size(0), H = d.num_heads, L = d.kv_lora_rank, P = d.qk_nope_head_dim, V = d.v_head_dim;
  const bool concat = hp_ != H;  // spec 5.5: non-power-of-two heads pass concatenated q/k, no rope tensors
  const auto& pf = md.prefill;
  auto attend = [&](const at::Tensor& kn, const at::Tensor& kp, const at::Tensor& v, bool causal,
                    c10::IntArrayRef kv_ends) {
    ops::FiaTensors t;
    ops::FiaParams p;
    if (concat) {
      t.query = at::cat({q_nope, q_pe}, -1);
      t.key = at::cat({kn, kp}, -1);
    } else {
      t.query = q_nope;
      t.key = kn;
      t.query_rope = q_pe;
      t.key_rope = kp;
    }
    t.value = v;
    if (causal) t.atten_mask = md.attn_mask;
    p.sparse_mode = causal ? 3 : 0;
    p.num_heads = H;
    p.num_key_value_heads = H;
    p.scale = cfg_.scale;
    p.input_layout = "TND";
    p.actual_seq_lengths = pf.actual_seq_lengths_q;
    p.actual_seq_lengths_kv = kv_ends;
    p.softmax_lse_flag = true;
    return ops::fused_infer_attention_score(t, p);
  };
  auto [out0, lse0] = attend(k_nope, k_pe, value, /*causal=*/true, pf.actual_seq_lengths_q);
  const ChunkedContext& cc = pf.chunked;
  if (cc.num_chunks == 0) return out0.reshape({tp, H * V});

  // Spec 5.6: gather each chunk from the caches, up-project, attend, merge.
  std::vector<at::Tensor> outs{out0.to(at::kFloat).reshape({tp * H, V})};
  std::vector<at::Tensor> lses{lse0.reshape({tp * H})};
  const auto opts = nope.options();
  for (int32_t c = 0; c < cc.num_chunks; ++c) {
    const int64_t toks = cc.seq_tot[c];
    at::Tensor kv_c = at::empty({toks, 1, L}, opts);
    at::Tensor kpe = at::empty({toks, 1, d.qk_rope_head_dim}, rope.options());
    ops::gather_pa_kv_cache(nope, rope, pf.block_table, cc.chunk_seq_lens[c], kv_c, kpe, cc.starts[c]);
    const at::Tensor kv = ops::dense::linear(kv_c.view({toks, L}), w_.kv_b_proj).view({toks, H, P + V});
    const at::Tensor kn = kv.narrow(-1, 0, P).contiguous();
    const at::Tensor v = kv.narrow(-1, P, V).contiguous();
    const at::Tensor kp = kpe.expand({toks, H, d.qk_rope_head_dim});
    auto [out_c, lse_c] = attend(kn, kp, v, /*causal=*/false, cc.kv_ends[c]);
    outs.push_back(out_c.to(at::kFloat).reshape({tp * H, V}));
    lses.push_back(lse_c.reshape({tp * H}));
  }
  const at::Tensor merged = std::get<0>(ops::attention_update(lses, outs, 0));
  return merged.view({tp, H * V});
}

std::pair<at::Tensor, at::Tensor> Impl::decode_preprocess(const at::Tensor& hidden, const at::Tensor& nope,
                                                          const at::Tensor& rope, const Metadata& md,
                                                          bool use_prolog) const {
  const Dims& d = cfg_.dims;
  const int64_t td = md.num_decode_tokens, H = d.num_heads, L = d.kv_lora_rank, P = d.qk_nope_head_dim,
                R = d.qk_rope_head_dim;
  const at::Tensor x = hidden.narrow(0, 0, td);
  if (use_prolog) {
    // Spec 5.4: the fused decode preprocess; q and k_pe come out in the same
    // half-split RoPE order as the native path (weights via trans_rope_weight).
    ops::MlaPrologArgs a;
    a.token_x = x;
    a.weight_dq = prolog_->weight_dq;
    a.weight_uq_qr = prolog_->weight_uq_qr;
    a.weight_uk = prolog_->weight_uk;
    a.weight_dkv_kr = prolog_->weight_dkv_kr;
    a.rmsnorm_gamma_cq = prolog_->gamma_cq;
    a.rmsnorm_gamma_ckv = prolog_->gamma_ckv;
    a.rope_cos = md.decode.cos;
    a.rope_sin = md.decode.sin;
    a.cache_index = md.slot_mapping.narrow(0, 0, td);
    a.rmsnorm_epsilon_cq = cfg_.q_norm_eps;
    a.rmsnorm_epsilon_ckv = cfg_.kv_norm_eps;
    a.cache_mode = cfg_.enable_kv_nz ? "PA_NZ" : "PA_BSND";
    at::Tensor nope_w = nope, rope_w = rope;
    auto r = ops::mla_prolog_v3(a, nope_w, rope_w);
    return {std::get<0>(r), std::get<1>(r)};
  }
  // Spec 5.2: native preprocess.
  at::Tensor q_c = x;
  if (d.q_lora_rank.has_value()) {
    q_c = ops::dense::rms_norm(ops::dense::linear(q_c, *w_.q_a_proj), *w_.q_a_layernorm, cfg_.q_norm_eps);
  }
  const at::Tensor kv_raw = ops::dense::linear(x, w_.kv_a_proj_with_mqa);
  const at::Tensor q = ops::dense::linear(q_c, w_.q_proj).view({td, H, P + R});
  const at::Tensor ql_nope = ops::dense::bmm(q.narrow(-1, 0, P).transpose(0, 1), w_uk_t_).transpose(0, 1);  // (td, H, L)
  const at::Tensor cos = md.decode.cos.view({td, 1, 1, R}), sin = md.decode.sin.view({td, 1, 1, R});
  const at::Tensor q_pe = ops::interleave_rope(q.narrow(-1, P, R).reshape({td, H, 1, R}), cos, sin).view({td, H, R});
  ops::kv_rmsnorm_rope_cache(kv_raw.view({td, 1, 1, L + R}), w_.kv_a_layernorm, cos, sin,
                             md.slot_mapping.narrow(0, 0, td), rope, nope, cfg_.kv_norm_eps,
                             cfg_.enable_kv_nz ? "PA_NZ" : "PA", false);
  return {ql_nope, q_pe};
}

void Impl::capture_decode(graph::GraphParams& g, const at::Tensor& hidden, const at::Tensor& nope,
                          const at::Tensor& rope, const Metadata& md, const at::Tensor& output, bool use_prolog) {
  // Spec 7 for MLA decode: the projections, RoPE and cache write (prepare), the
  // absorbed latent attention (a fused call refreshed per step: block table, KV
  // lengths, and the query ends in the speculative TND layout), then W_UV and
  // o_proj (prepare). The device graph captures the prepare work as plain
  // kernels; the CPU recording provider replays the closures in order. The
  // intermediates live in buffers allocated here, at stable addresses.
  const int64_t n = g.capturing_bucket();
  const int64_t td = md.num_decode_tokens;
  if (md.num_prefills != 0 || td != n || md.num_input_tokens != n || hidden.sizes()[0] != n) {
    throw_not_supported("MLA graph capture of bucket ", n, " takes decode-only batches of exactly ", n,
                        " tokens (got ", md.num_decodes, " decodes with ", td, " tokens, ", md.num_prefills,
                        " prefills, num_input_tokens=", md.num_input_tokens, ")");
  }
  const Dims& d = cfg_.dims;
  const int64_t L = d.kv_lora_rank, R = d.qk_rope_head_dim;
  at::Tensor qn = at::zeros({td, hp_, L}, hidden.options());
  at::Tensor qr = at::zeros({td, hp_, R}, hidden.options());
  graph::CapturedCall pre;
  pre.kind = graph::CallKind::Prepare;
  pre.layer_index = cfg_.layer_index;
  // The closure keeps the capture-time metadata: its tensors are views of the
  // builder's persistent buffers, which every later build refills in place.
  pre.prepare = [this, hidden, nope, rope, md_at_capture = md, qn, qr, use_prolog, H = d.num_heads]() mutable {
    auto [ql_nope, q_pe] = decode_preprocess(hidden, nope, rope, md_at_capture, use_prolog);
    ops::dense::copy(qn.narrow(1, 0, H), ql_nope);
    ops::dense::copy(qr.narrow(1, 0, H), q_pe);
  };
  g.capture_call(std::move(pre));

  graph::CapturedCall c;
  c.kind = graph::CallKind::FiaV2;
  c.layer_index = cfg_.layer_index;
  c.paged = true;
  decode_fia_args(qn, qr, nope, rope, md, c.fia2, c.fia2_params);
  c.refresh_q_lens = md.speculative;  // BNSD/BSND layouts take no query-length list
  // Head-major output of the latent attention: (Hp, td, L) for _NTD, (Hp, td, 1, L) for _NBSD.
  std::vector<int64_t> out_shape(c.fia2.query.sizes().begin(), c.fia2.query.sizes().end());
  if (md.speculative) {
    std::swap(out_shape[0], out_shape[1]);
  } else if (cfg_.enable_kv_nz) {
    out_shape = {out_shape[2], out_shape[0], out_shape[1], out_shape[3]};
  } else {
    std::swap(out_shape[0], out_shape[1]);
  }
  c.out = at::zeros(out_shape, hidden.options());
  c.lse = at::zeros({1}, hidden.options().dtype(at::kFloat));
  at::Tensor attn = c.out;
  g.capture_call(std::move(c));

  graph::CapturedCall post;
  post.kind = graph::CallKind::Prepare;
  post.layer_index = cfg_.layer_index;
  post.prepare = [this, attn, out = at::Tensor(output), td]() mutable {
    ops::dense::linear_out(out, decode_post(attn, td), w_.o_proj);
  };
  g.capture_call(std::move(post));
}

const at::Tensor& Impl::forward(const at::Tensor& hidden, const at::Tensor& nope, const at::Tensor& rope,
                                const Metadata* md_ptr, const at::Tensor& output) {
  last_decode_ = DecodePath::None;
  if (md_ptr == nullptr) {
    AAR_CHECK_ARG(output.defined(), "output must be given");
    output.zero_();
    return output;
  }
  const Metadata& md = *md_ptr;
  validate(hidden, nope, rope, md, output);
  const Dims& d = cfg_.dims;
  const int64_t H = d.num_heads, L = d.kv_lora_rank, P = d.qk_nope_head_dim, R = d.qk_rope_head_dim,
                V = d.v_head_dim;
  const int64_t T = md.num_actual_tokens, td = md.num_decode_tokens, tp = md.num_prefill_tokens;
  c10::InferenceMode guard;
  const bool use_prolog = prolog_.has_value() && md.num_prefills == 0 && td > 0 && td <= kMaxPrologTokens;
  if (graph::GraphParams* g = graph::GraphParams::current()) {
    capture_decode(*g, hidden, nope, rope, md, output, use_prolog);
    last_decode_ = use_prolog ? DecodePath::Prolog : DecodePath::Native;
    return output;
  }
  at::Tensor o_in = ops::dense::zeros({hidden.size(0), H * V}, hidden.options());
  if (td > 0) {
    auto [ql_nope, q_pe] = decode_preprocess(hidden, nope, rope, md, use_prolog);
    ops::dense::copy(o_in.narrow(0, 0, td), decode_attention(ql_nope, q_pe, nope, rope, md));
    last_decode_ = use_prolog ? DecodePath::Prolog : DecodePath::Native;
  }
  if (tp > 0) {
    AAR_CHECK_ARG(!cfg_.enable_kv_nz, "prefill with enable_kv_nz: NZ caches are for decode-only (PD decode) nodes");
    const at::Tensor x = hidden.narrow(0, td, tp);
    at::Tensor q_c = x;
    if (d.q_lora_rank.has_value()) {
      q_c = ops::dense::rms_norm(ops::dense::linear(q_c, *w_.q_a_proj), *w_.q_a_layernorm, cfg_.q_norm_eps);
    }
    const at::Tensor kv_raw = ops::dense::linear(x, w_.kv_a_proj_with_mqa);
    const at::Tensor q = ops::dense::linear(q_c, w_.q_proj).view({tp, H, P + R});
    const at::Tensor cos = md.prefill.cos.view({tp, 1, 1, R}), sin = md.prefill.sin.view({tp, 1, 1, R});
    const at::Tensor q_pe =
        ops::interleave_rope(q.narrow(-1, P, R).reshape({tp, H, 1, R}), cos, sin).view({tp, H, R});
    auto kvr = ops::kv_rmsnorm_rope_cache(kv_raw.view({tp, 1, 1, L + R}), w_.kv_a_layernorm, cos, sin,
                                          md.slot_mapping.narrow(0, td, tp), rope, nope, cfg_.kv_norm_eps, "PA",
                                          /*is_output_kv=*/true);
    const at::Tensor k_pe = std::get<2>(kvr).view({tp, 1, R}).expand({tp, H, R});
    const at::Tensor kv = ops::dense::linear(std::get<3>(kvr).view({tp, L}), w_.kv_b_proj).view({tp, H, P + V});
    const at::Tensor out = prefill_attention(q.narrow(-1, 0, P).contiguous(), q_pe, kv.narrow(-1, 0, P).contiguous(),
                                             k_pe, kv.narrow(-1, P, V).contiguous(), nope, rope, md);
    ops::dense::copy(o_in.narrow(0, td, tp), out);
  }
  (void)T;
  ops::dense::linear_out(output, o_in, w_.o_proj);
  return output;
}

}  // namespace aar::mla
