// DSA metadata builders (docs/design/dsa.md §3.1, §3.4, §3.5). Layout, lanes and the
// decisions are described in include/ascend_attn_rt/dsa/builder.h.
#include "ascend_attn_rt/dsa/builder.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>
#include <limits>

#include "../common/builder_checks.h"
#include "../common/inference_scope.h"
#include "../common/rope_gather.h"
#include "../common/staging.h"
#include "../core/staging_layout.h"
#include "ascend_attn_rt/detail/tensor_binding.h"
#include "ascend_attn_rt/dsa/backend.h"
#include "ascend_attn_rt/errors.h"
#include "ascend_attn_rt/ops/dense.h"
#include "ascend_attn_rt/ops/dsa_compressor.h"
#include "ascend_attn_rt/ops/lightning_indexer.h"
#include "ascend_attn_rt/ops/out_variants.h"
#include "ascend_attn_rt/ops/sparse_attn_sharedkv.h"
#include "ascend_attn_rt/ops/sparse_flash_mla.h"
#include "ascend_attn_rt/dsa/plan/dsa_step_plan.h"
#include "ascend_attn_rt/cp/plan/dcp_layout.h"
#include "ascend_attn_rt/dsa/plan/dsa_dcp_plan.h"
#include "ascend_attn_rt/cp/plan/sparse_cp.h"
#include "../cp/plan/dcp_internal.h"

namespace aar::dsa {

namespace {

constexpr int64_t kBlobWords = 1024;  // docs/design/dsa.md §3.5: (1024,) int32

// dst = src without the reference-count traffic when dst already is src (the
// steady state: cached views, the step's tensors).
inline void set(at::Tensor& dst, const at::Tensor& src) {
  if (!dst.is_same(src)) dst = src;
}

bool dcp_sharded_kind(DsaCacheKind k) {
  return k == DsaCacheKind::Swa || k == DsaCacheKind::C4Kv || k == DsaCacheKind::C128Kv;
}

// docs/design/sparse_cp.md §12: the local block-table columns a sharded group's kernels read and
// write on this rank (its owned positions of the SWA window up to S, or its owned compressed rows
// below S / r), inside the table and in [0, num_blocks). Runs before anything is written. A
// graph-padding request (b >= num_reqs, §12.5) has start_pos 0: the layer's lists read its
// positions below q_b only, so its columns are checked up to q_b, against the stride only (the
// staged table's padding rows are zeroed: block 0).
void check_dcp_local_columns(const StepMetadata& st, const GroupInputs& in, int64_t sbs, int32_t ratio,
                             int32_t win_left, int32_t num_blocks) {
  const DcpStepMetadata& d = st.dcp;
  namespace dcp = plan::detail::dcp;  // the unchecked formulas, the shard checked once (lo, hi >= 0 below)
  dcp::check_shard(plan::DcpShard{d.world_size, d.rank, d.interleave});
  for (int32_t b = 0; b < st.num_kernel_reqs; ++b) {
    const size_t ub = static_cast<size_t>(b);
    const int64_t q = st.plan.query_start_loc[ub + 1] - st.plan.query_start_loc[ub];
    const int64_t S = b < st.num_reqs ? st.plan.seq_lens[ub] : q;
    const int64_t lo = ratio <= 1 ? std::max<int64_t>(0, S - q - win_left) : 0;
    const int64_t hi = ratio <= 1 ? S : S / ratio;
    const int64_t llo = dcp::local_len(lo, d.world_size, d.interleave, d.rank);
    const int64_t lhi = dcp::local_len(hi, d.world_size, d.interleave, d.rank);
    if (lhi <= llo) continue;
    for (int64_t col = llo / sbs; col <= (lhi - 1) / sbs; ++col) {
      AAR_CHECK_ARG(col < in.block_table_stride, "block_table: request ", b, " needs local column ", col,
                    " on DCP rank ", d.rank, " but block_table_stride is ", in.block_table_stride);
      if (b >= st.num_reqs) continue;
      const int32_t id = in.block_table[static_cast<size_t>(b * int64_t{in.block_table_stride} + col)];
      AAR_CHECK_ARG(id >= 0 && id < num_blocks, "block_table[", b, "][", col, "]=", id,
                    " (a local column DCP rank ", d.rank, " reads) is not a block id in [0, num_blocks=",
                    num_blocks, ")");
    }
  }
}

// docs/design/sparse_cp.md §12: the slots of a sharded group rewritten to this rank's local ones
// (every row another rank owns gets the skip encoding). `n` rows at `slots` (fw words each); row i
// is position pos(i) of request req(i), or not a row (req < 0: left as it is).
template <class RowOf>
void localize_dcp_slots(const StepMetadata& st, const GroupInputs& in, int64_t sbs, int64_t fw, int64_t n,
                        int32_t* slots, BlockOffsetSkip skip, RowOf row_of) {
  const DcpStepMetadata& d = st.dcp;
  namespace dcp = plan::detail::dcp;  // the unchecked formulas, the shard checked once
  dcp::check_shard(plan::DcpShard{d.world_size, d.rank, d.interleave});
  for (int64_t i = 0; i < n; ++i) {
    int64_t b = -1, x = 0;
    row_of(i, b, x);
    if (b < 0) continue;
    AAR_CHECK_ARG(x >= 0, "internal: DCP slot of a negative position ", x, " (request ", b, ")");
    int32_t* o = slots + i * fw;
    if (dcp::owner(x, d.world_size, d.interleave) != d.rank) {
      o[0] = -1;
      if (fw == 2) o[1] = skip == BlockOffsetSkip::MinusOne ? -1 : static_cast<int32_t>(sbs - 1);
      continue;
    }
    const int64_t li = dcp::local_index(x, d.world_size, d.interleave);
    const int64_t blk = in.block_table[static_cast<size_t>(b * int64_t{in.block_table_stride} + li / sbs)];
    if (fw == 2) {
      o[0] = static_cast<int32_t>(blk);
      o[1] = static_cast<int32_t>(li % sbs);
    } else {
      o[0] = static_cast<int32_t>(blk * sbs + li % sbs);
    }
  }
}

}  // namespace

// ============================================================== StepBuilder

class StepBuilder::Lane {
 public:
  Lane(const StepBuilderConfig& cfg, const aar::detail::RopeRows& rope, const aar::detail::RopeRows* crope, int32_t draft_index,
       int64_t max_reqs, bool separate, int slot_base)
      : cfg_(cfg), rope_(rope), crope_(crope), draft_index_(draft_index), R_(max_reqs),
        cp_(cfg.dsa_cp_world_size > 1 && draft_index < 0), pcp_(cfg.pcp_world_size > 1) {
    const int64_t T = cfg.max_num_tokens;
    // DSA-CP: RoPE rows for the step padded to a multiple of the group (T_pad < T + W).
    const int64_t TR = cp_ ? T + cfg.dsa_cp_world_size : T;
    // Room for the step's packed rows (placed per step right before the
    // request part, packed()): the per-row arrays of the three ratios (at
    // most T rows each), then the RoPE rows of both tables. The request part
    // comes last, so a build copies from its first packed word to cumsum(S)'s end.
    core::StagingLayout layout;
    layout.add("step rows", 3 * kRowArrays * core::align_words(T) + 2 * core::align_words(TR * rope.row_words()) +
                                (crope ? 2 * core::align_words(TR * crope->row_words()) : 0));
    qsl_ = layout.add("query_start_loc", R_ + 1);
    seq_ = layout.add("seq_lens", R_);
    sp_r_ = layout.add("start_pos", R_);
    cu_ = layout.add("cu_seqlens_kv", R_ + 1);
    if (cp_) {
      // docs/design/sparse_cp.md §10: the local lengths, after the request part (one copy).
      lqsl_ = layout.add("dsa_cp_query_start_loc", R_ + 1);
      lseq_ = layout.add("dsa_cp_seq_lens", R_);
      lcu_ = layout.add("dsa_cp_cu_seqlens_kv", R_ + 1);
    }
    if (pcp_) {
      // docs/design/sparse_cp.md §13: this rank's rows and segments, after the request part (one copy).
      // T_loc <= T + B (a chunk pair of a q-token prefill has at most q + 1 rows); at most 4 segments
      // per request (a decode 1; a prefill a real and a pad part of each of its two chunks).
      const int64_t S4 = 4 * R_, TL = T + R_;
      pqsl_ = layout.add("pcp_query_start_loc", S4 + 1);
      pseq_ = layout.add("pcp_seq_lens", S4);
      piseq_ = layout.add("pcp_indexer_seq_lens", S4);
      pcu_ = layout.add("pcp_cu_seqlens_kv", S4 + 1);
      preq_ = layout.add("pcp_req", S4);
      pltok_ = layout.add("pcp_local_token_index", TL);
      ppos_ = layout.add("pcp_positions", TL);
      pgat_ = layout.add("pcp_gather_index", T);
    }
    buffers_ = std::make_unique<aar::detail::StagingBuffers>(layout.words(), cfg.device, separate, cfg.staging_buffers,
                                                        cfg.staging_hooks, slot_base);
    device_ = buffers_->device();
    v_qsl_ = core::RegionViews(device_, qsl_, R_ + 1, at::kInt);
    v_seq_ = core::RegionViews(device_, seq_, R_, at::kInt);
    v_sp_ = core::RegionViews(device_, sp_r_, R_, at::kInt);
    v_cu_ = core::RegionViews(device_, cu_, R_ + 1, at::kInt);
    if (cp_) {
      v_lqsl_ = core::RegionViews(device_, lqsl_, R_ + 1, at::kInt);
      v_lqe_ = core::RegionViews(device_, core::Region{lqsl_.offset + 1, R_}, R_, at::kInt);
      v_lseq_ = core::RegionViews(device_, lseq_, R_, at::kInt);
      v_lcu_ = core::RegionViews(device_, lcu_, R_ + 1, at::kInt);
      for (core::ViewCache* c : {&v_lcos_, &v_lsin_, &v_lccos_, &v_lcsin_, &v_lneg_, &v_lcneg_}) c->resize(T);
      lcql_scr_.assign(static_cast<size_t>(R_), 0);
      lseq_scr_.assign(static_cast<size_t>(R_), 0);
      md_.dsa_cp.world_size = cfg.dsa_cp_world_size;
      md_.dsa_cp.rank = cfg.dsa_cp_rank;
    }
    if (pcp_) {
      const int64_t S4 = 4 * R_, TL = T + R_;
      v_pqsl_ = core::RegionViews(device_, pqsl_, S4 + 1, at::kInt);
      v_pqe_ = core::RegionViews(device_, core::Region{pqsl_.offset + 1, S4}, S4, at::kInt);
      v_pseq_ = core::RegionViews(device_, pseq_, S4, at::kInt);
      v_piseq_ = core::RegionViews(device_, piseq_, S4, at::kInt);
      v_pcu_ = core::RegionViews(device_, pcu_, S4 + 1, at::kInt);
      v_preq_ = core::RegionViews(device_, preq_, S4, at::kInt);
      v_pltok_ = core::RegionViews(device_, pltok_, TL, at::kInt);
      v_ppos_ = core::RegionViews(device_, ppos_, TL, at::kInt);
      v_pgat_ = core::RegionViews(device_, pgat_, T, at::kInt);
      for (core::ViewCache* c : {&v_pcos_, &v_psin_, &v_pneg_, &v_pccos_, &v_pcsin_, &v_pcneg_}) c->resize(TL);
      ptok_scr_.assign(static_cast<size_t>(TL), 0);
      ppos_scr_.assign(static_cast<size_t>(TL), 0);
      pgat_scr_.assign(static_cast<size_t>(T), 0);
      pgcum_scr_.assign(static_cast<size_t>(R_ * cfg.pcp_world_size), 0);
      for (auto* v : {&pqe_scr_, &pseq_scr_, &piseq_scr_, &preq_scr_}) v->assign(static_cast<size_t>(S4), 0);
      pcu_scr_.assign(static_cast<size_t>(S4 + 1), 0);
      const auto ropt = at::TensorOptions().dtype(rope.dtype()).device(cfg.device);
      pcos_ = at::empty({TL, rope.dim()}, ropt);
      psin_ = at::empty({TL, rope.dim()}, ropt);
      pneg_ = at::empty({TL, rope.dim()}, ropt);
      if (crope) {
        const auto copt = at::TensorOptions().dtype(crope->dtype()).device(cfg.device);
        pccos_ = at::empty({TL, crope->dim()}, copt);
        pcsin_ = at::empty({TL, crope->dim()}, copt);
        pcneg_ = at::empty({TL, crope->dim()}, copt);
      }
      md_.pcp.world_size = cfg.pcp_world_size;
      md_.pcp.rank = cfg.pcp_rank;
    }
    if (cfg.dcp_world_size > 1) {
      md_.dcp.world_size = cfg.dcp_world_size;
      md_.dcp.rank = cfg.dcp_rank;
      md_.dcp.interleave = cfg.dcp_interleave;
    }
    for (core::ViewCache* c : {&v_cos_, &v_sin_, &v_ccos_, &v_csin_, &v_neg_, &v_cneg_}) c->resize(T);
    for (int k = 0; k < 3; ++k) {
      v_ridx_[k].resize(T);
      v_rpos_[k].resize(T);
      v_rreq_[k].resize(T);
    }
    sp_.assign(static_cast<size_t>(R_), 0);
    q_.assign(static_cast<size_t>(R_), 0);
    positions_.assign(static_cast<size_t>(TR), 0);
    // The -sin rows (stable buffers; see StepMetadata::neg_sin).
    const auto topt = at::TensorOptions().dtype(rope.dtype()).device(cfg.device);
    neg_ = at::empty({T, rope.dim()}, topt);
    if (crope) cneg_ = at::empty({T, crope->dim()}, topt.dtype(crope->dtype()));
    if (cp_) {
      lneg_ = at::empty({T, rope.dim()}, topt);
      if (crope) lcneg_ = at::empty({T, crope->dim()}, topt.dtype(crope->dtype()));
    }
    md_.draft_index = draft_index;
    md_.decode_threshold = 1 + cfg.num_speculative_tokens;
  }

