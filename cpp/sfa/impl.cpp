// Per-layer SFA forward (docs/design/sfa.md §4).
#include "ascend_attn_rt/sfa/impl.h"

#include <ATen/ATen.h>
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <utility>

#include "../common/rope_gather.h"
#include "../common/kv_cache.h"
#include "../latent/dcp_query.h"
#include "../latent/latent_core.h"
#include "ascend_attn_rt/comm/comm.h"
#include "ascend_attn_rt/sparse/dsa_cp_road.h"
#include "../sparse/dsa_cp_workspace.h"
#include "ascend_attn_rt/sparse/oproj_switch.h"
#include "ascend_attn_rt/sparse/topk_remap.h"
#include "cache_checks.h"
#include "indexer_call.h"
#include "indexer_workspace.h"
#include "offload_layer.h"
#include "sparse_attention.h"
#include "ascend_attn_rt/errors.h"
#include "ascend_attn_rt/graph/graph_params.h"
#include "ascend_attn_rt/sfa/graph.h"
#include "ascend_attn_rt/ops/dense.h"
#include "ascend_attn_rt/ops/fault_injection.h"
#include "ascend_attn_rt/ops/hadamard.h"
#include "ascend_attn_rt/ops/lightning_indexer.h"
#include "ascend_attn_rt/ops/quant.h"
#include "ascend_attn_rt/ops/rotary_mul.h"
#include "ascend_attn_rt/ops/sfa_c8_rows.h"
#include "ascend_attn_rt/ops/sparse_flash_attention.h"
#include "ascend_attn_rt/plan/hadamard.h"
#include "ascend_attn_rt/sfa/backend.h"
#include "../common/impl_checks.h"
#include "../graph/exclusive_scope.h"
#include "../common/inference_scope.h"

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

using detail::set;
using detail::check_cache;
using detail::is_one_byte_cache_dtype;

// What a C8 cache's dtype must be, per device kind (docs/design/sfa.md §2.2), for messages.
const char* c8_dtype_rule(plan::DeviceKind k) {
  return k == plan::DeviceKind::A5 ? "the C8 dtype of device_kind a5; docs/design/sfa.md §2.2: int8 on A2/A3, float8_e4m3fn on A5"
                                   : "the C8 dtype of device_kind a2/a3; docs/design/sfa.md §2.2: int8 on A2/A3, float8_e4m3fn on A5";
}
const char* c8_scale_rule(plan::DeviceKind k) {
  return k == plan::DeviceKind::A5 ? "the LI C8 scale dtype of device_kind a5; docs/design/sfa.md §2.2: fp16 on A2/A3, fp32 on A5"
                                   : "the LI C8 scale dtype of device_kind a2/a3; docs/design/sfa.md §2.2: fp16 on A2/A3, fp32 on A5";
}

}  // namespace

