// The GQA DCP metadata builder (decisions in gqa/dcp.h): plan::build_dcp_step
// into the packed staging buffer, one copy to the device, views out.
#include <ATen/ATen.h>

#include <algorithm>

#include "ascend_attn_rt/errors.h"
#include "ascend_attn_rt/gqa/backend.h"
#include "ascend_attn_rt/gqa/dcp.h"
#include "ascend_attn_rt/gqa/dcp_graph.h"
#include "ascend_attn_rt/plan/dcp_step_plan.h"
#include "../common/staging.h"
#include "../common/builder_checks.h"

namespace aar::gqa {

DcpMetadataBuilder::DcpMetadataBuilder(const DcpBuilderConfig& cfg)
    : cfg_(cfg), separate_(cfg.separate_device_buffers.value_or(!cfg.device.is_cpu())), masks_(cfg.device) {
  internal::check_builder_sizes<Backend>(cfg);
  internal::check_num_speculative_tokens(cfg);
  const plan::DcpShard& s = cfg.shard;
  AAR_CHECK_ARG(s.world >= 1 && s.world <= 16, "dcp world size must be in [1, 16] (npu_attention_update merges at "
                "most 16 partials), got ", s.world);
  AAR_CHECK_ARG(s.rank >= 0 && s.rank < s.world, "dcp rank ", s.rank, " is out of range [0, ", s.world, ")");
  // Spec 1.1: I <= B and B % I == 0.
  AAR_CHECK_ARG(s.interleave >= 1 && s.interleave <= cfg.block_size && cfg.block_size % s.interleave == 0,
                "cp_kv_cache_interleave_size=", s.interleave, " must divide block_size=", cfg.block_size);
  const int64_t T = cfg.max_num_tokens, R = cfg.max_num_reqs, M = cfg.max_blocks_per_req;
  off_slot_ = 0;
  off_dbt_ = T;
  off_pbt_ = off_dbt_ + T * M;
  buffers_ = std::make_unique<detail::StagingBuffers>(off_pbt_ + R * M, cfg.device, separate_, cfg.staging_buffers,
                                                      cfg.staging_hooks);
  ctx_idx_host_ = at::zeros({T}, at::TensorOptions().dtype(at::kLong));
  ctx_idx_dev_ = separate_ ? at::zeros({T}, at::TensorOptions().dtype(at::kLong).device(cfg.device)) : ctx_idx_host_;
  ctx_idx32_.assign(T, 0);
  dq_.assign(T, 0);
  dkv_.assign(T, 0);
  pq_.assign(R, 0);
  pctx_.assign(R, 0);
  draft_seq_.assign(R, 0);
  md_.shard = s;
  md_.base.block_size = cfg.block_size;
  md_.base.num_blocks = cfg.num_blocks;
  md_.base.causal = true;
  md_.base.attn_mask = masks_.attention_mask(/*causal=*/true, /*pooling=*/false);
}

DcpMetadataBuilder::~DcpMetadataBuilder() = default;

const DcpMetadata& DcpMetadataBuilder::build(const DcpBuildInputs& in) {
  const size_t b = in.seq_lens.size();
  AAR_CHECK_ARG(b <= static_cast<size_t>(cfg_.max_num_reqs), "num_reqs=", b, " exceeds max_num_reqs=",
                cfg_.max_num_reqs);
  const int64_t tokens = in.num_input_tokens > 0 ? in.num_input_tokens
                                                 : (in.query_start_loc.empty() ? 0 : in.query_start_loc.back());
  AAR_CHECK_ARG(tokens <= cfg_.max_num_tokens, "num_tokens=", tokens, " exceeds max_num_tokens=", cfg_.max_num_tokens);
  AAR_CHECK_ARG(in.block_table_stride <= cfg_.max_blocks_per_req, "block_table has ", in.block_table_stride,
                " columns, more than max_blocks_per_req=", cfg_.max_blocks_per_req);
  int32_t* s = buffers_->begin();
  const int64_t T = cfg_.max_num_tokens, R = cfg_.max_num_reqs, M = cfg_.max_blocks_per_req;

  plan::DcpStepInputs si;
  si.query_start_loc = in.query_start_loc;
  si.seq_lens = plan::draft_step_seq_lens(in.query_start_loc, in.seq_lens, in.draft_step,
                                          plan::Span<int32_t>(draft_seq_.data(), draft_seq_.size()));
  si.block_table = in.block_table;
  si.block_table_stride = in.block_table_stride;
  si.block_size = cfg_.block_size;
  si.num_blocks = cfg_.num_blocks;
  si.num_input_tokens = in.num_input_tokens;
  si.decode_threshold = decode_threshold();
  si.is_prefilling = in.is_prefilling;
  si.pd_recompute_scheduler = cfg_.pd_recompute_scheduler || in.draft_step >= 0;  // a draft step: all decodes
  si.shard = cfg_.shard;
  plan::DcpStepBuffers bf;
  bf.slot_mapping = plan::Span<int32_t>(s + off_slot_, T);
  bf.decode_block_table = plan::Span<int32_t>(s + off_dbt_, T * M);
  bf.decode_q_ends = plan::Span<int64_t>(dq_.data(), dq_.size());
  bf.decode_kv_lens = plan::Span<int64_t>(dkv_.data(), dkv_.size());
  bf.prefill_block_table = plan::Span<int32_t>(s + off_pbt_, R * M);
  bf.prefill_q_ends = plan::Span<int64_t>(pq_.data(), pq_.size());
  bf.prefill_context_lens = plan::Span<int64_t>(pctx_.data(), pctx_.size());
  bf.context_token_idx = plan::Span<int32_t>(ctx_idx32_.data(), ctx_idx32_.size());
  bf.out_stride = cfg_.max_blocks_per_req;
  const plan::DcpStepPlan p = plan::build_dcp_step(si, bf);

  const int32_t nd = p.split.num_decodes, np = p.split.num_prefills;
  const int32_t td = p.split.num_decode_tokens, tp = p.num_actual_tokens - td;
  const int32_t dk = p.decode_kernel_rows;
  // The regions used, each copied once (the decode-row region is sized for
  // max_num_tokens rows: copying it whole would move megabytes per step).
  buffers_->copy(off_slot_, p.num_input_tokens);
  buffers_->copy(off_dbt_, static_cast<int64_t>(dk) * M);
  buffers_->copy(off_pbt_, static_cast<int64_t>(np) * M);
  buffers_->finish();
  int64_t* ci = ctx_idx_host_.data_ptr<int64_t>();
  std::copy(ctx_idx32_.begin(), ctx_idx32_.begin() + p.num_context_rows, ci);
  // Pageable host memory: a synchronous copy, so the host rows are free again at once.
  if (separate_ && p.num_context_rows > 0) {
    ctx_idx_dev_.narrow(0, 0, p.num_context_rows).copy_(ctx_idx_host_.narrow(0, 0, p.num_context_rows));
  }
  counter_.next(md_.base.stamp);
  const at::Tensor& dev = buffers_->device();

  Metadata& m = md_.base;
  m.attn_state = plan::AttentionState::ChunkedPrefill;
  m.num_reqs = m.num_kernel_reqs = p.num_reqs;
  m.num_actual_tokens = p.num_actual_tokens;
  m.num_input_tokens = p.num_input_tokens;
  m.num_kernel_tokens = p.num_actual_tokens;
  m.num_decodes = nd;
  m.num_prefills = np;
  m.num_decode_tokens = td;
  m.max_query_len = p.max_query_len;
  m.max_seq_len = p.max_seq_len;
  m.slot_mapping = dev.narrow(0, off_slot_, p.num_input_tokens);
  m.no_context = !p.has_context && nd == 0;
  m.prefill_no_context = !p.has_context;
  md_.num_prefill_tokens = tp;
  md_.decode_kernel_rows = dk;
  md_.decode_block_tables = dev.narrow(0, off_dbt_, static_cast<int64_t>(dk) * M).view({dk, M});
  md_.decode_q_ends = c10::IntArrayRef(dq_.data(), dk);
  md_.decode_kv_lens = c10::IntArrayRef(dkv_.data(), dk);
  md_.prefill_block_tables = dev.narrow(0, off_pbt_, static_cast<int64_t>(np) * M).view({np, M});
  md_.prefill_q_ends = c10::IntArrayRef(pq_.data(), np);
  md_.prefill_context_lens = c10::IntArrayRef(pctx_.data(), np);
  md_.has_context = p.has_context;
  md_.local_context_tokens = p.local_context_tokens;
  md_.context_token_idx = ctx_idx_dev_.narrow(0, 0, p.num_context_rows);
  md_.num_local_writes = p.num_local_writes;
  md_.draft_step = in.draft_step;  // -1 or [0, 16): draft_step_seq_lens refused anything else
  return md_;
}

}  // namespace aar::gqa

namespace aar::gqa {

graph::StepParams dcp_graph_step_params(const DcpMetadata& md) {
  graph::StepParams sp;
  sp.block_tables = md.decode_block_tables;
  sp.q_ends = md.decode_q_ends;
  sp.kv_lens = md.decode_kv_lens;
  sp.num_reqs = md.decode_kernel_rows;  // one kernel "request" per decode row
  sp.num_real_reqs = md.base.num_decodes;
  sp.num_kernel_tokens = md.decode_kernel_rows;
  sp.num_input_tokens = md.base.num_input_tokens;
  sp.stamp = md.base.stamp;
  return sp;
}

}  // namespace aar::gqa