  const StepMetadata& metadata() const { return md_; }
  uint64_t generation() const { return counter_.current(); }
  void set_tables(const at::Tensor& c, const at::Tensor& s, const at::Tensor& cc, const at::Tensor& cs) {
    md_.rope_cos_table = c;
    md_.rope_sin_table = s;
    md_.compress_cos_table = cc;
    md_.compress_sin_table = cs;
  }

  const StepMetadata& build(const StepInputs& in, const plan::AttentionState* capture) {
    const int32_t thr = 1 + cfg_.num_speculative_tokens;
    core::refuse_unread(in, core::kBlockTable | core::kIsPrefilling | core::kReqIds,
                        "the DSA StepBuilder (each group's block table goes to its GroupBuilder)");
    // A draft lane holds max_num_reqs * decode_threshold requests.
    core::check_step_fits(in, cfg_, /*max_blocks_per_req=*/-1, draft_index_ < 0 ? -1 : R_);
    plan::DsaStepInputs di;
    static_cast<core::StepInput&>(di) = in;
    di.num_reqs_actual = in.num_reqs_actual;
    di.num_speculative_tokens = cfg_.num_speculative_tokens;
    di.max_num_reqs = static_cast<int32_t>(R_);
    di.max_num_tokens = cfg_.max_num_tokens;
    // Validates everything about the batch; writes only the private start_pos scratch.
    plan::DsaStepPlan p = plan::plan_dsa_step(di, plan::Span<int32_t>(sp_.data(), sp_.size()));
    // B requests (graph padding included) holding t_q tokens; t_in rows in all.
    const int32_t B = p.num_reqs, t_q = p.num_actual_tokens, t_in = p.num_input_tokens;
    const int32_t* qsl = in.query_start_loc.data();
    const int32_t* seq = in.seq_lens.data();

    // Decode-first (docs/design/dsa.md §3.1: upstream reorders; the split assumes it).
    for (int32_t b = p.split.num_decodes; b < p.num_reqs_actual; ++b) {
      const int32_t q = qsl[b + 1] - qsl[b];
      AAR_CHECK_ARG(q > thr, "query_start_loc: request ", b, " has ", q, " tokens (a decode at decode_threshold=",
                    thr, ") after the first prefill (request ", p.split.num_decodes,
                    "): the DSA builder needs a decode-first batch; reorder it with plan::reorder_decode_first");
    }
    // RoPE positions within both tables (the largest is max over requests of
    // start_pos + q - 1).
    // Branch-free (start_pos + q - 1 fits int32: it is S - 1 or, for padding
    // rows, q - 1).
    int32_t max_pos = -1;
    int64_t sum_s = 0;
    {
      int32_t* const qv = q_.data();
      const int32_t* const spv = sp_.data();
      for (int32_t b = 0; b < B; ++b) {
        const int32_t q = qsl[b + 1] - qsl[b];
        qv[b] = q;
        // start_pos + q - 1 when q > 0 (q >= 0 was validated), else -1: a select, not a branch.
        max_pos = std::max(max_pos, ((spv[b] + q) & -static_cast<int32_t>(q > 0)) - 1);
        sum_s += seq[b];
      }
    }
    if (t_in > t_q) max_pos = std::max(max_pos, 0);
    AAR_CHECK_ARG(max_pos < rope_.positions(), "seq_lens: a token at position ", max_pos,
                  " is past the rope_theta table (cos_table has ", rope_.positions(), " rows)");
    AAR_CHECK_ARG(crope_ == nullptr || max_pos < crope_->positions(), "seq_lens: a token at position ", max_pos,
                  " is past the compress_rope_theta table (compress_cos_table has ",
                  crope_ ? crope_->positions() : 0, " rows)");
    AAR_CHECK_ARG(sum_s <= std::numeric_limits<int32_t>::max(), "seq_lens: their sum ", sum_s,
                  " (cu_seqlens_kv) exceeds int32");
    plan::AttentionState state;
    if (capture != nullptr) {
      AAR_CHECK_ARG(p.split.num_prefills == 0, "build_for_graph_capture: the batch has ", p.split.num_prefills,
                    " prefill request(s); a captured ", plan::to_string(*capture), " step takes decodes only");
      state = *capture;
    } else if (in.attn_state.has_value()) {
      state = *in.attn_state;
      // PrefillNoCache attends over the new tokens alone (docs/design/gqa.md §2.1): no request may have context.
      if (state == plan::AttentionState::PrefillNoCache) {
        for (int64_t i = 0; i < B; ++i) {
          AAR_CHECK_ARG(sp_[static_cast<size_t>(i)] == 0, "attn_state=PrefillNoCache was given, but request ", i,
                        " has cached tokens (seq_lens[", i, "]=", sp_[static_cast<size_t>(i)] + q_[static_cast<size_t>(i)],
                        ", query length ", q_[static_cast<size_t>(i)], "): that state attends over the new tokens alone");
        }
      }
    } else {
      plan::StateInputs si;
      si.num_computed_tokens = plan::CSpan<int32_t>(sp_.data(), static_cast<size_t>(B));
      si.num_scheduled_tokens = plan::CSpan<int32_t>(q_.data(), static_cast<size_t>(B));
      si.num_spec_tokens = in.num_spec_tokens;
      si.spec_method = cfg_.num_speculative_tokens > 0 ? plan::SpecMethod::Mtp : plan::SpecMethod::None;
      si.chunked_prefill_enabled = cfg_.chunked_prefill_enabled;
      state = plan::select_attention_state(si);
    }

    // docs/design/sparse_cp.md §13: this rank's rows of the global step, into private scratch. A step with
    // prefills splits them (no graph padding, not in a draft lane); a step without is replicated (§13.4):
    // every rank's rows are the step's t_in rows, graph padding included.
    plan::DsaPcpPlan pplan;
    if (pcp_) {
      const int32_t np = p.split.num_prefills;
      if (np > 0 && draft_index_ >= 0) {
        throw_not_supported("build_for_drafting with pcp_world_size=", cfg_.pcp_world_size, ": the draft step has ",
                            np, " request(s) of more than decode_threshold=", thr, " tokens; a draft step under DSA "
                            "PCP is replicated on every rank and takes decodes only (docs/design/sparse_cp.md §13.4)");
      }
      AAR_CHECK_ARG(np == 0 || (p.num_reqs_actual == B && t_in == t_q), "num_reqs_actual=", p.num_reqs_actual,
                    " / num_input_tokens=", t_in, " with pcp_world_size=", cfg_.pcp_world_size,
                    ": a PCP step with prefills is the global batch without graph padding (", B, " requests, ", t_q,
                    " tokens; docs/design/sparse_cp.md §13)");
      plan::SparsePcpInputs pi;
      pi.query_start_loc = plan::CSpan<int32_t>(qsl, static_cast<size_t>(B) + 1);
      pi.seq_lens = plan::CSpan<int32_t>(seq, static_cast<size_t>(B));
      pi.num_decodes = p.split.num_decodes;
      pi.pcp_size = cfg_.pcp_world_size;
      pi.pcp_rank = cfg_.pcp_rank;
      plan::DsaPcpBuffers pb;
      pb.rows.local_token_index = plan::Span<int32_t>(ptok_scr_.data(), ptok_scr_.size());
      pb.rows.positions = plan::Span<int32_t>(ppos_scr_.data(), ppos_scr_.size());
      pb.rows.gather_index = plan::Span<int32_t>(pgat_scr_.data(), pgat_scr_.size());
      pb.rows.gathered_cum_query_lens = plan::Span<int32_t>(pgcum_scr_.data(), pgcum_scr_.size());
      pb.rows.indexer_cum_query_lens = plan::Span<int32_t>(pqe_scr_.data(), pqe_scr_.size());
      pb.rows.indexer_seq_lens = plan::Span<int32_t>(piseq_scr_.data(), piseq_scr_.size());
      pb.rows.indexer_req = plan::Span<int32_t>(preq_scr_.data(), preq_scr_.size());
      pb.sas_seq_lens = plan::Span<int32_t>(pseq_scr_.data(), pseq_scr_.size());
      pb.sas_cu_seqlens_kv = plan::Span<int32_t>(pcu_scr_.data(), pcu_scr_.size());
      pplan = plan::plan_dsa_pcp_step(pi, pb);
      if (np == 0) {
        // Replicated: the plan's rows are the step's t_q tokens in order; the bucket's rows past them
        // (num_input_tokens > t_q) are rows of no request (-1, position 0), as the layer's input has them.
        std::fill(ptok_scr_.begin() + t_q, ptok_scr_.begin() + t_in, -1);
        std::fill(ppos_scr_.begin() + t_q, ppos_scr_.begin() + t_in, 0);
        pplan.sizes.local_tokens = t_in;
      }
    }
    // docs/design/sparse_cp.md §4 on the kernel requests (graph padding included), into private
    // scratch: it validates before its writes and the staging buffer stays untouched until below.
    plan::TokenShard shard;
    int32_t lmax_q = 0, lmax_kv = 0;
    if (cp_) {
      plan::TokenShardInputs ti;
      ti.query_start_loc = plan::CSpan<int32_t>(qsl, static_cast<size_t>(B) + 1);
      ti.seq_lens = plan::CSpan<int32_t>(seq, static_cast<size_t>(B));
      ti.num_input_tokens = t_in;
      ti.world = cfg_.dsa_cp_world_size;
      ti.rank = cfg_.dsa_cp_rank;
      plan::TokenShardBuffers tb;
      tb.local_cum_query_lens = plan::Span<int32_t>(lcql_scr_.data(), static_cast<size_t>(B));
      tb.local_seq_lens = plan::Span<int32_t>(lseq_scr_.data(), static_cast<size_t>(B));
      shard = plan::plan_token_shard(ti, tb);
      for (int32_t b = 0, prev = 0; b < B; ++b) {
        lmax_q = std::max(lmax_q, lcql_scr_[static_cast<size_t>(b)] - prev);
        lmax_kv = std::max(lmax_kv, lseq_scr_[static_cast<size_t>(b)]);
        prev = lcql_scr_[static_cast<size_t>(b)];
      }
    }
    // RoPE rows gathered: the step's, or (DSA-CP) its padded count (position 0 past the step).
    const int32_t t_rope = cp_ ? shard.num_tokens_pad : t_in;

    // ---- writes
    int32_t counts[3];
    for (int k = 0; k < 3; ++k) counts[k] = plan::dsa_num_compressed_tokens(t_in, B, kRatios[k]);
    const Packed r = packed(t_rope, counts);
    int32_t* s = buffers_->begin();
    // The rows of each V4 ratio, once for all groups of the ratio, listed
    // straight into the staging buffer with their per-row arrays. Cannot
    // fail here: plan_dsa_rows checks what plan_dsa_step validated above (the
    // same arrays) and room for num_compressed_tokens rows, which each
    // region has; and it checks all three before it writes.
    plan::DsaRows rows[3];
    plan::DsaRowBuffers row_bufs[3];
    for (int k = 0; k < 3; ++k) {
      const auto nr = static_cast<size_t>(counts[k]);
      row_bufs[k] = {plan::Span<int32_t>(s + r.req[k], nr), plan::Span<int32_t>(s + r.idx[k], nr)};
    }
    plan::plan_dsa_rows(p, plan::CSpan<int32_t>(kRatios, 3), plan::CSpan<plan::DsaRowBuffers>(row_bufs, 3),
                        plan::Span<plan::DsaRows>(rows, 3));
    for (int k = 0; k < 3; ++k) {
      const auto nr = static_cast<size_t>(counts[k]);
      int32_t* idx = s + r.idx[k];
      int32_t* rpos = s + r.pos[k];
      int32_t* req = s + r.req[k];
      const size_t n = rows[k].index.size();
      const int sh = kRatioShifts[k];  // c * r for the power-of-two r
      for (size_t i = 0; i < n; ++i) rpos[i] = idx[i] << sh;
      std::fill(idx + n, idx + nr, -1);
      std::fill(rpos + n, rpos + nr, 0);
      std::fill(req + n, req + nr, -1);
    }
    std::memcpy(s + qsl_.offset, qsl, (static_cast<size_t>(B) + 1) * 4);
    std::memcpy(s + seq_.offset, seq, static_cast<size_t>(B) * 4);
    std::memcpy(s + sp_r_.offset, sp_.data(), static_cast<size_t>(B) * 4);
    int32_t* cu = s + cu_.offset;
    cu[0] = 0;
    for (int32_t b = 0; b < B; ++b) cu[b + 1] = cu[b] + seq[b];
    if (cp_) {
      int32_t* lq = s + lqsl_.offset;
      int32_t* lcu = s + lcu_.offset;
      lq[0] = 0;
      lcu[0] = 0;
      std::memcpy(lq + 1, lcql_scr_.data(), static_cast<size_t>(B) * 4);
      std::memcpy(s + lseq_.offset, lseq_scr_.data(), static_cast<size_t>(B) * 4);
      for (int32_t b = 0; b < B; ++b) lcu[b + 1] = lcu[b] + lseq_scr_[static_cast<size_t>(b)];
    }
    if (pcp_) {
      const auto ns = static_cast<size_t>(pplan.sizes.indexer_reqs);
      const auto tl = static_cast<size_t>(pplan.sizes.local_tokens);
      s[pqsl_.offset] = 0;
      std::memcpy(s + pqsl_.offset + 1, pqe_scr_.data(), ns * 4);
      std::memcpy(s + pseq_.offset, pseq_scr_.data(), ns * 4);
      std::memcpy(s + piseq_.offset, piseq_scr_.data(), ns * 4);
      std::memcpy(s + pcu_.offset, pcu_scr_.data(), (ns + 1) * 4);
      std::memcpy(s + preq_.offset, preq_scr_.data(), ns * 4);
      std::memcpy(s + pltok_.offset, ptok_scr_.data(), tl * 4);
      std::memcpy(s + ppos_.offset, ppos_scr_.data(), tl * 4);
      std::memcpy(s + pgat_.offset, pgat_scr_.data(), static_cast<size_t>(t_q) * 4);
    }
    int32_t* pos = positions_.data();
    if (t_q == B && p.max_seqlen_q == 1) {
      // Every request one token (a decode step): its position is its start_pos.
      std::memcpy(pos, sp_.data(), static_cast<size_t>(B) * 4);
    } else {
      for (int32_t b = 0; b < B; ++b) {
        const int32_t base = sp_[static_cast<size_t>(b)];
        for (int32_t i = qsl[b], j = 0; i < qsl[b + 1]; ++i, ++j) pos[i] = base + j;
      }
    }
    std::fill(pos + t_q, pos + t_rope, 0);
    auto* bytes = reinterpret_cast<uint8_t*>(s);
    const bool decode_only = p.max_seqlen_q <= thr;
    auto gather = [&](const aar::detail::RopeRows& rr, int64_t oc, int64_t os) {
      uint8_t* out_c = bytes + oc * 4;
      uint8_t* out_s = bytes + os * 4;
      if (decode_only) {
        rr.gather(pos, t_rope, out_c, out_s);
        return;
      }
      const size_t rb = static_cast<size_t>(rr.row_bytes());
      for (int32_t b = 0; b < B; ++b) {
        const int32_t q = q_[static_cast<size_t>(b)];
        if (q > 0) rr.copy_run(pos[qsl[b]], q, out_c + static_cast<size_t>(qsl[b]) * rb, out_s + qsl[b] * rb);
      }
      rr.gather(pos + t_q, t_rope - t_q, out_c + t_q * rb, out_s + t_q * rb);
    };
    gather(rope_, r.cos, r.sin);
    if (crope_ != nullptr) gather(*crope_, r.ccos, r.csin);
    // One host-to-device copy: from the first row array to cumsum(S)'s end.
    buffers_->copy(r.first, (pcp_ ? pgat_.offset + t_q : cp_ ? lcu_.offset + B + 1 : cu_.offset + B + 1) - r.first);
    buffers_->finish();
    counter_.next(md_.stamp);

    // The counts' one meaning (StepMetadata): over the real requests. The
    // real ones are decode-first (checked above), so their split is the
    // kernels' split cut at num_reqs_actual.
    const int32_t nra = p.num_reqs_actual;
    const int32_t nd = std::min(p.split.num_decodes, nra);
    md_.num_reqs = nra;
    md_.num_kernel_reqs = B;
    md_.num_actual_tokens = qsl[nra];
    md_.num_kernel_tokens = t_q;
    md_.num_input_tokens = t_in;
    md_.num_decodes = nd;
    md_.num_decode_tokens = qsl[nd];
    md_.num_prefills = nra - nd;
    md_.num_prefill_tokens = qsl[nra] - qsl[nd];
    md_.max_seqlen_q = p.max_seqlen_q;
    md_.max_seqlen_kv = p.max_seqlen_kv;
    if (nra == B) {
      md_.max_query_len = p.max_seqlen_q;
      md_.max_seq_len = p.max_seqlen_kv;
    } else {
      int32_t mq = 0, ms = 0;
      for (int32_t b = 0; b < nra; ++b) {
        mq = std::max(mq, q_[static_cast<size_t>(b)]);
        ms = std::max(ms, seq[b]);
      }
      md_.max_query_len = mq;
      md_.max_seq_len = ms;
    }
    md_.attn_state = state;
    const size_t ub = static_cast<size_t>(B);
    set(md_.query_start_loc, v_qsl_.first(B + 1));
    set(md_.seq_lens, v_seq_.first(B));
    set(md_.start_pos, v_sp_.first(B));
    set(md_.cu_seqlens_kv, v_cu_.first(B + 1));
    const size_t ut = static_cast<size_t>(t_in);
    set(md_.cos, v_cos_.get(t_in, r.cos, [&] { return rope_.view(device_, r.cos, t_in); }));
    set(md_.sin, v_sin_.get(t_in, r.sin, [&] { return rope_.view(device_, r.sin, t_in); }));
    if (crope_ != nullptr) {
      set(md_.compress_cos, v_ccos_.get(t_in, r.ccos, [&] { return crope_->view(device_, r.ccos, t_in); }));
      set(md_.compress_sin, v_csin_.get(t_in, r.csin, [&] { return crope_->view(device_, r.csin, t_in); }));
    }
    {
      // Device work after the copy (same stream): the inverse RoPE's rows.
      detail::InferenceScope guard;
      set(md_.neg_sin, v_neg_.get(t_in, [&] { return neg_.narrow(0, 0, t_in); }));
      ops::dense::neg_out(md_.neg_sin, md_.sin);
      if (crope_ != nullptr) {
        set(md_.compress_neg_sin, v_cneg_.get(t_in, [&] { return cneg_.narrow(0, 0, t_in); }));
        ops::dense::neg_out(md_.compress_neg_sin, md_.compress_sin);
      }
      if (cp_) fill_dsa_cp(shard, r, s, B, lmax_q, lmax_kv);
      if (pcp_) fill_pcp(pplan, s, t_q);
    }
    md_.query_start_loc_host = plan::CSpan<int32_t>(s + qsl_.offset, ub + 1);
    md_.seq_lens_host = plan::CSpan<int32_t>(s + seq_.offset, ub);
    md_.start_pos_host = plan::CSpan<int32_t>(s + sp_r_.offset, ub);
    md_.positions_host = plan::CSpan<int32_t>(pos, ut);
    for (int k = 0; k < 3; ++k) {
      const int64_t nr = counts[k];
      const auto unr = static_cast<size_t>(nr);
      StepMetadata::RowArrays& ra = md_.row_arrays[k];
      set(ra.index, v_ridx_[k].get(nr, r.idx[k], [&] { return device_.narrow(0, r.idx[k], nr); }));
      set(ra.position, v_rpos_[k].get(nr, r.pos[k], [&] { return device_.narrow(0, r.pos[k], nr); }));
      set(ra.request, v_rreq_[k].get(nr, r.req[k], [&] { return device_.narrow(0, r.req[k], nr); }));
      ra.index_host = plan::CSpan<int32_t>(s + r.idx[k], unr);
      ra.position_host = plan::CSpan<int32_t>(s + r.pos[k], unr);
      ra.request_host = plan::CSpan<int32_t>(s + r.req[k], unr);
    }
    p.query_start_loc = md_.query_start_loc_host;
    p.seq_lens = md_.seq_lens_host;
    p.start_pos = md_.start_pos_host;
    md_.plan = p;
    md_.rows_r1 = rows[0];
    md_.rows_r4 = rows[1];
    md_.rows_r128 = rows[2];
    return md_;
  }

