// DeepSeek-V4 ("DSA") attention metadata (docs/design/dsa.md §3.3, §3.1, §3.4, §3.5):
// what dsa::StepBuilder (once per step) and one dsa::GroupBuilder per KV-cache
// group (dsa/builder.h) produce, and the per-layer routing view.
//
// Every tensor is a view of its builder's persistent buffers (stable
// addresses for a given size; graph replay reads them). Host spans point into
// the builder's host staging buffer of the build's turn and are valid while
// the metadata is current (stamp). A group's metadata also reads the step's
// buffers (query_start_loc, seq_lens, start_pos, the RoPE rows): it is current
// only while both its own build and the step build it was made from are the
// latest of their builders (GroupMetadata::current()).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "ascend_attn_rt/build_stamp.h"
#include "ascend_attn_rt/core/step.h"
#include "ascend_attn_rt/plan/attention_state.h"
#include "ascend_attn_rt/dsa/plan/dsa_backend_facts.h"
#include "ascend_attn_rt/dsa/plan/dsa_kv_plan.h"
#include "ascend_attn_rt/dsa/plan/dsa_step_plan.h"
#include "ascend_attn_rt/plan/span.h"

namespace aar::dsa {

// DSA-CP token sharding of a step (docs/design/sparse_cp.md §4, §10): world_size 1 (every tensor
// undefined) without it. This rank computes every head for the tokens [local_start,
// local_start + tokens_per_rank) of the step padded to num_tokens_pad (the kernel requests'
// tokens, graph padding included); the StepMetadata's other fields stay the whole step's (the
// KV, compressor and indexer writes of every token, the global lengths).
struct DsaCpStepMetadata {
  int32_t world_size = 1;
  int32_t rank = 0;
  int32_t num_tokens_pad = 0;   // T_pad = roundup(num_input_tokens, world_size)
  int32_t tokens_per_rank = 0;  // tpr = T_pad / world_size
  int32_t local_start = 0;      // rank * tpr
  int32_t local_end = 0;        // the end of this rank's real tokens (>= local_start)
  // Maxima of the local query and KV lengths (the local SAS / QLI blobs').
  int32_t max_seqlen_q = 0, max_seqlen_kv = 0;
  int32_t num_local_tokens() const { return local_end - local_start; }
  // Device int32: the local query_start_loc (B+1, cumulative from 0), its ends (B: the QLI's
  // actual_seq_lengths_query), the KV length each request's last local query sees (B) and
  // [0, cumsum(those)] (B+1).
  at::Tensor query_start_loc, q_ends, seq_lens, cu_seqlens_kv;
  // (tpr, R) RoPE rows of the slice (position 0 in the padding) from the rope_theta table and
  // their -sin, and the same from the compress_rope_theta table (undefined without it):
  // compressed layers rotate their query with the latter, as without DSA-CP.
  at::Tensor cos, sin, neg_sin, compress_cos, compress_sin, compress_neg_sin;
  plan::CSpan<int32_t> query_start_loc_host, seq_lens_host;  // the build's turn of the staging buffer
};

// DCP of a step (docs/design/sparse_cp.md §12): world_size 1 without it. Position x of a
// request's SWA cache, and compressed row c of its compressed cache, live on rank
// owner(x) = floor(x / interleave) mod world_size at local_index(x) (cp/plan/dcp_layout.h).
struct DcpStepMetadata {
  int32_t world_size = 1;
  int32_t rank = 0;
  int32_t interleave = 1;
};
// PCP of a step (docs/design/sparse_cp.md §13): world_size 1 (every tensor undefined) without it. The step
// the builders describe is the GLOBAL one (every PCP rank builds it: the cache writes of every token); this
// rank's layer input and output are its local rows (plan_dsa_pcp_step, cp/plan/sparse_cp.h): the decode tokens,
// then per prefill its head and tail chunks (pads past the request's tokens), attended as `num_segments`
// requests of their own (a decode, a chunk's real rows, or its pads). A step without prefill (every kernel
// request a decode: a decode or draft step, graph padding allowed) is replicated instead: every rank's rows are
// the step's `num_input_tokens` rows (local_token_index 0.., -1 past num_kernel_tokens), the layer runs the
// single-rank road on them with no collective, and the groups read the global lists (StepMetadata::pcp_split).
struct PcpStepMetadata {
  int32_t world_size = 1;
  int32_t rank = 0;
  int32_t num_local_tokens = 0;  // T_loc: the rows of this rank's hidden states and output
  int32_t num_segments = 0;
  // Maxima of the segments' rows and SAS / indexer KV lengths (the SAS / QLI blobs').
  int32_t max_seqlen_q = 0, max_seqlen_kv = 0, max_indexer_seqlen_kv = 0;
  // Device int32: local_token_index (T_loc: the global token of each local row, -1 for a pad),
  // gather_index (the step's tokens: the row of each in the rank-major all-gather of the ranks' local
  // rows, Wp * T_loc rows), and per segment: query_start_loc (S+1, cumulative from 0), q_ends (S),
  // seq_lens (S: the SAS KV lengths), indexer_seq_lens (S: the QLI's, 0 for pads), cu_seqlens_kv (S+1:
  // [0, cumsum(seq_lens)]) and req (S: the segment's request, its block-table row).
  at::Tensor local_token_index, gather_index, query_start_loc, q_ends, seq_lens, indexer_seq_lens, cu_seqlens_kv,
      req;
  // (T_loc, R) RoPE rows of the local rows' positions (a pad at its request's last position) from both tables,
  // and their -sin (compress_* undefined without the compress tables).
  at::Tensor cos, sin, neg_sin, compress_cos, compress_sin, compress_neg_sin;
  plan::CSpan<int32_t> local_token_index_host, query_start_loc_host, seq_lens_host, req_host;
};

// The per-step shared values (upstream's per-step dict, docs/design/dsa.md §3.1
// ): computed once per step, read by every group of the step.
//
// The counts (core::StepCounts) have their one meaning: num_reqs the real
// requests (StepInputs::num_reqs_actual), num_kernel_reqs the B requests the
// kernels see ([num_reqs, B) are graph padding), num_actual_tokens the real
// requests' tokens (query_start_loc[num_reqs]), num_input_tokens T (>= the
// tokens of all B requests); the decode/prefill split and max_query_len /
// max_seq_len over the real requests. What the kernels take over all B
// requests is below (num_kernel_tokens, max_seqlen_q / kv, plan.split).
struct StepMetadata : core::StepCounts {
  // query_start_loc[B]: the tokens in the B requests, padding requests'
  // included (the SAS / QLI operators' T; the rows an eager forward computes).
  int32_t num_kernel_tokens = 0;
  int32_t decode_threshold = 1;    // 1 + num_speculative_tokens
  // Maxima over all B requests (what the kernels tile; the SAS / QLI metadata's).
  int32_t max_seqlen_q = 0, max_seqlen_kv = 0;
  plan::AttentionState attn_state = plan::AttentionState::DecodeOnly;
  int32_t draft_index = -1;        // -1: the main lane; d: build_for_drafting(.., d)
  // A prefill among the B requests (the kernels' split): it picks the groups'
  // cu_seqlens kinds and turns DSpark off.
  bool has_prefill() const { return plan.has_prefill(); }
  // PCP splits this step's rows over the ranks (docs/design/sparse_cp.md §13): a step with a prefill under
  // pcp_world_size > 1. Otherwise the step is every rank's whole (single-rank) step.
  bool pcp_split() const { return pcp.world_size > 1 && has_prefill(); }
  // The attention and its blobs read the rank's token slice with the local lengths: DSA-CP alone
  // (docs/design/sparse_cp.md §10). Under DSA-CP x DCP (§14) every rank attends every row of the step
  // over its KV shard with the global lengths, as DCP does; the indexer keeps the slice (dsa_cp.q_ends).
  bool dsa_cp_slice_attention() const { return dsa_cp.world_size > 1 && dcp.world_size <= 1; }

