// The DeepSeek-V4 ("DSA") metadata builders: StepBuilder once per step (split,
// start_pos, RoPE rows, the rows each ratio emits) and one GroupBuilder per KV-cache
// group (block table, slots, DSpark indices, tiling blobs), each one host-to-device
// copy into stable per-lane buffers. Batches must be decode-first; a rejected build
// writes nothing; metadata is valid until its builder's next build (build_stamp.h).
// Design: docs/design/dsa.md §3 (builders, slots, routing, DSpark, blobs, drafts); the DSA-CP
// token shard (StepBuilderConfig::dsa_cp_world_size): docs/design/sparse_cp.md §10.1; DCP
// (StepBuilderConfig::dcp_world_size): docs/design/sparse_cp.md §12.1; PCP (pcp_world_size):
// docs/design/sparse_cp.md §13.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "ascend_attn_rt/core/step.h"
#include "ascend_attn_rt/dsa/metadata.h"
#include "ascend_attn_rt/plan/attention_state.h"
#include "ascend_attn_rt/dsa/plan/dsa_backend_facts.h"
#include "ascend_attn_rt/dsa/plan/dsa_kv_plan.h"
#include "ascend_attn_rt/plan/span.h"
#include "ascend_attn_rt/staging.h"

namespace aar::detail {
class RopeRows;
}

namespace aar::dsa {

// The model's attention settings every KV-cache group of a step reads (one
// source of truth, given once to the StepBuilder). Defaults: DeepSeek-V4.
struct ModelSettings {
  int32_t head_dim = static_cast<int32_t>(kDsaHeadDim);  // D (the caches' rows; the SAS blob's head_dim)
  int32_t window = 128;  // SWA window W (ori_win_left = W - 1)
  // DSpark non-causal drafting (docs/design/dsa.md §3.4), read by the SWA group: num_spec > 0
  // builds dspark_swa_indices in steps without prefill (ori_win_left = W +
  // num_spec - 1 then). width 0 = roundup(W + num_spec, 128).
  int32_t dspark_num_spec = 0;
  int32_t dspark_width = 0;
  // SAS metadata (docs/design/dsa.md §3.5): the local query heads (0 = do not generate the
  // SAS blob) and the indexer top-k (cmp_topk of C4 layers).
  int32_t num_heads_q = 0;
  int32_t index_topk = 512;
  // The indexer (C4 layers): its query heads (the QLI blob's num_heads_q; 0 =
  // do not generate the QLI blob) and head dim Di (the indexer caches' rows).
  int32_t index_n_heads = static_cast<int32_t>(kDsaIndexerHeads);
  int32_t index_head_dim = static_cast<int32_t>(kDsaIndexerHeadDim);
};

// The step builder's part of the builder core (core/step.h): its capacities
// (max_num_reqs, max_num_tokens, num_speculative_tokens k: decode_threshold =
// 1 + k <= 16) and staging (device, separate_device_buffers: default device !=
// CPU, staging_buffers: host buffers per lane 1..4, staging_hooks: null =
// default events per lane). It has no block geometry: each GroupBuilder has its
// own (GroupConfig).
struct StepBuilderConfig : core::Capacities, core::StagingConfig {
  std::optional<int32_t> num_drafts;   // draft lanes; unset: num_speculative_tokens
  bool chunked_prefill_enabled = true; // attention-state derivation only
  // RoPE tables (max_position, R), rows of a multiple of 4 bytes (bf16 R = 64
  // for DSV4): rope_theta (required) and compress_rope_theta (required by
  // compressed groups). Kept on the host; device copies on `device`.
  at::Tensor cos_table, sin_table;
  at::Tensor compress_cos_table, compress_sin_table;
  ModelSettings model;                          // read by every GroupBuilder of this step
  // DSA-CP (docs/design/sparse_cp.md §4, §10): the size of the group the step's tokens are split
  // over (the TP group) and this rank's place in it; > 1 adds StepMetadata::dsa_cp, and every
  // group's SAS / QLI blobs and cu_seqlens tensors take the local lengths. Not combinable with
  // DSpark (dspark_num_spec) or drafting (build_for_drafting), refused by name.
  int32_t dsa_cp_world_size = 1;
  int32_t dsa_cp_rank = 0;
  // DCP (docs/design/sparse_cp.md §12): the SWA and compressed-KV caches sharded over
  // dcp_world_size ranks (interleave dcp_interleave; this rank dcp_rank); > 1 adds
  // StepMetadata::dcp and makes the SWA / C4Kv / C128Kv groups' slots this rank's local ones
  // (their block tables are the rank's local tables); the indexer and compressor-state groups
  // stay whole (global tables, every row written on every rank). Every step kind (decode,
  // speculative decode, prefill, mixed), decode buckets for graph capture (§12.5) and draft
  // lanes (§12.6) included; not combinable with DSA-CP or DSpark (refused by name).
  int32_t dcp_world_size = 1;
  int32_t dcp_rank = 0;
  int32_t dcp_interleave = 1;
  // PCP (docs/design/sparse_cp.md §13): the step given to build() is the GLOBAL step (the same on every
  // PCP rank); > 1 adds StepMetadata::pcp, this rank's rows (the decodes, its head and tail chunk of every
  // prefill) and their segments, and the attention-side groups' segment block tables
  // (GroupMetadata::pcp_block_table); the caches stay whole on every rank. A step with prefills is built
  // without graph padding; a step without (decodes; a decode bucket of build_for_graph_capture, graph padding
  // allowed; a draft step, whose requests must all be decodes) is replicated: every rank's rows are the
  // step's (StepMetadata::pcp_split). DSpark, DSA-CP and DCP with it are refused by name.
  int32_t pcp_world_size = 1;
  int32_t pcp_rank = 0;
};

// The step (core::StepInput): query_start_loc (B+1, leading 0), seq_lens (B,
// raw KV lengths), num_input_tokens (0 = query_start_loc[B]), attn_state
// (unset: derived by plan::select_attention_state with num_computed =
// start_pos, and num_spec_tokens when given). A DSA step has no block table of
// its own (each group's comes with GroupInputs), and is_prefilling / req_ids
// are not read: given, they are refused by name. B counts the graph-padding
// requests too; num_reqs_actual says which are real.
struct StepInputs : core::StepInput {
  int32_t num_reqs_actual = -1;          // -1 = B (no graph padding)
};

// Thread safety: one thread at a time per builder; builders of different engines share
// nothing. (tests/cpp/test_concurrency.cpp)
class StepBuilder {
 public:
  explicit StepBuilder(const StepBuilderConfig& cfg);
  ~StepBuilder();
  StepBuilder(const StepBuilder&) = delete;
  StepBuilder& operator=(const StepBuilder&) = delete;

