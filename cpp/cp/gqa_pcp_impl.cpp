// GQA PCP layer (docs/design/cp.md §6.4, §6.5, §7, §8): the sharded (legacy head/tail)
// and replicated (model-runner v2) designs of include/ascend_attn_rt/cp/gqa_pcp.h.
#include <ATen/ATen.h>

#include <tuple>

#include "ascend_attn_rt/comm/comm.h"
#include "ascend_attn_rt/comm/dcp_exchange.h"
#include "ascend_attn_rt/cp/gqa_pcp.h"
#include "../common/impl_checks.h"
#include "ascend_attn_rt/errors.h"
#include "ascend_attn_rt/graph/graph_params.h"
#include "ascend_attn_rt/gqa/kv_write.h"
#include "ascend_attn_rt/gqa/validate.h"
#include "ascend_attn_rt/ops/fused_infer_attention.h"
#include "../common/inference_scope.h"
#include "../graph/exclusive_scope.h"
#include "../gqa/graph_calls.h"
#include "decode_rows_graph.h"
#include "gqa_cp_exchange.h"

namespace aar::cp {

namespace {

// One attention partial: O (T, N, D) in the query dtype and its LSE (T, N, 1) fp32.
struct Partial {
  at::Tensor out, lse;
};

// Two partials of the same rows merged (comm/dcp_exchange.h): (T, N, D) fp32 and (T, N, 1).
Partial merge_two(const Partial& a, const Partial& b) {
  auto [o, l] = merge_two_partials(a.out, a.lse, b.out, b.lse);
  return {o, l};
}

}  // namespace

PcpAttentionImpl::PcpAttentionImpl(const gqa::ImplConfig& cfg, Comm* pcp, Comm* dcp)
    : cfg_(cfg), pcp_(pcp), dcp_(dcp) {
  AAR_CHECK_ARG(pcp != nullptr, "pcp: the PCP group's Comm is required");
  // The GQA layer's own checks (heads, ALiBi, soft-cap, KV dtype, ...) and
  // its defaults (num_kv_heads, scale).
  inner_ = std::make_unique<gqa::AttentionImpl>(cfg);
  cfg_ = inner_->config();
  // DCP shards the KV of one replicated KV head per rank (docs/design/cp.md §1.1: TP >
  // total KV heads): the Wd*H gathered query heads all map to it. With more
  // KV heads per rank the gathered heads' GQA groups would differ from each
  // rank's own.
  AAR_CHECK_ARG(dcp == nullptr || dcp->size() == 1 || cfg_.num_kv_heads == 1, "num_kv_heads=", cfg_.num_kv_heads,
                " with a DCP group of ", dcp == nullptr ? 1 : dcp->size(),
                " ranks: DCP needs one KV head per rank (TP > total KV heads), whose KV it shards");
  AAR_CHECK_ARG(!cfg_.kv_sharing, "kv_sharing: a PCP layer writes the KV it gathers; a layer sharing another "
                "layer's cache is not supported with PCP");
  ex_ = std::make_unique<GqaShardExchange>(cfg_.num_heads, cfg_.num_kv_heads, cfg_.head_size, cfg_.scale,
                                           dcp != nullptr && dcp->size() > 1 ? dcp : nullptr, pcp);
}

PcpAttentionImpl::~PcpAttentionImpl() = default;

void PcpAttentionImpl::check_groups(const PcpMetadata& md) const {
  AAR_CHECK_ARG(pcp_->size() == md.pcp_size && pcp_->rank() == md.pcp_rank, "pcp group: rank ", pcp_->rank(),
                " of ", pcp_->size(), " but the metadata was built for PCP rank ", md.pcp_rank, " of ", md.pcp_size);
  if (md.dcp_size > 1) {
    AAR_CHECK_ARG(dcp_ != nullptr, "dcp: the metadata has dcp_size=", md.dcp_size,
                  " but the layer was built without a DCP group");
  }
  if (dcp_ != nullptr) {
    AAR_CHECK_ARG(dcp_->size() == md.dcp_size && dcp_->rank() == md.dcp_rank, "dcp group: rank ", dcp_->rank(),
                  " of ", dcp_->size(), " but the metadata was built for DCP rank ", md.dcp_rank, " of ",
                  md.dcp_size);
  }
}

const at::Tensor& PcpAttentionImpl::forward(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                                            const at::Tensor& key_cache, const at::Tensor& value_cache,
                                            const PcpMetadata* metadata, const at::Tensor& output) {
  graph::GraphParams* capture = graph::GraphParams::current();
  if (capture != nullptr && metadata != nullptr) {
    graph::note_layer_life(life_, "cp.PcpAttentionImpl", cfg_.layer_index);  // recorded closures call this layer
  }
  if (metadata == nullptr) {
    graph::refuse_if_capturing("a GQA PCP forward without metadata (profiling run)");
    // Profiling / dummy run: nothing to attend, no collective (every rank runs it alike).
    return internal::zero_profiling_output(output, query, "query");
  }
  const PcpMetadata& md = *metadata;
  check_current(md.stamp, "metadata");
  check_groups(md);
  AAR_CHECK_ARG(key.defined() && value.defined(), "key and value are required: a PCP layer gathers and writes the "
                "KV of every step");
  AAR_CHECK_ARG(key_cache.defined() && value_cache.defined(), "key_cache and value_cache are required with PCP");
  const gqa::LayerShape shape{cfg_.num_heads, cfg_.num_kv_heads, cfg_.head_size};
  const bool sharded = md.kv_mode == plan::PcpKvMode::Sharded;
  const gqa::Metadata* g = sharded ? &md.shape : md.local;
  AAR_CHECK_ARG(g != nullptr, "metadata: the replicated build has no local metadata");
  if (!sharded) check_current(g->stamp, "metadata (its local GQA build)");
  AAR_CHECK_ARG(query.defined() && query.dim() == 3 && query.size(0) == md.num_local_tokens, "query must have ",
                md.num_local_tokens, " rows (the metadata's num_local_tokens), got shape ",
                query.defined() ? query.sizes() : c10::IntArrayRef{});
  gqa::validate_layer_inputs(shape, query, key, value, *g, output, md.num_local_tokens, "has num_local_tokens rows");
  AAR_CHECK_ARG(key.size(0) == md.num_local_tokens, "key has ", key.size(0), " rows, expected num_local_tokens=",
                md.num_local_tokens);
  gqa::validate_nd_caches(shape, key_cache, value_cache, *g, query.scalar_type(), query.device(), output);
  if (sharded) {
    if (cfg_.attn_type != gqa::AttnType::Decoder) {
      throw_not_supported("attn_type='", gqa::to_string(cfg_.attn_type),
                          "' with sharded PCP (only causal decoder layers)");
    }
    if (cfg_.sliding_window.has_value()) throw_not_supported("sliding_window with sharded PCP");
    if (cfg_.sinks.has_value()) throw_not_supported("sinks with sharded PCP");
    if (cfg_.head_size == 512 && cfg_.device_kind != plan::DeviceKind::A5) {
      throw_not_supported("head_size 512 with sharded PCP on A2/A3 (FIA TND takes no head size 512 there)");
    }
    AAR_CHECK_ARG(cfg_.head_size % 8 == 0 && cfg_.head_size <= 512, "head_size=", cfg_.head_size,
                  ": sharded PCP merges partials through npu_attention_update (a multiple of 8 in [8, 512])");
  } else {
    gqa::check_attn_type(cfg_.attn_type, *g, true);
  }
  if (capture != nullptr && (md.num_prefills > 0 || md.num_decodes == 0)) {
    // docs/design/cp.md §6.6: before any write or collective.
    throw_not_supported("a GQA PCP forward of a step with ", md.num_prefills, " prefills and ", md.num_decodes,
                        " decodes inside a graph capture (GQA PCP captures decode-only steps: the prefill "
                        "head/tail split and its gathers run eagerly only)");
  }
  // The shared exchange workspace is held for this forward (one thread at a time).
  graph::ForwardScope exclusive_scope;
  if (ex_->workspace()) exclusive_scope.hold(ex_->workspace()->exclusive());
  const KvHookScope<PcpMetadata> kv_scope(kv_hooks, key_cache, value_cache, /*wrote=*/true, md, "gqa_pcp");

  const aar::detail::InferenceScope inference;
  caches_.bind(key_cache, value_cache, cfg_.num_kv_heads * cfg_.head_size);
  if (capture != nullptr && sharded) {
    capture_sharded_decode(*capture, md, query, key, value, output);
    return output;
  }
  if (sharded) {
    forward_sharded(query, key, value, md, output);
  } else {
    forward_replicated(query, key, value, key_cache, value_cache, md, output);
  }
  return output;
}

void PcpAttentionImpl::forward_replicated(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                          const at::Tensor& key_cache, const at::Tensor& value_cache,
                                          const PcpMetadata& md, const at::Tensor& out) {
  const int64_t td = md.num_decode_tokens, p = md.num_local_tokens;
  if (md.num_prefills == 0) {
    // Nothing split anywhere (a batch-global fact): the ordinary GQA layer writes
    // every rank's own replicated copy of the decodes through the local build's
    // slots and attends them; no collective. Inside a graph capture it records
    // both (docs/design/cp.md §6.6), padding rows included.
    inner_->forward(q, k, v, key_cache, value_cache, md.local, out);
    const int64_t nt = md.local->num_kernel_tokens;
    if (graph::GraphParams::current() == nullptr && nt < p) out.narrow(0, nt, p - nt).zero_();
    return;
  } else {
    // docs/design/cp.md §6.5: K and V gathered separately, so each stays contiguous.
    const at::Tensor gk = pcp_->all_gather(k.narrow(0, td, p - td), 0);
    const at::Tensor gv = pcp_->all_gather(v.narrow(0, td, p - td), 0);
    const at::Tensor ck = td > 0 ? at::cat({k.narrow(0, 0, td), gk}) : gk;
    const at::Tensor cv = td > 0 ? at::cat({v.narrow(0, 0, td), gv}) : gv;
    gqa::write_paged_kv(cfg_.device_kind, ck, cv, caches_.key, caches_.value, md.write_slots);
  }
  // The ordinary GQA chunked-prefill path over the rank's segments; the cache
  // already holds this layer's KV of every token, so no write there.
  inner_->forward(q, std::nullopt, std::nullopt, key_cache, value_cache, md.local, out);
  const int64_t nt = md.local->num_kernel_tokens;
  if (nt < p) out.narrow(0, nt, p - nt).zero_();
}

void PcpAttentionImpl::forward_sharded(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                       const PcpMetadata& md, const at::Tensor& out) {
  const int64_t Wp = md.pcp_size, Wd = md.dcp_size;
  const int64_t H = cfg_.num_heads, Hkv = cfg_.num_kv_heads, D = cfg_.head_size, Hq = Wd * H;
  const int64_t td = md.num_decode_tokens, tloc = md.num_local_tokens, tp = tloc - td;
  const bool has_prefill = md.num_prefills > 0, has_decode = md.num_decodes > 0;

  // --- KV write (docs/design/cp.md §6.3, §6.4) ---
  at::Tensor kf, vf;  // the restored prefill K/V, padded-global order (Wp * tp rows)
  if (!has_prefill) {
    if (td > 0 && k.sizes()[0] == td && md.decode_slots.sizes()[0] == td) {
      // An unpadded decode-only step: every row is a decode token (docs/design/cp.md §3.5: no views made).
      gqa::write_paged_kv(cfg_.device_kind, k, v, caches_.key, caches_.value, md.decode_slots);
    } else if (td > 0) {
      gqa::write_paged_kv(cfg_.device_kind, k.narrow(0, 0, td), v.narrow(0, 0, td), caches_.key, caches_.value,
                          md.decode_slots.narrow(0, 0, td));
    }
  } else {
    const at::Tensor kv = at::cat({k, v}, -1);  // (T_loc, Hkv, 2D)
    const at::Tensor gathered = Wp > 1 ? pcp_->all_gather(kv, 0) : kv;
    const at::Tensor full = gathered.index_select(0, md.restore_idx);
    const at::Tensor fk = full.narrow(-1, 0, D).contiguous(), fv = full.narrow(-1, D, D).contiguous();
    gqa::write_paged_kv(cfg_.device_kind, fk, fv, caches_.key, caches_.value, md.padded_slot_mapping);
    kf = fk.narrow(0, Wp * td, Wp * tp);
    vf = fv.narrow(0, Wp * td, Wp * tp);
  }

  auto fia = [&](const at::Tensor& query, const at::Tensor& key, const at::Tensor& value, int64_t heads,
                 c10::IntArrayRef q_ends, c10::IntArrayRef kv_lens, const std::optional<at::Tensor>& block_table,
                 bool causal) {
    ops::FiaTensors t;
    ops::FiaParams p;
    t.query = query;
    t.key = key;
    t.value = value;
    t.block_table = block_table;
    p.actual_seq_lengths = q_ends;
    p.actual_seq_lengths_kv = kv_lens;
    p.num_heads = heads;
    p.num_key_value_heads = Hkv;
    p.scale = cfg_.scale;
    p.input_layout = "TND";
    p.softmax_lse_flag = true;
    if (block_table.has_value()) p.block_size = md.shape.block_size;
    if (causal) {
      t.atten_mask = md.attn_mask;
      p.sparse_mode = 3;
    } else {
      p.sparse_mode = 0;
    }
    auto [o, l] = ops::fused_infer_attention_score(t, p);
    return Partial{o, l};
  };
  // A partial over this rank's shard for the Wd*H gathered heads -> merged
  // over the DCP group for this rank's own H heads (comm/dcp_exchange.h), in the wire
  // layout (rows, H, D+1) fp32 that the PCP exchange sends.
  auto dcp_merge = [&](const Partial& p) {
    const int64_t rows = p.out.size(0);
    at::Tensor w = at::empty({rows, H, D + 1}, p.lse.options());
    if (Wd == 1) {
      w.narrow(-1, 0, D).copy_(p.out);
      w.narrow(-1, D, 1).copy_(p.lse);
      return w;
    }
    at::Tensor o = w.narrow(-1, 0, D);
    combine_partials(*dcp_, p.out, p.lse, o, w.narrow(-1, D, 1));
    return w;
  };
  // The Wp partials (Wp, rows, H, D+1) of this rank's rows merged: (rows, H, D) fp32 and (rows, H, 1).
  auto pcp_merge = [&](const at::Tensor& parts, int64_t rows) {
    auto [o, l] = merge_wire_partials(parts.view({Wp, rows * H, D + 1}));
    return Partial{o.view({rows, H, D}), l.view({rows, H, 1})};
  };

  // --- decodes (docs/design/cp.md §4, legacy PCP x DCP; one row per decode token, §6.6) ---
  if (has_decode) {
    // docs/design/cp.md §11.5: the wire, its gather and the merge's inputs are the PCP merge workspace's.
    const DcpViews& pw = pcp_wire_views(*pcp_, H, D, q.device(), /*workspace_group=*/0, td, merge_ws_);
    // A decode-only step's rows are the whole query and output (docs/design/cp.md §3.5: no views made).
    const bool all = tloc == td;
    decode_partial(md, all ? q : q.narrow(0, 0, td), td, pw);
    pcp_gather_merge(*pcp_, pw, all ? out : out.narrow(0, 0, td));
  }
  // Padding decode rows of a padded decode-only step run eagerly: defined zeros.
  if (tloc > td && !has_prefill) out.narrow(0, td, tloc - td).zero_();
  if (!has_prefill) return;

  // --- current chunk: head and tail blocks (docs/design/cp.md §6.4) ---
  const at::Tensor qp = q.narrow(0, td, tp);
  auto block = [&](const at::Tensor& q_idx, const at::Tensor& nomask_idx, int64_t nomask_tokens,
                   c10::IntArrayRef nomask_ends, const at::Tensor& mask_idx) {
    const at::Tensor qb = qp.index_select(0, q_idx);
    Partial m = fia(qb, kf.index_select(0, mask_idx), vf.index_select(0, mask_idx), H, md.mask_seq_ends,
                    md.mask_seq_ends, std::nullopt, true);
    if (nomask_tokens == 0) return m;
    Partial nm = fia(qb, kf.index_select(0, nomask_idx), vf.index_select(0, nomask_idx), H, md.mask_seq_ends,
                     nomask_ends, std::nullopt, false);
    return merge_two(nm, m);
  };
  const Partial head = block(md.q_head_idx, md.kv_head_nomask_idx, md.head_nomask_tokens, md.head_nomask_kv_ends,
                             md.kv_head_mask_idx);
  const Partial tail = block(md.q_tail_idx, md.kv_tail_nomask_idx, md.tail_nomask_tokens, md.tail_nomask_kv_ends,
                             md.kv_tail_mask_idx);
  Partial cur{at::cat({head.out.to(at::kFloat), tail.out.to(at::kFloat)}).index_select(0, md.q_full_idx),
              at::cat({head.lse, tail.lse}).index_select(0, md.q_full_idx)};

  // --- cached context (docs/design/cp.md §6.4 "context with PCP"; see the header for the
  // rank-major query and the PCP all-to-all) ---
  if (md.has_context) {
    at::Tensor qg = Wp > 1 ? pcp_->all_gather(qp, 0) : qp;  // (Wp*tp, H, D), rank-major
    if (Wd > 1) qg = gather_query_heads(*dcp_, qg);          // (Wp*tp, Wd*H, D)
    const Partial part = fia(qg, caches_.key_3d, caches_.value_3d, Hq, md.ctx_q_ends, md.ctx_kv_lens,
                             md.ctx_block_tables, false);
    at::Tensor w = dcp_merge(part);              // (Wp*tp, H, D+1)
    if (Wp > 1) w = pcp_->all_to_all_single(w);  // block j: rank j's partials of this rank's tokens
    const Partial merged = merge_two(pcp_merge(w, tp), cur);
    // Rows of requests without cached context keep the current chunk's
    // result: their context partials are all empty (-inf), which the CPU
    // twin merges to 0 / -inf but the NPU kernel need not (docs/design/cp.md §5).
    cur.out = at::where(md.context_rows.ne(0).view({tp, 1, 1}), merged.out, cur.out);
  }
  out.narrow(0, td, tp).copy_(cur.out);
}

void PcpAttentionImpl::decode_partial(const PcpMetadata& md, const at::Tensor& q_rows, int64_t rows,
                                      const DcpViews& pw) {
  const DcpViews& v = ex_->views(rows, q_rows);
  // Without DCP the kernel reads the query rows where they are (docs/design/cp.md §3.5): staging them
  // into the workspace is a copy a captured call needs (a stable address), an eager one does not.
  const bool local = ex_->world() == 1 && q_rows.is_contiguous();
  if (!local) ex_->stage_query(v, q_rows);
  ops::FiaTensors t;
  ops::FiaParams p;
  at::Tensor o, l;
  const bool all = rows == md.decode_kernel_rows;
  ex_->fill_partial_call(v, caches_.key_3d, caches_.value_3d,
                         all ? md.decode_block_tables : md.decode_block_tables.narrow(0, 0, rows),
                         md.decode_q_ends.slice(0, rows), md.decode_kv_lens.slice(0, rows), md.shape.block_size, t,
                         p, o, l);
  if (local) t.query = q_rows;
  const bool direct = wire_targets(v, pw, o, l);
  ops::fused_infer_attention_score_out(t, p, std::nullopt, o, l);
  wire_finish(v, pw, direct);
}

bool PcpAttentionImpl::wire_targets(const DcpViews& v, const DcpViews& pw, at::Tensor& o, at::Tensor& l) const {
  // Without DCP the kernel's partial is this rank's wire: its LSE goes straight into the wire's LSE
  // column, its output into the output columns when the query is fp32 (the kernel's output takes the
  // query dtype; else it lands in the exchange workspace and is cast into the wire after the call).
  if (ex_->world() > 1) return false;
  l = pw.wire_lse;
  if (v.partial_out.scalar_type() != at::kFloat) return false;
  o = pw.wire_out;
  return true;
}

void PcpAttentionImpl::wire_finish(const DcpViews& v, const DcpViews& pw, bool direct) const {
  if (ex_->world() > 1) {
    ex_->combine(v, pw.wire_out, pw.wire_lse);  // the DCP merge writes the wire's columns
  } else if (!direct) {
    ops::dense::copy(pw.wire_out, v.partial_out);
  }
}

void PcpAttentionImpl::capture_sharded_decode(graph::GraphParams& g, const PcpMetadata& md,
                                              const at::Tensor& query, const at::Tensor& key,
                                              const at::Tensor& value, const at::Tensor& output) {
  // docs/design/cp.md §6.6: the eager decode in four recorded calls over stable
  // buffers (the builder's decode rows, the shared DcpWorkspaces of the DCP leg and of
  // the PCP wire and merge, whose views the calls hold), the collectives inside the calls.
  const int64_t n = g.capturing_bucket(), H = cfg_.num_heads, D = cfg_.head_size;
  if (md.decode_kernel_rows != n || md.num_input_tokens != n || md.num_local_tokens != n || query.size(0) != n) {
    throw_not_supported("GQA PCP graph capture of bucket ", n, " takes decode-only steps padded to ", n,
                        " tokens (got ", md.decode_kernel_rows, " decode rows, num_input_tokens=",
                        md.num_input_tokens, ", query rows=", query.size(0), ")");
  }
  // Replays read the captured key/value buffers in place: no hidden copies.
  AAR_CHECK_ARG(key.is_contiguous() && value.is_contiguous(), "graph capture needs contiguous key and value");
  gqa::capture_kv_write(g, {cfg_.layer_index, 0}, key, value, caches_.key, caches_.value, md.decode_slots,
                        /*reshape_and_cache=*/false);
  // The replays write through the builder's slot mapping (docs/design/graph.md §1.2).
  g.note_metadata(0, md.stamp);
  const DcpViews v = ex_->views(n, query);
  g.capture_call(std::make_unique<graph::ClosureCall>(
      cfg_.layer_index, 0, [ex = ex_.get(), v, q = at::Tensor(query)]() { ex->stage_query(v, q); }));
  ops::FiaTensors t;
  ops::FiaParams p;
  at::Tensor o, l;
  ex_->fill_partial_call(v, caches_.key_3d, caches_.value_3d, md.decode_block_tables, md.decode_q_ends,
                         md.decode_kv_lens, md.shape.block_size, t, p, o, l);
  const DcpViews pw = pcp_wire_views(*pcp_, H, D, query.device(), /*workspace_group=*/0, n, merge_ws_);
  const bool direct = wire_targets(v, pw, o, l);
  graph_calls::capture_fia(g, {cfg_.layer_index, 0}, {}, std::move(t), p, std::move(o), std::move(l));
  g.capture_call(std::make_unique<graph::ClosureCall>(
      cfg_.layer_index, 0, [this, v, pw, direct, out = at::Tensor(output)]() {
        wire_finish(v, pw, direct);
        pcp_gather_merge(*pcp_, pw, out);
      }));
}

graph::StepParams graph_step_params(const PcpMetadata& md) {
  if (md.kv_mode == plan::PcpKvMode::Replicated) {
    decode_rows::require_decode_only(md, "GQA PCP");
    AAR_CHECK_ARG(md.local != nullptr, "metadata: the replicated build has no local metadata");
    return gqa::graph_step_params(*md.local);
  }
  return decode_rows::step_params(md, "GQA PCP");
}

}  // namespace aar::cp