  // Device views (int32): query_start_loc (B+1), seq_lens (B), start_pos (B:
  // S_b - q_b, 0 for padding rows), cu_seqlens_kv (B+1: [0, cumsum(S)], what
  // the A5 plans pass as decode cu_seqlens_ori_kv).
  at::Tensor query_start_loc, seq_lens, start_pos, cu_seqlens_kv;
  // RoPE rows of the step's T tokens (token i of request b at position
  // start_pos[b] + i - query_start_loc[b]; padding tokens past
  // num_actual_tokens at position 0), gathered on the host from each table:
  // cos/sin from the rope_theta table (SWA layers), compress_cos/sin from the
  // compress_rope_theta table (compressed layers; undefined without one).
  at::Tensor cos, sin, compress_cos, compress_sin;
  // The full tables on the builder's device (compressor_metadata's rope_cos /
  // rope_sin for compressed rows; docs/design/dsa.md §3.1 full_compress_cos/sin).
  at::Tensor rope_cos_table, rope_sin_table, compress_cos_table, compress_sin_table;
  // -sin and -compress_sin (T, R): the inverse RoPE's rows of the attention
  // output (docs/design/dsa.md §5.2), negated on the device by the build into
  // stable buffers of the lane (a view per size), so a graph replay reads
  // the step's rows (compress_neg_sin undefined without the compress tables).
  at::Tensor neg_sin, compress_neg_sin;

