// SFA metadata builder (docs/design/sfa.md §3.1, §3.2). The layout and the lane
// model are described in include/ascend_attn_rt/sfa/builder.h.
#include "ascend_attn_rt/sfa/builder.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <string>
#include <utility>

#include "../common/builder_checks.h"
#include "../common/rope_gather.h"
#include "../common/staging.h"
#include "../core/staging_layout.h"
#include "ascend_attn_rt/errors.h"
#include "ascend_attn_rt/cp/plan/sparse_cp.h"
#include "ascend_attn_rt/sfa/plan/sfa_offload_plan.h"
#include "ascend_attn_rt/sfa/plan/sfa_plan.h"
#include "ascend_attn_rt/sfa/backend.h"

namespace aar::sfa {

// One set of buffers, views, host lists and stamp counter: the main builds'
// (index -1) or one draft index's.
class MetadataBuilder::Lane {
 public:
  Lane(const BuilderConfig& cfg, const aar::detail::RopeRows& rope, int32_t draft_index, int64_t max_reqs, bool separate,
       int slot_base)
      : cfg_(cfg), rope_(rope), draft_index_(draft_index), R_(max_reqs), offload_(cfg.offload.has_value()),
        dcp_(cfg.dcp_world_size * cfg.pcp_world_size > 1), dsa_(cfg.dsa_cp_world_size > 1),
        pcp_(cfg.pcp_world_size > 1), kvw_(cfg.dcp_world_size * cfg.pcp_world_size),
        kvr_(cfg.pcp_rank * cfg.dcp_world_size + cfg.dcp_rank), separate_(separate) {
    const int64_t T = cfg.max_num_tokens, MB = cfg.max_blocks_per_req, W = rope.row_words();
    // DSA-CP: RoPE rows for the step padded to a multiple of the group (T_pad < T + world).
    const int64_t TR = dsa_ ? T + cfg.dsa_cp_world_size : T;
    // The token region first, sized for max_num_tokens; a step packs its token
    // views at its end (token_region), right before the request part.
    core::StagingLayout layout;
    const int64_t token_words = core::align_words(2 * T) + 2 * core::align_words(TR * W) +
                                (offload_ ? core::align_words(T) : 0) +  // offload: the token-to-request map
                                (dcp_ ? core::align_words(2 * T) : 0);   // DCP: the indexer's slots
    layout.add("token_region", token_words);
    qsl_ = layout.add("query_start_loc", R_ + 1);
    cql_ = layout.add("cum_query_lens", R_);
    seq_ = layout.add("seq_lens", R_);
    if (offload_) {
      rid_ = layout.add("req_ids", 2 * R_);  // int64
      pcql_ = layout.add("prefill_cum_query_lens", R_);
      dec_ids_.assign(T, 0);
      dec_seq_.assign(T, 0);
      dec_stable_.assign(T, 0);
      slots_host_.resize(static_cast<size_t>(cfg.staging_buffers) + 1);
    }
    if (dcp_) {
      dseq_ = layout.add("dcp_seq_lens", R_);
      dcp_block_lens_.assign(R_, 0);
      dseq_list_.assign(R_, 0);
    }
    if (dsa_) {
      lcql_ = layout.add("dsa_cp_cum_query_lens", R_);
      lseq_ = layout.add("dsa_cp_seq_lens", R_);
      lcql_list_.assign(R_, 0);
      lseq_list_.assign(R_, 0);
    }
    bt_ = layout.add("block_table", R_ * MB);
    if (dcp_) rbt_ = layout.add("indexer_block_table", R_ * MB * kvw_);
    buffers_ = std::make_unique<aar::detail::StagingBuffers>(layout.words(), cfg.device, separate, cfg.staging_buffers,
                                                        cfg.staging_hooks, slot_base);
    // DCP: each host buffer's record of its replicated rows (zero-filled buffers: nothing written yet).
    if (dcp_) rep_extent_.assign(static_cast<size_t>(buffers_->num_host()), std::vector<int32_t>(R_, 0));
    device_ = buffers_->device();
    positions_.assign(TR, 0);
    cql_list_.assign(R_, 0);
    seq_list_.assign(R_, 0);
    views_.qsl = core::RegionViews(device_, qsl_, R_ + 1, at::kInt);
    views_.cql = core::RegionViews(device_, cql_, R_, at::kInt);
    views_.seq = core::RegionViews(device_, seq_, R_, at::kInt);
    views_.bt = core::RegionViews(device_, bt_, R_, at::kInt, MB);
    for (core::ViewCache* v : {&views_.slots, &views_.cos, &views_.sin}) v->resize(T);
    if (dsa_) {
      views_.lcql = core::RegionViews(device_, lcql_, R_, at::kInt);
      views_.lseq = core::RegionViews(device_, lseq_, R_, at::kInt);
      views_.lcos.resize(TR);
      views_.lsin.resize(TR);
      md_.dsa_cp.world_size = cfg.dsa_cp_world_size;
      md_.dsa_cp.rank = cfg.dsa_cp_rank;
    }
    if (dcp_) {
      views_.islots.resize(T);
      views_.dseq = core::RegionViews(device_, dseq_, R_, at::kInt);
      views_.rbt = core::RegionViews(device_, rbt_, R_, at::kInt, MB * kvw_);
      // Under PCP the main cache is sharded over the PCP ranks (docs/design/sparse_cp.md §11).
      md_.dcp.world_size = kvw_;
      md_.dcp.rank = kvr_;
      md_.dcp.interleave = cfg.cp_kv_cache_interleave_size;
    }
    if (offload_) {
      views_.ttr.resize(T);
      views_.rid = core::RegionViews(device_, rid_, R_, at::kLong);
      views_.pcql = core::RegionViews(device_, pcql_, R_, at::kInt);
    }
    md_.block_size = cfg.block_size;
    md_.num_blocks = cfg.num_blocks;
    md_.speculative = cfg.num_speculative_tokens > 0;
    md_.draft_index = draft_index;
    md_.offload.enabled = offload_;
    md_.offload.decode_consumer = offload_ && cfg.offload->is_decode_consumer;
    md_.offload.block_table_stride = static_cast<int32_t>(MB);
    if (pcp_) init_pcp();
  }

  // The main lane's staging rows (R x max_blocks_per_req) on the CPU path.
  at::Tensor staged_rows(int64_t rows) const {
    return buffers_->host(0).narrow(0, bt_.offset, rows * cfg_.max_blocks_per_req).view({rows, cfg_.max_blocks_per_req});
  }

  const Metadata& metadata() const { return md_; }
  uint64_t generation() const { return counter_.current(); }

