// GQA PCP metadata builder (docs/design/cp.md §6, §6.3, §6.4, §6.5).
#include <ATen/ATen.h>

#include <algorithm>

#include "ascend_attn_rt/cp/gqa_pcp.h"
#include "ascend_attn_rt/errors.h"
#include "ascend_attn_rt/gqa/backend.h"
#include "../common/builder_checks.h"
#include "ascend_attn_rt/gqa/mask.h"
#include "ascend_attn_rt/cp/plan/dcp_layout.h"
#include "ascend_attn_rt/cp/plan/dcp_step_plan.h"
#include "ascend_attn_rt/cp/plan/pcp_split.h"
#include "ascend_attn_rt/cp/plan/pcp_step_plan.h"
#include "ascend_attn_rt/plan/slot_mapping.h"
#include "ascend_attn_rt/plan/split.h"
#include "../common/staging.h"
#include "../core/staging_layout.h"

namespace aar::cp {

namespace {

int32_t kv_world(const PcpConfig& c) { return c.pcp_size * c.dcp_size; }
int32_t kv_rank(const PcpConfig& c) { return c.pcp_rank * c.dcp_size + c.dcp_rank; }

plan::SlotMappingInputs slot_inputs(const PcpBuildInputs& in, const PcpConfig& c) {
  plan::SlotMappingInputs si;
  si.query_start_loc = in.query_start_loc;
  si.seq_lens = in.seq_lens;
  si.block_table = in.block_table;
  si.block_table_stride = in.block_table_stride;
  si.block_size = c.block_size;
  si.num_blocks = c.num_blocks;
  return si;
}

// The sharded path's prefill lists, one region per list, are sized by the step
// (the batch's chunks and head/tail KV counts): they are packed per build at the
// end of one region (StagingLayout::pack_before), so one copy of the used tail
// moves them all. The decode rows (slots, block table) have fixed regions of
// their own: a captured bucket reads them at the same address every step.
constexpr int kShardedLists = 11;

}  // namespace

struct PcpMetadataBuilder::Staging {
  core::Region lists;        // sharded: the per-step packed lists
  core::Region decode_slots, decode_bt;  // sharded: the decode rows (max_num_tokens rows)
  core::RegionViews decode_slots_dev, decode_bt_dev;
  core::Region write_slots;  // replicated
  core::RegionViews write_slots_dev;
  // Sharded: the packed lists' views, by length and keyed by their offset (which
  // moves with the other lists' sizes), so a steady-state step (a decode-only
  // one above all: every prefill list empty, the same offsets) makes no tensor.
  core::ViewCache slots_v, restore_v, qh_v, qt_v, hn_v, hm_v, tn_v, tm_v, qf_v, cbt_v, crow_v;
};

PcpMetadataBuilder::PcpMetadataBuilder(const PcpConfig& cfg) : cfg_(cfg) {
  internal::check_builder_sizes<gqa::Backend>(cfg);
  internal::check_num_speculative_tokens(cfg);
  AAR_CHECK_ARG(cfg.pcp_size >= 1, "pcp_size must be >= 1, got ", cfg.pcp_size);
  AAR_CHECK_ARG(cfg.pcp_rank >= 0 && cfg.pcp_rank < cfg.pcp_size, "pcp_rank=", cfg.pcp_rank,
                " is out of range [0, pcp_size=", cfg.pcp_size, ")");
  AAR_CHECK_ARG(cfg.dcp_size >= 1, "dcp_size must be >= 1, got ", cfg.dcp_size);
  AAR_CHECK_ARG(cfg.dcp_rank >= 0 && cfg.dcp_rank < cfg.dcp_size, "dcp_rank=", cfg.dcp_rank,
                " is out of range [0, dcp_size=", cfg.dcp_size, ")");
  AAR_CHECK_ARG(cfg.interleave_size >= 1, "interleave_size must be >= 1, got ", cfg.interleave_size);
  if (cfg.kv_mode == plan::PcpKvMode::Replicated) {
    if (cfg.dcp_size != 1) {
      throw_not_supported("kv_mode='replicated' (model-runner v2 PCP) with dcp_size=", cfg.dcp_size,
                          ": PCP with replicated KV and DCP > 1 at once is not supported (use kv_mode='sharded')");
    }
    AAR_CHECK_ARG(cfg.interleave_size == 1, "interleave_size=", cfg.interleave_size,
                  " has no effect with kv_mode='replicated' (the KV is not sharded); leave it at 1");
  } else {
    AAR_CHECK_ARG(cfg.block_size % cfg.interleave_size == 0, "block_size=", cfg.block_size,
                  " must be a multiple of interleave_size=", cfg.interleave_size);
    AAR_CHECK_ARG(kv_world(cfg) <= plan::kMaxCpMergePartitions, "pcp_size * dcp_size = ", kv_world(cfg),
                  " exceeds the ", plan::kMaxCpMergePartitions, " partials npu_attention_update merges");
  }

  const int64_t Wp = cfg.pcp_size, Nm = cfg.max_num_reqs, Tm = cfg.max_num_tokens, mb = cfg.max_blocks_per_req;
  // Padded-global rows: decodes Wp q, prefills P_i <= q_i + 2 Wp - 1.
  const int64_t G = Wp * Tm + 2 * Wp * Nm;
  const int64_t C = G / Wp;  // >= sum c_i
  cap_ = G;
  core::StagingLayout layout;
  st_ = std::make_unique<Staging>();
  int slot_base = 0;
  if (cfg.kv_mode == plan::PcpKvMode::Sharded) {
    // Every list at its bound, plus each one's alignment padding.
    const int64_t words = 3 * G + (6 + 3 * Wp) * C + Wp * Nm * mb;
    st_->lists = layout.add("sharded_lists", words + (kShardedLists + 1) * core::kStagingAlignWords);
    // Decode rows: at most max_num_tokens (the bucket of a padded step included).
    st_->decode_slots = layout.add("decode_slots", Tm);
    st_->decode_bt = layout.add("decode_block_table", Tm * mb);
    // The views' length bounds (G <= cap_ is checked per build): the chunk total
    // sum c_i <= C, the rank's 2 sum c_i prefill rows, its head no-mask keys
    // pcp_rank * sum c_i and tail no-mask keys (2 Wp - 1 - pcp_rank) * sum c_i.
    const int64_t rp = cfg.pcp_rank;
    for (core::ViewCache* c : {&st_->slots_v, &st_->restore_v}) c->resize(G);
    for (core::ViewCache* c : {&st_->qh_v, &st_->qt_v, &st_->hm_v, &st_->tm_v}) c->resize(C);
    st_->hn_v.resize(rp * C);
    st_->tn_v.resize((2 * Wp - 1 - rp) * C);
    st_->qf_v.resize(2 * C);
    st_->crow_v.resize(2 * C);
    st_->cbt_v.resize(Wp * Nm);  // rows (Wp * num_prefills), keyed by offset and stride
  } else {
    // Td + Wp (P - Td) <= Wp P slots, and P <= Tm (a rank's rows are at most the batch's).
    st_->write_slots = layout.add("write_slots", Wp * Tm);
    // Hooks shared with the inner GQA builder (its buffers are slots [0, n)) see ours after them.
    if (cfg.staging_hooks) slot_base = cfg.staging_buffers;
  }
  buffers_ = std::make_unique<detail::StagingBuffers>(layout.words(), cfg.device, cfg.separate(),
                                                      cfg.staging_buffers, cfg.staging_hooks, slot_base);
  if (cfg.kv_mode == plan::PcpKvMode::Replicated) {
    st_->write_slots_dev = core::RegionViews(buffers_->device(), st_->write_slots, Wp * Tm, at::kInt);
  } else {
    st_->decode_slots_dev = core::RegionViews(buffers_->device(), st_->decode_slots, Tm, at::kInt);
    st_->decode_bt_dev = core::RegionViews(buffers_->device(), st_->decode_bt, Tm, at::kInt, mb);
  }

  flags_.assign(Nm, 0);
  qlens_.assign(Nm, 0);
  num_computed_.assign(Nm, 0);
  token_slots_.assign(Tm, 0);
  local_lens_.assign(Nm, 0);
  positions_.reserve(G);
  token_index_.reserve(G);
  decode_q_ends_.assign(Tm, 0);
  decode_kv_lens_.assign(Tm, 0);
  mask_ends_.assign(Nm, 0);
  head_ends_.assign(Nm, 0);
  tail_ends_.assign(Nm, 0);
  ctx_q_ends_.assign(Wp * Nm, 0);
  ctx_kv_lens_.assign(Wp * Nm, 0);
  if (cfg.kv_mode == plan::PcpKvMode::Replicated) {
    // The rank's segments as an ordinary GQA batch: the same core (geometry,
    // staging), at most 2 N + 1 rows.
    gqa::BuilderConfig b;
    static_cast<core::BuilderCore&>(b) = cfg;
    b.max_num_reqs = static_cast<int32_t>(2 * Nm + 1);
    inner_ = std::make_unique<gqa::MetadataBuilder>(b);
    segments_.resize(2 * Nm + 1);
    local_qsl_.assign(2 * Nm + 2, 0);
    local_seq_.assign(2 * Nm + 1, 0);
    local_pref_.assign(2 * Nm + 1, 0);
    local_bt_.assign((2 * Nm + 1) * mb, 0);
    token_slots_.assign(Tm, 0);
    expanded_slots_.assign(Wp * Tm, 0);
    u8_.reserve(Tm);
  } else {
    gqa::MaskBuilder masks(cfg.device);
    causal_mask_ = masks.attention_mask(/*causal=*/true, /*pooling=*/false);
  }
  md_.kv_mode = cfg.kv_mode;
  md_.pcp_size = cfg.pcp_size;
  md_.pcp_rank = cfg.pcp_rank;
  md_.dcp_size = cfg.dcp_size;
  md_.dcp_rank = cfg.dcp_rank;
}

PcpMetadataBuilder::~PcpMetadataBuilder() = default;

const PcpMetadata& PcpMetadataBuilder::build(const PcpBuildInputs& in) { return build_step(in, false); }

const PcpMetadata& PcpMetadataBuilder::build_step(const PcpBuildInputs& in, bool for_capture) {
  const size_t n = in.seq_lens.size();
  core::check_step_fits(in, cfg_, cfg_.max_blocks_per_req);
  core::refuse_unread(in, core::kAttnState | core::kNumSpecTokens | core::kReqIds,
                      "the GQA PCP builder (no forced state, no per-request speculative counts, no per-request "
                      "state)");
  AAR_CHECK_ARG(in.query_start_loc.size() == n + 1, "query_start_loc has ", in.query_start_loc.size(),
                " entries, expected num_reqs + 1 = ", n + 1);
  AAR_CHECK_ARG(in.block_table_stride >= 0, "block_table_stride must be >= 0, got ", in.block_table_stride);
  AAR_CHECK_ARG(in.block_table.size() == n * static_cast<size_t>(in.block_table_stride), "block_table has ",
                in.block_table.size(), " entries, expected num_reqs * block_table_stride = ",
                n * static_cast<size_t>(in.block_table_stride));
  // Validates query_start_loc and is_prefilling (the threshold-1 flags are then replaced below).
  int32_t num_decodes = plan::pcp_split_flags(in.query_start_loc, in.is_prefilling,
                                              plan::Span<uint8_t>(flags_.data(), n));
  const int32_t total = in.query_start_loc[n];  // <= max_num_tokens (check_step_fits)
  int32_t max_q = 0, max_s = 0;
  for (size_t i = 0; i < n; ++i) {
    qlens_[i] = in.query_start_loc[i + 1] - in.query_start_loc[i];
    AAR_CHECK_ARG(in.seq_lens[i] >= qlens_[i], "seq_lens[", i, "]=", in.seq_lens[i],
                  " is smaller than its query length ", qlens_[i]);
    num_computed_[i] = in.seq_lens[i] - qlens_[i];
    max_q = std::max(max_q, qlens_[i]);
    max_s = std::max(max_s, in.seq_lens[i]);
  }
  if (decode_threshold() > 1 && n > 0) {
    // Speculative decode: docs/design/cp.md §3.2's split with the decode threshold
    // 1 + num_speculative_tokens (short extends are prefills by is_prefilling;
    // without it every short request is a decode), the first prefill splitting
    // the batch as above.
    plan::SplitInputs sp;
    sp.query_start_loc = in.query_start_loc;
    sp.num_actual_tokens = total;
    sp.max_query_len = max_q;
    sp.decode_threshold = decode_threshold();
    sp.treat_short_extends_as_decodes = in.is_prefilling.empty();
    if (!sp.treat_short_extends_as_decodes) sp.is_prefilling = in.is_prefilling;
    num_decodes = plan::split_decodes_and_prefills(sp).num_decodes;
    for (size_t i = 0; i < n; ++i) flags_[i] = static_cast<int32_t>(i) >= num_decodes ? 1 : 0;
  }
  const int32_t num_prefills = static_cast<int32_t>(n) - num_decodes;
  // Graph buckets: a decode-only step may be padded to num_input_tokens (decode
  // rows of KV length 0); a step with prefills keeps its split and is never padded.
  const int32_t t_in = in.num_input_tokens == 0 ? total : in.num_input_tokens;
  AAR_CHECK_ARG(t_in >= total, "num_input_tokens=", in.num_input_tokens, " is smaller than query_start_loc[-1]=",
                total);
  if (for_capture && (num_prefills > 0 || num_decodes == 0)) {
    throw_not_supported("build_for_graph_capture: GQA PCP captures decode-only steps (got ", num_decodes,
                        " decodes and ", num_prefills, " prefills): the prefill head/tail split and its gathers "
                        "run eagerly only");
  }
  if (t_in > total && (num_prefills > 0 || num_decodes == 0)) {
    throw_not_supported("num_input_tokens=", t_in, " pads a step with ", num_prefills, " prefills and ", num_decodes,
                        " decodes: GQA PCP pads decode-only steps only (graph buckets); a step with prefills keeps "
                        "its head/tail split and runs eagerly (give 0 or query_start_loc[-1]=", total, ")");
  }
  // A decode-only step of several tokens per request is a speculative one.
  const bool decode_only = num_prefills == 0 && num_decodes > 0;
  const bool spec_decode = decode_only && max_q > 1;
  plan::AttentionState state = spec_decode ? plan::AttentionState::SpecDecoding : plan::AttentionState::DecodeOnly;
  if (!decode_only) {
    // docs/design/cp.md §3.5: a decode-only step's state is set above, without the per-request pass.
    plan::StateInputs state_in;
    state_in.num_computed_tokens = plan::CSpan<int32_t>(num_computed_.data(), n);
    state_in.num_scheduled_tokens = plan::CSpan<int32_t>(qlens_.data(), n);
    state = plan::select_attention_state(state_in);
  }
  if (cfg_.kv_mode == plan::PcpKvMode::Sharded) {
    build_sharded(in, num_decodes, t_in);
  } else {
    build_replicated(in, t_in, spec_decode);
  }
  md_.attn_state = state;
  md_.num_reqs = static_cast<int32_t>(n);
  md_.num_kernel_reqs = static_cast<int32_t>(n) + (t_in - total);  // the padding decode rows are the dummies
  md_.num_decodes = num_decodes;
  md_.num_prefills = num_prefills;
  md_.num_actual_tokens = total;
  md_.num_input_tokens = t_in;
  md_.num_prefill_tokens = total - md_.num_decode_tokens;
  md_.max_query_len = max_q;
  md_.max_seq_len = max_s;
  bool ctx = false;
  for (size_t i = num_decodes; i < n; ++i) ctx = ctx || num_computed_[i] > 0;
  md_.has_context = ctx;
  counter_.next(md_.stamp);
  return md_;
}

const PcpMetadata& PcpMetadataBuilder::build_for_graph_capture(const PcpBuildInputs& in,
                                                               plan::AttentionState state) {
  static const core::BackendFacts& facts = PcpBackend::facts();
  core::check_capturable(facts, state);
  build_step(in, true);
  md_.attn_state = state;
  return md_;
}

const PcpMetadata& PcpMetadataBuilder::build_for_drafting(const PcpBuildInputs& in, int32_t draft_index) {
  core::check_draft_index(draft_index);
  return build(in);
}

static_assert(core::is_builder_v<PcpMetadataBuilder>, "cp::PcpMetadataBuilder follows the builder contract");

void PcpMetadataBuilder::build_sharded(const PcpBuildInputs& in, int32_t nd, int32_t t_in) {
  const size_t n = in.seq_lens.size();
  const int32_t Wp = cfg_.pcp_size, rp = cfg_.pcp_rank, W = kv_world(cfg_), r = kv_rank(cfg_);
  const int32_t I = cfg_.interleave_size;
  const int32_t total = in.query_start_loc[n];
  // --- validation (nothing written that the previous metadata reads) ---
  const plan::SlotMappingInputs si = slot_inputs(in, cfg_);
  plan::check_dcp_block_table(si, W, I);
  plan::PcpSplitInputs sp;
  sp.query_lens = plan::CSpan<int32_t>(qlens_.data(), n);
  sp.num_decodes = nd;
  sp.pcp_size = Wp;
  const plan::PcpSplitSizes sz = plan::pcp_split_sizes(sp);
  const plan::PcpHeadTailCounts ht = plan::pcp_head_tail_counts(sp, rp);
  const int64_t G = sz.padded_global_tokens, Td = sz.num_decode_tokens, C = ht.chunk_tokens;
  const int64_t np = static_cast<int64_t>(n) - nd, stride = in.block_table_stride;
  // Holds by the token and request limits checked above; every other list is bounded by G.
  AAR_CHECK_ARG(G <= cap_, "the padded-global batch has ", G, " rows, more than the builder's capacity ", cap_);

  // The batch tokens' slots on this KV rank (-1 where another rank owns them);
  // validates the written columns (the read ones were checked above).
  plan::DcpShard shard{W, r, I};
  plan::compute_dcp_slot_mapping(si, shard, plan::Span<int32_t>(token_slots_.data(), total));

  // --- host lists and the staging buffer ---
  int32_t* s = buffers_->begin();
  int64_t o_slots, o_restore, o_qh, o_qt, o_hn, o_hm, o_tn, o_tm, o_qf, o_cbt, o_crow;
  const core::Region& lists = st_->lists;
  const int64_t first = core::StagingLayout::pack_before(
      lists.end(), {{&o_slots, G}, {&o_restore, G}, {&o_qh, C}, {&o_qt, C},
                    {&o_hn, ht.head_nomask_tokens}, {&o_hm, C}, {&o_tn, ht.tail_nomask_tokens}, {&o_tm, C},
                    {&o_qf, 2 * C}, {&o_cbt, Wp * np * stride}, {&o_crow, sz.local_prefill_tokens}});
  // Holds by the bounds the region was sized with (G <= cap_ above).
  AAR_CHECK_ARG(first >= lists.offset, "the sharded PCP lists of this step need ", lists.end() - first,
                " staging words, more than the builder's ", lists.words);
  plan::pcp_padded_slot_mapping(sp, plan::CSpan<int32_t>(token_slots_.data(), total),
                                plan::Span<int32_t>(s + o_slots, G));
  plan::pcp_restore_index(sp, plan::Span<int32_t>(s + o_restore, G));
  // Decode rows (docs/design/cp.md §3.3, §6.6): one per decode token, then the
  // padding rows of a padded decode-only step (t_in > total only then). The rows are
  // DCP's (plan::write_dcp_decode_rows) under the PCP x DCP shard.
  const int64_t dk = nd > 0 && np == 0 ? t_in : Td, mb = cfg_.max_blocks_per_req;
  {
    int32_t* dslots = s + st_->decode_slots.offset;
    std::copy_n(token_slots_.data(), Td, dslots);
    std::fill(dslots + Td, dslots + dk, plan::kPadSlot);
    plan::write_dcp_decode_rows(in.query_start_loc, in.seq_lens, nd, in.block_table, in.block_table_stride, shard,
                                static_cast<int32_t>(dk), plan::Span<int64_t>(decode_q_ends_.data(), dk),
                                plan::Span<int64_t>(decode_kv_lens_.data(), dk),
                                plan::Span<int32_t>(s + st_->decode_bt.offset, dk * mb), static_cast<int32_t>(mb));
  }
  plan::PcpHeadTailBuffers hb;
  hb.q_head_idx = plan::Span<int32_t>(s + o_qh, C);
  hb.q_tail_idx = plan::Span<int32_t>(s + o_qt, C);
  hb.kv_head_nomask_idx = plan::Span<int32_t>(s + o_hn, ht.head_nomask_tokens);
  hb.kv_head_mask_idx = plan::Span<int32_t>(s + o_hm, C);
  hb.kv_tail_nomask_idx = plan::Span<int32_t>(s + o_tn, ht.tail_nomask_tokens);
  hb.kv_tail_mask_idx = plan::Span<int32_t>(s + o_tm, C);
  hb.q_full_idx = plan::Span<int32_t>(s + o_qf, 2 * C);
  hb.mask_seq_ends = plan::Span<int64_t>(mask_ends_.data(), np);
  hb.head_nomask_kv_ends = plan::Span<int64_t>(head_ends_.data(), np);
  hb.tail_nomask_kv_ends = plan::Span<int64_t>(tail_ends_.data(), np);
  plan::pcp_head_tail_indices(sp, rp, hb);
  // Context entries of the PCP-gathered query, rank-major: (rank j, request i).
  positions_.assign(sz.local_tokens, 0);
  plan::pcp_local_tokens(sp, rp, plan::Span<int32_t>(local_lens_.data(), n),
                         plan::Span<int32_t>(positions_.data(), positions_.size()));
  int64_t qe = 0;
  for (int32_t j = 0; j < Wp; ++j) {
    for (int64_t i = 0; i < np; ++i) {
      const int64_t req = nd + i;
      ctx_q_ends_[j * np + i] = (qe += local_lens_[req]);
      ctx_kv_lens_[j * np + i] = plan::dcp_local_len(num_computed_[req], W, I, r);
      std::copy_n(in.block_table.data() + req * stride, stride, s + o_cbt + (j * np + i) * stride);
    }
  }
  {
    int32_t* crow = s + o_crow;
    for (int64_t i = 0; i < np; ++i) {
      crow = std::fill_n(crow, local_lens_[nd + i], num_computed_[nd + i] > 0 ? 1 : 0);
    }
  }
  // Where each local row comes from in the global batch (-1: a pad, and the
  // padding decode rows of a padded step, which have no position either).
  const int64_t rows_local = sz.local_tokens + (dk - Td);
  positions_.resize(rows_local, -1);
  token_index_.assign(rows_local, -1);
  {
    int64_t row = 0;
    for (size_t i = 0; i < n; ++i) {
      for (int32_t k = 0; k < local_lens_[i]; ++k, ++row) {
        const int32_t p = positions_[row];
        if (p < qlens_[i]) token_index_[row] = in.query_start_loc[i] + p;
      }
    }
  }
  buffers_->copy(first, lists.end() - first);
  buffers_->copy(st_->decode_slots.offset, dk);
  buffers_->copy(st_->decode_bt.offset, dk * mb);
  buffers_->finish();

  const at::Tensor& dev = buffers_->device();
  auto view = [&](core::ViewCache& vc, int64_t o, int64_t len) -> const at::Tensor& {
    return vc.get(len, o, [&] { return dev.narrow(0, o, len); });
  };
  Staging& st = *st_;
  md_.padded_slot_mapping = view(st.slots_v, o_slots, G);
  md_.restore_idx = view(st.restore_v, o_restore, G);
  md_.decode_kernel_rows = static_cast<int32_t>(dk);
  md_.decode_slots = st.decode_slots_dev.first(dk);
  md_.decode_block_tables = st.decode_bt_dev.first(dk);
  md_.q_head_idx = view(st.qh_v, o_qh, C);
  md_.q_tail_idx = view(st.qt_v, o_qt, C);
  md_.kv_head_nomask_idx = view(st.hn_v, o_hn, ht.head_nomask_tokens);
  md_.kv_head_mask_idx = view(st.hm_v, o_hm, C);
  md_.kv_tail_nomask_idx = view(st.tn_v, o_tn, ht.tail_nomask_tokens);
  md_.kv_tail_mask_idx = view(st.tm_v, o_tm, C);
  md_.q_full_idx = view(st.qf_v, o_qf, 2 * C);
  md_.ctx_block_tables = st.cbt_v.get(Wp * np, o_cbt * (cfg_.max_blocks_per_req + 1) + stride, [&] {
    return dev.narrow(0, o_cbt, Wp * np * stride).view({Wp * np, stride});
  });
  md_.context_rows = view(st.crow_v, o_crow, sz.local_prefill_tokens);
  md_.attn_mask = causal_mask_;
  md_.decode_q_ends = c10::IntArrayRef(decode_q_ends_.data(), dk);
  md_.decode_kv_lens = c10::IntArrayRef(decode_kv_lens_.data(), dk);
  md_.mask_seq_ends = c10::IntArrayRef(mask_ends_.data(), np);
  md_.head_nomask_kv_ends = c10::IntArrayRef(head_ends_.data(), np);
  md_.tail_nomask_kv_ends = c10::IntArrayRef(tail_ends_.data(), np);
  md_.ctx_q_ends = c10::IntArrayRef(ctx_q_ends_.data(), Wp * np);
  md_.ctx_kv_lens = c10::IntArrayRef(ctx_kv_lens_.data(), Wp * np);
  md_.chunk_tokens = ht.chunk_tokens;
  md_.head_nomask_tokens = ht.head_nomask_tokens;
  md_.tail_nomask_tokens = ht.tail_nomask_tokens;
  md_.num_decode_tokens = sz.num_decode_tokens;
  md_.num_local_tokens = static_cast<int32_t>(rows_local);
  md_.shape.block_size = cfg_.block_size;
  md_.shape.num_blocks = cfg_.num_blocks;
  md_.shape.num_input_tokens = md_.shape.num_actual_tokens = md_.shape.num_kernel_tokens =
      static_cast<int32_t>(rows_local);
  md_.local = nullptr;
  md_.write_slots = at::Tensor();
}

void PcpMetadataBuilder::build_replicated(const PcpBuildInputs& in, int32_t t_in, bool spec_decode) {
  const size_t n = in.seq_lens.size();
  const int32_t Wp = cfg_.pcp_size, rp = cfg_.pcp_rank;
  const int32_t total = in.query_start_loc[n];
  const int64_t stride = in.block_table_stride;
  // --- validation ---
  const plan::SlotMappingInputs si = slot_inputs(in, cfg_);
  plan::compute_slot_mapping(si, plan::Span<int32_t>(token_slots_.data(), total));
  plan::PcpSegmentInputs seg;
  seg.query_start_loc = in.query_start_loc;
  seg.num_computed_tokens = plan::CSpan<int32_t>(num_computed_.data(), n);
  seg.is_prefilling = plan::CSpan<uint8_t>(flags_.data(), n);
  seg.pcp_size = Wp;
  const int32_t P = plan::pcp_padded_local_tokens(seg);
  // Holds (a rank's rows are at most the batch's, or the one dummy row); the
  // expanded mapping and write-slot region are sized by it.
  AAR_CHECK_ARG(P <= cfg_.max_num_tokens, "the rank's padded rows P=", P, " exceed max_num_tokens=",
                cfg_.max_num_tokens);
  plan::PcpLocalBatchBuffers lb;
  lb.query_start_loc = plan::Span<int32_t>(local_qsl_.data(), local_qsl_.size());
  lb.seq_lens = plan::Span<int32_t>(local_seq_.data(), local_seq_.size());
  lb.block_table = plan::Span<int32_t>(local_bt_.data(), local_bt_.size());
  lb.is_prefilling = plan::Span<uint8_t>(local_pref_.data(), local_pref_.size());
  lb.segments = plan::Span<plan::PcpSegment>(segments_.data(), segments_.size());
  const int32_t rows = plan::pcp_local_batch(seg, rp, in.block_table, in.block_table_stride, lb);
  int32_t td = 0;
  bool any_split = false;
  for (size_t i = 0; i < n; ++i) {
    if (flags_[i]) any_split = true;
    else td += qlens_[i];
  }

  // The rank's rows as an ordinary GQA batch, padded to P tokens. A batch
  // with a split request is always ChunkedPrefill (docs/design/cp.md §6.5): a fresh prefill
  // segment still reads the other ranks' chunks from the cache.
  gqa::BuildInputs bi;
  bi.query_start_loc = plan::CSpan<int32_t>(local_qsl_.data(), rows + 1);
  bi.seq_lens = plan::CSpan<int32_t>(local_seq_.data(), rows);
  bi.block_table = plan::CSpan<int32_t>(local_bt_.data(), rows * stride);
  bi.block_table_stride = in.block_table_stride;
  // A padded decode-only step (t_in > total only then, and then P = total): the
  // inner build pads to the bucket with its own dummies.
  const int32_t rows_local = std::max(P, t_in > total ? t_in : 0);
  bi.num_input_tokens = rows_local;
  if (any_split) bi.attn_state = plan::AttentionState::ChunkedPrefill;
  // Decode-only with several tokens per request: the speculative state, whose
  // causal order the GQA layer keeps (and captures).
  if (spec_decode) bi.attn_state = plan::AttentionState::SpecDecoding;
  bi.is_prefilling = plan::CSpan<uint8_t>(local_pref_.data(), rows);
  const gqa::Metadata& local = inner_->build(bi);

  // The expanded mapping (docs/design/cp.md §6.5, host scratch) and the write slots of
  // cat(K[:Td], gathered), the one region a layer reads.
  const int64_t G = static_cast<int64_t>(Wp) * P;
  int32_t* e = expanded_slots_.data();
  plan::pcp_expanded_slot_mapping(seg, plan::CSpan<int32_t>(token_slots_.data(), total), plan::Span<int32_t>(e, G));
  int32_t* s = buffers_->begin();
  const int64_t nw = td + static_cast<int64_t>(Wp) * (P - td);
  int32_t* w = s + st_->write_slots.offset;
  std::copy_n(e, td, w);  // rank 0's row: the decode copies' real slots
  for (int32_t j = 0; j < Wp; ++j) std::copy_n(e + j * P + td, P - td, w + td + j * (P - td));
  buffers_->copy(st_->write_slots.offset, nw);
  buffers_->finish();
  md_.write_slots = st_->write_slots_dev.first(nw);
  md_.local = &local;
  md_.num_decode_tokens = td;
  md_.num_local_tokens = rows_local;
  md_.decode_kernel_rows = td;

  positions_.assign(rows_local, -1);
  token_index_.assign(rows_local, -1);
  for (int32_t k = 0; k < rows; ++k) {
    const plan::PcpSegment& g = segments_[k];
    for (int32_t t = 0; t < g.num_tokens; ++t) {
      positions_[g.local_begin + t] = g.token_begin - in.query_start_loc[g.req] + t;
      token_index_[g.local_begin + t] = g.token_begin + t;
    }
  }
  md_.shape = gqa::Metadata{};
  md_.attn_mask.reset();
}

}  // namespace aar::cp
