#include "ascend_attn_rt/c8/impl.h"

#include "ascend_attn_rt/graph/graph_params.h"
#include "ascend_attn_rt/graph_calls/fused_attention_calls.h"
#include "ascend_attn_rt/gqa/validate.h"

#include <ATen/ATen.h>
#include <cmath>
#include <vector>

#include "../common/kv_cache.h"
#include "ascend_attn_rt/c8/quant.h"
#include "ascend_attn_rt/errors.h"
#include "ascend_attn_rt/ops/fusion_attention.h"
#include "ascend_attn_rt/ops/kv_cache_write.h"
#include "../common/impl_checks.h"
#include "../common/inference_scope.h"

namespace aar::c8 {

using plan::AttentionState;

const char* to_string(ForwardPath p) {
  switch (p) {
    case ForwardPath::None: return "none";
    case ForwardPath::C8Decode: return "c8_decode";
    case ForwardPath::C8ChunkedSplit: return "c8_chunked_split";
    case ForwardPath::FusedDense: return "fused_dense";
    case ForwardPath::C8Dequant: return "c8_dequant";
    case ForwardPath::Encoder: return "encoder";
    case ForwardPath::Float: return "float";
  }
  return "unknown";
}

namespace {

bool all_defined(const RawScales& r) {
  return r.k_scale.defined() && r.k_offset.defined() && r.v_scale.defined() && r.v_offset.defined();
}
bool none_defined(const RawScales& r) {
  return !r.k_scale.defined() && !r.k_offset.defined() && !r.v_scale.defined() && !r.v_offset.defined();
}

}  // namespace

AttentionImpl::AttentionImpl(const ImplConfig& cfg) : cfg_(cfg) {
  internal::resolve_head_layout(cfg_);
  if (cfg_.sliding_window.has_value()) {
    throw_not_supported("sliding_window=", *cfg_.sliding_window,
                        " is not supported by the C8 backend (its INT8 decode kernel call takes no window)");
  }
  if (cfg_.has_sinks) throw_not_supported("sinks are not supported by the C8 backend (FIA v1 has no learnable sink)");
  if (cfg_.has_alibi_slopes) throw_not_supported("ALiBi (alibi_slopes) is not supported by the C8 backend");
  internal::check_logits_soft_cap(cfg_.logits_soft_cap, "the C8 backend");
  if (cfg_.attn_type == gqa::AttnType::EncoderDecoder) {
    throw_not_supported("attn_type 'encoder_decoder' (cross-attention) is not supported by the C8 backend yet");
  }
  if (cfg_.kv_transfer == KvTransferRole::Producer) {
    // A KV producer keeps a float cache (docs/design/gqa.md §5.1): the layer is a GQA layer.
    gqa::ImplConfig g;
    g.num_heads = cfg_.num_heads;
    g.head_size = cfg_.head_size;
    g.scale = cfg_.scale;
    g.num_kv_heads = cfg_.num_kv_heads;
    g.attn_type = cfg_.attn_type;
    g.kv_sharing = cfg_.kv_sharing;
    g.device_kind = cfg_.device_kind;
    float_impl_.emplace(g);
    // The producer's cache is float: it never quantises. Scales a checkpoint
    // carries are validated (a bad one fails here as on the consumer) but not
    // kept; scales() stays empty.
    if (!none_defined(cfg_.scales)) {
      AAR_CHECK_ARG(all_defined(cfg_.scales), "the C8 backend needs k_scale, k_offset, v_scale and v_offset");
      (void)prepare_scales(cfg_.scales, cfg_.num_kv_heads, cfg_.head_size, cfg_.tp_rank, cfg_.tp_size);
    }
    return;
  }
  AAR_CHECK_ARG(cfg_.head_size % kNzWidth == 0, "head_size=", cfg_.head_size,
                " must be a multiple of 32 for the C8 NZ cache");
  AAR_CHECK_ARG(all_defined(cfg_.scales), "the C8 backend needs k_scale, k_offset, v_scale and v_offset");
  scales_ = prepare_scales(cfg_.scales, cfg_.num_kv_heads, cfg_.head_size, cfg_.tp_rank, cfg_.tp_size);
}

void AttentionImpl::validate(const at::Tensor& query, const std::optional<at::Tensor>& key,
                             const std::optional<at::Tensor>& value, const at::Tensor& key_cache,
                             const at::Tensor& value_cache, const gqa::Metadata& md, const at::Tensor& output) const {
  const int64_t Nkv = cfg_.num_kv_heads, D = cfg_.head_size;
  // Float query/key/value (the C8 impl quantises K/V itself); caches are int8 NZ.
  gqa::validate_layer_inputs({cfg_.num_heads, Nkv, D}, query, key, value, md, output, md.num_actual_tokens,
                             "schedules num_actual_tokens rows");
  AAR_CHECK_ARG(key_cache.defined() == value_cache.defined(), "key_cache and value_cache must be given together");
  if (key_cache.defined()) {
    for (const at::Tensor* c : {&key_cache, &value_cache}) {
      const char* name = c == &key_cache ? "key_cache" : "value_cache";
      const NzCacheGeometry nz = check_nz_cache(*c, Nkv, D, name);
      AAR_CHECK_ARG(nz.block_size == md.block_size, name, " has block_size ", nz.block_size,
                    " but the metadata was built for block_size=", md.block_size);
      AAR_CHECK_ARG(nz.num_blocks >= md.num_blocks, name, " has ", nz.num_blocks,
                    " blocks but the metadata was built for num_blocks=", md.num_blocks);
      AAR_CHECK_ARG(c->device() == query.device(), name, " is on ", c->device(), " but query is on ",
                    query.device());
    }
    ::aar::detail::check_caches_disjoint(key_cache, value_cache, "key_cache", "value_cache");
    const internal::OutputApart apart(output);
    apart.check(key_cache, "key_cache");
    apart.check(value_cache, "value_cache");
  }
}

ForwardPath AttentionImpl::choose_path(const gqa::Metadata& md, bool has_key, bool has_cache) const {
  // Bidirectional over the step's own tokens (float K/V): pooling encoders and
  // encoder layers without a cache.
  if (!md.causal && (md.is_pooling || !has_cache)) return ForwardPath::Encoder;
  const bool single_token_decodes = md.num_decodes > 0 && md.num_decode_tokens == md.num_decodes;
  if (md.attn_state == AttentionState::DecodeOnly && md.num_prefills == 0 && single_token_decodes) {
    return ForwardPath::C8Decode;
  }
  // Multi-token (speculative) decodes cannot take the S=1 BNSD call: they go
  // with the prefills over dequantised context (upstream reshapes them wrongly).
  if (md.attn_state == AttentionState::ChunkedPrefill && single_token_decodes) return ForwardPath::C8ChunkedSplit;
  if (md.attn_state == AttentionState::PrefillNoCache && has_key) return ForwardPath::FusedDense;
  return ForwardPath::C8Dequant;
}

void AttentionImpl::bind_caches(const at::Tensor& key_cache, const at::Tensor& value_cache) {
  // The bindings hold the caller's tensors, so a freed cache's address cannot
  // come back as another tensor that would match; set_/resize_ rebind.
  if (bound_key_.same(key_cache) && bound_value_.same(value_cache)) return;
  key_nz_ = nz_view(key_cache, cfg_.num_kv_heads, cfg_.head_size, "key_cache");
  value_nz_ = nz_view(value_cache, cfg_.num_kv_heads, cfg_.head_size, "value_cache");
  bound_key_.bind(key_cache);
  bound_value_.bind(value_cache);
}

void AttentionImpl::write_kv(const at::Tensor& key, const at::Tensor& value, const gqa::Metadata& md) {
  const int64_t n = md.num_actual_tokens;
  if (n == 0) return;
  const at::Tensor slots = md.slot_mapping.narrow(0, 0, n);
  const at::Tensor kq = quantize(key.narrow(0, 0, n), scales_.k_inv_scale, scales_.k_offset);
  const at::Tensor vq = quantize(value.narrow(0, 0, n), scales_.v_inv_scale, scales_.v_offset);
  ops::scatter_pa_kv_cache(kq, vq, key_nz_, value_nz_, slots, "PA_NZ");
}

DecodeCall AttentionImpl::decode_call(const at::Tensor& query, const gqa::Metadata& md, int64_t num_decodes,
                                      const at::Tensor& output) {
  check_current(md.stamp, "metadata");
  AAR_CHECK_ARG(key_nz_.defined(), "decode_call: no KV cache bound yet (forward binds it)");
  AAR_CHECK_ARG(num_decodes >= 0 && num_decodes <= md.num_kernel_reqs, "num_decodes=", num_decodes,
                " must be in [0, num_kernel_reqs=", md.num_kernel_reqs, "]");
  const int64_t B = num_decodes;
  for (const at::Tensor* t : {&query, &output}) {
    const char* name = t == &query ? "query" : "output";
    AAR_CHECK_ARG(t->defined() && t->dim() == 3 && t->size(0) >= B && t->size(1) == cfg_.num_heads &&
                      t->size(2) == cfg_.head_size,
                  "decode_call: ", name, " must have shape (T >= num_decodes=", B, ", ", cfg_.num_heads, ", ",
                  cfg_.head_size, "), got ", t->defined() ? t->sizes() : c10::IntArrayRef{});
    AAR_CHECK_ARG(at::isFloatingType(t->scalar_type()) && t->scalar_type() != at::kDouble, "decode_call: ", name,
                  " dtype must be float32, float16 or bfloat16, got ", t->scalar_type());
    AAR_CHECK_ARG(t->device() == key_nz_.device(), "decode_call: ", name, " is on ", t->device(),
                  " but the bound cache is on ", key_nz_.device());
  }
  AAR_CHECK_ARG(output.scalar_type() == query.scalar_type(), "decode_call: output dtype ", output.scalar_type(),
                " differs from query dtype ", query.scalar_type());
  DecodeCall c;
  c.tensors.query = query.narrow(0, 0, B).unsqueeze(2);  // (B, N, 1, D)
  c.tensors.key = key_nz_;
  c.tensors.value = value_nz_;
  c.tensors.block_table = md.block_tables.narrow(0, 0, B);
  c.tensors.key_antiquant_scale = scales_.k_antiquant_scale;
  c.tensors.value_antiquant_scale = scales_.v_antiquant_scale;
  if (scales_.has_offset) {
    c.tensors.key_antiquant_offset = scales_.k_antiquant_offset;
    c.tensors.value_antiquant_offset = scales_.v_antiquant_offset;
  }
  ops::FiaParams& p = c.params;
  p.has_actual_seq_lengths = false;  // S = 1 per request
  p.actual_seq_lengths_kv = md.seq_lens_list.slice(0, B);
  p.num_heads = cfg_.num_heads;
  p.num_key_value_heads = cfg_.num_kv_heads;
  p.scale = cfg_.scale;
  p.input_layout = "BNSD";
  p.sparse_mode = 0;  // one query row sees its whole context
  p.inner_precise = 1;
  p.block_size = key_nz_.size(3);
  p.antiquant_mode = 0;
  p.key_antiquant_mode = 0;
  p.value_antiquant_mode = 0;
  c.output = output.narrow(0, 0, B).unsqueeze(2);
  return c;
}

void AttentionImpl::run_decode(const at::Tensor& query, const gqa::Metadata& md, int64_t num_decodes,
                               const at::Tensor& output) {
  if (num_decodes == 0) return;
  DecodeCall c = decode_call(query, md, num_decodes, output);
  ops::fused_infer_attention_score_out(c.tensors, c.params, std::nullopt, c.output, lse_placeholder_);
}

void AttentionImpl::run_prefill(const at::Tensor& query, const std::optional<at::Tensor>& key,
                                const std::optional<at::Tensor>& value, const gqa::Metadata& md, bool prefill_part,
                                const at::Tensor& output) {
  // The requests [r0, num_real_reqs) and their tokens [t0, t1): every request,
  // or the prefill part after the decodes. Every list and index comes from the
  // build (the part's rebased query ends, the dense context): no host work.
  const int64_t r0 = prefill_part ? md.num_decodes : 0, np = md.num_reqs - r0;
  const int64_t t0 = prefill_part ? md.num_decode_tokens : 0, t1 = md.num_actual_tokens;
  if (np <= 0 || t1 == t0) return;
  const c10::IntArrayRef q_ends =
      (prefill_part ? md.prefill_actual_seq_lengths_q : md.actual_seq_lengths_q).slice(0, np);
  at::Tensor k, v;
  c10::IntArrayRef kv_lens;
  if (key.has_value() && (prefill_part ? md.prefill_no_context : md.no_context)) {
    k = key->narrow(0, t0, t1 - t0);
    v = value->narrow(0, t0, t1 - t0);
    kv_lens = q_ends;
  } else {
    AAR_CHECK_ARG(key_nz_.defined(), "attention state ", plan::to_string(md.attn_state),
                  " reads cached context from the paged KV cache, but key_cache/value_cache are not given");
    const gqa::DenseContext& dc = gqa::dense_context(md);
    kv_lens = (prefill_part ? dc.prefill_kv_ends : dc.kv_ends).slice(0, np);
    const at::Tensor slots = dc.slots.narrow(0, prefill_part ? dc.prefill_kv_start : 0, kv_lens.back());
    const auto dtype = query.scalar_type();
    const auto index = nz_slot_index(slots, key_nz_.size(3));
    k = dequant_slots(key_nz_, index, scales_.k_scale, scales_.k_offset, dtype);
    v = dequant_slots(value_nz_, index, scales_.v_scale, scales_.v_offset, dtype);
    if (key.has_value()) {
      // The new tokens at full precision (upstream re-reads them through INT8).
      const at::Tensor rows = prefill_part ? dc.prefill_token_rows : dc.token_rows;
      k.index_copy_(0, rows, key->narrow(0, t0, t1 - t0));
      v.index_copy_(0, rows, value->narrow(0, t0, t1 - t0));
    }
  }
  ops::FiaTensors t;
  ops::FiaParams p;
  t.query = query.narrow(0, t0, t1 - t0);
  t.key = k;
  t.value = v;
  p.actual_seq_lengths = q_ends;
  p.actual_seq_lengths_kv = kv_lens;  // cumulative: dense KV, no block table
  p.num_heads = cfg_.num_heads;
  p.num_key_value_heads = cfg_.num_kv_heads;
  p.scale = cfg_.scale;
  p.input_layout = "TND";
  if (md.causal) {
    t.atten_mask = md.attn_mask;
    p.sparse_mode = 3;
  } else {
    p.sparse_mode = 0;
  }
  at::Tensor out = output.narrow(0, t0, t1 - t0);
  ops::fused_infer_attention_score_out(t, p, std::nullopt, out, lse_placeholder_);
}

void AttentionImpl::capture(graph::GraphParams& g, ForwardPath path, const gqa::Metadata& md,
                            const at::Tensor& query, const std::optional<at::Tensor>& key,
                            const std::optional<at::Tensor>& value, const at::Tensor& output) {
  if (path != ForwardPath::C8Decode) {
    throw_not_supported("graph capture of the C8 '", to_string(path), "' path (state ",
                        plan::to_string(md.attn_state), ") is not supported: only DecodeOnly batches are captured");
  }
  const int64_t n = g.capturing_bucket();
  AAR_CHECK_ARG(md.num_input_tokens == n && query.sizes()[0] == n && md.num_kernel_reqs == n &&
                    md.num_kernel_tokens == n,
                "C8 graph capture of bucket ", n, " needs ", n, " one-token requests (num_kernel_reqs=", md.num_kernel_reqs,
                ", num_input_tokens=", md.num_input_tokens,
                "); pad decode batches with uniform_decode_padding");
  if (key.has_value() && key_nz_.defined() && !cfg_.kv_sharing) {
    AAR_CHECK_ARG(key->is_contiguous() && value->is_contiguous(), "graph capture needs contiguous key and value");
    // Quantise every bucket row; padding rows map to slot -1 and are skipped.
    g.capture_call(std::make_unique<graph::ClosureCall>(
        cfg_.layer_index, cfg_.kv_cache_group,
        [k = *key, v = *value, kc = key_nz_, vc = value_nz_, slots = md.slot_mapping, sc = scales_]() mutable {
          const at::Tensor kq = quantize(k, sc.k_inv_scale, sc.k_offset);
          const at::Tensor vq = quantize(v, sc.v_inv_scale, sc.v_offset);
          ops::scatter_pa_kv_cache(kq, vq, kc, vc, slots, "PA_NZ");
        }));
    // The replays write through the builder's slot mapping (docs/design/graph.md §1.2).
    g.note_metadata(cfg_.kv_cache_group, md.stamp);
  }
  DecodeCall dc = decode_call(query, md, md.num_kernel_reqs, output);
  // BNSD: one row per request, no query-length list.
  graph_calls::capture_fia(g, {cfg_.layer_index, cfg_.kv_cache_group}, {/*paged=*/true, /*q_lens=*/false},
                           std::move(dc.tensors), dc.params, dc.output, lse_placeholder_);
}

const at::Tensor& AttentionImpl::forward(const at::Tensor& query, const std::optional<at::Tensor>& key,
                                         const std::optional<at::Tensor>& value, const at::Tensor& key_cache,
                                         const at::Tensor& value_cache, const gqa::Metadata* metadata,
                                         const at::Tensor& output) {
  if (metadata == nullptr) {
    graph::refuse_if_capturing("a forward without metadata (profiling run)");
    last_path_ = ForwardPath::None;
    return internal::zero_profiling_output(output, query, "query");
  }
  const KvHookScope<gqa::Metadata> kv_scope(kv_hooks, key_cache, value_cache,
                                            key.has_value() && key_cache.defined() && !cfg_.kv_sharing, *metadata,
                                            "c8");
  if (float_impl_.has_value()) {
    float_impl_->forward(query, key, value, key_cache, value_cache, metadata, output);
    last_path_ = ForwardPath::Float;
    return output;
  }
  const gqa::Metadata& md = *metadata;
  check_current(md.stamp, "metadata");
  validate(query, key, value, key_cache, value_cache, md, output);
  gqa::check_attn_type(cfg_.attn_type, md, key_cache.defined());
  const ForwardPath path = choose_path(md, key.has_value(), key_cache.defined());
  if (path == ForwardPath::Encoder) gqa::check_own_tokens(md, "the C8 encoder path (bidirectional, no cache read)");
  if (path == ForwardPath::Encoder || path == ForwardPath::FusedDense) {
    AAR_CHECK_ARG(key.has_value(), "attention over the new tokens (", to_string(path), ") needs key and value");
  }
  if (path == ForwardPath::C8Decode || path == ForwardPath::C8ChunkedSplit) {
    AAR_CHECK_ARG(key_cache.defined(), "attention state ", plan::to_string(md.attn_state),
                  " reads the paged KV cache, but key_cache/value_cache are not given");
  }
  // A prefill over cached context reads the build's dense context: checked
  // here, before the cache write.
  const bool prefill_reads_cache =
      (path == ForwardPath::C8ChunkedSplit && !(key.has_value() && md.prefill_no_context)) ||
      ((path == ForwardPath::C8Dequant || path == ForwardPath::FusedDense) && !(key.has_value() && md.no_context));
  if (prefill_reads_cache) {
    AAR_CHECK_ARG(key_cache.defined(), "attention state ", plan::to_string(md.attn_state),
                  " reads cached context from the paged KV cache, but key_cache/value_cache are not given");
    // Computed now (once per build) if the build did not: before any write.
    (void)gqa::dense_context(md);
  }
  const aar::detail::InferenceScope inference;
  if (scales_.k_scale.device() != query.device()) scales_ = scales_.to(query.device());
  if (key_cache.defined()) bind_caches(key_cache, value_cache);
  if (!lse_placeholder_.defined() || lse_placeholder_.device() != query.device()) {
    lse_placeholder_ = at::zeros({1}, query.options().dtype(at::kFloat));
  }
  if (graph::GraphParams* g = graph::GraphParams::current()) {
    capture(*g, path, md, query, key, value, output);
    last_path_ = path;
    return output;
  }
  if (key.has_value() && key_cache.defined() && !cfg_.kv_sharing) write_kv(*key, *value, md);
  last_path_ = path;
  // Only the scheduled requests are attended (the FIA dummy request of a
  // padded batch is not): rows [0, num_actual_tokens).
  const int64_t B = md.num_reqs, n = md.num_actual_tokens;
  if (n == 0) return output;

  switch (path) {
    case ForwardPath::C8Decode:
      run_decode(query, md, B, output);
      return output;
    case ForwardPath::C8ChunkedSplit: {
      run_decode(query, md, md.num_decodes, output);
      run_prefill(query, key, value, md, /*prefill_part=*/true, output);
      return output;
    }
    case ForwardPath::FusedDense:
    case ForwardPath::C8Dequant:
      run_prefill(query, key, value, md, /*prefill_part=*/false, output);
      return output;
    case ForwardPath::Encoder: {
      // Bidirectional over the float new K/V (upstream feeds the int8 K/V to
      // npu_fusion_attention, docs/design/gqa.md §5.4).
      ops::FusionAttentionArgs a;
      a.query = query.narrow(0, 0, n);
      a.key = key->narrow(0, 0, n);
      a.value = value->narrow(0, 0, n);
      a.head_num = cfg_.num_heads;
      a.input_layout = "TND";
      a.scale = cfg_.scale;
      a.actual_seq_qlen = md.actual_seq_lengths_q.slice(0, B);
      a.actual_seq_kvlen = md.actual_seq_lengths_q.slice(0, B);
      a.sparse_mode = 0;
      output.narrow(0, 0, n).copy_(ops::fusion_attention(a));
      return output;
    }
    default:
      break;
  }
  throw std::logic_error("unhandled C8 forward path");
}

}  // namespace aar::c8
