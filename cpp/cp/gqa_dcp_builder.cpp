// The GQA DCP metadata builder (decisions in cp/gqa_dcp.h): plan::build_dcp_step
// into its staging regions, the used part of each copied to the device, views out.
#include <ATen/ATen.h>

#include <algorithm>

#include "ascend_attn_rt/errors.h"
#include "ascend_attn_rt/gqa/backend.h"
#include "ascend_attn_rt/cp/gqa_dcp.h"
#include "ascend_attn_rt/cp/gqa_dcp_graph.h"
#include "ascend_attn_rt/cp/plan/dcp_step_plan.h"
#include "../common/staging.h"
#include "decode_rows_graph.h"
#include "../common/builder_checks.h"
#include "../core/staging_layout.h"

namespace aar::gqa {

// The staging buffer's regions and their views (core/staging_layout.h), made
// the first time a size is seen: a steady-state build creates no tensor, and
// the decode rows a graph captures keep their address.
struct DcpMetadataBuilder::Staging {
  core::Region slots, decode_bt, prefill_bt;
  core::RegionViews slots_dev, decode_bt_dev, prefill_bt_dev;
  core::ViewCache context_idx;  // views of ctx_idx_dev_, by row count
};

DcpMetadataBuilder::DcpMetadataBuilder(const DcpBuilderConfig& cfg)
    : cfg_(cfg), separate_(cfg.separate()), masks_(cfg.device) {
  internal::check_builder_sizes<Backend>(cfg);
  internal::check_num_speculative_tokens(cfg);
  const plan::DcpShard& s = cfg.shard;
  AAR_CHECK_ARG(s.world >= 1 && s.world <= 16, "dcp world size must be in [1, 16] (npu_attention_update merges at "
                "most 16 partials), got ", s.world);
  AAR_CHECK_ARG(s.rank >= 0 && s.rank < s.world, "dcp rank ", s.rank, " is out of range [0, ", s.world, ")");
  // docs/design/cp.md §1.1: I <= B and B % I == 0.
  AAR_CHECK_ARG(s.interleave >= 1 && s.interleave <= cfg.block_size && cfg.block_size % s.interleave == 0,
                "cp_kv_cache_interleave_size=", s.interleave, " must divide block_size=", cfg.block_size);
  const int64_t T = cfg.max_num_tokens, R = cfg.max_num_reqs, M = cfg.max_blocks_per_req;
  // Each region's used part is copied on its own (the decode rows are sized
  // for max_num_tokens rows: copying up to the last region would move
  // megabytes per step).
  core::StagingLayout layout;
  st_ = std::make_unique<Staging>();
  Staging& st = *st_;
  st.slots = layout.add("slot_mapping", T);
  st.decode_bt = layout.add("decode_block_table", T * M);
  st.prefill_bt = layout.add("prefill_block_table", R * M);
  buffers_ = std::make_unique<detail::StagingBuffers>(layout.words(), cfg.device, separate_, cfg.staging_buffers,
                                                      cfg.staging_hooks);
  const at::Tensor& dev = buffers_->device();
  st.slots_dev = core::RegionViews(dev, st.slots, T, at::kInt);
  st.decode_bt_dev = core::RegionViews(dev, st.decode_bt, T, at::kInt, M);
  st.prefill_bt_dev = core::RegionViews(dev, st.prefill_bt, R, at::kInt, M);
  st.context_idx.resize(T);
  ctx_idx_host_ = at::zeros({T}, at::TensorOptions().dtype(at::kLong));
  ctx_idx_dev_ = separate_ ? at::zeros({T}, at::TensorOptions().dtype(at::kLong).device(cfg.device)) : ctx_idx_host_;
  ctx_idx32_.assign(T, 0);
  dq_.assign(T, 0);
  dkv_.assign(T, 0);
  pq_.assign(R, 0);
  pctx_.assign(R, 0);
  draft_seq_.assign(R, 0);
  md_.shard = s;
  md_.block_size = cfg.block_size;
  md_.num_blocks = cfg.num_blocks;
  md_.causal = true;
  md_.attn_mask = masks_.attention_mask(/*causal=*/true, /*pooling=*/false);
}

DcpMetadataBuilder::~DcpMetadataBuilder() = default;

const DcpMetadata& DcpMetadataBuilder::build(const DcpBuildInputs& in) {
  core::check_step_fits(in, cfg_, cfg_.max_blocks_per_req);
  int32_t* s = buffers_->begin();
  const int64_t M = cfg_.max_blocks_per_req;
  Staging& st = *st_;

  // The step as given (build_dcp_step refuses the fields it does not read),
  // a draft step's lengths in place of its base lengths.
  plan::DcpStepInputs si;
  static_cast<core::StepInput&>(si) = in;
  si.seq_lens = plan::draft_step_seq_lens(in.query_start_loc, in.seq_lens, in.draft_step,
                                          plan::Span<int32_t>(draft_seq_.data(), draft_seq_.size()));
  si.block_size = cfg_.block_size;
  si.num_blocks = cfg_.num_blocks;
  si.decode_threshold = decode_threshold();
  si.pd_recompute_scheduler = cfg_.pd_recompute_scheduler || in.draft_step >= 0;  // a draft step: all decodes
  si.shard = cfg_.shard;
  plan::DcpStepBuffers bf;
  bf.slot_mapping = plan::Span<int32_t>(s + st.slots.offset, st.slots.words);
  bf.decode_block_table = plan::Span<int32_t>(s + st.decode_bt.offset, st.decode_bt.words);
  bf.decode_q_ends = plan::Span<int64_t>(dq_.data(), dq_.size());
  bf.decode_kv_lens = plan::Span<int64_t>(dkv_.data(), dkv_.size());
  bf.prefill_block_table = plan::Span<int32_t>(s + st.prefill_bt.offset, st.prefill_bt.words);
  bf.prefill_q_ends = plan::Span<int64_t>(pq_.data(), pq_.size());
  bf.prefill_context_lens = plan::Span<int64_t>(pctx_.data(), pctx_.size());
  bf.context_token_idx = plan::Span<int32_t>(ctx_idx32_.data(), ctx_idx32_.size());
  bf.out_stride = cfg_.max_blocks_per_req;
  const plan::DcpStepPlan p = plan::build_dcp_step(si, bf);

  const int32_t nd = p.split.num_decodes, np = p.split.num_prefills;
  const int32_t td = p.split.num_decode_tokens, tp = p.num_actual_tokens - td;
  const int32_t dk = p.decode_kernel_rows;
  buffers_->copy(st.slots.offset, p.num_input_tokens);
  buffers_->copy(st.decode_bt.offset, static_cast<int64_t>(dk) * M);
  buffers_->copy(st.prefill_bt.offset, static_cast<int64_t>(np) * M);
  buffers_->finish();
  int64_t* ci = ctx_idx_host_.data_ptr<int64_t>();
  std::copy(ctx_idx32_.begin(), ctx_idx32_.begin() + p.num_context_rows, ci);
  // Pageable host memory: a synchronous copy, so the host rows are free again at once.
  if (separate_ && p.num_context_rows > 0) {
    ctx_idx_dev_.narrow(0, 0, p.num_context_rows).copy_(ctx_idx_host_.narrow(0, 0, p.num_context_rows));
  }
  counter_.next(md_.stamp);

  md_.attn_state = plan::AttentionState::ChunkedPrefill;
  md_.num_reqs = p.num_reqs;
  // The padding decode rows of a graph bucket are the kernels' dummies.
  md_.num_kernel_reqs = p.num_reqs + (dk - td);
  md_.num_actual_tokens = p.num_actual_tokens;
  md_.num_input_tokens = p.num_input_tokens;
  md_.num_kernel_tokens = p.num_actual_tokens;
  md_.num_decodes = nd;
  md_.num_prefills = np;
  md_.num_decode_tokens = td;
  md_.num_prefill_tokens = tp;
  md_.max_query_len = p.max_query_len;
  md_.max_seq_len = p.max_seq_len;
  md_.slot_mapping = st.slots_dev.first(p.num_input_tokens);
  md_.no_context = !p.has_context && nd == 0;
  md_.prefill_no_context = !p.has_context;
  md_.decode_kernel_rows = dk;
  md_.decode_block_tables = st.decode_bt_dev.first(dk);
  md_.decode_q_ends = c10::IntArrayRef(dq_.data(), dk);
  md_.decode_kv_lens = c10::IntArrayRef(dkv_.data(), dk);
  md_.prefill_block_tables = st.prefill_bt_dev.first(np);
  md_.prefill_q_ends = c10::IntArrayRef(pq_.data(), np);
  md_.prefill_context_lens = c10::IntArrayRef(pctx_.data(), np);
  md_.has_context = p.has_context;
  md_.local_context_tokens = p.local_context_tokens;
  md_.context_token_idx =
      st.context_idx.get(p.num_context_rows, [&] { return ctx_idx_dev_.narrow(0, 0, p.num_context_rows); });
  md_.num_local_writes = p.num_local_writes;
  md_.draft_step = in.draft_step;  // -1 or [0, 16): draft_step_seq_lens refused anything else
  return md_;
}

const DcpMetadata& DcpMetadataBuilder::build_for_graph_capture(const DcpBuildInputs& in,
                                                               plan::AttentionState state) {
  static const core::BackendFacts& facts = DcpBackend::facts();
  core::check_capturable(facts, state);
  build(in);
  md_.attn_state = state;
  return md_;
}

const DcpMetadata& DcpMetadataBuilder::build_for_drafting(const DcpBuildInputs& in, int32_t draft_index) {
  core::check_draft_index(draft_index);
  AAR_CHECK_ARG(in.draft_step < 0 || in.draft_step == draft_index, "draft_step=", in.draft_step,
                " (a draft step over base lengths) differs from draft_index=", draft_index);
  return build(in);
}

static_assert(core::is_builder_v<DcpMetadataBuilder>, "gqa::DcpMetadataBuilder follows the builder contract");

}  // namespace aar::gqa

namespace aar::gqa {

graph::StepParams dcp_graph_step_params(const DcpMetadata& md) {
  return cp::decode_rows::step_params(md, "GQA DCP");
}

}  // namespace aar::gqa