  // The backend contract's builder (core/backend.h).
  using Inputs = StepInputs;
  using Output = StepMetadata;
  const StepMetadata& build(const StepInputs& in);
  // The states Backend::facts().capturable declares (DecodeOnly, SpecDecoding);
  // others are refused by name (NotSupported) before anything is built.
  const StepMetadata& build_for_graph_capture(const StepInputs& in,
                                              plan::AttentionState state = plan::AttentionState::DecodeOnly);
  // A draft step in the lane of draft_index (the main metadata stays current).
  const StepMetadata& build_for_drafting(const StepInputs& in, int32_t draft_index);

  const StepBuilderConfig& config() const { return cfg_; }
  const ModelSettings& model() const { return cfg_.model; }
  // The cache dims of the model (head_dim and index_head_dim of the settings,
  // rope_dim the RoPE tables' width): what every group's cache spec is for.
  DsaCacheDims cache_dims() const;
  int32_t decode_threshold() const { return 1 + cfg_.num_speculative_tokens; }
  int32_t num_drafts() const { return static_cast<int32_t>(lanes_.size()) - 1; }
  bool has_compress_table() const { return compress_rope_ != nullptr; }
  int64_t rope_positions() const;
  int64_t compress_rope_positions() const;  // 0 without the compress tables
  const StepMetadata& metadata() const;
  uint64_t generation() const;

