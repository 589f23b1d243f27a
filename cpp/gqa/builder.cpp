#include "ascend_attn_rt/gqa/builder.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <array>
#include <utility>

#include "ascend_attn_rt/errors.h"
#include "ascend_attn_rt/gqa/backend.h"
#include "ascend_attn_rt/graph/graph_params.h"
#include "ascend_attn_rt/gqa/plan/step_plan.h"
#include "../common/staging.h"
#include "../common/builder_checks.h"
#include "../core/staging_layout.h"

namespace aar::gqa {

// The staging buffer's regions and their views (core/staging_layout.h): views
// are made the first time a size is seen and reused, so a steady-state build
// creates no tensor.
struct MetadataBuilder::Staging {
  core::Region qsl, seq, slots, bt;
  core::RegionViews qsl_dev, seq_dev, bt_dev, slots_dev;
  std::array<core::RegionViews, detail::StagingBuffers::kMaxHostBuffers> seq_host;  // per host buffer
};

MetadataBuilder::MetadataBuilder(const BuilderConfig& cfg)
    : cfg_(cfg), separate_(cfg.separate_device_buffers.value_or(!cfg.device.is_cpu())), masks_(cfg.device) {
  internal::check_builder_sizes<Backend>(cfg);
  internal::check_num_speculative_tokens(cfg);

  // Requests the kernels may see: the real ones plus one padding dummy, or, with
  // uniform decode padding, up to one dummy per padding token.
  const int64_t R = cfg.uniform_decode_padding
                        ? std::max<int64_t>(cfg.max_num_reqs + 1, cfg.max_num_tokens)
                        : cfg.max_num_reqs + 1;
  const int64_t MB = cfg.max_blocks_per_req;
  cap_reqs_ = R;
  // Fixed regions, the block table last: a build copies [0, the last used row).
  core::StagingLayout layout;
  st_ = std::make_unique<Staging>();
  Staging& st = *st_;
  st.qsl = layout.add("query_start_loc", R + 1);
  st.seq = layout.add("seq_lens", R);
  st.slots = layout.add("slot_mapping", cfg.max_num_tokens);
  st.bt = layout.add("block_table", R * MB);
  buffers_ = std::make_unique<detail::StagingBuffers>(layout.words(), cfg.device, separate_, cfg.staging_buffers,
                                                      cfg.staging_hooks);
  const at::Tensor& device = buffers_->device();
  st.qsl_dev = core::RegionViews(device, st.qsl, R + 1, at::kInt);
  st.seq_dev = core::RegionViews(device, st.seq, R, at::kInt);
  st.bt_dev = core::RegionViews(device, st.bt, R, at::kInt, MB);
  st.slots_dev = core::RegionViews(device, st.slots, cfg.max_num_tokens, at::kInt);
  for (int i = 0; i < buffers_->num_host(); ++i) st.seq_host[i] = core::RegionViews(buffers_->host(i), st.seq, R, at::kInt);
  if (separate_) {
    // The engine's table is its own: builds copy its rows into the staging
    // buffer of their turn, so it is free to rewrite once build() returns.
    staging_block_table_ = at::zeros({R, MB}, at::TensorOptions().dtype(at::kInt));
  } else {
    staging_block_table_ = buffers_->host(0).narrow(0, st.bt.offset, R * MB).view({R, MB});
  }
  q_ends_.assign(R, 0);
  kv_lens_.assign(R, 0);
  prefill_q_ends_.assign(R, 0);
  if (cfg.dense_context.value_or(true)) {
    dense_kv_ends_.assign(R, 0);
    dense_prefill_kv_ends_.assign(R, 0);
  }

  md_.block_size = cfg.block_size;
  md_.num_blocks = cfg.num_blocks;
  md_.is_pooling = cfg.pooling;
  // Built once; every causal build hands out the same device tensor.
  causal_mask_ = masks_.attention_mask(/*causal=*/true, cfg.pooling);
}

MetadataBuilder::~MetadataBuilder() = default;

const Metadata& MetadataBuilder::build(const BuildInputs& in) {
  // The host buffer of this build's turn, once its last copy has completed.
  int32_t* s = buffers_->begin();
  const int host = buffers_->active();
  const int64_t R = cap_reqs_;

  core::check_step_fits(in, cfg_, cfg_.max_blocks_per_req);
  core::refuse_unread(in, core::kReqIds, "the GQA builder (it keeps no per-request state)");

  plan::StepInputs si;
  static_cast<core::StepInput&>(si) = in;
  si.block_size = cfg_.block_size;
  si.num_blocks = cfg_.num_blocks;
  si.decode_threshold = decode_threshold();
  si.treat_short_extends_as_decodes = true;
  si.spec_method = cfg_.spec_method;
  si.chunked_prefill_enabled = cfg_.chunked_prefill_enabled;
  si.pad_fia_batch = cfg_.pad_fia_batch;
  si.uniform_decode_len = cfg_.uniform_decode_padding ? decode_threshold() : 0;

  plan::StepBuffers buf;
  Staging& st = *st_;
  buf.query_start_loc = plan::Span<int32_t>(s + st.qsl.offset, R + 1);
  buf.seq_lens = plan::Span<int32_t>(s + st.seq.offset, R);
  buf.slot_mapping = plan::Span<int32_t>(s + st.slots.offset, cfg_.max_num_tokens);
  buf.block_table = plan::Span<int32_t>(s + st.bt.offset, R * cfg_.max_blocks_per_req);
  buf.block_table_stride = cfg_.max_blocks_per_req;
  buf.q_ends = plan::Span<int64_t>(q_ends_.data(), q_ends_.size());
  buf.kv_lens = plan::Span<int64_t>(kv_lens_.data(), kv_lens_.size());

  // Everything that can fail is checked in here, before its first write.
  const plan::StepPlan p = plan::build_step(si, buf);
  const int32_t B = p.fia.num_reqs;

  // One host-to-device copy (device path): the packed prefix up to the last
  // used block-table row; then the turn passes to the next host buffer.
  buffers_->copy(0, st.bt.offset + static_cast<int64_t>(B) * cfg_.max_blocks_per_req);
  buffers_->finish();
  counter_.next(md_.stamp);

  md_.attn_state = p.state;
  md_.num_reqs = p.num_reqs;
  md_.num_kernel_reqs = B;
  md_.num_actual_tokens = p.num_actual_tokens;
  md_.num_input_tokens = p.num_input_tokens;
  md_.num_kernel_tokens = p.fia.num_tokens;
  md_.num_decodes = p.split.num_decodes;
  md_.num_prefills = p.split.num_prefills;
  md_.num_decode_tokens = p.split.num_decode_tokens;
  md_.num_prefill_tokens = p.num_actual_tokens - p.split.num_decode_tokens;
  md_.max_query_len = p.max_query_len;
  md_.max_seq_len = p.max_seq_len;
  md_.causal = in.causal;
  md_.query_start_loc = st.qsl_dev.first(B + 1);
  md_.seq_lens = st.seq_host[host].first(B);
  md_.block_tables = st.bt_dev.first(B);
  md_.slot_mapping = st.slots_dev.first(p.num_input_tokens);
  if (in.causal) {
    md_.attn_mask = causal_mask_;
  } else {
    md_.attn_mask.reset();
  }
  md_.actual_seq_lengths_q = c10::IntArrayRef(q_ends_.data(), B);
  md_.seq_lens_list = c10::IntArrayRef(kv_lens_.data(), B);

  // The prefill part's own query ends (split paths), and which parts have
  // cached context: once per build, so forward does no host work.
  const int32_t nd = p.split.num_decodes, ndt = p.split.num_decode_tokens;
  const int32_t np_fia = std::max(B - nd, 0);
  for (int32_t i = 0; i < np_fia; ++i) prefill_q_ends_[i] = q_ends_[nd + i] - ndt;
  md_.prefill_actual_seq_lengths_q = c10::IntArrayRef(prefill_q_ends_.data(), np_fia);
  md_.no_context = p.context_end == 0;
  md_.prefill_no_context = p.context_end <= nd;
  md_.dense = DenseContext{};
  md_.dense_source = cfg_.dense_context.has_value() ? nullptr : this;
  if (cfg_.dense_context.value_or(false)) build_dense_context(nd, ndt);
  return md_;
}

const DenseContext& MetadataBuilder::dense_context_of(const Metadata& md) {
  AAR_CHECK_ARG(md.stamp.generation == md_.stamp.generation && md.stamp.live == md_.stamp.live, "the metadata is stale: its builder has built again since (generation ",
                md_.stamp.generation, "), so its dense context can no longer be computed");
  if (!md_.dense.valid) {
    graph::refuse_if_capturing(
        "computing the dense context on demand (construct the MetadataBuilder with dense_context=True to capture "
        "a step whose layers read it)");
    build_dense_context(md_.num_decodes, md_.num_decode_tokens);
  }
  return md_.dense;
}

const DenseContext* MetadataBuilder::computed_dense_context_of(const Metadata& md) const {
  const bool same_build = md.stamp.generation == md_.stamp.generation && md.stamp.live == md_.stamp.live;
  return same_build && md_.dense.valid ? &md_.dense : nullptr;
}

const DenseContext* computed_dense_context(const Metadata& md) {
  if (md.dense.valid) return &md.dense;
  return md.dense_source != nullptr ? md.dense_source->computed_dense_context_of(md) : nullptr;
}

const DenseContext& dense_context(const Metadata& md) {
  if (md.dense.valid) return md.dense;
  AAR_CHECK_ARG(md.dense_source != nullptr, "this layer reads the builder's dense context (the paged context as "
                "dense rows), but the MetadataBuilder was constructed with dense_context=False: construct it with "
                "dense_context=True or leave the option unset (computed on demand)");
  return md.dense_source->dense_context_of(md);
}

void MetadataBuilder::build_dense_context(int32_t nd, int32_t ndt) {
  // Host: cumulative KV lengths (all kernel requests, and the prefill part's).
  const int32_t B = md_.num_kernel_reqs;
  int64_t total = 0;
  for (int32_t r = 0; r < B; ++r) dense_kv_ends_[r] = (total += kv_lens_[r]);
  const int64_t start = nd > 0 ? dense_kv_ends_[nd - 1] : 0;
  for (int32_t r = nd; r < B; ++r) dense_prefill_kv_ends_[r - nd] = dense_kv_ends_[r] - start;
  DenseContext& d = md_.dense;
  d.valid = true;
  d.kv_ends = c10::IntArrayRef(dense_kv_ends_.data(), B);
  d.prefill_kv_ends = c10::IntArrayRef(dense_prefill_kv_ends_.data(), std::max(B - nd, 0));
  d.prefill_kv_start = start;
  // Device: every KV position's slot and every real token's row, from the
  // metadata's device tensors (no host loop over positions, no sync).
  const at::Tensor kv_lens =
      st_->seq_dev.first(B).to(at::kLong);  // int32 -> int64 (a new tensor)
  const auto lopts = at::TensorOptions().dtype(at::kLong).device(cfg_.device);
  // Index of the segment (request) of every position 0..n-1 given the
  // segments' cumulative ends: the number of ends <= position (scatter-add +
  // cumsum: no sync, and every step has a meta kernel).
  auto segment_of = [&](const at::Tensor& seg_ends, int64_t n) {
    at::Tensor marks = at::zeros({n + 1}, lopts);
    marks.scatter_add_(0, seg_ends, at::ones_like(seg_ends));
    return marks.narrow(0, 0, n).cumsum(0);
  };
  const at::Tensor ends = kv_lens.cumsum(0);
  const at::Tensor starts = ends - kv_lens;
  const at::Tensor pos = at::arange(total, lopts);
  const at::Tensor req = segment_of(ends, total);
  // 1-D gathers (at::gather: a structured kernel, so meta tensors work too).
  const at::Tensor j = pos - at::gather(starts, 0, req);
  const int64_t bs = cfg_.block_size, mb = cfg_.max_blocks_per_req;
  const at::Tensor blk = at::gather(md_.block_tables.reshape({-1}), 0, req * mb + j.div(bs, "floor"));
  d.slots = blk.to(at::kLong) * bs + j.remainder(bs);
  const int64_t nt = md_.num_actual_tokens;
  const at::Tensor qs = md_.query_start_loc.to(at::kLong);
  const at::Tensor tok = at::arange(nt, lopts);
  // Tokens past the real requests (a padding dummy) are not rows of anything:
  // the segments are the real requests' query ends.
  const int32_t nr = md_.num_reqs;
  const at::Tensor treq = segment_of(qs.narrow(0, 1, nr), nt);
  const at::Tensor ctx = kv_lens - (qs.narrow(0, 1, B) - qs.narrow(0, 0, B));  // cached tokens per request
  d.token_rows = at::gather(starts + ctx, 0, treq) + tok - at::gather(qs, 0, treq);
  d.prefill_token_rows = d.token_rows.narrow(0, ndt, nt - ndt) - start;
}

const Metadata& MetadataBuilder::build_for_graph_capture(const BuildInputs& in, plan::AttentionState state) {
  static const core::BackendFacts& facts = Backend::facts();
  core::check_capturable(facts, state);
  build(in);
  md_.attn_state = state;
  return md_;
}

const Metadata& MetadataBuilder::build_for_drafting(const BuildInputs& in, int32_t draft_index) {
  core::check_draft_index(draft_index);
  return build(in);
}

static_assert(core::is_builder_v<MetadataBuilder>, "gqa::MetadataBuilder follows the builder contract");

}  // namespace aar::gqa