  // capture: build_for_graph_capture's build (under PCP a step with prefills is refused by the plan).
  Metadata& build(const BuildInputs& in, bool capture = false) {
    const int64_t MB = cfg_.max_blocks_per_req;
    if (in.draft_step != -1) {
      throw_not_supported("BuildInputs.draft_step=", in.draft_step, ": the SFA builder has no DCP draft steps "
                          "(its drafts are build_for_drafting's lanes, which take the draft's own seq_lens)");
    }
    if (draft_index_ >= 0) {
      AAR_CHECK_ARG(in.seq_lens.size() <= static_cast<size_t>(R_), "num_reqs=", in.seq_lens.size(),
                    " (seq_lens entries) exceeds the draft lane's request capacity max_num_reqs*decode_threshold=",
                    R_);
    }
    core::check_step_fits(in, cfg_, cfg_.max_blocks_per_req, draft_index_ >= 0 ? R_ : -1);
    if (pcp_ && !cfg_.graph_decode_padding && in.num_input_tokens != 0 && !in.query_start_loc.empty() &&
        in.num_input_tokens != in.query_start_loc.back()) {
      throw_not_supported("num_input_tokens=", in.num_input_tokens, " with pcp_world_size=", cfg_.pcp_world_size,
                          " without graph_decode_padding: a PCP build takes the global batch unpadded "
                          "(num_input_tokens 0 or query_start_loc[B]=", in.query_start_loc.back(),
                          ", docs/design/sparse_cp.md §11)");
    }
    // The offload's checks (plan/sfa_offload_plan.h), before anything is written.
    plan::SfaOffloadInputs oi;
    if (offload_) {
      static_cast<core::StepInput&>(oi) = in;
      oi.decode_threshold = 1 + cfg_.num_speculative_tokens;
      oi.decode_consumer = cfg_.offload->is_decode_consumer;
      plan::check_sfa_offload_step(oi);
    } else {
      // The plain split treats short extends as decodes and keeps no per-request state.
      core::refuse_unread(in, core::kReqIds | core::kIsPrefilling,
                          "the SFA builder without KV offload (BuilderConfig::offload)");
    }
    // The host buffer of this build's turn, once its last copy has completed.
    int32_t* s = buffers_->begin();
    const int turn = buffers_->active();
    const int64_t tokens = in.num_input_tokens > 0 ? in.num_input_tokens
                                                   : (in.query_start_loc.empty() ? 0 : in.query_start_loc.back());
    // A negative count is rejected by the plan; the token spans are then empty.
    const int64_t n = std::max<int64_t>(in.num_input_tokens < 0 ? 0 : tokens, 0);
    const TokenRegion& tr = token_region(n);

    // is_prefilling and req_ids were refused above unless this is an offload builder.
    plan::SfaStepInputs pi;
    static_cast<core::StepInput&>(pi) = in;
    pi.block_size = cfg_.block_size;
    pi.num_blocks = cfg_.num_blocks;
    pi.decode_threshold = 1 + cfg_.num_speculative_tokens;
    pi.spec_method = cfg_.num_speculative_tokens > 0 ? plan::SpecMethod::Mtp : plan::SpecMethod::None;
    pi.chunked_prefill_enabled = cfg_.chunked_prefill_enabled;
    pi.rope_positions = rope_.positions();
    pi.pad_decode_batch = cfg_.graph_decode_padding;
    // PCP (docs/design/sparse_cp.md §11.1): only a decode-only step is padded to a graph bucket, and only a
    // decode-only step is captured; a step with prefills keeps its head/tail split (refused before any write).
    pi.pad_only_decode_buckets = pcp_;
    pi.capture_decode_only = pcp_ && capture;
    pi.treat_short_extends_as_decodes = !offload_ || cfg_.offload->is_decode_consumer;
    pi.dcp = plan::DcpShard{kvw_, kvr_, cfg_.cp_kv_cache_interleave_size};

    plan::SfaStepBuffers pb;
    pb.query_start_loc = plan::Span<int32_t>(s + qsl_.offset, R_ + 1);
    pb.cum_query_lens = plan::Span<int32_t>(s + cql_.offset, R_);
    pb.seq_lens = plan::Span<int32_t>(s + seq_.offset, R_);
    pb.block_table = plan::Span<int32_t>(s + bt_.offset, R_ * MB);
    pb.block_table_stride = static_cast<int32_t>(MB);
    pb.slot_mapping = plan::Span<int64_t>(reinterpret_cast<int64_t*>(s + tr.slots), n);
    pb.positions = plan::Span<int32_t>(positions_.data(), n);
    pb.cum_query_lens_list = plan::Span<int64_t>(cql_list_.data(), cql_list_.size());
    pb.seq_lens_list = plan::Span<int64_t>(seq_list_.data(), seq_list_.size());
    if (dcp_) {
      const int64_t rs = MB * kvw_;
      pb.dcp_block_lens = plan::Span<int32_t>(dcp_block_lens_.data(), dcp_block_lens_.size());
      pb.dcp_seq_lens = plan::Span<int32_t>(s + dseq_.offset, R_);
      pb.dcp_seq_lens_list = plan::Span<int64_t>(dseq_list_.data(), dseq_list_.size());
      pb.replicated_block_table = plan::Span<int32_t>(s + rbt_.offset, R_ * rs);
      pb.replicated_stride = static_cast<int32_t>(rs);
      pb.replicated_slot_mapping = plan::Span<int64_t>(reinterpret_cast<int64_t*>(s + tr.islots), n);
      std::vector<int32_t>& ext = rep_extent_[static_cast<size_t>(turn)];
      pb.replicated_extent = plan::Span<int32_t>(ext.data(), ext.size());
    }

    // Everything that can fail happens in here, before its first write.
    const plan::SfaStepPlan p = plan::plan_sfa_step(pi, pb);
    const int32_t B = p.num_reqs, Bk = p.num_kernel_reqs, t_real = p.num_actual_tokens, t_in = p.num_input_tokens;
    plan::TokenShard shard;
    int32_t t_rope = t_in;  // RoPE rows gathered: the step's, or (DSA-CP) its padded count
    if (dsa_) {
      // docs/design/sparse_cp.md §4 on the kernel requests (graph padding dummies included).
      kqsl_.resize(static_cast<size_t>(Bk) + 1);
      kqsl_[0] = 0;
      std::copy(pb.cum_query_lens.data(), pb.cum_query_lens.data() + Bk, kqsl_.begin() + 1);
      plan::TokenShardInputs ti;
      ti.query_start_loc = plan::CSpan<int32_t>(kqsl_.data(), kqsl_.size());
      ti.seq_lens = plan::CSpan<int32_t>(pb.seq_lens.data(), Bk);
      ti.num_input_tokens = kqsl_.back() > t_in ? kqsl_.back() : t_in;
      ti.world = cfg_.dsa_cp_world_size;
      ti.rank = cfg_.dsa_cp_rank;
      plan::TokenShardBuffers tb;
      tb.local_cum_query_lens = plan::Span<int32_t>(s + lcql_.offset, Bk);
      tb.local_seq_lens = plan::Span<int32_t>(s + lseq_.offset, Bk);
      shard = plan::plan_token_shard(ti, tb);
      std::copy(s + lcql_.offset, s + lcql_.offset + Bk, lcql_list_.begin());
      std::copy(s + lseq_.offset, s + lseq_.offset + Bk, lseq_list_.begin());
      t_rope = shard.num_tokens_pad;
      std::fill(positions_.begin() + t_in, positions_.begin() + t_rope, 0);
    }
    if (offload_) {
      plan::SfaOffloadBuffers ob;
      ob.req_ids = plan::Span<uint64_t>(reinterpret_cast<uint64_t*>(s + rid_.offset), R_);
      ob.token_to_req = plan::Span<int32_t>(s + tr.ttr, n);
      ob.prefill_cum_query_lens = plan::Span<int32_t>(s + pcql_.offset, R_);
      ob.decode_req_ids = plan::Span<uint64_t>(dec_ids_.data(), dec_ids_.size());
      ob.decode_seq_lens = plan::Span<int32_t>(dec_seq_.data(), dec_seq_.size());
      ob.decode_stable_prefix = plan::Span<int32_t>(dec_stable_.data(), dec_stable_.size());
      plan::write_sfa_offload_step(oi, p.split, t_in, ob);
    }
    if (pcp_) plan_pcp(s, in, p);

    // RoPE rows of every token, gathered on the host into the packed buffer.
    auto* bytes = reinterpret_cast<uint8_t*>(s);
    uint8_t* out_cos = bytes + tr.cos * 4;
    uint8_t* out_sin = bytes + tr.sin * 4;
    if (p.max_query_len <= pi.decode_threshold) {
      // Decodes only (the steady state): one row per token, specialised gather.
      rope_.gather(positions_.data(), t_in, out_cos, out_sin);
    } else {
      // A request's tokens have consecutive positions: one copy per request and table.
      const size_t rb = static_cast<size_t>(rope_.row_bytes());
      const int32_t* qsl = in.query_start_loc.data();
      for (int32_t r = 0; r < B; ++r) {
        const int32_t q = qsl[r + 1] - qsl[r];
        if (q == 0) continue;
        const size_t dst = static_cast<size_t>(qsl[r]) * rb;
        rope_.copy_run(positions_[qsl[r]], q, out_cos + dst, out_sin + dst);
      }
      const size_t pad = static_cast<size_t>(t_real) * rb;
      rope_.gather(positions_.data() + t_real, t_in - t_real, out_cos + pad, out_sin + pad);
    }
    if (t_rope > t_in) {
      const size_t off = static_cast<size_t>(t_in) * static_cast<size_t>(rope_.row_bytes());
      rope_.gather(positions_.data() + t_in, t_rope - t_in, out_cos + off, out_sin + off);
    }
    // One host-to-device copy (device path): from the step's first slot to its
    // last block-table row. Then the turn passes to the next host buffer.
    const int64_t copy_end = dcp_ ? rbt_.offset + static_cast<int64_t>(Bk) * MB * kvw_
                                  : bt_.offset + static_cast<int64_t>(Bk) * MB;
    buffers_->copy(tr.slots, copy_end - tr.slots);
    buffers_->finish();
    counter_.next(md_.stamp);

    md_.attn_state = p.state;
    md_.num_reqs = B;
    md_.num_kernel_reqs = Bk;
    md_.num_actual_tokens = t_real;
    md_.num_input_tokens = t_in;
    md_.num_decodes = p.split.num_decodes;
    md_.num_decode_tokens = p.split.num_decode_tokens;
    md_.num_prefills = p.split.num_prefills;
    md_.num_prefill_tokens = t_real - p.split.num_decode_tokens;
    md_.max_query_len = p.max_query_len;
    md_.max_seq_len = p.max_seq_len;
    md_.query_start_loc = views_.qsl.first(B + 1);
    md_.cum_query_lens = views_.cql.first(Bk);
    md_.seq_lens = views_.seq.first(Bk);
    md_.block_table = views_.bt.first(Bk);
    // The token views' offsets depend on the token count only (token_region).
    md_.slot_mapping = views_.slots.get(t_in, [&] { return device_.narrow(0, tr.slots, 2 * n).view(at::kLong); });
    md_.cos = views_.cos.get(t_in, [&] { return rope_.view(device_, tr.cos, t_in); });
    md_.sin = views_.sin.get(t_in, [&] { return rope_.view(device_, tr.sin, t_in); });
    md_.seq_lens_list = c10::IntArrayRef(seq_list_.data(), Bk);
    md_.cum_query_lens_list = c10::IntArrayRef(cql_list_.data(), Bk);
    if (offload_) fill_offload(s, turn, tr, p);
    if (dsa_) {
      DsaCpMetadata& c = md_.dsa_cp;
      c.num_tokens_pad = shard.num_tokens_pad;
      c.tokens_per_rank = shard.tokens_per_rank;
      c.local_start = shard.local_start;
      c.local_end = shard.local_end;
      set_view(c.cum_query_lens, views_.lcql.first(Bk));
      set_view(c.seq_lens, views_.lseq.first(Bk));
      const int64_t key = static_cast<int64_t>(t_rope) * (INT32_MAX + int64_t{1}) + shard.local_start;
      set_view(c.cos, views_.lcos.get(shard.tokens_per_rank, key, [&] {
        return rope_.view(device_, tr.cos, t_rope).narrow(0, shard.local_start, shard.tokens_per_rank);
      }));
      set_view(c.sin, views_.lsin.get(shard.tokens_per_rank, key, [&] {
        return rope_.view(device_, tr.sin, t_rope).narrow(0, shard.local_start, shard.tokens_per_rank);
      }));
      c.cum_query_lens_list = c10::IntArrayRef(lcql_list_.data(), Bk);
      c.seq_lens_list = c10::IntArrayRef(lseq_list_.data(), Bk);
    }
    if (pcp_) fill_pcp(p);
    if (dcp_) {
      set_view(md_.dcp.seq_lens, views_.dseq.first(Bk));
      set_view(md_.dcp.indexer_block_table, views_.rbt.first(Bk));
      set_view(md_.dcp.indexer_slot_mapping,
               views_.islots.get(t_in, [&] { return device_.narrow(0, tr.islots, 2 * n).view(at::kLong); }));
      md_.dcp.seq_lens_list = c10::IntArrayRef(dseq_list_.data(), Bk);
    }
    return md_;
  }