Impl::Impl(const ImplConfig& cfg, const mla::Weights& weights, const std::optional<IndexerWeights>& iw)
    : cfg_(cfg), iw_(iw) {
  const mla::Dims& d = cfg_.dims;
  internal::check_softmax_scale(cfg_.scale);
  if (cfg_.scale == 0.0) cfg_.scale = 1.0 / std::sqrt(static_cast<double>(d.qk_nope_head_dim + d.qk_rope_head_dim));
  AAR_CHECK_ARG(cfg_.indexer.has_value() == iw_.has_value(),
                cfg_.indexer.has_value() ? "the layer has an indexer config but no indexer_weights"
                                         : "indexer_weights were given but the layer has no indexer config");
  AAR_CHECK_ARG(!cfg_.use_index_cache || cfg_.indexer.has_value(),
                "use_index_cache writes the layer's top-k for later layers: it needs an indexer");
  if (cfg_.indexer.has_value()) {
    const IndexerConfig& ic = *cfg_.indexer;
    internal::check_norm_eps(ic.k_norm_eps, "indexer.k_norm_eps");
    // Bounded before the weights' shapes multiply them (INT64_MAX wrapped those; a huge topk allocated
    // its selection only in the forward, after the cache writes).
    AAR_CHECK_ARG(internal::dim_in_range(ic.n_head) && internal::dim_in_range(ic.head_dim) &&
                      internal::dim_in_range(ic.topk),
                  "indexer n_head, head_dim and topk must be in [1, ", internal::kMaxModelDim, "], got ", ic.n_head,
                  ", ", ic.head_dim, ", ", ic.topk);
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
  AAR_CHECK_ARG(!cfg_.li_c8 || cfg_.indexer.has_value(),
                "li_c8 quantises the layer's indexer cache, but the layer has no indexer (it reuses the top-k "
                "buffer and its tuple has no indexer part)");
  if (cfg_.li_c8) {
    const int64_t D = cfg_.indexer->head_dim;
    AAR_CHECK_ARG(plan::is_power_of_two(D) && D <= 4096, "li_c8: the indexer head_dim=", D,
                  " must be a power of two (the Sylvester Hadamard rotation of docs/design/sparse.md §3; DeepSeek-V3.2: 128)");
  }
  if (cfg_.sfa_c8) {
    AAR_CHECK_ARG(d.kv_lora_rank == ops::kSfaC8NopeDim && d.qk_rope_head_dim == ops::kSfaC8RopeDim,
                  "sfa_c8: the packed SFA C8 rows hold kv_lora_rank=", ops::kSfaC8NopeDim, " and qk_rope_head_dim=",
                  ops::kSfaC8RopeDim, " (docs/design/sfa.md §5), got kv_lora_rank=", d.kv_lora_rank, ", qk_rope_head_dim=",
                  d.qk_rope_head_dim);
  }
  // docs/design/sfa.md §6: the offload's configuration checks, before the preprocess (which it forces).
  if (cfg_.offload.has_value()) {
    const OffloadConfig& oc = *cfg_.offload;
    AAR_CHECK_ARG(!cfg_.sfa_c8, "offload: the SFA C8 main cache (sfa_c8=True) cannot be offloaded (docs/design/sfa.md §6: the "
                  "main cache must be BF16; LI C8 is allowed)");
    AAR_CHECK_ARG(!cfg_.preprocess.dsa_cp && cfg_.preprocess.dcp_size <= 1, "offload: context parallel (dsa_cp=",
                  cfg_.preprocess.dsa_cp ? "True" : "False", ", dcp_size=", cfg_.preprocess.dcp_size,
                  ") is not allowed with KV offload (docs/design/sfa.md §6)");
    const at::ScalarType dt = mla::activation_dtype(weights);
    AAR_CHECK_ARG(dt == at::kBFloat16, "offload: the main cache must be bfloat16 (docs/design/sfa.md §6; the host pool holds bf16 "
                  "rows), but the layer's cache dtype (its weights' dtype) is ", dt);
    AAR_CHECK_ARG(oc.is_decode_consumer || oc.keep_device_kv_cache, "offload: is_decode_consumer=False and "
                  "keep_device_kv_cache=False: the offloaded layer must be a PD decode consumer, or keep the device "
                  "KV cache for its prefills (docs/design/sfa.md §6)");
    if (cfg_.indexer.has_value()) {
      AAR_CHECK_ARG(oc.topk_buffer_size >= cfg_.indexer->topk, "offload.topk_buffer_size=", oc.topk_buffer_size,
                    " must be >= index_topk=", cfg_.indexer->topk, " (docs/design/sfa.md §6: every top-k entry needs a resident slot)");
    }
  }
  AAR_CHECK_ARG(!cfg_.preprocess.kv_offload || cfg_.offload.has_value(), "preprocess.kv_offload is set but offload "
                "is not: the layer's KV offload is ImplConfig::offload (the preprocess selection follows it)");
  // docs/design/sfa.md §4.2: the preprocess, once.
  PreprocessConfig pc = cfg_.preprocess;
  pc.kv_offload = cfg_.offload.has_value();
  pc.has_q_lora = d.q_lora_rank.has_value();
  AAR_CHECK_ARG(pc.quant == mla::quant_type(weights), "preprocess quant type \"", mla::to_string(pc.quant),
                "\" differs from the weights' \"", mla::to_string(mla::quant_type(weights)), "\"");
  // The selection's SFA C8 input is the layer's sfa_c8 (one flag, not two that could disagree).
  AAR_CHECK_ARG(!pc.enable_sparse_sfa_c8 || cfg_.sfa_c8, "preprocess.enable_sparse_sfa_c8 is set but sfa_c8 is "
                "not: the layer's SFA C8 is ImplConfig::sfa_c8 (the selection follows it)");
  pc.enable_sparse_sfa_c8 = cfg_.sfa_c8;
  // docs/design/sparse_cp.md §1: the mode from the two switches; the DCP size is the comm's.
  const int64_t dcp_world = cfg_.dcp_comm != nullptr ? cfg_.dcp_comm->size() : 1;
  AAR_CHECK_ARG(pc.dcp_size == 1 || pc.dcp_size == dcp_world, "preprocess.dcp_size=", pc.dcp_size,
                " but the layer's dcp_comm has ", dcp_world, " rank(s): DCP is the dcp_comm's group");
  pc.dcp_size = dcp_world;
  const int64_t dsa_world = cfg_.dsa_cp_comm != nullptr ? cfg_.dsa_cp_comm->size() : 1;
  AAR_CHECK_ARG(!pc.dsa_cp || dsa_world > 1, "preprocess.dsa_cp is set but the layer has no dsa_cp_comm of more "
                "than one rank: DSA-CP is the dsa_cp_comm's group");
  pc.dsa_cp = dsa_world > 1;
  const int64_t pcp_world = cfg_.pcp_comm != nullptr ? cfg_.pcp_comm->size() : 1;
  const CpMode mode = resolve_cp_mode(pc.dsa_cp, pc.dcp_size, pcp_world);
  if (mode == CpMode::Pcp || mode == CpMode::PcpDcp) {
    // docs/design/sparse_cp.md §11: the PCP layer gathers unquantised latent rows (LI C8 quantises the
    // gathered indexer keys on every rank).
    const char* no = cfg_.sfa_c8 ? "sfa_c8" : cfg_.offload.has_value() ? "offload" : nullptr;
    if (no != nullptr) {
      throw_not_supported(no, " with PCP (pcp_comm of ", pcp_world, " ranks) is not implemented "
                          "(docs/design/sparse_cp.md §11)");
    }
    // The merges' limits (W partials of kv_lora_rank), checked before any step.
    for (const int64_t w : {pcp_world, dcp_world}) {
      cp::DcpWorkspaceShape probe;
      probe.world = w;
      probe.heads = d.num_heads;
      probe.q_dim = d.kv_lora_rank + d.qk_rope_head_dim;
      probe.out_dim = d.kv_lora_rank;
      cp::DcpWorkspace check_merge(probe);
    }
  }
  if (mode == CpMode::DsaCp || mode == CpMode::DsaCpDcp) {
    const char* no = cfg_.sfa_c8 ? "sfa_c8" : cfg_.li_c8 ? "li_c8" : cfg_.offload.has_value() ? "offload" : nullptr;
    if (no != nullptr) {
      throw_not_supported(no, " with DSA-CP", mode == CpMode::DsaCpDcp ? " x DCP" : "", " (dsa_cp_comm of ",
                          dsa_world, " ranks) is not implemented: the token-sharded layer gathers and writes "
                          "unquantised rows (docs/design/sparse_cp.md §6)");
    }
  }
  if (mode == CpMode::DsaCpDcp) {
    // docs/design/sparse_cp.md §9: the DCP group is the DSA-CP group, in the same order, so that DCP rank r
    // holds token slice r. The same cp::Comm may be passed for both.
    const cp::Comm& a = *cfg_.dsa_cp_comm;
    const cp::Comm& b = *cfg_.dcp_comm;
    if (a.size() != b.size() || a.rank() != b.rank()) {
      throw_not_supported("DSA-CP x DCP with dsa_cp_comm rank ", a.rank(), " of ", a.size(), " and dcp_comm rank ",
                          b.rank(), " of ", b.size(), ": the DCP group must be the DSA-CP group in the same order "
                          "(docs/design/sparse_cp.md §9)");
    }
    // The merge's limits (npu_attention_update: W partials of kv_lora_rank), checked here rather than
    // inside a step that has already issued its all-gathers.
    cp::DcpWorkspaceShape probe;
    probe.world = a.size();
    probe.heads = d.num_heads;
    probe.q_dim = d.kv_lora_rank + d.qk_rope_head_dim;
    probe.out_dim = d.kv_lora_rank;
    cp::DcpWorkspace check_merge(probe);
  }
  if (mode == CpMode::Dcp) {
    // LI C8 is not refused: its key bytes and scales go to the replicated indexer slots and the
    // quantised indexer reads the replicated view (docs/design/sparse_cp.md §5).
    if (cfg_.sfa_c8) {
      throw_not_supported("sfa_c8 with DCP (dcp_comm of ", dcp_world, " ranks): the KV-quant sparse attention's "
                          "LSE path under DCP is not implemented (docs/design/sparse_cp.md §6)");
    }
    AAR_CHECK_ARG(!cfg_.offload.has_value(), "offload with DCP (dcp_comm of ", dcp_world,
                  " ranks): the KV-offload layer has no context-parallel variant");
  }
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
  lc.sfa_c8_rows = cfg_.sfa_c8;
  lc.workspace_group = cfg_.workspace_group;
  lc.o_proj_shards = dsa_world;
  core_ = std::make_shared<LatentCore>(lc, weights);
  if (dsa_world > 1) oproj_full_ = std::make_unique<sparse::OProjFullWeight>(core_->o_proj_slot(), *cfg_.dsa_cp_comm);
  const at::Tensor& wref = core_->weights().kv_b_proj;  // never quantised
  if (cfg_.sfa_c8) {
    const auto dt = wref.scalar_type();
    AAR_CHECK_ARG(dt == at::kHalf || dt == at::kBFloat16, "sfa_c8: the weights must be float16 or bfloat16 (the "
                  "packed rows keep k_rope in the query's dtype; the KV-quant kernel takes fp16/bf16 queries), got ",
                  dt);
  }
  if (cfg_.sfa_c8) no_rope_ = at::empty({0}, wref.options());  // PROLOG_V3's kr_cache (ckvkr_repo_mode 1)
  if (cfg_.li_c8) {
    const int64_t D = cfg_.indexer->head_dim;
    hadamard_ = ops::hadamard_matrix(D, 1.0 / std::sqrt(static_cast<double>(D)), wref.scalar_type(), wref.device());
  }
  if (cfg_.offload.has_value()) {
    offload_ = std::make_unique<detail::OffloadLayer>(*cfg_.offload, cfg_.layer_index, d.kv_lora_rank,
                                                      d.qk_rope_head_dim, wref.device(),
                                                      /*repeats_decisions=*/!cfg_.indexer.has_value());
  }
  if (cfg_.indexer.has_value()) {
    detail::IndexerShape shape;
    shape.device = wref.device();
    shape.dtype = wref.scalar_type();
    shape.n_head = cfg_.indexer->n_head;
    shape.head_dim = cfg_.indexer->head_dim;
    shape.rope_dim = d.qk_rope_head_dim;
    shape.group = cfg_.workspace_group;
    iws_ = detail::IndexerWorkspace::shared(shape);
  }
  if (dsa_world > 1) {
    // The slice's rows [kv_a | k_indexer] (the raw kv_a rows, normed and rotated by the cache write after
    // the gather; under DSA-CP x DCP the query [ql_nope | q_pe] after them), the road's head blocks
    // (docs/design/sparse_cp.md §7.1, §15).
    sparse::detail::DsaCpShape cs;
    cs.device = wref.device();
    cs.dtype = wref.scalar_type();
    cs.world = dsa_world;
    cs.road_width = d.num_heads * d.v_head_dim;
    cs.pack_cols = {d.kv_lora_rank + d.qk_rope_head_dim};
    if (cfg_.indexer.has_value()) cs.pack_cols.push_back(cfg_.indexer->head_dim);
    if (cfg_.dcp_comm != nullptr) {
      cs.pack_cols.push_back(d.num_heads * d.kv_lora_rank);
      cs.pack_cols.push_back(d.num_heads * d.qk_rope_head_dim);
    }
    cs.group = cfg_.workspace_group;
    // DSA-CP x DCP: the slice's selection padded to the rank's rows before its gather (run_dsa_cp_dcp).
    if (cfg_.dcp_comm != nullptr && cfg_.indexer.has_value()) cs.topk = cfg_.indexer->topk;
    cpws_ = sparse::detail::DsaCpWorkspace::shared(cs);
  }
}

Impl::~Impl() = default;

const detail::OffloadLayer& Impl::offload_layer() const {
  AAR_CHECK_ARG(offload_ != nullptr, "the layer has no KV offload (ImplConfig::offload)");
  return *offload_;
}
const OffloadStepStats& Impl::last_offload_stats() const { return offload_layer().stats(); }
const at::Tensor& Impl::resident_k() const { return offload_layer().buffer_k(); }
const at::Tensor& Impl::resident_v() const { return offload_layer().buffer_v(); }
int64_t Impl::resident_rows() const { return offload_layer().resident_rows(); }
int32_t Impl::resident_token(int32_t row, int32_t slot) const {
  const detail::OffloadLayer& o = offload_layer();
  const plan::ResidentLru& lru = o.lru();
  AAR_CHECK_ARG(row >= 0 && row < lru.max_rows() && slot >= 0 && slot < lru.capacity(), "resident (row, slot)=(",
                row, ", ", slot, ") is out of range [0, ", lru.max_rows(), ") x [0, ", lru.capacity(), ")");
  return o.resident_token(row, slot);
}
void Impl::reset_resident() {
  offload_layer();
  offload_->reset_resident();
}

const at::Tensor& Impl::w_uk_t() const { return core_->w_uk_t(); }
const at::Tensor& Impl::o_proj_weight() const { return core_->weights().o_proj; }
const at::Tensor& Impl::o_proj_full_pool() const {
  AAR_CHECK_ARG(oproj_full_ != nullptr, "the layer has no DSA-CP (dsa_cp_comm): no o_proj full-weight pool");
  return oproj_full_->pool();
}
const at::Tensor& Impl::w_uv() const { return core_->w_uv(); }

void Impl::release_views() {
  seen_ = Seen{};
  li_args_ = ops::LightningIndexerArgs{};
  sfa_args_ = ops::SparseFlashAttentionArgs{};
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
  cp::check_comm_matches(cfg_.pcp_comm, md.pcp.world_size, md.pcp.rank, "PCP", "pcp_comm", "pcp_world_size");
  const bool pcp = md.pcp.world_size > 1;
  if (pcp) {
    AAR_CHECK_ARG(hidden.size(0) == md.pcp.num_local_tokens, "hidden_states has ", hidden.size(0),
                  " rows but this PCP rank's rows are num_local_tokens=", md.pcp.num_local_tokens,
                  " (docs/design/sparse_cp.md §11: the decodes, then every prefill's head and tail chunk)");
  } else {
    AAR_CHECK_ARG(hidden.size(0) >= tk, "hidden_states has ", hidden.size(0), " rows but the metadata's kernels read ",
                  tk, " tokens (num_input_tokens=", md.num_input_tokens, ")");
  }
  AAR_CHECK_ARG(output.defined() && output.sizes() == hidden.sizes() && output.scalar_type() == dtype &&
                    output.device() == dev,
                "output must be a ", dtype, " tensor of shape ", hidden.sizes(), " on ", dev, ", got ",
                output.defined() ? output.sizes() : c10::IntArrayRef{});
  AAR_CHECK_ARG(output.is_contiguous(), "output must be contiguous (o_proj writes it in place), got strides ",
                output.strides());
  internal::check_output_disjoint(output, hidden, "hidden_states");
  // Under PCP the metadata's DCP part is the main cache's shard over the Wp * Wd ranks (docs/design/sparse_cp.md
  // §11); the layer's dcp_comm is checked against the DCP group's part of it (Wd, rd).
  if (md.pcp.world_size <= 1) {
    cp::check_comm_matches(cfg_.dcp_comm, md.dcp.world_size, md.dcp.rank, "DCP", "dcp_comm", "dcp_world_size");
  } else {
    cp::check_comm_matches(cfg_.dcp_comm, md.pcp.dcp_world_size, md.pcp.dcp_rank, "DCP", "dcp_comm",
                           "dcp_world_size");
  }
  cp::check_comm_matches(cfg_.dsa_cp_comm, md.dsa_cp.world_size, md.dsa_cp.rank, "DSA-CP", "dsa_cp_comm",
                         "dsa_cp_world_size");
  // docs/design/sfa.md §2.2: the main part, then the indexer part, per the layer's flags.
  const bool has_idx = cfg_.indexer.has_value();
  const bool sfa_c8 = cfg_.sfa_c8, li_c8 = cfg_.li_c8;
  // KV offload without keep_device_kv_cache: no main cache on the device.
  const bool no_main = offload_ != nullptr && !cfg_.offload->keep_device_kv_cache;
  const size_t n_main = no_main ? 0 : sfa_c8 ? 1 : 2;
  const size_t want = n_main + (has_idx ? (li_c8 ? 2 : 1) : 0);
  if (no_main) {
    AAR_CHECK_ARG(kv.size() == want, "kv_cache of a layer offloaded without keep_device_kv_cache is its indexer part "
                  "only, ", want, " tensors (", has_idx ? "indexer k" : "", li_c8 ? ", indexer scale" : "",
                  "; the main cache lives in the host pool), got ", kv.size());
  } else {
    AAR_CHECK_ARG(kv.size() == want, "kv_cache must be the layer's composed tuple of ", want, " tensors (",
                  sfa_c8 ? "packed" : "latent, rope", has_idx ? ", indexer k" : "", li_c8 ? ", indexer scale" : "",
                  ": compose_kv_cache with sfa_c8=", sfa_c8 ? "True" : "False", ", li_c8=", li_c8 ? "True" : "False",
                  "), got ", kv.size());
  }
  const plan::DeviceKind dk = cfg_.device_kind;
  const at::ScalarType c8 = Backend::c8_dtype(dk);
  constexpr const char* kModelIs = "the weights' dtype";
  Caches c;
  if (no_main) {
    // nothing on the device
  } else if (sfa_c8) {
    c.packed = kv[0];
    check_cache(c.packed, "kv_cache[0] (packed SFA C8)", ops::kSfaC8RowBytes, md, c8, c8_dtype_rule(dk), dev);
  } else {
    c.nope = kv[0];
    c.rope = kv[1];
    check_cache(c.nope, "kv_cache[0] (latent)", d.kv_lora_rank, md, dtype, kModelIs, dev);
    check_cache(c.rope, "kv_cache[1] (rope)", d.qk_rope_head_dim, md, dtype, kModelIs, dev);
    AAR_CHECK_ARG(c.rope.size(0) == c.nope.size(0), "kv_cache[1] (rope) has ", c.rope.size(0),
                  " blocks but kv_cache[0] (latent) has ", c.nope.size(0), " (one rope row per latent row)");
  }
  // The builder's rope tables set the rows' width; a table of another width fails deep in the rope.
  aar::detail::check_rope_rows_width(md.cos, d.qk_rope_head_dim);
  if (has_idx) {
    const char* kn = no_main ? "kv_cache[0] (indexer k)" : sfa_c8 ? "kv_cache[1] (indexer k)" : "kv_cache[2] (indexer k)";
    c.index_k = kv[n_main];
    check_cache(c.index_k, kn, cfg_.indexer->head_dim, md, li_c8 ? c8 : dtype, li_c8 ? c8_dtype_rule(dk) : kModelIs,
                dev, md.dcp.world_size);
    if (li_c8) {
      const char* sn = no_main  ? "kv_cache[1] (indexer scale)"
                       : sfa_c8 ? "kv_cache[2] (indexer scale)"
                                : "kv_cache[3] (indexer scale)";
      c.index_scale = kv[n_main + 1];
      check_cache(c.index_scale, sn, 1, md, dk == plan::DeviceKind::A5 ? at::kFloat : at::kHalf, c8_scale_rule(dk),
                  dev, md.dcp.world_size);
      AAR_CHECK_ARG(c.index_scale.size(0) == c.index_k.size(0), sn, " has ", c.index_scale.size(0),
                    " blocks but ", kn, " has ", c.index_k.size(0), " (one scale per key row)");
    }
  }
  const bool needs_buffer = !has_idx || cfg_.use_index_cache;
  if (needs_buffer) {
    AAR_CHECK_ARG(topk != nullptr, has_idx ? "use_index_cache writes the top-k into the model's TopkBuffer"
                                           : "a layer without an indexer reads the top-k from the model's TopkBuffer",
                  ": topk must be given");
    const int64_t K = has_idx ? cfg_.indexer->topk : topk->index_topk();
    AAR_CHECK_ARG(topk->index_topk() == K, "topk buffer holds ", topk->index_topk(),
                  " indices per token but the layer's indexer selects ", K);
    // Under PCP a step with a prefill keeps the gathered rows of every rank in the buffer
    // (docs/design/sparse_cp.md §11), a decode-only step its tokens' rows (§11.2).
    const bool gathered = pcp && md.num_prefills > 0;
    const int64_t need = gathered ? int64_t{md.pcp.world_size} * md.pcp.num_local_tokens : tk;
    AAR_CHECK_ARG(topk->max_num_tokens() >= need, "topk buffer has ", topk->max_num_tokens(),
                  " rows, fewer than the step's ", need, gathered ? " gathered PCP rows" : " tokens");
    AAR_CHECK_ARG(topk->buffer().device() == dev, "topk buffer is on ", topk->buffer().device(),
                  " but the layer's weights are on ", dev);
  }
  if (offload_ != nullptr) {
    offload_->check(md, has_idx ? cfg_.indexer->topk : topk->index_topk());
    // docs/design/sfa.md §6's table: a step with prefills writes and reads the device cache.
    const bool decode_only = (md.attn_state == plan::AttentionState::DecodeOnly ||
                              md.attn_state == plan::AttentionState::SpecDecoding) &&
                             md.num_prefills == 0 && md.num_decodes > 0;
    AAR_CHECK_ARG(decode_only || tk == 0 || cfg_.offload->keep_device_kv_cache, "a step with prefills (num_prefills=",
                  md.num_prefills, ", num_decodes=", md.num_decodes, ", attn_state=", plan::to_string(md.attn_state),
                  ") needs offload.keep_device_kv_cache=True: only decode-only steps run without the device KV "
                  "cache (docs/design/sfa.md §6)");
  }
  // Memory shared between the tuple's tensors, the output and the top-k buffer, after each tensor's
  // own checks (which name a wrong tuple more precisely).
  internal::TupleApart apart;
  if (topk != nullptr) {  // the model's top-k buffer: written by one layer, read by later ones
    apart.topk_buffer = &topk->buffer();
    apart.hidden = &hidden;
  }
  internal::check_tuple_disjoint(kv, output, apart);
  return c;
}

void Impl::indexer_rope_(const at::Tensor& head, const at::Tensor& cos, const at::Tensor& sin) {
  // RoPE on the first R dims of each indexer head (docs/design/sparse.md §2), in place:
  // `head` is the (tk, 1, heads, R) view of those dims (BSND with S = 1, the
  // angles BS1D); the rotated values are written back over them, the rest of
  // the head stays.
  const int64_t R = cfg_.dims.qk_rope_head_dim;
  at::Tensor rot;
  if (!cfg_.indexer->glm_moe_dsa) {
    // neox halves: the MLA tables' rows are [c | c], [s | s], exactly the
    // 'half' rotation's operands.
    rot = ops::rotary_mul(head, cos, sin, "half");
  } else {
    // GLM-MoE-DSA: pairs (2i, 2i+1). The 'interleave' rotation takes the
    // angles repeated per pair: [c0, c0, c1, c1, ...] from the halves table.
    const at::Tensor ci = cos.narrow(-1, 0, R / 2).repeat_interleave(2, -1);
    const at::Tensor si = sin.narrow(-1, 0, R / 2).repeat_interleave(2, -1);
    rot = ops::rotary_mul(head, ci, si, "interleave");
  }
  ops::dense::copy(head, rot);
}

at::Tensor Impl::indexer_topk(const at::Tensor& x, const at::Tensor& q_c, const Caches& c, const Metadata& md,
                              int64_t tk) {
  // docs/design/sparse.md §4 / docs/design/sfa.md §4.3: keys (LayerNorm, RoPE) written into the indexer cache at
  // the step's full slot mapping, weights, queries (RoPE), then the indexer.
  // The intermediates live in the shared indexer workspace and every view of
  // the step's tensors is cached: a steady-state call makes none.
  const IndexerConfig& ic = *cfg_.indexer;
  const IndexerWeights& w = *iw_;
  const int64_t D = ic.head_dim, R = cfg_.dims.qk_rope_head_dim;
  const detail::IndexerViews& v = iws_->views(tk);
  // (tk, 1, 1, R): the rotation's BS1D operands for the (tk, 1, heads, R) heads.
  const at::Tensor& cos = LatentCore::view_of(md.cos, tk, seen_.cos_src, seen_.cos4,
                                              [&] { return md.cos.narrow(0, 0, tk).view({tk, 1, 1, R}); });
  const at::Tensor& sin = LatentCore::view_of(md.sin, tk, seen_.sin_src, seen_.sin4,
                                              [&] { return md.sin.narrow(0, 0, tk).view({tk, 1, 1, R}); });
  // Under DCP the indexer cache (with LI C8: keys and scales) is replicated: its own slots and block table
  // (docs/design/sparse_cp.md §2, §5).
  const bool dcp = md.dcp.world_size > 1;
  const at::Tensor& idx_slots = dcp ? md.dcp.indexer_slot_mapping : md.slot_mapping;
  const at::Tensor& idx_table = dcp ? md.dcp.indexer_block_table : md.block_table;
  const at::Tensor& slots = LatentCore::view_of(idx_slots, tk, seen_.slots_src, seen_.slots2,
                                                [&] { return idx_slots.narrow(0, 0, tk).view({tk, 1}); });
  if (cfg_.li_c8) {
    indexer_keys_(v, x, cos, sin);
    ops::dense::linear_out(v.w, x, w.weights_proj);     // (tk, n_head)
    ops::dense::linear_out(v.q, q_c, w.wq_b);
    indexer_rope_(v.q_head, cos, sin);                  // q: (tk, n_head, D)
    const at::Tensor& rows = LatentCore::view_of(c.index_k, c.index_k.size(0) * c.index_k.size(1), seen_.idx_src,
                                                 seen_.idx_rows, [&] { return c.index_k.view({-1, D}); });
    at::Tensor rows_w = rows;
    return quant_indexer_topk(v.k, v.q3, v.w, c, md, rows_w, slots);
  }
  indexer_keys_(v, x, cos, sin);
  // The indexer cache as rows of D (a view of the validated contiguous cache).
  const at::Tensor& rows = LatentCore::view_of(c.index_k, c.index_k.size(0) * c.index_k.size(1), seen_.idx_src, seen_.idx_rows,
                                               [&] { return c.index_k.view({-1, D}); });
  at::Tensor rows_w = rows;
  detail::write_indexer_keys(rows_w, slots, v.k);
  return indexer_select_(v, x, q_c, cos, sin, c, md.cum_query_lens, md.seq_lens, idx_table);
}

void Impl::indexer_keys_(const detail::IndexerViews& v, const at::Tensor& x, const at::Tensor& cos4,
                         const at::Tensor& sin4) {
  const IndexerWeights& w = *iw_;
  ops::dense::linear_out(v.k, x, w.wk);
  ops::dense::layer_norm_out(v.k, v.k, w.k_norm_weight, w.k_norm_bias, cfg_.indexer->k_norm_eps);
  indexer_rope_(v.k_head, cos4, sin4);  // k: (tk, D)
}

at::Tensor Impl::indexer_select_(const detail::IndexerViews& v, const at::Tensor& x, const at::Tensor& q_c,
                                 const at::Tensor& cos4, const at::Tensor& sin4, const Caches& c,
                                 const at::Tensor& cum_query_lens, const at::Tensor& seq_lens,
                                 const at::Tensor& block_table) {
  const IndexerConfig& ic = *cfg_.indexer;
  const IndexerWeights& w = *iw_;
  ops::dense::linear_out(v.w, x, w.weights_proj);     // (tk, n_head)
  ops::dense::linear_out(v.q, q_c, w.wq_b);
  indexer_rope_(v.q_head, cos4, sin4);                // q: (tk, n_head, D)
  if (cfg_.li_c8) return quant_indexer_select_(v.q3, v.w, c, cum_query_lens, seq_lens, block_table);  // PCP
  // The operator's arguments persist between calls: only what changed is assigned.
  return detail::lightning_indexer(li_args_, {v.q3, c.index_k, v.w, cum_query_lens, seq_lens, block_table, ic.topk,
                                              detail::indexer_library(ic.glm_moe_dsa, cfg_.device_kind)});
}

at::Tensor Impl::quant_indexer_topk(const at::Tensor& k, const at::Tensor& q, const at::Tensor& weights,
                                    const Caches& c, const Metadata& md, at::Tensor& k_rows, const at::Tensor& slots) {
  // docs/design/sparse.md §4 / docs/design/sfa.md §4.3, LI C8: the Hadamard rotation (after RoPE), per-token key
  // and per-(token, head) query quantisation, the key bytes and scales written
  // at the full slot mapping, then the quantised indexer.
  quant_indexer_write_(k, c, k_rows, slots);
  return quant_indexer_select_(q, weights, c, md.cum_query_lens, md.seq_lens,
                               md.dcp.world_size > 1 ? md.dcp.indexer_block_table : md.block_table);
}

void Impl::quant_indexer_write_(const at::Tensor& k, const Caches& c, at::Tensor& k_rows, const at::Tensor& slots) {
  // LI C8 keys (tk, D): rotated, quantised per token, bytes and scales written at `slots` (tk, 1).
  const int64_t tk = k.size(0);
  const bool a5 = cfg_.device_kind == plan::DeviceKind::A5;
  const at::ScalarType scale_dtype = c.index_scale.scalar_type();  // fp16 (A2/A3) / fp32 (A5), validated
  ops::DynamicQuantArgs qa;
  // npu_dynamic_quant's dst_type: None = int8 (A2/A3), float8_e4m3fn on A5.
  if (a5) qa.dst_type = static_cast<int64_t>(c.index_k.scalar_type());
  qa.input = ops::hadamard_rotate(k, hadamard_);                    // (tk, D)
  const auto [k_q, k_scale] = ops::dynamic_quant(qa);              // (tk, D), (tk) fp32
  const at::Tensor& scale_rows =
      LatentCore::view_of(c.index_scale, c.index_scale.size(0) * c.index_scale.size(1), seen_.scale_src, seen_.scale_rows,
                          [&] { return c.index_scale.view({-1, 1}); });
  at::Tensor scale_w = scale_rows;
  ops::scatter_nd_update_(k_rows, slots, k_q);
  ops::scatter_nd_update_(scale_w, slots, ops::dense::cast(k_scale, scale_dtype).view({tk, 1}));
}

at::Tensor Impl::quant_indexer_select_(const at::Tensor& q, const at::Tensor& weights, const Caches& c,
                                       const at::Tensor& cum_query_lens, const at::Tensor& seq_lens,
                                       const at::Tensor& block_table) {
  // LI C8 queries (tk, n_head, D): rotated, quantised per (token, head), then the quantised indexer.
  const IndexerConfig& ic = *cfg_.indexer;
  const bool a5 = cfg_.device_kind == plan::DeviceKind::A5;
  const at::ScalarType scale_dtype = c.index_scale.scalar_type();
  ops::DynamicQuantArgs qa;
  if (a5) qa.dst_type = static_cast<int64_t>(c.index_k.scalar_type());
  qa.input = ops::hadamard_rotate(q, hadamard_);                    // (tk, n_head, D)
  const auto [q_q, q_scale] = ops::dynamic_quant(qa);              // (tk, n_head, D), (tk, n_head) fp32
  ops::QuantLightningIndexerArgs a;
  ops::LightningIndexerArgs& b = a.base;
  b.query = q_q;
  b.key = c.index_k;
  b.weights = ops::dense::cast(weights, at::kHalf);  // docs/design/sparse.md §4: fp16 weights in the C8 path
  b.actual_seq_lengths_query = cum_query_lens;
  b.actual_seq_lengths_key = seq_lens;
  b.block_table = block_table;
  b.layout_query = "TND";
  b.layout_key = "PA_BSND";
  b.sparse_count = ic.topk;
  b.sparse_mode = 3;
  // The A3 operator takes fp16 dequant scales, A5's fp16 or fp32: the scale cache's dtype.
  a.query_dequant_scale = ops::dense::cast(q_scale, scale_dtype);
  a.key_dequant_scale = c.index_scale.squeeze(2);  // (nb, bs, 1)
  a.query_quant_mode = 0;
  a.key_quant_mode = 0;
  // docs/design/sfa.md §4.3: A2/A3 vllm-ascend's npu_lightning_indexer_quant, A5 torch_npu's npu_quant_lightning_indexer.
  return ops::quant_lightning_indexer(a, a5 ? ops::OpLibrary::TorchNpu : ops::OpLibrary::VllmAscend);
}

void Impl::store_packed_rows(const at::Tensor& k_nope, const at::Tensor& k_rope, const Caches& c, const Metadata& md,
                             int64_t tk) {
  // docs/design/sfa.md §5 / §4.1: block-quantised k_nope, the rope bytes and the
  // scale bytes in one 656-byte row per token, cache.view(-1, 656)[slot] = row
  // (slot -1 skipped by the scatter).
  const at::Tensor packed = ops::pack_sfa_c8_rows(k_nope, k_rope.view({tk, cfg_.dims.qk_rope_head_dim}),
                                                  c.packed.scalar_type());
  const at::Tensor& rows = LatentCore::view_of(c.packed, c.packed.size(0) * c.packed.size(1), seen_.packed_src, seen_.packed_rows,
                                               [&] { return c.packed.view({-1, ops::kSfaC8RowBytes}); });
  at::Tensor rows_w = rows;
  const at::Tensor& slots = LatentCore::view_of(md.slot_mapping, tk, seen_.slots_src, seen_.slots2,
                                                [&] { return md.slot_mapping.narrow(0, 0, tk).view({tk, 1}); });
  ops::scatter_nd_update_(rows_w, slots, packed);
}

at::Tensor Impl::sparse_attention(const at::Tensor& qn, const at::Tensor& qr, const at::Tensor& topk, const Caches& c,
                                  const Metadata& md) {
  // docs/design/sfa.md §4.1: routed by the main cache's dtype (validated against sfa_c8).
  if (is_one_byte_cache_dtype(c.packed.defined() ? c.packed.scalar_type() : c.nope.scalar_type())) {
    ops::KvQuantSparseFlashAttentionArgs a;
    a.query = ops::dense::cat_last(qn, qr);  // (tk, H, L + R) = [ql_nope | q_pe]
    a.key = c.packed;
    a.value = c.packed;
    a.sparse_indices = topk;
    a.scale_value = cfg_.scale;
    a.key_quant_mode = 2;
    a.value_quant_mode = 2;
    a.block_table = md.block_table;
    a.actual_seq_lengths_query = md.cum_query_lens;
    a.actual_seq_lengths_kv = md.seq_lens;
    a.sparse_block_size = 1;
    a.layout_query = "TND";
    a.layout_kv = "PA_BSND";
    a.sparse_mode = 3;
    a.attention_mode = 2;
    a.quant_scale_repo_mode = 1;
    a.tile_size = ops::kSfaC8Tile;
    a.rope_head_dim = cfg_.dims.qk_rope_head_dim;
    // vllm-ascend's operator on A2/A3, torch_npu's on A5 (which returns no LSE; none is asked for here).
    const ops::OpLibrary lib =
        cfg_.device_kind == plan::DeviceKind::A5 ? ops::OpLibrary::TorchNpu : ops::OpLibrary::VllmAscend;
    return std::get<0>(ops::kv_quant_sparse_flash_attention(a, lib));
  }
  return detail::sparse_attention(sfa_args_, {qn, qr, topk, c.nope, c.rope, md.block_table, md.cum_query_lens,
                                               md.seq_lens, cfg_.scale});
}

const at::Tensor& Impl::dcp_sparse_attention(const at::Tensor& qn, const at::Tensor& qr, const at::Tensor& topk,
                                             const Caches& c, const Metadata& md, int64_t tk, at::Tensor& merged) {
  // docs/design/sparse_cp.md §5: every rank holds the step's tokens and this rank's heads; the
  // KV of a request is spread over the group, the indexer saw all of it (replicated).
  cp::Comm& comm = *cfg_.dcp_comm;
  const mla::Dims& d = cfg_.dims;
  const int64_t L = d.kv_lora_rank, R = d.qk_rope_head_dim;
  const cp::DcpViews& w =
      mla::detail::latent_dcp_views(comm, {d.num_heads, L, R, cfg_.workspace_group}, qn, tk, dcp_ws_);
  mla::detail::latent_dcp_stage_query(comm, w, qn, qr);  // (tk, W*H, L + R) gathered, then split
  // The selection in this rank's local positions, valid entries first (the kernel's scan
  // stops at the first -1); sparse_mode 0 with the local lengths: the indexer already
  // applied causality in global positions.
  const at::Tensor local_topk = sparse::remap_topk_to_dcp_rank(topk, md.dcp.world_size, md.dcp.rank,
                                                               md.dcp.interleave);
  const at::Tensor o = sparse_attention_lse(w.staged_a, w.staged_b, local_topk, c, md.block_table,
                                            md.cum_query_lens, md.dcp.seq_lens, w.partial_lse);
  ops::dense::copy(w.partial_out, o);
  // Merged straight into the kept (tk H, L) rows of `merged` (run's decode-workspace view).
  if (merged.is_same(seen_.merged)) {
    cp::combine_partials(comm, w, seen_.merged_rows);
  } else {
    cp::combine_partials(comm, w.partial_out, w.partial_lse, merged, std::nullopt, &w);
  }
  return merged;
}

const at::Tensor& Impl::pcp_decode_attention(const at::Tensor& qn, const at::Tensor& qr, const at::Tensor& topk,
                                             const Caches& c, const Metadata& md, int64_t tk, at::Tensor& merged) {
  // docs/design/sparse_cp.md §11.2: every PCP rank holds the step's decode rows; the main cache is sharded
  // over the W = Wp Wd PCP x DCP ranks (md.dcp: this rank's local table, lengths and shard). The rank's
  // partial over its shard goes into the (tk, H, L + 1) fp32 wire [out | LSE] (under PCP x DCP first merged
  // over the DCP group, whose ranks hold the same rows and their own heads), then ONE all-gather of the wire
  // over PCP and the shared wire merge (cp::pcp_gather_merge_rows, as MLA PCP's decode).
  const mla::Dims& d = cfg_.dims;
  const int64_t H = d.num_heads, L = d.kv_lora_rank, R = d.qk_rope_head_dim;
  const DcpMetadata& dm = md.dcp;
  const at::Tensor local_topk = sparse::remap_topk_to_dcp_rank(topk, dm.world_size, dm.rank, dm.interleave);
  // The wire [out | LSE] (tk, H, L + 1) fp32 and its all-gather over PCP: the shared PCP merge workspace
  // (cp::pcp_wire_views, as MLA PCP's decode; grown to the largest step, its views made once per row count).
  const cp::DcpViews& pw =
      cp::pcp_wire_views(*cfg_.pcp_comm, H, L, qn.device(), cfg_.workspace_group, tk, pcp_wire_ws_);
  if (md.pcp.dcp_world_size > 1) {
    cp::Comm& dc = *cfg_.dcp_comm;
    const cp::DcpViews& w = mla::detail::latent_dcp_views(dc, {H, L, R, cfg_.workspace_group}, qn, tk, dcp_ws_);
    mla::detail::latent_dcp_stage_query(dc, w, qn, qr);  // (tk, Wd H, L + R) gathered, then split
    const at::Tensor o = sparse_attention_lse(w.staged_a, w.staged_b, local_topk, c, md.block_table,
                                              md.cum_query_lens, dm.seq_lens, w.partial_lse);
    ops::dense::copy(w.partial_out, o);
    cp::combine_partials(*cfg_.dcp_comm, w, pw.wire_out_rows, pw.wire_lse_rows);  // into the wire's rows
  } else {
    const at::Tensor o = sparse_attention_lse(qn, qr, local_topk, c, md.block_table, md.cum_query_lens,
                                              dm.seq_lens, pw.wire_lse);
    ops::dense::copy(pw.wire_out, o);
  }
  // One all-gather of the wire over PCP, the Wp blocks merged into `merged` (its kept rows when it is the
  // decode workspace's, as the caller passes it).
  if (merged.is_same(seen_.merged)) {
    cp::pcp_gather_merge_rows(*cfg_.pcp_comm, pw, seen_.merged_rows);
  } else {
    cp::pcp_gather_merge(*cfg_.pcp_comm, pw, merged);
  }
  return merged;
}

at::Tensor Impl::sparse_attention_lse(const at::Tensor& qn, const at::Tensor& qr, const at::Tensor& local_topk,
                                      const Caches& c, const at::Tensor& block_table, const at::Tensor& cum_query_lens,
                                      const at::Tensor& local_seq_lens, const at::Tensor& lse_out) {
  // docs/design/sparse_cp.md §3, §5: the selection in this rank's local positions, valid entries first
  // (the kernel's scan stops at the first -1), over the main cache's local blocks and lengths.
  return detail::sparse_attention_lse(
      dcp_sfa_args_, {qn, qr, local_topk, c.nope, c.rope, block_table, cum_query_lens, local_seq_lens, cfg_.scale},
      lse_out);
}

const at::Tensor& Impl::select_topk(const at::Tensor& x, const mla::detail::LatentQuery& q, const Caches& c,
                                    const Metadata& md, TopkBuffer* topk, int64_t tk) {
  // Top-k: this layer's indexer, or the selection an earlier layer left.
  if (cfg_.indexer.has_value()) {
    // q_c: the native path's normed q-LoRA activations, or what the fused
    // operator returned (query_norm / inner_out); x without q-LoRA.
    // A W8A8-dynamic PROLOG_V3 (SFA C8) returns q_c as int8 with per-token
    // scales: dequantised for the indexer's unquantised wq_b (upstream's
    // quant matmul with a W8A8 wq_b computes the same product up to the
    // weight's quantisation).
    const at::Tensor q_c = q.qc_scale.defined() ? ops::dense::dequant_rows(q.qc, q.qc_scale, x.scalar_type())
                           : q.qc.defined()      ? q.qc
                                                 : x;
    last_topk_rows_ = indexer_topk(x, q_c, c, md, tk);
    if (cfg_.use_index_cache) last_topk_rows_ = topk->store(last_topk_rows_);
    last_topk_ = TopkSource::Indexer;
  } else {
    last_topk_rows_ = topk->view(tk);
    last_topk_ = TopkSource::Reused;
  }
  return last_topk_rows_;
}

void Impl::run_offload(const at::Tensor& hidden, const Caches& c, const Metadata& md, TopkBuffer* topk,
                       const at::Tensor& output, int64_t tk) {
  // docs/design/sfa.md §6's table. The batch is decode-first (the builder checked): the
  // md.num_decode_tokens leading tokens take the resident path.
  const int64_t rows = hidden.size(0), ndt = md.num_decode_tokens, R = cfg_.dims.qk_rope_head_dim;
  const at::Tensor x = rows == tk ? hidden : hidden.narrow(0, 0, tk);
  const mla::detail::DecodeViews& v = core_->views(tk, mla::detail::DecodeLayout::TND);
  mla::detail::LatentStep s;
  s.x = x;
  s.cos = md.cos;
  s.sin = md.sin;
  s.slots = md.slot_mapping;
  last_pre_ = Preprocess::Native;  // forced (docs/design/sfa.md §6)
  OffloadStepStats& st = offload_->stats();
  st = OffloadStepStats{};
  const bool decode_only = md.num_prefills == 0 && ndt > 0 &&
                           (md.attn_state == plan::AttentionState::DecodeOnly ||
                            md.attn_state == plan::AttentionState::SpecDecoding);
  mla::detail::LatentQuery q;
  if (decode_only) {
    // The latent and rope rows without a device cache write, committed to the pool.
    mla::detail::LatentKv kv;
    q = core_->preprocess_unwritten(v, s, kv);
    offload_->commit(kv.k_nope, kv.k_rope.view({tk, R}), md);
  } else {
    // keep_device_kv_cache (validated): the device caches as without offload,
    // then their new rows device -> host.
    q = core_->preprocess(v, s, c.nope, c.rope, mla::detail::Fused::None, /*stable=*/false);
    const at::Tensor slots = md.slot_mapping.narrow(0, 0, md.num_actual_tokens);
    offload_->commit(c.nope.view({-1, cfg_.dims.kv_lora_rank}).index_select(0, slots),
                     c.rope.view({-1, R}).index_select(0, slots), md);
  }
  const at::Tensor& topk_rows = select_topk(x, q, c, md, topk, tk);
  st.route = decode_only ? OffloadStepStats::Route::DecodeOnly : OffloadStepStats::Route::WithPrefills;
  at::Tensor dec, attn;
  if (ndt > 0) {
    dec = offload_->attend(q.qn.narrow(0, 0, ndt), q.qr.narrow(0, 0, ndt), topk_rows.narrow(0, 0, ndt), md,
                           cfg_.scale);
  }
  if (ndt == tk) {
    attn = dec;
  } else if (decode_only) {
    attn = at::cat({dec, at::zeros({tk - ndt, dec.size(1), dec.size(2)}, dec.options())});
  } else {
    // The prefills on the device cache, their lengths rebased (docs/design/sfa.md §6).
    const OffloadMetadata& o = md.offload;
    const int64_t np = tk - ndt;
    st.prefill_tokens = np;
    const at::Tensor pre = detail::sparse_attention(
        sfa_args_, {q.qn.narrow(0, ndt, np), q.qr.narrow(0, ndt, np), topk_rows.narrow(0, ndt, np), c.nope, c.rope,
                    o.prefill_block_table, o.prefill_cum_query_lens, o.prefill_seq_lens, cfg_.scale});
    attn = ndt > 0 ? at::cat({dec, pre}) : pre;
  }
  const at::Tensor& y = core_->w_uv_out_token_major(v, attn, tk);  // (tk, H*V)
  if (rows == tk) {
    ops::dense::linear_out(output, y, core_->weights().o_proj);
  } else {
    ops::dense::linear_out(output.narrow(0, 0, tk), y, core_->weights().o_proj);
    ops::dense::zero(output.narrow(0, tk, rows - tk));
  }
}

void Impl::capture_offload(graph::GraphParams& g, const at::Tensor& hidden, const Caches& c, const Metadata& md,
                           TopkBuffer* topk, const at::Tensor& output, int64_t tk) {
  // docs/design/sfa.md §6.6: (1) the device work up to the top-k, staged for the host; (2) a host callback
  // (commit, mask, LRU, the misses' copies, the slots); (3) the resident attention, W_UV and o_proj.
  const int64_t bucket = g.capturing_bucket();
  if (!g.provider().supports_host_callbacks()) {
    throw_not_supported("SFA KV-offload graph capture records a host callback (docs/design/sfa.md §6.6), which the '",
                        g.provider().name(), "' graph provider cannot launch: give it launch_host_func (torch_npu: "
                        "npu._launch_host_func), or use the recording provider on the CPU");
  }
  const bool decode_only = (md.attn_state == plan::AttentionState::DecodeOnly ||
                            md.attn_state == plan::AttentionState::SpecDecoding) &&
                           md.num_prefills == 0 && md.num_decodes > 0;
  if (!decode_only) {
    throw_not_supported("SFA KV-offload graph capture takes decode-only steps (docs/design/sfa.md §6.6: a step "
                        "with prefills reads the device cache and runs eagerly), got num_prefills=", md.num_prefills,
                        ", num_decodes=", md.num_decodes, ", attn_state=", plan::to_string(md.attn_state));
  }
  AAR_CHECK_ARG(hidden.size(0) == bucket && tk == bucket, "SFA KV-offload graph capture of bucket ", bucket,
                " needs hidden_states of that many rows, all kernel tokens (graph_decode_padding), got ",
                hidden.size(0), " rows and ", tk, " kernel tokens");
  const int64_t K = cfg_.indexer.has_value() ? cfg_.indexer->topk : topk->index_topk();
  const int64_t R = cfg_.dims.qk_rope_head_dim;
  std::shared_ptr<detail::OffloadGraphStep> gs = offload_->capture_state(g, md, tk, K);
  const int64_t layer = cfg_.layer_index;
  // (1) Every tensor it reads is at a stable address (the builder's buffers, the caches, the workspaces);
  // `md_at_capture`'s views are the builder's, refilled in place by each build.
  g.capture_call(std::make_unique<graph::ClosureCall>(
      layer, 0, [this, gs, hidden, c, md_at_capture = md, topk, tk, R]() {
        // A CPU replay runs this work at once on the builder's buffers: a build after the update would
        // give it the next step's, refused before anything runs. (On a device the builder's copies into
        // them are stream-ordered after the replay; the host callback reads the update's snapshot,
        // docs/design/sfa.md §6.7.) Not at capture: a device provider runs this once then.
        if (gs->has_step) {
          check_current(gs->stamp, "the SFA metadata of the bucket's last update (rebuilt since: update with the new "
                        "build before the replay)");
        }
        const mla::detail::DecodeViews& v = core_->views(tk, mla::detail::DecodeLayout::TND);
        mla::detail::LatentStep s;
        s.x = hidden;
        s.cos = md_at_capture.cos;
        s.sin = md_at_capture.sin;
        s.slots = md_at_capture.slot_mapping;
        last_pre_ = Preprocess::Native;  // forced (docs/design/sfa.md §6)
        mla::detail::LatentKv kv;
        const mla::detail::LatentQuery q = core_->preprocess_unwritten(v, s, kv);
        const at::Tensor& rows = select_topk(hidden, q, c, md_at_capture, topk, tk);
        gs->qn = q.qn;
        gs->qr = q.qr;
        offload_->stage(*gs, kv.k_nope, kv.k_rope.view({tk, R}), rows);
      }));
  // (2) The step's host inputs come with each update (sfa::graph_step_params).
  g.capture_call(std::make_unique<graph::HostCallbackCall>(
      layer, 0, [this, gs]() { offload_->host_step(*gs); },
      [this, gs](const graph::StepParams& step, int64_t b, const graph::UpdatePass& pass) {
        const Metadata* m = step.backend_metadata_as<Metadata>();
        AAR_CHECK_ARG(m != nullptr, "the update of bucket ", b, " needs the step's sfa Metadata (sfa::graph_step_params): "
                      "layer ", cfg_.layer_index, " is a captured SFA KV-offload layer whose host callback reads it");
        offload_->check_step(*gs, *m, b, pass);
      },
      [gs](const graph::StepParams& step, const graph::UpdatePass& pass) {
        detail::OffloadLayer::take_step(*gs, *step.backend_metadata_as<Metadata>(), pass);  // a snapshot (§6.7)
      }));
  // (3) Over the bucket's rows: the padding rows' slots are all -1, their attention rows zero.
  g.capture_call(std::make_unique<graph::ClosureCall>(layer, 0, [this, gs, output, tk]() {
    const mla::detail::DecodeViews& v = core_->views(tk, mla::detail::DecodeLayout::TND);
    const at::Tensor attn = offload_->attend_resident(*gs, cfg_.scale);
    const at::Tensor& y = core_->w_uv_out_token_major(v, attn, tk);  // (tk, H*V)
    ops::dense::linear_out(output, y, core_->weights().o_proj);
  }));
}

graph::StepParams graph_step_params(const Metadata& md) {
  graph::StepParams sp;
  sp.block_tables = md.block_table;
  sp.q_ends = md.cum_query_lens_list;
  sp.kv_lens = md.seq_lens_list;
  sp.num_reqs = md.num_kernel_reqs;
  sp.num_real_reqs = md.num_reqs;
  sp.num_kernel_tokens = md.cum_query_lens_list.empty() ? 0 : md.cum_query_lens_list.back();
  sp.num_input_tokens = md.num_input_tokens;
  sp.stamp = md.stamp;
  sp.set_backend_metadata(md);
  return sp;
}

void Impl::write_gathered_rows_(const Caches& c, const at::Tensor& rows, const at::Tensor& slots,
                                const at::Tensor& islots) {
  // docs/design/sparse_cp.md §7, §9, §11: gathered rows [k_rope | k_nope | k_indexer] (n, R + L + Di[+ ...]);
  // their column blocks made contiguous for the scatters.
  const mla::Dims& d = cfg_.dims;
  const int64_t L = d.kv_lora_rank, R = d.qk_rope_head_dim;
  const bool has_idx = cfg_.indexer.has_value();
  write_rows_(c, ops::dense::contiguous(rows.narrow(1, 0, R)), ops::dense::contiguous(rows.narrow(1, R, L)),
              has_idx ? ops::dense::contiguous(rows.narrow(1, R + L, cfg_.indexer->head_dim)) : at::Tensor(), slots,
              islots);
}

void Impl::write_rows_(const Caches& c, const at::Tensor& k_rope, const at::Tensor& k_nope, const at::Tensor& k_idx,
                       const at::Tensor& slots, const at::Tensor& islots) {
  // The latent rows at `slots` (-1: another rank's position under DCP / PCP), the indexer rows at
  // `islots` (every row: the replicated or the whole cache), LI C8 rows quantised per token first.
  // Every row given is written: the slot tensors may be longer.
  const mla::Dims& d = cfg_.dims;
  // The caches as rows and the slots as (n, 1): views kept from the last step while the caches and the
  // builder's slot buffers are the same tensors (a view made per call is host work on every layer).
  const int64_t n = k_rope.size(0), L = d.kv_lora_rank, R = d.qk_rope_head_dim;
  const int64_t cache_rows = c.nope.size(0) * c.nope.size(1);
  at::Tensor nope_rows = LatentCore::view_of(c.nope, cache_rows, seen_.nope_src, seen_.nope,
                                             [&] { return c.nope.view({-1, L}); });
  at::Tensor rope_rows = LatentCore::view_of(c.rope, c.rope.size(0) * c.rope.size(1), seen_.rope_src, seen_.rope,
                                             [&] { return c.rope.view({-1, R}); });
  const auto slot_rows = [n](const at::Tensor& t) { return ::aar::detail::first_rows(t, n).view({n, 1}); };
  const at::Tensor& s = LatentCore::view_of(slots, n, seen_.wr_slots_src, seen_.wr_slots, [&] { return slot_rows(slots); });
  ops::scatter_nd_update_(rope_rows, s, k_rope);
  ops::scatter_nd_update_(nope_rows, s, k_nope);
  if (!cfg_.indexer.has_value()) return;
  write_indexer_rows_(c, k_idx, islots.is_same(slots) ? s : islots);
}

void Impl::write_indexer_rows_(const Caches& c, const at::Tensor& k_idx, const at::Tensor& islots) {
  // The indexer rows k_idx (n, Di) at islots (every row: the replicated or the whole cache; a (n, 1) view is
  // taken as it is, a longer slot tensor through the kept (n, 1) view), LI C8 rows quantised per token first.
  const int64_t n = k_idx.size(0);
  const auto slot_rows = [n](const at::Tensor& t) { return ::aar::detail::first_rows(t, n).view({n, 1}); };
  const at::Tensor& is = islots.dim() == 2 ? islots
                         : LatentCore::view_of(islots, n, seen_.wr_islots_src, seen_.wr_islots,
                                               [&] { return slot_rows(islots); });
  const int64_t Di = cfg_.indexer->head_dim;
  // The same (rows, Di) view indexer_topk keeps.
  at::Tensor idx_rows = LatentCore::view_of(c.index_k, c.index_k.size(0) * c.index_k.size(1), seen_.idx_src,
                                            seen_.idx_rows, [&] { return c.index_k.view({-1, Di}); });
  if (cfg_.li_c8) {
    // Every rank quantises every gathered key (per token: the single-rank bytes) and writes its replica.
    quant_indexer_write_(k_idx, c, idx_rows, is);
  } else {
    ops::scatter_nd_update_(idx_rows, is, k_idx);
  }
}

const at::Tensor& Impl::staged_rows_(const at::Tensor& staged, int64_t n) {
  // The first n rows of a staged column block (the gathered indexer keys), kept while the block and n repeat.
  return LatentCore::view_of(staged, n, seen_.gidx_src, seen_.gidx,
                             [&] { return ::aar::detail::first_rows(staged, n); });
}

void Impl::write_gathered_kv_(const Caches& c, const at::Tensor& kv_rows, const Metadata& md, int64_t n) {
  // docs/design/sparse_cp.md §15: the step's first n gathered raw kv_a rows (token order, contiguous)
  // normed, rotated and written at the step's slots in one npu_kv_rmsnorm_rope_cache, as the single-rank
  // preprocess writes them; every view kept while the step's tensors and n repeat.
  const int64_t LR = kv_rows.size(1), R = cfg_.dims.qk_rope_head_dim;
  const at::Tensor& kv4 = LatentCore::view_of(kv_rows, n, seen_.gkv_src, seen_.gkv4,
                                              [&] { return kv_rows.narrow(0, 0, n).view({n, 1, 1, LR}); });
  const at::Tensor& cos = LatentCore::view_of(md.cos, n, seen_.gcos_src, seen_.gcos4,
                                              [&] { return md.cos.narrow(0, 0, n).view({n, 1, 1, R}); });
  const at::Tensor& sin = LatentCore::view_of(md.sin, n, seen_.gsin_src, seen_.gsin4,
                                              [&] { return md.sin.narrow(0, 0, n).view({n, 1, 1, R}); });
  const at::Tensor& slots = LatentCore::view_of(md.slot_mapping, n, seen_.gslots_src, seen_.gslots, [&] {
    return ::aar::detail::first_rows(md.slot_mapping, n);
  });
  core_->write_kv_rows(kv4, cos, sin, slots, c.nope, c.rope);
}

// The preprocess of a DSA-CP rank's token slice (docs/design/sparse_cp.md §7 step 1, §9 step 1): nothing
// written; the rows every rank gathers, packed token-major into `pack` (tpr rows, zeros past the slice's
// real tokens): [kv_a | k_indexer] (the raw kv_a rows: the cache write norms and rotates them, §15) and,
// under DSA-CP x DCP, the query [ql_nope | q_pe] of every head after them.
struct Impl::DsaCpSlice {
  const sparse::detail::DsaCpViews* views = nullptr;  // its pack is the rows every rank gathers
  mla::detail::LatentQuery q;
  const detail::IndexerViews* iv = nullptr;  // layers with an indexer, nloc > 0
  // nloc > 0: the slice's hidden rows and its RoPE rows (n, 1, 1, R), held by the caller or the layer
  // (pointers: no reference count taken per call).
  const at::Tensor* xl = nullptr;
  const at::Tensor* cos4 = nullptr;
  const at::Tensor* sin4 = nullptr;
  int64_t nloc = 0;
};

void Impl::dsa_cp_slice(const at::Tensor& hidden, const DsaCpMetadata& sh, bool with_query, DsaCpSlice& s) {
  const mla::Dims& d = cfg_.dims;
  const int64_t tpr = sh.tokens_per_rank, nloc = sh.local_end - sh.local_start;
  const int64_t L = d.kv_lora_rank, R = d.qk_rope_head_dim, N = d.num_heads;
  const bool has_idx = cfg_.indexer.has_value();
  const int64_t Di = has_idx ? cfg_.indexer->head_dim : 0;
  const int64_t width = R + L + Di + (with_query ? N * (L + R) : 0);
  s.nloc = nloc;
  // The workspace's (tpr, width) rows: every column of the real rows is written below, the padding
  // rows are zeroed.
  const sparse::detail::DsaCpViews& pv = cpws_->views(tpr, nloc);
  AAR_CHECK_ARG(pv.pack.size(1) == width, "DSA-CP slice of ", width, " columns in a workspace of ", pv.pack.size(1));
  s.views = &pv;
  if (nloc < tpr) ops::dense::zero(pv.pack_pad);
  if (nloc == 0) return;
  // The slice's rows of the hidden states: a view kept while the caller passes the same tensor and the
  // slice's start and length are the last step's.
  if (nloc == hidden.size(0)) {
    s.xl = &hidden;
  } else {
    if (!seen_.xl_src.same(hidden) || seen_.xl_start != sh.local_start || !seen_.xl.defined() ||
        seen_.xl.size(0) != nloc) {
      seen_.xl = ::aar::detail::leading_rows(hidden, sh.local_start, nloc);
      seen_.xl_src.bind(hidden);
      seen_.xl_start = sh.local_start;
    }
    s.xl = &seen_.xl;
  }
  const mla::detail::DecodeViews& v = core_->views(nloc, mla::detail::DecodeLayout::TND);
  mla::detail::LatentStep st;
  st.x = *s.xl;
  st.cos = nloc == tpr ? sh.cos : sh.cos.narrow(0, 0, nloc);
  st.sin = nloc == tpr ? sh.sin : sh.sin.narrow(0, 0, nloc);
  s.q = core_->preprocess_query(v, st);
  ops::dense::copy(pv.pack_cols[0], v.kv_raw);  // the raw kv_a rows (§15)
  if (has_idx) {
    s.iv = &iws_->views(nloc);
    s.cos4 = &LatentCore::view_of(st.cos, nloc, seen_.cos_src, seen_.cos4,
                                 [&] { return st.cos.view({nloc, 1, 1, R}); });
    s.sin4 = &LatentCore::view_of(st.sin, nloc, seen_.sin_src, seen_.sin4,
                                 [&] { return st.sin.view({nloc, 1, 1, R}); });
    indexer_keys_(*s.iv, *s.xl, *s.cos4, *s.sin4);
    ops::dense::copy(pv.pack_cols[1], s.iv->k);
  }
  if (with_query) {
    const size_t qc = has_idx ? 2 : 1;
    const at::Tensor& a = pv.pack_cols[qc];
    const at::Tensor& b = pv.pack_cols[qc + 1];
    ops::dense::copy(LatentCore::view_of(a, nloc, seen_.pack_qn_src, seen_.pack_qn, [&] { return a.view({nloc, N, L}); }),
                     s.q.qn);
    ops::dense::copy(LatentCore::view_of(b, nloc, seen_.pack_qr_src, seen_.pack_qr, [&] { return b.view({nloc, N, R}); }),
                     s.q.qr);
  }
}

void Impl::dsa_cp_output(const at::Tensor& y_local, int64_t nloc, const Metadata& md, const at::Tensor& output,
                         int64_t tk) {
  // docs/design/sparse_cp.md §7 step 4: from this rank's slice `y_local` (nloc, N V) back to the whole
  // step's tokens, by one of the two roads; every rank issues the same collectives.
  cp::Comm& comm = *cfg_.dsa_cp_comm;
  const mla::Dims& d = cfg_.dims;
  const int64_t W = comm.size(), tpr = md.dsa_cp.tokens_per_rank, N = d.num_heads, V = d.v_head_dim;
  const bool decode_state = md.attn_state == plan::AttentionState::DecodeOnly ||
                            md.attn_state == plan::AttentionState::SpecDecoding;
  const bool full_road = !decode_state && cfg_.dsa_cp_full_o_proj_prefill;
  // The slice padded to tpr rows, in the layout of its road (sparse/dsa_cp_road.h); the o_proj reads
  // the layer's handle at call time, the shard or, under the switch, the full weights.
  const sparse::DsaCpRows& r = cpws_->road_rows(tpr, nloc, full_road);
  if (nloc > 0) {
    ops::dense::copy(r.real, LatentCore::view_of(y_local, nloc, seen_.y_road_src, seen_.y_road,
                                                 [&] { return y_local.view({nloc, W, N * V / W}); }));
  }
  const auto o_proj = [this](const at::Tensor& x) { return ops::dense::linear(x, core_->weights().o_proj); };
  const auto o_proj_shard = [this](const at::Tensor& x, const at::Tensor& out) {
    if (!out.defined()) return ops::dense::linear(x, core_->weights().o_proj);
    ops::dense::linear_out(out, x, core_->weights().o_proj);
    return out;
  };
  sparse::dsa_cp_road_back(comm, r, oproj_full_.get(), o_proj, o_proj_shard, output, tk);
}

void Impl::run_dsa_cp(const at::Tensor& hidden, const Caches& c, const Metadata& md, TopkBuffer* topk,
                      const at::Tensor& output, int64_t tk) {
  // docs/design/sparse_cp.md §7. Every rank holds the whole step's hidden states and computes every
  // head for its token shard [local_start, local_end); the padding rows of its shard (up to
  // tokens_per_rank) take part in the collectives as zeros. Every collective below is issued by
  // every rank in the same order, whatever its shard holds.
  cp::Comm& comm = *cfg_.dsa_cp_comm;
  const DsaCpMetadata& sh = md.dsa_cp;
  const bool has_idx = cfg_.indexer.has_value();
  const auto opts = hidden.options();
  last_pre_ = Preprocess::Native;  // DSA-CP: the native path (docs/design/sfa.md §4.2's table)
  // 1. This rank's tokens: the latent query, the latent and rope key rows and the indexer key,
  //    none written yet.
  DsaCpSlice s;
  dsa_cp_slice(hidden, sh, /*with_query=*/false, s);
  const int64_t nloc = s.nloc;
  // 2. Every rank's rows gathered (token order) and written for the whole step: every rank keeps
  //    complete caches.
  const sparse::detail::DsaCpViews& pv = *s.views;
  comm.all_gather(pv.pack, 0, pv.gathered);  // (T_pad, L + R + Di)
  const int64_t tw = std::min<int64_t>(tk, md.slot_mapping.size(0));
  // The gathered column blocks made contiguous in the workspace, then the rows of the step's tokens
  // written (§15: the latent and rope rows by one fused write).
  const size_t ncols = has_idx ? 2 : 1;
  for (size_t i = 0; i < ncols; ++i) ops::dense::copy(pv.staged_cols[i], pv.gathered_cols[i]);
  write_gathered_kv_(c, pv.staged_cols[0], md, tw);
  if (has_idx) write_indexer_rows_(c, staged_rows_(pv.staged_cols[1], tw), md.slot_mapping);
  // 3. Top-k and sparse attention of this rank's tokens with its local lengths.
  at::Tensor y_local;  // (nloc, N * V)
  if (nloc > 0) {
    if (has_idx) {
      const at::Tensor& q_c = s.q.qc.defined() ? s.q.qc : *s.xl;
      last_topk_rows_ = indexer_select_(*s.iv, *s.xl, q_c, *s.cos4, *s.sin4, c, sh.cum_query_lens, sh.seq_lens,
                                        md.block_table);
      if (cfg_.use_index_cache) last_topk_rows_ = topk->store(last_topk_rows_);
      last_topk_ = TopkSource::Indexer;
    } else {
      last_topk_rows_ = topk->view(nloc);
      last_topk_ = TopkSource::Reused;
    }
    const at::Tensor attn = detail::sparse_attention(
        sfa_args_, {s.q.qn, s.q.qr, last_topk_rows_, c.nope, c.rope, md.block_table, sh.cum_query_lens, sh.seq_lens,
                    cfg_.scale});  // (nloc, N, L)
    const mla::detail::DecodeViews& v = core_->views(nloc, mla::detail::DecodeLayout::TND);
    y_local = core_->w_uv_out_token_major(v, attn, nloc);
  } else {
    last_topk_rows_ = at::empty({0, 1, has_idx ? cfg_.indexer->topk : topk->index_topk()}, opts.dtype(at::kInt));
    last_topk_ = has_idx ? TopkSource::Indexer : TopkSource::Reused;
  }
  // 4. Back to the whole step's tokens.
  dsa_cp_output(y_local, nloc, md, output, tk);
}

const cp::DcpViews& Impl::merge_views_(std::shared_ptr<cp::DcpWorkspace>& slot, cp::Comm& comm, int64_t heads,
                                      int64_t rows, at::ScalarType dtype) {
  cp::DcpWorkspaceShape sh;
  sh.device = core_->weights().kv_b_proj.device();
  sh.q_dtype = sh.out_dtype = dtype;
  sh.world = comm.size();
  sh.heads = heads;
  sh.q_dim = 0;  // merge only
  sh.out_dim = cfg_.dims.kv_lora_rank;
  sh.comm = &comm;
  sh.workspace_group = cfg_.workspace_group;
  if (!slot || !(slot->shape() == sh)) slot = cp::DcpWorkspace::shared(sh);
  return slot->views(rows);
}

at::Tensor& Impl::merged_rows_(int64_t rows, at::ScalarType dtype) {
  // The merged rows of a token-block merge (DSA-CP x DCP, PCP): (1, rows N, L) and seen_.cp_merged3
  // (rows, N, L). In the decode workspace's attention buffer when the dtype is the model's (the SFA
  // kernels' outputs leave it unused; W_UV reads the merge from it into another buffer), made once per
  // row count; a fp32 merge (PCP x DCP) gets a tensor of its own.
  const int64_t N = cfg_.dims.num_heads, L = cfg_.dims.kv_lora_rank;
  const mla::detail::DecodeViews& v = core_->views(rows, mla::detail::DecodeLayout::TND);
  if (v.attn.scalar_type() != dtype) {
    seen_.cp_merged = at::empty({1, rows * N, L}, v.attn.options().dtype(dtype));
    seen_.cp_merged3 = seen_.cp_merged.view({rows, N, L});
    seen_.cp_merged2 = seen_.cp_merged.view({rows * N, L});
    seen_.cp_merged_src = ::aar::detail::TensorBinding();
    seen_.cp_merged_rows = -1;
    return seen_.cp_merged;
  }
  if (!seen_.cp_merged_src.same(v.attn) || seen_.cp_merged_rows != rows) {
    seen_.cp_merged3 = v.attn.view({-1}).narrow(0, 0, rows * N * L).view({rows, N, L});
    seen_.cp_merged = seen_.cp_merged3.view({1, rows * N, L});
    seen_.cp_merged2 = seen_.cp_merged3.view({rows * N, L});
    seen_.cp_merged_src.bind(v.attn);
    seen_.cp_merged_rows = rows;
  }
  return seen_.cp_merged;
}

void Impl::run_dsa_cp_dcp(const at::Tensor& hidden, const Caches& c, const Metadata& md, TopkBuffer* topk,
                          const at::Tensor& output, int64_t tk) {
  // docs/design/sparse_cp.md §9: tokens sharded over the group (DSA-CP) and the main KV cache sharded
  // over the same group (DCP, the indexer cache replicated). Every collective goes through
  // dsa_cp_comm (the DCP group is the same group, checked at construction) and is issued by every rank
  // in the same order, whatever its slice holds.
  cp::Comm& comm = *cfg_.dsa_cp_comm;
  const DsaCpMetadata& sh = md.dsa_cp;
  const DcpMetadata& dm = md.dcp;
  const mla::Dims& d = cfg_.dims;
  const int64_t tpr = sh.tokens_per_rank, Tp = sh.num_tokens_pad;
  const int64_t L = d.kv_lora_rank, R = d.qk_rope_head_dim, N = d.num_heads;
  const bool has_idx = cfg_.indexer.has_value();
  last_pre_ = Preprocess::Native;
  // 1. The slice's rows and query, nothing written.
  DsaCpSlice s;
  dsa_cp_slice(hidden, sh, /*with_query=*/true, s);
  const int64_t nloc = s.nloc;
  // 2. One gather of [kv_a | k_indexer | ql_nope | q_pe] along the tokens; this rank's latent
  //    rows at its DCP-local slots (-1 elsewhere), every indexer row at its replicated slot.
  const sparse::detail::DsaCpViews& pv = *s.views;
  comm.all_gather(pv.pack, 0, pv.gathered);  // (T_pad, L + R + Di + N (L + R))
  const int64_t tw = std::min<int64_t>(tk, md.slot_mapping.size(0));
  // Every column block made contiguous in the workspace (the scatters' rows, the query halves).
  for (const at::Tensor* v = pv.staged_cols.data(), *g = pv.gathered_cols.data();
       v != pv.staged_cols.data() + pv.staged_cols.size(); ++v, ++g) {
    ops::dense::copy(*v, *g);
  }
  // The same without a reference count when t has n rows (the usual step): the narrow goes to `held`.
  const auto rows_of = [](const at::Tensor& t, int64_t n, at::Tensor& held) -> const at::Tensor& {
    if (t.size(0) == n) return t;
    held = t.narrow(0, 0, n);
    return held;
  };
  const size_t qc = has_idx ? 2 : 1;  // the query's first column block
  write_gathered_kv_(c, pv.staged_cols[0], md, tw);
  if (has_idx) {
    write_indexer_rows_(c, staged_rows_(pv.staged_cols[1], tw), dm.indexer_slot_mapping);
  }
  // 3. The slice's selection on the replicated view (global positions), padded with -1 rows to tpr and
  //    gathered: every rank holds every token's rows, the single-rank selection.
  // (tk, 1, K): the shared buffer's kept view, or the gathered rows when the buffer is not kept (pointers
  // to tensors that outlive the call: no reference count per step).
  const at::Tensor* topk_all = nullptr;
  at::Tensor gathered_topk;
  if (has_idx) {
    // The slice workspace's (tpr, 1, K) rows (no allocation per call): the selection overwrites rows
    // [0, nloc), the padding rows are set to -1.
    const at::Tensor& mine = pv.topk;
    if (nloc < tpr) ops::dense::fill(pv.topk_pad, -1);
    if (nloc > 0) {
      const at::Tensor& q_c = s.q.qc.defined() ? s.q.qc : *s.xl;
      ops::dense::copy(pv.topk_real, indexer_select_(*s.iv, *s.xl, q_c, *s.cos4, *s.sin4, c, sh.cum_query_lens,
                                                     sh.seq_lens, dm.indexer_block_table));
    }
    // Gathered straight into the shared buffer when it is kept (its first T_pad rows: no copy after).
    const bool keep = cfg_.use_index_cache && Tp <= topk->max_num_tokens();
    if (keep) {
      // The step's rows are the buffer's kept view of tk rows (no narrow per call).
      comm.all_gather(mine, 0, topk->view(Tp));
      topk_all = &topk->view(tk);
    } else {
      gathered_topk = comm.all_gather(mine, 0).narrow(0, 0, tk);
      topk_all = &gathered_topk;
    }
    if (cfg_.use_index_cache) topk_all = &topk->store(*topk_all);
    last_topk_ = TopkSource::Indexer;
  } else {
    topk_all = &topk->view(tk);
    last_topk_ = TopkSource::Reused;
  }
  if (!last_topk_rows_.is_same(*topk_all)) last_topk_rows_ = *topk_all;
  // 4. Every head of every token of the step over this rank's shard: the selection in local positions,
  //    sparse_mode 0 with the local lengths (§3), with the LSE.
  const at::Tensor local_topk = sparse::remap_topk_to_dcp_rank(*topk_all, dm.world_size, dm.rank, dm.interleave);
  const at::Tensor& sa = pv.staged_cols[qc];
  const at::Tensor& sb = pv.staged_cols[qc + 1];
  const at::Tensor& qn = LatentCore::view_of(sa, tk, seen_.staged_qn_src, seen_.staged_qn,
                                             [&] { return ::aar::detail::first_rows(sa, tk).view({tk, N, L}); });
  const at::Tensor& qr = LatentCore::view_of(sb, tk, seen_.staged_qr_src, seen_.staged_qr,
                                             [&] { return ::aar::detail::first_rows(sb, tk).view({tk, N, R}); });
  // 5. The partials padded to T_pad (zeros, LSE -inf in the padding) and exchanged along the tokens: on
  //    the (1, T_pad N, L) view the head-block exchange of combine_partials is the token-block exchange
  //    (block r of the rows is slice r); this rank merges the W partials of its own slice.
  const cp::DcpViews& mw = merge_views_(merge_ws_, comm, tpr * N, 1, hidden.scalar_type());
  const at::Tensor& part = LatentCore::view_of(mw.partial_out, Tp, seen_.part_src, seen_.part,
                                               [&] { return mw.partial_out.view({Tp, N, L}); });
  const at::Tensor& part_lse = LatentCore::view_of(mw.partial_lse, Tp, seen_.part_lse_src, seen_.part_lse,
                                                   [&] { return mw.partial_lse.view({Tp, N, 1}); });
  at::Tensor held_lse, held_part;
  const at::Tensor o = sparse_attention_lse(qn, qr, local_topk, c, md.block_table, md.cum_query_lens, dm.seq_lens,
                                            rows_of(part_lse, tk, held_lse));
  ops::dense::copy(rows_of(part, tk, held_part), o);
  if (tk < Tp) {
    ops::dense::zero(part.narrow(0, tk, Tp - tk));
    ops::dense::fill(part_lse.narrow(0, tk, Tp - tk), -std::numeric_limits<double>::infinity());
  }
  merged_rows_(tpr, o.scalar_type());  // (1, tpr N, L), kept as (tpr N, L)
  cp::combine_partials(comm, mw, seen_.cp_merged2);
  // 6. W_UV of the slice, then back to the whole step's tokens (§7).
  at::Tensor y_local;
  if (nloc > 0) {
    const mla::detail::DecodeViews& v = core_->views(nloc, mla::detail::DecodeLayout::TND);
    at::Tensor held_merged;
    const at::Tensor attn = ops::dense::cast(rows_of(seen_.cp_merged3, nloc, held_merged), hidden.scalar_type());
    y_local = core_->w_uv_out_token_major(v, attn, nloc);
  }
  dsa_cp_output(y_local, nloc, md, output, tk);
}

void Impl::run_pcp(const at::Tensor& hidden, const Caches& c, const Metadata& md, TopkBuffer* topk,
                   const at::Tensor& output, int64_t tk) {
  // docs/design/sparse_cp.md §11. This rank holds its T_loc rows (decodes, then its head and tail chunk
  // of every prefill); the main cache is sharded over the PCP x DCP ranks as under DCP (md.dcp), the
  // indexer cache replicated. Every collective is issued by every rank in the same order (every rank has the
  // same T_loc, and T_loc > 0 whenever the step has a token).
  cp::Comm& comm = *cfg_.pcp_comm;
  const PcpMetadata& pm = md.pcp;
  const DcpMetadata& dm = md.dcp;
  const mla::Dims& d = cfg_.dims;
  const int64_t tl = pm.num_local_tokens, G = int64_t{pm.world_size} * tl;
  const int64_t L = d.kv_lora_rank, R = d.qk_rope_head_dim, N = d.num_heads;
  const bool has_idx = cfg_.indexer.has_value();
  const int64_t Di = has_idx ? cfg_.indexer->head_dim : 0;
  const int64_t K = has_idx ? cfg_.indexer->topk : topk->index_topk();
  const auto opts = hidden.options();
  last_pre_ = Preprocess::Native;  // the rows are written after the gather
  // 1. The local rows' query of every head, latent/rope key rows and indexer key, nothing written.
  const int64_t qoff = R + L + Di;
  at::Tensor pack = ops::dense::zeros({tl, qoff + N * (L + R)}, opts);
  mla::detail::LatentQuery q;
  const detail::IndexerViews* iv = nullptr;
  at::Tensor cos4, sin4;
  if (tl > 0) {
    const mla::detail::DecodeViews& v = core_->views(tl, mla::detail::DecodeLayout::TND);
    mla::detail::LatentStep st;
    st.x = hidden;
    st.cos = pm.cos;
    st.sin = pm.sin;
    mla::detail::LatentKv kv;
    q = core_->preprocess_unwritten(v, st, kv);
    ops::dense::copy(pack.narrow(1, 0, R), kv.k_rope.view({tl, R}));
    ops::dense::copy(pack.narrow(1, R, L), kv.k_nope);
    if (has_idx) {
      iv = &iws_->views(tl);
      cos4 = pm.cos.view({tl, 1, 1, R});
      sin4 = pm.sin.view({tl, 1, 1, R});
      indexer_keys_(*iv, hidden, cos4, sin4);
      ops::dense::copy(pack.narrow(1, R + L, Di), iv->k);
    }
    ops::dense::copy(pack.narrow(1, qoff, N * L).view({tl, N, L}), q.qn);
    ops::dense::copy(pack.narrow(1, qoff + N * L, N * R).view({tl, N, R}), q.qr);
  }
  // 2. Every rank's rows (rank-major), the step's rows picked in global token order and written: latent
  //    rows at this rank's local slots (-1 where another rank owns the position), indexer rows at the
  //    replicated slots.
  const at::Tensor all = comm.all_gather(pack, 0);  // (Wp T_loc, width)
  const at::Tensor rows = ops::dense::index_select(all, 0, pm.gather_index);  // (tk, width)
  write_gathered_rows_(c, rows, md.slot_mapping, dm.indexer_slot_mapping);
  // 3. The local rows' selection on the replicated view, one causal indexer request per chunk (global
  //    positions), all-gathered: every rank holds every gathered row's selection.
  at::Tensor topk_all;  // (Wp T_loc, 1, K)
  if (has_idx) {
    at::Tensor mine = ops::dense::full({tl, 1, K}, -1, opts.dtype(at::kInt));
    if (tl > 0) {
      const at::Tensor q_c = q.qc.defined() ? q.qc : hidden;
      ops::dense::copy(mine, indexer_select_(*iv, hidden, q_c, cos4, sin4, c, pm.indexer_cum_query_lens,
                                             pm.indexer_seq_lens, pm.indexer_block_table));
    }
    // Gathered straight into the shared buffer when it is kept (no copy after).
    const bool keep = cfg_.use_index_cache && G <= topk->max_num_tokens();
    topk_all = keep ? comm.all_gather(mine, 0, topk->view(G)) : comm.all_gather(mine, 0);
    if (cfg_.use_index_cache) topk_all = topk->store(topk_all);
    last_topk_ = TopkSource::Indexer;
  } else {
    topk_all = topk->view(G);
    last_topk_ = TopkSource::Reused;
  }
  last_topk_rows_ = topk_all;
  // 4. Every gathered query over this rank's shard: the selection in local positions, sparse_mode 0 with
  //    the local lengths of each (rank, request) group, with the LSE.
  //    PCP x DCP: the queries gathered along the heads over the DCP group first (every DCP rank holds the
  //    same rows and its own heads), W_d N heads per row.
  const at::Tensor local_topk = sparse::remap_topk_to_dcp_rank(topk_all, dm.world_size, dm.rank, dm.interleave);
  const int64_t Wd = pm.dcp_world_size;
  const at::Tensor q_rows = all.narrow(1, qoff, N * (L + R));
  at::Tensor qn = ops::dense::contiguous(q_rows.narrow(1, 0, N * L)).view({G, N, L});
  at::Tensor qr = ops::dense::contiguous(q_rows.narrow(1, N * L, N * R)).view({G, N, R});
  if (Wd > 1) {
    const at::Tensor q_all = cp::gather_query_heads(*cfg_.dcp_comm, ops::dense::cat_last(qn, qr));  // (G, Wd N, L + R)
    qn = ops::dense::contiguous(q_all.narrow(2, 0, L));
    qr = ops::dense::contiguous(q_all.narrow(2, L, R));
  }
  // The partials go straight into the merges' workspaces: the PCP merge's (Wp T_loc rows of N heads; fp32
  // after a DCP merge), and under PCP x DCP first the DCP merge's (W_d N heads per row).
  const cp::DcpViews& pw = merge_views_(merge_ws_, comm, tl * N, 1, Wd > 1 ? at::kFloat : hidden.scalar_type());
  const at::Tensor& p_out = LatentCore::view_of(pw.partial_out, G, seen_.part_src, seen_.part,
                                                [&] { return pw.partial_out.view({G, N, L}); });
  const at::Tensor& p_lse = LatentCore::view_of(pw.partial_lse, G, seen_.part_lse_src, seen_.part_lse,
                                                [&] { return pw.partial_lse.view({G, N, 1}); });
  if (Wd > 1) {
    // The DCP partials of this rank's heads merged (with their LSE), then the PCP merge below.
    const cp::DcpViews& dw = merge_views_(merge_ws2_, *cfg_.dcp_comm, N, G, hidden.scalar_type());
    const at::Tensor o = sparse_attention_lse(qn, qr, local_topk, c, pm.gathered_block_table,
                                              pm.gathered_cum_query_lens, pm.gathered_seq_lens, dw.partial_lse);
    ops::dense::copy(dw.partial_out, o);
    at::Tensor out = p_out;
    cp::combine_partials(*cfg_.dcp_comm, dw.partial_out, dw.partial_lse, out, p_lse, &dw);
  } else {
    const at::Tensor o = sparse_attention_lse(qn, qr, local_topk, c, pm.gathered_block_table,
                                              pm.gathered_cum_query_lens, pm.gathered_seq_lens, p_lse);
    ops::dense::copy(p_out, o);
  }
  // 5. Block r of the gathered rows is rank r's: combine_partials' head-block exchange on the
  //    (1, Wp T_loc N, L) view hands each rank the Wp partials of its own rows and merges them.
  merged_rows_(tl, p_out.scalar_type());  // (1, tl N, L), kept as (tl N, L)
  cp::combine_partials(comm, pw, seen_.cp_merged2);
  // 6. W_UV and o_proj on the local rows.
  if (tl == 0) return;
  const mla::detail::DecodeViews& v = core_->views(tl, mla::detail::DecodeLayout::TND);
  const at::Tensor attn = ops::dense::cast(seen_.cp_merged3, hidden.scalar_type());
  const at::Tensor& y = core_->w_uv_out_token_major(v, attn, tl);  // (T_loc, N V)
  ops::dense::linear_out(output, y, core_->weights().o_proj);
}

void Impl::run(const at::Tensor& hidden, const Caches& c, const Metadata& md, TopkBuffer* topk,
               const at::Tensor& output, int64_t tk, bool stable) {
  const int64_t rows = hidden.size(0);
  if (tk == 0) {
    // (Rank-independent: tk is the step's, so under DSA-CP every rank skips its collectives alike.)
    ops::dense::zero(output);
    last_topk_ = TopkSource::None;
    if (offload_ != nullptr) offload_->stats() = OffloadStepStats{};
    return;
  }
  if (offload_ != nullptr) {
    run_offload(hidden, c, md, topk, output, tk);
    return;
  }
  // docs/design/sparse_cp.md §11.2: a PCP step with a prefill takes the head/tail road; a decode-only step
  // (every rank's rows are the step's tokens in order) the road below, with pcp_decode_attention.
  const bool pcp = md.pcp.world_size > 1;
  if (pcp && md.num_prefills > 0) {
    run_pcp(hidden, c, md, topk, output, tk);
    return;
  }
  if (md.dsa_cp.world_size > 1) {
    // (validate checked both comms against the metadata: DCP too only when the layer has both.)
    if (md.dcp.world_size > 1) {
      run_dsa_cp_dcp(hidden, c, md, topk, output, tk);
    } else {
      run_dsa_cp(hidden, c, md, topk, output, tk);
    }
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
  // docs/design/sfa.md §4.2: the resolved preprocess, downgraded to NATIVE outside
  // DecodeOnly / SpecDecoding steps and for MLAPO above 1024 input tokens.
  // (PCP decode-only: NATIVE, as the PCP head/tail road, whose fused preprocess is not wired.)
  last_pre_ = pcp ? Preprocess::Native : runtime_preprocess(choice_.kind, md.attn_state, md.num_input_tokens);
  const mla::detail::Fused path = last_pre_ == Preprocess::PrologV3 ? mla::detail::Fused::PrologV3
                                  : last_pre_ == Preprocess::Mlapo  ? mla::detail::Fused::Mlapo
                                                                    : mla::detail::Fused::None;
  // SFA C8: NATIVE preprocesses without latent/rope cache writes and packs the
  // latent key into the cache below (docs/design/sfa.md §4.1, §5); PROLOG_V3 writes
  // the packed rows itself (kv_cache_quant_mode 3; the rope cache is empty).
  mla::detail::LatentKv kv;
  const bool packed_here = cfg_.sfa_c8 && path == mla::detail::Fused::None;
  const mla::detail::LatentQuery q =
      packed_here ? core_->preprocess_unwritten(v, s, kv)
                  : core_->preprocess(v, s, cfg_.sfa_c8 ? c.packed : c.nope, cfg_.sfa_c8 ? no_rope_ : c.rope, path,
                                      stable);
  if (packed_here) store_packed_rows(kv.k_nope, kv.k_rope, c, md, tk);
  select_topk(x, q, c, md, topk, tk);
  at::Tensor attn;  // (tk, H, L)
  if (md.dcp.world_size > 1) {
    // (Under PCP, md.dcp is the PCP x DCP shard.) The merge lands in the decode workspace's attention buffer.
    const int64_t H = cfg_.dims.num_heads, L = cfg_.dims.kv_lora_rank;
    LatentCore::view_of(v.attn, tk, seen_.merged_src, seen_.merged, [&] {
      seen_.merged_rows = v.attn.view({-1}).narrow(0, 0, tk * H * L).view({tk * H, L});
      return seen_.merged_rows.view({tk, H, L});
    });
    attn = pcp ? pcp_decode_attention(q.qn, q.qr, last_topk_rows_, c, md, tk, seen_.merged)
               : dcp_sparse_attention(q.qn, q.qr, last_topk_rows_, c, md, tk, seen_.merged);
  } else {
    attn = sparse_attention(q.qn, q.qr, last_topk_rows_, c, md);
  }
  const at::Tensor& y = core_->w_uv_out_token_major(v, attn, tk);                                         // (tk, H*V)
  if (rows == tk) {
    ops::dense::linear_out(output, y, core_->weights().o_proj);
  } else {
    ops::dense::linear_out(output.narrow(0, 0, tk), y, core_->weights().o_proj);
    ops::dense::zero(output.narrow(0, tk, rows - tk));
  }
}

const at::Tensor& Impl::forward(const at::Tensor& hidden, const std::vector<at::Tensor>& kv_cache,
                                const Metadata* md_ptr, const at::Tensor& output, TopkBuffer* topk) {
  // Shared workspaces used below are held for this forward (one thread at a time).
  graph::ForwardScope exclusive_scope;
  if (md_ptr == nullptr) {
    graph::refuse_if_capturing("an SFA forward without metadata (profiling run)");
    last_topk_ = TopkSource::None;
    return internal::zero_profiling_output(output, hidden, "hidden_states");
  }
  const Metadata& md = *md_ptr;
  check_current(md.stamp, "metadata");
  const Caches c = validate(hidden, kv_cache, md, topk, output);
  const int64_t tk = md.cum_query_lens_list.empty() ? 0 : md.cum_query_lens_list.back();
  const KvHookScope<Metadata> kv_scope(kv_hooks, kv_cache, tk > 0, md, "sfa");
  const aar::detail::InferenceScope inference;
  if (graph::GraphParams* g = graph::GraphParams::current()) {
    graph::note_layer_life(life_, "sfa.Impl", cfg_.layer_index);  // recorded closures call this layer
    if (md.pcp.world_size > 1 && (md.num_prefills > 0 || md.num_decodes == 0)) {
      throw_not_supported("SFA PCP capture of a step with prefills is not supported (pcp_world_size=",
                          md.pcp.world_size, ", num_prefills=", md.num_prefills, ", num_decodes=", md.num_decodes,
                          "): the PCP head/tail split is eager only; decode-only buckets are captured "
                          "(docs/design/sparse_cp.md §11.1)");
    }
    if (offload_ != nullptr) {
      capture_offload(*g, hidden, c, md, topk, output, tk);
      g->note_metadata(0, md.stamp);  // docs/design/graph.md §1.2
      return output;
    }
    // Every operator of the layer reads only tensors at stable addresses (the
    // builder's buffers, the caches, the workspace, the top-k buffer): the
    // device graph captures them as they are and an update has nothing to
    // refresh; the CPU recording provider replays the closure.
    AAR_CHECK_ARG(hidden.size(0) == g->capturing_bucket(), "SFA graph capture of bucket ", g->capturing_bucket(),
                  " needs hidden_states of that many rows, got ", hidden.size(0));
    if (md.attn_state != plan::AttentionState::DecodeOnly && md.attn_state != plan::AttentionState::SpecDecoding) {
      throw_not_supported("SFA graph capture takes DecodeOnly and SpecDecoding batches (docs/design/sfa.md §3.2), got ",
                          plan::to_string(md.attn_state));
    }
    // SFA PCP (docs/design/sparse_cp.md §11.1): the replay issues the PCP (and DCP) collectives inside the
    // recorded call; the captured lists have the bucket's sizes, so an update must bring a decode-only step
    // of the same rows and kernel requests (the bucket padding gives them), checked before anything runs.
    graph::ClosureCall::Check check;
    if (md.pcp.world_size > 1) {
      check = [layer = cfg_.layer_index, tl = md.pcp.num_local_tokens, bk = md.num_kernel_reqs,
               rank = md.pcp.rank](const graph::StepParams& step, int64_t b) {
        const Metadata* m = step.backend_metadata_as<Metadata>();
        AAR_CHECK_ARG(m != nullptr, "the update of bucket ", b, " needs the step's sfa Metadata: layer ", layer,
                      " is a captured SFA PCP layer");
        if (m->num_prefills > 0 || m->num_decodes == 0) {
          throw_not_supported("the update of bucket ", b, ": SFA PCP capture of a step with prefills is not "
                              "supported (num_prefills=", m->num_prefills, ", num_decodes=", m->num_decodes,
                              "): the PCP head/tail split is eager only (docs/design/sparse_cp.md §11.1)");
        }
        AAR_CHECK_ARG(m->pcp.world_size > 1 && m->pcp.rank == rank && m->pcp.num_local_tokens == tl &&
                          m->num_kernel_reqs == bk,
                      "the update of bucket ", b, ": layer ", layer, " captured SFA PCP rank ", rank, " with ", tl,
                      " rows and ", bk, " kernel requests, the step has PCP rank ", m->pcp.rank, " of ",
                      m->pcp.world_size, " with ", m->pcp.num_local_tokens, " rows and ", m->num_kernel_reqs,
                      " kernel requests (build it with graph_decode_padding and num_input_tokens=", b, ")");
      };
    }
    g->capture_call(std::make_unique<graph::ClosureCall>(
        cfg_.layer_index, 0,
        [this, hidden, c, md_at_capture = md, topk, out = at::Tensor(output), tk]() {
          run(hidden, c, md_at_capture, topk, out, tk, /*stable=*/true);
        },
        std::move(check)));
    g->note_metadata(0, md.stamp);  // docs/design/graph.md §1.2
    return output;
  }
  run(hidden, c, md, topk, output, tk, /*stable=*/false);
  return output;
}

const char* to_string(CpMode m) {
  switch (m) {
    case CpMode::Plain: return "plain";
    case CpMode::DsaCp: return "dsa_cp";
    case CpMode::Dcp: return "dcp";
    case CpMode::DsaCpDcp: return "dsa_cp_dcp";
    case CpMode::Pcp: return "pcp";
    case CpMode::PcpDcp: return "pcp_dcp";
  }
  return "?";
}

CpMode resolve_cp_mode(bool dsa_cp, int64_t dcp_size, int64_t pcp_size) {
  AAR_CHECK_ARG(dcp_size >= 1, "dcp_size must be >= 1, got ", dcp_size);
  AAR_CHECK_ARG(pcp_size >= 1, "pcp_size must be >= 1, got ", pcp_size);
  if (pcp_size > 1) {
    // docs/design/sparse_cp.md §11: PCP alone or with DCP.
    if (dsa_cp) {
      throw_not_supported("pcp_size=", pcp_size, " with dsa_cp=True: SFA PCP x DSA-CP is not implemented "
                          "(docs/design/sparse_cp.md §11)");
    }
    return dcp_size > 1 ? CpMode::PcpDcp : CpMode::Pcp;
  }
  return dsa_cp ? (dcp_size > 1 ? CpMode::DsaCpDcp : CpMode::DsaCp) : (dcp_size > 1 ? CpMode::Dcp : CpMode::Plain);
}

}  // namespace aar::sfa
