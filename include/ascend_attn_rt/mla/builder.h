// The MLA metadata builder: validates and plans a step in pure C++, gathers the RoPE
// rows on the host, and copies into persistent buffers at stable addresses (one copy
// for a decode-only step, three with prefills); views cached per size; a rejected
// build writes nothing; metadata valid until the next build (build_stamp.h). Graph
// decode padding, DCP and PCP builds per BuilderConfig.
// Design: docs/design/mla.md §3, DCP §6.1, PCP docs/design/cp.md §11, staging docs/design/core.md §4.
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
#include "ascend_attn_rt/mla/metadata.h"
#include "ascend_attn_rt/mla/plan/mla_pcp_plan.h"
#include "ascend_attn_rt/plan/span.h"
#include "ascend_attn_rt/staging.h"

namespace aar::detail {
class StagingBuffers;
class RopeRows;
}

namespace aar::mla {

// The builder core (core/step.h: capacities, block geometry, staging) and
// what the MLA builder adds.
struct BuilderConfig : core::BuilderCore {
  int32_t max_model_len = 0;           // 0 = max_blocks_per_req * block_size
  bool chunked_prefill_enabled = true;
  // Graph decode padding (docs/design/mla.md §3.5 "enable-pad"; for MLA decode graph buckets):
  // a decode-only build with num_input_tokens > its tokens pads the decode
  // metadata to the bucket with dummy requests of decode_threshold tokens (KV
  // length 0, zero block-table rows written into the staging rows after the
  // real ones, RoPE position 0); DecodeMetadata::num_kernel_* give the padded
  // counts. The decode then runs over the padded rows (their output is 0).
  bool graph_decode_padding = false;
  // With graph_decode_padding: docs/design/mla.md §3.5 "disable-pad" mode (full-graph MTP with
  // the padded drafter batch disabled) instead: the bucket's num_input_tokens
  // become both the kernels' requests and tokens, the query ends extended by
  // round-half-even interpolation (plan::pad_actual_q_disable_mode).
  bool disable_padded_drafter_batch = false;
  // 0 = the upstream workspace rule (plan::chunked_prefill_workspace_size).
  int64_t workspace_tokens = 0;
  // RoPE tables (max_position, R), first and second halves identical (docs/design/mla.md §1.3).
  // Any dtype with rows of a multiple of 4 bytes; the builder keeps a host copy
  // (the rows are gathered on the host).
  at::Tensor cos_table, sin_table;
  // Decode context parallel (docs/design/mla.md §6, AscendMlaDCPMetadataBuilder): this rank's
  // place in the DCP group and the interleave size I (block_size % I == 0).
  // With dcp_world_size > 1 the builds are this rank's (plan::MlaStepInputs::dcp:
  // local slots and KV lengths, the DCP context chunks; graph decode padding's
  // dummy requests get local KV length 0). With num_speculative_tokens > 0 the
  // decode metadata has one row per decode token (docs/design/cp.md §3.3 as per-row
  // local KV lengths, plan/mla_plan.h): DecodeMetadata's num_kernel_reqs ==
  // num_kernel_tokens, block_table / seq_lens_list per token.
  int32_t dcp_world_size = 1;
  int32_t dcp_rank = 0;
  int32_t cp_kv_cache_interleave_size = 1;
  // Prefill context parallel, the sharded design (docs/design/cp.md §11): this rank's place in
  // the PCP group. With pcp_world_size > 1 a build takes the GLOBAL batch (the same inputs on
  // every rank) and plans this rank's rows (Metadata::pcp): the decodes (replicated) and the
  // head and tail chunks of every prefill; the KV is sharded over the pcp_world_size *
  // dcp_world_size ranks (rank pcp_rank * dcp_world_size + dcp_rank) with the interleave size
  // above. Speculative decode and decode-only graph buckets (graph_decode_padding, docs/design/cp.md §11.4)
  // work with PCP; refused by name: disable_padded_drafter_batch, and padding or capturing a
  // step with prefills (those steps are eager). Wp * Wd <= 16.
  int32_t pcp_world_size = 1;
  int32_t pcp_rank = 0;
  // The P/D recompute scheduler (docs/design/cp.md §3.1 / §3.2): under DCP, requests of
  // at most the decode threshold are decodes whatever is_prefilling says (as
  // they are without DCP).
  bool pd_recompute_scheduler = false;
};

// Thread safety: one thread at a time per builder; builders share nothing, so engines on
// several threads each keep their own. Layers only read the returned Metadata. (tests/cpp/test_concurrency.cpp)
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
  // SpecDecoding): build(in), the metadata carrying `state`; other states are
  // refused by name (NotSupported) before anything is built.
  const Metadata& build_for_graph_capture(const BuildInputs& in,
                                          plan::AttentionState state = plan::AttentionState::DecodeOnly);
  // A draft model's step (draft_index >= 0): build(in). The builder keeps no
  // draft lanes, so the previous metadata becomes stale; the DCP draft-step
  // lengths rule stays BuildInputs::draft_step, as in build().
  const Metadata& build_for_drafting(const BuildInputs& in, int32_t draft_index);

