#include "ascend_attn_rt/fa3/impl.h"

#include <ATen/ATen.h>
#include <cmath>
#include <vector>

#include "../common/kv_cache.h"
#include "ascend_attn_rt/errors.h"
#include "ascend_attn_rt/gqa/validate.h"
#include "ascend_attn_rt/graph/graph_params.h"
#include "ascend_attn_rt/fa3/backend.h"
#include "ascend_attn_rt/ops/fused_infer_attention.h"
#include "ascend_attn_rt/ops/kv_cache_write.h"
#include "../common/inference_scope.h"

#include "../common/impl_checks.h"

namespace aar::fa3 {

const char* to_string(ForwardPath p) {
  switch (p) {
    case ForwardPath::None: return "none";
    case ForwardPath::Paged: return "fa3_paged";
    case ForwardPath::Encoder: return "encoder";
  }
  return "unknown";
}

namespace {

// Rejections happen before the encoder impl is built, so their messages name
// this backend.
gqa::ImplConfig checked_gqa_config(const ImplConfig& c) {
  if (c.sliding_window.has_value()) {
    throw_not_supported("sliding_window=", *c.sliding_window,
                        " is not supported by the FA3 backend (upstream raises ValueError: no window support)");
  }
  if (!c.enforce_eager && c.full_decode_only_graph) {
    throw_not_supported("the FA3 backend does not support FULL_DECODE_ONLY graph mode: set enforce_eager=True "
                        "(or full_decode_only_graph=False)");
  }
  if (c.has_sinks) throw_not_supported("sinks are not supported by the FA3 backend");
  if (c.has_alibi_slopes) throw_not_supported("ALiBi (alibi_slopes) is not supported by the FA3 backend");
  internal::check_logits_soft_cap(c.logits_soft_cap, "the FA3 backend");
  if (c.kv_cache_dtype != "auto") {
    throw_not_supported("kv_cache_dtype='", c.kv_cache_dtype, "' is not supported by the FA3 backend (only 'auto')");
  }
  if (c.attn_type == gqa::AttnType::EncoderDecoder) {
    throw_not_supported("attn_type 'encoder_decoder' (cross-attention) is not supported by the FA3 backend");
  }
  gqa::ImplConfig g;
  g.num_heads = c.num_heads;
  g.head_size = c.head_size;
  g.scale = c.scale;
  g.num_kv_heads = c.num_kv_heads;
  g.attn_type = c.attn_type;
  g.kv_sharing = c.kv_sharing;
  return g;
}

}  // namespace

AttentionImpl::AttentionImpl(const ImplConfig& cfg) : cfg_(cfg), encoder_(checked_gqa_config(cfg)) {
  cfg_.num_kv_heads = encoder_.config().num_kv_heads;
  cfg_.scale = encoder_.config().scale;
}

void AttentionImpl::validate(const at::Tensor& query, const std::optional<at::Tensor>& key,
                             const std::optional<at::Tensor>& value, const at::Tensor& key_cache,
                             const at::Tensor& value_cache, const gqa::Metadata& md, const at::Tensor& output) const {
  const int64_t Nkv = cfg_.num_kv_heads, D = cfg_.head_size;
  const auto dtype = query.scalar_type();
  gqa::validate_layer_inputs({cfg_.num_heads, Nkv, D}, query, key, value, md, output, md.num_kernel_tokens,
                             "attends num_kernel_tokens rows");
  AAR_CHECK_ARG(key_cache.defined() && value_cache.defined(),
                "the FA3 backend reads K/V from the paged cache: key_cache and value_cache are required");
  AAR_CHECK_ARG(key_cache.dim() != 4 || Backend::is_supported_block_size(key_cache.size(1)), "key_cache has block_size ",
                key_cache.size(1), ": the FA3 backend supports block_size 128 only");
  gqa::validate_nd_caches({cfg_.num_heads, Nkv, D}, key_cache, value_cache, md, dtype, query.device(), output);
}

const at::Tensor& AttentionImpl::forward(const at::Tensor& query, const std::optional<at::Tensor>& key,
                                         const std::optional<at::Tensor>& value, const at::Tensor& key_cache,
                                         const at::Tensor& value_cache, const gqa::Metadata* metadata,
                                         const at::Tensor& output) {
  last_num_calls_ = 0;
  // The FA3 backend is eager-only (upstream: FULL_DECODE_ONLY graphs need
  // enforce_eager): inside a capture it refuses instead of running unrecorded.
  graph::refuse_if_capturing("the FA3 backend's forward (eager only)");
  if (metadata == nullptr) {
    last_path_ = ForwardPath::None;
    return internal::zero_profiling_output(output, query, "query");
  }
  const gqa::Metadata& md = *metadata;
  check_current(md.stamp, "metadata");
  const KvHookScope<gqa::Metadata> kv_scope(kv_hooks, key_cache, value_cache,
                                            key.has_value() && key_cache.defined() && !cfg_.kv_sharing, md, "fa3");
  if (!md.causal && (md.is_pooling || !key_cache.defined())) {
    // Inherited upstream forward: bidirectional attention over the step's own
    // tokens takes the dense encoder path (the GQA impl, same attn_type checks).
    encoder_.forward(query, key, value, key_cache, value_cache, metadata, output);
    last_path_ = ForwardPath::Encoder;
    last_num_calls_ = 1;
    return output;
  }
  validate(query, key, value, key_cache, value_cache, md, output);
  gqa::check_attn_type(cfg_.attn_type, md, true);
  const aar::detail::InferenceScope inference;
  caches_.bind(key_cache, value_cache, cfg_.num_kv_heads * cfg_.head_size);
  if (key.has_value() && !cfg_.kv_sharing) {
    const int64_t n = key->size(0);
    const at::Tensor slots = n == md.num_input_tokens ? md.slot_mapping : md.slot_mapping.narrow(0, 0, n);
    const at::Tensor k = key->is_contiguous() ? *key : key->contiguous();
    const at::Tensor v = value->is_contiguous() ? *value : value->contiguous();
    ops::scatter_pa_kv_cache(k, v, caches_.key, caches_.value, slots, "Norm");
  }
  if (!lse_placeholder_.defined() || lse_placeholder_.device() != query.device()) {
    lse_placeholder_ = at::zeros({1}, query.options().dtype(at::kFloat));
  }
  last_path_ = ForwardPath::Paged;
  const int64_t nt = md.num_kernel_tokens;
  if (nt == 0) return output;

  const int64_t nd = md.num_decodes, ndt = md.num_decode_tokens, R = md.num_kernel_reqs;
  ops::FiaTensors t;
  ops::FiaParams p;
  t.key = caches_.key_3d;
  t.value = caches_.value_3d;
  p.num_heads = cfg_.num_heads;
  p.num_key_value_heads = cfg_.num_kv_heads;
  p.scale = cfg_.scale;  // upstream leaves the kernel's default 1/sqrt(D)
  p.input_layout = "TND";
  p.block_size = md.block_size;
  if (md.causal) {
    // Bottom-right causal for both parts (upstream: decodes non-causal, wrong
    // for multi-token speculative decodes).
    t.atten_mask = md.attn_mask;
    p.sparse_mode = 3;
  } else {
    p.sparse_mode = 0;
  }
  if (nd > 0) {
    t.query = query.narrow(0, 0, ndt);
    t.block_table = md.block_tables.narrow(0, 0, nd);
    p.actual_seq_lengths = md.actual_seq_lengths_q.slice(0, nd);
    p.actual_seq_lengths_kv = md.seq_lens_list.slice(0, nd);
    at::Tensor out = output.narrow(0, 0, ndt);
    ops::fused_infer_attention_score_out(t, p, std::nullopt, out, lse_placeholder_);
    ++last_num_calls_;
  }
  const int64_t np = R - nd;
  if (np > 0 && nt > ndt) {
    t.query = query.narrow(0, ndt, nt - ndt);
    t.block_table = md.block_tables.narrow(0, nd, np);  // by requests, not by decode tokens
    p.actual_seq_lengths = md.prefill_actual_seq_lengths_q;  // rebased to the part's first row (by the build)
    p.actual_seq_lengths_kv = md.seq_lens_list.slice(nd, np);
    at::Tensor out = output.narrow(0, ndt, nt - ndt);
    ops::fused_infer_attention_score_out(t, p, std::nullopt, out, lse_placeholder_);
    ++last_num_calls_;
  }
  return output;
}

}  // namespace aar::fa3
