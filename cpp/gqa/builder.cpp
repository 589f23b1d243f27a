#include "ascend_attn_rt/gqa/builder.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <utility>

#include "ascend_attn_rt/errors.h"
#include "ascend_attn_rt/gqa/backend.h"
#include "ascend_attn_rt/plan/step_plan.h"
#include "../common/staging.h"

namespace aar::gqa {

// Views of the persistent buffers, created the first time a size is seen and
// reused afterwards: a steady-state build creates no tensor.
struct MetadataBuilder::Views {
  std::vector<at::Tensor> qsl;          // by num_reqs: device (n+1)
  std::vector<at::Tensor> seq_lens;     // by num_reqs: host (n)
  std::vector<at::Tensor> block_table;  // by num_reqs: device (n, max_blocks)
  std::vector<at::Tensor> slots;        // by num_input_tokens: device (n)
};

namespace {

at::Tensor lazy_view(std::vector<at::Tensor>& cache, size_t n, const at::Tensor& base, int64_t offset,
                     int64_t len, int64_t cols = 0) {
  at::Tensor& v = cache[n];
  if (!v.defined()) {
    v = base.narrow(0, offset, len * (cols > 0 ? cols : 1));
    if (cols > 0) v = v.view({len, cols});
  }
  return v;
}

}  // namespace

MetadataBuilder::MetadataBuilder(const BuilderConfig& cfg)
    : cfg_(cfg), separate_(cfg.separate_device_buffers.value_or(!cfg.device.is_cpu())), masks_(cfg.device) {
  AAR_CHECK_ARG(cfg.max_num_reqs > 0, "max_num_reqs must be positive, got ", cfg.max_num_reqs);
  AAR_CHECK_ARG(cfg.max_num_tokens > 0, "max_num_tokens must be positive, got ", cfg.max_num_tokens);
  AAR_CHECK_ARG(cfg.max_blocks_per_req > 0, "max_blocks_per_req must be positive, got ", cfg.max_blocks_per_req);
  AAR_CHECK_ARG(Backend::is_supported_block_size(cfg.block_size), "block_size ", cfg.block_size,
                " is not supported (supported: 16, 32, 64, 128)");
  AAR_CHECK_ARG(cfg.num_blocks > 0, "num_blocks must be positive, got ", cfg.num_blocks);
  AAR_CHECK_ARG(cfg.num_speculative_tokens >= 0 && cfg.num_speculative_tokens <= 15,
                "num_speculative_tokens must be in [0, 15] (decode threshold 1 + n <= 16, the FIA TND limit), got ",
                cfg.num_speculative_tokens);

  // Requests the kernels may see: the real ones plus one padding dummy, or, with
  // uniform decode padding, up to one dummy per padding token.
  const int64_t R = cfg.uniform_decode_padding
                        ? std::max<int64_t>(cfg.max_num_reqs + 1, cfg.max_num_tokens)
                        : cfg.max_num_reqs + 1;
  cap_reqs_ = R;
  off_qsl_ = 0;
  off_seq_ = off_qsl_ + R + 1;
  off_slot_ = off_seq_ + R;
  off_bt_ = off_slot_ + cfg.max_num_tokens;
  const int64_t total = off_bt_ + R * static_cast<int64_t>(cfg.max_blocks_per_req);

  detail::StagingPair buffers = detail::make_staging_pair(total, cfg.device, separate_);
  staging_ = std::move(buffers.staging);
  device_ = std::move(buffers.device);
  staging_block_table_ = staging_.narrow(0, off_bt_, R * cfg.max_blocks_per_req).view({R, cfg.max_blocks_per_req});
  q_ends_.assign(R, 0);
  kv_lens_.assign(R, 0);

  views_ = std::make_unique<Views>();
  views_->qsl.resize(R + 1);
  views_->seq_lens.resize(R + 1);
  views_->block_table.resize(R + 1);
  views_->slots.resize(cfg.max_num_tokens + 1);

  md_.block_size = cfg.block_size;
  md_.num_blocks = cfg.num_blocks;
  md_.is_pooling = cfg.pooling;
  // Built once; every causal build hands out the same device tensor.
  causal_mask_ = masks_.attention_mask(/*causal=*/true, cfg.pooling);
}

MetadataBuilder::~MetadataBuilder() = default;

const Metadata& MetadataBuilder::build(const BuildInputs& in) {
  int32_t* s = staging_.data_ptr<int32_t>();
  const int64_t R = cap_reqs_;

  const size_t num_reqs = in.seq_lens.size();
  AAR_CHECK_ARG(num_reqs <= static_cast<size_t>(cfg_.max_num_reqs), "num_reqs=", num_reqs,
                " (seq_lens entries) exceeds the builder's max_num_reqs=", cfg_.max_num_reqs);
  const int64_t tokens = in.num_input_tokens > 0 ? in.num_input_tokens
                                                 : (in.query_start_loc.empty() ? 0 : in.query_start_loc.back());
  AAR_CHECK_ARG(tokens <= cfg_.max_num_tokens, "num_tokens=", tokens,
                " (query_start_loc[-1] or num_input_tokens) exceeds the builder's max_num_tokens=",
                cfg_.max_num_tokens);
  AAR_CHECK_ARG(in.block_table_stride <= cfg_.max_blocks_per_req, "block_table has ", in.block_table_stride,
                " columns, more than the builder's max_blocks_per_req=", cfg_.max_blocks_per_req);

  plan::StepInputs si;
  si.query_start_loc = in.query_start_loc;
  si.seq_lens = in.seq_lens;
  si.block_table = in.block_table;
  si.block_table_stride = in.block_table_stride;
  si.block_size = cfg_.block_size;
  si.num_blocks = cfg_.num_blocks;
  si.num_input_tokens = in.num_input_tokens;
  si.decode_threshold = decode_threshold();
  si.treat_short_extends_as_decodes = true;
  si.is_prefilling = in.is_prefilling;
  si.has_state = in.attn_state.has_value();
  if (si.has_state) si.state = *in.attn_state;
  si.num_spec_tokens = in.num_spec_tokens;
  si.spec_method = cfg_.spec_method;
  si.chunked_prefill_enabled = cfg_.chunked_prefill_enabled;
  si.pad_fia_batch = cfg_.pad_fia_batch;
  si.uniform_decode_len = cfg_.uniform_decode_padding ? decode_threshold() : 0;

  plan::StepBuffers buf;
  buf.query_start_loc = plan::Span<int32_t>(s + off_qsl_, R + 1);
  buf.seq_lens = plan::Span<int32_t>(s + off_seq_, R);
  buf.slot_mapping = plan::Span<int32_t>(s + off_slot_, cfg_.max_num_tokens);
  buf.block_table = plan::Span<int32_t>(s + off_bt_, R * cfg_.max_blocks_per_req);
  buf.block_table_stride = cfg_.max_blocks_per_req;
  buf.q_ends = plan::Span<int64_t>(q_ends_.data(), q_ends_.size());
  buf.kv_lens = plan::Span<int64_t>(kv_lens_.data(), kv_lens_.size());

  const plan::StepPlan p = plan::build_step(si, buf);
  const int32_t B = p.fia.num_reqs;

  if (separate_) {
    // One host-to-device copy: the packed prefix up to the last used block-table row.
    const int64_t used = off_bt_ + static_cast<int64_t>(B) * cfg_.max_blocks_per_req;
    device_.narrow(0, 0, used).copy_(staging_.narrow(0, 0, used), /*non_blocking=*/true);
  }

  md_.attn_state = p.state;
  md_.num_reqs = B;
  md_.num_real_reqs = p.num_reqs;
  md_.num_actual_tokens = p.num_actual_tokens;
  md_.num_input_tokens = p.num_input_tokens;
  md_.num_kernel_tokens = p.fia.num_tokens;
  md_.num_decodes = p.split.num_decodes;
  md_.num_prefills = p.split.num_prefills;
  md_.num_decode_tokens = p.split.num_decode_tokens;
  md_.max_query_len = p.max_query_len;
  md_.max_seq_len = p.max_seq_len;
  md_.causal = in.causal;
  md_.query_start_loc = lazy_view(views_->qsl, B, device_, off_qsl_, B + 1);
  md_.seq_lens = lazy_view(views_->seq_lens, B, staging_, off_seq_, B);
  md_.block_tables = lazy_view(views_->block_table, B, device_, off_bt_, B, cfg_.max_blocks_per_req);
  md_.slot_mapping = lazy_view(views_->slots, p.num_input_tokens, device_, off_slot_, p.num_input_tokens);
  if (in.causal) {
    md_.attn_mask = causal_mask_;
  } else {
    md_.attn_mask.reset();
  }
  md_.actual_seq_lengths_q = c10::IntArrayRef(q_ends_.data(), B);
  md_.seq_lens_list = c10::IntArrayRef(kv_lens_.data(), B);
  return md_;
}

const Metadata& MetadataBuilder::build_for_graph_capture(const BuildInputs& in, plan::AttentionState state) {
  if (state != plan::AttentionState::DecodeOnly && state != plan::AttentionState::ChunkedPrefill &&
      state != plan::AttentionState::SpecDecoding) {
    throw_not_supported("build_for_graph_capture: attention state ", plan::to_string(state),
                        " cannot be captured (only DecodeOnly, ChunkedPrefill and SpecDecoding)");
  }
  build(in);
  md_.attn_state = state;
  return md_;
}

}  // namespace aar::gqa
