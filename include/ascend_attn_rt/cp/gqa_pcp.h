// GQA/MHA prefill context parallelism over a PCP group, with or without DCP, in two
// designs (PcpConfig::kv_mode): Sharded (DualChunkSwap head/tail, KV sharded over
// Wp * Wd ranks) and Replicated (model-runner v2 segments, full KV on every rank).
// Both take the global batch on every rank and give the rank's local rows; every
// collective decision uses batch-global facts only. No speculative decode, no graph
// capture. Design: docs/design/cp.md §6 (the designs), §8 (collectives).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/util/ArrayRef.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "ascend_attn_rt/build_stamp.h"
#include "ascend_attn_rt/core/backend.h"
#include "ascend_attn_rt/core/step.h"
#include "ascend_attn_rt/detail/tensor_binding.h"
#include "ascend_attn_rt/gqa/builder.h"
#include "ascend_attn_rt/gqa/impl.h"
#include "ascend_attn_rt/gqa/metadata.h"
#include "ascend_attn_rt/kv_connector.h"
#include "ascend_attn_rt/cp/plan/cp_groups.h"
#include "ascend_attn_rt/cp/plan/pcp_segments.h"
#include "ascend_attn_rt/plan/span.h"

namespace aar::detail {
class StagingBuffers;
}

namespace aar::cp {

class Comm;

// The backend's declared facts (core/backend.h), registered as "gqa_pcp".
struct PcpBackend {
  static core::BackendFacts facts();
};

// The builder core (core/step.h; capacities for the global batch: max_num_reqs
// requests and max_num_tokens scheduled tokens per step) and what PCP adds.
// num_speculative_tokens must be 0 (no speculative decode with PCP).
struct PcpConfig : core::BuilderCore {
  int32_t pcp_size = 1, pcp_rank = 0;  // Wp, rp
  int32_t dcp_size = 1, dcp_rank = 0;  // Wd, rd (sharded mode only)
  int32_t interleave_size = 1;         // I (sharded mode: B % I == 0)
  plan::PcpKvMode kv_mode = plan::PcpKvMode::Sharded;
};

// The step (core::StepInput): the global batch, decodes first. Read:
// query_start_loc, seq_lens (context + new tokens), the host block table and
// is_prefilling; num_input_tokens may only repeat query_start_loc[N] (PCP
// pads nothing for graphs); attn_state, num_spec_tokens and req_ids are
// refused by name when given.
struct PcpBuildInputs : core::StepInput {};

// The counts (core::StepCounts) are the global step's, the same on every rank:
// num_reqs = num_kernel_reqs the N scheduled requests (no padding dummies),
// num_actual_tokens = num_input_tokens the scheduled tokens, the
// decode/prefill split (num_decode_tokens Td are also this rank's decode rows:
// decodes are replicated). The rows of this rank's q/k/v/output are
// num_local_tokens.
struct PcpMetadata : core::StepCounts {
  // The global step's state (plan::select_attention_state of its lengths), for
  // engines and logs: the layers read the split. The replicated path's local
  // GQA batch has its own (local->attn_state).
  plan::AttentionState attn_state = plan::AttentionState::ChunkedPrefill;
  plan::PcpKvMode kv_mode = plan::PcpKvMode::Sharded;
  int32_t pcp_size = 1, pcp_rank = 0, dcp_size = 1, dcp_rank = 0;
  int32_t num_local_tokens = 0;    // rows of this rank's q/k/v/output
  bool has_context = false;        // a split request has cached context (batch-global)

  // Sharded. `shape` carries the validation facts (block_size, num_blocks,
  // rows) for the shared GQA input checks.
  gqa::Metadata shape;
  at::Tensor padded_slot_mapping;  // device int32 (Wp * T_loc): padded-global order
  at::Tensor decode_slots;         // device int32 (Td)
  at::Tensor restore_idx;          // device int32 (Wp * T_loc): padded_global = gathered[restore]
  at::Tensor q_head_idx, q_tail_idx, kv_head_nomask_idx, kv_head_mask_idx, kv_tail_nomask_idx, kv_tail_mask_idx,
      q_full_idx;                  // device int32 (docs/design/cp.md §6.4 lists)
  at::Tensor decode_block_tables;  // device int32 (num_decodes, stride)
  at::Tensor ctx_block_tables;     // device int32 (Wp * num_prefills, stride): entry (j, i) = request i's row
  at::Tensor context_rows;         // device int32 (T_loc - Td): 1 where the local prefill row's request has context
  std::optional<at::Tensor> attn_mask;
  c10::IntArrayRef decode_q_ends, decode_kv_lens;  // cumulative 1..Td; local KV lengths (this step included)
  c10::IntArrayRef mask_seq_ends, head_nomask_kv_ends, tail_nomask_kv_ends;  // cumulative (docs/design/cp.md §6.4)
  c10::IntArrayRef ctx_q_ends, ctx_kv_lens;  // cumulative 2c_i over (rank j, request i); local context lengths
  int32_t chunk_tokens = 0, head_nomask_tokens = 0, tail_nomask_tokens = 0;