  // Host copies of the lists (the build's turn of the staging buffer).
  plan::CSpan<int32_t> query_start_loc_host, seq_lens_host, start_pos_host, positions_host;
  // The plan the groups read (views of the host lists above).
  plan::DsaStepPlan plan;
  // The rows the step emits at the V4 ratios 1, 4 and 128 (plan_dsa_rows),
  // listed once per step for all groups of each ratio; rows_at(ratio) is
  // null for any other ratio. Their request / index lists view the first
  // rows of row_arrays below (the build's turn of the staging buffer).
  plan::DsaRows rows_r1, rows_r4, rows_r128;
  // The per-row arrays of those rows, one set per ratio (rows_r1's, rows_r4's,
  // rows_r128's), staged by the step build and shared by every group of the
  // ratio (GroupMetadata::row_index / row_position / row_request are these
  // views): (num_compressed_tokens(T, B, r),) int32 each, the compressed row
  // index c (-1 for padding rows), its RoPE position c * r (0 for padding
  // rows), its request (-1 for padding rows).
  struct RowArrays {
    at::Tensor index, position, request;
    plan::CSpan<int32_t> index_host, position_host, request_host;
  };
  RowArrays row_arrays[3];
  // StepBuilderConfig::dsa_cp_world_size > 1 only.
  DsaCpStepMetadata dsa_cp;
  // StepBuilderConfig::dcp_world_size > 1 only (docs/design/sparse_cp.md §12).
  DcpStepMetadata dcp;
  // StepBuilderConfig::pcp_world_size > 1 only (docs/design/sparse_cp.md §13).
  PcpStepMetadata pcp;
  // 0, 1, 2 for ratios <= 1, 4, 128; -1 for any other.
  static int ratio_slot(int32_t ratio) { return ratio <= 1 ? 0 : ratio == 4 ? 1 : ratio == 128 ? 2 : -1; }
  const plan::DsaRows* rows_at(int32_t ratio) const {
    const int k = ratio_slot(ratio);
    return k == 0 ? &rows_r1 : k == 1 ? &rows_r4 : k == 2 ? &rows_r128 : nullptr;
  }
  const RowArrays* row_arrays_at(int32_t ratio) const {
    const int k = ratio_slot(ratio);
    return k < 0 ? nullptr : &row_arrays[k];
  }
  BuildStamp stamp;
};

// One KV-cache group's metadata (docs/design/dsa.md §3.1 AscendDSAReqMetadata).
struct GroupMetadata {
  DsaCacheKind kind = DsaCacheKind::Swa;
  int32_t compress_ratio = 1;        // 1 = uncompressed (SWA and every state cache), 4, 128
  int32_t block_size = 0;            // the scheduler's logical block (raw tokens)
  int32_t storage_block_size = 0;    // physical rows per page
  SlotFormat slot_format = SlotFormat::BlockOffset;
  int32_t num_reqs = 0;         // the step's real requests (StepMetadata::num_reqs)
  int32_t num_kernel_reqs = 0;  // the step's B: the block table's rows (padding rows zeroed)
  int32_t draft_index = -1;
  int32_t num_blocks = 0;  // the group's GroupConfig::num_blocks: a layer's cache of this group needs as many
  int32_t window = 0;      // the step's ModelSettings::window (W); ori_win_left derives from it