 private:
  // Word offsets of a step's token views: packed together, ending (up to
  // alignment) where the request part begins.
  struct TokenRegion {
    int64_t slots, cos, sin, ttr, islots;
  };
  // A metadata field takes a cached view only when it holds another one: a steady-state step repeats its
  // views, and each tensor assignment is a reference-count increment and decrement.
  static void set_view(at::Tensor& field, const at::Tensor& view) {
    if (!field.is_same(view)) field = view;
  }

  // Kept for the last n: steady-state steps repeat their token count.
  const TokenRegion& token_region(int64_t n) {
    if (n != token_region_n_) {
      const int64_t W = rope_.row_words();
      // DSA-CP: RoPE rows for the step padded to a multiple of the group.
      const int64_t g = dsa_ ? cfg_.dsa_cp_world_size : 1;
      const int64_t nr = (n + g - 1) / g * g;
      TokenRegion& r = token_region_;
      core::StagingLayout::pack_before(
          qsl_.offset, {{&r.slots, 2 * n}, {&r.cos, nr * W}, {&r.sin, nr * W}, {&r.ttr, offload_ ? n : 0},
                        {&r.islots, dcp_ ? 2 * n : 0}});
      token_region_n_ = n;
    }
    return token_region_;
  }

  // PCP (docs/design/sparse_cp.md §11): host lists of the rank's rows; one int32 buffer holding the
  // device lists at fixed offsets, the gather index and the local RoPE rows (on the CPU path the device
  // tensors are the host ones; else each build copies the used part).
  void init_pcp() {
    const int64_t T = cfg_.max_num_tokens, MB = cfg_.max_blocks_per_req, Wp = cfg_.pcp_world_size;
    const int64_t TL = T + R_, IR = 4 * R_, G = Wp * R_;
    pp_.token.assign(TL, 0);
    pp_.pos.assign(TL, 0);
    pp_.gather.assign(T, 0);
    pp_.gcum.assign(G, 0);
    pp_.icum.assign(IR, 0);
    pp_.iseq.assign(IR, 0);
    pp_.ireq.assign(IR, 0);
    pp_.token_list.assign(TL, 0);
    pp_.icum_list.assign(IR, 0);
    pp_.iseq_list.assign(IR, 0);
    pp_.o_icum = 0;
    pp_.o_iseq = IR;
    pp_.o_ibt = 2 * IR;
    pp_.o_gcum = pp_.o_ibt + IR * MB * kvw_;
    pp_.o_gseq = pp_.o_gcum + G;
    pp_.o_gbt = pp_.o_gseq + G;
    const int64_t words = pp_.o_gbt + G * MB;
    const auto i32 = at::TensorOptions().dtype(at::kInt);
    pp_.host = at::zeros({words}, i32);
    pp_.gidx_host = at::zeros({T}, at::TensorOptions().dtype(at::kLong));
    pp_.cos_host = at::zeros({TL, rope_.dim()}, at::TensorOptions().dtype(rope_.dtype()));
    pp_.sin_host = at::zeros_like(pp_.cos_host);
    if (separate_) {
      pp_.dev = pp_.host.to(cfg_.device);
      pp_.gidx = pp_.gidx_host.to(cfg_.device);
      pp_.cos = pp_.cos_host.to(cfg_.device);
      pp_.sin = pp_.sin_host.to(cfg_.device);
    } else {
      pp_.dev = pp_.host;
      pp_.gidx = pp_.gidx_host;
      pp_.cos = pp_.cos_host;
      pp_.sin = pp_.sin_host;
    }
    for (core::ViewCache* v : {&pp_.cos_v, &pp_.sin_v}) v->resize(TL);
    pp_.gidx_v.resize(T);
    for (core::ViewCache* v : {&pp_.icum_v, &pp_.iseq_v, &pp_.ibt_v}) v->resize(IR);
    for (core::ViewCache* v : {&pp_.gcum_v, &pp_.gseq_v, &pp_.gbt_v}) v->resize(G);
    md_.pcp.world_size = cfg_.pcp_world_size;
    md_.pcp.rank = cfg_.pcp_rank;
    md_.pcp.dcp_world_size = cfg_.dcp_world_size;
    md_.pcp.dcp_rank = cfg_.dcp_rank;
  }