 private:
  // The V4 ratios whose rows the step lists (StepMetadata::ratio_slot's order)
  // and the arrays per ratio (index, position, request).
  static constexpr int32_t kRatios[3] = {1, 4, 128};
  static constexpr int kRatioShifts[3] = {0, 2, 7};
  static_assert((1 << kRatioShifts[0]) == kRatios[0] && (1 << kRatioShifts[1]) == kRatios[1] &&
                    (1 << kRatioShifts[2]) == kRatios[2],
                "kRatioShifts are log2(kRatios)");
  static constexpr int64_t kRowArrays = 3;
  // Word offsets of a step of n tokens whose ratios emit counts[k] rows: the
  // row arrays of each ratio, then the RoPE rows, packed so that they end (up
  // to alignment) at the request part.
  struct Packed {
    int64_t first;  // the first word of the step's copy
    int64_t idx[3], pos[3], req[3];
    int64_t cos, sin, ccos, csin;
  };
  Packed packed(int64_t n, const int32_t (&counts)[3]) const {
    const int64_t w1 = n * rope_.row_words(), w2 = crope_ ? n * crope_->row_words() : 0;
    Packed r;
    r.first = core::StagingLayout::pack_before(
        qsl_.offset, {{&r.idx[0], counts[0]}, {&r.pos[0], counts[0]}, {&r.req[0], counts[0]},
                      {&r.idx[1], counts[1]}, {&r.pos[1], counts[1]}, {&r.req[1], counts[1]},
                      {&r.idx[2], counts[2]}, {&r.pos[2], counts[2]}, {&r.req[2], counts[2]},
                      {&r.cos, w1}, {&r.sin, w1}, {&r.ccos, w2}, {&r.csin, w2}});
    return r;
  }

