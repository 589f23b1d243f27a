// The SFA metadata builder and the indexer cache group's builder. Every build is one
// host-to-device copy of a contiguous range of the lane's packed buffer (main lane and
// one lane per draft index, each with its own stamp counter); metadata tensors are
// views at addresses that depend only on their size; a rejected build writes nothing.
// Optional KV-offload builds (BuilderConfig::offload) add the offload part.
// Design: docs/design/sfa.md §3 (buffers, drafts, padding), §6.2 (offload builder).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "ascend_attn_rt/build_stamp.h"
#include "ascend_attn_rt/core/step.h"
#include "ascend_attn_rt/latent/build_inputs.h"
#include "ascend_attn_rt/plan/attention_state.h"
#include "ascend_attn_rt/plan/request_keys.h"
#include "ascend_attn_rt/plan/span.h"
#include "ascend_attn_rt/sfa/metadata.h"
#include "ascend_attn_rt/staging.h"

namespace aar::detail {
class RopeRows;
}

namespace aar::sfa {

// The KV-offload builder's settings (docs/design/sfa.md §6, "Builder"; the layer's
// side is sfa::OffloadConfig, sfa/offload.h).
struct BuilderOffloadConfig {
  // A PD decode consumer (kv consumer and not producer): the split treats
  // short extends as decodes (upstream's 1-token boundary step of a prompt is
  // a decode on a consumer only). Otherwise every build takes is_prefilling.
  bool is_decode_consumer = false;
};

// The builder core (core/step.h: capacities, block geometry, staging) and
// what the SFA builder adds. block_size: SFA's kernel block is 128
// (Backend::supported_block_sizes); any multiple of 16 in [16, 128] is
// accepted (Backend::is_builder_block_size) for tests. num_speculative_tokens:
// SpecDecoding needs n > 0 (MTP). staging_buffers are per lane; shared
// staging_hooks see lane i's host buffer j as slot i * staging_buffers + j
// (lane 0 = main, lane 1 + d = draft d).
struct BuilderConfig : core::BuilderCore {
  bool chunked_prefill_enabled = true; // attention-state derivation only
  // Graph decode padding (the MLA "enable-pad" rule, plan::SfaStepInputs::
  // pad_decode_batch): a build whose every request is a decode, with
  // num_input_tokens > its tokens, gets dummy requests of decode_threshold
  // tokens with KV length 0 and zero block-table rows after the real ones
  // (Metadata::num_kernel_reqs counts them). Together they never exceed the
  // lane's request capacity (max_num_reqs on the main lane).
  bool graph_decode_padding = false;
  // Draft lanes (build_for_drafting's draft_index in [0, num_drafts)); unset:
  // num_speculative_tokens. A draft lane takes up to max_num_reqs *
  // decode_threshold requests (upstream sizes its per-draft buffers
  // max_num_seqs * (k + 1) + 1).
  std::optional<int32_t> num_drafts;
  // RoPE tables (max_position, R), first and second halves identical (MLA half
  // layout). Any dtype with rows of a multiple of 4 bytes; kept on the host.
  at::Tensor cos_table, sin_table;
  // The KV-offload builder (docs/design/sfa.md §6): every build takes req_ids (and
  // is_prefilling unless a decode consumer), splits the batch with the
  // offload's rule, needs it decode-first (a decode after the first prefill
  // is rejected by name: plan/sfa_offload_plan.h) and fills
  // Metadata::offload. Graph mode (docs/design/sfa.md §6.6): graph_decode_padding
  // pads decode-only steps as without offload; build_for_graph_capture takes
  // decode-only batches only (a prefill is refused by name).
  std::optional<BuilderOffloadConfig> offload;
  // Decode context parallel with the replicated indexer (docs/design/sparse_cp.md §2):
  // this rank's place in the DCP group and the interleave size I (block_size % I == 0).
  // The engine's block table holds the group's local blocks (one table for the group);
  // the indexer cache has num_blocks * dcp_world_size blocks (replicated on every rank).
  // Not combinable with offload (refused by name).
  int32_t dcp_world_size = 1;
  int32_t dcp_rank = 0;
  int32_t cp_kv_cache_interleave_size = 1;
  // DSA-CP token sharding (docs/design/sparse_cp.md §4): this rank's place in the group the
  // step's tokens are split over (the TP group). Adds Metadata::dsa_cp. Not combinable with offload
  // (refused by name). With dcp_world_size > 1 (DSA-CP x DCP, docs/design/sparse_cp.md §9) both parts
  // are built, the shard planned on the global lengths; the DCP group must be this group in the same
  // order: other sizes or ranks are refused by name.
  int32_t dsa_cp_world_size = 1;
  int32_t dsa_cp_rank = 0;
  // Prefill context parallel (docs/design/sparse_cp.md §11): this rank's place in the PCP group. A build
  // then takes the GLOBAL step (the same inputs on every rank) and plans this rank's rows
  // (Metadata::pcp): the main cache is sharded over the pcp_world_size * dcp_world_size ranks like DCP's
  // (rank pcp_rank * dcp_world_size + dcp_rank, interleave cp_kv_cache_interleave_size; at most 16
  // ranks), the indexer cache replicated (num_blocks * pcp_world_size * dcp_world_size blocks).
  // Speculative decode, draft lanes (decodes, replicated rows) and decode-only graph buckets
  // (graph_decode_padding, build_for_graph_capture) work under PCP (docs/design/sparse_cp.md §11,
  // §11.1); refused by name: dsa_cp_world_size > 1, offload, and padding or capturing a step with
  // prefills (those steps are eager).
  int32_t pcp_world_size = 1;
  int32_t pcp_rank = 0;
};

// The step (core::StepInput via mla::BuildInputs). What the SFA builders
// read beyond the MLA family's:
//  * req_ids: offload builders only (refused by name otherwise): each
//    request's identity (B entries, no two equal: refused by name), which must
//    never be shared by two live requests, so not a hash (upstream's adler32
//    collides): the engine's own request numbers, or
//    MetadataBuilder::request_keys() for string ids. The resident-slot LRU
//    resets a decode row whose id changed.
//  * is_prefilling: offload builders that are not decode consumers only
//    (required there, rejected elsewhere): per request, "still prefilling its
//    prompt" (num_computed < prompt length), B entries, nonzero = true.
// draft_step is refused (the SFA drafts are build_for_drafting's lanes).
using BuildInputs = mla::BuildInputs;

// Thread safety: one thread at a time per builder (main and draft lanes included);
// builders share nothing. Layers only read the returned Metadata. (tests/cpp/test_concurrency.cpp)
class MetadataBuilder {
 public:
  explicit MetadataBuilder(const BuilderConfig& cfg);
  ~MetadataBuilder();
  MetadataBuilder(const MetadataBuilder&) = delete;
  MetadataBuilder& operator=(const MetadataBuilder&) = delete;