  const BuilderConfig& config() const { return cfg_; }
  int32_t decode_threshold() const { return 1 + cfg_.num_speculative_tokens; }
  int64_t workspace_tokens() const { return workspace_; }
  const Metadata& metadata() const { return md_; }
  // Host int32 (max_num_reqs, max_blocks_per_req) block table an engine may
  // keep its block table in and pass back as BuildInputs::block_table (same
  // pointer, stride max_blocks_per_req). Without separate device buffers (the
  // CPU) it is the staging buffer itself and the build copies no block-table
  // rows (prefill rows are still copied to their own fixed-address region); on
  // the device path it is a table of its own, copied into the staging buffer of
  // the turn, so the engine may rewrite it once build() returns.
  const at::Tensor& block_table_staging() const { return staging_block_table_; }
  // Generation of the latest build (0 before the first).
  uint64_t generation() const { return counter_.current(); }
  // PCP (pcp_world_size > 1): host int32, the global token (query_start_loc units) of every
  // local row of the latest build, -1 for padding rows: how a model runner gathers this rank's
  // hidden states (and puts its output rows back). Empty without PCP.
  const std::vector<int32_t>& pcp_local_token_index() const { return pcp_token_index_; }

 private:
  struct Staging;  // the staging buffer's named regions and their cached views

  void gather_rope(uint8_t* staging, const BuildInputs& in, int32_t num_decodes, int32_t num_decode_tokens,
                   int32_t num_prefill_tokens);
  // PCP: this rank's rows of the planned global step (plan/mla_pcp_plan.h) into the staging
  // buffer and the host lists; returns the first staging word of the step's PCP lists.
  int64_t plan_pcp_rows(int32_t* staging, const BuildInputs& in, int32_t num_decodes, int32_t num_tokens,
                        plan::MlaPcpSizes& sizes);
  void set_pcp_metadata(const plan::MlaPcpSizes& sizes);
  at::Tensor rope_view(int64_t offset, int64_t rows) const;

  BuilderConfig cfg_;  // cos_table / sin_table: contiguous host copies
  bool separate_ = false;
  int64_t workspace_ = 0;
  std::unique_ptr<::aar::detail::RopeRows> rope_;  // the host tables and the row gather (cpp/common/rope_gather.h)
  Metadata md_;
  ::aar::detail::BuildCounter counter_;
  // Packed int32 regions (core::StagingLayout, each on a 64-byte boundary):
  // [qsl | slot64 | decode cos | decode sin | block table (all rows) | chunk
  // cu_seq_lens | chunk starts | chunk lens | padded chunk lens | prefill block
  // table | prefill cos | prefill sin | DCP per-token decode rows | PCP lists]. A
  // decode-only build copies up to the last decode row.
  std::unique_ptr<::aar::detail::StagingBuffers> buffers_;
  at::Tensor device_;  // buffers_->device()
  at::Tensor staging_block_table_;
  // Token positions (host only: the rows are gathered on the host).
  std::vector<int32_t> decode_positions_, prefill_positions_;
  std::vector<int64_t> q_ends_, kv_lens_, prefill_q_ends_;
  std::vector<int64_t> chunk_kv_ends_, seq_tot_, max_seq_;
  // DCP: local gathered rows per chunk, the reorg rows (grown to the largest
  // total context seen; the device copy is a tensor of its own) and the scratch
  // of plan_mla_step.
  std::vector<int64_t> local_seq_tot_, reorg_index_, reorg_offsets_;
  at::Tensor reorg_device_;
  std::vector<int32_t> dcp_block_lens_;
  std::vector<uint8_t> dcp_is_prefilling_;
  std::vector<int32_t> draft_seq_;  // a draft step's lengths (base + d + 1)
  // DCP with speculative decode: the per-token decode rows (their block table
  // is the staging region "dcp_decode_block_table").
  std::vector<int64_t> dcp_q_ends_, dcp_kv_lens_;
  // The KV shard: Wp * Wd ranks, this one rp * Wd + rd (DCP alone: Wd, rd).
  int32_t kv_world_ = 1, kv_rank_ = 0;
  // PCP: the global step's per-token plan (slots, prefill positions and query ends), the
  // rank's host lists and scratch (sized at construction), the local token index.
  std::vector<int64_t> pcp_global_slots_, pcp_global_q_ends_;
  std::vector<int32_t> pcp_global_positions_, pcp_query_lens_, pcp_local_lens_, pcp_positions_, pcp_token_rows_,
      pcp_restore_inverse_, pcp_token_index_;
  std::vector<int64_t> pcp_mask_ends_, pcp_head_ends_, pcp_tail_ends_;
  std::unique_ptr<Staging> st_;
};

}  // namespace aar::mla
