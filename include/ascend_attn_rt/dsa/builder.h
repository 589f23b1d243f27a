// The DeepSeek-V4 ("DSA") metadata builders (spec sparse.md 6.5, 6.6, 6.7):
// the C++ half of AscendDSAMetadataBuilder.
//
// Upstream runs one builder per KV-cache group, and the first one to run in a
// step fills a shared per-step dict (split, seq_lens, cos/sin, SAS blobs) that
// the others reuse (spec 6.5 step 1, 11.11). Here that is explicit:
//   StepBuilder::build(step inputs)            once per step: validation, the
//       decode/prefill split, start_pos, cumsum(S), the RoPE rows of every token
//       from each RoPE table (rope_theta and compress_rope_theta), gathered on
//       the host, and the rows each V4 ratio (1, 4, 128) emits with their
//       index / position / request arrays (StepMetadata::row_arrays, shared
//       by every group of the ratio); one host-to-device copy.
//   GroupBuilder::build(step metadata, table)  once per KV-cache group (SWA,
//       C4 KV, C128 KV, C4 indexer K, the state caches): the staged block table
//       (graph-padding rows zeroed), the slot mapping (ratio <= 1: the step's
//       token slots; compressed groups: the compressed rows' slots), DSpark
//       indices; one host-to-device copy. Its row_index / row_position /
//       row_request are the step's arrays of its ratio. All planning is
//       plan::plan_dsa_step / plan_dsa_rows / plan_dsa_group
//       (plan/dsa_step_plan.h).
//
// Buffers (the core's staging allocator, docs/design/core.md): per lane one
// int32 buffer laid out by name (host staging buffers used in turn + a device
// twin; one buffer on the CPU), the per-token regions packed per step right
// before the per-request part (the block table, in a group) so a build copies
// one contiguous range; views are cached per size (and per offset for the
// packed regions), so a given step shape always gets the same addresses.
// Lanes: the main one and one per draft index (build_for_drafting), each with
// its own stamp counter. A rejected build writes nothing: the previous
// metadata stays valid.
//
// Requirements and decisions (where the spec is silent):
//  - Batches must be decode-first (a request of <= decode_threshold tokens
//    after the first prefill is rejected naming query_start_loc; engines
//    reorder with plan::reorder_decode_first at decode_threshold).
//  - build_for_graph_capture takes the states dsa::Backend::facts() declares
//    capturable, DecodeOnly and SpecDecoding (NotSupported naming any other),
//    and a batch without prefills.
//  - Graph padding: requests [num_reqs_actual, B) get start_pos 0 and zeroed
//    block-table rows (and no compressed rows, -1 DSpark rows).
//  - Drafts (spec 6.5 "Draft mode"): only groups of ratio <= 1 build for
//    drafting (NotSupported naming the cache kind otherwise); a draft group
//    build takes a draft step build of the same draft index.
//  - SAS / QLI metadata (spec 6.7): every group lane owns two (1024,) int32
//    device buffers at stable addresses. A build fills sas_metadata (the
//    operator's blob copied in, device to device, by the
//    out-forms of ops/out_variants.h) for the groups a layer
//    reads it from (spec 6.4 common(): Swa, C4Kv, C128Kv) when
//    ModelSettings::num_heads_q > 0, with the arguments of spec 6.7, through
//    the plan's metadata operator: npu_sparse_attn_sharedkv_metadata (A2/A3,
//    ops/sparse_attn_sharedkv.h), npu_kv_quant_sparse_attn_sharedkv_metadata
//    with the plan's kv_quant_mode / tile_size / rope_head_dim (A5, fp8
//    rows), or CANN's cann_ops_transformer::sparse_flash_mla_metadata (A5 +
//    BF16; schema in third_party/cann_ops_transformer_ops.txt,
//    ops/sparse_flash_mla.h) with the same spec 6.7 values mapped by the spec
//    7.2 adapter (to_sparse_flash_mla_metadata_args: seqused_kv ->
//    seqused_ori_kv, max_seqlen_kv -> max_seqlen_ori_kv, no device; for the
//    compressed groups also seqused_cmp_kv / cmp_residual_kv and
//    max_seqlen_cmp_kv = max_seqlen_kv / cmp_ratio). NOT filled
//    (sas_metadata_filled = false, the buffer keeps its old contents): the
//    state / indexer groups (no layer reads their SAS blob).
//  - SparseFlashMla lengths (spec 7.2), A5 + BF16 plan, compressed KV groups
//    (C4Kv, C128Kv): seqused_cmp_kv = S / r and cmp_residual_kv = S % r per
//    request, computed on the host (dsa::flash_mla_cmp_lengths) into the
//    group's packed buffer, so they ride the group's one host-to-device copy
//    and sit at stable addresses (GroupMetadata::seqused_cmp_kv, ...). The
//    layer passes them to both the metadata op (above) and the attention call.
//  - Skip rows (slot_mapping rows past num_valid_rows; the valid rows always
//    come first): Flat -1; BlockOffset (-1, bs-1), except on a plan with
//    block_offset_skip = MinusOne (A5 + BF16, spec 7.2) whose ratio <= 1
//    groups write (-1, -1); its compressed groups keep (-1, bs-1), the
//    encoding of the compressor_metadata rows they stand for.
//    The QLI blob (spec 6.5 step 3, 6.7) is filled by the C4 indexer-cache
//    group (kind C4IndexerK) when ModelSettings::index_n_heads > 0 (default 64):
//    npu_vllm_quant_lightning_indexer_metadata (ops/lightning_indexer.h) with
//    actual_seq_lengths_query = query_start_loc[1:], actual_seq_lengths_key =
//    seq_lens, num_heads_q = index_n_heads, num_heads_k 1, head_dim =
//    index_head_dim, quant modes 0, batch_size B, the step's max_seqlen_q/kv,
//    "TND"/"PA_BSND", sparse_count = index_topk, sparse_mode 3, pre/next
//    tokens 2^63-1, cmp_ratio 4; copied device to device into the lane's
//    stable qli_metadata buffer (qli_metadata_filled = true; the arguments are
//    recorded in GroupMetadata::qli_* so a layer can check them). Every other
//    group (and index_n_heads = 0) leaves qli_metadata_filled = false.
//    Deliberate fix of spec 11.12: the blob's ori_win_left is the attention
//    call's window (W + num_spec - 1 when DSpark is active, else W - 1) in
//    main and draft builds alike; upstream's main build passes W - 1 to the
//    metadata op but W + num_spec - 1 to the kernel.
//  - Per-step rows a graph replay reads (stable buffers, a view per size):
//    the step build negates its sin rows on the device (StepMetadata::neg_sin
//    / compress_neg_sin: the inverse RoPE's -sin); a compressed group's build
//    runs compressor_metadata_out over its staged table into the lane's
//    compressed_cos / compressed_sin / compressed_slots (spec 6.5, 9; the
//    slots equal the host plan's slot_mapping).
//  - RoPE: a group of ratio <= 1 reads the rope_theta rows, a compressed group
//    the compress_rope_theta rows (the layer's common() group decides its
//    RoPE: spec 6.4). A compressed group needs the compress tables.
//  - One source of truth for the model: the settings every group reads (the
//    window, the attention and indexer heads and dims, the top-k, DSpark) are
//    given once, to the StepBuilder (StepBuilderConfig::model); a
//    GroupBuilder takes them from its StepBuilder and only its own cache
//    (kind, cache block size, plan, table width, num_blocks) from GroupConfig.
//    The rope dim is the RoPE tables' width. The group's cache spec is for
//    these dims (GroupBuilder::cache_spec(), dsa_cache_spec), and its
//    metadata carries the window (GroupMetadata::window), which a layer
//    configured with a window of its own is checked against (dsa/impl.h).
//  - Reads (plan::DsaGroupReads): a build checks every block-table column the
//    group's kernels read, not only the ones the step writes, inside the
//    table and in [0, num_blocks): the compressed KV and indexer K groups
//    every compressed row before S / r (the attention and the indexer read
//    them all), the SWA group its window (ori_win_left positions before the
//    step's first token), the compressor state groups the positions the
//    compressor gathers when a row completes. A table that fails is refused
//    by name (block_table[b][col]=id, num_blocks) before anything is written.
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
  // DSpark non-causal drafting (spec 6.6), read by the SWA group: num_spec > 0
  // builds dspark_swa_indices in steps without prefill (ori_win_left = W +
  // num_spec - 1 then). width 0 = roundup(W + num_spec, 128).
  int32_t dspark_num_spec = 0;
  int32_t dspark_width = 0;
  // SAS metadata (spec 6.7): the local query heads (0 = do not generate the
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
  int32_t cache_block_size = 128;  // 32, 64, 128 (spec 6.2): gives the group's block sizes and ratio
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
