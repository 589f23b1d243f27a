// Per-layer GQA DCP attention (decisions in cp/gqa_dcp.h): local KV write, decode
// over the local shard with the gathered query, prefill current chunk plus
// context over the local shard, partial exchange and LSE merges (comm/dcp_exchange.h).
#include <ATen/ATen.h>

#include <cmath>
#include <limits>

#include "ascend_attn_rt/comm/dcp_exchange.h"
#include "ascend_attn_rt/errors.h"
#include "ascend_attn_rt/graph/graph_params.h"
#include "ascend_attn_rt/cp/gqa_dcp.h"
#include "ascend_attn_rt/gqa/validate.h"
#include "ascend_attn_rt/ops/attention_update.h"
#include "ascend_attn_rt/ops/fused_infer_attention.h"
#include "ascend_attn_rt/ops/kv_cache_write.h"
#include "../common/impl_checks.h"
#include "gqa_cp_exchange.h"
#include "../graph/exclusive_scope.h"
#include "../gqa/graph_calls.h"
#include "../common/inference_scope.h"

namespace aar::gqa {

DcpAttentionImpl::DcpAttentionImpl(const ImplConfig& cfg, cp::Comm& comm) : cfg_(cfg), comm_(comm) {
  internal::resolve_head_layout(cfg_);
  const char* what = "decode context parallel (DCP) attention";
  if (cfg_.sliding_window.has_value()) throw_not_supported("sliding_window with ", what);
  if (cfg_.sinks.has_value()) throw_not_supported("sinks with ", what);
  if (cfg_.has_alibi_slopes) throw_not_supported("ALiBi (alibi_slopes) with ", what);
  internal::check_logits_soft_cap(cfg_.logits_soft_cap, what);
  if (cfg_.kv_cache_dtype != "auto") throw_not_supported("kv_cache_dtype='", cfg_.kv_cache_dtype, "' with ", what);
  if (cfg_.attn_type != AttnType::Decoder) {
    throw_not_supported("attn_type '", to_string(cfg_.attn_type), "' with ", what, " (decoder layers only)");
  }
  if (cfg_.device_kind == plan::DeviceKind::Ascend310P) throw_not_supported("device_kind 310p with ", what);
  // The GQA layer's decode-path and graph-key settings: the DCP layer has one decode path
  // and keys its captured calls by layer only, so a value other than the default would be
  // ignored; it is refused by name instead.
  const char* one_path = " with DCP attention (it has one decode path; the setting steers the GQA layer's)";
  if (!cfg_.pa_shape_list.empty()) throw_not_supported("pa_shape_list", one_path);
  if (cfg_.full_decode_only_graph) throw_not_supported("full_decode_only_graph", one_path);
  if (cfg_.has_speculative_config) {
    throw_not_supported("has_speculative_config", one_path,
                        "; speculative decode is the DCP builder's num_speculative_tokens");
  }
  if (cfg_.kv_cache_group != 0) {
    throw_not_supported("kv_cache_group=", cfg_.kv_cache_group,
                        " with DCP attention (its captured calls are keyed by layer_index only)");
  }
  AAR_CHECK_ARG(comm_.size() <= 16, "DCP group size ", comm_.size(), " exceeds 16 (npu_attention_update's limit)");
  ex_ = std::make_unique<cp::GqaShardExchange>(cfg_.num_heads, cfg_.num_kv_heads, cfg_.head_size, cfg_.scale, &comm_);
}

DcpAttentionImpl::~DcpAttentionImpl() = default;

void DcpAttentionImpl::decode(const DcpMetadata& md, const at::Tensor& query, const at::Tensor& output) {
  // The step's decode tokens only (eager: no padding rows).
  const int64_t td = md.num_decode_tokens;
  // docs/design/cp.md §3.5: a decode-only step's rows are the whole query and output (no views made).
  const bool all = query.sizes()[0] == td;
  const cp::DcpViews& v = ex_->views(td, query);
  ex_->stage_query(v, all ? query : query.narrow(0, 0, td));
  ops::FiaTensors t;
  ops::FiaParams p;
  at::Tensor out, lse;
  ex_->fill_partial_call(v, caches_.key_3d, caches_.value_3d, md.decode_block_tables, md.decode_q_ends,
                         md.decode_kv_lens, md.block_size, t, p, out, lse);
  p.actual_seq_lengths = md.decode_q_ends.slice(0, td);
  p.actual_seq_lengths_kv = md.decode_kv_lens.slice(0, td);
  t.block_table = md.decode_kernel_rows == td ? md.decode_block_tables : md.decode_block_tables.narrow(0, 0, td);
  ops::fused_infer_attention_score_out(t, p, std::nullopt, out, lse);
  ex_->combine(v, all ? output : output.narrow(0, 0, td));
}

void DcpAttentionImpl::capture_decode(graph::GraphParams& g, const DcpMetadata& md, const at::Tensor& query,
                                      const std::optional<at::Tensor>& key, const std::optional<at::Tensor>& value,
                                      const at::Tensor& output) {
  const int64_t n = g.capturing_bucket();
  if (md.num_prefills != 0 || md.num_decodes == 0 || md.decode_kernel_rows != n ||
      md.num_input_tokens != n || query.sizes()[0] != n) {
    throw_not_supported("DCP graph capture of bucket ", n, " takes decode-only batches padded to ", n,
                        " tokens (got ", md.num_decodes, " decodes, ", md.num_prefills,
                        " prefills, ", md.decode_kernel_rows, " decode rows, num_input_tokens=",
                        md.num_input_tokens, ", query rows=", query.sizes()[0], ")");
  }
  if (key.has_value() && !cfg_.kv_sharing) {
    // Replays read the captured key/value buffers in place: no hidden copies.
    AAR_CHECK_ARG(key->is_contiguous() && value->is_contiguous(), "graph capture needs contiguous key and value");
    AAR_CHECK_ARG(key->sizes()[0] == n, "graph capture of bucket ", n, " needs key/value of ", n, " rows, got ",
                  key->sizes()[0]);
    // The builder's slot mapping: a stable address, -1 past the real tokens.
    capture_kv_write(g, {cfg_.layer_index, 0}, *key, *value, caches_.key, caches_.value, md.slot_mapping,
                     /*reshape_and_cache=*/false);
    // The replays write through the builder's slot mapping (docs/design/graph.md §1.2).
    g.note_metadata(0, md.stamp);
  }
  // The closures hold copies of the views (and so the buffers) they use.
  const cp::DcpViews v = ex_->views(n, query);
  g.capture_call(std::make_unique<graph::ClosureCall>(
      cfg_.layer_index, 0, [ex = ex_.get(), v, q = at::Tensor(query)]() { ex->stage_query(v, q); }));
  ops::FiaTensors t;
  ops::FiaParams p;
  at::Tensor out, lse;
  ex_->fill_partial_call(v, caches_.key_3d, caches_.value_3d, md.decode_block_tables, md.decode_q_ends,
                         md.decode_kv_lens, md.block_size, t, p, out, lse);
  graph_calls::capture_fia(g, {cfg_.layer_index, 0}, {}, std::move(t), p, std::move(out), std::move(lse));
  g.capture_call(std::make_unique<graph::ClosureCall>(
      cfg_.layer_index, 0, [ex = ex_.get(), v, out = at::Tensor(output)]() { ex->combine(v, out); }));
}

void DcpAttentionImpl::prefill(const DcpMetadata& md, const at::Tensor& query, const at::Tensor& key,
                               const at::Tensor& value, const at::Tensor& output) {
  const int64_t td = md.num_decode_tokens, tp = md.num_prefill_tokens;
  const int64_t H = cfg_.num_heads, D = cfg_.head_size;
  const at::Tensor qp = query.narrow(0, td, tp);
  // Upstream order (docs/design/cp.md §8): the context query gather before the current pass,
  // into the workspace the decode uses (the decode pass of this step is done
  // with it; its views of tp rows alias the same storage).
  const cp::DcpViews* v = nullptr;
  if (md.has_context) {
    v = &ex_->views(tp, query);
    ex_->stage_query(*v, qp);
  }
  // The current pass's LSE and the context pass's merged output and LSE: a
  // grow-only fp32 scratch of the layer (3 views, no allocation once grown).
  const int64_t need = tp * H * (D + 2);
  if (!prefill_scratch_.defined() || prefill_scratch_.numel() < need || prefill_scratch_.device() != query.device()) {
    prefill_scratch_ = at::empty({std::max<int64_t>(need, 1)}, query.options().dtype(at::kFloat));
  }
  at::Tensor lc = prefill_scratch_.narrow(0, 0, tp * H).view({tp, H, 1});
  at::Tensor lctx = prefill_scratch_.narrow(0, tp * H, tp * H).view({tp, H, 1});
  at::Tensor octx = prefill_scratch_.narrow(0, 2 * tp * H, tp * H * D).view({tp, H, D});

  // Current chunk: causal over the step's own K/V (q_len == kv_len per request).
  at::Tensor oc = output.narrow(0, td, tp);
  {
    ops::FiaTensors t;
    ops::FiaParams p;
    t.query = qp;
    t.key = key.narrow(0, td, tp);
    t.value = value.narrow(0, td, tp);
    t.atten_mask = md.attn_mask;
    p.actual_seq_lengths = md.prefill_q_ends;
    p.actual_seq_lengths_kv = md.prefill_q_ends;  // cumulative: dense K/V
    p.num_heads = H;
    p.num_key_value_heads = cfg_.num_kv_heads;
    p.scale = cfg_.scale;
    p.input_layout = "TND";
    p.sparse_mode = 3;
    p.softmax_lse_flag = md.has_context;
    // Without the LSE flag the kernel writes no LSE: a one-element placeholder of the scratch.
    at::Tensor lse_arg = md.has_context ? lc : prefill_scratch_.narrow(0, 0, 1);
    if (oc.is_contiguous()) {
      ops::fused_infer_attention_score_out(t, p, std::nullopt, oc, lse_arg);
    } else {
      at::Tensor tmp = at::empty_like(qp);
      ops::fused_infer_attention_score_out(t, p, std::nullopt, tmp, lse_arg);
      oc.copy_(tmp);
    }
  }
  if (!md.has_context) return;

  // Context: the gathered query against this rank's local cached context, its
  // partial into the workspace (KV-head-major when regrouped), exchanged and
  // merged into octx / lctx.
  ops::FiaTensors t;
  ops::FiaParams p;
  at::Tensor po, pl;
  ex_->fill_partial_call(*v, caches_.key_3d, caches_.value_3d, md.prefill_block_tables, md.prefill_q_ends,
                         md.prefill_context_lens, md.block_size, t, p, po, pl);
  if (md.local_context_tokens > 0) {
    ops::fused_infer_attention_score_out(t, p, std::nullopt, po, pl);
  } else {
    // No local context: the empty partial, still exchanged (docs/design/cp.md §7.3).
    po.zero_();
    pl.fill_(-std::numeric_limits<float>::infinity());
  }
  ex_->combine(*v, octx, lctx);

  // Chunk merge on the rows of requests with context (docs/design/cp.md §5). The
  // other rows keep Oc: their context partial is empty on every rank, which
  // the NPU's fused merge would turn into NaN.
  const at::Tensor& idx = md.context_token_idx;
  const int64_t n = idx.size(0);
  if (n == 0) return;
  const at::Tensor l_ctx = lctx.index_select(0, idx).view({n * H});
  const at::Tensor l_cur = lc.index_select(0, idx).view({n * H});
  const at::Tensor o_ctx = octx.index_select(0, idx).view({n * H, D});
  const at::Tensor o_cur = oc.index_select(0, idx).to(at::kFloat).view({n * H, D});
  auto [merged, unused] = ops::attention_update({l_ctx, l_cur}, {o_ctx, o_cur}, 0);
  oc.index_copy_(0, idx, merged.view({n, H, D}).to(oc.scalar_type()));
}

const at::Tensor& DcpAttentionImpl::forward(const at::Tensor& query, const std::optional<at::Tensor>& key,
                                            const std::optional<at::Tensor>& value, const at::Tensor& key_cache,
                                            const at::Tensor& value_cache, const DcpMetadata* metadata,
                                            const at::Tensor& output) {
  if (metadata == nullptr) {
    // Profiling / dummy run: nothing to attend, no collective (every rank of
    // the group runs it alike, so none waits for a peer).
    graph::refuse_if_capturing("a DCP forward without metadata (profiling run)");
    return internal::zero_profiling_output(output, query, "query");
  }
  const DcpMetadata& md = *metadata;
  // The shared exchange workspace is held for this forward (one thread at a
  // time), from the start when the layer has one already: before any write.
  graph::ForwardScope exclusive_scope;
  if (ex_->workspace()) exclusive_scope.hold(ex_->workspace()->exclusive());
  check_current(md.stamp, "metadata");
  AAR_CHECK_ARG(md.shard.world == comm_.size() && md.shard.rank == comm_.rank(), "the metadata was built for DCP rank ",
                md.shard.rank, " of ", md.shard.world, " but the layer's group is rank ", comm_.rank(), " of ",
                comm_.size());
  const LayerShape shape{cfg_.num_heads, cfg_.num_kv_heads, cfg_.head_size};
  validate_layer_inputs(shape, query, key, value, md, output, md.num_actual_tokens,
                        "has num_actual_tokens rows");
  AAR_CHECK_ARG(key_cache.defined(), "DCP attention reads and writes the paged KV cache: key_cache/value_cache are required");
  validate_nd_caches(shape, key_cache, value_cache, md, query.scalar_type(), query.device(), output);
  AAR_CHECK_ARG(md.num_prefills == 0 || key.has_value(),
                "prefill requests attend this step's own K/V: key and value are required");
  const bool writes = key.has_value() && !cfg_.kv_sharing;
  const KvHookScope<DcpMetadata> kv_scope(kv_hooks, key_cache, value_cache, writes, md, "gqa_dcp");
  const aar::detail::InferenceScope inference;
  caches_.bind(key_cache, value_cache, cfg_.num_kv_heads * cfg_.head_size);
  if (graph::GraphParams* g = graph::GraphParams::current()) {
    capture_decode(*g, md, query, key, value, output);
    return output;
  }
  // 1. This rank's own tokens only (slot -1 elsewhere, skipped by the kernel).
  if (writes) {
    const int64_t n = key->sizes()[0];
    const at::Tensor slots = n == md.num_input_tokens ? md.slot_mapping : md.slot_mapping.narrow(0, 0, n);
    ops::scatter_pa_kv_cache(key->contiguous(), value->contiguous(), caches_.key, caches_.value, slots, "Norm");
  }
  // 2-3. Collectives depend only on batch-global facts (docs/design/cp.md §8).
  if (md.num_decodes > 0) decode(md, query, output);
  if (md.num_prefills > 0) prefill(md, query, *key, *value, output);
  return output;
}

}  // namespace aar::gqa