  // docs/design/sparse_cp.md §10: the step's DSA-CP part (views of the local lengths and of
  // the slice's RoPE rows, the slice's -sin rows), after the copy (the -sin on the device).
  void fill_dsa_cp(const plan::TokenShard& sh, const Packed& r, const int32_t* s, int32_t B, int32_t lmax_q,
                   int32_t lmax_kv) {
    DsaCpStepMetadata& c = md_.dsa_cp;
    const int64_t tpr = sh.tokens_per_rank, ls = sh.local_start;
    c.num_tokens_pad = sh.num_tokens_pad;
    c.tokens_per_rank = sh.tokens_per_rank;
    c.local_start = sh.local_start;
    c.local_end = sh.local_end;
    c.max_seqlen_q = lmax_q;
    c.max_seqlen_kv = lmax_kv;
    const size_t ub = static_cast<size_t>(B);
    set(c.query_start_loc, v_lqsl_.first(B + 1));
    set(c.q_ends, v_lqe_.first(B));
    set(c.seq_lens, v_lseq_.first(B));
    set(c.cu_seqlens_kv, v_lcu_.first(B + 1));
    c.query_start_loc_host = plan::CSpan<int32_t>(s + lqsl_.offset, ub + 1);
    c.seq_lens_host = plan::CSpan<int32_t>(s + lseq_.offset, ub);
    // The slice's rows of the padded step's (their offset moves with the step's other packed
    // regions: the key; ls is rank * tpr, fixed by tpr).
    set(c.cos, v_lcos_.get(tpr, r.cos, [&] { return rope_.view(device_, r.cos + ls * rope_.row_words(), tpr); }));
    set(c.sin, v_lsin_.get(tpr, r.sin, [&] { return rope_.view(device_, r.sin + ls * rope_.row_words(), tpr); }));
    set(c.neg_sin, v_lneg_.get(tpr, [&] { return lneg_.narrow(0, 0, tpr); }));
    ops::dense::neg_out(c.neg_sin, c.sin);
    if (crope_ != nullptr) {
      const int64_t w = crope_->row_words();
      set(c.compress_cos, v_lccos_.get(tpr, r.ccos, [&] { return crope_->view(device_, r.ccos + ls * w, tpr); }));
      set(c.compress_sin, v_lcsin_.get(tpr, r.csin, [&] { return crope_->view(device_, r.csin + ls * w, tpr); }));
      set(c.compress_neg_sin, v_lcneg_.get(tpr, [&] { return lcneg_.narrow(0, 0, tpr); }));
      ops::dense::neg_out(c.compress_neg_sin, c.compress_sin);
    }
  }

  // docs/design/sparse_cp.md §13: the step's PCP part (views of the staged rows and segments), and the local
  // rows' RoPE rows gathered on the device from the full tables by their positions, with their -sin.
  void fill_pcp(const plan::DsaPcpPlan& pp, const int32_t* s, int32_t t_q) {
    PcpStepMetadata& c = md_.pcp;
    const int64_t tl = pp.sizes.local_tokens, ns = pp.sizes.indexer_reqs;
    c.num_local_tokens = static_cast<int32_t>(tl);
    c.num_segments = static_cast<int32_t>(ns);
    c.max_seqlen_q = pp.max_seqlen_q;
    c.max_seqlen_kv = pp.max_seqlen_kv;
    c.max_indexer_seqlen_kv = pp.max_indexer_seqlen_kv;
    set(c.local_token_index, v_pltok_.first(tl));
    set(c.gather_index, v_pgat_.first(t_q));
    set(c.query_start_loc, v_pqsl_.first(ns + 1));
    set(c.q_ends, v_pqe_.first(ns));
    set(c.seq_lens, v_pseq_.first(ns));
    set(c.indexer_seq_lens, v_piseq_.first(ns));
    set(c.cu_seqlens_kv, v_pcu_.first(ns + 1));
    set(c.req, v_preq_.first(ns));
    const at::Tensor& pos = v_ppos_.first(tl);
    auto rows = [&](core::ViewCache& vc, const at::Tensor& buf, at::Tensor& dst, const at::Tensor& table) {
      set(dst, vc.get(tl, [&] { return buf.narrow(0, 0, tl); }));
      at::index_select_out(dst, table, 0, pos);
    };
    rows(v_pcos_, pcos_, c.cos, md_.rope_cos_table);
    rows(v_psin_, psin_, c.sin, md_.rope_sin_table);
    set(c.neg_sin, v_pneg_.get(tl, [&] { return pneg_.narrow(0, 0, tl); }));
    ops::dense::neg_out(c.neg_sin, c.sin);
    if (crope_ != nullptr) {
      rows(v_pccos_, pccos_, c.compress_cos, md_.compress_cos_table);
      rows(v_pcsin_, pcsin_, c.compress_sin, md_.compress_sin_table);
      set(c.compress_neg_sin, v_pcneg_.get(tl, [&] { return pcneg_.narrow(0, 0, tl); }));
      ops::dense::neg_out(c.compress_neg_sin, c.compress_sin);
    }
    const auto ul = static_cast<size_t>(tl), us = static_cast<size_t>(ns);
    c.local_token_index_host = plan::CSpan<int32_t>(s + pltok_.offset, ul);
    c.query_start_loc_host = plan::CSpan<int32_t>(s + pqsl_.offset, us + 1);
    c.seq_lens_host = plan::CSpan<int32_t>(s + pseq_.offset, us);
    c.req_host = plan::CSpan<int32_t>(s + preq_.offset, us);
  }

