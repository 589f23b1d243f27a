// MLA metadata builder (spec mla.md section 3).
#include "ascend_attn_rt/mla/builder.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "ascend_attn_rt/errors.h"
#include "ascend_attn_rt/mla/backend.h"
#include "ascend_attn_rt/plan/mla_plan.h"
#include "ascend_attn_rt/plan/step_plan.h"
#include "ascend_attn_rt/plan/workspace.h"

namespace aar::mla {

namespace {
constexpr int64_t kMaskSize = 2048;
constexpr int64_t kChunks = plan::kMaxContextChunks;
}  // namespace

MetadataBuilder::MetadataBuilder(const BuilderConfig& cfg) : cfg_(cfg) {
  AAR_CHECK_ARG(cfg.max_num_reqs > 0, "max_num_reqs must be positive, got ", cfg.max_num_reqs);
  AAR_CHECK_ARG(cfg.max_num_tokens > 0, "max_num_tokens must be positive, got ", cfg.max_num_tokens);
  AAR_CHECK_ARG(cfg.max_blocks_per_req > 0, "max_blocks_per_req must be positive, got ", cfg.max_blocks_per_req);
  AAR_CHECK_ARG(Backend::is_supported_block_size(cfg.block_size), "block_size ", cfg.block_size,
                " is not supported (supported: 16, 32, 64, 128)");
  AAR_CHECK_ARG(cfg.num_blocks > 0, "num_blocks must be positive, got ", cfg.num_blocks);
  AAR_CHECK_ARG(cfg.num_speculative_tokens >= 0 && cfg.num_speculative_tokens <= 15,
                "num_speculative_tokens must be in [0, 15] (decode threshold 1 + n <= 16, the FIA TND limit), got ",
                cfg.num_speculative_tokens);
  for (const at::Tensor* t : {&cfg.cos_table, &cfg.sin_table}) {
    const char* name = t == &cfg.cos_table ? "cos_table" : "sin_table";
    AAR_CHECK_ARG(t->defined() && t->dim() == 2 && t->size(1) % 2 == 0, name,
                  " must be a (max_position, qk_rope_head_dim) tensor, got ",
                  t->defined() ? t->sizes() : c10::IntArrayRef{});
  }
  AAR_CHECK_ARG(cfg.cos_table.sizes() == cfg.sin_table.sizes(), "cos_table ", cfg.cos_table.sizes(),
                " and sin_table ", cfg.sin_table.sizes(), " must have the same shape");
  const int64_t max_model_len =
      cfg.max_model_len > 0 ? cfg.max_model_len : int64_t{cfg.max_blocks_per_req} * cfg.block_size;
  workspace_ = cfg.workspace_tokens > 0
                   ? cfg.workspace_tokens
                   : plan::chunked_prefill_workspace_size(max_model_len, cfg.max_num_reqs, cfg.block_size);

  const int64_t R = cfg.max_num_reqs, T = cfg.max_num_tokens, MB = cfg.max_blocks_per_req;
  off_qsl_ = 0;
  off_seq_ = off_qsl_ + R + 2;
  off_slot_ = off_seq_ + R + 1;
  off_pos_ = off_slot_ + T;
  off_cu_ = off_pos_ + T;
  off_starts_ = off_cu_ + kChunks * (R + 1);
  off_clens_ = off_starts_ + kChunks * R;
  off_bt_ = off_clens_ + kChunks * R;
  total_ = off_bt_ + (R + 1) * MB;
  auto host = at::TensorOptions().dtype(at::kInt).device(at::kCPU);
  staging_ = at::zeros({total_}, host);
  device_ = cfg.device.is_cpu() ? staging_ : at::zeros({total_}, host.device(cfg.device));
  auto dev = at::TensorOptions().device(cfg.device);
  slots64_ = at::full({T}, -1, dev.dtype(at::kLong));
  const at::Tensor cos_t = cfg.cos_table.to(cfg.device), sin_t = cfg.sin_table.to(cfg.device);
  cfg_.cos_table = cos_t;
  cfg_.sin_table = sin_t;
  cos_buf_ = at::zeros({T, cos_t.size(1)}, cos_t.options());
  sin_buf_ = at::zeros({T, cos_t.size(1)}, cos_t.options());
  q_ends_.assign(R + 1, 0);
  kv_lens_.assign(R + 1, 0);
  prefill_q_ends_.assign(R, 0);
  chunk_kv_ends_.assign(kChunks * R, 0);
  seq_tot_.assign(kChunks, 0);
  max_seq_.assign(kChunks, 0);
  ctx_lens_.assign(R, 0);
  md_.block_size = cfg.block_size;
  md_.num_blocks = cfg.num_blocks;
  md_.speculative = cfg.num_speculative_tokens > 0;
  md_.attn_mask = at::triu(at::ones({kMaskSize, kMaskSize}, dev.dtype(at::kChar)), 1);
}

MetadataBuilder::~MetadataBuilder() = default;

const Metadata& MetadataBuilder::build(const BuildInputs& in) {
  int32_t* s = staging_.data_ptr<int32_t>();
  const int64_t R = cfg_.max_num_reqs, MB = cfg_.max_blocks_per_req;
  const size_t num_reqs = in.seq_lens.size();
  AAR_CHECK_ARG(num_reqs <= static_cast<size_t>(R), "num_reqs=", num_reqs,
                " (seq_lens entries) exceeds the builder's max_num_reqs=", R);
  const int64_t tokens = in.num_input_tokens > 0 ? in.num_input_tokens
                                                 : (in.query_start_loc.empty() ? 0 : in.query_start_loc.back());
  AAR_CHECK_ARG(tokens <= cfg_.max_num_tokens, "num_tokens=", tokens, " exceeds the builder's max_num_tokens=",
                cfg_.max_num_tokens);
  AAR_CHECK_ARG(in.block_table_stride <= MB, "block_table has ", in.block_table_stride,
                " columns, more than the builder's max_blocks_per_req=", MB);

  plan::StepInputs si;
  si.query_start_loc = in.query_start_loc;
  si.seq_lens = in.seq_lens;
  si.block_table = in.block_table;
  si.block_table_stride = in.block_table_stride;
  si.block_size = cfg_.block_size;
  si.num_blocks = cfg_.num_blocks;
  si.num_input_tokens = in.num_input_tokens;
  si.decode_threshold = decode_threshold();
  si.treat_short_extends_as_decodes = true;  // MLA without DCP (spec 3.3)
  si.has_state = in.attn_state.has_value();
  if (si.has_state) si.state = *in.attn_state;
  si.num_spec_tokens = in.num_spec_tokens;
  si.spec_method = cfg_.num_speculative_tokens > 0 ? plan::SpecMethod::Mtp : plan::SpecMethod::None;
  si.chunked_prefill_enabled = cfg_.chunked_prefill_enabled;
  si.pad_fia_batch = false;

  plan::StepBuffers buf;
  buf.query_start_loc = plan::Span<int32_t>(s + off_qsl_, R + 2);
  buf.seq_lens = plan::Span<int32_t>(s + off_seq_, R + 1);
  buf.slot_mapping = plan::Span<int32_t>(s + off_slot_, cfg_.max_num_tokens);
  buf.block_table = plan::Span<int32_t>(s + off_bt_, (R + 1) * MB);
  buf.block_table_stride = static_cast<int32_t>(MB);
  buf.q_ends = plan::Span<int64_t>(q_ends_.data(), q_ends_.size());
  buf.kv_lens = plan::Span<int64_t>(kv_lens_.data(), kv_lens_.size());
  const plan::StepPlan p = plan::build_step(si, buf);

  const int32_t B = p.num_reqs, nd = p.split.num_decodes, np = p.split.num_prefills;
  const int32_t td = p.split.num_decode_tokens, tp = p.split.num_prefill_tokens;
  const int32_t* qsl = s + off_qsl_;
  const int32_t* seq = s + off_seq_;

  // Positions of the scheduled tokens (context + offset); padded tokens get 0.
  int32_t* pos = s + off_pos_;
  for (int32_t r = 0; r < B; ++r) {
    const int32_t ql = qsl[r + 1] - qsl[r];
    for (int32_t t = 0; t < ql; ++t) pos[qsl[r] + t] = seq[r] - ql + t;
  }
  std::fill(pos + p.num_actual_tokens, pos + p.num_input_tokens, 0);
  const int64_t max_pos = cfg_.cos_table.size(0);
  for (int32_t r = 0; r < B; ++r) {
    AAR_CHECK_ARG(seq[r] <= max_pos, "seq_lens[", r, "]=", seq[r], " exceeds the RoPE table length ", max_pos);
  }

  // Context chunks of the prefills (spec 3.4).
  plan::ContextChunkPlan cp;
  md_.prefill.max_query_len = 0;
  md_.prefill.max_seq_len = 0;
  if (np > 0 && cfg_.chunked_prefill_enabled) {
    int32_t max_q = 0, max_s = 0;
    for (int32_t b = 0; b < np; ++b) {
      const int32_t r = nd + b, ql = qsl[r + 1] - qsl[r];
      ctx_lens_[b] = seq[r] - ql;
      prefill_q_ends_[b] = qsl[r + 1] - qsl[nd];
      max_q = std::max(max_q, ql);
      max_s = std::max(max_s, seq[r]);
    }
    plan::ContextChunkInputs ci;
    ci.context_lens = plan::CSpan<int32_t>(ctx_lens_.data(), np);
    ci.workspace_tokens = workspace_;
    ci.block_size = cfg_.block_size;
    plan::ContextChunkBuffers cb;
    cb.cu_seq_lens = plan::Span<int32_t>(s + off_cu_, kChunks * (np + 1));
    cb.starts = plan::Span<int32_t>(s + off_starts_, kChunks * np);
    cb.chunk_seq_lens = plan::Span<int32_t>(s + off_clens_, kChunks * np);
    cb.kv_ends = plan::Span<int64_t>(chunk_kv_ends_.data(), kChunks * np);
    cb.seq_tot = plan::Span<int64_t>(seq_tot_.data(), kChunks);
    cb.max_seq_lens = plan::Span<int64_t>(max_seq_.data(), kChunks);
    cp = plan::plan_context_chunks(ci, cb);
    md_.prefill.max_query_len = max_q;
    md_.prefill.max_seq_len = max_s;
  } else if (np > 0) {
    // Without chunked prefill there is no context to merge (spec 3.4 returns None);
    // a prefill with context would silently lose it, so reject it.
    for (int32_t b = 0; b < np; ++b) {
      const int32_t r = nd + b, ql = qsl[r + 1] - qsl[r];
      AAR_CHECK_ARG(seq[r] == ql, "request ", r, " has ", seq[r] - ql,
                    " cached context tokens but chunked_prefill_enabled is false (its context would be ignored)");
      prefill_q_ends_[b] = qsl[r + 1] - qsl[nd];
      md_.prefill.max_query_len = std::max(md_.prefill.max_query_len, ql);
    }
  }

  // One host-to-device copy of the packed prefix.
  const int64_t used = off_bt_ + static_cast<int64_t>(B) * MB;
  if (!cfg_.device.is_cpu()) device_.narrow(0, 0, used).copy_(staging_.narrow(0, 0, used), /*non_blocking=*/true);

  const int32_t T_in = p.num_input_tokens;
  at::Tensor slots32 = device_.narrow(0, off_slot_, T_in);
  md_.slot_mapping = slots64_.narrow(0, 0, T_in);
  md_.slot_mapping.copy_(slots32);
  const at::Tensor positions = device_.narrow(0, off_pos_, T_in);
  at::Tensor cos = cos_buf_.narrow(0, 0, T_in), sin = sin_buf_.narrow(0, 0, T_in);
  at::index_select_out(cos, cfg_.cos_table, 0, positions);
  at::index_select_out(sin, cfg_.sin_table, 0, positions);

  md_.attn_state = p.state;
  md_.num_reqs = B;
  md_.num_actual_tokens = p.num_actual_tokens;
  md_.num_input_tokens = T_in;
  md_.num_decodes = nd;
  md_.num_prefills = np;
  md_.num_decode_tokens = td;
  md_.num_prefill_tokens = tp;
  md_.query_start_loc = device_.narrow(0, off_qsl_, B + 1);
  const at::Tensor bt = device_.narrow(0, off_bt_, static_cast<int64_t>(B) * MB).view({B, MB});
  if (nd > 0) {
    md_.decode.block_table = bt.narrow(0, 0, nd);
    md_.decode.seq_lens_list = c10::IntArrayRef(kv_lens_.data(), nd);
    md_.decode.actual_seq_lengths_q = c10::IntArrayRef(q_ends_.data(), nd);
    md_.decode.cos = cos.narrow(0, 0, td);
    md_.decode.sin = sin.narrow(0, 0, td);
    md_.decode.max_seq_len = *std::max_element(seq, seq + nd);
  } else {
    md_.decode = DecodeMetadata{};
  }
  if (np > 0) {
    md_.prefill.block_table = bt.narrow(0, nd, np);
    md_.prefill.actual_seq_lengths_q = c10::IntArrayRef(prefill_q_ends_.data(), np);
    md_.prefill.cos = cos.narrow(0, td, tp);
    md_.prefill.sin = sin.narrow(0, td, tp);
    ChunkedContext& cc = md_.prefill.chunked;
    cc.num_chunks = cp.num_chunks;
    cc.chunk_size = cp.chunk_size;
    cc.kv_ends.clear();
    if (cp.num_chunks > 0) {
      const int64_t C = cp.num_chunks;
      cc.cu_seq_lens = device_.narrow(0, off_cu_, C * (np + 1)).view({C, np + 1});
      cc.starts = device_.narrow(0, off_starts_, C * np).view({C, np});
      cc.chunk_seq_lens = device_.narrow(0, off_clens_, C * np).view({C, np});
      cc.seq_tot = c10::IntArrayRef(seq_tot_.data(), C);
      cc.max_seq_lens = c10::IntArrayRef(max_seq_.data(), C);
      for (int64_t c = 0; c < C; ++c) cc.kv_ends.emplace_back(chunk_kv_ends_.data() + c * np, np);
    } else {
      cc = ChunkedContext{};
    }
  } else {
    md_.prefill = PrefillMetadata{};
  }
  return md_;
}

}  // namespace aar::mla