  // This rank's rows of the planned global step (the plan validated everything they read).
  void plan_pcp(const int32_t* s, const BuildInputs& in, const plan::SfaStepPlan& p) {
    const int64_t MB = cfg_.max_blocks_per_req, Wp = cfg_.pcp_world_size, rs = MB * kvw_;
    const int32_t B = p.num_reqs;
    pp_.decode = p.split.num_prefills == 0 && every_request_has_tokens(in.query_start_loc, B);
    if (pp_.decode) {
      plan_pcp_decode(p);
      return;
    }
    pp_.iota = 0;  // the generic rows below overwrite the token lists
    plan::SparsePcpInputs si;
    si.query_start_loc = in.query_start_loc;
    si.seq_lens = in.seq_lens;
    si.num_decodes = p.split.num_decodes;
    si.pcp_size = cfg_.pcp_world_size;
    si.pcp_rank = cfg_.pcp_rank;
    plan::SparsePcpBuffers sb;
    sb.local_token_index = plan::Span<int32_t>(pp_.token.data(), pp_.token.size());
    sb.positions = plan::Span<int32_t>(pp_.pos.data(), pp_.pos.size());
    sb.gather_index = plan::Span<int32_t>(pp_.gather.data(), pp_.gather.size());
    sb.gathered_cum_query_lens = plan::Span<int32_t>(pp_.gcum.data(), pp_.gcum.size());
    sb.indexer_cum_query_lens = plan::Span<int32_t>(pp_.icum.data(), pp_.icum.size());
    sb.indexer_seq_lens = plan::Span<int32_t>(pp_.iseq.data(), pp_.iseq.size());
    sb.indexer_req = plan::Span<int32_t>(pp_.ireq.data(), pp_.ireq.size());
    pp_.sizes = plan::plan_sparse_pcp_rows(si, sb);
    pp_.groups = B;
    if (p.padded) pad_pcp_bucket(s, p);
    // (Unpadded PCP steps have num_input_tokens == qsl[B]; a padded bucket's dummy tokens are gathered too.)
    const int32_t tl = pp_.sizes.local_tokens, nr = pp_.sizes.indexer_reqs, tr = p.num_input_tokens;
    const int32_t Bg = pp_.groups;
    for (int32_t i = 0; i < tl; ++i) pp_.token_list[i] = pp_.token[i];
    for (int32_t k = 0; k < nr; ++k) {
      pp_.icum_list[k] = pp_.icum[k];
      pp_.iseq_list[k] = pp_.iseq[k];
    }
    pp_.token_index.assign(pp_.token.begin(), pp_.token.begin() + tl);
    int32_t* h = pp_.host.data_ptr<int32_t>();
    std::copy(pp_.icum.begin(), pp_.icum.begin() + nr, h + pp_.o_icum);
    std::copy(pp_.iseq.begin(), pp_.iseq.begin() + nr, h + pp_.o_iseq);
    const int32_t* rep = s + rbt_.offset;  // the replicated view of the global requests
    pp_.rep_rows = true;
    for (int32_t k = 0; k < nr; ++k) pp_.rep_rows &= pp_.ireq[k] == k;
    if (!pp_.rep_rows) {
      for (int32_t k = 0; k < nr; ++k) {
        std::copy(rep + pp_.ireq[k] * rs, rep + (pp_.ireq[k] + 1) * rs, h + pp_.o_ibt + k * rs);
      }
    }
    pp_.split = p.split.num_prefills > 0;
    const int32_t* bt = s + bt_.offset;   // the local block table of the global requests
    const int32_t* dseq = s + dseq_.offset;
    for (int64_t j = 0; pp_.split && j < Wp; ++j) {
      // Group j's rows g = j * Bg + b are the Bg local rows in order: one run.
      std::copy(bt, bt + static_cast<int64_t>(Bg) * MB, h + pp_.o_gbt + j * Bg * MB);
      for (int32_t b = 0; b < Bg; ++b) {
        const int64_t g = j * Bg + b;
        h[pp_.o_gcum + g] = pp_.gcum[g];
        h[pp_.o_gseq + g] = dseq[b];
      }
    }
    int64_t* gi = pp_.gidx_host.data_ptr<int64_t>();
    if (pp_.split) {
      for (int32_t t = 0; t < tr; ++t) gi[t] = pp_.gather[t];
    }
    // Every request a decode: the local rows are the step's tokens at their positions (no padding
    // under PCP), whose RoPE rows the main gather writes.
    pp_.rope_main = p.split.num_decodes == B && tl == p.num_input_tokens;
    if (!pp_.rope_main) {
      rope_.gather(pp_.pos.data(), tl, static_cast<uint8_t*>(pp_.cos_host.data_ptr()),
                   static_cast<uint8_t*>(pp_.sin_host.data_ptr()));
    }
    if (separate_) {
      auto copy = [](const at::Tensor& dst, const at::Tensor& src, int64_t off, int64_t n) {
        if (n > 0) dst.narrow(0, off, n).copy_(src.narrow(0, off, n));
      };
      copy(pp_.dev, pp_.host, pp_.o_icum, nr);
      copy(pp_.dev, pp_.host, pp_.o_iseq, nr);
      if (!pp_.rep_rows) copy(pp_.dev, pp_.host, pp_.o_ibt, nr * rs);
      if (pp_.split) {
        copy(pp_.dev, pp_.host, pp_.o_gcum, Wp * Bg);
        copy(pp_.dev, pp_.host, pp_.o_gseq, Wp * Bg);
        copy(pp_.dev, pp_.host, pp_.o_gbt, Wp * Bg * MB);
        copy(pp_.gidx, pp_.gidx_host, 0, tr);
      }
      if (!pp_.rope_main) {
        copy(pp_.cos, pp_.cos_host, 0, tl);
        copy(pp_.sin, pp_.sin_host, 0, tl);
      }
    }
  }

