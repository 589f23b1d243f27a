#include "ascend_attn_rt/gqa/impl.h"

#include <ATen/ATen.h>

#include <cmath>
#include <limits>

#include "ascend_attn_rt/errors.h"
#include "ascend_attn_rt/graph/graph_params.h"
#include "ascend_attn_rt/gqa/kv_write.h"
#include "ascend_attn_rt/gqa/validate.h"
#include "ascend_attn_rt/ops/fused_infer_attention.h"
#include "ascend_attn_rt/ops/fusion_attention.h"
#include "ascend_attn_rt/ops/kv_cache_write.h"
#include "ascend_attn_rt/ops/paged_attention.h"
#include "../common/impl_checks.h"
#include "../common/inference_scope.h"
#include "graph_calls.h"

namespace aar::gqa {

using plan::AttentionState;

const char* to_string(AttnType t) {
  switch (t) {
    case AttnType::Decoder: return "decoder";
    case AttnType::EncoderOnly: return "encoder_only";
    case AttnType::Encoder: return "encoder";
    case AttnType::EncoderDecoder: return "encoder_decoder";
  }
  return "unknown";
}

void check_attn_type(AttnType t, const Metadata& md, bool has_cache) {
  // The layer's type decides its causality; the metadata must agree (vLLM
  // builds encoder groups' metadata with causal=False).
  const bool bidirectional = t != AttnType::Decoder;
  AAR_CHECK_ARG(md.causal != bidirectional, "attn_type='", to_string(t), "' layers attend ",
                bidirectional ? "bidirectionally" : "causally", " but the metadata was built with causal=",
                md.causal ? "True" : "False", " (build it with causal=", bidirectional ? "False" : "True", ")");
  AAR_CHECK_ARG(t != AttnType::Encoder || !has_cache,
                "attn_type='encoder' layers keep no KV cache: pass key_cache=None and value_cache=None");
}

void check_own_tokens(const Metadata& md, const char* what) {
  AAR_CHECK_ARG(md.no_context, what,
                " attends each request's own new tokens only, but the metadata has requests with cached "
                "context (seq_len > query_len); give the layer its KV cache");
}

const char* to_string(ForwardPath p) {
  switch (p) {
    case ForwardPath::None: return "none";
    case ForwardPath::FusedPaged: return "fused_paged";
    case ForwardPath::FusedDense: return "fused_dense";
    case ForwardPath::FusedSinks: return "fused_sinks";
    case ForwardPath::PagedAttention: return "paged_attention";
    case ForwardPath::Encoder: return "encoder";
    case ForwardPath::FusedSplit: return "fused_split";
    case ForwardPath::LargeHead: return "large_head";
  }
  return "unknown";
}

AttentionImpl::AttentionImpl(const ImplConfig& cfg) : cfg_(cfg) {
  internal::resolve_head_layout(cfg_);
  if (cfg_.has_alibi_slopes) {
    throw_not_supported("ALiBi (alibi_slopes) is not supported by the GQA backend: the fused kernels take no slopes");
  }
  internal::check_logits_soft_cap(cfg_.logits_soft_cap, "the GQA backend");
  if (cfg_.kv_cache_dtype != "auto") {
    throw_not_supported("kv_cache_dtype='", cfg_.kv_cache_dtype,
                        "' is not supported by the GQA backend (only 'auto'; INT8 KV is the C8 backend)");
  }
  if (cfg_.attn_type == AttnType::EncoderDecoder) {
    throw_not_supported("attn_type 'encoder_decoder' (cross-attention) is not supported by the GQA backend yet");
  }
  if (cfg_.sliding_window.has_value()) {
    AAR_CHECK_ARG(*cfg_.sliding_window > 0, "sliding_window must be positive, got ", *cfg_.sliding_window);
  }
  if (cfg_.sinks.has_value()) {
    const at::Tensor& s = *cfg_.sinks;
    AAR_CHECK_ARG(s.defined() && s.dim() == 1 && s.sizes()[0] == cfg_.num_heads, "sinks must have shape (",
                  cfg_.num_heads, ",), got ", s.defined() ? s.sizes() : c10::IntArrayRef{});
    AAR_CHECK_ARG(at::isFloatingType(s.scalar_type()), "sinks must be a floating tensor, got ", s.scalar_type());
    sinks_fp32_ = s.to(at::kFloat).contiguous();
    // A sink is a logit: -inf (no sink) is one, NaN or +inf would turn every output row into NaN.
    // Read once, at construction (a meta tensor has no values to read).
    if (!sinks_fp32_->is_meta()) {
      const at::Tensor host = sinks_fp32_->to(at::kCPU);
      const float* p = host.data_ptr<float>();
      for (int64_t h = 0; h < host.numel(); ++h) {
        AAR_CHECK_ARG(!std::isnan(p[h]) && p[h] != std::numeric_limits<float>::infinity(), "sinks[", h, "]=", p[h],
                      " must be a logit: finite, or -inf for none");
      }
    }
  }
}

void AttentionImpl::validate(const at::Tensor& query, const std::optional<at::Tensor>& key,
                             const std::optional<at::Tensor>& value, const at::Tensor& key_cache,
                             const at::Tensor& value_cache, const Metadata& md, const at::Tensor& output) const {
  const LayerShape shape{cfg_.num_heads, cfg_.num_kv_heads, cfg_.head_size};
  validate_layer_inputs(shape, query, key, value, md, output, md.num_kernel_tokens, "attends num_kernel_tokens rows");
  validate_nd_caches(shape, key_cache, value_cache, md, query.scalar_type(), query.device(), output);
  AAR_CHECK_ARG(!sinks_fp32_.has_value() || sinks_fp32_->device() == query.device(), "sinks are on ",
                sinks_fp32_.has_value() ? sinks_fp32_->device() : query.device(), " but query is on ", query.device());
}

ForwardPath AttentionImpl::choose_path(const Metadata& md, int64_t num_tokens, bool has_cache) const {
  // Bidirectional attention over the step's own tokens: a pooling model's
  // encoder layers (docs/design/gqa.md §4.3), and encoder layers without a cache.
  if (!md.causal && (md.is_pooling || !has_cache)) return ForwardPath::Encoder;
  // Paged attention has no sink input: sinks always go through FIA v2.
  if (md.attn_state == AttentionState::DecodeOnly && !cfg_.sliding_window.has_value() && !cfg_.sinks.has_value()) {
    plan::PagedAttentionRule rule;
    rule.has_speculative_config = cfg_.has_speculative_config;
    rule.device = cfg_.device_kind;
    rule.full_decode_only_graph = cfg_.full_decode_only_graph;
    rule.pa_shape_list = plan::CSpan<int32_t>(cfg_.pa_shape_list.data(), cfg_.pa_shape_list.size());
    if (plan::using_paged_attention(num_tokens, rule, cfg_.head_size)) return ForwardPath::PagedAttention;
  }
  if (cfg_.sinks.has_value()) return ForwardPath::FusedSinks;
  // A2/A3 FIA in TND layout does not take head size 512 (docs/design/gqa.md §4.5).
  if (cfg_.head_size == 512 && cfg_.device_kind != plan::DeviceKind::A5) return ForwardPath::LargeHead;
  if (md.attn_state == AttentionState::PrefillNoCache) return ForwardPath::FusedDense;
  if (cfg_.device_kind == plan::DeviceKind::A5 && md.attn_state == AttentionState::ChunkedPrefill &&
      md.causal && !cfg_.sliding_window.has_value() && md.num_decodes > 0 && md.num_prefills > 0) {
    return ForwardPath::FusedSplit;
  }
  return ForwardPath::FusedPaged;
}

void AttentionImpl::write_kv(const at::Tensor& key, const at::Tensor& value, const Metadata& md) {
  const int64_t n = key.sizes()[0];
  // Rows past num_actual_tokens map to slot -1 and are skipped by the kernel, so
  // the padded slot mapping serves a padded key as is (no slicing per layer).
  at::Tensor slots = n == md.num_input_tokens ? md.slot_mapping : md.slot_mapping.narrow(0, 0, n);
  write_paged_kv(cfg_.device_kind, key, value, caches_.key, caches_.value, slots);
}

void write_paged_kv(plan::DeviceKind device, const at::Tensor& key, const at::Tensor& value, at::Tensor& key_cache,
                    at::Tensor& value_cache, const at::Tensor& slot_mapping) {
  const at::Tensor k = key.is_contiguous() ? key : key.contiguous();
  const at::Tensor v = value.is_contiguous() ? value : value.contiguous();
  if (device == plan::DeviceKind::Ascend310P) {
    ops::reshape_and_cache(k, v, key_cache, value_cache, slot_mapping);
  } else {
    ops::scatter_pa_kv_cache(k, v, key_cache, value_cache, slot_mapping, "Norm");
  }
}

at::Tensor AttentionImpl::fill_paged(const Metadata& md, const at::Tensor& query, const at::Tensor& output,
                                     ops::PagedAttentionArgs& a) const {
  // One query row per real request; a padding dummy is not attended.
  const int64_t B = md.num_reqs, T = query.sizes()[0];
  a.query = T == B ? query : query.narrow(0, 0, B);
  a.key_cache = caches_.key;
  a.value_cache = caches_.value;
  a.num_kv_heads = cfg_.num_kv_heads;
  a.num_heads = cfg_.num_heads;
  a.scale_value = cfg_.scale;
  a.block_table = md.num_kernel_reqs == B ? md.block_tables : md.block_tables.narrow(0, 0, B);
  a.context_lens = md.num_kernel_reqs == B ? md.seq_lens : md.seq_lens.narrow(0, 0, B);
  return T == B ? output : output.narrow(0, 0, B);
}

void AttentionImpl::fill_fia(const Metadata& md, const at::Tensor& q, const std::optional<at::Tensor>& key,
                             const std::optional<at::Tensor>& value, bool dense, ops::FiaTensors& t,
                             ops::FiaParams& p) const {
  const int64_t nt = md.num_kernel_tokens;
  t.query = q;
  if (dense) {
    // PrefillNoCache: the new K/V are the whole context; both lists cumulative.
    t.key = key->sizes()[0] == nt ? *key : key->narrow(0, 0, nt);
    t.value = value->sizes()[0] == nt ? *value : value->narrow(0, 0, nt);
    p.actual_seq_lengths_kv = md.actual_seq_lengths_q;
  } else {
    t.key = caches_.key_3d;
    t.value = caches_.value_3d;
    t.block_table = md.block_tables;
    p.actual_seq_lengths_kv = md.seq_lens_list;  // per request with a block table
    p.block_size = md.block_size;
  }
  p.actual_seq_lengths = md.actual_seq_lengths_q;
  p.num_heads = cfg_.num_heads;
  p.num_key_value_heads = cfg_.num_kv_heads;
  p.scale = cfg_.scale;
  p.input_layout = "TND";
  if (!md.causal) {
    p.sparse_mode = 0;  // bidirectional; no mask (a mask would be applied as-is in mode 0)
    return;
  }
  const int64_t sw = cfg_.sliding_window.value_or(0);
  t.atten_mask = md.attn_mask;
  // vLLM's window holds W keys including the query's own position; the kernels'
  // band p - pre_tokens <= j <= p is inclusive, so pre_tokens = W - 1 (upstream
  // passes W and attends one key too many).
  p.sparse_mode = sw > 0 ? 4 : 3;
  p.pre_tokens = sw > 0 ? sw - 1 : ops::kIntMax32;
  p.next_tokens = sw > 0 ? 0 : ops::kIntMax32;
}

void AttentionImpl::fill_fia_v2(const Metadata& md, const at::Tensor& q, const std::optional<at::Tensor>& key,
                                const std::optional<at::Tensor>& value, bool dense, ops::FiaV2Tensors& t,
                                ops::FiaV2Params& p) const {
  const int64_t nt = md.num_kernel_tokens;
  t.query = q;
  if (dense) {
    t.key = key->sizes()[0] == nt ? *key : key->narrow(0, 0, nt);
    t.value = value->sizes()[0] == nt ? *value : value->narrow(0, 0, nt);
    p.actual_seq_kvlen = md.actual_seq_lengths_q;
  } else {
    t.key = caches_.key_3d;
    t.value = caches_.value_3d;
    t.block_table = md.block_tables;
    p.actual_seq_kvlen = md.seq_lens_list;
    p.block_size = md.block_size;
  }
  t.learnable_sink = sinks_fp32_;
  p.actual_seq_qlen = md.actual_seq_lengths_q;
  p.num_query_heads = cfg_.num_heads;
  p.num_key_value_heads = cfg_.num_kv_heads;
  p.softmax_scale = cfg_.scale;
  p.input_layout = "TND";
  if (!md.causal) {
    p.sparse_mode = 0;
    return;
  }
  const int64_t sw = cfg_.sliding_window.value_or(0);
  t.atten_mask = md.attn_mask;
  p.sparse_mode = sw > 0 ? 4 : 3;
  p.pre_tokens = sw > 0 ? sw - 1 : ops::kIntMax32;
  p.next_tokens = 0;
}


void AttentionImpl::capture(graph::GraphParams& g, ForwardPath path, const Metadata& md, const at::Tensor& query,
                            const std::optional<at::Tensor>& key, const std::optional<at::Tensor>& value,
                            const at::Tensor& output) {
  // A5's two-call split is the same maths as one call: capture one.
  if (path == ForwardPath::FusedSplit) path = ForwardPath::FusedPaged;
  if ((path != ForwardPath::FusedPaged && path != ForwardPath::FusedSinks && path != ForwardPath::PagedAttention) ||
      md.attn_state == AttentionState::PrefillNoCache) {
    throw_not_supported("graph capture of the '", to_string(path), "' path (state ", plan::to_string(md.attn_state),
                        ") is not supported: capture DecodeOnly, ChunkedPrefill or SpecDecoding batches "
                        "(MetadataBuilder::build_for_graph_capture)");
  }
  const int64_t n = g.capturing_bucket();
  AAR_CHECK_ARG(md.num_input_tokens == n && query.sizes()[0] == n, "graph capture of bucket ", n,
                " needs a batch padded to ", n, " tokens (num_input_tokens=", md.num_input_tokens,
                ", query rows=", query.sizes()[0], ")");
  const graph_calls::CallKeys keys{cfg_.layer_index, cfg_.kv_cache_group};
  if (key.has_value() && caches_.key.defined() && !cfg_.kv_sharing) {
    // Replays read the captured key/value buffers in place: no hidden copies.
    AAR_CHECK_ARG(key->is_contiguous() && value->is_contiguous(), "graph capture needs contiguous key and value");
    const at::Tensor slots =
        key->sizes()[0] == md.num_input_tokens ? md.slot_mapping : md.slot_mapping.narrow(0, 0, key->sizes()[0]);
    capture_kv_write(g, keys, *key, *value, caches_.key, caches_.value, slots,
                     cfg_.device_kind == plan::DeviceKind::Ascend310P);
    // The replays write through the builder's slot mapping (docs/design/graph.md §1.2).
    g.note_metadata(cfg_.kv_cache_group, md.stamp);
  }
  const int64_t nt = md.num_kernel_tokens, T = query.sizes()[0];
  const at::Tensor q = T == nt ? query : query.narrow(0, 0, nt);
  const at::Tensor out = T == nt ? output : output.narrow(0, 0, nt);
  switch (path) {
    case ForwardPath::PagedAttention: {
      ops::PagedAttentionArgs a;
      at::Tensor o = fill_paged(md, query, output, a);
      capture_paged_attention(g, keys, std::move(a), std::move(o));
      return;
    }
    case ForwardPath::FusedSinks: {
      ops::FiaV2Tensors t;
      ops::FiaV2Params p;
      fill_fia_v2(md, q, key, value, /*dense=*/false, t, p);
      graph_calls::capture_fia_v2(g, keys, {}, std::move(t), p, out, lse_placeholder_);
      return;
    }
    default: {
      ops::FiaTensors t;
      ops::FiaParams p;
      fill_fia(md, q, key, value, /*dense=*/false, t, p);
      graph_calls::capture_fia(g, keys, {}, std::move(t), p, out, lse_placeholder_);
      return;
    }
  }
}

const at::Tensor& AttentionImpl::forward(const at::Tensor& query, const std::optional<at::Tensor>& key,
                                         const std::optional<at::Tensor>& value, const at::Tensor& key_cache,
                                         const at::Tensor& value_cache, const Metadata* metadata,
                                         const at::Tensor& output) {
  if (metadata == nullptr) {
    // Profiling / dummy run: no metadata, nothing to attend.
    graph::refuse_if_capturing("a forward without metadata (profiling run)");
    last_path_ = ForwardPath::None;
    return internal::zero_profiling_output(output, query, "query");
  }
  const Metadata& md = *metadata;
  check_current(md.stamp, "metadata");
  validate(query, key, value, key_cache, value_cache, md, output);
  const int64_t T = query.sizes()[0];
  const bool has_cache = key_cache.defined();
  check_attn_type(cfg_.attn_type, md, has_cache);
  const ForwardPath path = choose_path(md, T, has_cache);
  if (path == ForwardPath::Encoder) check_own_tokens(md, "the encoder path (bidirectional, no cache read)");
  const bool dense = path == ForwardPath::Encoder || path == ForwardPath::FusedDense ||
                     (path == ForwardPath::LargeHead && md.attn_state == AttentionState::PrefillNoCache) ||
                     (path == ForwardPath::FusedSinks && md.attn_state == AttentionState::PrefillNoCache);
  if (!dense) {
    AAR_CHECK_ARG(has_cache, "attention state ", plan::to_string(md.attn_state),
                  " reads the paged KV cache, but key_cache/value_cache are not given");
  }
  if (dense) {
    AAR_CHECK_ARG(key.has_value(), "attention over the new tokens (", to_string(path),
                  ") needs key and value");
  }
  if (path == ForwardPath::LargeHead && cfg_.sliding_window.has_value()) {
    throw_not_supported("sliding_window with head_size 512 on A2/A3: the large-head fallback "
                        "(npu_fusion_attention) has no window here; use device_kind a5");
  }
  if (path == ForwardPath::LargeHead && !dense) {
    // Computed now (once per build) if the build did not: before any write.
    (void)dense_context(md);
  }
  const KvHookScope<Metadata> kv_scope(kv_hooks, key_cache, value_cache,
                                       key.has_value() && has_cache && !cfg_.kv_sharing, md, "gqa");
  // Operators run without autograd (entered once here, not per operator call).
  const aar::detail::InferenceScope inference;
  if (has_cache) caches_.bind(key_cache, value_cache, cfg_.num_kv_heads * cfg_.head_size);
  if (!lse_placeholder_.defined() || lse_placeholder_.device() != query.device()) {
    lse_placeholder_ = at::zeros({1}, query.options().dtype(at::kFloat));
  }
  if (graph::GraphParams* g = graph::GraphParams::current()) {
    capture(*g, path, md, query, key, value, output);
    last_path_ = path;
    return output;
  }
  if (key.has_value() && has_cache && !cfg_.kv_sharing) write_kv(*key, *value, md);

  const int64_t nt = md.num_kernel_tokens;
  last_path_ = path;
  if (nt == 0) return output;
  const at::Tensor q = T == nt ? query : query.narrow(0, 0, nt);
  at::Tensor out = T == nt ? output : output.narrow(0, 0, nt);

  switch (path) {
    case ForwardPath::PagedAttention: {
      ops::PagedAttentionArgs a;
      at::Tensor o = fill_paged(md, query, output, a);
      ops::paged_attention(a, o, std::nullopt);
      return output;
    }
    case ForwardPath::Encoder: {
      ops::FusionAttentionArgs a;
      a.query = q;
      a.key = key->sizes()[0] == nt ? *key : key->narrow(0, 0, nt);
      a.value = value->sizes()[0] == nt ? *value : value->narrow(0, 0, nt);
      a.head_num = cfg_.num_heads;
      a.input_layout = "TND";
      a.scale = cfg_.scale;
      // Both lists cumulative. Upstream appends a trailing 0 when the query is
      // padded; we slice the query to the attended rows instead.
      a.actual_seq_qlen = md.actual_seq_lengths_q;
      a.actual_seq_kvlen = md.actual_seq_lengths_q;
      a.sparse_mode = 0;
      out.copy_(ops::fusion_attention(a));
      return output;
    }
    case ForwardPath::FusedSinks: {
      ops::FiaV2Tensors t;
      ops::FiaV2Params p;
      fill_fia_v2(md, q, key, value, dense, t, p);
      ops::fused_infer_attention_score_v2_out(t, p, std::nullopt, out, lse_placeholder_);
      return output;
    }
    case ForwardPath::FusedDense:
    case ForwardPath::FusedPaged: {
      ops::FiaTensors t;
      ops::FiaParams p;
      fill_fia(md, q, key, value, path == ForwardPath::FusedDense, t, p);
      ops::fused_infer_attention_score_out(t, p, std::nullopt, out, lse_placeholder_);
      return output;
    }
    case ForwardPath::LargeHead: {
      // docs/design/gqa.md §4.5 large-head fallback: dense TND K/V (the new tokens for
      // PrefillNoCache, else the paged context gathered request by request)
      // through npu_fusion_attention; both length lists cumulative.
      ops::FusionAttentionArgs a;
      a.query = q;
      if (dense) {
        a.key = key->sizes()[0] == nt ? *key : key->narrow(0, 0, nt);
        a.value = value->sizes()[0] == nt ? *value : value->narrow(0, 0, nt);
        a.actual_seq_kvlen = md.actual_seq_lengths_q;
      } else {
        // The paged context gathered request by request, at the slots the
        // build computed (no host work here); both length lists cumulative.
        const int64_t nkv = cfg_.num_kv_heads, d = cfg_.head_size;
        c10::List<std::optional<at::Tensor>> rows;
        const DenseContext& dc = dense_context(md);
        rows.push_back(dc.slots);
        a.key = at::index(caches_.key.view({-1, nkv, d}), rows);
        a.value = at::index(caches_.value.view({-1, nkv, d}), rows);
        a.actual_seq_kvlen = dc.kv_ends;
      }
      a.head_num = cfg_.num_heads;
      a.input_layout = "TND";
      a.scale = cfg_.scale;
      a.actual_seq_qlen = md.actual_seq_lengths_q;
      if (md.causal) {
        if (!large_head_mask_.defined()) large_head_mask_ = md.attn_mask->to(at::kBool);
        a.atten_mask = large_head_mask_;
        a.next_tockens = 0;
        a.sparse_mode = 3;
      } else {
        a.sparse_mode = 0;
      }
      out.copy_(ops::fusion_attention(a));
      return output;
    }
    case ForwardPath::FusedSplit: {
      // A5: decodes and prefills of a chunked-prefill batch in two calls
      // (docs/design/gqa.md §4.4); mathematically the single call.
      const int64_t nd = md.num_decodes, ndt = md.num_decode_tokens;
      ops::FiaTensors t;
      ops::FiaParams p;
      t.key = caches_.key_3d;
      t.value = caches_.value_3d;
      t.atten_mask = md.attn_mask;
      p.num_heads = cfg_.num_heads;
      p.num_key_value_heads = cfg_.num_kv_heads;
      p.scale = cfg_.scale;
      p.input_layout = "TND";
      p.block_size = md.block_size;
      p.sparse_mode = 3;
      t.query = q.narrow(0, 0, ndt);
      t.block_table = md.block_tables.narrow(0, 0, nd);
      p.actual_seq_lengths = md.actual_seq_lengths_q.slice(0, nd);
      p.actual_seq_lengths_kv = md.seq_lens_list.slice(0, nd);
      at::Tensor out_d = out.narrow(0, 0, ndt);
      ops::fused_infer_attention_score_out(t, p, std::nullopt, out_d, lse_placeholder_);
      const int64_t np = md.num_kernel_reqs - nd;
      t.query = q.narrow(0, ndt, nt - ndt);
      t.block_table = md.block_tables.narrow(0, nd, np);
      p.actual_seq_lengths = md.prefill_actual_seq_lengths_q;
      p.actual_seq_lengths_kv = md.seq_lens_list.slice(nd);
      at::Tensor out_p = out.narrow(0, ndt, nt - ndt);
      ops::fused_infer_attention_score_out(t, p, std::nullopt, out_p, lse_placeholder_);
      return output;
    }
    default:
      break;
  }
  throw std::logic_error("unhandled forward path");
}

}  // namespace aar::gqa