  const StepBuilderConfig& cfg_;
  const aar::detail::RopeRows& rope_;
  const aar::detail::RopeRows* crope_;
  int32_t draft_index_;
  int64_t R_;
  bool cp_ = false;                     // DSA-CP (the main lane of a dsa_cp_world_size > 1 builder)
  bool pcp_ = false;                    // PCP (the main lane of a pcp_world_size > 1 builder)
  core::Region pqsl_, pseq_, piseq_, pcu_, preq_, pltok_, ppos_, pgat_;  // PCP: after cu_
  core::RegionViews v_pqsl_, v_pqe_, v_pseq_, v_piseq_, v_pcu_, v_preq_, v_pltok_, v_ppos_, v_pgat_;
  core::ViewCache v_pcos_, v_psin_, v_pneg_, v_pccos_, v_pcsin_, v_pcneg_;
  at::Tensor pcos_, psin_, pneg_, pccos_, pcsin_, pcneg_;
  std::vector<int32_t> ptok_scr_, ppos_scr_, pgat_scr_, pgcum_scr_, pqe_scr_, pseq_scr_, piseq_scr_, preq_scr_,
      pcu_scr_;
  core::Region qsl_, seq_, sp_r_, cu_;  // the request part
  core::Region lqsl_, lseq_, lcu_;      // DSA-CP: the local lengths (after cu_)
  core::RegionViews v_lqsl_, v_lqe_, v_lseq_, v_lcu_;
  core::ViewCache v_lcos_, v_lsin_, v_lccos_, v_lcsin_, v_lneg_, v_lcneg_;
  at::Tensor lneg_, lcneg_;
  std::vector<int32_t> lcql_scr_, lseq_scr_;
  std::unique_ptr<aar::detail::StagingBuffers> buffers_;
  at::Tensor device_, neg_, cneg_;
  std::vector<int32_t> sp_, q_, positions_;
  core::RegionViews v_qsl_, v_seq_, v_sp_, v_cu_;
  // Views of the packed rows by count (remade when the count's offset moves),
  // and of the -sin buffers.
  core::ViewCache v_ridx_[3], v_rpos_[3], v_rreq_[3];
  core::ViewCache v_cos_, v_sin_, v_ccos_, v_csin_, v_neg_, v_cneg_;
  StepMetadata md_;
  detail::BuildCounter counter_;
};

StepBuilder::StepBuilder(const StepBuilderConfig& cfg) : cfg_(cfg) {
  core::check_capacities(cfg);
  core::check_staging(cfg);
  const int32_t drafts = cfg.num_drafts.value_or(cfg.num_speculative_tokens);
  AAR_CHECK_ARG(drafts >= 0 && drafts <= 15, "num_drafts must be in [0, 15], got ", drafts);
  const ModelSettings& ms = cfg.model;
  AAR_CHECK_ARG(ms.head_dim > 0, "head_dim must be positive, got ", ms.head_dim);
  AAR_CHECK_ARG(ms.window >= 1, "window must be positive, got ", ms.window);
  AAR_CHECK_ARG(ms.dspark_num_spec >= 0, "dspark_num_spec must be >= 0, got ", ms.dspark_num_spec);
  if (ms.dspark_num_spec > 0) plan::dspark_swa_width(ms.window, ms.dspark_num_spec, ms.dspark_width);
  AAR_CHECK_ARG(ms.num_heads_q >= 0, "num_heads_q must be >= 0 (0: no SAS blob), got ", ms.num_heads_q);
  AAR_CHECK_ARG(ms.index_n_heads >= 0, "index_n_heads must be >= 0 (0: no QLI blob), got ", ms.index_n_heads);
  AAR_CHECK_ARG(ms.index_head_dim > 0, "index_head_dim must be positive, got ", ms.index_head_dim);
  AAR_CHECK_ARG(ms.index_topk > 0, "index_topk must be positive, got ", ms.index_topk);
  AAR_CHECK_ARG(cfg.dsa_cp_world_size >= 1 && cfg.dsa_cp_rank >= 0 && cfg.dsa_cp_rank < cfg.dsa_cp_world_size,
                "dsa_cp_rank=", cfg.dsa_cp_rank, " is not a rank of a DSA-CP group of dsa_cp_world_size=",
                cfg.dsa_cp_world_size);
  AAR_CHECK_ARG(cfg.dcp_world_size >= 1 && cfg.dcp_world_size <= 16 && cfg.dcp_rank >= 0 &&
                    cfg.dcp_rank < cfg.dcp_world_size,
                "dcp_rank=", cfg.dcp_rank, " is not a rank of a DCP group of dcp_world_size=", cfg.dcp_world_size,
                " (dcp_world_size in [1, 16])");
  AAR_CHECK_ARG(cfg.dcp_interleave >= 1, "dcp_interleave must be >= 1, got ", cfg.dcp_interleave);
  if (cfg.dcp_world_size > 1 && cfg.dsa_cp_world_size > 1 &&
      (cfg.dcp_world_size != cfg.dsa_cp_world_size || cfg.dcp_rank != cfg.dsa_cp_rank)) {
    // docs/design/sparse_cp.md §14: the DCP group is the DSA-CP (TP) group, DCP rank r holds token slice r.
    throw_not_supported("dcp_world_size=", cfg.dcp_world_size, " (dcp_rank=", cfg.dcp_rank, ") with dsa_cp_world_size=",
                        cfg.dsa_cp_world_size, " (dsa_cp_rank=", cfg.dsa_cp_rank, "): DSA DCP x DSA-CP is built "
                        "for a DCP group that is the DSA-CP group (same size, same rank; docs/design/sparse_cp.md "
                        "§14)");
  }
  AAR_CHECK_ARG(cfg.pcp_world_size >= 1 && cfg.pcp_world_size <= 16 && cfg.pcp_rank >= 0 &&
                    cfg.pcp_rank < cfg.pcp_world_size,
                "pcp_rank=", cfg.pcp_rank, " is not a rank of a PCP group of pcp_world_size=", cfg.pcp_world_size,
                " (pcp_world_size in [1, 16])");
  if (cfg.pcp_world_size > 1) {
    // docs/design/sparse_cp.md §13.
    if (cfg.dsa_cp_world_size > 1) {
      throw_not_supported("pcp_world_size=", cfg.pcp_world_size, " with dsa_cp_world_size=", cfg.dsa_cp_world_size,
                          ": DSA-CP x PCP is not implemented (both split the step's tokens; docs/design/sparse_cp.md "
                          "§13)");
    }
    if (cfg.dcp_world_size > 1) {
      throw_not_supported("pcp_world_size=", cfg.pcp_world_size, " with dcp_world_size=", cfg.dcp_world_size,
                          ": DSA PCP x DCP is not implemented (the PCP rows over sharded caches would need DCP's "
                          "query gather and LSE merge per segment; docs/design/sparse_cp.md §13)");
    }
    if (ms.dspark_num_spec > 0) {
      throw_not_supported("pcp_world_size=", cfg.pcp_world_size, " with dspark_num_spec=", ms.dspark_num_spec,
                          ": DSpark under DSA PCP is not implemented (its SWA indices are per global token; "
                          "docs/design/sparse_cp.md §13)");
    }
  }
  if (cfg.dcp_world_size > 1 && ms.dspark_num_spec > 0) {
    throw_not_supported("dcp_world_size=", cfg.dcp_world_size, " with dspark_num_spec=", ms.dspark_num_spec,
                        ": DSpark under DSA DCP is not implemented (docs/design/sparse_cp.md §12)");
  }
  if (cfg.dsa_cp_world_size > 1 && ms.dspark_num_spec > 0) {
    throw_not_supported("dsa_cp_world_size=", cfg.dsa_cp_world_size, " with dspark_num_spec=", ms.dspark_num_spec,
                        ": DSpark's non-causal SWA indices under DSA-CP (local lengths of the whole KV, the "
                        "indices sliced per rank) are not implemented (docs/design/sparse_cp.md §10)");
  }
  rope_ = std::make_unique<aar::detail::RopeRows>(cfg.cos_table, cfg.sin_table);
  AAR_CHECK_ARG(rope_->dim() % 2 == 0 && rope_->dim() <= ms.head_dim, "cos_table has ", rope_->dim(),
                " columns: the rope dim must be even and <= head_dim=", ms.head_dim);
  const bool has_c = cfg.compress_cos_table.defined(), has_s = cfg.compress_sin_table.defined();
  AAR_CHECK_ARG(has_c == has_s, "compress_cos_table and compress_sin_table must be given together (got ",
                has_c ? "only compress_cos_table" : "only compress_sin_table", ")");
  if (has_c) {
    try {
      compress_rope_ = std::make_unique<aar::detail::RopeRows>(cfg.compress_cos_table, cfg.compress_sin_table);
    } catch (const InvalidArgument& e) {
      throw_invalid("compress tables: ", e.what());
    }
  }
  cfg_.num_drafts = drafts;
  // Device copies of the full tables (the compressor reads them per row).
  auto dev = [&](const at::Tensor& t) { return t.to(cfg.device); };
  const at::Tensor rc = dev(rope_->cos_table()), rs = dev(rope_->sin_table());
  at::Tensor cc, cs;
  if (compress_rope_) {
    cc = dev(compress_rope_->cos_table());
    cs = dev(compress_rope_->sin_table());
  }
  const bool separate = cfg.separate();
  for (int32_t l = 0; l <= drafts; ++l) {
    const int slot_base = cfg.staging_hooks != nullptr ? l * cfg.staging_buffers : 0;
    const int64_t cap = l == 0 ? cfg.max_num_reqs : int64_t{cfg.max_num_reqs} * decode_threshold();
    lanes_.push_back(
        std::make_unique<Lane>(cfg_, *rope_, compress_rope_.get(), l - 1, cap, separate, slot_base));
    lanes_.back()->set_tables(rc, rs, cc, cs);
  }
}

StepBuilder::~StepBuilder() = default;

StepBuilder::Lane& StepBuilder::lane(int32_t d) const {
  AAR_CHECK_ARG(d >= 0 && d < num_drafts(), "draft_index=", d, " is out of range [0, num_drafts=", num_drafts(), ")");
  return *lanes_[static_cast<size_t>(d) + 1];
}

const StepMetadata& StepBuilder::build(const StepInputs& in) { return lanes_[0]->build(in, nullptr); }

const StepMetadata& StepBuilder::build_for_graph_capture(const StepInputs& in, plan::AttentionState state) {
  static const core::BackendFacts& facts = Backend::facts();
  core::check_capturable(facts, state);
  // DSA PCP (docs/design/sparse_cp.md §13.4): a decode bucket is replicated on every rank (the lane refuses
  // prefills in a capture build first).
  // DSA DCP (docs/design/sparse_cp.md §12.5): the decode bucket builds as without DCP (the lane's
  // dcp block is set at construction; DSpark under DCP was refused there). DSA-CP x DCP (§14.3) too.
  return lanes_[0]->build(in, &state);
}

const StepMetadata& StepBuilder::build_for_drafting(const StepInputs& in, int32_t d) {
  // Under DCP a draft lane carries the step's dcp block like the main lane (docs/design/sparse_cp.md
  // §12.6): its SWA groups localize their slots the same way.
  // Under PCP a draft step of decodes is replicated (docs/design/sparse_cp.md §13.4); the lane refuses prefills.
  if (cfg_.dsa_cp_world_size > 1) {
    throw_not_supported("build_for_drafting with dsa_cp_world_size=", cfg_.dsa_cp_world_size, ": draft steps under "
                        "DSA-CP (per-draft local token metadata) are not implemented (docs/design/sparse_cp.md §10)");
  }
  return lane(d).build(in, nullptr);
}

static_assert(core::is_builder_v<StepBuilder>, "dsa::StepBuilder follows the builder contract");

DsaCacheDims StepBuilder::cache_dims() const {
  DsaCacheDims d;
  d.head_dim = cfg_.model.head_dim;
  d.rope_dim = rope_->dim();
  d.index_head_dim = cfg_.model.index_head_dim;
  return d;
}

int64_t StepBuilder::rope_positions() const { return rope_->positions(); }
int64_t StepBuilder::compress_rope_positions() const { return compress_rope_ ? compress_rope_->positions() : 0; }
const StepMetadata& StepBuilder::metadata() const { return lanes_[0]->metadata(); }
uint64_t StepBuilder::generation() const { return lanes_[0]->generation(); }

// ============================================================= GroupBuilder

class GroupBuilder::Lane {
 public:
  Lane(const GroupBuilder& g, const StepBuilderConfig& scfg, int32_t draft_index, int64_t max_reqs, bool separate,
       int slot_base)
      : g_(g), draft_index_(draft_index), R_(max_reqs) {
    const int64_t T = scfg.max_num_tokens, MB = g.cfg_.max_blocks_per_req;
    fw_ = plan::slot_format_width(g.slot_format_);
    const ModelSettings& ms = g.model();
    // DSpark is the SWA group's (docs/design/dsa.md §3.4).
    dspark_width_ = g.cfg_.kind == DsaCacheKind::Swa && ms.dspark_num_spec > 0
                        ? plan::dspark_swa_width(ms.window, ms.dspark_num_spec, ms.dspark_width)
                        : 0;
    // The SparseFlashMla plan's compressed KV groups stage seqused_cmp_kv /
    // cmp_residual_kv (docs/design/dsa.md §4.2 adapter) next to their rows.
    const DsaCacheKind kind = g.cfg_.kind;
    cmp_lens_ = g.cfg_.plan.renames_seqused_for_flash_mla &&
                (kind == DsaCacheKind::C4Kv || kind == DsaCacheKind::C128Kv);
    // docs/design/sparse_cp.md §12.2: under DCP the SWA group stages each row's owned window slots
    // ((T, 1, window) int32) and the compressed KV groups each row's compressed-row limit ((T, 1)).
    if (scfg.dcp_world_size > 1) {
      dcp_width_ = kind == DsaCacheKind::Swa ? ms.window
                   : kind == DsaCacheKind::C4Kv || kind == DsaCacheKind::C128Kv ? 1
                                                                                : 0;
    }
    // The in-place scatter plan's attention-KV groups stage the graph write's fill slot
    // (GroupMetadata::graph_fill_slot, docs/design/dsa.md §6).
    fill_ = g.cfg_.plan.kv_scatter == KvScatterKind::ScatterNdUpdateInplace &&
            (kind == DsaCacheKind::Swa || kind == DsaCacheKind::C4Kv || kind == DsaCacheKind::C128Kv);
    if (fill_) {
      AAR_CHECK_ARG(fw_ == 2, "internal: the in-place scatter plan's ", to_string(kind), " group has flat slots");
      fill_mark_.assign(static_cast<size_t>(T) + 1, 0);
    }
    // Room for a build's packed rows (packed(): slots, DSpark rows, the
    // SparseFlashMla lengths), then the block table: a build copies from its
    // first packed word to its last table row.
    core::StagingLayout layout;
    layout.add("group rows", core::align_words(T * fw_) + core::align_words(T * dspark_width_) +
                                 (cmp_lens_ ? 2 * core::align_words(R_) : 0) + (fill_ ? core::align_words(2) : 0) +
                                 core::align_words(T * dcp_width_));
    bt_ = layout.add("block_table", R_ * MB);
    buffers_ = std::make_unique<aar::detail::StagingBuffers>(layout.words(), scfg.device, separate,
                                                        scfg.staging_buffers, scfg.staging_hooks, slot_base);
    device_ = buffers_->device();
    for (core::ViewCache* c : {&v_slots_, &v_ds_, &v_ccos_, &v_csin_, &v_cslots_, &v_dcp_}) c->resize(T);
    for (core::ViewCache* c : {&v_bt_, &v_scmp_, &v_cres_}) c->resize(R_);
    v_fill_.resize(0);
    block_scratch_.assign(static_cast<size_t>(T), 0);
    if (dspark_width_ > 0) dspark_scratch_.assign(static_cast<size_t>(T * dspark_width_), -1);
    const auto i32 = at::TensorOptions().dtype(at::kInt).device(scfg.device);
    md_.sas_metadata = at::zeros({kBlobWords}, i32);
    md_.qli_metadata = at::zeros({kBlobWords}, i32);
    if (g.spec_.compress_ratio > 1) {
      // compressor_metadata's outputs (GroupMetadata::compressed_*), T rows at most.
      const at::Tensor& ct = g.step_.metadata().compress_cos_table;
      const auto copt = at::TensorOptions().dtype(ct.scalar_type()).device(scfg.device);
      ccos_ = at::empty({T * ct.size(1)}, copt);
      csin_ = at::empty({T * ct.size(1)}, copt);
      cslots_ = at::empty({T * fw_}, i32);
    }
    empty_ = at::empty({0}, i32);
    // PCP: the groups whose table the attention or the indexer reads get their segments' rows.
    if (scfg.pcp_world_size > 1 && draft_index < 0 && kind != DsaCacheKind::C4AttnState &&
        kind != DsaCacheKind::C4IndexerState && kind != DsaCacheKind::C128State) {
      pbt_ = at::zeros({4 * R_ * MB}, i32);
      v_pbt_.resize(4 * R_);
    }
    md_.kind = g.cfg_.kind;
    md_.num_blocks = g.cfg_.num_blocks;
    md_.window = ms.window;
    md_.compress_ratio = g.spec_.compress_ratio;
    md_.block_size = static_cast<int32_t>(g.spec_.block_size);
    md_.storage_block_size = static_cast<int32_t>(g.spec_.storage_block_size);
    md_.slot_format = g.slot_format_;
    md_.draft_index = draft_index;
    md_.dspark_width = dspark_width_;
  }

  const GroupMetadata& metadata() const { return md_; }
  uint64_t generation() const { return counter_.current(); }
  at::Tensor staged_rows(int64_t rows) const {
    const int64_t MB = g_.cfg_.max_blocks_per_req;
    return buffers_->host(0).narrow(0, bt_.offset, rows * MB).view({rows, MB});
  }