  const Metadata& build(const BuildInputs& in);
  using Inputs = BuildInputs;
  using Output = Metadata;
  // The states Backend::facts().capturable declares (DecodeOnly and
  // SpecDecoding; NotSupported otherwise, before anything is built); the
  // metadata carries `state`.
  const Metadata& build_for_graph_capture(const BuildInputs& in,
                                          plan::AttentionState state = plan::AttentionState::DecodeOnly);
  // A draft step's metadata in draft lane `draft_index` (see the file comment).
  const Metadata& build_for_drafting(const BuildInputs& in, int32_t draft_index);

  const BuilderConfig& config() const { return cfg_; }  // cos_table / sin_table: the host copies
  int32_t decode_threshold() const { return 1 + cfg_.num_speculative_tokens; }
  int32_t num_drafts() const { return static_cast<int32_t>(lanes_.size()) - 1; }
  const Metadata& metadata() const;                          // the main lane's latest
  const Metadata& draft_metadata(int32_t draft_index) const; // draft lane's latest
  // Host int32 (max_num_reqs, max_blocks_per_req) block table an engine may
  // keep its block table in and pass back as BuildInputs::block_table (same
  // pointer, stride max_blocks_per_req) to build(). Without separate device
  // buffers (the CPU) it is the main lane's staging rows themselves, so the
  // build copies no rows (dummy rows of graph padding are written into it after
  // the batch's rows); on the device path it is a table of its own, copied
  // into the staging buffer of the turn, so the engine may rewrite it once
  // build() returns. Passed to build_for_drafting it is copied into the draft
  // lane like any host table.
  const at::Tensor& block_table_staging() const { return staging_block_table_; }
  uint64_t generation() const;                           // the main lane's (0 before its first build)
  uint64_t draft_generation(int32_t draft_index) const;  // a draft lane's
  // String request ids -> BuildInputs::req_ids that never collide (see
  // plan/request_keys.h); one table per builder, kept across steps.
  plan::RequestKeys& request_keys() { return request_keys_; }
  // PCP (pcp_world_size > 1): the global token (query_start_loc units) of every local row of the main
  // lane's latest build, -1 for a pad row (docs/design/sparse_cp.md §11). Empty without PCP.
  const std::vector<int32_t>& pcp_local_token_index() const;

 private:
  class Lane;
  Lane& draft_lane(int32_t draft_index) const;

  BuilderConfig cfg_;
  std::unique_ptr<::aar::detail::RopeRows> rope_;
  std::vector<std::unique_ptr<Lane>> lanes_;  // [0] main, [1 + d] draft d
  at::Tensor staging_block_table_;
  plan::RequestKeys request_keys_;
};

// The indexer cache group's builder (docs/design/sfa.md §2.3: AscendSFAIndexerBackend), part
// of the "sfa" backend (its facts are Backend::facts()). The group exists so
// the KV planner allocates the indexer cache as its own tensor while sharing
// the main group's block ids; it has no metadata of its own: the three build
// entry points return null, and the indexer reads everything (block table,
// both length lists, slot mapping) from the main "*.attn" layer's
// sfa::Metadata. The step is not validated because nothing of it is read;
// build_for_graph_capture refuses the states the backend cannot capture and
// build_for_drafting a negative draft_index, as the main builder does.
class IndexerMetadataBuilder {
 public:
  // reorder_batch_threshold = None upstream.
  static std::optional<int32_t> reorder_batch_threshold() { return std::nullopt; }
  const Metadata* build(const BuildInputs&) const noexcept { return nullptr; }
  const Metadata* build_for_graph_capture(const BuildInputs& in,
                                          plan::AttentionState state = plan::AttentionState::DecodeOnly) const;
  const Metadata* build_for_drafting(const BuildInputs& in, int32_t draft_index) const;
};

}  // namespace aar::sfa