  static bool every_request_has_tokens(plan::CSpan<int32_t> qsl, int32_t B) {
    int empty = 0;
    for (int32_t r = 0; r < B; ++r) empty |= qsl[r + 1] == qsl[r];
    return empty == 0;
  }

  // A decode-only step whose every request has tokens (docs/design/sparse_cp.md §11.2): what
  // plan_sparse_pcp_rows and pad_pcp_bucket give for it is known without planning it. Every rank's rows are
  // the step's t_in kernel tokens in order (the real ones, then a padded bucket's dummies, -1 as rows), and
  // the indexer's requests are the kernel requests (one per request, each with tokens, dummies included), so
  // their lists are the step's own cum_query_lens / seq_lens and their replicated rows the step's table; the
  // local rows' RoPE rows are the step's. Only the row lists are written, and only where they are not already
  // the identity (pp_.iota: the leading entries that hold their own index).
  void plan_pcp_decode(const plan::SfaStepPlan& p) {
    const int32_t t_real = p.num_actual_tokens, t_in = p.num_input_tokens, Bk = p.num_kernel_reqs;
    std::vector<int32_t>& idx = pp_.token_index;
    idx.resize(static_cast<size_t>(t_in));
    for (int32_t i = pp_.iota; i < t_real; ++i) {
      idx[i] = i;
      pp_.token_list[i] = i;
    }
    for (int32_t i = t_real; i < t_in; ++i) {
      idx[i] = -1;
      pp_.token_list[i] = -1;
    }
    // (A shorter step leaves the identity past its rows; a padded one overwrote it from t_real.)
    pp_.iota = t_in > t_real ? t_real : std::max(pp_.iota, t_real);
    pp_.sizes.num_decode_tokens = t_real;
    pp_.sizes.local_tokens = t_in;
    pp_.sizes.indexer_reqs = Bk;
    pp_.groups = Bk;
    pp_.split = false;
    pp_.rep_rows = true;
    pp_.rope_main = true;
  }

  // A decode-only step padded to its graph bucket (docs/design/sparse_cp.md §11.1): every PCP rank's rows
  // are the step's t_in kernel tokens, the real decodes (planned above) then the dummies; the dummies are
  // requests of the kernels like the real ones (the plan's dummy rows: KV length 0, block-table rows of zeros,
  // slots -1), so their indexer requests select nothing and their partials are empty on every rank. The
  // gathered groups are then the B_k kernel requests of each rank's block.
  void pad_pcp_bucket(const int32_t* s, const plan::SfaStepPlan& p) {
    const int32_t t_real = p.num_actual_tokens, t_in = p.num_input_tokens, Bk = p.num_kernel_reqs;
    const int32_t* kcql = s + cql_.offset;  // the kernel requests' cumulative query ends, dummies included
    const int32_t* kseq = s + seq_.offset;  // their global KV lengths (0 for a dummy)
    for (int32_t t = t_real; t < t_in; ++t) {
      pp_.token[t] = -1;
      pp_.pos[t] = 0;
      pp_.gather[t] = t;  // its rank-0 copy, as a decode token's (its slots are -1: nothing is written)
    }
    for (int32_t k = 0; k < Bk; ++k) {
      pp_.icum[k] = kcql[k];
      pp_.iseq[k] = kseq[k];
      pp_.ireq[k] = k;
    }
    for (int32_t j = 0; j < cfg_.pcp_world_size; ++j) {
      for (int32_t b = 0; b < Bk; ++b) pp_.gcum[static_cast<size_t>(j) * Bk + b] = j * t_in + kcql[b];
    }
    pp_.sizes.local_tokens = t_in;
    pp_.sizes.indexer_reqs = Bk;
    pp_.groups = Bk;
  }