  const GroupMetadata& build(const StepMetadata& st, const GroupInputs& in) {
    check_current(st.stamp, "step metadata");
    AAR_CHECK_ARG(st.draft_index >= 0 || st.stamp.live == g_.step_.metadata().stamp.live,
                  "step metadata comes from another StepBuilder than this group's");
    AAR_CHECK_ARG(st.draft_index == draft_index_, "step metadata is from ",
                  st.draft_index < 0 ? std::string("the main lane") : "draft lane " + std::to_string(st.draft_index),
                  " but this is a ",
                  draft_index_ < 0 ? std::string("main build") : "draft build of draft_index " +
                                                                     std::to_string(draft_index_));
    const int32_t B = st.num_kernel_reqs, T = st.num_input_tokens;
    AAR_CHECK_ARG(B <= R_, "the step's num_kernel_reqs=", B, " exceeds the group lane's request capacity ", R_);
    AAR_CHECK_ARG(in.block_table_stride >= 0 && in.block_table_stride <= g_.cfg_.max_blocks_per_req,
                  "block_table_stride=", in.block_table_stride, " must be in [0, max_blocks_per_req=",
                  g_.cfg_.max_blocks_per_req, "]");
    const int32_t ratio = std::max(g_.spec_.compress_ratio, 1);
    const int32_t rows = plan::dsa_num_compressed_tokens(T, B, ratio);
    const bool dspark = dspark_width_ > 0 && !st.has_prefill();
    const ModelSettings& ms = g_.model();
    // The attention call's window (docs/design/dsa.md §3.4: DSpark widens it to the draft block).
    const int32_t win_left = dspark ? ms.window + ms.dspark_num_spec - 1 : ms.window - 1;
    const Packed r = packed(rows, dspark ? T : 0, B, dcp_width_ > 0 ? T : 0);

    // DSpark first into the private scratch (validates; the staging buffer
    // stays untouched if anything below fails).
    if (dspark) {
      plan::DsparkSwaInputs di;
      di.query_start_loc = st.plan.query_start_loc;
      di.seq_lens = st.plan.seq_lens;
      di.block_table = in.block_table;
      di.block_table_stride = in.block_table_stride;
      di.block_size = static_cast<int32_t>(g_.spec_.storage_block_size);
      di.num_blocks = g_.cfg_.num_blocks;
      di.window = ms.window;
      di.num_spec = ms.dspark_num_spec;
      di.width = dspark_width_;
      di.num_rows = T;
      di.num_reqs_actual = st.num_reqs;
      plan::build_dspark_swa_indices(di, plan::Span<int32_t>(dspark_scratch_.data(), dspark_scratch_.size()));
    }
    plan::DsaGroupInputs gi;
    gi.compress_ratio = g_.spec_.compress_ratio;
    gi.storage_block_size = static_cast<int32_t>(g_.spec_.storage_block_size);
    gi.block_table = in.block_table;
    gi.block_table_stride = in.block_table_stride;
    gi.num_blocks = g_.cfg_.num_blocks;
    gi.slot_format = g_.slot_format_;
    // The plan's skip encoding for token (ratio <= 1) mappings; compressed
    // groups keep compressor_metadata's (-1, bs-1) (dsa/plan/dsa_kv_plan.h).
    gi.block_offset_skip = ratio <= 1 ? g_.cfg_.plan.block_offset_skip : BlockOffsetSkip::LastOffset;
    gi.rope_positions = ratio > 1 ? g_.step_.compress_rope_positions() : 0;
    // What the group's kernels read besides this step's rows (dsa/builder.h "Reads").
    gi.reads = g_.reads_;
    gi.read_window = win_left;
    gi.state_ratio = g_.state_ratio_;
    gi.state_coff = g_.spec_.coff;

    int32_t* s = buffers_->begin();
    const size_t ur = static_cast<size_t>(rows);
    const int64_t stride = in.block_table_stride;
    plan::DsaGroupBuffers gb;
    gb.block_table = plan::Span<int32_t>(s + bt_.offset, static_cast<size_t>(R_ * g_.cfg_.max_blocks_per_req));
    gb.slot_mapping = plan::Span<int32_t>(s + r.slots, ur * fw_);
    gb.block_scratch = plan::Span<int32_t>(block_scratch_.data(), block_scratch_.size());
    // Validates everything before its first write. The step's row list of
    // this ratio saves re-deriving the rows per group, and the step's per-row
    // arrays (index, position, request) are this group's: only the slots are
    // written here.
    const plan::DsaRows* rl = st.rows_at(ratio);
    const StepMetadata::RowArrays* ra = st.row_arrays_at(ratio);
    AAR_CHECK_ARG(rl != nullptr && ra != nullptr, "internal: the step lists no rows at ratio ", ratio);
    // docs/design/sparse_cp.md §12: a sharded group's table is this rank's local one.
    const bool dcp = st.dcp.world_size > 1 && dcp_sharded_kind(g_.cfg_.kind);
    const int64_t sbs = g_.spec_.storage_block_size;
    if (dcp) check_dcp_local_columns(st, in, sbs, ratio, win_left, g_.cfg_.num_blocks);
    const plan::DsaGroupPlan gp = plan::plan_dsa_group(st.plan, gi, gb, *rl);
    if (dcp && ratio <= 1) {
      const int32_t* qsl = st.plan.query_start_loc.data();
      localize_dcp_slots(st, in, sbs, fw_, qsl[st.num_reqs], s + r.slots, gi.block_offset_skip,
                         [&, cb = int64_t{0}](int64_t t, int64_t& b, int64_t& x) mutable {
                           // Rows in order: the last request starting at or before t, walked forward.
                           while (cb < st.num_reqs && qsl[cb + 1] <= t) ++cb;
                           b = cb;
                           x = st.plan.start_pos[static_cast<size_t>(b)] + (t - qsl[b]);
                         });
    } else if (dcp) {
      localize_dcp_slots(st, in, sbs, fw_, gp.num_valid_rows, s + r.slots, gi.block_offset_skip,
                         [&](int64_t i, int64_t& b, int64_t& x) {
                           b = ra->request_host[static_cast<size_t>(i)];
                           x = ra->index_host[static_cast<size_t>(i)];
                         });
    }
    const size_t dsn = dspark ? static_cast<size_t>(T) * dspark_width_ : 0;
    if (dspark) std::memcpy(s + r.dspark, dspark_scratch_.data(), dsn * 4);
    if (dcp_width_ > 0) stage_dcp_rows(st, s, r.dcp, T, stride, win_left);
    const size_t ub = static_cast<size_t>(B);
    // DSA-CP (docs/design/sparse_cp.md §10): the attention's lengths are the rank's local ones (not
    // under DSA-CP x DCP, §14: every row over the shard, global lengths).
    const bool cp = st.dsa_cp_slice_attention();
    if (cmp_lens_) {
      // Cannot fail here: seq_lens were validated by the step build and are <= its max_seqlen_kv
      // (the local ones by plan_token_shard, <= their max).
      flash_mla_cmp_lengths(cp ? st.dsa_cp.seq_lens_host : st.plan.seq_lens,
                            cp ? st.dsa_cp.max_seqlen_kv : st.max_seqlen_kv, ratio,
                            plan::Span<int32_t>(s + r.cmp, ub), plan::Span<int32_t>(s + r.cres, ub));
    }
    if (fill_) pick_fill_slot(s + r.slots, gp.num_valid_rows, sbs, s + r.fill);
    buffers_->copy(r.slots, bt_.offset + B * stride - r.slots);
    buffers_->finish();
    counter_.next(md_.stamp);

    const AttnKvPlan& kp = g_.cfg_.plan;
    md_.step_stamp = st.stamp;
    md_.num_reqs = st.num_reqs;
    md_.num_kernel_reqs = B;
    md_.num_compressed_tokens = gp.num_compressed_tokens;
    md_.num_valid_rows = gp.num_valid_rows;
    md_.block_table_stride = static_cast<int32_t>(stride);
    set(md_.block_table,
        v_bt_.get(B, stride, [&] { return device_.narrow(0, bt_.offset, B * stride).view({B, stride}); }));
    set(md_.seq_lens, st.seq_lens);
    set(md_.query_start_loc, st.query_start_loc);
    set(md_.start_pos, st.start_pos);
    set(md_.slot_mapping, v_slots_.get(rows, r.slots, [&] {
      at::Tensor v = device_.narrow(0, r.slots, rows * fw_);
      return fw_ == 2 ? v.view({rows, 2}) : v;
    }));
    set(md_.row_index, ra->index);
    set(md_.row_position, ra->position);
    set(md_.row_request, ra->request);
    if (ratio > 1) {
      set(md_.cos, st.compress_cos);
      set(md_.sin, st.compress_sin);
      set(md_.neg_sin, st.compress_neg_sin);
      set(md_.full_compress_cos, st.compress_cos_table);
      set(md_.full_compress_sin, st.compress_sin_table);
      fill_compressed_rows(st, rows);
    } else {
      set(md_.cos, st.cos);
      set(md_.sin, st.sin);
      set(md_.neg_sin, st.neg_sin);
    }
    const bool prefill = st.has_prefill();
    md_.cu_seqlens_ori_kv_kind = prefill ? kp.prefill_cu_seqlens_ori_kv : kp.decode_cu_seqlens_ori_kv;
    md_.cu_seqlens_cmp_kv_kind = prefill ? kp.prefill_cu_seqlens_cmp_kv : kp.decode_cu_seqlens_cmp_kv;
    set(md_.cu_seqlens_ori_kv, cu_tensor(md_.cu_seqlens_ori_kv_kind, st));
    set(md_.cu_seqlens_cmp_kv, cu_tensor(md_.cu_seqlens_cmp_kv_kind, st));
    set(md_.dspark_swa_indices, dspark ? v_ds_.get(T, r.dspark, [&] {
      return device_.narrow(0, r.dspark, int64_t{T} * dspark_width_).view({T, 1, dspark_width_});
    })
                                    : at::Tensor());
    md_.ori_win_left = win_left;
    md_.ori_win_right = 0;
    md_.max_seqlen_q = st.max_seqlen_q;
    md_.max_seqlen_kv = st.max_seqlen_kv;
    if (cmp_lens_) {
      set(md_.seqused_cmp_kv, v_scmp_.get(B, r.cmp, [&] { return device_.narrow(0, r.cmp, B); }));
      set(md_.cmp_residual_kv, v_cres_.get(B, r.cres, [&] { return device_.narrow(0, r.cres, B); }));
      md_.max_seqlen_cmp_kv = (cp ? st.dsa_cp.max_seqlen_kv : st.max_seqlen_kv) / ratio;
      md_.seqused_cmp_kv_host = plan::CSpan<int32_t>(s + r.cmp, ub);
      md_.cmp_residual_kv_host = plan::CSpan<int32_t>(s + r.cres, ub);
    }
    if (pbt_.defined() && st.pcp_split()) {
      // docs/design/sparse_cp.md §13: the segments' rows of the staged table (after the copy, same stream).
      const int64_t ns = st.pcp.num_segments;
      set(md_.pcp_block_table, v_pbt_.get(ns, stride, [&] { return pbt_.narrow(0, 0, ns * stride).view({ns, stride}); }));
      detail::InferenceScope guard;
      at::index_select_out(md_.pcp_block_table, md_.block_table, 0, st.pcp.req);
    } else {
      md_.pcp_block_table = at::Tensor();  // a replicated step (§13.4) reads the global table
    }
    if (dcp_width_ > 0) {
      // docs/design/sparse_cp.md §12.2: the rows' DCP lists, read by the layers as they are.
      const int64_t w = dcp_width_;
      const at::Tensor& v = v_dcp_.get(T, r.dcp, [&] { return device_.narrow(0, r.dcp, T * w).view({T, 1, w}); });
      set(g_.cfg_.kind == DsaCacheKind::Swa ? md_.dcp_ori_indices : md_.dcp_cmp_limit, v);
    }
    if (fill_) set(md_.graph_fill_slot, v_fill_.get(0, r.fill, [&] { return device_.narrow(0, r.fill, 2).view({1, 2}); }));
    md_.sas_metadata_filled = fill_sas(st, ratio);
    md_.qli_metadata_filled = fill_qli(st);
    md_.qli_num_heads = md_.qli_metadata_filled ? ms.index_n_heads : 0;
    md_.qli_head_dim = md_.qli_metadata_filled ? ms.index_head_dim : 0;
    md_.qli_sparse_count = md_.qli_metadata_filled ? ms.index_topk : 0;
    md_.block_table_host = plan::CSpan<int32_t>(s + bt_.offset, static_cast<size_t>(B * stride));
    md_.slot_mapping_host = plan::CSpan<int32_t>(s + r.slots, ur * fw_);
    md_.row_index_host = ra->index_host;
    md_.row_position_host = ra->position_host;
    md_.row_request_host = ra->request_host;
    md_.dspark_host = dspark ? plan::CSpan<int32_t>(s + r.dspark, dsn) : plan::CSpan<int32_t>();
    return md_;
  }

