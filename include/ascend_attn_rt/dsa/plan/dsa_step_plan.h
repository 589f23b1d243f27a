// DeepSeek-V4 ("DSA") per-step host planning, torch-free: plan_dsa_step once per step
// (validation, split, start_pos), plan_dsa_rows per ratio, plan_dsa_group per KV-cache
// group (staged table, slots, compressed rows; equal to compressor_metadata on valid
// input), the slot formats and DSpark rows. Every function validates all of its input
// first and writes nothing on error; none allocates.
// Design: docs/design/dsa.md §3.1, §3.2, §3.4; skip slots docs/design/sparse.md §7.
#pragma once

#include <cstdint>

#include "ascend_attn_rt/plan/span.h"
#include "ascend_attn_rt/plan/split.h"
#include "ascend_attn_rt/plan/step_input.h"

namespace aar::plan {

// Slot-mapping layouts of the DSA KV scatters (docs/design/dsa.md §4.1). The values are
// compressor_metadata's slot_mapping_format argument.
//   BlockOffset (A2/A3): two int32 per slot, (block, offset).
//   Flat (A5): one int32 per slot.
enum class SlotFormat : int32_t { Flat = 1, BlockOffset = 2 };

// int32 entries one slot takes in `format` (2 for BlockOffset, 1 for Flat).
int32_t slot_format_width(SlotFormat format);

// How a skipped slot ("do not write this row") is encoded in a BlockOffset
// mapping. Both encodings have block -1, the one test every consumer makes
// (Flat mappings always use -1).
//   LastOffset (-1, storage_block_size - 1): upstream HEAD's floor split of
//     slot -1 (docs/design/dsa.md §4.1), and what compressor_metadata writes for invalid
//     rows (so every compressed group's host slots use it on every plan).
//   MinusOne (-1, -1): the A5 + BF16 plan's token slot mapping (docs/design/dsa.md §4.2: the
//     PR formats with an explicit `where(slot >= 0, (slot // bs, slot % bs),
//     (-1, -1))`, no % applied to a negative slot). AttnKvPlan::block_offset_skip.
enum class BlockOffsetSkip : int32_t { LastOffset = 0, MinusOne = 1 };

// decode_threshold = 1 + num_speculative_tokens must be in [1, 16] (docs/design/dsa.md §3.1);
// returns it, or throws naming num_speculative_tokens.
inline constexpr int32_t kDsaMaxDecodeThreshold = 16;
int32_t dsa_decode_threshold(int32_t num_speculative_tokens);

// docs/design/dsa.md §2.2: the physical rows per page of a compressed cache, block_size /
// compress_ratio (block_size = the scheduler's logical block in raw tokens,
// e.g. 512 / 4 = 128, 16384 / 128 = 128); ratio 0 or 1 gives block_size.
// block_size must be a positive multiple of the ratio.
int32_t dsa_storage_block_size(int32_t block_size, int32_t compress_ratio);

// --- 1. Token slot formatting (docs/design/dsa.md §3.2, §4.1) -------------------------
//
// out receives slots.size() * slot_format_width(format) int32 values.
//   BlockOffset: a slot s >= 0 becomes (s / storage_block_size, s %
//     storage_block_size) (floor semantics; for s >= 0 that is plain division).
//   Flat: s >= 0 is copied.
// Negative slots ("do not write this token") get one explicit skip encoding:
//   BlockOffset: (-1, storage_block_size - 1), or (-1, -1) with
//   skip = MinusOne; Flat: -1.
// Why: (-1, bs-1) is what upstream's floor division gives for its only
// negative slot, -1, and what compressor_metadata writes for invalid rows, so
// the upstream scatter (which drops out-of-range linear indices) and a
// consumer that skips explicitly on block < 0 (docs/design/dsa.md §4.1's advice, what our
// scatter twins do) both skip the token. Any other negative slot (upstream
// never produces one) is canonicalised to the same encoding rather than
// floor-divided to (-2, ...) etc., so "block < 0" or "slot < 0" is the one
// test a consumer needs. Valid slots whose block (or flat slot) does not fit
// int32 are rejected.
void format_dsa_slot_mapping(CSpan<int64_t> slots, int32_t storage_block_size, SlotFormat format, Span<int32_t> out,
                             BlockOffsetSkip skip = BlockOffsetSkip::LastOffset);
void format_dsa_slot_mapping(CSpan<int32_t> slots, int32_t storage_block_size, SlotFormat format, Span<int32_t> out,
                             BlockOffsetSkip skip = BlockOffsetSkip::LastOffset);

// --- 2. Compressed-row counts (docs/design/dsa.md §3.2, §1.2) -----------------------
//
// Rows of the compressor's output for a step of num_tokens tokens over
// num_reqs requests: min(T, T / ratio + B) for ratio > 1, else T (ratio 0 and
// 1 mean "uncompressed"). Upstream's example: T=13, B=3 gives 13 / 6 / 3 for ratios
// 1 / 4 / 128. Negative arguments are rejected.
int32_t dsa_num_compressed_tokens(int32_t num_tokens, int32_t num_reqs, int32_t ratio);

// The compressed rows a request emits in one step (docs/design/dsa.md §1.2): row c covers
// raw positions [c*r, (c+1)*r) and is emitted once position (c+1)*r - 1 has
// been processed, so a step that takes the request from context_len to
// context_len + query_len raw tokens emits rows [first, first + count) with
// first = context_len / r and count = (context_len + query_len) / r -
// context_len / r. Row c's RoPE position is c * r. ratio <= 1 means r = 1 (one
// row per token, c = the token's position).
struct DsaCompressedRows {
  int32_t first = 0;
  int32_t count = 0;
};
DsaCompressedRows dsa_compressed_rows(int32_t context_len, int32_t query_len, int32_t ratio);

// --- 3 / 4 / 6. The step plan and the per-group plan -------------------------

// The step (StepInput): query_start_loc (B+1, B = the batch incl. graph
// padding), seq_lens (B, raw KV lengths S_b) and num_input_tokens (tokens the
// layers see, >= query_start_loc[B]; 0 = query_start_loc[B]; num_compressed_tokens
// of every group is counted from it) are read; the step's other fields are the
// builder's (state derivation) and not read here.
struct DsaStepInputs : StepInput {
  // Requests [num_reqs_actual, B) are graph padding (docs/design/dsa.md §3.2):
  // start_pos 0, zeroed block-table rows, no compressed rows, no DSpark
  // slots. Their lengths are only required to be >= 0 (a dummy may have
  // tokens but no KV). -1 = B (no padding).
  int32_t num_reqs_actual = -1;
  int32_t num_speculative_tokens = 0;  // k: decode_threshold = 1 + k <= 16
  int32_t max_num_reqs = 0;            // B must be <= this; 0 = unchecked
  int32_t max_num_tokens = 0;          // num_input_tokens must be <= this; 0 = unchecked
};

// The shared per-step values. It holds views of the caller's query_start_loc,
// seq_lens and start_pos buffers: they must outlive every plan_dsa_group
// call that takes this plan, unchanged.
struct DsaStepPlan {
  CSpan<int32_t> query_start_loc;  // B+1
  CSpan<int32_t> seq_lens;         // B
  CSpan<int32_t> start_pos;        // B: S_b - q_b for real requests, 0 for padding rows
  SplitResult split;               // shared split (decode-first order assumed)
  int32_t num_reqs = 0;            // B
  int32_t num_reqs_actual = 0;
  int32_t num_actual_tokens = 0;   // query_start_loc[B]
  int32_t num_input_tokens = 0;    // T
  int32_t decode_threshold = 1;
  // Over all B rows (what the kernels tile); 0 for an empty step (upstream
  // allows 0, docs/design/dsa.md §3.2).
  int32_t max_seqlen_q = 0;
  int32_t max_seqlen_kv = 0;
  bool has_prefill() const { return split.num_prefills > 0; }
};

// Validates the batch (query_start_loc of B+1 entries starting at 0 and
// non-decreasing; seq_lens >= 0, and >= the query length for real requests;
// num_reqs_actual in [0, B]; num_input_tokens >= query_start_loc[B]; the
// maxima; k in [0, 15]; room for B entries in start_pos_out), then writes
// start_pos_out[b] = S_b - q_b for b < num_reqs_actual and 0 for padding rows,
// and returns the shared plan. Nothing is written on error.
DsaStepPlan plan_dsa_step(const DsaStepInputs& in, Span<int32_t> start_pos_out);

// What a group's kernels read from its cache besides the rows the step writes
// (DsaGroupInputs::reads), per real request b with tokens in the step (one
// without queries nothing), S = seq_lens[b] and start = S - query length (row
// units: compressed rows, or raw positions for ratio <= 1):
//   WrittenRows       nothing more
//   CompressedPrefix  rows [0, S / r): the attention over a compressed KV
//                     cache (C128 reads them all, C4 any the top-k picks) and
//                     the indexer's scoring of every compressed key
//   Window            positions [max(0, start - read_window), S): the sliding
//                     window attention's keys (read_window = the attention
//                     call's ori_win_left)
//   CompressorState   when the step completes a row of the compressor
//                     (S / state_ratio > start / state_ratio), the positions
//                     [max(0, (start / state_ratio - state_coff + 1) *
//                     state_ratio), start) whose state it gathers
// plan_dsa_group checks every page column of those rows like a written one:
// inside the table row and a block id in [0, num_blocks). A kernel given an
// id past the cache would read out of bounds on the device.
enum class DsaGroupReads : int32_t { WrittenRows = 0, CompressedPrefix = 1, Window = 2, CompressorState = 3 };

struct DsaGroupInputs {
  // compress_ratio of the group's cache spec: 0 or 1 = uncompressed (SWA and
  // its state), 4, 128, ... (any r >= 1 is planned).
  int32_t compress_ratio = 1;
  // Physical rows per page of the group's storage (docs/design/dsa.md §2.2: block_size //
  // compress_ratio, 128 for every cache at cache bs 128). For ratio <= 1 this
  // is the block size itself.
  int32_t storage_block_size = 0;
  // The scheduler's logical table (docs/design/dsa.md §2.2): one entry per storage_block_size
  // * ratio raw tokens, i.e. per storage_block_size compressed rows. Row c of
  // request b lives at table[b][c / storage_block_size] * storage_block_size +
  // c % storage_block_size.
  CSpan<int32_t> block_table;  // B rows x block_table_stride
  int32_t block_table_stride = 0;
  int32_t num_blocks = 0;      // pages of the cache: ids written must be < this; 0 = unchecked
  SlotFormat slot_format = SlotFormat::BlockOffset;
  // The BlockOffset encoding of the skip rows past the emitted ones (Flat: -1).
  BlockOffsetSkip block_offset_skip = BlockOffsetSkip::LastOffset;
  // Rows of the full RoPE table of this group (compressor_metadata's
  // rope_cos): every emitted row's position c * r must be < this. 0 = unchecked.
  int64_t rope_positions = 0;
  // The rows the group's kernels read (DsaGroupReads above) and their
  // parameters: read_window >= 0 for Window; state_ratio >= 1 and state_coff
  // >= 1 for CompressorState (the state cache is uncompressed: ratio <= 1).
  DsaGroupReads reads = DsaGroupReads::WrittenRows;
  int32_t read_window = 0;
  int32_t state_ratio = 0, state_coff = 0;
};

// Caller-owned outputs. num_rows = DsaGroupPlan::num_compressed_tokens.
struct DsaGroupBuffers {
  // >= B * block_table_stride: the staged table, real rows copied and padding
  // rows zeroed. Optional (empty = not written). May alias
  // DsaGroupInputs::block_table (same stride): then only padding rows are
  // zeroed.
  Span<int32_t> block_table;
  // >= num_rows * slot_format_width(format): emitted rows' slots,
  // concatenated over requests in order, then the skip encoding
  // (DsaGroupInputs::block_offset_skip) up to num_rows. Required. The valid
  // rows are always the first num_valid_rows: a consumer that must not pass
  // skip rows to its kernel writes only that prefix.
  Span<int32_t> slot_mapping;
  // Optional, >= num_rows each (empty = not written):
  Span<int32_t> row_index;     // compressed row index c; -1 for padding rows
  Span<int32_t> row_position;  // RoPE position c * r; 0 for padding rows (the
                               // op writes cos = 1, sin = 0 there: a standard
                               // table's position 0)
  Span<int32_t> row_request;   // request b of the row; -1 for padding rows
  // Optional private scratch (>= num_rows entries; empty = none) for the
  // row-list overload: the block id of each row is kept there by the
  // validation pass, so the write pass reads it sequentially instead of
  // reading the block table a second time (one cache line, often one page,
  // per request). Its contents are unspecified afterwards.
  Span<int32_t> block_scratch;
};

struct DsaGroupPlan {
  int32_t ratio = 1;                  // max(compress_ratio, 1)
  int32_t num_compressed_tokens = 0;  // num_rows: dsa_num_compressed_tokens(T, B, ratio)
  int32_t num_valid_rows = 0;         // rows emitted by real requests (<= num_rows)
};

// The per-group half (docs/design/dsa.md §3.2, §2.2 geometry rule, 9). Validates
// the group against the step (storage_block_size > 0, ratio >= 0, stride >=
// 0, table size >= B * stride, every emitted row's column < stride and its
// block id in [0, num_blocks) (negative ids are always rejected), the same
// for every column of the rows its kernels read (DsaGroupReads), positions
// within rope_positions, flat slots within int32, room in every buffer), then
// writes. For ratio <= 1 the rows are the step's tokens, so slot_mapping
// equals format_dsa_slot_mapping of the scheduler's token slot mapping (the
// upstream SWA path), computed from the table.
//
// Where the device op would silently emit an unstorable row (a negative table
// entry, a column past the table, a position past the RoPE table: it writes
// the skip encoding and cos = 1, sin = 0), this plan raises instead: those are
// scheduler bugs that would silently lose compressed KV.
DsaGroupPlan plan_dsa_group(const DsaStepPlan& step, const DsaGroupInputs& group, const DsaGroupBuffers& buf);

// --- 4b. The emitted rows of a step at one ratio, shared by its groups --------
//
// Every group of one compress ratio emits the same rows in a step (request b,
// compressed row c: what plan_dsa_group writes to row_request / row_index);
// only the pages they land in differ. plan_dsa_rows lists them once per step
// and ratio, and plan_dsa_group's overload below takes the list instead of
// deriving it again per group: a V4 step has four ratio-1 groups (SWA and the
// three compressor states) and two of ratio 4. For ratio <= 1 the rows are
// the step's real tokens (c = the token's position).
struct DsaRowBuffers {
  Span<int32_t> request;  // >= the rows (<= num_compressed_tokens of the ratio)
  Span<int32_t> index;
};
struct DsaRows {
  int32_t ratio = 1;                  // max(ratio, 1)
  int32_t num_compressed_tokens = 0;  // dsa_num_compressed_tokens(T, B, ratio)
  int32_t max_index = -1;             // the largest row index c; -1 without rows
  CSpan<int32_t> request, index;      // the rows of the real requests, in order
};
// Validates like plan_dsa_group (a plan's request whose lengths changed since
// plan_dsa_step is rejected with the same message; room in both buffers) and
// writes the list. The result views `buf`, which must outlive its uses.
DsaRows plan_dsa_rows(const DsaStepPlan& step, int32_t ratio, const DsaRowBuffers& buf);
// The lists of several ratios (a step's 1, 4 and 128) over one validation:
// out[k] = plan_dsa_rows(step, ratios[k], bufs[k]) for every k, with every
// check (bufs.size() == ratios.size() <= out.size(), each ratio's room)
// made before the first list is written.
void plan_dsa_rows(const DsaStepPlan& step, CSpan<int32_t> ratios, CSpan<DsaRowBuffers> bufs, Span<DsaRows> out);

// plan_dsa_group over the list plan_dsa_rows made for this step at the
// group's ratio (rows.ratio must equal max(compress_ratio, 1) and
// rows.num_compressed_tokens the step's count): the same validation, errors
// and outputs as the overload above, in about a quarter of its work per row.
DsaGroupPlan plan_dsa_group(const DsaStepPlan& step, const DsaGroupInputs& group, const DsaGroupBuffers& buf,
                            const DsaRows& rows);

// --- 5. DSpark sliding-window visible slots (docs/design/dsa.md §3.4) -----------------------

// Columns of the DSpark index rows: roundup(window + num_spec, 128) when
// width == 0, else width, which must be >= window + num_spec. window >= 1,
// num_spec >= 0.
int32_t dspark_swa_width(int32_t window, int32_t num_spec, int32_t width = 0);

struct DsparkSwaInputs {
  CSpan<int32_t> query_start_loc;  // B+1
  CSpan<int32_t> seq_lens;         // B
  CSpan<int32_t> block_table;      // B rows x block_table_stride (the SWA group's table)
  int32_t block_table_stride = 0;
  int32_t block_size = 0;          // SWA page size (bs)
  int32_t num_blocks = 0;          // 0 = unchecked
  int32_t window = 128;            // W
  int32_t num_spec = 0;            // the draft block size
  int32_t width = 0;               // 0 = roundup(W + num_spec, 128)
  int32_t num_rows = 0;            // T rows written; 0 = query_start_loc[B]
  int32_t num_reqs_actual = -1;    // -1 = B; padding requests' rows are all -1
};

// docs/design/dsa.md §3.4: for request b, q_b = its query length, prefix = S_b - q_b, start
// = max(prefix - W, 0), vis = S_b - start; column j < width holds the physical
// slot of raw position start + j, table[b][p / bs] * bs + p % bs, if j < vis,
// else -1. The row is repeated q_b times (one per token, in token order),
// rows past query_start_loc[B] are -1 and the result is truncated to num_rows
// rows. out gets num_rows * width int32 (row-major [T, 1, width]); returns
// width.
// Decisions where upstream is silent: the table must cover every visible
// position (upstream clamps the column, which can only matter for a table too
// short for S_b: that is rejected, naming the request); a request whose
// visible span exceeds width (vis > width, possible only when q_b > width - W)
// is rejected rather than silently cropped; graph-padding requests (b >=
// num_reqs_actual) get -1 rows (their zeroed table would point into block 0).
int32_t build_dspark_swa_indices(const DsparkSwaInputs& in, Span<int32_t> out);

}  // namespace aar::plan