  void fill_pcp(const plan::SfaStepPlan& p) {
    const int64_t MB = cfg_.max_blocks_per_req, Wp = cfg_.pcp_world_size, rs = MB * kvw_;
    const int64_t B = pp_.groups, tl = pp_.sizes.local_tokens, nr = pp_.sizes.indexer_reqs;
    PcpMetadata& m = md_.pcp;
    m.num_local_tokens = static_cast<int32_t>(tl);
    m.num_indexer_reqs = static_cast<int32_t>(nr);
    // (md_.cos / md_.sin hold the step's t_in rows, which are the local rows under rope_main.)
    set_view(m.cos, pp_.rope_main ? md_.cos : pp_.cos_v.get(tl, [&] { return pp_.cos.narrow(0, 0, tl); }));
    set_view(m.sin, pp_.rope_main ? md_.sin : pp_.sin_v.get(tl, [&] { return pp_.sin.narrow(0, 0, tl); }));
    const int64_t tr = p.num_input_tokens, G = pp_.split ? Wp * B : 0;
    // (Decode-only: no gather index and no gathered groups, empty views.)
    set_view(m.gather_index,
             pp_.gidx_v.get(pp_.split ? tr : 0, [&] { return pp_.gidx.narrow(0, 0, pp_.split ? tr : 0); }));
    // (Decode-only with tokens in every request: the indexer's requests are the kernel requests.)
    set_view(m.indexer_cum_query_lens,
             pp_.decode ? md_.cum_query_lens : pp_.icum_v.get(nr, [&] { return pp_.dev.narrow(0, pp_.o_icum, nr); }));
    set_view(m.indexer_seq_lens,
             pp_.decode ? md_.seq_lens : pp_.iseq_v.get(nr, [&] { return pp_.dev.narrow(0, pp_.o_iseq, nr); }));
    set_view(m.indexer_block_table, pp_.rep_rows ? views_.rbt.first(nr) : pp_.ibt_v.get(nr, [&] {
      return pp_.dev.narrow(0, pp_.o_ibt, nr * rs).view({nr, rs});
    }));
    set_view(m.gathered_cum_query_lens, pp_.gcum_v.get(G, [&] { return pp_.dev.narrow(0, pp_.o_gcum, G); }));
    set_view(m.gathered_seq_lens, pp_.gseq_v.get(G, [&] { return pp_.dev.narrow(0, pp_.o_gseq, G); }));
    set_view(m.gathered_block_table,
             pp_.gbt_v.get(G, [&] { return pp_.dev.narrow(0, pp_.o_gbt, G * MB).view({G, MB}); }));
    m.local_token_index_list = c10::IntArrayRef(pp_.token_list.data(), tl);
    m.indexer_cum_query_lens_list = pp_.decode ? md_.cum_query_lens_list : c10::IntArrayRef(pp_.icum_list.data(), nr);
    m.indexer_seq_lens_list = pp_.decode ? md_.seq_lens_list : c10::IntArrayRef(pp_.iseq_list.data(), nr);
  }

 public:
  const std::vector<int32_t>& pcp_token_index() const { return pp_.token_index; }

 private:
  // The metadata's offload part (docs/design/sfa.md §6) of a build planned into host buffer
  // `turn` (data s).
  void fill_offload(const int32_t* s, int turn, const TokenRegion& tr, const plan::SfaStepPlan& p) {
    const int64_t MB = cfg_.max_blocks_per_req;
    const int32_t B = p.num_reqs, t_real = p.num_actual_tokens, t_in = p.num_input_tokens;
    const int32_t nd = p.split.num_decodes, np = p.split.num_prefills, ndt = p.split.num_decode_tokens;
    OffloadMetadata& o = md_.offload;
    o.req_ids = views_.rid.first(B);
    o.token_to_req = views_.ttr.get(t_in, [&] { return device_.narrow(0, tr.ttr, t_in); });
    o.prefill_cum_query_lens = views_.pcql.first(np);
    if (!prefill_views_.seq.defined() || prefill_views_.nd != nd || prefill_views_.np != np) {
      prefill_views_.nd = nd;
      prefill_views_.np = np;
      prefill_views_.seq = device_.narrow(0, seq_.offset + nd, np);
      prefill_views_.bt = device_.narrow(0, bt_.offset + nd * MB, np * MB).view({np, MB});
    }
    o.prefill_seq_lens = prefill_views_.seq;
    o.prefill_block_table = prefill_views_.bt;
    // Host int64 slots of the real tokens in the turn's host buffer (the
    // device buffer itself on the CPU path), viewed once per (turn, count).
    auto& sh = slots_host_[static_cast<size_t>(turn)];
    if (!sh.view.defined() || sh.tokens != t_real || sh.offset != tr.slots) {
      sh.tokens = t_real;
      sh.offset = tr.slots;
      sh.view = buffers_->host(turn).narrow(0, tr.slots, 2 * static_cast<int64_t>(t_real)).view(at::kLong);
    }
    o.slot_mapping_host = sh.view;
    o.req_ids_host = plan::CSpan<uint64_t>(reinterpret_cast<const uint64_t*>(s + rid_.offset), B);
    o.token_to_req_host = plan::CSpan<int32_t>(s + tr.ttr, t_in);
    o.block_table_host = plan::CSpan<int32_t>(s + bt_.offset, static_cast<size_t>(B) * MB);
    o.decode_req_ids = plan::CSpan<uint64_t>(dec_ids_.data(), ndt);
    o.decode_seq_lens = plan::CSpan<int32_t>(dec_seq_.data(), ndt);
    o.decode_stable_prefix = plan::CSpan<int32_t>(dec_stable_.data(), ndt);
  }

  // Views made the first time a size is seen (core/staging_layout.h).
  struct Views {
    core::RegionViews qsl;                 // by num_reqs: (n + 1)
    core::RegionViews cql, seq, bt;        // by num_kernel_reqs
    core::ViewCache slots, cos, sin;       // by num_input_tokens (the token region's packing)
    core::ViewCache ttr;                   // offload: by num_input_tokens
    core::RegionViews rid, pcql;           // offload: by num_reqs / num_prefills
    core::ViewCache islots;                // DCP: by num_input_tokens
    core::RegionViews lcql, lseq;          // DSA-CP: by num_kernel_reqs
    core::ViewCache lcos, lsin;            // DSA-CP: by tokens per rank, keyed by (T_pad, local_start)
    core::RegionViews dseq, rbt;           // DCP: by num_kernel_reqs
  };
  // Offload: the prefill views of the last (num_decodes, num_prefills).
  struct PrefillViews {
    int32_t nd = -1, np = -1;
    at::Tensor seq, bt;
  };
  // Offload: the host slot view of a host buffer's last build.
  struct SlotsHost {
    int32_t tokens = -1;
    int64_t offset = -1;
    at::Tensor view;
  };