  at::Tensor block_table;  // (B, max_blocks_per_req) int32, graph-padding rows zeroed
  // PCP (docs/design/sparse_cp.md §13), the groups whose table the attention or the indexer reads (Swa,
  // C4Kv, C128Kv, C4IndexerK): the block-table row of each of the step's PCP segments
  // (StepMetadata::pcp.req), gathered on the device; undefined otherwise.
  at::Tensor pcp_block_table;
  at::Tensor seq_lens, query_start_loc, start_pos;  // the step's
  // ratio <= 1: the formatted slots of the step's T tokens; compressed
  // groups: the slots of the compressed rows the step emits (what the device
  // path's compressor_metadata generates; the CPU path reads these), then the
  // skip encoding up to num_compressed_tokens rows (-1 Flat; BlockOffset
  // (-1, bs-1), or (-1, -1) for the ratio <= 1 groups of a plan with
  // block_offset_skip MinusOne). (rows, 2) for BlockOffset, (rows,) for Flat.
  // The first num_valid_rows rows are the valid ones, always; under DCP (docs/design/sparse_cp.md
  // §12.1) the SWA and compressed-KV groups' slots are this rank's local ones, skip rows (another
  // rank's rows) possibly among them.
  at::Tensor slot_mapping;
  int32_t num_compressed_tokens = 0;  // rows: T for ratio <= 1, min(T, T // r + B) else
  int32_t num_valid_rows = 0;         // rows emitted by real requests
  // Per row (num_compressed_tokens,) int32: compressed row index c (-1 for
  // padding rows), its RoPE position c * r (0 for padding rows), its request
  // (-1 for padding rows). The same for every group of one ratio: views of
  // the step's StepMetadata::row_arrays (the step build stages them once).
  at::Tensor row_index, row_position, row_request;
  // RoPE rows of the step's tokens from this group's table (ratio <= 1:
  // rope_theta; compressed: compress_rope_theta), and the full compress table
  // (compressed groups only; undefined otherwise).
  at::Tensor cos, sin, full_compress_cos, full_compress_sin;
  // -sin of `sin` (the step's neg_sin / compress_neg_sin).
  at::Tensor neg_sin;
  // Compressed groups (main lane): compressor_metadata's outputs for the
  // step's compressed rows (num_compressed_tokens of them; docs/design/dsa.md §3.1 "the
  // compressor metadata op generates slots on device", docs/design/ops.md §4.6), made by the
  // build through compressor_metadata_out into stable buffers of the lane:
  // cos / sin (rows, 1, 1, R) in the compress tables' dtype (identity rows
  // for invalid ones) and the slots in the group's format ((rows, 2) or
  // (rows,)). Undefined for groups of ratio <= 1.
  at::Tensor compressed_cos, compressed_sin, compressed_slots;
  // docs/design/dsa.md §3.5 blobs: (1024,) int32 device buffers at stable addresses (one pair
  // per builder lane). sas_metadata_filled / qli_metadata_filled say whether
  // this build wrote them (see dsa/builder.h).
  at::Tensor sas_metadata, qli_metadata;
  bool sas_metadata_filled = false, qli_metadata_filled = false;
  // The QLI blob's num_heads_q / head_dim / sparse_count when filled (0 otherwise).
  int32_t qli_num_heads = 0, qli_head_dim = 0, qli_sparse_count = 0;
  // The SAS metadata op's cu_seqlens_ori_kv / cu_seqlens_cmp_kv (docs/design/dsa.md §3.2
  // , per the AttnKvPlan): an empty (0,) tensor (EmptyTensor), the
  // step's query_start_loc, [0, cumsum(S)], or undefined (None).
  at::Tensor cu_seqlens_ori_kv, cu_seqlens_cmp_kv;
  CuSeqlensKv cu_seqlens_ori_kv_kind = CuSeqlensKv::None, cu_seqlens_cmp_kv_kind = CuSeqlensKv::None;
  // The SparseFlashMla plan's derived compressed lengths (docs/design/dsa.md §4.2 adapter),
  // defined on its compressed KV groups (C4Kv, C128Kv) only: (B,) int32
  // seqused_cmp_kv[b] = S_b / r and cmp_residual_kv[b] = S_b % r, staged by
  // the builder (dsa::flash_mla_cmp_lengths) in the group's buffer; and
  // max_seqlen_cmp_kv = max_seqlen_kv / r (0 elsewhere).
  at::Tensor seqused_cmp_kv, cmp_residual_kv;
  int32_t max_seqlen_cmp_kv = 0;
  // The in-place scatter plan (A5 + BF16) on its SWA and compressed KV groups: (1, 2) int32, a
  // (block, offset) no valid row of this build writes. A graph replay writes all of a group's rows
  // (docs/design/dsa.md §6): the skip rows go there, carrying that slot's current row. Undefined
  // on the other plans and groups.
  at::Tensor graph_fill_slot;
  // DSpark (docs/design/dsa.md §3.4): (T, 1, width) physical slots, defined on SWA groups
  // configured non-causal (dspark_num_spec > 0) in steps without prefill.
  at::Tensor dspark_swa_indices;
  // DCP (StepBuilderConfig::dcp_world_size > 1; docs/design/sparse_cp.md §12.2), staged once per
  // step by the group build (dsa/plan/dsa_dcp_plan.h) and read by every layer as they are; undefined
  // otherwise. Swa groups: dcp_ori_indices (T, 1, window) int32, each query row's window slots this
  // rank owns (physical slots of the local table, position order, then -1). C4Kv / C128Kv groups:
  // dcp_cmp_limit (T, 1) int32, each row's compressed-row limit floor((p + 1) / r). Rows of no
  // request: all -1 / 0.
  at::Tensor dcp_ori_indices, dcp_cmp_limit;
  int32_t ori_win_left = 0, ori_win_right = 0;  // the attention call's window
  int32_t max_seqlen_q = 0, max_seqlen_kv = 0;

