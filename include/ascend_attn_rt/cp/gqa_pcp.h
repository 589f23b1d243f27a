// GQA/MHA prefill context parallelism over a PCP group, with or without DCP, in two
// designs (PcpConfig::kv_mode): Sharded (DualChunkSwap head/tail, KV sharded over
// Wp * Wd ranks) and Replicated (model-runner v2 segments, full KV on every rank).
// Both take the global batch on every rank and give the rank's local rows; every
// collective decision uses batch-global facts only. Speculative decode (decodes of up
// to 1 + num_speculative_tokens tokens, one decode row per token) and graph capture of
// decode-only buckets (padded with KV-length-0 rows; steps with prefills are eager
// only). Design: docs/design/cp.md §6 (the designs), §6.6 (spec decode, capture),
// §8 (collectives).
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
#include "ascend_attn_rt/graph/step_params.h"
#include "ascend_attn_rt/kv_connector.h"
#include "ascend_attn_rt/cp/plan/cp_groups.h"
#include "ascend_attn_rt/cp/plan/pcp_segments.h"
#include "ascend_attn_rt/plan/span.h"

namespace aar::detail {
class StagingBuffers;
}

namespace aar::graph {
class GraphParams;
}

namespace aar::cp {

class Comm;
class GqaShardExchange;  // cpp/cp/gqa_cp_exchange.h
struct DcpViews;         // comm/dcp_exchange.h
class DcpWorkspace;

// The backend's declared facts (core/backend.h), registered as "gqa_pcp".
struct PcpBackend {
  static core::BackendFacts facts();
};

// The builder core (core/step.h; capacities for the global batch: max_num_reqs
// requests and max_num_tokens scheduled tokens per step) and what PCP adds.
// num_speculative_tokens in [0, 15]: the decode threshold is 1 + it (a request
// of at most that many new tokens that is not still prefilling is a decode,
// replicated on every PCP rank, not split).
struct PcpConfig : core::BuilderCore {
  int32_t pcp_size = 1, pcp_rank = 0;  // Wp, rp
  int32_t dcp_size = 1, dcp_rank = 0;  // Wd, rd (sharded mode only)
  int32_t interleave_size = 1;         // I (sharded mode: B % I == 0)
  plan::PcpKvMode kv_mode = plan::PcpKvMode::Sharded;
};

// The step (core::StepInput): the global batch, decodes first. Read:
// query_start_loc, seq_lens (context + new tokens), the host block table and
// is_prefilling; num_input_tokens is 0, query_start_loc[N], or (a graph
// bucket) more than query_start_loc[N] on a decode-only step only: padding
// decode rows of KV length 0 up to it (a padded step with prefills is refused
// by name); attn_state, num_spec_tokens and req_ids are refused by name when
// given.
struct PcpBuildInputs : core::StepInput {};

// The counts (core::StepCounts) are the global step's, the same on every rank:
// num_reqs the N scheduled requests, num_kernel_reqs N plus the padding decode
// rows of a graph bucket, num_actual_tokens the scheduled tokens,
// num_input_tokens the bucket (or num_actual_tokens), the decode/prefill split
// (num_decode_tokens Td are also this rank's first decode rows: decodes are
// replicated). The rows of this rank's q/k/v/output are num_local_tokens (the
// bucket on a padded decode-only step).
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
  // Decode rows, one per decode token (its own KV length, so the causal order
  // among a speculative decode's tokens needs no mask), then on a padded
  // decode-only step padding rows of KV length 0 (slot -1) up to
  // decode_kernel_rows. The three device views keep their address build after
  // build (a captured bucket reads them).
  int32_t decode_kernel_rows = 0;  // Td, or the bucket when padded
  at::Tensor decode_slots;         // device int32 (decode_kernel_rows): this KV rank's slots, -1 elsewhere
  at::Tensor restore_idx;          // device int32 (Wp * T_loc): padded_global = gathered[restore]
  at::Tensor q_head_idx, q_tail_idx, kv_head_nomask_idx, kv_head_mask_idx, kv_tail_nomask_idx, kv_tail_mask_idx,
      q_full_idx;                  // device int32 (docs/design/cp.md §6.4 lists)
  at::Tensor decode_block_tables;  // device int32 (decode_kernel_rows, max_blocks_per_req): each row its request's
  at::Tensor ctx_block_tables;     // device int32 (Wp * num_prefills, stride): entry (j, i) = request i's row
  at::Tensor context_rows;         // device int32 (T_loc - Td): 1 where the local prefill row's request has context
  std::optional<at::Tensor> attn_mask;
  // Cumulative 1..decode_kernel_rows; per row the local KV length up to and
  // including its token (local_len(p + 1), docs/design/cp.md §3.3), 0 for padding.
  c10::IntArrayRef decode_q_ends, decode_kv_lens;
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
  // The states PcpBackend::facts().capturable declares (DecodeOnly,
  // SpecDecoding) on a decode-only step (padded to num_input_tokens); another
  // state or a step with prefills is refused by name (NotSupported) before
  // anything is built. The metadata's attn_state is `state`.
  const PcpMetadata& build_for_graph_capture(const PcpBuildInputs& in,
                                             plan::AttentionState state = plan::AttentionState::DecodeOnly);
  // A draft model's step: build() (no draft lanes; the previous metadata
  // becomes stale).
  const PcpMetadata& build_for_drafting(const PcpBuildInputs& in, int32_t draft_index);
  const PcpConfig& config() const { return cfg_; }
  int32_t decode_threshold() const { return 1 + cfg_.num_speculative_tokens; }
  const PcpMetadata& metadata() const { return md_; }