  const BuilderConfig& cfg_;
  const aar::detail::RopeRows& rope_;
  int32_t draft_index_;
  int64_t R_;  // request capacity (kernel requests, dummies included)
  bool offload_ = false;
  core::Region qsl_, cql_, seq_, bt_;  // the staging buffer's request part
  TokenRegion token_region_;
  int64_t token_region_n_ = -1;
  core::Region rid_, pcql_;           // offload only
  bool dcp_ = false;
  bool dsa_ = false;
  bool pcp_ = false;
  int32_t kvw_ = 1, kvr_ = 0;  // the main cache's shard: DCP's, or (PCP) the PCP group's
  bool separate_ = false;
  struct PcpPart {
    std::vector<int32_t> token, pos, gather, gcum, icum, iseq, ireq, token_index;
    std::vector<int64_t> token_list, icum_list, iseq_list;
    at::Tensor host, dev, gidx_host, gidx, cos_host, sin_host, cos, sin;
    int64_t o_icum = 0, o_iseq = 0, o_ibt = 0, o_gcum = 0, o_gseq = 0, o_gbt = 0;
    plan::SparsePcpSizes sizes;
    int32_t groups = 0;  // the gathered groups per rank: the step's requests, or a padded bucket's B_k
    // This build's shortcuts: the local rows are the step's tokens in order (every request a decode),
    // so their RoPE rows are the step's; the indexer requests are the step's first ones in order, so
    // their replicated rows are the step's replicated table.
    bool rope_main = false, rep_rows = false;
    // A step with a prefill (the head/tail split): the gather index and the gathered groups are made; a
    // decode-only step's layer reads neither (docs/design/sparse_cp.md §11.2), so they are skipped.
    bool split = false;
    // This build is plan_pcp_decode's (a decode-only step, every request with tokens): the indexer's lists are
    // the step's kernel lists.
    bool decode = false;
    int32_t iota = 0;  // leading entries of token_list and token_index that hold their own index
    // The metadata's views, made once per count (core::ViewCache).
    core::ViewCache cos_v, sin_v, gidx_v, icum_v, iseq_v, ibt_v, gcum_v, gseq_v, gbt_v;
  } pp_;
  core::Region dseq_, rbt_;           // DCP only
  core::Region lcql_, lseq_;          // DSA-CP only
  std::vector<int32_t> kqsl_;         // DSA-CP, host: the kernel requests' query starts
  std::vector<int64_t> lcql_list_, lseq_list_;
  std::vector<int32_t> dcp_block_lens_;  // DCP, host scratch of the plan
  std::vector<std::vector<int32_t>> rep_extent_;  // DCP: per host buffer, SfaStepBuffers::replicated_extent
  std::vector<int64_t> dseq_list_;
  std::unique_ptr<aar::detail::StagingBuffers> buffers_;
  at::Tensor device_;
  std::vector<int32_t> positions_;          // host only: the RoPE rows are gathered on the host
  std::vector<int64_t> cql_list_, seq_list_;
  Views views_;
  PrefillViews prefill_views_;
  std::vector<SlotsHost> slots_host_;
  std::vector<uint64_t> dec_ids_;       // offload, host only: per decode token
  std::vector<int32_t> dec_seq_, dec_stable_;
  Metadata md_;
  detail::BuildCounter counter_;
};

MetadataBuilder::MetadataBuilder(const BuilderConfig& cfg) : cfg_(cfg) {
  AAR_CHECK_ARG(cfg.max_num_reqs > 0, "max_num_reqs must be positive, got ", cfg.max_num_reqs);
  AAR_CHECK_ARG(cfg.max_num_tokens > 0, "max_num_tokens must be positive, got ", cfg.max_num_tokens);
  AAR_CHECK_ARG(cfg.max_blocks_per_req > 0, "max_blocks_per_req must be positive, got ", cfg.max_blocks_per_req);
  ::aar::internal::check_capacity_bounds(cfg);
  AAR_CHECK_ARG(Backend::is_builder_block_size(cfg.block_size), "block_size ", cfg.block_size,
                " is not supported (SFA's kernel block is 128; multiples of 16 in [16, 128] are accepted for tests)");
  AAR_CHECK_ARG(cfg.num_blocks > 0, "num_blocks must be positive, got ", cfg.num_blocks);
  ::aar::internal::check_slot_range(cfg);
  AAR_CHECK_ARG(cfg.num_speculative_tokens >= 0 && cfg.num_speculative_tokens <= 15,
                "num_speculative_tokens must be in [0, 15] (decode threshold 1 + n <= 16, docs/design/sfa.md §3.2), got ",
                cfg.num_speculative_tokens);
  AAR_CHECK_ARG(cfg.dcp_world_size >= 1 && cfg.dcp_rank >= 0 && cfg.dcp_rank < cfg.dcp_world_size, "dcp_rank=",
                cfg.dcp_rank, " is not a rank of a DCP group of dcp_world_size=", cfg.dcp_world_size);
  AAR_CHECK_ARG(cfg.cp_kv_cache_interleave_size >= 1 && cfg.block_size % cfg.cp_kv_cache_interleave_size == 0,
                "cp_kv_cache_interleave_size=", cfg.cp_kv_cache_interleave_size,
                " must be positive and divide block_size=", cfg.block_size);
  AAR_CHECK_ARG(cfg.dsa_cp_world_size >= 1 && cfg.dsa_cp_rank >= 0 && cfg.dsa_cp_rank < cfg.dsa_cp_world_size,
                "dsa_cp_rank=", cfg.dsa_cp_rank, " is not a rank of a DSA-CP group of dsa_cp_world_size=",
                cfg.dsa_cp_world_size);
  if (cfg.dsa_cp_world_size > 1 && cfg.offload.has_value()) {
    throw_not_supported("dsa_cp_world_size=", cfg.dsa_cp_world_size, " with offload: the KV-offload builder has no "
                        "context-parallel variant (docs/design/sparse_cp.md §6)");
  }
  if (cfg.dsa_cp_world_size > 1 && cfg.dcp_world_size > 1 &&
      (cfg.dsa_cp_world_size != cfg.dcp_world_size || cfg.dsa_cp_rank != cfg.dcp_rank)) {
    // docs/design/sparse_cp.md §9: DCP rank r holds token slice r.
    throw_not_supported("dsa_cp_world_size=", cfg.dsa_cp_world_size, ", dsa_cp_rank=", cfg.dsa_cp_rank,
                        " with dcp_world_size=", cfg.dcp_world_size, ", dcp_rank=", cfg.dcp_rank,
                        ": DSA-CP x DCP needs the DCP group to be the DSA-CP group in the same order (equal sizes "
                        "and ranks, docs/design/sparse_cp.md §9)");
  }
  AAR_CHECK_ARG(cfg.pcp_world_size >= 1 && cfg.pcp_world_size <= 16 && cfg.pcp_rank >= 0 &&
                    cfg.pcp_rank < cfg.pcp_world_size,
                "pcp_rank=", cfg.pcp_rank, " is not a rank of a PCP group of pcp_world_size=", cfg.pcp_world_size,
                " (pcp_world_size in [1, 16])");
  AAR_CHECK_ARG(int64_t{cfg.pcp_world_size} * cfg.dcp_world_size <= 16, "pcp_world_size * dcp_world_size = ",
                int64_t{cfg.pcp_world_size} * cfg.dcp_world_size, " exceeds 16 (the main cache's shard spans at most "
                "16 ranks, docs/design/sparse_cp.md §11)");
  if (cfg.pcp_world_size > 1) {
    // docs/design/sparse_cp.md §11: what SFA PCP does not combine with.
    const char* no = cfg.dsa_cp_world_size > 1             ? "dsa_cp_world_size > 1 (SFA PCP x DSA-CP is not implemented)"
                     : cfg.offload.has_value()             ? "offload (the KV-offload builder has no context-parallel variant)"
                                                           : nullptr;
    if (no != nullptr) {
      throw_not_supported("pcp_world_size=", cfg.pcp_world_size, " with ", no, " (docs/design/sparse_cp.md §11)");
    }
  }
  if (cfg.dcp_world_size > 1 && cfg.offload.has_value()) {
    throw_not_supported("offload with dcp_world_size=", cfg.dcp_world_size,
                        ": the KV-offload builder has no context-parallel variant (upstream's neither)");
  }
  const int32_t drafts = cfg.num_drafts.value_or(cfg.num_speculative_tokens);
  AAR_CHECK_ARG(drafts >= 0 && drafts <= 15, "num_drafts must be in [0, 15], got ", drafts);
  AAR_CHECK_ARG(cfg.staging_buffers >= 1 && cfg.staging_buffers <= aar::detail::StagingBuffers::kMaxHostBuffers,
                "staging_buffers must be in [1, ", aar::detail::StagingBuffers::kMaxHostBuffers, "], got ",
                cfg.staging_buffers);
  // Validates the tables (errors name cos_table / sin_table) and keeps host copies.
  rope_ = std::make_unique<aar::detail::RopeRows>(cfg.cos_table, cfg.sin_table);
  cfg_.cos_table = rope_->cos_table();
  cfg_.sin_table = rope_->sin_table();
  cfg_.num_drafts = drafts;

  const bool separate = cfg.separate_device_buffers.value_or(!cfg.device.is_cpu());
  const int64_t R = cfg.max_num_reqs;
  for (int32_t lane = 0; lane <= drafts; ++lane) {
    const int slot_base = cfg.staging_hooks != nullptr ? lane * cfg.staging_buffers : 0;
    const int64_t cap = lane == 0 ? R : R * decode_threshold();
    lanes_.push_back(std::make_unique<Lane>(cfg_, *rope_, lane - 1, cap, separate, slot_base));
  }
  if (separate) {
    // The engine's table is its own (see block_table_staging()).
    staging_block_table_ = at::zeros({R, cfg.max_blocks_per_req}, at::TensorOptions().dtype(at::kInt));
  } else {
    staging_block_table_ = lanes_[0]->staged_rows(R);
  }
}

MetadataBuilder::~MetadataBuilder() = default;

const Metadata& MetadataBuilder::build(const BuildInputs& in) { return lanes_[0]->build(in); }

const Metadata& MetadataBuilder::build_for_graph_capture(const BuildInputs& in, plan::AttentionState state) {
  static const core::BackendFacts& facts = Backend::facts();
  core::check_capturable(facts, state);  // docs/design/sfa.md §3.2
  // Under PCP a step with prefills is refused by the plan before any write (docs/design/sparse_cp.md §11.1).
  if (cfg_.offload.has_value()) {
    // docs/design/sfa.md §6.6: only decode-only buckets are captured (a step with prefills reads the device
    // cache and runs eagerly). Checked on the request lengths before anything is written.
    const int32_t thr = decode_threshold();
    const size_t B = in.query_start_loc.empty() ? 0 : in.query_start_loc.size() - 1;
    for (size_t r = 0; r < B; ++r) {
      const int32_t q = in.query_start_loc[r + 1] - in.query_start_loc[r];
      const bool prefilling = r < in.is_prefilling.size() && in.is_prefilling[r] != 0;
      if (q > thr || prefilling) {
        throw_not_supported("build_for_graph_capture: request ", r, " (query length ", q,
                            prefilling ? ", still prefilling" : "", ") is a prefill, and the KV-offload builder "
                            "captures decode-only buckets only (docs/design/sfa.md §6.6: a step with prefills "
                            "reads the device cache and runs eagerly)");
      }
    }
  }
  Metadata& md = lanes_[0]->build(in, /*capture=*/true);
  md.attn_state = state;
  return md;
}

MetadataBuilder::Lane& MetadataBuilder::draft_lane(int32_t d) const {
  AAR_CHECK_ARG(d >= 0 && d < num_drafts(), "draft_index=", d, " is out of range [0, num_drafts=", num_drafts(),
                ")");
  return *lanes_[static_cast<size_t>(d) + 1];
}

const Metadata& MetadataBuilder::build_for_drafting(const BuildInputs& in, int32_t d) {
  // Under PCP a draft lane plans its batch like the main lane (docs/design/sparse_cp.md §11): a draft
  // step's decodes are replicated on every PCP rank, a prefill (if any) split into head/tail chunks.
  return draft_lane(d).build(in);
}

const Metadata& MetadataBuilder::metadata() const { return lanes_[0]->metadata(); }
const std::vector<int32_t>& MetadataBuilder::pcp_local_token_index() const { return lanes_[0]->pcp_token_index(); }
const Metadata& MetadataBuilder::draft_metadata(int32_t d) const { return draft_lane(d).metadata(); }
uint64_t MetadataBuilder::generation() const { return lanes_[0]->generation(); }
uint64_t MetadataBuilder::draft_generation(int32_t d) const { return draft_lane(d).generation(); }

static_assert(core::is_builder_v<MetadataBuilder>, "sfa::MetadataBuilder follows the builder contract");

const Metadata* IndexerMetadataBuilder::build_for_graph_capture(const BuildInputs&, plan::AttentionState state) const {
  static const core::BackendFacts& facts = Backend::facts();
  core::check_capturable(facts, state, "IndexerMetadataBuilder.build_for_graph_capture");
  return nullptr;
}

const Metadata* IndexerMetadataBuilder::build_for_drafting(const BuildInputs&, int32_t draft_index) const {
  core::check_draft_index(draft_index);
  return nullptr;
}

}  // namespace aar::sfa
