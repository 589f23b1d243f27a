// GQA decode context parallelism: DcpMetadataBuilder (this rank's local slots, per-token
// decode rows, prefill context, one copy per build) and DcpAttentionImpl (KV write of
// the rank's own tokens; decodes and cached context attended on the local shard and
// merged over the group; current prefill chunks attended locally). Every rank must run
// the same layers in the same order (collectives). Refused by name: windows, sinks,
// ALiBi, soft-cap, non-decoder layers, quantised caches.
// Design: docs/design/cp.md §3-§5, graph capture docs/design/graph.md §4.4.
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

namespace aar::cp {
class GqaShardExchange;  // cpp/cp/gqa_cp_exchange.h
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
  // The P/D recompute scheduler (docs/design/cp.md §3.1 / §3.2): requests of at most the
  // decode threshold are decodes whatever is_prefilling says (a decode node
  // recomputes a transferred request's last prompt token as a decode).
  bool pd_recompute_scheduler = false;
  plan::DcpShard shard;                // world / rank / interleave (I <= B, B % I == 0)
};

// The step (core::StepInput: decode-first order, global seq_lens, the group's
// one block table; attn_state, num_spec_tokens and req_ids are not read and
// are refused by name when given) and the draft step.
struct DcpBuildInputs : core::StepInput {
  // A draft-model (MTP proposer) step d >= 0 (docs/design/cp.md §3.1, plan::draft_step_seq_lens):
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
  ~DcpAttentionImpl();

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
  void capture_decode(graph::GraphParams& g, const DcpMetadata& md, const at::Tensor& query,
                      const std::optional<at::Tensor>& key, const std::optional<at::Tensor>& value,
                      const at::Tensor& output);
  void prefill(const DcpMetadata& md, const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
               const at::Tensor& output);

  ImplConfig cfg_;
  cp::Comm& comm_;
  detail::BoundNdCaches caches_;
  // The decode exchange (query gather, the local call's arguments, exchange and
  // merge over a DcpWorkspace shared by the layers of one shape), shared with
  // sharded GQA PCP (cpp/cp/gqa_cp_exchange.h).
  std::unique_ptr<cp::GqaShardExchange> ex_;
  at::Tensor prefill_scratch_;             // fp32, grow-only: the prefill's LSEs and merged context output
};

}  // namespace aar::gqa