 private:
  class Lane;
  Lane& lane(int32_t draft_index) const;
  StepBuilderConfig cfg_;
  std::unique_ptr<::aar::detail::RopeRows> rope_, compress_rope_;
  std::vector<std::unique_ptr<Lane>> lanes_;
};

// One KV-cache group's own cache; the settings every group shares come from
// the StepBuilder (ModelSettings), and so do the capacities and staging.
// The block geometry (core/step.h): max_blocks_per_req (block-table columns),
// num_blocks (pages of the group's cache, range checks; required) and
// block_size, the raw tokens one block-table entry covers, which the kind and
// cache_block_size decide (GroupBuilder::block_size(): cache_block_size times
// the ratio for the compressed caches, the state backends' own sizes): 0 (the
// default here) takes it, another value must equal it.
struct GroupConfig : core::BlockGeometry {
  GroupConfig() { block_size = 0; }
  DsaCacheKind kind = DsaCacheKind::Swa;
  int32_t cache_block_size = 128;  // 32, 64, 128 (docs/design/dsa.md §2.2): gives the group's block sizes and ratio
  AttnKvPlan plan;                 // slot format, cu_seqlens choices
};

struct GroupInputs {
  plan::CSpan<int32_t> block_table;  // B rows x block_table_stride, the scheduler's logical table
  int32_t block_table_stride = 0;    // <= max_blocks_per_req
};

// Thread safety: one thread at a time per builder, and not concurrently with a build of
// its StepBuilder (it reads the step's metadata): build a step's groups after the step, on
// the same thread or one handed over to.
class GroupBuilder {
 public:
  // Sizes, device, staging and the model's settings come from `step` (which
  // must outlive this).
  GroupBuilder(const StepBuilder& step, const GroupConfig& cfg);
  ~GroupBuilder();
  GroupBuilder(const GroupBuilder&) = delete;
  GroupBuilder& operator=(const GroupBuilder&) = delete;

  // `step` must be the current main-lane metadata of this builder's StepBuilder.
  const GroupMetadata& build(const StepMetadata& step, const GroupInputs& in);
  // Ratio <= 1 groups only; `step` from StepBuilder::build_for_drafting(.., draft_index).
  const GroupMetadata& build_for_drafting(const StepMetadata& step, const GroupInputs& in, int32_t draft_index);

  const GroupConfig& config() const { return cfg_; }
  const ModelSettings& model() const { return step_.model(); }
  // The group's cache for the step's model dims (StepBuilder::cache_dims()):
  // dsa_kv_cache_shape(cache_spec(), num_blocks) is the shape a layer takes.
  const DsaCacheSpec& cache_spec() const { return spec_; }
  int32_t compress_ratio() const { return spec_.compress_ratio; }
  int32_t block_size() const { return static_cast<int32_t>(spec_.block_size); }
  int32_t storage_block_size() const { return static_cast<int32_t>(spec_.storage_block_size); }
  SlotFormat slot_format() const { return slot_format_; }
  int32_t num_drafts() const { return static_cast<int32_t>(lanes_.size()) - 1; }
  const GroupMetadata& metadata() const;
  uint64_t generation() const;
  // Host int32 (max_num_reqs, max_blocks_per_req) table an engine may keep
  // this group's block table in and pass back as GroupInputs::block_table
  // (same pointer, stride max_blocks_per_req) to build(). Without separate
  // device buffers (the CPU) it is the main lane's staging rows themselves:
  // the build copies no rows (graph-padding rows are zeroed in it), and the
  // metadata's block table is a view of it. On the device path it is a table
  // of its own, copied into the staging buffer of the turn, so the engine may
  // rewrite it once build() returns. (The SFA builder's scheme.)
  const at::Tensor& block_table_staging() const { return staging_block_table_; }

 private:
  class Lane;
  at::Tensor staging_block_table_;
  const StepBuilder& step_;
  GroupConfig cfg_;
  DsaCacheSpec spec_;
  SlotFormat slot_format_ = SlotFormat::BlockOffset;
  plan::DsaGroupReads reads_ = plan::DsaGroupReads::WrittenRows;  // by kind (dsa/builder.h "Reads")
  int32_t state_ratio_ = 0;                                       // the compressor's ratio of a state group
  std::vector<std::unique_ptr<Lane>> lanes_;
};

}  // namespace aar::dsa
