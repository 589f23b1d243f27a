// Per-step attention metadata (docs/design/gqa.md §3.1). Owned by the MetadataBuilder
// that produced it and valid until that builder's next build: every tensor is a
// view of a persistent buffer and the length lists point into builder storage.
// `stamp` identifies the build; consumers reject a stale copy (build_stamp.h).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>

#include <cstdint>
#include <optional>

#include "ascend_attn_rt/build_stamp.h"
#include "ascend_attn_rt/core/step.h"
#include "ascend_attn_rt/plan/attention_state.h"

namespace aar::graph {
struct StepParams;  // graph/step_params.h
}

namespace aar::gqa {

// The paged context as dense rows, request after request: what the paths that
// attend over a gathered context read (the A2/A3 head-size-512 fallback, the C8
// prefill over dequantised context). Computed on the metadata's device at most once
// per build: by the build itself (BuilderConfig::dense_context = true), or on
// demand by the first layer that reads it (the default; gqa::dense_context()).
struct DenseContext {
  bool valid = false;
  // Device int64 (sum of the kernels' KV lengths): the cache slot
  // (block * block_size + offset) of every KV position of requests [0, num_reqs).
  at::Tensor slots;
  // Device int64 (num_kernel_tokens): the dense row of every query token (its
  // position in its request's context, offset by the requests before it).
  at::Tensor token_rows;
  // Device int64 (num_kernel_tokens - num_decode_tokens): the rows of the tokens
  // of requests [num_decodes, num_reqs) counted from their first request's row.
  at::Tensor prefill_token_rows;
  c10::IntArrayRef kv_ends;          // host, num_reqs: cumulative KV lengths
  c10::IntArrayRef prefill_kv_ends;  // host: the same for requests [num_decodes, num_reqs), rebased to 0
  int64_t prefill_kv_start = 0;      // kv_ends[num_decodes - 1] (0 without decodes)
};

struct Metadata;

// What computes a build's dense context on demand (the builder that made it).
// (Not in a gqa::detail namespace: one would hide ::aar::detail in gqa code.)
class DenseContextSource {
 public:
  virtual const DenseContext& dense_context_of(const Metadata& md) = 0;
  // The dense context if it has been computed for md's build (null otherwise).
  virtual const DenseContext* computed_dense_context_of(const Metadata& md) const = 0;

 protected:
  ~DenseContextSource() = default;
};

// The step's counts (core::StepCounts: num_reqs real requests, num_kernel_reqs
// the fused kernels' B_fia with a padding dummy; num_actual_tokens are written
// to the cache) and the GQA metadata.
struct Metadata : core::StepCounts {
  plan::AttentionState attn_state = plan::AttentionState::ChunkedPrefill;
  int32_t num_kernel_tokens = 0;   // actual_seq_lengths_q.back(): query rows attended
  int32_t block_size = 0;
  int32_t num_blocks = 0;          // KV-cache blocks the slots and block ids were checked against
  bool causal = true;
  bool is_pooling = false;

  at::Tensor query_start_loc;  // device int32 (num_reqs + 1)
  at::Tensor seq_lens;         // host int32 (num_reqs): per-request KV lengths
  at::Tensor block_tables;     // device int32 (num_reqs, max_blocks_per_req)
  at::Tensor slot_mapping;     // device int32 (num_input_tokens), -1 past num_actual_tokens
  std::optional<at::Tensor> attn_mask;  // device; None for non-causal

  c10::IntArrayRef actual_seq_lengths_q;  // cumulative query ends (num_reqs)
  c10::IntArrayRef seq_lens_list;         // per-request KV lengths (num_reqs)
  // Cumulative query ends of requests [num_decodes, num_reqs), rebased to the
  // first of them (the prefill part's own call in the split paths).
  c10::IntArrayRef prefill_actual_seq_lengths_q;
  // No request of [0, num_real_reqs) / [num_decodes, num_real_reqs) has cached
  // context (every KV length equals its query length).
  bool no_context = false;
  bool prefill_no_context = false;
  DenseContext dense;
  // Set when the builder computes the dense context on demand (null when it
  // computed it at the build, or never does).
  DenseContextSource* dense_source = nullptr;
  BuildStamp stamp;
};

// The build's dense context: md.dense when the build computed it, else computed
// now, once per build, by the builder (refused inside a graph capture, and by a
// builder configured with dense_context = false: the error names the option).
const DenseContext& dense_context(const Metadata& md);
// The dense context if the build or a layer has computed it (null otherwise);
// computes nothing.
const DenseContext* computed_dense_context(const Metadata& md);

// What a graph update refreshes from this step (gqa/graph.h), declared with
// the metadata so that GraphParams::update(n, metadata) finds it.
graph::StepParams graph_step_params(const Metadata& md);

}  // namespace aar::gqa
