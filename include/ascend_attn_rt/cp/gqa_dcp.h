// GQA decode context parallel (spec cp.md 3, 4, 5.1): the KV cache is sharded
// along the sequence over the DCP group (plan/dcp_layout.h); every rank runs
// the whole batch, writes only the tokens it owns, and attends its local shard.
//
// DcpMetadataBuilder: plan::build_dcp_step into persistent buffers (the used
// part of each staging region copied once per build on the device path,
// staging.h), giving DcpMetadata: a gqa::Metadata (the fields the layer
// checks) plus the DCP parts. DcpAttentionImpl::forward, per layer:
//   1. KV write of this rank's own tokens (local slots, -1 elsewhere);
//   2. decodes: query heads all-gathered over the group, FIA over the local
//      paged shard with one query row per decode token and that token's local
//      KV length (plan/dcp_step_plan.h: the interleave-aware causal mask of
//      speculative decode without a mask tensor), LSE returned, partials
//      exchanged and merged (comm/dcp_exchange.h);
//   3. prefills: causal FIA over the step's own K/V (every rank has all of
//      them; no communication), and, when some prefill request has cached
//      context (a batch-global fact), the gathered query against this rank's
//      local context through the paged cache (non-causal: every cached token
//      precedes the chunk), exchanged and merged across ranks, then merged with
//      the current-chunk result on the rows of requests with context only.
//   Fresh prefills (no context anywhere) issue no collective.
//
// Decisions where the spec is silent:
// - Head layout. Every rank of the group holds the same num_kv_heads KV heads;
//   rank rd's local query head h is global head rd*H + h and uses KV head
//   h / (H / Hkv) (upstream's constraints make Hkv = 1 per rank; this is the
//   same rule for any Hkv). FIA maps gathered head g to KV head g / (W*H/Hkv),
//   so with Hkv > 1 the gathered heads are regrouped KV-head-major before the
//   call and back after it (two copies; none when Hkv == 1 or W == 1).
// - The context is read through the paged cache with per-request local
//   lengths (FIA with a block table) instead of upstream's copy into
//   contiguous K/V: the same keys, no extra memory. A rank with no local
//   context skips the kernel (partial O = 0, LSE = -inf) but still exchanges.
// - Graph capture (graph/graph_params.h) of decode-only batches padded to the
//   bucket (num_input_tokens = bucket): the decode rows are padded to the
//   bucket with rows of KV length 0 (block-table row 0), so the fused call's
//   query has the bucket's rows at every step; a capture records the KV write,
//   the query gather (prepare), the local paged call (refreshed per step from
//   dcp_graph_step_params: block table, query ends, local KV lengths) and the
//   exchange + merge (prepare). The intermediates are a shared DcpWorkspace's
//   (comm/dcp_exchange.h), at stable addresses. On the NPU the prepare work, collectives
//   included, is captured into the device graph; the CPU recording provider
//   runs it in order at replay. Padded rows merge to 0 (their partials are
//   empty on every rank) and land in output rows no caller reads. Steps with
//   prefills are refused in a capture (NotSupported), as is a capture with a
//   KV connector set (kv_connector.h).
// - KV-connector hooks (kv_connector.h) around every eager forward, with the
//   DcpMetadata as the layer metadata; `wrote` is whether this call wrote the
//   cache (key given, not a KV-sharing layer), on every rank alike, even when
//   this rank owns none of the step's tokens.
// - Not supported, rejected by name: sliding windows, sinks, ALiBi, soft-cap,
//   non-decoder layers, quantised caches, non-causal metadata.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "ascend_attn_rt/build_stamp.h"
#include "ascend_attn_rt/core/backend.h"
#include "ascend_attn_rt/core/step.h"
#include "ascend_attn_rt/comm/comm.h"
#include "ascend_attn_rt/comm/dcp_exchange.h"
#include "ascend_attn_rt/gqa/impl.h"
#include "ascend_attn_rt/gqa/mask.h"
#include "ascend_attn_rt/gqa/metadata.h"
#include "ascend_attn_rt/kv_connector.h"
#include "ascend_attn_rt/ops/fused_infer_attention.h"
#include "ascend_attn_rt/cp/plan/dcp_layout.h"
#include "ascend_attn_rt/plan/span.h"
#include "ascend_attn_rt/staging.h"

namespace aar::detail {
class StagingBuffers;
}

namespace aar::graph {
class GraphParams;
}

