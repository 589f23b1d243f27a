// The GQA metadata builder (spec gqa.md section 4): turns one step's scheduler
// output into device metadata. Persistent buffers are allocated at construction;
// a build validates, plans (plan::build_step, pure C++), and makes at most one
// host-to-device copy. No allocation in steady state.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "ascend_attn_rt/gqa/mask.h"
#include "ascend_attn_rt/gqa/metadata.h"
#include "ascend_attn_rt/plan/attention_state.h"
#include "ascend_attn_rt/plan/span.h"

namespace aar::gqa {

struct BuilderConfig {
  int32_t max_num_reqs = 256;
  int32_t max_num_tokens = 8192;
  int32_t max_blocks_per_req = 64;
  int32_t block_size = 128;
  int32_t num_blocks = 0;                 // KV-cache blocks (range checks); required
  int32_t num_speculative_tokens = 0;     // decode threshold = 1 + this (<= 16)
  plan::SpecMethod spec_method = plan::SpecMethod::None;
  bool chunked_prefill_enabled = true;
  bool pooling = false;                   // model_runner_type == "pooling"
  bool pad_fia_batch = true;              // dummy request for padded tokens (spec 4.7)
  // Pad uniform decode batches (every request 1 + num_speculative_tokens
  // tokens) with one dummy request per decode_threshold padding tokens instead
  // of one dummy for all: graph buckets for paged attention and the BNSD decode
  // kernels take one row per request (spec 4.7, uniform case).
  bool uniform_decode_padding = false;
  c10::Device device = c10::Device(c10::kCPU);
  // Keep device buffers apart from the host staging buffer and copy once per
  // build. Defaults to (device != CPU); settable so CPU tests exercise the copy.
  std::optional<bool> separate_device_buffers;
};

struct BuildInputs {
  plan::CSpan<int32_t> query_start_loc;  // B+1, exclusive prefix sums
  plan::CSpan<int32_t> seq_lens;         // B
  plan::CSpan<int32_t> block_table;      // B x block_table_stride, row-major, host
  int32_t block_table_stride = 0;
  int32_t num_input_tokens = 0;          // 0 = query_start_loc[B]
  std::optional<plan::AttentionState> attn_state;  // derived when absent
  plan::CSpan<uint8_t> is_prefilling;    // optional
  plan::CSpan<int32_t> num_spec_tokens;  // optional (state derivation)
  bool causal = true;
};

class MetadataBuilder {
 public:
  explicit MetadataBuilder(const BuilderConfig& cfg);
  ~MetadataBuilder();
  MetadataBuilder(const MetadataBuilder&) = delete;
  MetadataBuilder& operator=(const MetadataBuilder&) = delete;

  const Metadata& build(const BuildInputs& in);
  // Spec 4.5: only DecodeOnly, ChunkedPrefill and SpecDecoding may be captured.
  const Metadata& build_for_graph_capture(const BuildInputs& in,
                                          plan::AttentionState state = plan::AttentionState::DecodeOnly);

  const BuilderConfig& config() const { return cfg_; }
  int32_t decode_threshold() const { return 1 + cfg_.num_speculative_tokens; }
  int32_t reorder_batch_threshold() const { return decode_threshold(); }
  const Metadata& metadata() const { return md_; }
  // Host int32 (request capacity, max_blocks_per_req) staging block table. An
  // engine may keep its block table here and pass it back as
  // BuildInputs::block_table (same pointer): the build then copies nothing.
  const at::Tensor& block_table_staging() const { return staging_block_table_; }
  MaskBuilder& mask_builder() { return masks_; }

 private:
  struct Views;  // per-size cached views

  BuilderConfig cfg_;
  bool separate_;
  MaskBuilder masks_;
  std::optional<at::Tensor> causal_mask_;
  Metadata md_;
  // Host staging: one packed int32 buffer [qsl | seq_lens | slot_mapping | block_table].
  at::Tensor staging_;
  at::Tensor device_;  // same layout on the device (aliases staging_ when !separate_)
  at::Tensor staging_block_table_;
  std::vector<int64_t> q_ends_;
  std::vector<int64_t> kv_lens_;
  std::unique_ptr<Views> views_;
  int64_t cap_reqs_ = 0;  // request capacity incl. padding dummies
  int64_t off_qsl_ = 0, off_seq_ = 0, off_slot_ = 0, off_bt_ = 0;
};

}  // namespace aar::gqa
