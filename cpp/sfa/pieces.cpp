// The SFA layer's indexer step and sparse attention for engines that compute their own
// projections (ascend_attn_rt/sfa/pieces.h, docs/design/sfa.md §4.5).
#include "ascend_attn_rt/sfa/pieces.h"

#include <ATen/ATen.h>

#include <cmath>

#include "../common/inference_scope.h"
#include "../latent/dcp_query.h"
#include "ascend_attn_rt/build_stamp.h"
#include "ascend_attn_rt/comm/comm.h"
#include "ascend_attn_rt/comm/dcp_exchange.h"
#include "ascend_attn_rt/errors.h"
#include "ascend_attn_rt/graph/graph_params.h"
#include "ascend_attn_rt/ops/dense.h"
#include "ascend_attn_rt/sparse/topk_remap.h"
#include "cache_checks.h"
#include "indexer_call.h"
#include "sparse_attention.h"

namespace aar::sfa {

// Named (not anonymous): the unity build puts this file in one translation unit with the other SFA sources.
namespace detail::pieces {

c10::IntArrayRef sizes_of(const at::Tensor& t) { return t.defined() ? t.sizes() : c10::IntArrayRef{}; }

at::ScalarType dtype_of(const at::Tensor& t) { return t.defined() ? t.scalar_type() : at::ScalarType::Undefined; }

bool is_model_dtype(at::ScalarType t) { return t == at::kHalf || t == at::kBFloat16 || t == at::kFloat; }

int64_t kernel_tokens(const Metadata& md) {
  return md.cum_query_lens_list.empty() ? 0 : md.cum_query_lens_list.back();
}

// The metadata of the step: current, at most DCP (PCP and DSA-CP split the step's tokens, which the
// engine's own projections do not), on the caches' device.
void check_metadata(const Metadata& md, const char* what, c10::Device device, const char* device_is) {
  check_current(md.stamp, "metadata");
  if (md.pcp.world_size > 1 || md.dsa_cp.world_size > 1) {
    throw_not_supported(what, " with metadata built for prefill context parallel or DSA-CP (pcp_world_size=",
                        md.pcp.world_size, ", dsa_cp_world_size=", md.dsa_cp.world_size,
                        "): use sfa.Impl, which runs those collectives (docs/design/sparse_cp.md); the pieces take "
                        "DCP metadata");
  }
  AAR_CHECK_ARG(md.block_table.device() == device, "metadata is on ", md.block_table.device(), " but ", device_is,
                " is on ", device);
}

// t itself when contiguous, else a contiguous copy (a provider-covered copy).
at::Tensor contiguous(const at::Tensor& t) {
  if (t.is_contiguous()) return t;
  at::Tensor c = at::empty(t.sizes(), t.options());
  ops::dense::copy(c, t);
  return c;
}

// Inside a capture: the step must be a decode-only (or speculative decode) batch of the bucket's
// kernel tokens, as sfa::Impl's capture takes (docs/design/graph.md §4.3).
void check_capture(const Metadata& md, const graph::GraphParams& g, const char* what) {
  const int64_t n = g.capturing_bucket();
  if ((md.attn_state != plan::AttentionState::DecodeOnly && md.attn_state != plan::AttentionState::SpecDecoding) ||
      kernel_tokens(md) != n) {
    throw_not_supported(what, " graph capture of bucket ", n, " takes DecodeOnly and SpecDecoding batches of ", n,
                        " kernel tokens, got ", plan::to_string(md.attn_state), " with ", kernel_tokens(md));
  }
}

void fill_minus_one(const at::Tensor& t) {
  if (t.numel() > 0 && !ops::dense::no_compute()) t.fill_(-1);
}

}  // namespace detail::pieces

namespace pd = detail::pieces;

IndexerStep::IndexerStep(const IndexerStepConfig& cfg) : cfg_(cfg) {
  AAR_CHECK_ARG(cfg_.topk > 0, "topk must be positive, got ", cfg_.topk);
}

at::Tensor IndexerStep::run(const at::Tensor& k, const at::Tensor& q, const at::Tensor& weights,
                            const at::Tensor& index_cache, const Metadata& md, TopkBuffer& topk_out) {
  AAR_CHECK_ARG(topk_out.index_topk() == cfg_.topk, "topk_out (a TopkBuffer) holds index_topk=",
                topk_out.index_topk(), " indices per token but the step selects topk=", cfg_.topk);
  return run(k, q, weights, index_cache, md, topk_out.buffer());
}

at::Tensor IndexerStep::run(const at::Tensor& k, const at::Tensor& q, const at::Tensor& weights,
                            const at::Tensor& cache, const Metadata& md, const at::Tensor& dst) {
  // --- every check before any write
  AAR_CHECK_ARG(cache.defined() && (cache.dim() == 3 || (cache.dim() == 4 && cache.size(2) == 1)),
                "index_cache must have shape (num_blocks, block_size, head_dim) or (num_blocks, block_size, 1, "
                "head_dim), got ", pd::sizes_of(cache));
  const at::ScalarType dt = cache.scalar_type();
  AAR_CHECK_ARG(pd::is_model_dtype(dt), "index_cache dtype ", dt, " is not float16, bfloat16 or float32 (a quantised "
                "LI C8 indexer cache is not supported by sfa.IndexerStep; sfa.Impl runs LI C8)");
  const c10::Device dev = cache.device();
  pd::check_metadata(md, "sfa.IndexerStep.run", dev, "index_cache");
  const int64_t D = cache.size(-1);
  if (!cache_src_.same(cache) || !cache4_.defined()) {
    cache4_ = cache.dim() == 3 ? cache.unsqueeze(2) : cache;
    rows_ = cache.is_contiguous() ? cache4_.view({-1, D}) : at::Tensor();
    cache_src_.bind(cache);
  }
  // Under DCP the indexer cache is replicated (docs/design/sparse_cp.md §2): num_blocks * W blocks, its own
  // slots and block table; the indexer reads the global lengths (md.seq_lens).
  const bool dcp = md.dcp.world_size > 1;
  detail::check_cache(cache4_, "index_cache", D, md, dt, "its own dtype", dev, dcp ? md.dcp.world_size : 1,
                      "the caches");
  const int64_t tk = pd::kernel_tokens(md);
  AAR_CHECK_ARG(k.defined() && k.dim() == 2 && k.size(1) == D && k.size(0) >= tk,
                "k must have shape (T >= ", tk, " kernel tokens, head_dim=", D, "), got ", pd::sizes_of(k));
  AAR_CHECK_ARG(k.scalar_type() == dt, "k dtype ", k.scalar_type(), " is not index_cache's ", dt,
                " (the key rows are written as given)");
  AAR_CHECK_ARG(q.defined() && q.dim() == 3 && q.size(1) > 0 && q.size(2) == D && q.size(0) >= tk,
                "q must have shape (T >= ", tk, " kernel tokens, n_head, head_dim=", D, "), got ", pd::sizes_of(q));
  AAR_CHECK_ARG(q.scalar_type() == dt || q.scalar_type() == at::kFloat8_e4m3fn, "q dtype ", q.scalar_type(),
                " is neither index_cache's ", dt, " nor float8_e4m3fn");
  const int64_t n_head = q.size(1), T = q.size(0);
  AAR_CHECK_ARG(weights.defined() && weights.dim() == 2 && weights.size(1) == n_head && weights.size(0) >= tk,
                "weights must have shape (T >= ", tk, " kernel tokens, n_head=", n_head, "), got ",
                pd::sizes_of(weights));
  AAR_CHECK_ARG(pd::is_model_dtype(weights.scalar_type()), "weights dtype ", weights.scalar_type(),
                " is not float16, bfloat16 or float32");
  AAR_CHECK_ARG(dst.defined() && dst.dim() == 2 && dst.size(0) >= T && dst.size(1) >= cfg_.topk,
                "topk_out must have shape (rows >= ", T, " (q's tokens), columns >= topk=", cfg_.topk, "), got ",
                pd::sizes_of(dst));
  AAR_CHECK_ARG(dst.scalar_type() == at::kInt, "topk_out dtype ", dst.scalar_type(), " is not int32");
  for (const auto& [t, name] : {std::pair<const at::Tensor*, const char*>{&k, "k"}, {&q, "q"}, {&weights, "weights"},
                                {&dst, "topk_out"}}) {
    AAR_CHECK_ARG(t->device() == dev, name, " is on ", t->device(), " but index_cache is on ", dev);
  }
  // --- the step
  const aar::detail::InferenceScope inference;
  const int64_t K = cfg_.topk;
  const at::Tensor& slot_src = dcp ? md.dcp.indexer_slot_mapping : md.slot_mapping;
  if (tk > 0 && (!slots_src_.same(slot_src) || !slots2_.defined() || slots2_.size(0) != tk)) {
    slots2_ = slot_src.narrow(0, 0, tk).view({tk, 1});
    slots_src_.bind(slot_src);
  }
  // Everything the step reads is held by value: inside a capture it is recorded, and the metadata's
  // tensors are views of the builder's buffers, which every later build refills in place.
  auto step = [this, k, q, weights, dst, dt, tk, T, K, rows = rows_, cache4 = cache4_, slots2 = slots2_,
               cql = md.cum_query_lens, seq = md.seq_lens, bt = dcp ? md.dcp.indexer_block_table : md.block_table]() {
    const aar::detail::InferenceScope inference;
    if (tk > 0) {
      at::Tensor cache_rows = rows;
      detail::write_indexer_keys(cache_rows, slots2, pd::contiguous(k.narrow(0, 0, tk)));
      const at::Tensor qc = pd::contiguous(ops::dense::cast(q.narrow(0, 0, tk), dt));
      const at::Tensor wc = pd::contiguous(ops::dense::cast(weights.narrow(0, 0, tk), dt));
      const at::Tensor idx = detail::lightning_indexer(
          args_, {qc, cache4, wc, cql, seq, bt, K,
                  detail::indexer_library(cfg_.glm_moe_dsa, cfg_.device_kind)});  // (tk, 1, K)
      ops::dense::copy(dst.narrow(0, 0, tk).narrow(1, 0, K), idx.view({tk, K}));
      if (dst.size(1) > K) pd::fill_minus_one(dst.narrow(0, 0, tk).narrow(1, K, dst.size(1) - K));
    }
    if (T > tk) pd::fill_minus_one(dst.narrow(0, tk, T - tk));
  };
  if (graph::GraphParams* g = graph::GraphParams::current()) {
    graph::note_layer_life(life_, "sfa.IndexerStep", -1);  // the recorded step calls this object
    // Inside a capture (vLLM's graph capture through the adapter, docs/design/vllm_sparse.md §6): one
    // prepare call, as sfa::Impl records its layer (docs/design/graph.md §4.3).
    pd::check_capture(md, *g, "sfa.IndexerStep.run");
    g->capture_call(std::make_unique<graph::ClosureCall>(-1, 0, std::move(step)));
    g->note_metadata(0, md.stamp);  // docs/design/graph.md §1.2
  } else {
    step();
  }
  return dst.narrow(0, 0, tk).narrow(1, 0, K).unsqueeze(1);
}

SparseAttention::SparseAttention(double scale) : SparseAttention(SparseAttentionConfig{scale}) {}

SparseAttention::SparseAttention(const SparseAttentionConfig& cfg) : cfg_(cfg) {
  AAR_CHECK_ARG(std::isfinite(cfg.scale) && cfg.scale > 0.0, "scale must be finite and > 0, got ", cfg.scale);
}

SparseAttention::~SparseAttention() = default;

at::Tensor SparseAttention::run(const at::Tensor& qn, const at::Tensor& qr, const at::Tensor& topk,
                                const at::Tensor& nope, const at::Tensor& rope, const Metadata& md,
                                const std::optional<at::Tensor>& out) {
  // --- every check before any write
  AAR_CHECK_ARG(nope.defined() && nope.dim() == 4 && rope.defined() && rope.dim() == 4,
                "nope_cache and rope_cache must be (num_blocks, block_size, 1, width) (the views "
                "mla.LatentAttention.split_kv_cache gives), got ", pd::sizes_of(nope), " and ", pd::sizes_of(rope));
  const at::ScalarType dt = nope.scalar_type();
  AAR_CHECK_ARG(pd::is_model_dtype(dt), "nope_cache dtype ", dt, " is not float16, bfloat16 or float32 (a quantised "
                "SFA C8 cache is not supported by sfa.SparseAttention; sfa.Impl runs SFA C8)");
  const c10::Device dev = nope.device();
  pd::check_metadata(md, "sfa.SparseAttention.run", dev, "nope_cache");
  // The layer's DCP group must be the metadata's (a comm of several ranks with single-rank metadata too).
  cp::check_comm_matches(cfg_.dcp_comm, md.dcp.world_size, md.dcp.rank, "DCP", "dcp_comm", "dcp_world_size");
  const bool dcp = md.dcp.world_size > 1;
  const int64_t L = nope.size(3), R = rope.size(3);
  if (dcp) {
    AAR_CHECK_ARG(L % 8 == 0 && L >= 8 && L <= 512, "nope_cache width (kv_lora_rank) ", L, ": DCP merges the "
                  "latent partials through npu_attention_update, which takes a multiple of 8 in [8, 512]");
  }
  detail::check_cache(nope, "nope_cache", L, md, dt, "its own dtype", dev, 1, "the caches");
  detail::check_cache(rope, "rope_cache", R, md, dt, "nope_cache's dtype", dev, 1, "the caches");
  const int64_t tk = pd::kernel_tokens(md);
  AAR_CHECK_ARG(qn.defined() && qn.dim() == 3 && qn.size(1) > 0 && qn.size(2) == L && qn.size(0) >= tk,
                "ql_nope must have shape (T >= ", tk, " kernel tokens, num_heads, kv_lora_rank=", L, "), got ",
                pd::sizes_of(qn));
  const int64_t T = qn.size(0), N = qn.size(1);
  AAR_CHECK_ARG(qr.defined() && qr.dim() == 3 && qr.size(0) == T && qr.size(1) == N && qr.size(2) == R,
                "q_pe must have shape (", T, ", ", N, ", qk_rope_head_dim=", R, ") like ql_nope, got ",
                pd::sizes_of(qr));
  AAR_CHECK_ARG(qn.scalar_type() == dt && qr.scalar_type() == dt, "ql_nope / q_pe dtypes ", qn.scalar_type(), " / ",
                qr.scalar_type(), " are not the caches' ", dt);
  AAR_CHECK_ARG(topk.defined() && (topk.dim() == 2 || (topk.dim() == 3 && topk.size(1) == 1)) &&
                    topk.size(0) >= tk && topk.size(-1) > 0,
                "topk must have shape (rows >= ", tk, " kernel tokens, K) or (rows, 1, K), got ", pd::sizes_of(topk));
  AAR_CHECK_ARG(topk.scalar_type() == at::kInt, "topk dtype ", topk.scalar_type(), " is not int32");
  if (out.has_value()) {
    const at::Tensor& o = *out;
    AAR_CHECK_ARG(o.defined() && o.dim() == 3 && o.size(0) == T && o.size(1) == N && o.size(2) == L,
                  "out must have shape (", T, ", ", N, ", ", L, ") like ql_nope, got ", pd::sizes_of(o));
    AAR_CHECK_ARG(o.scalar_type() == dt, "out dtype ", o.scalar_type(), " is not the caches' ", dt);
    AAR_CHECK_ARG(o.is_contiguous(), "out must be contiguous, got strides ", o.strides());
    AAR_CHECK_ARG(o.device() == dev, "out is on ", o.device(), " but nope_cache is on ", dev);
  }
  for (const auto& [t, name] : {std::pair<const at::Tensor*, const char*>{&qn, "ql_nope"}, {&qr, "q_pe"},
                                {&topk, "topk"}}) {
    AAR_CHECK_ARG(t->device() == dev, name, " is on ", t->device(), " but nope_cache is on ", dev);
  }
  // --- the step
  const aar::detail::InferenceScope inference;
  graph::GraphParams* g = graph::GraphParams::current();
  if (g != nullptr) {
    pd::check_capture(md, *g, "sfa.SparseAttention.run");
    graph::note_layer_life(life_, "sfa.SparseAttention", -1);  // recorded closures call this object
    g->note_metadata(0, md.stamp);  // its closures read the builder's buffers: docs/design/graph.md §1.2
  }
  if (tk == 0) {
    const at::Tensor res = out.has_value() ? *out : at::empty({T, N, L}, qn.options());
    if (g != nullptr) {
      g->capture_call(std::make_unique<graph::ClosureCall>(-1, 0, [res]() { ops::dense::zero(res); }));
    } else {
      ops::dense::zero(res);
    }
    return res;
  }
  // Everything the operator reads is held by value: inside a capture the call is recorded, and the
  // metadata's tensors are views of the builder's buffers, which every later build refills in place.
  if (dcp) {
    const at::Tensor res = out.has_value() ? *out : at::empty({T, N, L}, qn.options());
    return run_dcp(qn, qr, topk, nope, rope, md, res, tk);
  }
  auto compute = [this, qn, qr, topk, nope, rope, tk, bt = md.block_table, cql = md.cum_query_lens,
                  seq = md.seq_lens]() {
    const aar::detail::InferenceScope inference;
    const at::Tensor q_nope = pd::contiguous(qn.narrow(0, 0, tk));
    const at::Tensor q_rope = pd::contiguous(qr.narrow(0, 0, tk));
    const at::Tensor rows =
        pd::contiguous(topk.dim() == 2 ? topk.narrow(0, 0, tk).unsqueeze(1) : topk.narrow(0, 0, tk));
    return detail::sparse_attention(args_, {q_nope, q_rope, rows, nope, rope, bt, cql, seq, cfg_.scale});  // (tk, N, L)
  };
  if (g == nullptr && !out.has_value() && T == tk) return compute();
  // Inside a capture the result lands in a tensor made now (or the given out), which the recorded
  // call writes at every replay (one prepare call, docs/design/graph.md §4.3).
  const at::Tensor res = out.has_value() ? *out : at::empty({T, N, L}, qn.options());
  auto finish = [compute, res, tk, T]() {
    ops::dense::copy(res.narrow(0, 0, tk), compute());
    if (T > tk) ops::dense::zero(res.narrow(0, tk, T - tk));
  };
  if (g != nullptr) {
    g->capture_call(std::make_unique<graph::ClosureCall>(-1, 0, std::move(finish)));
  } else {
    finish();
  }
  return res;
}

at::Tensor SparseAttention::run_dcp(const at::Tensor& qn, const at::Tensor& qr, const at::Tensor& topk,
                                    const at::Tensor& nope, const at::Tensor& rope, const Metadata& md,
                                    const at::Tensor& res, int64_t tk) {
  // docs/design/sparse_cp.md §5, steps 3-6, without the projections: the query of this rank's heads
  // gathered along the heads over the group, the global top-k rows remapped to this rank's local
  // positions (valid entries first), the W * N heads' sparse attention over the rank's shard with their
  // LSE, the partials exchanged and merged by LSE into this rank's heads, straight into res[:tk].
  cp::Comm* comm = cfg_.dcp_comm;
  const int64_t T = qn.size(0), N = qn.size(1), L = qn.size(2), R = qr.size(2);
  const cp::DcpViews& w = mla::detail::latent_dcp_views(*comm, {N, L, R, cfg_.workspace_group}, qn, tk, dcp_ws_);
  const int32_t world = md.dcp.world_size, rank = md.dcp.rank, interleave = md.dcp.interleave;
  // Held by value (a capture records the closure; the metadata's tensors are the builder's buffers,
  // refilled in place by every later build; the views are the shared DcpWorkspace's).
  auto step = [this, comm, w, qn, qr, topk, nope, rope, res, tk, T, world, rank, interleave,
               bt = md.block_table, cql = md.cum_query_lens, local_seq = md.dcp.seq_lens]() {
    const aar::detail::InferenceScope inference;
    if (tk > 0) {  // every rank holds the same step: tk is the same on every rank (no collective at 0)
      mla::detail::latent_dcp_stage_query(*comm, w, qn.narrow(0, 0, tk), qr.narrow(0, 0, tk));
      const at::Tensor rows = topk.dim() == 2 ? topk.narrow(0, 0, tk).unsqueeze(1) : topk.narrow(0, 0, tk);
      const at::Tensor local = pd::contiguous(sparse::remap_topk_to_dcp_rank(rows, world, rank, interleave));
      const at::Tensor o = detail::sparse_attention_lse(
          dcp_args_, {w.staged_a, w.staged_b, local, nope, rope, bt, cql, local_seq, cfg_.scale}, w.partial_lse);
      ops::dense::copy(w.partial_out, o);
      at::Tensor merged = res.narrow(0, 0, tk);
      cp::combine_partials(*comm, w.partial_out, w.partial_lse, merged, std::nullopt, &w);
    }
    if (T > tk) ops::dense::zero(res.narrow(0, tk, T - tk));
  };
  if (graph::GraphParams* g = graph::GraphParams::current()) {
    // One prepare call whose replay issues the two collectives (every rank replays in the same order).
    g->capture_call(std::make_unique<graph::ClosureCall>(-1, 0, std::move(step)));
  } else {
    step();
  }
  return res;
}

}  // namespace aar::sfa