namespace aar::gqa {

// The backend's declared facts (core/backend.h), registered as "gqa_dcp".
struct DcpBackend {
  static core::BackendFacts facts();
};

// A gqa::Metadata (so the layer's shared GQA input checks take it as it is)
// whose counts (core::StepCounts) keep their one meaning: num_reqs the B
// scheduled requests, num_kernel_reqs B plus the padding decode rows of a
// graph bucket (each a one-token dummy without KV), num_actual_tokens the
// tokens written, num_input_tokens the rows the layer receives, and the
// decode/prefill split. Of the GQA fields the layer reads block_size,
// num_blocks, slot_mapping (this rank's local slots), attn_mask (the causal
// mask of the current-chunk pass) and stamp. attn_state is ChunkedPrefill,
// or the state build_for_graph_capture was given (nothing reads it). The GQA
// request fields (query_start_loc, seq_lens, block_tables, the length lists)
// stay empty: hand it to DcpAttentionImpl and dcp_graph_step_params only (C++
// would also take it where a plain GQA Metadata goes, and read an empty step).
struct DcpMetadata : Metadata {
  plan::DcpShard shard;
  // Decode rows, one per decode token (plan::build_dcp_step), then, in a
  // decode-only step padded to num_input_tokens (graph buckets), padding rows
  // of KV length 0 up to decode_kernel_rows.
  int32_t decode_kernel_rows = 0;           // num_decode_tokens, or num_input_tokens when padded
  at::Tensor decode_block_tables;           // device int32 (decode_kernel_rows, max_blocks)
  c10::IntArrayRef decode_q_ends;           // 1..decode_kernel_rows
  c10::IntArrayRef decode_kv_lens;          // local KV length per decode row
  // Prefill requests.
  at::Tensor prefill_block_tables;          // device int32 (num_prefills, max_blocks)
  c10::IntArrayRef prefill_q_ends;          // cumulative, from 0
  c10::IntArrayRef prefill_context_lens;    // local cached context per request
  bool has_context = false;                 // batch-global: some prefill has cached context
  int64_t local_context_tokens = 0;         // this rank's share of it
  at::Tensor context_token_idx;             // device int64 (num_context_rows): prefill rows with context
  int32_t num_local_writes = 0;
  // A draft-model step (DcpBuildInputs::draft_step): its index d, -1 otherwise.
  // Its decode_kv_lens are upstream's draft_cp_seq_len (local_len(base + d + 1, rank)).
  int32_t draft_step = -1;
};

// The builder core (core/step.h: capacities, block geometry, staging) and
// what DCP adds.
struct DcpBuilderConfig : core::BuilderCore {
  // The P/D recompute scheduler (spec 3.1 / 3.2): requests of at most the
  // decode threshold are decodes whatever is_prefilling says (a decode node
  // recomputes a transferred request's last prompt token as a decode).
  bool pd_recompute_scheduler = false;
  plan::DcpShard shard;                // world / rank / interleave (I <= B, B % I == 0)
};

// The step (core::StepInput: decode-first order, global seq_lens, the group's
// one block table; attn_state, num_spec_tokens and req_ids are not read and
// are refused by name when given) and the draft step.
struct DcpBuildInputs : core::StepInput {
  // A draft-model (MTP proposer) step d >= 0 (spec 3.1, plan::draft_step_seq_lens):
  // seq_lens are then the requests' base lengths, every request has one query
  // token at position base + d (query_start_loc 0, 1, ..., B) and is a decode
  // (is_prefilling is not read); -1: a normal step.
  int32_t draft_step = -1;
};

// Thread safety: as gqa::MetadataBuilder: one thread at a time per builder.
class DcpMetadataBuilder {
 public:
  explicit DcpMetadataBuilder(const DcpBuilderConfig& cfg);
  ~DcpMetadataBuilder();
  DcpMetadataBuilder(const DcpMetadataBuilder&) = delete;
  DcpMetadataBuilder& operator=(const DcpMetadataBuilder&) = delete;