 private:
  struct Packed {
    int64_t slots, dspark, cmp, cres, fill, dcp;
  };
  // Word offsets of a build of `rows` compressed rows, `ds_tokens` DSpark
  // rows and `reqs` requests (seqused_cmp_kv and cmp_residual_kv when
  // cmp_lens_): packed so that they end (up to alignment) at the block table.
  Packed packed(int64_t rows, int64_t ds_tokens, int64_t reqs, int64_t dcp_tokens) const {
    const int64_t c = cmp_lens_ ? reqs : 0;
    Packed r;
    core::StagingLayout::pack_before(
        bt_.offset,
        {{&r.slots, rows * fw_}, {&r.dspark, ds_tokens * dspark_width_}, {&r.cmp, c}, {&r.cres, c},
         {&r.fill, fill_ ? 2 : 0}, {&r.dcp, dcp_tokens * dcp_width_}});
    return r;
  }
  // docs/design/sparse_cp.md §12.2: the DCP lists of the step's T rows at word `at` of the staging
  // buffer (plan/dsa_dcp_plan.h): the SWA group's owned window slots over the staged local table
  // (graph-padding rows zeroed: block 0), the compressed groups' row limits. After the slots'
  // build: the table's local columns were checked there (check_dcp_local_columns).
  void stage_dcp_rows(const StepMetadata& st, int32_t* s, int64_t at, int64_t T, int64_t stride, int32_t win_left) {
    DsaDcpRows dr;
    dr.query_start_loc = st.plan.query_start_loc;
    dr.start_pos = st.plan.start_pos;
    dr.num_reqs = st.num_kernel_reqs;
    dr.num_rows = T;
    dr.shard = plan::DcpShard{st.dcp.world_size, st.dcp.rank, st.dcp.interleave};
    const plan::Span<int32_t> out(s + at, static_cast<size_t>(T * dcp_width_));
    if (g_.cfg_.kind == DsaCacheKind::Swa) {
      AAR_CHECK_ARG(win_left + 1 == dcp_width_, "internal: the DCP window list is ", dcp_width_,
                    " wide, the attention window ", win_left + 1);
      plan_dsa_dcp_window_slots(dr, plan::CSpan<int32_t>(s + bt_.offset, static_cast<size_t>(st.num_kernel_reqs * stride)),
                                stride, g_.spec_.storage_block_size, win_left, out);
    } else {
      plan_dsa_dcp_cmp_limits(dr, g_.spec_.compress_ratio, out);
    }
  }
  // docs/design/dsa.md §6: the first slot of 0..V (block / offset pairs of `sbs` rows) that none
  // of the build's V valid rows writes (V + 1 candidates, V taken at most). A graph replay's
  // in-place write sends its skip rows there with the slot's own current row, so the write is
  // full width (a replay cannot change a host row count) and changes nothing but the valid rows.
  void pick_fill_slot(const int32_t* slots, int32_t valid, int64_t sbs, int32_t* out) {
    std::fill(fill_mark_.begin(), fill_mark_.begin() + valid + 1, 0);
    for (int32_t i = 0; i < valid; ++i) {
      const int64_t l = int64_t{slots[2 * i]} * sbs + slots[2 * i + 1];
      if (l >= 0 && l <= valid) fill_mark_[static_cast<size_t>(l)] = 1;
    }
    int64_t l = 0;
    while (fill_mark_[static_cast<size_t>(l)] != 0) ++l;
    AAR_CHECK_ARG(l < int64_t{g_.cfg_.num_blocks} * sbs, "internal: no free fill slot among the ", valid + 1,
                  " first of a cache of ", g_.cfg_.num_blocks, " blocks");
    out[0] = static_cast<int32_t>(l / sbs);
    out[1] = static_cast<int32_t>(l % sbs);
  }
  // docs/design/dsa.md §3.1 / docs/design/ops.md §4.6: compressor_metadata over the staged table into the lane's
  // stable buffers (views per row count), read by the step's layers.
  void fill_compressed_rows(const StepMetadata& st, int64_t rows) {
    const int64_t R = st.compress_cos_table.size(1);
    set(md_.compressed_cos, v_ccos_.get(rows, [&] { return ccos_.narrow(0, 0, rows * R).view({rows, 1, 1, R}); }));
    set(md_.compressed_sin, v_csin_.get(rows, [&] { return csin_.narrow(0, 0, rows * R).view({rows, 1, 1, R}); }));
    set(md_.compressed_slots, v_cslots_.get(rows, [&] {
      at::Tensor v = cslots_.narrow(0, 0, rows * fw_);
      return fw_ == 2 ? v.view({rows, 2}) : v;
    }));
    detail::InferenceScope guard;
    ops::CompressorMetadataArgs a;
    a.rope_cos = st.compress_cos_table;
    a.rope_sin = st.compress_sin_table;
    a.cu_seqlens = st.query_start_loc;
    a.start_pos = st.start_pos;
    a.kv_block_table = md_.block_table;
    a.kv_block_size = g_.spec_.storage_block_size;
    a.slot_mapping_format = g_.slot_format_ == SlotFormat::Flat ? ops::CompressedSlotFormat::Flat
                                                                : ops::CompressedSlotFormat::BlockOffset;
    a.compress_ratio = g_.spec_.compress_ratio;
    a.num_reqs_actual = st.num_reqs;
    ops::compressor_metadata_out(a, md_.compressed_cos, md_.compressed_sin, md_.compressed_slots);
    // docs/design/sparse_cp.md §12: a sharded compressed group writes at this rank's local slots (the
    // operator's are the global table's), which the build staged in slot_mapping.
    if (st.dcp.world_size > 1 && dcp_sharded_kind(g_.cfg_.kind)) {
      // (slot_mapping is the rows' view already: no narrow per build.)
      ops::dense::copy(md_.compressed_slots, ::aar::detail::first_rows(md_.slot_mapping, rows));
    }
  }
  // docs/design/dsa.md §3.5: the SAS blob of this group's layers, copied into the stable
  // buffer. Returns whether it was generated (see dsa/builder.h).
  bool fill_sas(const StepMetadata& st, int32_t ratio) {
    const GroupConfig& c = g_.cfg_;
    const bool reads_sas = c.kind == DsaCacheKind::Swa || c.kind == DsaCacheKind::C4Kv ||
                           c.kind == DsaCacheKind::C128Kv;
    // The plan's metadata operator (the enum is checked at construction);
    // the remaining path is KvQuantSharedKv.
    const bool shared = c.plan.sparse_attn == SparseAttnPath::SharedKv;
    const bool flash_mla = c.plan.sparse_attn == SparseAttnPath::SparseFlashMla;
    const ModelSettings& ms = g_.model();
    if (!reads_sas || ms.num_heads_q <= 0) return false;
    detail::InferenceScope guard;
    auto opt = [](const at::Tensor& t) -> std::optional<at::Tensor> {
      if (!t.defined()) return std::nullopt;
      return t;
    };
    ops::SparseAttnSharedKvMetadataArgs a;
    a.num_heads_q = ms.num_heads_q;
    a.num_heads_kv = 1;
    a.head_dim = ms.head_dim;
    // DSA-CP (docs/design/sparse_cp.md §10): the rank's slice, every head (num_heads_q is then
    // the model's), the local lengths. DSA-CP x DCP (§14): every row of the step, global lengths.
    const bool cp = st.dsa_cp_slice_attention();
    a.cu_seqlens_q = cp ? st.dsa_cp.query_start_loc : st.query_start_loc;
    a.cu_seqlens_ori_kv = opt(md_.cu_seqlens_ori_kv);
    a.cu_seqlens_cmp_kv = opt(md_.cu_seqlens_cmp_kv);
    a.seqused_kv = cp ? st.dsa_cp.seq_lens : st.seq_lens;
    a.batch_size = st.num_kernel_reqs;
    a.max_seqlen_q = cp ? st.dsa_cp.max_seqlen_q : st.max_seqlen_q;
    a.max_seqlen_kv = cp ? st.dsa_cp.max_seqlen_kv : st.max_seqlen_kv;
    if (st.pcp_split()) {
      // docs/design/sparse_cp.md §13: this rank's segments (a replicated step reads the global lists).
      a.cu_seqlens_q = st.pcp.query_start_loc;
      a.seqused_kv = st.pcp.seq_lens;
      a.batch_size = st.pcp.num_segments;
      a.max_seqlen_q = st.pcp.max_seqlen_q;
      a.max_seqlen_kv = st.pcp.max_seqlen_kv;
    }
    a.cmp_topk = ratio == 4 ? ms.index_topk : 0;
    a.cmp_ratio = ratio <= 1 ? 1 : (ratio == 4 ? 4 : 128);
    a.ori_mask_mode = 4;
    a.cmp_mask_mode = 3;
    a.ori_win_left = md_.ori_win_left;
    a.ori_win_right = md_.ori_win_right;
    a.layout_q = "TND";
    a.layout_kv = to_string(c.plan.layout_kv);
    a.has_ori_kv = true;
    a.has_cmp_kv = ratio > 1;
    a.device = "npu";
    if (shared) {
      ops::sparse_attn_sharedkv_metadata_out(a, md_.sas_metadata);
    } else if (flash_mla) {
      // docs/design/dsa.md §4.2: the same arguments through the SparseFlashMla adapter
      // (seqused_kv -> seqused_ori_kv, max_seqlen_kv -> max_seqlen_ori_kv,
      // device dropped; compressed groups add the staged seqused_cmp_kv /
      // cmp_residual_kv and max_seqlen_cmp_kv = max_seqlen_kv / cmp_ratio).
      std::optional<ops::FlashMlaCmpLengthTensors> cmp;
      if (ratio > 1) cmp = ops::FlashMlaCmpLengthTensors{md_.seqused_cmp_kv, md_.cmp_residual_kv};
      ops::sparse_flash_mla_metadata_out(ops::to_sparse_flash_mla_metadata_args(a, cmp), md_.sas_metadata);
    } else {
      ops::KvQuantSparseAttnSharedKvMetadataArgs q;
      q.base = a;
      q.kv_quant_mode = c.plan.kv_quant_mode;
      q.tile_size = c.plan.tile_size;
      q.rope_head_dim = c.plan.rope_head_dim;
      ops::kv_quant_sparse_attn_sharedkv_metadata_out(q, md_.sas_metadata);
    }
    return true;
  }
  // docs/design/dsa.md §3.2 / §3.5: the QLI blob of the step's C4 layers, made by the
  // indexer-cache group and copied into the stable buffer.
  bool fill_qli(const StepMetadata& st) {
    const GroupConfig& c = g_.cfg_;
    const ModelSettings& ms = g_.model();
    if (c.kind != DsaCacheKind::C4IndexerK || ms.index_n_heads <= 0) return false;
    detail::InferenceScope guard;
    ops::VllmQuantLightningIndexerMetadataArgs m;
    m.num_heads_q = ms.index_n_heads;
    m.num_heads_k = 1;
    m.head_dim = ms.index_head_dim;
    m.query_quant_mode = 0;
    m.key_quant_mode = 0;
    // query_start_loc[1:], remade only when the step hands out another
    // query_start_loc view (its views are cached per size): no narrow per build.
    if (!qsl_src_.same(st.query_start_loc)) {
      q_ends_ = st.query_start_loc.narrow(0, 1, st.num_kernel_reqs);
      qsl_src_.bind(st.query_start_loc);
    }
    // DSA-CP (docs/design/sparse_cp.md §10): the selection of the rank's slice, local lengths.
    const bool cp = st.dsa_cp.world_size > 1;
    m.actual_seq_lengths_query = cp ? st.dsa_cp.q_ends : q_ends_;
    m.actual_seq_lengths_key = cp ? st.dsa_cp.seq_lens : st.seq_lens;
    m.batch_size = st.num_kernel_reqs;
    m.max_seqlen_q = cp ? st.dsa_cp.max_seqlen_q : st.max_seqlen_q;
    m.max_seqlen_k = cp ? st.dsa_cp.max_seqlen_kv : st.max_seqlen_kv;
    if (st.pcp_split()) {
      // docs/design/sparse_cp.md §13: this rank's segments (pads select nothing: KV length 0).
      m.actual_seq_lengths_query = st.pcp.q_ends;
      m.actual_seq_lengths_key = st.pcp.indexer_seq_lens;
      m.batch_size = st.pcp.num_segments;
      m.max_seqlen_q = st.pcp.max_seqlen_q;
      m.max_seqlen_k = st.pcp.max_indexer_seqlen_kv;
    }
    m.layout_query = "TND";
    m.layout_key = "PA_BSND";
    m.sparse_count = ms.index_topk;
    m.sparse_mode = 3;
    m.cmp_ratio = 4;
    m.device = "npu";
    ops::vllm_quant_lightning_indexer_metadata_out(m, md_.qli_metadata);
    return true;
  }
  // DSA-CP: the attention runs on the rank's slice, so its query_start_loc and cumsum(S) are the
  // local ones (docs/design/sparse_cp.md §10); under DSA-CP x DCP on every row (§14): the global ones.
  at::Tensor cu_tensor(CuSeqlensKv k, const StepMetadata& st) const {
    const bool cp = st.dsa_cp_slice_attention();
    switch (k) {
      case CuSeqlensKv::None: return {};
      case CuSeqlensKv::EmptyTensor: return empty_;
      case CuSeqlensKv::QueryStartLoc:
        return st.pcp_split() ? st.pcp.query_start_loc : cp ? st.dsa_cp.query_start_loc : st.query_start_loc;
      case CuSeqlensKv::CumsumSeqLens:
        return st.pcp_split() ? st.pcp.cu_seqlens_kv : cp ? st.dsa_cp.cu_seqlens_kv : st.cu_seqlens_kv;
    }
    return {};
  }