  // Host lists (the build's turn of the staging buffer).
  plan::CSpan<int32_t> block_table_host;  // B * max_blocks_per_req
  plan::CSpan<int32_t> slot_mapping_host, row_index_host, row_position_host, row_request_host, dspark_host;
  plan::CSpan<int32_t> seqused_cmp_kv_host, cmp_residual_kv_host;  // empty unless seqused_cmp_kv is defined
  int32_t block_table_stride = 0;
  int32_t dspark_width = 0;

  BuildStamp stamp, step_stamp;
  bool current() const { return stamp.current() && step_stamp.current(); }
};

// Throws InvalidArgument naming `what` when the group's metadata or the step
// build it reads is stale.
void check_current(const GroupMetadata& g, const char* what);

// docs/design/dsa.md §3.3: the groups one attention layer reads. swa always; ratio > 1:
// attention (the compressed KV group) and compressor_state; ratio 4: also
// indexer_cache and indexer_state. common() = attention if present, else swa.
struct LayerMetadata {
  int32_t compress_ratio = 1;
  const StepMetadata* step = nullptr;
  const GroupMetadata* swa = nullptr;
  const GroupMetadata* attention = nullptr;
  const GroupMetadata* compressor_state = nullptr;
  const GroupMetadata* indexer_cache = nullptr;
  const GroupMetadata* indexer_state = nullptr;
  const GroupMetadata& common() const { return attention != nullptr ? *attention : *swa; }
};

// Builds the routing of a layer of compress_ratio (1, 4, 128: check_compress_ratio) and checks it:
// every group the ratio needs is given, no other one is (a ratio-128 layer
// given an indexer is a wiring bug), each has the expected cache kind (swa:
// Swa; attention: C4Kv / C128Kv by ratio; compressor_state: C4AttnState /
// C128State; indexer_cache: C4IndexerK; indexer_state: C4IndexerState), and
// all are current and built from `step`. InvalidArgument naming the slot.
LayerMetadata route_layer(int32_t compress_ratio, const StepMetadata& step, const GroupMetadata* swa,
                          const GroupMetadata* attention = nullptr, const GroupMetadata* compressor_state = nullptr,
                          const GroupMetadata* indexer_cache = nullptr, const GroupMetadata* indexer_state = nullptr);

// The same routing with the groups picked by cache kind from a step's group
// builds in any order (an engine passes all of its groups to every layer; the
// ones the layer does not read are ignored), then checked as above. A kind the
// layer reads that is missing, or given twice (which one would be ambiguous),
// is InvalidArgument naming it; a null entry is InvalidArgument naming its
// index.
LayerMetadata route_layer(int32_t compress_ratio, const StepMetadata& step, plan::CSpan<const GroupMetadata*> groups);

}  // namespace aar::dsa
