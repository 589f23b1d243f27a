// MLA metadata builder (docs/design/mla.md §3).
#include "ascend_attn_rt/mla/builder.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <utility>
#include <cstring>

#include "ascend_attn_rt/errors.h"
#include "ascend_attn_rt/mla/backend.h"
#include "ascend_attn_rt/cp/plan/cp_groups.h"
#include "ascend_attn_rt/cp/plan/dcp_step_plan.h"
#include "ascend_attn_rt/mla/plan/mla_pcp_plan.h"
#include "ascend_attn_rt/mla/plan/mla_plan.h"
#include "ascend_attn_rt/plan/workspace.h"
#include "../common/rope_gather.h"
#include "latent_ops.h"
#include "../common/staging.h"
#include "../common/builder_checks.h"
#include "../core/staging_layout.h"

namespace aar::mla {

namespace {
constexpr int64_t kMaskSize = 2048;
constexpr int64_t kChunks = plan::kMaxContextChunks;

// A draft step's inputs (BuildInputs::draft_step): the given ones with the
// step's lengths base + d + 1 written into `lens` (plan::draft_step_seq_lens
// checks the step's shape first).
const BuildInputs& mla_draft_inputs(const BuildInputs& given, std::vector<int32_t>& lens, BuildInputs& out) {
  out = given;
  out.seq_lens = plan::draft_step_seq_lens(given.query_start_loc, given.seq_lens, given.draft_step,
                                           plan::Span<int32_t>(lens.data(), lens.size()));
  return out;
}

}  // namespace

// The staging buffer's regions (core/staging_layout.h) and their views, made
// the first time a size is seen and reused: a steady-state build creates no
// tensor.
struct MetadataBuilder::Staging {
  core::Region qsl, slots, dcos, dsin, bt, cu, starts, clens, plens, pbt, pcos, psin, dtbt, pcp;
  // PCP: this step's lists, packed at the end of the `pcp` region (StagingLayout::pack_before).
  int64_t o_pslots = 0, o_restore = 0, o_qh = 0, o_qt = 0, o_hn = 0, o_hm = 0, o_tn = 0, o_tm = 0, o_qf = 0;
  core::RegionViews qsl_dev;                // by num_reqs: (n + 1)
  core::RegionViews slots_dev;              // int64, by num_input_tokens
  core::RegionViews decode_bt, prefill_bt;  // by decode kernel requests / num_prefills: (n, max_blocks)
  core::RegionViews token_bt;               // DCP per-token decode rows: (n, max_blocks)
  // RoPE rows in the tables' dtype, by decode kernel tokens / num_prefill_tokens: (n, R)
  core::ViewCache dcos_v, dsin_v, pcos_v, psin_v;
  // Context chunks, by (num_chunks - 1) * (max_num_reqs + 1) + num_prefills
  core::ViewCache cu_v, starts_v, clens_v, plens_v;
  // PCP: the packed lists' views, by length and keyed by their offset (which moves
  // with the other lists' sizes): a decode-only step (every prefill list empty)
  // or a repeated shape makes no tensor.
  core::ViewCache pslots_v, restore_v, qh_v, qt_v, hn_v, hm_v, tn_v, tm_v, qf_v;
};

MetadataBuilder::MetadataBuilder(const BuilderConfig& cfg)
    : cfg_(cfg), separate_(cfg.separate_device_buffers.value_or(!cfg.device.is_cpu())) {
  internal::check_builder_sizes<Backend>(cfg);
  internal::check_num_speculative_tokens(cfg);
  AAR_CHECK_ARG(cfg.dcp_world_size >= 1 && cfg.dcp_rank >= 0 && cfg.dcp_rank < cfg.dcp_world_size, "dcp_rank=",
                cfg.dcp_rank, " is not a rank of a DCP group of dcp_world_size=", cfg.dcp_world_size);
  AAR_CHECK_ARG(cfg.cp_kv_cache_interleave_size >= 1 && cfg.block_size % cfg.cp_kv_cache_interleave_size == 0,
                "cp_kv_cache_interleave_size=", cfg.cp_kv_cache_interleave_size,
                " must be positive and divide block_size=", cfg.block_size, " (docs/design/cp.md §1.1)");
  AAR_CHECK_ARG(cfg.pcp_world_size >= 1 && cfg.pcp_rank >= 0 && cfg.pcp_rank < cfg.pcp_world_size, "pcp_rank=",
                cfg.pcp_rank, " is not a rank of a PCP group of pcp_world_size=", cfg.pcp_world_size);
  const bool pcp = cfg.pcp_world_size > 1;
  if (pcp) {
    // docs/design/cp.md §11: decodes (speculative ones too, one decode row per token) are
    // replicated on every PCP rank; only a decode-only step is padded and captured.
    if (cfg.disable_padded_drafter_batch) {
      throw_not_supported("disable_padded_drafter_batch with pcp_world_size=", cfg.pcp_world_size,
                          ": the interpolated (unpadded) drafter batch is not planned under PCP, whose decode "
                          "rows are replicated per rank and strided by pcp_size (docs/design/cp.md §11)");
    }
    AAR_CHECK_ARG(int64_t{cfg.pcp_world_size} * cfg.dcp_world_size <= plan::kMaxCpMergePartitions,
                  "pcp_world_size * dcp_world_size = ", int64_t{cfg.pcp_world_size} * cfg.dcp_world_size,
                  " exceeds the ", plan::kMaxCpMergePartitions, " partials npu_attention_update merges");
  }
  kv_world_ = cfg.pcp_world_size * cfg.dcp_world_size;
  kv_rank_ = cfg.pcp_rank * cfg.dcp_world_size + cfg.dcp_rank;
  // Validates the tables (errors name cos_table / sin_table) and keeps host copies.
  rope_ = std::make_unique<aar::detail::RopeRows>(cfg.cos_table, cfg.sin_table);
  AAR_CHECK_ARG(cfg.max_model_len >= 0, "max_model_len must be >= 0 (0: max_blocks_per_req x block_size), got ",
                cfg.max_model_len);
  AAR_CHECK_ARG(cfg.workspace_tokens >= 0, "workspace_tokens must be >= 0 (0: derived from max_model_len), got ",
                cfg.workspace_tokens);
  const int64_t max_model_len =
      cfg.max_model_len > 0 ? cfg.max_model_len : int64_t{cfg.max_blocks_per_req} * cfg.block_size;
  workspace_ = cfg.workspace_tokens > 0
                   ? cfg.workspace_tokens
                   : plan::chunked_prefill_workspace_size(max_model_len, cfg.max_num_reqs, cfg.block_size);

  const int64_t R = cfg.max_num_reqs, T = cfg.max_num_tokens, MB = cfg.max_blocks_per_req;
  // A decode has at most decode_threshold tokens: the decode RoPE regions are
  // sized for that, not for max_num_tokens.
  const int64_t TD = std::min<int64_t>(T, R * decode_threshold());
  const int64_t W = rope_->row_words();  // int32 words per RoPE row
  // PCP: a rank's rows (its prefills' 2 c_i <= q_i + 1 each) and the lists' bounds
  // (padded-global rows Wp * TL, chunk tokens sum c_i <= TL / 2).
  const int64_t TL = pcp ? T + R : T;
  const int64_t Wp = cfg.pcp_world_size, G = Wp * TL, Cc = TL / 2 + 1;
  constexpr int64_t kPcpLists = 9;
  const int64_t pcp_words = pcp ? 3 * G + (6 + 3 * Wp) * Cc + (kPcpLists + 1) * core::kStagingAlignWords : 0;
  // A sharded KV (DCP, PCP or both) with speculative decode: one decode row per token
  // (plan/mla_plan.h).
  const bool token_rows = kv_world_ > 1 && cfg.num_speculative_tokens > 0;
  // The regions a decode-only step uses come first (one copy up to its last
  // block-table row); a step with prefills copies up to its last prefill
  // block-table row, then its prefill RoPE rows.
  core::StagingLayout layout;
  st_ = std::make_unique<Staging>();
  Staging& st = *st_;
  st.qsl = layout.add("query_start_loc", R + 1);
  st.slots = layout.add("slot_mapping", 2 * TL);  // int64
  st.dcos = layout.add("decode_cos", TD * W);
  st.dsin = layout.add("decode_sin", TD * W);
  st.bt = layout.add("block_table", R * MB);
  st.cu = layout.add("chunk_cu_seq_lens", kChunks * (R + 1));
  st.starts = layout.add("chunk_starts", kChunks * R);
  st.clens = layout.add("chunk_seq_lens", kChunks * R);
  st.plens = layout.add("chunk_padded_seq_lens", kChunks * R);
  st.pbt = layout.add("prefill_block_table", R * MB);
  st.pcos = layout.add("prefill_cos", TL * W);
  st.psin = layout.add("prefill_sin", TL * W);
  st.dtbt = layout.add("dcp_decode_block_table", token_rows ? TD * MB : 0);
  st.pcp = layout.add("pcp_lists", pcp_words);

  buffers_ = std::make_unique<aar::detail::StagingBuffers>(layout.words(), cfg.device, separate_, cfg.staging_buffers,
                                                      cfg.staging_hooks);
  device_ = buffers_->device();
  if (separate_) {
    // The engine's table is its own (see block_table_staging()).
    staging_block_table_ = at::zeros({R, MB}, at::TensorOptions().dtype(at::kInt));
  } else {
    staging_block_table_ = buffers_->host(0).narrow(0, st.bt.offset, R * MB).view({R, MB});
  }
  // Padding slots stay -1 until a build overwrites them.
  device_.narrow(0, st.slots.offset, st.slots.words).view(at::kLong).fill_(-1);
  for (int i = 0; separate_ && i < buffers_->num_host(); ++i) {
    buffers_->host(i).narrow(0, st.slots.offset, st.slots.words).view(at::kLong).fill_(-1);
  }
  st.qsl_dev = core::RegionViews(device_, st.qsl, R + 1, at::kInt);
  st.slots_dev = core::RegionViews(device_, st.slots, TL, at::kLong);
  st.decode_bt = core::RegionViews(device_, st.bt, R, at::kInt, MB);
  st.prefill_bt = core::RegionViews(device_, st.pbt, R, at::kInt, MB);
  if (token_rows) st.token_bt = core::RegionViews(device_, st.dtbt, TD, at::kInt, MB);
  for (core::ViewCache* c : {&st.dcos_v, &st.dsin_v}) c->resize(TD);
  for (core::ViewCache* c : {&st.pcos_v, &st.psin_v}) c->resize(TL);
  for (core::ViewCache* c : {&st.cu_v, &st.starts_v, &st.clens_v, &st.plens_v}) c->resize(kChunks * (R + 1) - 1);
  if (pcp) {
    // Length bounds: G padded-global rows; the rank's prefill rows Wp * tpl <= G;
    // chunk tokens sum c_i < Cc; head no-mask keys pcp_rank * sum c_i, tail
    // no-mask keys (2 Wp - 1 - pcp_rank) * sum c_i.
    const int64_t rp = cfg.pcp_rank;
    for (core::ViewCache* c : {&st.pslots_v, &st.restore_v}) c->resize(G);
    for (core::ViewCache* c : {&st.qh_v, &st.qt_v, &st.hm_v, &st.tm_v}) c->resize(Cc);
    st.qf_v.resize(2 * Cc);
    st.hn_v.resize(rp * Cc);
    st.tn_v.resize((2 * Wp - 1 - rp) * Cc);
  }

  // The RoPE rows are gathered on the host, so the tables live there.
  cfg_.cos_table = rope_->cos_table();
  cfg_.sin_table = rope_->sin_table();
  decode_positions_.assign(TD, 0);
  prefill_positions_.assign(TL, 0);

  q_ends_.assign(R + 1, 0);
  kv_lens_.assign(R + 1, 0);
  prefill_q_ends_.assign(R, 0);
  chunk_kv_ends_.assign(kChunks * R, 0);
  seq_tot_.assign(kChunks, 0);
  max_seq_.assign(kChunks, 0);
  if (kv_world_ > 1) {
    local_seq_tot_.assign(kChunks, 0);
    reorg_offsets_.assign(kChunks + 1, 0);
    dcp_block_lens_.assign(R, 0);
    dcp_is_prefilling_.assign(R, 0);
  }
  draft_seq_.assign(R, 0);
  if (token_rows) {
    dcp_q_ends_.assign(TD, 0);
    dcp_kv_lens_.assign(TD, 0);
  }

  md_.block_size = cfg.block_size;
  md_.num_blocks = cfg.num_blocks;
  md_.speculative = cfg.num_speculative_tokens > 0;
  md_.dcp = DcpInfo{cfg.dcp_world_size, cfg.dcp_rank, cfg.cp_kv_cache_interleave_size};
  md_.pcp.world_size = cfg.pcp_world_size;
  md_.pcp.rank = cfg.pcp_rank;
  if (pcp) {
    pcp_global_slots_.assign(T, 0);
    pcp_global_positions_.assign(T, 0);
    pcp_global_q_ends_.assign(R, 0);
    pcp_query_lens_.assign(R, 0);
    pcp_local_lens_.assign(R, 0);
    pcp_positions_.assign(TL, 0);
    pcp_token_rows_.assign(T + G, 0);
    pcp_restore_inverse_.assign(G, 0);
    pcp_token_index_.reserve(TL);
    pcp_mask_ends_.assign(R, 0);
    pcp_head_ends_.assign(R, 0);
    pcp_tail_ends_.assign(R, 0);
  }
  md_.attn_mask = at::triu(at::ones({kMaskSize, kMaskSize}, at::TensorOptions().device(cfg.device).dtype(at::kChar)), 1);
  md_.prefill.chunked.kv_ends.reserve(kChunks);
}

MetadataBuilder::~MetadataBuilder() = default;

at::Tensor MetadataBuilder::rope_view(int64_t offset, int64_t rows) const { return rope_->view(device_, offset, rows); }

void MetadataBuilder::gather_rope(uint8_t* s, const BuildInputs& in, int32_t num_decodes, int32_t td, int32_t tp) {
  if (td > 0) rope_->gather(decode_positions_.data(), td, s + st_->dcos.offset * 4, s + st_->dsin.offset * 4);
  if (tp > 0 && cfg_.pcp_world_size > 1) {
    // PCP: the rank's head and tail chunks (and their pads), two runs per request.
    rope_->gather(prefill_positions_.data(), tp, s + st_->pcos.offset * 4, s + st_->psin.offset * 4);
  } else if (tp > 0) {
    // A prefill's tokens have consecutive positions (seq_len - query_len ..
    // seq_len - 1): one copy per request and table.
    const size_t rb = static_cast<size_t>(rope_->row_bytes());
    uint8_t* out_cos = s + st_->pcos.offset * 4;
    uint8_t* out_sin = s + st_->psin.offset * 4;
    const int32_t* qsl = in.query_start_loc.data();
    const int32_t* seq = in.seq_lens.data();
    const int32_t base = qsl[num_decodes];
    const size_t b = in.seq_lens.size();
    for (size_t r = static_cast<size_t>(num_decodes); r < b; ++r) {
      const int32_t q = qsl[r + 1] - qsl[r];
      const size_t dst = static_cast<size_t>(qsl[r] - base) * rb;
      rope_->copy_run(seq[r] - q, q, out_cos + dst, out_sin + dst);
    }
  }
}

const Metadata& MetadataBuilder::build(const BuildInputs& given) {
  // The host buffer of this build's turn, once its last copies have completed.
  int32_t* s = buffers_->begin();
  const int64_t R = cfg_.max_num_reqs, T = cfg_.max_num_tokens, MB = cfg_.max_blocks_per_req;
  const size_t num_reqs = given.seq_lens.size();
  // Before the draft step's lengths are written into draft_seq_ (max_num_reqs entries).
  core::check_step_fits(given, cfg_, cfg_.max_blocks_per_req);
  core::refuse_unread(given, core::kReqIds, "the MLA builder (it keeps no per-request state)");
  BuildInputs drafted;
  const BuildInputs& in = given.draft_step == -1 ? given : mla_draft_inputs(given, draft_seq_, drafted);

  plan::MlaStepInputs mi;
  static_cast<core::StepInput&>(mi) = in;
  mi.block_size = cfg_.block_size;
  mi.num_blocks = cfg_.num_blocks;
  mi.decode_threshold = decode_threshold();
  mi.spec_method = cfg_.num_speculative_tokens > 0 ? plan::SpecMethod::Mtp : plan::SpecMethod::None;
  mi.chunked_prefill_enabled = cfg_.chunked_prefill_enabled;
  mi.rope_positions = rope_->positions();
  mi.workspace_tokens = workspace_;
  mi.pad_decode_batch = cfg_.graph_decode_padding;
  mi.pad_interpolated = cfg_.disable_padded_drafter_batch;
  // The KV shard: the DCP group's, or with PCP the Wp * Wd ranks' (docs/design/cp.md §11).
  const bool sharded = kv_world_ > 1;
  const bool pcp = cfg_.pcp_world_size > 1;
  mi.dcp = plan::DcpShard{kv_world_, kv_rank_, cfg_.cp_kv_cache_interleave_size};
  if (pcp) {
    // Only a decode-only step is padded to a graph bucket (graph_decode_padding); a step with
    // prefills is eager (docs/design/cp.md §11.4).
    const int32_t total = in.query_start_loc.empty() ? 0 : in.query_start_loc.back();
    AAR_CHECK_ARG(cfg_.graph_decode_padding || in.num_input_tokens == 0 || in.num_input_tokens == total,
                  "num_input_tokens=", in.num_input_tokens,
                  ": a PCP build without graph_decode_padding pads no step; give 0 or query_start_loc[-1]=", total);
    mi.pad_only_decode_buckets = true;
  }
  mi.pd_recompute_scheduler = cfg_.pd_recompute_scheduler || in.draft_step >= 0;  // a draft step: all decodes
  if (sharded) {
    AAR_CHECK_ARG(in.is_prefilling.empty() || in.is_prefilling.size() == num_reqs, "is_prefilling has ",
                  in.is_prefilling.size(), " entries, expected num_reqs=", num_reqs);
    // The reorg rows of the context chunks: at most the total context of the
    // batch (grown once to the largest batch seen; the plan checks the room).
    int64_t ctx = 0;
    const size_t n = std::min(num_reqs, in.query_start_loc.empty() ? size_t{0} : in.query_start_loc.size() - 1);
    for (size_t r = 0; r < n; ++r) {
      ctx += std::max<int64_t>(0, int64_t{in.seq_lens[r]} - (in.query_start_loc[r + 1] - in.query_start_loc[r]));
    }
    if (static_cast<int64_t>(reorg_index_.size()) < ctx) reorg_index_.resize(static_cast<size_t>(ctx));
  }

  Staging& st = *st_;
  plan::MlaStepBuffers buf;
  buf.query_start_loc = plan::Span<int32_t>(s + st.qsl.offset, R + 1);
  buf.block_table = plan::Span<int32_t>(s + st.bt.offset, R * MB);
  buf.block_table_stride = static_cast<int32_t>(MB);
  buf.q_ends = plan::Span<int64_t>(q_ends_.data(), q_ends_.size());
  buf.kv_lens = plan::Span<int64_t>(kv_lens_.data(), kv_lens_.size());
  buf.slot_mapping = plan::Span<int64_t>(reinterpret_cast<int64_t*>(s + st.slots.offset), T);
  buf.decode_positions = plan::Span<int32_t>(decode_positions_.data(), decode_positions_.size());
  buf.prefill_positions = plan::Span<int32_t>(prefill_positions_.data(), prefill_positions_.size());
  buf.prefill_block_table = plan::Span<int32_t>(s + st.pbt.offset, R * MB);
  buf.prefill_q_ends = plan::Span<int64_t>(prefill_q_ends_.data(), prefill_q_ends_.size());
  if (pcp) {
    // The global step's per-token plan goes to host scratch; plan_pcp_rows writes the rank's rows.
    buf.slot_mapping = plan::Span<int64_t>(pcp_global_slots_.data(), pcp_global_slots_.size());
    buf.prefill_positions = plan::Span<int32_t>(pcp_global_positions_.data(), pcp_global_positions_.size());
    buf.prefill_q_ends = plan::Span<int64_t>(pcp_global_q_ends_.data(), pcp_global_q_ends_.size());
  }
  buf.chunks.cu_seq_lens = plan::Span<int32_t>(s + st.cu.offset, kChunks * (R + 1));
  buf.chunks.starts = plan::Span<int32_t>(s + st.starts.offset, kChunks * R);
  buf.chunks.chunk_seq_lens = plan::Span<int32_t>(s + st.clens.offset, kChunks * R);
  buf.chunks.kv_ends = plan::Span<int64_t>(chunk_kv_ends_.data(), chunk_kv_ends_.size());
  buf.chunks.seq_tot = plan::Span<int64_t>(seq_tot_.data(), seq_tot_.size());
  buf.chunks.max_seq_lens = plan::Span<int64_t>(max_seq_.data(), max_seq_.size());
  if (sharded) {
    buf.chunks.padded_chunk_seq_lens = plan::Span<int32_t>(s + st.plens.offset, kChunks * R);
    buf.chunks.local_seq_tot = plan::Span<int64_t>(local_seq_tot_.data(), local_seq_tot_.size());
    buf.chunks.reorg_index = plan::Span<int64_t>(reorg_index_.data(), reorg_index_.size());
    buf.chunks.reorg_offsets = plan::Span<int64_t>(reorg_offsets_.data(), reorg_offsets_.size());
    buf.dcp_block_lens = plan::Span<int32_t>(dcp_block_lens_.data(), dcp_block_lens_.size());
    buf.dcp_is_prefilling = plan::Span<uint8_t>(dcp_is_prefilling_.data(), dcp_is_prefilling_.size());
    if (!dcp_q_ends_.empty()) {
      buf.dcp_decode_block_table = plan::Span<int32_t>(s + st.dtbt.offset, st.dtbt.words);
      buf.dcp_decode_q_ends = plan::Span<int64_t>(dcp_q_ends_.data(), dcp_q_ends_.size());
      buf.dcp_decode_kv_lens = plan::Span<int64_t>(dcp_kv_lens_.data(), dcp_kv_lens_.size());
    }
  }

  // Everything that can fail happens in here, before its first write.
  const plan::MlaStepPlan p = plan::plan_mla_step(mi, buf);
  const int32_t B = p.num_reqs, nd = p.split.num_decodes, np = p.split.num_prefills;
  const int32_t td = p.split.num_decode_tokens, tp = p.split.num_prefill_tokens;
  const int32_t T_in = p.num_input_tokens;
  const int64_t C = p.chunks.num_chunks;
  // PCP: the rank's rows (local slots, prefill positions and query ends, the lists); the
  // global plan above validated the step, and every capacity holds by the construction bounds.
  plan::MlaPcpSizes pcp_sizes;
  int64_t pcp_first = st.pcp.end();
  if (pcp) {
    pcp_first = plan_pcp_rows(s, in, nd, p.num_actual_tokens, pcp_sizes);
    // A decode-only step padded to a graph bucket: the dummy decode rows follow the real ones
    // (slot -1, no global token), replicated like them.
    const int32_t tk_pad = p.decode_kernel_tokens;
    if (np == 0 && nd > 0 && tk_pad > pcp_sizes.split.local_tokens) {
      auto* slots = reinterpret_cast<int64_t*>(s + st.slots.offset);
      std::fill(slots + pcp_sizes.split.local_tokens, slots + tk_pad, int64_t{-1});
      pcp_token_index_.resize(static_cast<size_t>(tk_pad), -1);
      pcp_sizes.split.local_tokens = tk_pad;
    }
  }
  const int32_t tl = pcp ? pcp_sizes.split.local_tokens : T_in;      // the slot mapping's rows
  const int32_t tpl = pcp ? pcp_sizes.split.local_prefill_tokens : tp;  // the prefill rows

  // The decode kernels' view: with graph decode padding, the padded bucket.
  const int32_t nk = p.decode_kernel_reqs, tk = p.decode_kernel_tokens;
  gather_rope(reinterpret_cast<uint8_t*>(s), in, nd, tk, tpl);
  // Host-to-device copies of what the step uses (device path): a decode-only
  // step is one copy of the packed prefix up to its last block-table row; a
  // step with prefills copies the prefix up to its last prefill block-table
  // row, then its prefill cos and sin rows (the regions between are sized for
  // max_num_tokens and mostly unused). Then the turn passes on.
  if (np == 0) {
    buffers_->copy(0, st.bt.offset + static_cast<int64_t>(std::max(B, nk)) * MB);
  } else {
    const int64_t words = static_cast<int64_t>(tpl) * rope_->row_words();
    buffers_->copy(0, st.pbt.offset + static_cast<int64_t>(np) * MB);
    buffers_->copy(st.pcos.offset, words);
    buffers_->copy(st.psin.offset, words);
  }
  if (p.dcp_token_rows) buffers_->copy(st.dtbt.offset, static_cast<int64_t>(nk) * MB);
  if (pcp) buffers_->copy(pcp_first, st.pcp.end() - pcp_first);
  buffers_->finish();
  counter_.next(md_.stamp);

  md_.attn_state = p.state;
  md_.draft_step = in.draft_step;
  md_.num_reqs = B;
  md_.num_kernel_reqs = p.num_kernel_reqs;
  md_.num_actual_tokens = p.num_actual_tokens;
  md_.num_input_tokens = T_in;
  md_.num_decodes = nd;
  md_.num_prefills = np;
  md_.num_decode_tokens = td;
  md_.num_prefill_tokens = tp;
  md_.max_query_len = p.max_query_len;
  md_.max_seq_len = p.max_seq_len;
  detail::assign(md_.query_start_loc, st.qsl_dev.first(B + 1));
  detail::assign(md_.slot_mapping, st.slots_dev.first(tl));
  if (nd > 0) {
    DecodeMetadata& d = md_.decode;
    d.num_kernel_reqs = nk;
    d.num_kernel_tokens = tk;
    if (p.dcp_token_rows) {
      d.block_table = st.token_bt.first(nk);
      d.seq_lens_list = c10::IntArrayRef(dcp_kv_lens_.data(), nk);
      d.actual_seq_lengths_q = c10::IntArrayRef(dcp_q_ends_.data(), nk);
    } else {
      d.block_table = st.decode_bt.first(nk);
      d.seq_lens_list = c10::IntArrayRef(kv_lens_.data(), nk);
      d.actual_seq_lengths_q = c10::IntArrayRef(q_ends_.data(), nk);
    }
    d.cos = st.dcos_v.get(tk, [&] { return rope_view(st.dcos.offset, tk); });
    d.sin = st.dsin_v.get(tk, [&] { return rope_view(st.dsin.offset, tk); });
    d.max_seq_len = p.decode_max_seq_len;
  } else {
    md_.decode = DecodeMetadata{};
  }
  PrefillMetadata& pf = md_.prefill;
  ChunkedContext& cc = pf.chunked;
  if (np > 0) {
    pf.block_table = st.prefill_bt.first(np);
    pf.actual_seq_lengths_q = c10::IntArrayRef(prefill_q_ends_.data(), np);
    pf.cos = st.pcos_v.get(tpl, [&] { return rope_view(st.pcos.offset, tpl); });
    pf.sin = st.psin_v.get(tpl, [&] { return rope_view(st.psin.offset, tpl); });
    pf.max_query_len = pcp ? pcp_sizes.prefill_max_query_len : p.prefill_max_query_len;
    pf.max_seq_len = p.prefill_max_seq_len;
  } else {
    pf.block_table.reset();
    pf.actual_seq_lengths_q = {};
    pf.cos.reset();
    pf.sin.reset();
    pf.max_query_len = 0;
    pf.max_seq_len = 0;
  }
  cc.num_chunks = p.chunks.num_chunks;
  cc.chunk_size = p.chunks.chunk_size;
  cc.kv_ends.clear();  // keeps its capacity (kChunks)
  if (np > 0 && C > 0) {
    const int64_t key = (C - 1) * (R + 1) + np;
    const auto chunk_rows = [&](const core::Region& r, int64_t cols) {
      return device_.narrow(0, r.offset, C * cols).view({C, cols});
    };
    cc.cu_seq_lens = st.cu_v.get(key, [&] { return chunk_rows(st.cu, np + 1); });
    cc.starts = st.starts_v.get(key, [&] { return chunk_rows(st.starts, np); });
    cc.chunk_seq_lens = st.clens_v.get(key, [&] { return chunk_rows(st.clens, np); });
    cc.seq_tot = c10::IntArrayRef(seq_tot_.data(), C);
    cc.max_seq_lens = c10::IntArrayRef(max_seq_.data(), C);
    for (int64_t c = 0; c < C; ++c) cc.kv_ends.emplace_back(chunk_kv_ends_.data() + c * np, np);
    if (sharded) {
      cc.local_chunk_size = p.local_chunk_size;
      cc.padded_chunk_seq_lens = st.plens_v.get(key, [&] { return chunk_rows(st.plens, np); });
      cc.local_seq_tot = c10::IntArrayRef(local_seq_tot_.data(), C);
      cc.reorg_offsets = c10::IntArrayRef(reorg_offsets_.data(), C + 1);
      // A tensor over the host rows (CPU), or a synchronous copy of them (the
      // device path: the host vector is rewritten by the next build). Only steps
      // with prefill context under DCP pay it.
      const int64_t rows = reorg_offsets_[C];
      at::Tensor host = at::from_blob(reorg_index_.data(), {rows}, at::TensorOptions().dtype(at::kLong));
      reorg_device_ = separate_ || !cfg_.device.is_cpu() ? host.to(cfg_.device) : host;
      cc.reorg_index = reorg_device_;
    }
  } else {
    cc.num_chunks = 0;
    cc.chunk_size = 0;
    cc.cu_seq_lens.reset();
    cc.starts.reset();
    cc.chunk_seq_lens.reset();
    cc.seq_tot = {};
    cc.max_seq_lens = {};
  }
  if (pcp) set_pcp_metadata(pcp_sizes);
  if (!(np > 0 && C > 0 && sharded)) {
    cc.local_chunk_size = 0;
    cc.padded_chunk_seq_lens.reset();
    cc.local_seq_tot = {};
    cc.reorg_index.reset();
    cc.reorg_offsets = {};
  }
  return md_;
}

const Metadata& MetadataBuilder::build_for_graph_capture(const BuildInputs& in, plan::AttentionState state) {
  static const core::BackendFacts& facts = Backend::facts();
  core::check_capturable(facts, state);
  if (cfg_.pcp_world_size > 1 && !cfg_.graph_decode_padding) {
    throw_not_supported("build_for_graph_capture with pcp_world_size=", cfg_.pcp_world_size,
                        " without graph_decode_padding: MLA PCP captures decode-only buckets only "
                        "(docs/design/cp.md §11.4)");
  }
  build(in);
  md_.attn_state = state;
  return md_;
}

const Metadata& MetadataBuilder::build_for_drafting(const BuildInputs& in, int32_t draft_index) {
  core::check_draft_index(draft_index);
  return build(in);
}

static_assert(core::is_builder_v<MetadataBuilder>, "mla::MetadataBuilder follows the builder contract");

int64_t MetadataBuilder::plan_pcp_rows(int32_t* s, const BuildInputs& in, int32_t nd, int32_t num_tokens,
                                       plan::MlaPcpSizes& sizes) {
  Staging& st = *st_;
  const size_t n = in.seq_lens.size();
  plan::MlaPcpInputs pi;
  pi.query_start_loc = in.query_start_loc;
  pi.seq_lens = in.seq_lens;
  pi.num_decodes = nd;
  pi.pcp_size = cfg_.pcp_world_size;
  pi.pcp_rank = cfg_.pcp_rank;
  pi.token_slots = plan::CSpan<int64_t>(pcp_global_slots_.data(), static_cast<size_t>(num_tokens));
  const plan::MlaPcpSizes sz = plan::mla_pcp_sizes(pi, plan::Span<int32_t>(pcp_query_lens_.data(), n));
  const int64_t G = sz.split.padded_global_tokens, tpl = sz.split.local_prefill_tokens;
  const int64_t Wp = cfg_.pcp_world_size, Ck = sz.head_tail.chunk_tokens;
  // The step's lists packed at the end of their region (the padded slots as int64: 2 words).
  const int64_t first = core::StagingLayout::pack_before(
      st.pcp.end(), {{&st.o_pslots, 2 * G}, {&st.o_restore, Wp * tpl}, {&st.o_qh, Ck}, {&st.o_qt, Ck},
                     {&st.o_hn, sz.head_tail.head_nomask_tokens}, {&st.o_hm, Ck},
                     {&st.o_tn, sz.head_tail.tail_nomask_tokens}, {&st.o_tm, Ck}, {&st.o_qf, 2 * Ck}});
  // Holds by the bounds the region was sized with (a rank's rows are at most max_num_tokens +
  // max_num_reqs); checked before anything is written.
  AAR_CHECK_ARG(first >= st.pcp.offset, "the PCP lists of this step need ", st.pcp.end() - first,
                " staging words, more than the builder's ", st.pcp.words);
  plan::MlaPcpBuffers b;
  b.slot_mapping = plan::Span<int64_t>(reinterpret_cast<int64_t*>(s + st.slots.offset), st.slots.words / 2);
  b.prefill_positions = plan::Span<int32_t>(prefill_positions_.data(), prefill_positions_.size());
  b.prefill_q_ends = plan::Span<int64_t>(prefill_q_ends_.data(), prefill_q_ends_.size());
  b.padded_slot_mapping = plan::Span<int64_t>(reinterpret_cast<int64_t*>(s + st.o_pslots), G);
  b.prefill_restore_idx = plan::Span<int32_t>(s + st.o_restore, Wp * tpl);
  b.head_tail.q_head_idx = plan::Span<int32_t>(s + st.o_qh, Ck);
  b.head_tail.q_tail_idx = plan::Span<int32_t>(s + st.o_qt, Ck);
  b.head_tail.kv_head_nomask_idx = plan::Span<int32_t>(s + st.o_hn, sz.head_tail.head_nomask_tokens);
  b.head_tail.kv_head_mask_idx = plan::Span<int32_t>(s + st.o_hm, Ck);
  b.head_tail.kv_tail_nomask_idx = plan::Span<int32_t>(s + st.o_tn, sz.head_tail.tail_nomask_tokens);
  b.head_tail.kv_tail_mask_idx = plan::Span<int32_t>(s + st.o_tm, Ck);
  b.head_tail.q_full_idx = plan::Span<int32_t>(s + st.o_qf, 2 * Ck);
  b.head_tail.mask_seq_ends = plan::Span<int64_t>(pcp_mask_ends_.data(), pcp_mask_ends_.size());
  b.head_tail.head_nomask_kv_ends = plan::Span<int64_t>(pcp_head_ends_.data(), pcp_head_ends_.size());
  b.head_tail.tail_nomask_kv_ends = plan::Span<int64_t>(pcp_tail_ends_.data(), pcp_tail_ends_.size());
  pcp_token_index_.resize(static_cast<size_t>(sz.split.local_tokens));
  b.local_token_index = plan::Span<int32_t>(pcp_token_index_.data(), pcp_token_index_.size());
  b.query_lens = plan::Span<int32_t>(pcp_query_lens_.data(), pcp_query_lens_.size());
  b.local_lens = plan::Span<int32_t>(pcp_local_lens_.data(), pcp_local_lens_.size());
  b.positions = plan::Span<int32_t>(pcp_positions_.data(), pcp_positions_.size());
  b.token_rows = plan::Span<int32_t>(pcp_token_rows_.data(), pcp_token_rows_.size());
  b.restore_inverse = plan::Span<int32_t>(pcp_restore_inverse_.data(), pcp_restore_inverse_.size());
  sizes = plan::plan_mla_pcp_rows(pi, sz, b);  // sz: this step's mla_pcp_sizes (computed once)
  return first;
}

void MetadataBuilder::set_pcp_metadata(const plan::MlaPcpSizes& sz) {
  Staging& st = *st_;
  PcpInfo& pc = md_.pcp;
  const int64_t Wp = cfg_.pcp_world_size, G = sz.split.padded_global_tokens;
  const int64_t tpl = sz.split.local_prefill_tokens, Ck = sz.head_tail.chunk_tokens;
  const int64_t np = sz.head_tail.num_prefills;
  auto i32 = [&](core::ViewCache& vc, int64_t o, int64_t len) -> const at::Tensor& {
    return vc.get(len, o, [&] { return device_.narrow(0, o, len); });
  };
  pc.num_local_tokens = sz.split.local_tokens;
  pc.num_local_prefill_tokens = sz.split.local_prefill_tokens;
  // Assigned only when the view changed (detail::assign): a steady step keeps its views.
  detail::assign(pc.padded_slot_mapping, st.pslots_v.get(G, st.o_pslots, [&] {
    return device_.narrow(0, st.o_pslots, 2 * G).view(at::kLong);
  }));
  detail::assign(pc.prefill_restore_idx, i32(st.restore_v, st.o_restore, Wp * tpl));
  detail::assign(pc.q_head_idx, i32(st.qh_v, st.o_qh, Ck));
  detail::assign(pc.q_tail_idx, i32(st.qt_v, st.o_qt, Ck));
  detail::assign(pc.kv_head_nomask_idx, i32(st.hn_v, st.o_hn, sz.head_tail.head_nomask_tokens));
  detail::assign(pc.kv_head_mask_idx, i32(st.hm_v, st.o_hm, Ck));
  detail::assign(pc.kv_tail_nomask_idx, i32(st.tn_v, st.o_tn, sz.head_tail.tail_nomask_tokens));
  detail::assign(pc.kv_tail_mask_idx, i32(st.tm_v, st.o_tm, Ck));
  detail::assign(pc.q_full_idx, i32(st.qf_v, st.o_qf, 2 * Ck));
  pc.mask_seq_ends = c10::IntArrayRef(pcp_mask_ends_.data(), np);
  pc.head_nomask_kv_ends = c10::IntArrayRef(pcp_head_ends_.data(), np);
  pc.tail_nomask_kv_ends = c10::IntArrayRef(pcp_tail_ends_.data(), np);
  pc.chunk_tokens = sz.head_tail.chunk_tokens;
  pc.head_nomask_tokens = sz.head_tail.head_nomask_tokens;
  pc.tail_nomask_tokens = sz.head_tail.tail_nomask_tokens;
}

}  // namespace aar::mla
