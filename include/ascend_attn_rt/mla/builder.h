// The MLA metadata builder (spec mla.md section 3). Persistent buffers are
// allocated at construction; a build validates, plans (pure C++ plan layer),
// makes one host-to-device copy, and gathers the RoPE tables at the token
// positions (two small device ops). Graph-mode padding is not wired yet (it
// needs the graph layer); the padding maths is plan::pad_actual_q_*.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "ascend_attn_rt/mla/metadata.h"
#include "ascend_attn_rt/plan/span.h"

namespace aar::mla {

struct BuilderConfig {
  int32_t max_num_reqs = 256;
  int32_t max_num_tokens = 8192;
  int32_t max_blocks_per_req = 64;
  int32_t block_size = 128;
  int32_t num_blocks = 0;              // required, for range checks
  int32_t max_model_len = 0;           // 0 = max_blocks_per_req * block_size
  int32_t num_speculative_tokens = 0;  // decode threshold = 1 + n <= 16
  bool chunked_prefill_enabled = true;
  // 0 = the upstream workspace rule (plan::chunked_prefill_workspace_size).
  int64_t workspace_tokens = 0;
  // RoPE tables (max_position, R), first and second halves identical (spec 6.1).
  at::Tensor cos_table, sin_table;
  c10::Device device = c10::Device(c10::kCPU);
};

struct BuildInputs {
  plan::CSpan<int32_t> query_start_loc;  // B+1, exclusive prefix sums
  plan::CSpan<int32_t> seq_lens;         // B, context + new tokens
  plan::CSpan<int32_t> block_table;      // B x block_table_stride, row-major, host
  int32_t block_table_stride = 0;
  int32_t num_input_tokens = 0;          // 0 = query_start_loc[B]
  std::optional<plan::AttentionState> attn_state;  // derived when absent
  plan::CSpan<int32_t> num_spec_tokens;  // optional (state derivation)
};

class MetadataBuilder {
 public:
  explicit MetadataBuilder(const BuilderConfig& cfg);
  ~MetadataBuilder();
  MetadataBuilder(const MetadataBuilder&) = delete;
  MetadataBuilder& operator=(const MetadataBuilder&) = delete;

  const Metadata& build(const BuildInputs& in);

  const BuilderConfig& config() const { return cfg_; }
  int32_t decode_threshold() const { return 1 + cfg_.num_speculative_tokens; }
  int64_t workspace_tokens() const { return workspace_; }
  const Metadata& metadata() const { return md_; }

 private:
  BuilderConfig cfg_;
  int64_t workspace_ = 0;
  Metadata md_;
  at::Tensor staging_, device_;  // packed int32
  at::Tensor slots64_, cos_buf_, sin_buf_;
  std::vector<int64_t> q_ends_, kv_lens_, prefill_q_ends_, decode_q_ends_, decode_kv_lens_;
  std::vector<int64_t> chunk_kv_ends_, seq_tot_, max_seq_;
  std::vector<int32_t> ctx_lens_;
  int64_t off_qsl_ = 0, off_seq_ = 0, off_slot_ = 0, off_pos_ = 0, off_bt_ = 0, off_cu_ = 0, off_starts_ = 0,
          off_clens_ = 0, total_ = 0;
};

}  // namespace aar::mla