  // Replicated.
  const gqa::Metadata* local = nullptr;  // the GQA build of this rank's segments
  at::Tensor write_slots;                // device int32 (Td + Wp * (P - Td)): cat(K[:Td], gathered)'s slots

  BuildStamp stamp;
};

// Thread safety: as gqa::MetadataBuilder: one thread at a time per builder.
class PcpMetadataBuilder {
 public:
  explicit PcpMetadataBuilder(const PcpConfig& cfg);
  ~PcpMetadataBuilder();
  PcpMetadataBuilder(const PcpMetadataBuilder&) = delete;
  PcpMetadataBuilder& operator=(const PcpMetadataBuilder&) = delete;

  const PcpMetadata& build(const PcpBuildInputs& in);
  using Inputs = PcpBuildInputs;
  using Output = PcpMetadata;
  // PcpBackend::facts().capturable is empty: every state is refused by name
  // (NotSupported), before anything is built.
  const PcpMetadata& build_for_graph_capture(const PcpBuildInputs& in,
                                             plan::AttentionState state = plan::AttentionState::DecodeOnly);
  // A draft model's step: build() (no draft lanes; the previous metadata
  // becomes stale).
  const PcpMetadata& build_for_drafting(const PcpBuildInputs& in, int32_t draft_index);
  const PcpConfig& config() const { return cfg_; }
  const PcpMetadata& metadata() const { return md_; }

  // Host int32 positions (within each request's scheduled tokens) of this
  // rank's local rows after the latest build: sharded, pcp_local_tokens (>= q
  // for pads); replicated, per row (-1 for padding rows).
  const std::vector<int32_t>& local_positions() const { return positions_; }
  // Host int32, the global token (query_start_loc units) of every local row,
  // -1 for padding: how a model runner gathers this rank's hidden states.
  const std::vector<int32_t>& local_token_index() const { return token_index_; }

 private:
  void build_sharded(const PcpBuildInputs& in, int32_t num_decodes);
  void build_replicated(const PcpBuildInputs& in);

  struct Staging;  // the staging buffer's regions (and the replicated path's cached views)

  PcpConfig cfg_;
  PcpMetadata md_;
  detail::BuildCounter counter_;
  std::unique_ptr<detail::StagingBuffers> buffers_;
  std::unique_ptr<Staging> st_;
  std::unique_ptr<gqa::MetadataBuilder> inner_;  // replicated mode
  std::optional<at::Tensor> causal_mask_;
  int64_t cap_ = 0;
  // Host scratch, sized at construction.
  std::vector<uint8_t> flags_;
  std::vector<int32_t> qlens_, token_slots_, positions_, token_index_, local_lens_, pads_;
  std::vector<int32_t> local_qsl_, local_seq_, local_bt_, expanded_slots_;
  std::vector<uint8_t> local_pref_, u8_;
  std::vector<int64_t> decode_q_ends_, decode_kv_lens_, mask_ends_, head_ends_, tail_ends_, ctx_q_ends_,
      ctx_kv_lens_;
  std::vector<int32_t> num_computed_;
  std::vector<plan::PcpSegment> segments_;
};

// Thread safety: one thread at a time per layer; layers of one rank run in order (their
// collectives must be issued in the same order on every rank).
class PcpAttentionImpl {
 public:
  // KV-connector hooks of this layer (kv_connector.h), around every forward
  // with the PcpMetadata as the layer metadata; a PCP layer always writes its
  // cache (wrote = true). None by default.
  KvHooks kv_hooks;

  // pcp: the PCP group's Comm (size Wp); dcp: the DCP group's (size Wd), may be
  // null when Wd = 1. Both are borrowed: they must outlive the layer.
  PcpAttentionImpl(const gqa::ImplConfig& cfg, Comm* pcp, Comm* dcp = nullptr);

  // query (T_loc, H, D), key/value (T_loc, Hkv, D) (required: PCP writes the
  // KV of every layer), caches as for gqa::AttentionImpl, output (T_loc, H, D)
  // written in full (padding rows get defined values). Validates everything
  // before the first collective or write. metadata == nullptr (profiling run)
  // zero-fills the output and issues no collective. Returns output.
  const at::Tensor& forward(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                            const at::Tensor& key_cache, const at::Tensor& value_cache, const PcpMetadata* metadata,
                            const at::Tensor& output);

  const gqa::ImplConfig& config() const { return cfg_; }

 private:
  void forward_sharded(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const PcpMetadata& md,
                       const at::Tensor& out);
  void forward_replicated(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const at::Tensor& key_cache, const at::Tensor& value_cache, const PcpMetadata& md,
                          const at::Tensor& out);
  void check_groups(const PcpMetadata& md) const;

  gqa::ImplConfig cfg_;
  Comm* pcp_;
  Comm* dcp_;
  std::unique_ptr<gqa::AttentionImpl> inner_;  // replicated mode: the ordinary layer, no KV write
  ::aar::detail::BoundNdCaches caches_;
};

}  // namespace aar::cp