  const GroupBuilder& g_;
  int32_t draft_index_;
  int64_t R_;
  int64_t fw_ = 2;
  int32_t dspark_width_ = 0;
  int64_t dcp_width_ = 0;  // DCP (sparse_cp.md §12.2): words per row of the staged lists, 0 without
  bool cmp_lens_ = false, fill_ = false;
  std::vector<uint8_t> fill_mark_;  // pick_fill_slot's scratch (T + 1)
  core::Region bt_;  // the staged block table (R_ rows of max_blocks_per_req)
  std::unique_ptr<aar::detail::StagingBuffers> buffers_;
  at::Tensor device_, empty_, ccos_, csin_, cslots_;
  at::Tensor pbt_;  // PCP (docs/design/sparse_cp.md §13): the segments' block-table rows, 4 R_ x max_blocks_per_req
  core::ViewCache v_pbt_;
  std::vector<int32_t> dspark_scratch_, block_scratch_;
  detail::TensorBinding qsl_src_;  // the step view q_ends_ was made from
  at::Tensor q_ends_;
  // Views by count; the block table's also by its width, the packed rows'
  // also by their offset.
  core::ViewCache v_bt_, v_slots_, v_ds_, v_scmp_, v_cres_, v_ccos_, v_csin_, v_cslots_, v_fill_, v_dcp_;
  GroupMetadata md_;
  detail::BuildCounter counter_;
};

GroupBuilder::GroupBuilder(const StepBuilder& step, const GroupConfig& cfg) : step_(step), cfg_(cfg) {
  if (step.config().pcp_world_size > 1 && cfg.plan.sparse_attn != SparseAttnPath::SharedKv) {
    throw_not_supported("pcp_world_size=", step.config().pcp_world_size, " with the ", cfg.plan.sparse_attn_op,
                        " plan (device ", static_cast<int>(cfg.plan.device), "): DSA PCP is built for the A2/A3 "
                        "npu_sparse_attn_sharedkv plan only (docs/design/sparse_cp.md §13)");
  }
  if (step.config().dcp_world_size > 1 && cfg.plan.sparse_attn != SparseAttnPath::SharedKv) {
    throw_not_supported("dcp_world_size=", step.config().dcp_world_size, " with the ", cfg.plan.sparse_attn_op,
                        " plan (device ", static_cast<int>(cfg.plan.device), "): DSA DCP is built for the A2/A3 "
                        "npu_sparse_attn_sharedkv plan only (docs/design/sparse_cp.md §12)");
  }
  // Names cache_block_size, and a model dim the plan cannot hold (the fp8 rows' 512 / 64).
  spec_ = dsa_cache_spec(cfg.kind, cfg.cache_block_size, cfg.plan, step.cache_dims());
  AAR_CHECK_ARG(cfg.plan.sparse_attn == SparseAttnPath::SharedKv ||
                    cfg.plan.sparse_attn == SparseAttnPath::KvQuantSharedKv ||
                    cfg.plan.sparse_attn == SparseAttnPath::SparseFlashMla,
                "plan sparse_attn value ", static_cast<int>(cfg.plan.sparse_attn), " is outside the enum");
  slot_format_ = slot_format_for(cfg.plan, cfg.kind);
  AAR_CHECK_ARG(cfg.block_size == 0 || cfg.block_size == spec_.block_size, "block_size=", cfg.block_size,
                " is not the block size of a ", to_string(cfg.kind), " group at cache_block_size=", cfg.cache_block_size,
                " (", spec_.block_size, "; 0 takes it)");
  cfg_.block_size = static_cast<int32_t>(spec_.block_size);
  core::check_geometry(cfg_, nullptr, 0);
  // The lanes' block-table rows (the draft lanes hold decode_threshold x as many requests) are sized
  // from it: the builders' table bound (builder_checks.h), where INT32_MAX asked for tens of GiB.
  const int64_t lane_reqs = int64_t{step.config().max_num_reqs} * std::max<int64_t>(1, step.decode_threshold());
  AAR_CHECK_ARG((lane_reqs + 1) * cfg_.max_blocks_per_req <= internal::kMaxBlockTableWords, "max_blocks_per_req=",
                cfg_.max_blocks_per_req, " with max_num_reqs=", step.config().max_num_reqs,
                " exceeds the block-table bound of ", internal::kMaxBlockTableWords, " entries");
  // The rows each kind's kernels read (plan::DsaGroupReads): the compressed KV
  // and indexer K caches are read whole (attention, indexer), the SWA cache
  // over its window, a state cache where the compressor gathers.
  switch (cfg.kind) {
    case DsaCacheKind::Swa: reads_ = plan::DsaGroupReads::Window; break;
    case DsaCacheKind::C4Kv:
    case DsaCacheKind::C128Kv:
    case DsaCacheKind::C4IndexerK: reads_ = plan::DsaGroupReads::CompressedPrefix; break;
    case DsaCacheKind::C4AttnState:
    case DsaCacheKind::C4IndexerState:
      reads_ = plan::DsaGroupReads::CompressorState;
      state_ratio_ = 4;
      break;
    case DsaCacheKind::C128State:
      reads_ = plan::DsaGroupReads::CompressorState;
      state_ratio_ = 128;
      break;
  }
  AAR_CHECK_ARG(spec_.compress_ratio <= 1 || step.has_compress_table(), "kind ", to_string(cfg.kind),
                " (compress_ratio ", spec_.compress_ratio, ") needs the compress_rope_theta tables: the StepBuilder "
                "has no compress_cos_table / compress_sin_table");
  const StepBuilderConfig& sc = step.config();
  const bool separate = sc.separate();
  // Draft lanes only where drafting is supported (docs/design/dsa.md §3.1: ratio <= 1).
  const int32_t drafts = spec_.compress_ratio <= 1 ? step.num_drafts() : 0;
  for (int32_t l = 0; l <= drafts; ++l) {
    const int slot_base = sc.staging_hooks != nullptr ? l * sc.staging_buffers : 0;
    const int64_t cap = l == 0 ? sc.max_num_reqs : int64_t{sc.max_num_reqs} * step.decode_threshold();
    lanes_.push_back(std::make_unique<Lane>(*this, sc, l - 1, cap, separate, slot_base));
  }
  if (separate) {
    staging_block_table_ = at::zeros({sc.max_num_reqs, cfg.max_blocks_per_req}, at::TensorOptions().dtype(at::kInt));
  } else {
    staging_block_table_ = lanes_[0]->staged_rows(sc.max_num_reqs);
  }
}

GroupBuilder::~GroupBuilder() = default;

const GroupMetadata& GroupBuilder::build(const StepMetadata& step, const GroupInputs& in) {
  return lanes_[0]->build(step, in);
}

const GroupMetadata& GroupBuilder::build_for_drafting(const StepMetadata& step, const GroupInputs& in, int32_t d) {
  if (spec_.compress_ratio > 1) {
    throw_not_supported("build_for_drafting: kind ", to_string(cfg_.kind), " (compress_ratio ", spec_.compress_ratio,
                        ") cannot build for drafting: only SWA (ratio <= 1) groups draft (docs/design/dsa.md §3.1 Draft mode)");
  }
  AAR_CHECK_ARG(d >= 0 && d < num_drafts(), "draft_index=", d, " is out of range [0, num_drafts=", num_drafts(), ")");
  return lanes_[static_cast<size_t>(d) + 1]->build(step, in);
}

const GroupMetadata& GroupBuilder::metadata() const { return lanes_[0]->metadata(); }
uint64_t GroupBuilder::generation() const { return lanes_[0]->generation(); }

// ============================================================== routing

void check_current(const GroupMetadata& g, const char* what) {
  check_current(g.stamp, what);
  AAR_CHECK_ARG(g.step_stamp.current(), what, " was built from a step build that is no longer current (the "
                "StepBuilder has built again): rebuild the group");
}

LayerMetadata route_layer(int32_t ratio, const StepMetadata& step, const GroupMetadata* swa,
                          const GroupMetadata* attention, const GroupMetadata* compressor_state,
                          const GroupMetadata* indexer_cache, const GroupMetadata* indexer_state) {
  check_compress_ratio(ratio);
  check_current(step.stamp, "step metadata");
  const bool compressed = ratio > 1, c4 = ratio == 4;
  auto slot = [&](const GroupMetadata* g, const char* name, bool needed, DsaCacheKind kind) {
    AAR_CHECK_ARG((g != nullptr) == needed, name, needed ? " is required" : " must not be given", " for a layer of "
                  "compress_ratio ", ratio, " (docs/design/dsa.md §3.3)");
    if (g == nullptr) return;
    AAR_CHECK_ARG(g->kind == kind, name, " has cache kind ", to_string(g->kind), ", expected ", to_string(kind));
    check_current(*g, name);
    AAR_CHECK_ARG(g->step_stamp.generation == step.stamp.generation && g->step_stamp.live == step.stamp.live,
                  name, " was built from another step build than `step`");
  };
  slot(swa, "swa", true, DsaCacheKind::Swa);
  slot(attention, "attention", compressed, c4 ? DsaCacheKind::C4Kv : DsaCacheKind::C128Kv);
  slot(compressor_state, "compressor_state", compressed, c4 ? DsaCacheKind::C4AttnState : DsaCacheKind::C128State);
  slot(indexer_cache, "indexer_cache", c4, DsaCacheKind::C4IndexerK);
  slot(indexer_state, "indexer_state", c4, DsaCacheKind::C4IndexerState);
  LayerMetadata l;
  l.compress_ratio = ratio;
  l.step = &step;
  l.swa = swa;
  l.attention = attention;
  l.compressor_state = compressor_state;
  l.indexer_cache = indexer_cache;
  l.indexer_state = indexer_state;
  return l;
}

LayerMetadata route_layer(int32_t ratio, const StepMetadata& step, plan::CSpan<const GroupMetadata*> groups) {
  check_compress_ratio(ratio);
  const bool compressed = ratio > 1, c4 = ratio == 4;
  auto pick = [&](bool needed, DsaCacheKind kind) -> const GroupMetadata* {
    if (!needed) return nullptr;
    const GroupMetadata* found = nullptr;
    for (size_t i = 0; i < groups.size(); ++i) {
      AAR_CHECK_ARG(groups[i] != nullptr, "groups[", i, "] is null");
      if (groups[i]->kind != kind) continue;
      AAR_CHECK_ARG(found == nullptr, "groups: cache kind ", to_string(kind), " is given twice (a layer of "
                    "compress_ratio ", ratio, " reads one)");
      found = groups[i];
    }
    AAR_CHECK_ARG(found != nullptr, "groups: no group of cache kind ", to_string(kind), ", which a layer of "
                  "compress_ratio ", ratio, " reads (docs/design/dsa.md §3.3)");
    return found;
  };
  return route_layer(ratio, step, pick(true, DsaCacheKind::Swa),
                     pick(compressed, c4 ? DsaCacheKind::C4Kv : DsaCacheKind::C128Kv),
                     pick(compressed, c4 ? DsaCacheKind::C4AttnState : DsaCacheKind::C128State),
                     pick(c4, DsaCacheKind::C4IndexerK), pick(c4, DsaCacheKind::C4IndexerState));
}

}  // namespace aar::dsa
