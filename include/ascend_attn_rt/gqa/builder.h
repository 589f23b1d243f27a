// The GQA metadata builder (docs/design/gqa.md §3): turns one step's scheduler
// output into device metadata. Persistent buffers are allocated at construction;
// a build validates, plans (plan::build_step, pure C++), and makes at most one
// host-to-device copy. No allocation in steady state (the optional dense
// context, BuilderConfig::dense_context, is a few device operations per build).
//
// Buffers: on the device path the step is written into one of
// BuilderConfig::staging_buffers host buffers, used in turn, and copied to one
// device buffer (stable addresses, for graph capture); a host buffer is only
// rewritten once the copy made from it has completed (include/ascend_attn_rt/
// staging.h). On the CPU the host buffer is the device buffer.
//
// Lifetime: build() returns the builder's metadata, stamped with the build's
// generation; a copy kept past the next build is stale and rejected by forward
// and graph update (build_stamp.h).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "ascend_attn_rt/build_stamp.h"
#include "ascend_attn_rt/core/step.h"
#include "ascend_attn_rt/gqa/mask.h"
#include "ascend_attn_rt/gqa/metadata.h"
#include "ascend_attn_rt/plan/attention_state.h"
#include "ascend_attn_rt/plan/span.h"
#include "ascend_attn_rt/staging.h"

namespace aar::detail {
class StagingBuffers;
}

namespace aar::gqa {

// The builder core (core/step.h: capacities, block geometry, staging) and what
// the GQA builder adds.
struct BuilderConfig : core::BuilderCore {
  plan::SpecMethod spec_method = plan::SpecMethod::None;
  bool chunked_prefill_enabled = true;
  bool pooling = false;                   // model_runner_type == "pooling"
  bool pad_fia_batch = true;              // dummy request for padded tokens (docs/design/gqa.md §2.5)
  // Pad uniform decode batches (every request 1 + num_speculative_tokens
  // tokens) with one dummy request per decode_threshold padding tokens instead
  // of one dummy for all: graph buckets for paged attention and the BNSD decode
  // kernels take one row per request (docs/design/gqa.md §2.5, uniform case).
  bool uniform_decode_padding = false;
  // Metadata::dense (the paged context as dense rows), read by layers that
  // attend over a gathered context (head size 512 on A2/A3, the C8 prefill
  // over cached context): unset (default) computes it on demand, once per
  // build, when the first such layer asks (gqa::dense_context()), so those
  // layers work with the default builder and others pay nothing; true computes
  // it at every build (a few device operations; needed to capture such a step
  // in a graph); false never does (those layers then refuse by name).
  std::optional<bool> dense_context;
};

// The step (core::StepInput; req_ids are not read: refused when given) and
// whether its attention is causal.
struct BuildInputs : core::StepInput {
  bool causal = true;
};

// Thread safety: one thread at a time per builder (build, build_for_graph_capture, the
// accessors, mask_builder()); builders share nothing, so engines on several threads each
// keep their own. forward and graph update only read the returned Metadata; the builder's
// next build rewrites it. (tests/cpp/test_concurrency.cpp)
class MetadataBuilder final : private DenseContextSource {
 public:
  explicit MetadataBuilder(const BuilderConfig& cfg);
  ~MetadataBuilder();
  MetadataBuilder(const MetadataBuilder&) = delete;
  MetadataBuilder& operator=(const MetadataBuilder&) = delete;

  const Metadata& build(const BuildInputs& in);
  using Inputs = BuildInputs;
  using Output = Metadata;
  // The states Backend::facts().capturable declares (DecodeOnly, ChunkedPrefill,
  // SpecDecoding); others are refused by name before anything is built.
  const Metadata& build_for_graph_capture(const BuildInputs& in,
                                          plan::AttentionState state = plan::AttentionState::DecodeOnly);
  // A draft model's step: build() (the builder keeps no draft lanes, so the
  // previous metadata becomes stale; keep one builder per live draft step).
  const Metadata& build_for_drafting(const BuildInputs& in, int32_t draft_index);

  const BuilderConfig& config() const { return cfg_; }
  int32_t decode_threshold() const { return 1 + cfg_.num_speculative_tokens; }
  int32_t reorder_batch_threshold() const { return decode_threshold(); }
  const Metadata& metadata() const { return md_; }
  // Host int32 (request capacity, max_blocks_per_req) block table an engine may
  // keep its block table in and pass back as BuildInputs::block_table. Without
  // separate device buffers (the CPU) it is the staging buffer itself and the
  // build copies no rows; on the device path it is a table of its own whose
  // rows the build copies into the staging buffer of the turn (so the engine
  // may rewrite it as soon as build() returns).
  const at::Tensor& block_table_staging() const { return staging_block_table_; }
  // Generation of the latest build (0 before the first).
  uint64_t generation() const { return counter_.current(); }
  MaskBuilder& mask_builder() { return masks_; }

 private:
  struct Staging;  // the staging buffer's regions and their cached views

  void build_dense_context(int32_t num_decodes, int32_t num_decode_tokens);
  const DenseContext& dense_context_of(const Metadata& md) override;
  const DenseContext* computed_dense_context_of(const Metadata& md) const override;

  BuilderConfig cfg_;
  bool separate_;
  MaskBuilder masks_;
  std::optional<at::Tensor> causal_mask_;
  Metadata md_;
  detail::BuildCounter counter_;
  // Host staging: packed int32 buffers [qsl | seq_lens | slot_mapping | block_table],
  // the same layout on the device (one buffer, aliasing the host one when !separate_).
  std::unique_ptr<detail::StagingBuffers> buffers_;
  at::Tensor staging_block_table_;
  std::vector<int64_t> q_ends_;
  std::vector<int64_t> kv_lens_;
  std::vector<int64_t> prefill_q_ends_;
  std::vector<int64_t> dense_kv_ends_, dense_prefill_kv_ends_;
  std::unique_ptr<Staging> st_;
  int64_t cap_reqs_ = 0;  // request capacity incl. padding dummies
};

}  // namespace aar::gqa