  // Host int32 positions (within each request's scheduled tokens) of this
  // rank's local rows after the latest build: sharded, pcp_local_tokens (>= q
  // for pads; -1 for the padding decode rows of a padded decode-only step);
  // replicated, per row (-1 for padding rows).
  const std::vector<int32_t>& local_positions() const { return positions_; }
  // Host int32, the global token (query_start_loc units) of every local row,
  // -1 for padding: how a model runner gathers this rank's hidden states.
  const std::vector<int32_t>& local_token_index() const { return token_index_; }

 private:
  const PcpMetadata& build_step(const PcpBuildInputs& in, bool for_capture);
  void build_sharded(const PcpBuildInputs& in, int32_t num_decodes, int32_t num_input_tokens);
  void build_replicated(const PcpBuildInputs& in, int32_t num_input_tokens, bool spec_decode);

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
  // zero-fills the output and issues no collective. Inside a graph capture a
  // decode-only step (padded to the bucket) is recorded, the collectives inside
  // the recorded calls (docs/design/cp.md §6.6); a step with prefills, or no
  // metadata, is refused by name before anything is written. Returns output.
  const at::Tensor& forward(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                            const at::Tensor& key_cache, const at::Tensor& value_cache, const PcpMetadata* metadata,
                            const at::Tensor& output);

  const gqa::ImplConfig& config() const { return cfg_; }
  ~PcpAttentionImpl();

 private:
  void forward_sharded(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const PcpMetadata& md,
                       const at::Tensor& out);
  void forward_replicated(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const at::Tensor& key_cache, const at::Tensor& value_cache, const PcpMetadata& md,
                          const at::Tensor& out);
  void check_groups(const PcpMetadata& md) const;
  // The decodes' rows [0, rows): this rank's partial over its KV shard (merged
  // over DCP) in the wire (rows, H, D+1) fp32 of the PCP merge workspace's views `pw`
  // (docs/design/cp.md §11.5); cp::pcp_gather_merge then merges the Wp wires.
  void decode_partial(const PcpMetadata& md, const at::Tensor& q_rows, int64_t rows, const DcpViews& pw);
  // Without DCP: the kernel's out= targets redirected into the wire (its LSE column always, its
  // output columns when the query is fp32); returns whether the output went there.
  bool wire_targets(const DcpViews& v, const DcpViews& pw, at::Tensor& o, at::Tensor& l) const;
  // After the kernel: the DCP merge into the wire, or the output's cast into it when not direct.
  void wire_finish(const DcpViews& v, const DcpViews& pw, bool direct) const;
  void capture_sharded_decode(graph::GraphParams& g, const PcpMetadata& md, const at::Tensor& query,
                              const at::Tensor& key, const at::Tensor& value, const at::Tensor& output);

  gqa::ImplConfig cfg_;
  // Held weakly by the graph buckets that recorded calls reaching this object (graph::note_layer_life):
  // update / replay of such a bucket refuse it by name once the object is gone.
  std::shared_ptr<const int> life_ = std::make_shared<const int>(0);
  Comm* pcp_;
  Comm* dcp_;
  std::unique_ptr<gqa::AttentionImpl> inner_;  // replicated mode: the ordinary layer
  std::unique_ptr<GqaShardExchange> ex_;       // sharded mode: the decode's DCP leg (a group of one without DCP)
  std::shared_ptr<DcpWorkspace> merge_ws_;     // sharded decode: the PCP wire, its gather and merge (shared by shape)
  ::aar::detail::BoundNdCaches caches_;
};

// The decode rows a captured bucket's calls are refreshed from (GraphParams::update):
// sharded, one row per decode token plus the padding rows, each with its
// request's block-table row, its query end and this rank's local KV length;
// replicated, the local GQA build's (gqa::graph_step_params).
graph::StepParams graph_step_params(const PcpMetadata& md);

}  // namespace aar::cp