  const DcpMetadata& build(const DcpBuildInputs& in);
  using Inputs = DcpBuildInputs;
  using Output = DcpMetadata;
  // The states DcpBackend::facts().capturable declares (DecodeOnly,
  // SpecDecoding: the decode-only batches padded to a bucket that
  // DcpAttentionImpl captures); others are refused by name before anything is
  // built. The metadata's attn_state is `state`.
  const DcpMetadata& build_for_graph_capture(const DcpBuildInputs& in,
                                             plan::AttentionState state = plan::AttentionState::DecodeOnly);
  // A draft model's step: build() (no draft lanes; the previous metadata
  // becomes stale). Its seq_lens are the draft step's own lengths, as vLLM
  // passes them; a step built from base lengths sets in.draft_step instead,
  // which must then equal draft_index.
  const DcpMetadata& build_for_drafting(const DcpBuildInputs& in, int32_t draft_index);
  const DcpBuilderConfig& config() const { return cfg_; }
  int32_t decode_threshold() const { return 1 + cfg_.num_speculative_tokens; }
  const DcpMetadata& metadata() const { return md_; }

 private:
  struct Staging;  // the staging buffer's regions and their cached views

  DcpBuilderConfig cfg_;
  bool separate_;
  MaskBuilder masks_;
  DcpMetadata md_;
  detail::BuildCounter counter_;
  // Regions [slots | decode block table | prefill block table]; the context
  // rows are int64 (the index kernels' type) in a buffer of their own.
  std::unique_ptr<detail::StagingBuffers> buffers_;
  std::unique_ptr<Staging> st_;
  at::Tensor ctx_idx_host_, ctx_idx_dev_;
  std::vector<int32_t> ctx_idx32_;
  std::vector<int64_t> dq_, dkv_, pq_, pctx_;
  std::vector<int32_t> draft_seq_;  // a draft step's lengths (base + d + 1)
};

// Thread safety: one thread at a time per layer; layers of one rank run in order, as
// their collectives must be issued in the same order on every rank (comm/comm.h).
class DcpAttentionImpl {
 public:
  // KV-connector hooks of this layer (kv_connector.h); none by default.
  KvHooks kv_hooks;

  // `comm` is the DCP group (its size and rank must match the metadata's
  // shard); it must outlive the layer.
  DcpAttentionImpl(const ImplConfig& cfg, cp::Comm& comm);

  // query (T, H, D); key/value (T, Hkv, D); caches (num_blocks, B, Hkv, D)
  // contiguous; output (T, H, D), rows [0, num_actual_tokens) written.
  // metadata == nullptr (profiling run) zero-fills the output and issues no
  // collective (every rank of the group runs it alike); refused inside a graph
  // capture. Returns output.
  const at::Tensor& forward(const at::Tensor& query, const std::optional<at::Tensor>& key,
                            const std::optional<at::Tensor>& value, const at::Tensor& key_cache,
                            const at::Tensor& value_cache, const DcpMetadata* metadata, const at::Tensor& output);

  const ImplConfig& config() const { return cfg_; }
  cp::Comm& comm() { return comm_; }

 private:
  void decode(const DcpMetadata& md, const at::Tensor& query, const at::Tensor& output);
  // The decode's three stages over workspace views of T rows: the gathered
  // query (regrouped KV-head-major when needed) and the fused call's
  // arguments; then the exchange and merge into out_rows (and the merged LSE
  // into lse_rows when given). The prefill's context pass uses them too.
  const cp::DcpViews& decode_views(int64_t T, const at::Tensor& query);
  void stage_query(const cp::DcpViews& v, const at::Tensor& q_rows);
  // The local paged call of T gathered rows (the decode rows, or the prefill's
  // context pass) over the workspace's views: its arguments, out and lse.
  void fill_partial_call(const cp::DcpViews& v, const at::Tensor& block_table, c10::IntArrayRef q_ends,
                         c10::IntArrayRef kv_lens, int64_t block_size, ops::FiaTensors& t, ops::FiaParams& p,
                         at::Tensor& out, at::Tensor& lse) const;
  void combine(const cp::DcpViews& v, const at::Tensor& out_rows,
               const std::optional<at::Tensor>& lse_rows = std::nullopt);
  void capture_decode(graph::GraphParams& g, const DcpMetadata& md, const at::Tensor& query,
                      const std::optional<at::Tensor>& key, const std::optional<at::Tensor>& value,
                      const at::Tensor& output);
  void prefill(const DcpMetadata& md, const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
               const at::Tensor& output);

  ImplConfig cfg_;
  cp::Comm& comm_;
  detail::BoundNdCaches caches_;
  std::shared_ptr<cp::DcpWorkspace> ws_;  // shared by the layers of one shape
  at::Tensor prefill_scratch_;             // fp32, grow-only: the prefill's LSEs and merged context output
};

}  // namespace aar::gqa
