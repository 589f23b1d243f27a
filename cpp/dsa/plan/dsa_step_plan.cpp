// DeepSeek-V4 DSA per-step planning (docs/design/dsa.md §3.1, §3.4, §1.2, §2.2, §4.1, docs/design/ops.md §4.6).
// See the header for the contract; every function validates completely before
// its first write.
#include "ascend_attn_rt/dsa/plan/dsa_step_plan.h"

#include <algorithm>
#include <cstddef>
#include <limits>
#include <string>
#include <type_traits>

#include "../../plan/cpu_features.h"
#include "ascend_attn_rt/errors.h"
#include "ascend_attn_rt/plan/seq_lens.h"

#if AAR_HAVE_X86_DISPATCH
#include <immintrin.h>
#endif
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace aar::plan {

namespace {

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

void check_format(SlotFormat f) {
  AAR_CHECK_ARG(f == SlotFormat::Flat || f == SlotFormat::BlockOffset, "slot_format=", static_cast<int32_t>(f),
                " is not a SlotFormat (1 = Flat, 2 = BlockOffset)");
}

// Writes the encoding of one slot (block, offset) / flat; block < 0 = skip.
inline void put_slot(int32_t* out, std::size_t row, SlotFormat f, int32_t block, int32_t offset, int32_t bs) {
  if (f == SlotFormat::BlockOffset) {
    if (block < 0) {
      out[2 * row] = -1;
      out[2 * row + 1] = bs - 1;
    } else {
      out[2 * row] = block;
      out[2 * row + 1] = offset;
    }
  } else {
    out[row] = block < 0 ? -1 : block * bs + offset;
  }
}

// The skip encoding of one row: block -1 and the plan's offset (BlockOffset), or -1 (Flat).
inline void put_skip(int32_t* out, std::size_t row, SlotFormat f, int32_t skip_offset) {
  if (f == SlotFormat::BlockOffset) {
    out[2 * row] = -1;
    out[2 * row + 1] = skip_offset;
  } else {
    out[row] = -1;
  }
}

void check_skip(BlockOffsetSkip s) {
  AAR_CHECK_ARG(s == BlockOffsetSkip::LastOffset || s == BlockOffsetSkip::MinusOne, "block_offset_skip=",
                static_cast<int32_t>(s), " is not a BlockOffsetSkip (0 = LastOffset, 1 = MinusOne)");
}

// docs/design/dsa.md §4.1 (-1, bs-1) or docs/design/dsa.md §4.2 (-1, -1).
inline int32_t skip_offset(BlockOffsetSkip s, int32_t bs) { return s == BlockOffsetSkip::MinusOne ? -1 : bs - 1; }

template <typename T>
void format_slots_impl(CSpan<T> slots, int32_t bs, SlotFormat format, Span<int32_t> out, BlockOffsetSkip skip) {
  check_format(format);
  check_skip(skip);
  AAR_CHECK_ARG(bs > 0, "storage_block_size=", bs, " must be positive");
  const std::size_t w = static_cast<std::size_t>(slot_format_width(format));
  AAR_CHECK_ARG(out.size() >= slots.size() * w, "out has room for ", out.size(), " int32 values, needs ",
                slots.size() * w, " (", slots.size(), " slots, format width ", w, ")");
  // Largest slot whose encoding fits int32: flat must itself fit; block/offset
  // needs slot / bs to fit.
  const int64_t max_slot =
      format == SlotFormat::Flat ? kInt32Max : kInt32Max * static_cast<int64_t>(bs) + (bs - 1);
  for (std::size_t i = 0; i < slots.size(); ++i) {
    AAR_CHECK_ARG(static_cast<int64_t>(slots[i]) <= max_slot, "slots[", i, "]=", static_cast<int64_t>(slots[i]),
                  " does not fit the int32 ", format == SlotFormat::Flat ? "flat slot" : "block id",
                  " (storage_block_size=", bs, ")");
  }
  for (std::size_t i = 0; i < slots.size(); ++i) {
    const int64_t s = slots[i];
    if (s < 0) {
      put_skip(out.data(), i, format, skip_offset(skip, bs));
    } else if (format == SlotFormat::Flat) {
      out[i] = static_cast<int32_t>(s);
    } else {
      out[2 * i] = static_cast<int32_t>(s / bs);
      out[2 * i + 1] = static_cast<int32_t>(s % bs);
    }
  }
}

// The batch checks shared by plan_dsa_step and build_dspark_swa_indices.
// Returns num_reqs_actual resolved.
int32_t check_batch(CSpan<int32_t> qsl, CSpan<int32_t> seq_lens, int32_t num_reqs_actual) {
  validate_start_loc(qsl, "query_start_loc");
  const std::size_t b = qsl.size() - 1;
  AAR_CHECK_ARG(seq_lens.size() == b, "seq_lens has ", seq_lens.size(), " entries, query_start_loc has ", qsl.size(),
                " (expected B+1 = ", seq_lens.size() + 1, ")");
  AAR_CHECK_ARG(b <= static_cast<std::size_t>(kInt32Max), "B=", b, " does not fit int32");
  const auto nb = static_cast<int32_t>(b);
  const int32_t nra = num_reqs_actual < 0 ? nb : num_reqs_actual;
  AAR_CHECK_ARG(num_reqs_actual >= -1 && nra <= nb, "num_reqs_actual=", num_reqs_actual,
                " is out of range [0, B=", nb, "] (or -1 for B)");
  // Branch-free pass (vectorises); the per-request checks run only when it
  // has found a bad length, and name the first one. q >= 0 (query_start_loc
  // is non-decreasing), so S - q < 0 <=> S < q once S >= 0.
  const int32_t* const s = seq_lens.data();
  int32_t neg = 0;
  for (int32_t r = 0; r < nb; ++r) neg |= s[r];
  for (int32_t r = 0; r < nra; ++r) {
    neg |= static_cast<int32_t>(static_cast<uint32_t>(s[r]) - static_cast<uint32_t>(qsl[r + 1] - qsl[r]));
  }
  if (neg >= 0) return nra;
  for (int32_t r = 0; r < nb; ++r) {
    const int32_t q = qsl[r + 1] - qsl[r];
    AAR_CHECK_ARG(seq_lens[r] >= 0, "seq_lens[", r, "]=", seq_lens[r], " is negative");
    if (r < nra) {
      AAR_CHECK_ARG(seq_lens[r] >= q, "seq_lens[", r, "]=", seq_lens[r], " is smaller than its query length ", q);
    }
  }
  return nra;
}

// dsa_compressed_rows without its checks (r >= 1, 0 <= ctx, ctx + q fits int32).
inline DsaCompressedRows rows_of(int32_t ctx, int32_t q, int32_t r) {
  const int32_t first = ctx / r;
  return {first, (ctx + q) / r - first};
}

// Division of non-negative values by a positive divisor fixed per call:
// shifts and masks for powers of two (every DSV4 ratio and page size), so the
// per-request loops of a 256-request step pay no integer division.
struct NonNegDiv {
  int32_t d = 1;
  int32_t shift = -1;  // log2(d) when d is a power of two
  explicit NonNegDiv(int32_t divisor) : d(divisor) {
    // A bit count, not a loop: the builders make a few of these per group build.
    if ((d & (d - 1)) == 0) shift = d > 0 ? __builtin_ctz(static_cast<uint32_t>(d)) : 0;
  }
  int32_t div(int32_t x) const { return shift >= 0 ? x >> shift : x / d; }
  int32_t mod(int32_t x) const { return shift >= 0 ? x & (d - 1) : x % d; }
};

inline DsaCompressedRows rows_of(int32_t ctx, int32_t q, const NonNegDiv& r) {
  const int32_t first = r.div(ctx);
  return {first, r.div(ctx + q) - first};
}

// A power-of-two divisor as a shift and a mask, with NonNegDiv's interface:
// the write loop below is instantiated for it, so the common case has no
// per-row branch on the divisor's kind.
struct Pow2Div {
  int32_t d = 1, shift = 0, mask = 0;
  explicit Pow2Div(const NonNegDiv& nd) : d(nd.d), shift(nd.shift), mask(nd.d - 1) {}
  int32_t div(int32_t x) const { return x >> shift; }
  int32_t mod(int32_t x) const { return x & mask; }
};

void check_table_size(CSpan<int32_t> table, int32_t stride, std::size_t b) {
  AAR_CHECK_ARG(stride >= 0, "block_table_stride=", stride, " is negative");
  AAR_CHECK_ARG(table.size() >= b * static_cast<std::size_t>(stride), "block_table has ", table.size(),
                " entries, needs B * block_table_stride = ", b, " * ", stride);
}

}  // namespace

int32_t slot_format_width(SlotFormat format) {
  check_format(format);
  return format == SlotFormat::BlockOffset ? 2 : 1;
}

int32_t dsa_decode_threshold(int32_t num_speculative_tokens) {
  AAR_CHECK_ARG(num_speculative_tokens >= 0 && num_speculative_tokens <= kDsaMaxDecodeThreshold - 1,
                "num_speculative_tokens=", num_speculative_tokens, " is out of range [0, ", kDsaMaxDecodeThreshold - 1,
                "] (decode_threshold = 1 + k must be <= ", kDsaMaxDecodeThreshold, ")");
  return 1 + num_speculative_tokens;
}

int32_t dsa_storage_block_size(int32_t block_size, int32_t compress_ratio) {
  AAR_CHECK_ARG(compress_ratio >= 0, "compress_ratio=", compress_ratio, " is negative");
  AAR_CHECK_ARG(block_size > 0, "block_size=", block_size, " must be positive");
  const int32_t r = std::max(compress_ratio, 1);
  AAR_CHECK_ARG(block_size % r == 0, "block_size=", block_size, " is not a multiple of compress_ratio=", r);
  return block_size / r;
}

void format_dsa_slot_mapping(CSpan<int64_t> slots, int32_t storage_block_size, SlotFormat format, Span<int32_t> out,
                             BlockOffsetSkip skip) {
  format_slots_impl(slots, storage_block_size, format, out, skip);
}

void format_dsa_slot_mapping(CSpan<int32_t> slots, int32_t storage_block_size, SlotFormat format, Span<int32_t> out,
                             BlockOffsetSkip skip) {
  format_slots_impl(slots, storage_block_size, format, out, skip);
}

int32_t dsa_num_compressed_tokens(int32_t num_tokens, int32_t num_reqs, int32_t ratio) {
  AAR_CHECK_ARG(num_tokens >= 0, "num_tokens=", num_tokens, " is negative");
  AAR_CHECK_ARG(num_reqs >= 0, "num_reqs=", num_reqs, " is negative");
  AAR_CHECK_ARG(ratio >= 0, "ratio=", ratio, " is negative");
  if (ratio <= 1) return num_tokens;
  const int64_t bound = static_cast<int64_t>(num_tokens / ratio) + num_reqs;
  return static_cast<int32_t>(std::min<int64_t>(num_tokens, bound));
}

DsaCompressedRows dsa_compressed_rows(int32_t context_len, int32_t query_len, int32_t ratio) {
  AAR_CHECK_ARG(context_len >= 0, "context_len=", context_len, " is negative");
  AAR_CHECK_ARG(query_len >= 0, "query_len=", query_len, " is negative");
  AAR_CHECK_ARG(static_cast<int64_t>(context_len) + query_len <= kInt32Max, "context_len + query_len = ",
                static_cast<int64_t>(context_len) + query_len, " does not fit int32");
  AAR_CHECK_ARG(ratio >= 0, "ratio=", ratio, " is negative");
  return rows_of(context_len, query_len, std::max(ratio, 1));
}

DsaStepPlan plan_dsa_step(const DsaStepInputs& in, Span<int32_t> start_pos_out) {
  const int32_t thr = dsa_decode_threshold(in.num_speculative_tokens);
  const int32_t nra = check_batch(in.query_start_loc, in.seq_lens, in.num_reqs_actual);
  const CSpan<int32_t> qsl = in.query_start_loc;
  const auto b = static_cast<int32_t>(in.seq_lens.size());
  const int32_t t_real = qsl[b];
  AAR_CHECK_ARG(in.max_num_reqs >= 0, "max_num_reqs=", in.max_num_reqs, " is negative");
  AAR_CHECK_ARG(in.max_num_reqs == 0 || b <= in.max_num_reqs, "B=", b, " exceeds max_num_reqs=", in.max_num_reqs);
  AAR_CHECK_ARG(in.num_input_tokens == 0 || in.num_input_tokens >= t_real, "num_input_tokens=", in.num_input_tokens,
                " is smaller than query_start_loc[B]=", t_real);
  const int32_t t_in = in.num_input_tokens == 0 ? t_real : in.num_input_tokens;
  AAR_CHECK_ARG(in.max_num_tokens >= 0, "max_num_tokens=", in.max_num_tokens, " is negative");
  AAR_CHECK_ARG(in.max_num_tokens == 0 || t_in <= in.max_num_tokens, "num_input_tokens=", t_in,
                " exceeds max_num_tokens=", in.max_num_tokens);
  AAR_CHECK_ARG(start_pos_out.size() >= static_cast<std::size_t>(b), "start_pos_out has room for ",
                start_pos_out.size(), " entries, needs B=", b);

  DsaStepPlan p;
  // One pass over the requests (everything is validated): the maxima and
  // start_pos.
  int32_t max_q = 0, max_kv = 0;
  const int32_t* const seq = in.seq_lens.data();
  int32_t* const sp = start_pos_out.data();
  for (int32_t r = 0; r < b; ++r) {
    const int32_t q = qsl[r + 1] - qsl[r];
    max_q = std::max(max_q, q);
    max_kv = std::max(max_kv, seq[r]);
    sp[r] = r < nra ? seq[r] - q : 0;
  }
  SplitInputs si;
  si.query_start_loc = qsl;
  si.num_actual_tokens = t_real;
  si.max_query_len = max_q;
  si.decode_threshold = thr;
  si.treat_short_extends_as_decodes = true;
  p.split = split_decodes_and_prefills(si);  // cannot throw on the validated batch
  p.query_start_loc = qsl;
  p.seq_lens = in.seq_lens;
  p.start_pos = CSpan<int32_t>(start_pos_out.data(), static_cast<std::size_t>(b));
  p.num_reqs = b;
  p.num_reqs_actual = nra;
  p.num_actual_tokens = t_real;
  p.num_input_tokens = t_in;
  p.decode_threshold = thr;
  p.max_seqlen_q = max_q;
  p.max_seqlen_kv = max_kv;
  return p;
}

namespace {

// plan_dsa_group's validation as it was first written: request by request,
// every condition with its own error. It is the definition of the errors (and
// of their order: the first bad request's first failed check is reported);
// group_rows_valid runs it only once its fast pass has found a problem.
void throw_group_row_error(const DsaStepPlan& step, const DsaGroupInputs& g, int32_t r, const NonNegDiv& rdiv,
                           const NonNegDiv& sdiv) {
  const int32_t sbs = g.storage_block_size;
  const auto stride = static_cast<std::size_t>(g.block_table_stride);
  for (int32_t q_i = 0; q_i < step.num_reqs_actual; ++q_i) {
    const int32_t q = step.query_start_loc[q_i + 1] - step.query_start_loc[q_i];
    // The plan holds views of the caller's arrays: guard against their change.
    AAR_CHECK_ARG(q >= 0 && step.seq_lens[q_i] >= q, "step: seq_lens[", q_i, "]=", step.seq_lens[q_i],
                  " and query length ", q, " are not a validated request (inputs changed after plan_dsa_step?)");
    const DsaCompressedRows rows = rows_of(step.seq_lens[q_i] - q, q, rdiv);
    if (rows.count == 0) continue;
    const int32_t last = rows.first + rows.count - 1;
    AAR_CHECK_ARG(g.rope_positions == 0 || static_cast<int64_t>(last) * r < g.rope_positions, "request ", q_i,
                  " emits compressed row ", last, " at RoPE position ", static_cast<int64_t>(last) * r,
                  " but rope_positions=", g.rope_positions);
    const int32_t col_last = sdiv.div(last);
    AAR_CHECK_ARG(static_cast<std::size_t>(col_last) < stride, "request ", q_i, " emits compressed row ", last,
                  " in block-table column ", col_last, " but block_table_stride=", stride,
                  " (storage_block_size=", sbs, ", ratio=", r, ")");
    const int32_t* row = g.block_table.data() + static_cast<std::size_t>(q_i) * stride;
    for (int32_t col = sdiv.div(rows.first); col <= col_last; ++col) {
      const int32_t id = row[col];
      AAR_CHECK_ARG(id >= 0 && (g.num_blocks == 0 || id < g.num_blocks), "block_table[", q_i, "][", col, "]=", id,
                    " is out of range [0, ", g.num_blocks == 0 ? std::string("inf") : std::to_string(g.num_blocks),
                    ") (request ", q_i, " writes compressed rows there)");
      AAR_CHECK_ARG(g.slot_format != SlotFormat::Flat ||
                        static_cast<int64_t>(id) * sbs + (sbs - 1) <= kInt32Max,
                    "block_table[", q_i, "][", col, "]=", id, " gives flat slots beyond int32 (storage_block_size=",
                    sbs, ")");
    }
  }
}

// The block-id checks of throw_group_row_error as one bound: an id passes iff
// (uint32)id < it (negative ids wrap past any bound <= 2^31).
uint32_t block_id_limit(const DsaGroupInputs& g) {
  uint32_t limit = g.num_blocks == 0 ? uint32_t{1} << 31 : static_cast<uint32_t>(g.num_blocks);
  if (g.slot_format == SlotFormat::Flat) {
    // id * sbs + sbs - 1 <= INT32_MAX  <=>  id <= (INT32_MAX - sbs + 1) / sbs.
    limit = std::min(limit, static_cast<uint32_t>((kInt32Max - g.storage_block_size + 1) / g.storage_block_size + 1));
  }
  return limit;
}

// Checks every row the real requests emit (its RoPE position, page column and
// block id) and returns how many there are. The same conditions as
// throw_group_row_error, folded so that the per-request loop has no error
// branch but the two that guard its own reads: the id checks (>= 0, below
// num_blocks, flat slots within int32) are one unsigned bound, the RoPE check
// one maximum. On any failure throw_group_row_error names the error.
template <class Div>
int64_t group_rows_valid(const DsaStepPlan& step, const DsaGroupInputs& g, int32_t r, const Div& rdiv,
                         const Div& sdiv, const NonNegDiv& rdiv_checked, const NonNegDiv& sdiv_checked) {
  const auto stride = static_cast<std::size_t>(g.block_table_stride);
  const uint32_t limit = block_id_limit(g);
  const int32_t* const qsl = step.query_start_loc.data();
  const int32_t* const seq = step.seq_lens.data();
  const int32_t* const table = g.block_table.data();
  int64_t valid = 0;
  int32_t max_last = -1;
  uint32_t bad = 0;
  bool ok = true;
  const int32_t nra = step.num_reqs_actual;
  for (int32_t q_i = 0; q_i < nra; ++q_i) {
    const int32_t q = qsl[q_i + 1] - qsl[q_i], s = seq[q_i];
    if (__builtin_expect(q < 0 || s < q, 0)) {
      ok = false;
      break;
    }
    const int32_t first = rdiv.div(s - q), end = rdiv.div(s);
    if (end == first) continue;
    valid += end - first;
    const int32_t last = end - 1;
    max_last = std::max(max_last, last);
    const int32_t col_first = sdiv.div(first), col_last = sdiv.div(last);
    if (__builtin_expect(static_cast<std::size_t>(col_last) >= stride, 0)) {
      ok = false;
      break;
    }
    const int32_t* row = table + static_cast<std::size_t>(q_i) * stride;
    bad |= static_cast<uint32_t>(static_cast<uint32_t>(row[col_first]) >= limit);
    // Rows of one request span more than one page only in prefills.
    for (int32_t col = col_first + 1; col <= col_last; ++col) {
      bad |= static_cast<uint32_t>(static_cast<uint32_t>(row[col]) >= limit);
    }
  }
  if (g.rope_positions != 0 && static_cast<int64_t>(max_last) * r >= g.rope_positions) ok = false;
  if (!ok || bad != 0) {
    throw_group_row_error(step, g, r, rdiv_checked, sdiv_checked);
    throw_invalid("internal: plan_dsa_group's fast validation failed where the per-request one did not");
  }
  return valid;
}

// The rows [lo, hi) request b's kernels read (DsaGroupReads, in the group's
// row units), for the validated lengths s >= q >= 0; lo >= hi when none.
struct ReadSpan {
  int32_t lo, hi;
};
template <DsaGroupReads kReads, class Div>
inline ReadSpan read_span(int32_t s, int32_t q, const DsaGroupInputs& g, const Div& rdiv, const Div& state_div) {
  const int32_t start = s - q;
  if constexpr (kReads == DsaGroupReads::CompressedPrefix) {
    return {0, q == 0 ? 0 : rdiv.div(s)};  // a request without tokens queries nothing
  } else if constexpr (kReads == DsaGroupReads::Window) {
    return {std::max(start - g.read_window, 0), q == 0 ? 0 : s};
  } else {
    const int32_t c0 = state_div.div(start);
    if (state_div.div(s) == c0) return {0, 0};  // no row completes: the compressor reads no earlier state
    return {std::max((c0 - g.state_coff + 1) * g.state_ratio, 0), start};
  }
}

const char* reads_what(DsaGroupReads r) {
  switch (r) {
    case DsaGroupReads::CompressedPrefix: return "the attention / indexer reads its compressed rows";
    case DsaGroupReads::Window: return "the sliding-window attention reads its positions";
    case DsaGroupReads::CompressorState: return "the compressor reads the state of its positions";
    default: return "reads";
  }
}

// The definition of the read checks' errors (the first bad request's first
// failure); check_group_reads runs it once its fast pass found a problem.
template <DsaGroupReads kReads>
void throw_group_read_error(const DsaStepPlan& step, const DsaGroupInputs& g, const NonNegDiv& rdiv,
                            const NonNegDiv& sdiv, const NonNegDiv& state_div) {
  const auto stride = static_cast<std::size_t>(g.block_table_stride);
  for (int32_t b = 0; b < step.num_reqs_actual; ++b) {
    const int32_t q = step.query_start_loc[b + 1] - step.query_start_loc[b], s = step.seq_lens[b];
    AAR_CHECK_ARG(q >= 0 && s >= q, "step: seq_lens[", b, "]=", s, " and query length ", q,
                  " are not a validated request (inputs changed after plan_dsa_step?)");
    const ReadSpan span = read_span<kReads>(s, q, g, rdiv, state_div);
    if (span.lo >= span.hi) continue;
    const int32_t col_lo = sdiv.div(span.lo), col_hi = sdiv.div(span.hi - 1);
    AAR_CHECK_ARG(static_cast<std::size_t>(col_hi) < stride, "request ", b, ": ", reads_what(kReads), " [",
                  span.lo, ", ", span.hi, "), up to block-table column ", col_hi, ", but block_table_stride=", stride,
                  " (storage_block_size=", sdiv.d, ")");
    const int32_t* row = g.block_table.data() + static_cast<std::size_t>(b) * stride;
    for (int32_t col = col_lo; col <= col_hi; ++col) {
      const int32_t id = row[col];
      AAR_CHECK_ARG(id >= 0 && (g.num_blocks == 0 || id < g.num_blocks), "block_table[", b, "][", col, "]=", id,
                    " is out of range [0, num_blocks=",
                    g.num_blocks == 0 ? std::string("inf") : std::to_string(g.num_blocks), ") (request ", b, ": ",
                    reads_what(kReads), " [", span.lo, ", ", span.hi, ") there)");
      AAR_CHECK_ARG(g.slot_format != SlotFormat::Flat ||
                        static_cast<int64_t>(id) * sdiv.d + (sdiv.d - 1) <= kInt32Max,
                    "block_table[", b, "][", col, "]=", id, " gives flat slots beyond int32 (storage_block_size=",
                    sdiv.d, ")");
    }
  }
}

// The exact read check: every page column of the rows each real request's
// kernels read (DsaGroupReads) is in the table and holds a block id in [0,
// num_blocks), request by request (the id checks are block_id_limit's one
// unsigned bound); any failure is named by throw_group_read_error. The fast
// passes below fall back to it when they find a problem or cannot run.
template <DsaGroupReads kReads, class Div>
void group_reads_valid(const DsaStepPlan& step, const DsaGroupInputs& g, const Div& rdiv, const Div& sdiv,
                       const Div& state_div, const NonNegDiv& rdiv_checked, const NonNegDiv& sdiv_checked,
                       const NonNegDiv& state_div_checked, int32_t first = 0) {
  const auto stride = static_cast<std::size_t>(g.block_table_stride);
  const uint32_t limit = block_id_limit(g);
  const int32_t* const qsl = step.query_start_loc.data();
  const int32_t* const seq = step.seq_lens.data();
  const int32_t* const table = g.block_table.data();
  uint32_t bad = 0;
  bool ok = true;
  for (int32_t b = first; b < step.num_reqs_actual; ++b) {
    const int32_t q = qsl[b + 1] - qsl[b], s = seq[b];
    if (__builtin_expect(q < 0 || s < q, 0)) {
      ok = false;
      break;
    }
    const ReadSpan span = read_span<kReads>(s, q, g, rdiv, state_div);
    if (span.lo >= span.hi) continue;
    const int32_t col_lo = sdiv.div(span.lo), col_hi = sdiv.div(span.hi - 1);
    if (__builtin_expect(static_cast<std::size_t>(col_hi) >= stride, 0)) {
      ok = false;
      break;
    }
    const int32_t* row = table + static_cast<std::size_t>(b) * stride;
    for (int32_t col = col_lo; col <= col_hi; ++col) bad |= static_cast<uint32_t>(static_cast<uint32_t>(row[col]) >= limit);
  }
  if (!ok || bad != 0) {
    throw_group_read_error<kReads>(step, g, rdiv_checked, sdiv_checked, state_div_checked);
    throw_invalid("internal: plan_dsa_group's fast read validation failed where the per-request one did not");
  }
}

// Whether the first `cols` ids of each of `rows` table rows pass the unsigned
// bound `limit` (block_id_limit).
bool scan_rows(const int32_t* row, std::size_t rows, std::size_t stride, std::size_t cols, uint32_t limit) {
  uint32_t bad = 0;
  for (std::size_t b = 0; b < rows; ++b, row += stride) {
    for (std::size_t c = 0; c < cols; ++c) bad |= static_cast<uint32_t>(static_cast<uint32_t>(row[c]) >= limit);
  }
  return bad == 0;
}
#if AAR_HAVE_X86_DISPATCH
// all & the lanes of id with (uint32)id <= max_id.
__attribute__((target("avx2"), always_inline)) inline __m256i and_within(__m256i all, __m256i max_id, __m256i id) {
  return _mm256_and_si256(all, _mm256_cmpeq_epi32(_mm256_min_epu32(id, max_id), id));
}

// scan_rows eight ids a step (the rows are short: a decode's C4 prefix is a
// few pages), the last part of a row by a masked load (its masked lanes read
// nothing). limit >= 1.
__attribute__((target("avx2"))) bool scan_rows_avx2(const int32_t* row, std::size_t rows, std::size_t stride,
                                                    std::size_t cols, uint32_t limit) {
  const __m256i max_id = _mm256_set1_epi32(static_cast<int32_t>(limit - 1));
  const std::size_t full = cols / 8;
  // Lanes of a row's last part (all eight when cols is a multiple of eight, for the one-load case).
  const int32_t in_tail = cols % 8 == 0 ? 8 : static_cast<int32_t>(cols % 8);
  const __m256i tail = _mm256_cmpgt_epi32(_mm256_set1_epi32(in_tail), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  const bool has_tail = cols % 8 != 0;
  __m256i all = _mm256_set1_epi32(-1);
  if (cols <= 2 && rows >= 8 && rows * stride <= static_cast<std::size_t>(kInt32Max)) {
    // A column or two a row (a C128 decode): eight rows a gather.
    const __m256i vstride = _mm256_set1_epi32(static_cast<int32_t>(stride));
    const __m256i eight_rows = _mm256_set1_epi32(static_cast<int32_t>(8 * stride));
    __m256i idx = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), vstride);
    std::size_t b = 0;
    for (; b + 8 <= rows; b += 8, idx = _mm256_add_epi32(idx, eight_rows)) {
      all = and_within(all, max_id, _mm256_i32gather_epi32(row, idx, 4));
      if (cols == 2) all = and_within(all, max_id, _mm256_i32gather_epi32(row + 1, idx, 4));
    }
    for (row += b * stride; b < rows; ++b, row += stride) all = and_within(all, max_id, _mm256_maskload_epi32(row, tail));
    return _mm256_movemask_epi8(all) == -1;
  }
  if (cols <= 8) {
    // The decode case: one (masked) load a row, four rows a turn.
    std::size_t b = 0;
    for (; b + 4 <= rows; b += 4, row += 4 * stride) {
      all = and_within(all, max_id, _mm256_maskload_epi32(row, tail));
      all = and_within(all, max_id, _mm256_maskload_epi32(row + stride, tail));
      all = and_within(all, max_id, _mm256_maskload_epi32(row + 2 * stride, tail));
      all = and_within(all, max_id, _mm256_maskload_epi32(row + 3 * stride, tail));
    }
    for (; b < rows; ++b, row += stride) all = and_within(all, max_id, _mm256_maskload_epi32(row, tail));
    return _mm256_movemask_epi8(all) == -1;
  }
  for (std::size_t b = 0; b < rows; ++b, row += stride) {
    const int32_t* p = row;
    for (std::size_t c = 0; c < full; ++c, p += 8) {
      const __m256i id = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
      all = _mm256_and_si256(all, _mm256_cmpeq_epi32(_mm256_min_epu32(id, max_id), id));
    }
    if (has_tail) {
      // Masked lanes load 0, which passes.
      const __m256i id = _mm256_maskload_epi32(p, tail);
      all = _mm256_and_si256(all, _mm256_cmpeq_epi32(_mm256_min_epu32(id, max_id), id));
    }
  }
  return _mm256_movemask_epi8(all) == -1;
}
#endif
bool scan_rows_pick(const int32_t* row, std::size_t rows, std::size_t stride, std::size_t cols, uint32_t limit) {
#if AAR_HAVE_X86_DISPATCH
  if (limit >= 1 && detail::cpu_has_avx2()) return scan_rows_avx2(row, rows, stride, cols, limit);
#endif
  return scan_rows(row, rows, stride, cols, limit);
}

// The CompressedPrefix fast pass: request b reads columns [0, (S_b / r - 1) /
// sbs], so every real request's row is scanned over the widest of those
// prefixes, [0, H]: one fixed-length run per row (it vectorises) instead of a
// span per request. Columns past a shorter request's prefix are within its
// row and, in an engine's table, hold ids of its own blocks or the null block
// 0; when one holds anything else the exact check decides. Returns whether
// every id passed (false: run the exact check).
template <class Div>
bool prefix_reads_fast(const DsaStepPlan& step, const DsaGroupInputs& g, const Div& rdiv, const Div& sdiv) {
  const int32_t nra = step.num_reqs_actual;
  // At most the longest request's rows (the division is monotone; the step's
  // maximum also counts graph-padding rows: at worst more columns are scanned).
  const int32_t max_rows = rdiv.div(step.max_seqlen_kv);
  if (max_rows <= 0 || nra == 0) return true;
  const auto stride = static_cast<std::size_t>(g.block_table_stride);
  const auto cols = static_cast<std::size_t>(sdiv.div(max_rows - 1)) + 1;
  if (cols > stride) return false;
  return scan_rows_pick(g.block_table.data(), static_cast<std::size_t>(nra), stride, cols, block_id_limit(g));
}

#if AAR_HAVE_X86_DISPATCH
// The Window / CompressorState fast pass, eight requests at a time (AVX2; the
// page size and the state ratio are powers of two), over the columns a request
// reads BEFORE the first one it writes: those it writes (a ratio-1 group
// writes a row per token) were checked by the written-row pass already. Its
// span is computed in vectors and its few columns (a window's or a compressor
// group's worth, usually none or one) read with masked gathers, column k of
// all eight at once. Returns whether every request passed (false: the exact
// check names the error); the last nra % 8 requests are left to the caller.
// Needs nra * stride <= INT32_MAX (the gathers' indices are int32) and limit
// >= 1.
__attribute__((target("avx2"))) bool narrow_reads_avx2(const int32_t* start_pos, const int32_t* seq, int32_t nra,
                                                       const int32_t* table, uint32_t stride, uint32_t limit,
                                                       int sshift, bool window, int32_t read_window, int rshift,
                                                       int32_t coff) {
  const __m256i zero = _mm256_setzero_si256();
  const __m256i one = _mm256_set1_epi32(1);
  const __m256i max_col = _mm256_set1_epi32(static_cast<int32_t>(stride - 1));
  const __m256i max_id = _mm256_set1_epi32(static_cast<int32_t>(limit - 1));
  const __m256i vstride = _mm256_set1_epi32(static_cast<int32_t>(stride));
  const __m256i eight_rows = _mm256_set1_epi32(static_cast<int32_t>(8 * stride));
  const __m128i vs = _mm_cvtsi32_si128(sshift), vr = _mm_cvtsi32_si128(rshift);
  const __m256i vwin = _mm256_set1_epi32(read_window), vback = _mm256_set1_epi32(coff - 1);
  __m256i fail = zero;
  __m256i row0 = _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), vstride);  // each row's first id
  for (int32_t b = 0; b + 8 <= nra; b += 8, row0 = _mm256_add_epi32(row0, eight_rows)) {
    const __m256i s = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(seq + b));
    const __m256i start = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(start_pos + b));
    // Lengths changed after planning (start_pos < 0 or > S): the exact check names them.
    fail = _mm256_or_si256(fail, _mm256_or_si256(_mm256_cmpgt_epi32(zero, start), _mm256_cmpgt_epi32(start, s)));
    // The first column the request writes, start >> sshift, when it has tokens.
    const __m256i written = _mm256_sra_epi32(start, vs);
    __m256i lo, last;  // the first position read; the last column to check
    if (window) {
      lo = _mm256_max_epi32(_mm256_sub_epi32(start, vwin), zero);
      // A request without tokens (S == start_pos) queries nothing: last -1, no column.
      const __m256i no_tokens = _mm256_cmpeq_epi32(s, start);
      last = _mm256_or_si256(_mm256_sub_epi32(written, one), no_tokens);
    } else {
      const __m256i c0 = _mm256_sra_epi32(start, vr);
      const __m256i completes = _mm256_cmpgt_epi32(_mm256_sra_epi32(s, vr), c0);
      lo = _mm256_max_epi32(_mm256_sll_epi32(_mm256_sub_epi32(c0, vback), vr), zero);
      // A completed row implies tokens: the gathered positions [lo, start) end before the written column.
      last = _mm256_or_si256(_mm256_sub_epi32(written, one), _mm256_andnot_si256(completes, _mm256_set1_epi32(-1)));
    }
    const __m256i col_lo = _mm256_sra_epi32(lo, vs);
    // Columns to read per lane (<= 0: none); a span past the table fails (the exact check names it).
    const __m256i n = _mm256_add_epi32(_mm256_sub_epi32(last, col_lo), one);
    const __m256i nonempty = _mm256_cmpgt_epi32(n, zero);
    fail = _mm256_or_si256(fail, _mm256_andnot_si256(_mm256_cmpeq_epi32(_mm256_min_epu32(last, max_col), last),
                                                     nonempty));
    const __m256i take_n = _mm256_andnot_si256(fail, _mm256_and_si256(n, nonempty));
    __m256i idx = _mm256_add_epi32(row0, col_lo);
    for (__m256i k = zero;; k = _mm256_add_epi32(k, one), idx = _mm256_add_epi32(idx, one)) {
      const __m256i take = _mm256_cmpgt_epi32(take_n, k);
      if (_mm256_testz_si256(take, take)) break;
      const __m256i id = _mm256_mask_i32gather_epi32(zero, table, idx, take, 4);
      const __m256i within = _mm256_cmpeq_epi32(_mm256_min_epu32(id, max_id), id);
      fail = _mm256_or_si256(fail, _mm256_andnot_si256(within, take));
    }
  }
  return _mm256_testz_si256(fail, fail);
}
#endif

template <DsaGroupReads kReads>
void check_group_reads_as(const DsaStepPlan& step, const DsaGroupInputs& g, int32_t r, int32_t sbs) {
  const NonNegDiv rdiv(r), sdiv(sbs), state_div(kReads == DsaGroupReads::CompressorState ? g.state_ratio : 1);
  const bool pow2 = rdiv.shift >= 0 && sdiv.shift >= 0 && state_div.shift >= 0;
  if constexpr (kReads == DsaGroupReads::CompressedPrefix) {
    if (pow2 ? prefix_reads_fast(step, g, Pow2Div(rdiv), Pow2Div(sdiv)) : prefix_reads_fast(step, g, rdiv, sdiv)) {
      return;
    }
  } else {
#if AAR_HAVE_X86_DISPATCH
    const int32_t nra = step.num_reqs_actual;
    const auto stride = static_cast<uint32_t>(g.block_table_stride);
    const uint32_t limit = block_id_limit(g);
    if (pow2 && nra >= 8 && stride >= 1 && limit >= 1 &&
        static_cast<uint64_t>(nra) * stride <= static_cast<uint64_t>(kInt32Max) && detail::cpu_has_avx2() &&
        step.start_pos.size() >= static_cast<std::size_t>(nra) &&
        narrow_reads_avx2(step.start_pos.data(), step.seq_lens.data(), nra, g.block_table.data(), stride,
                          limit, sdiv.shift, kReads == DsaGroupReads::Window, g.read_window, state_div.shift,
                          g.state_coff)) {
      // The last nra % 8 requests, exactly (an error there is named over the whole step).
      group_reads_valid<kReads>(step, g, Pow2Div(rdiv), Pow2Div(sdiv), Pow2Div(state_div), rdiv, sdiv, state_div,
                                nra & ~7);
      return;
    }
#endif
  }
  if (pow2) {
    group_reads_valid<kReads>(step, g, Pow2Div(rdiv), Pow2Div(sdiv), Pow2Div(state_div), rdiv, sdiv, state_div);
  } else {
    group_reads_valid<kReads>(step, g, rdiv, sdiv, state_div, rdiv, sdiv, state_div);
  }
}

// plan_dsa_group's read checks (the arguments were checked by check_group_args).
void check_group_reads(const DsaStepPlan& step, const DsaGroupInputs& g, int32_t r, int32_t sbs) {
  switch (g.reads) {
    case DsaGroupReads::WrittenRows: return;
    case DsaGroupReads::CompressedPrefix: return check_group_reads_as<DsaGroupReads::CompressedPrefix>(step, g, r, sbs);
    case DsaGroupReads::Window: return check_group_reads_as<DsaGroupReads::Window>(step, g, r, sbs);
    case DsaGroupReads::CompressorState: return check_group_reads_as<DsaGroupReads::CompressorState>(step, g, r, sbs);
  }
}

struct RowOut {
  int32_t *slots, *index, *position, *request;
};

// The emitted rows of the real requests (validated), every output given:
// returns the rows written. Per request the bounds are loaded once, before
// any store (the stores may alias the inputs as far as the compiler knows).
template <bool kBlockOffset, class Div>
std::size_t write_rows(const DsaStepPlan& step, const int32_t* table, std::size_t stride, int32_t r, const Div& rdiv,
                       const Div& sdiv, int32_t sbs, const RowOut& out) {
  const int32_t* const qsl = step.query_start_loc.data();
  const int32_t* const seq = step.seq_lens.data();
  int32_t* const slots = out.slots;
  int32_t* const ri = out.index;
  int32_t* const rp = out.position;
  int32_t* const rq = out.request;
  std::size_t o = 0;
  for (int32_t q_i = 0; q_i < step.num_reqs_actual; ++q_i) {
    const int32_t s = seq[q_i], q = qsl[q_i + 1] - qsl[q_i];
    const int32_t first = rdiv.div(s - q), end = rdiv.div(s);
    const int32_t* row = table + static_cast<std::size_t>(q_i) * stride;
    auto put = [&](int32_t c) {
      const int32_t block = row[sdiv.div(c)];
      if (kBlockOffset) {
        slots[2 * o] = block;
        slots[2 * o + 1] = sdiv.mod(c);
      } else {
        slots[o] = block * sbs + sdiv.mod(c);
      }
      ri[o] = c;
      rp[o] = c * r;
      rq[o] = q_i;
      ++o;
    };
    // One row per request is the decode step at every ratio (or none, for a
    // compressed group): straight-line, not a loop the compiler vectorises
    // with a set-up that costs more than the row.
    if (end - first == 1) {
      put(first);
    } else {
      for (int32_t c = first; c < end; ++c) put(c);
    }
  }
  return o;
}

// The same rows for any divisor and any subset of the optional outputs.
std::size_t write_rows_general(const DsaStepPlan& step, const int32_t* table, std::size_t stride, int32_t r,
                               const NonNegDiv& rdiv, const NonNegDiv& sdiv, int32_t sbs, SlotFormat fmt,
                               const RowOut& out) {
  const int32_t* const qsl = step.query_start_loc.data();
  const int32_t* const seq = step.seq_lens.data();
  std::size_t out_row = 0;
  for (int32_t q_i = 0; q_i < step.num_reqs_actual; ++q_i) {
    const int32_t q = qsl[q_i + 1] - qsl[q_i];
    const DsaCompressedRows rows = rows_of(seq[q_i] - q, q, rdiv);
    const int32_t* row = table + static_cast<std::size_t>(q_i) * stride;
    const int32_t end = rows.first + rows.count;
    for (int32_t c = rows.first; c < end; ++c, ++out_row) {
      put_slot(out.slots, out_row, fmt, row[sdiv.div(c)], sdiv.mod(c), sbs);
      if (out.index != nullptr) out.index[out_row] = c;
      if (out.position != nullptr) out.position[out_row] = c * r;
      if (out.request != nullptr) out.request[out_row] = q_i;
    }
  }
  return out_row;
}

}  // namespace

namespace {

// plan_dsa_group's argument checks, shared by both overloads.
struct GroupArgs {
  int32_t r = 1, sbs = 1, num_rows = 0;
  std::size_t stride = 0, rows_u = 0;
};
GroupArgs check_group_args(const DsaStepPlan& step, const DsaGroupInputs& g, const DsaGroupBuffers& buf) {
  const int32_t b = step.num_reqs;
  const int32_t nra = step.num_reqs_actual;
  AAR_CHECK_ARG(b >= 0 && nra >= 0 && nra <= b && step.query_start_loc.size() == static_cast<std::size_t>(b) + 1 &&
                    step.seq_lens.size() == static_cast<std::size_t>(b) &&
                    step.start_pos.size() == static_cast<std::size_t>(b),
                "step is not a plan from plan_dsa_step (num_reqs=", b, ", num_reqs_actual=", nra,
                ", query_start_loc has ", step.query_start_loc.size(), " entries)");
  AAR_CHECK_ARG(g.compress_ratio >= 0, "compress_ratio=", g.compress_ratio, " is negative");
  GroupArgs a;
  a.r = std::max(g.compress_ratio, 1);
  a.sbs = g.storage_block_size;
  AAR_CHECK_ARG(a.sbs > 0, "storage_block_size=", a.sbs, " must be positive");
  check_format(g.slot_format);
  check_skip(g.block_offset_skip);
  check_table_size(g.block_table, g.block_table_stride, static_cast<std::size_t>(b));
  AAR_CHECK_ARG(g.num_blocks >= 0, "num_blocks=", g.num_blocks, " is negative");
  AAR_CHECK_ARG(g.rope_positions >= 0, "rope_positions=", g.rope_positions, " is negative");
  a.stride = static_cast<std::size_t>(g.block_table_stride);
  switch (g.reads) {
    case DsaGroupReads::WrittenRows:
    case DsaGroupReads::CompressedPrefix: break;
    case DsaGroupReads::Window:
      AAR_CHECK_ARG(g.read_window >= 0, "read_window=", g.read_window, " is negative");
      AAR_CHECK_ARG(a.r == 1, "reads=Window is the sliding window of an uncompressed group, but compress_ratio=",
                    g.compress_ratio);
      break;
    case DsaGroupReads::CompressorState:
      AAR_CHECK_ARG(g.state_ratio >= 1 && g.state_coff >= 1, "reads=CompressorState needs state_ratio >= 1 and "
                    "state_coff >= 1, got ", g.state_ratio, " and ", g.state_coff);
      AAR_CHECK_ARG(a.r == 1, "reads=CompressorState is a state cache (one row per position), but compress_ratio=",
                    g.compress_ratio);
      break;
    default: throw_invalid("reads=", static_cast<int32_t>(g.reads), " is not a DsaGroupReads");
  }

  a.num_rows = dsa_num_compressed_tokens(step.num_input_tokens, b, a.r);
  const std::size_t w = static_cast<std::size_t>(slot_format_width(g.slot_format));
  a.rows_u = static_cast<std::size_t>(a.num_rows);
  AAR_CHECK_ARG(buf.slot_mapping.size() >= a.rows_u * w, "slot_mapping has room for ", buf.slot_mapping.size(),
                " int32 values, needs ", a.rows_u * w, " (", a.num_rows, " compressed rows, format width ", w, ")");
  auto check_opt = [&](Span<int32_t> s, const char* name) {
    AAR_CHECK_ARG(s.empty() || s.size() >= a.rows_u, name, " has room for ", s.size(), " entries, needs ",
                  a.num_rows);
  };
  check_opt(buf.row_index, "row_index");
  check_opt(buf.row_position, "row_position");
  check_opt(buf.row_request, "row_request");
  AAR_CHECK_ARG(buf.block_table.empty() || buf.block_table.size() >= static_cast<std::size_t>(b) * a.stride,
                "block_table buffer has room for ", buf.block_table.size(), " entries, needs B * stride = ", b, " * ",
                a.stride);
  return a;
}

// The staged table: real rows copied (unless it is the input itself),
// graph-padding rows zeroed.
void stage_table(const DsaStepPlan& step, const DsaGroupInputs& g, const DsaGroupBuffers& buf, std::size_t stride) {
  if (buf.block_table.empty() || stride == 0) return;
  int32_t* dst = buf.block_table.data();
  const int32_t* src = g.block_table.data();
  const auto nra = static_cast<std::size_t>(step.num_reqs_actual), b = static_cast<std::size_t>(step.num_reqs);
  if (dst != src) std::copy(src, src + nra * stride, dst);
  std::fill(dst + nra * stride, dst + b * stride, 0);
}

RowOut row_out(const DsaGroupBuffers& buf) {
  // Local pointers (null = not requested): the int32 stores could alias the
  // spans' arrays, so nothing is re-read through `buf` per row.
  RowOut out;
  out.slots = buf.slot_mapping.data();
  out.index = buf.row_index.empty() ? nullptr : buf.row_index.data();
  out.position = buf.row_position.empty() ? nullptr : buf.row_position.data();
  out.request = buf.row_request.empty() ? nullptr : buf.row_request.data();
  return out;
}

void write_padding_rows(const RowOut& out, std::size_t from, std::size_t to, SlotFormat fmt, int32_t sbs,
                        BlockOffsetSkip skip) {
  if (from >= to) return;
  // One fill per array (no per-row format branch): every compressed group of
  // a decode step pads most of its rows.
  if (fmt == SlotFormat::BlockOffset) {
    const int32_t skip_off = skip_offset(skip, sbs);
    for (std::size_t row = from; row < to; ++row) {
      out.slots[2 * row] = -1;
      out.slots[2 * row + 1] = skip_off;
    }
  } else {
    std::fill(out.slots + from, out.slots + to, -1);
  }
  if (out.index != nullptr) std::fill(out.index + from, out.index + to, -1);
  if (out.position != nullptr) std::fill(out.position + from, out.position + to, 0);
  if (out.request != nullptr) std::fill(out.request + from, out.request + to, -1);
}

}  // namespace

DsaGroupPlan plan_dsa_group(const DsaStepPlan& step, const DsaGroupInputs& g, const DsaGroupBuffers& buf) {
  const GroupArgs a = check_group_args(step, g, buf);
  const int32_t r = a.r, sbs = a.sbs, num_rows = a.num_rows;
  const NonNegDiv rdiv(r), sdiv(sbs);
  const bool pow2 = rdiv.shift >= 0 && sdiv.shift >= 0;
  const int64_t valid = pow2 ? group_rows_valid(step, g, r, Pow2Div(rdiv), Pow2Div(sdiv), rdiv, sdiv)
                             : group_rows_valid(step, g, r, rdiv, sdiv, rdiv, sdiv);
  AAR_CHECK_ARG(valid <= num_rows, "internal: ", valid, " emitted rows exceed num_compressed_tokens=", num_rows);
  check_group_reads(step, g, r, sbs);

  // Writes.
  stage_table(step, g, buf, a.stride);
  const RowOut out = row_out(buf);
  const bool all = out.index != nullptr && out.position != nullptr && out.request != nullptr;
  const bool block_offset = g.slot_format == SlotFormat::BlockOffset;
  std::size_t out_row;
  // What the builders ask for (every DSV4 ratio and page size is a power of
  // two, every optional buffer given) gets a branch-free instantiation; the
  // rest the general loop. Both write the same values.
  if (all && pow2) {
    const Pow2Div rp2(rdiv), sp2(sdiv);
    out_row = block_offset ? write_rows<true>(step, g.block_table.data(), a.stride, r, rp2, sp2, sbs, out)
                           : write_rows<false>(step, g.block_table.data(), a.stride, r, rp2, sp2, sbs, out);
  } else {
    out_row = write_rows_general(step, g.block_table.data(), a.stride, r, rdiv, sdiv, sbs, g.slot_format, out);
  }
  write_padding_rows(out, out_row, a.rows_u, g.slot_format, sbs, g.block_offset_skip);
  return {r, num_rows, static_cast<int32_t>(valid)};
}

namespace {

// plan_dsa_rows' list of the validated requests' rows; returns their number.
template <class Div>
__attribute__((always_inline)) inline std::size_t list_rows(const int32_t* qsl, const int32_t* seq, int32_t nra,
                                                            const Div& rdiv, const DsaRowBuffers& buf, bool all_one,
                                                            int32_t& max_index) {
  int32_t* const rq = buf.request.data();
  int32_t* const ri = buf.index.data();
  std::size_t o = 0;
  int32_t mx = -1;
  if (all_one && rdiv.d == 1) {
    // A decode step (every real request one token): at ratio 1 request b's
    // row is (b, S_b - 1). Two loops that vectorise.
    for (int32_t q_i = 0; q_i < nra; ++q_i) rq[q_i] = q_i;
    for (int32_t q_i = 0; q_i < nra; ++q_i) {
      ri[q_i] = seq[q_i] - 1;
      mx = std::max(mx, seq[q_i] - 1);
    }
    max_index = mx;
    return static_cast<std::size_t>(nra);
  }
  if (all_one) {
    // A decode step at ratio r > 1: request b emits the row (S_b - 1) / r iff
    // S_b % r == 0 (its token completes a compressed row).
    int32_t q_i = 0;
#if defined(__SSE2__)
    if constexpr (std::is_same_v<Div, Pow2Div>) {
      // Four requests at a time: a block where all four emit (the batch's
      // lengths agree modulo r) is stored as vectors, one where none emits
      // costs its test, and a mixed one lists its emitters from the mask.
      const __m128i mask = _mm_set1_epi32(rdiv.mask), one = _mm_set1_epi32(1), four = _mm_set1_epi32(4);
      const __m128i shift = _mm_cvtsi32_si128(rdiv.shift);
      __m128i req = _mm_setr_epi32(0, 1, 2, 3);
      __m128i vmax = _mm_set1_epi32(-1);
      for (; q_i + 4 <= nra; q_i += 4, req = _mm_add_epi32(req, four)) {
        const __m128i sv = _mm_loadu_si128(reinterpret_cast<const __m128i*>(seq + q_i));
        const __m128i emit = _mm_cmpeq_epi32(_mm_and_si128(sv, mask), _mm_setzero_si128());
        const int bits = _mm_movemask_ps(_mm_castsi128_ps(emit));
        if (bits == 0) continue;
        const __m128i first = _mm_sra_epi32(_mm_sub_epi32(sv, one), shift);
        if (bits == 0xF) {
          _mm_storeu_si128(reinterpret_cast<__m128i*>(rq + o), req);
          _mm_storeu_si128(reinterpret_cast<__m128i*>(ri + o), first);
          // max over signed int32 (SSE2 has no pmaxsd): first > vmax picks first.
          const __m128i gt = _mm_cmpgt_epi32(first, vmax);
          vmax = _mm_or_si128(_mm_and_si128(gt, first), _mm_andnot_si128(gt, vmax));
          o += 4;
          continue;
        }
        for (int m = bits; m != 0; m &= m - 1) {
          const int j = __builtin_ctz(static_cast<unsigned>(m));
          const int32_t f = rdiv.div(seq[q_i + j] - 1);
          rq[o] = q_i + j;
          ri[o] = f;
          mx = std::max(mx, f);
          ++o;
        }
      }
      alignas(16) int32_t lanes[4];
      _mm_store_si128(reinterpret_cast<__m128i*>(lanes), vmax);
      for (int32_t v : lanes) mx = std::max(mx, v);
    }
#endif
    // The rest (and every request without SSE2 or for another divisor),
    // branch-free: every request's entry is written at the list's end, which
    // advances by the emit bit; o <= q_i < nra <= the rows' room, so the
    // write stays in bounds.
    for (; q_i < nra; ++q_i) {
      const int32_t s = seq[q_i], first = rdiv.div(s - 1);
      const int32_t e = rdiv.div(s) - first;  // 0 or 1
      rq[o] = q_i;
      ri[o] = first;
      mx = e != 0 && first > mx ? first : mx;
      o += static_cast<std::size_t>(e);
    }
    max_index = mx;
    return o;
  }
  for (int32_t q_i = 0; q_i < nra; ++q_i) {
    const int32_t s = seq[q_i], q = qsl[q_i + 1] - qsl[q_i];
    const int32_t first = rdiv.div(s - q), end = rdiv.div(s);
    if (end - first == 1) {  // a decode (or a short extend) at every ratio
      rq[o] = q_i;
      ri[o] = first;
      ++o;
      mx = std::max(mx, first);
    } else if (end > first) {
      for (int32_t c = first; c < end; ++c, ++o) {
        rq[o] = q_i;
        ri[o] = c;
      }
      mx = std::max(mx, end - 1);  // a request's rows ascend
    }
  }
  max_index = mx;
  return o;
}

// list_rows for the builders' case (a power-of-two ratio), its loops eight
// requests wide in an AVX2 clone where the CPU has it.
#if AAR_HAVE_X86_DISPATCH
__attribute__((target("avx2"))) std::size_t list_rows_pow2_avx2(const int32_t* qsl, const int32_t* seq, int32_t nra,
                                                                const Pow2Div& rdiv, const DsaRowBuffers& buf,
                                                                bool all_one, int32_t& max_index) {
  return list_rows(qsl, seq, nra, rdiv, buf, all_one, max_index);
}
#endif
std::size_t list_rows_pow2(const int32_t* qsl, const int32_t* seq, int32_t nra, const Pow2Div& rdiv,
                           const DsaRowBuffers& buf, bool all_one, int32_t& max_index) {
#if AAR_HAVE_X86_DISPATCH
  // Below two vectors of requests the clone's set-up costs more than it saves.
  if (nra >= 16 && detail::cpu_has_avx2()) return list_rows_pow2_avx2(qsl, seq, nra, rdiv, buf, all_one, max_index);
#endif
  return list_rows(qsl, seq, nra, rdiv, buf, all_one, max_index);
}

}  // namespace

void plan_dsa_rows(const DsaStepPlan& step, CSpan<int32_t> ratios, CSpan<DsaRowBuffers> bufs, Span<DsaRows> out) {
  const int32_t b = step.num_reqs, nra = step.num_reqs_actual;
  AAR_CHECK_ARG(b >= 0 && nra >= 0 && nra <= b && step.query_start_loc.size() == static_cast<std::size_t>(b) + 1 &&
                    step.seq_lens.size() == static_cast<std::size_t>(b),
                "step is not a plan from plan_dsa_step (num_reqs=", b, ", num_reqs_actual=", nra,
                ", query_start_loc has ", step.query_start_loc.size(), " entries)");
  AAR_CHECK_ARG(bufs.size() == ratios.size() && out.size() >= ratios.size(), "plan_dsa_rows: ", ratios.size(),
                " ratios need as many row buffers (got ", bufs.size(), ") and results (room for ", out.size(), ")");
  // Every request emits at most min(q, q / r + 1) rows, so the step at most
  // num_compressed_tokens (T >= the sum of q): room for that many suffices.
  for (std::size_t k = 0; k < ratios.size(); ++k) {
    AAR_CHECK_ARG(ratios[k] >= 0, "ratio=", ratios[k], " is negative");
    const int32_t r = std::max(ratios[k], 1);
    const auto cap = static_cast<std::size_t>(dsa_num_compressed_tokens(step.num_input_tokens, b, r));
    AAR_CHECK_ARG(bufs[k].request.size() >= cap && bufs[k].index.size() >= cap, "row buffers have room for ",
                  bufs[k].request.size(), " / ", bufs[k].index.size(), " rows, need num_compressed_tokens=", cap,
                  " at ratio ", r);
  }
  const int32_t* const qsl = step.query_start_loc.data();
  const int32_t* const seq = step.seq_lens.data();
  // The plan holds views of the caller's arrays: guard against their change
  // (plan_dsa_group's check and message), once for every ratio. Branch-free,
  // so it vectorises. Whether every real request has one token, in the same
  // pass: the lists' decode paths rely on it (the arrays' values, not the
  // plan's).
  int32_t neg = 0, not_one = 0;
  for (int32_t q_i = 0; q_i < nra; ++q_i) {
    const int32_t q = qsl[q_i + 1] - qsl[q_i];
    neg |= q | (seq[q_i] - q);
    not_one |= q ^ 1;
  }
  if (neg < 0) {
    for (int32_t q_i = 0; q_i < nra; ++q_i) {
      const int32_t q = qsl[q_i + 1] - qsl[q_i], s = seq[q_i];
      AAR_CHECK_ARG(q >= 0 && s >= q, "step: seq_lens[", q_i, "]=", s, " and query length ", q,
                    " are not a validated request (inputs changed after plan_dsa_step?)");
    }
  }
  // Writes.
  for (std::size_t k = 0; k < ratios.size(); ++k) {
    const int32_t r = std::max(ratios[k], 1);
    const NonNegDiv rdiv(r);
    const DsaRowBuffers& buf = bufs[k];
    int32_t max_index = -1;
    // Every V4 ratio is a power of two: its loop has no per-request branch on
    // the divisor's kind.
    const std::size_t n = rdiv.shift >= 0 ? list_rows_pow2(qsl, seq, nra, Pow2Div(rdiv), buf, not_one == 0, max_index)
                                          : list_rows(qsl, seq, nra, rdiv, buf, not_one == 0, max_index);
    DsaRows& rows = out[k];
    rows.ratio = r;
    rows.num_compressed_tokens = dsa_num_compressed_tokens(step.num_input_tokens, b, r);
    rows.max_index = max_index;
    rows.request = CSpan<int32_t>(buf.request.data(), n);
    rows.index = CSpan<int32_t>(buf.index.data(), n);
  }
}

DsaRows plan_dsa_rows(const DsaStepPlan& step, int32_t ratio, const DsaRowBuffers& buf) {
  DsaRows rows;
  plan_dsa_rows(step, CSpan<int32_t>(&ratio, 1), CSpan<DsaRowBuffers>(&buf, 1), Span<DsaRows>(&rows, 1));
  return rows;
}

namespace {

#if AAR_HAVE_X86_DISPATCH
// Lanes with (uint32)x <= m: min_epu32(x, m) == x.
__attribute__((target("avx2"), always_inline)) inline __m256i dsa_within_avx2(__m256i x, __m256i m) {
  return _mm256_cmpeq_epi32(_mm256_min_epu32(x, m), x);
}

// What the fused row pass below also checks for a ratio-1 group (one row a
// token: ri is the token's position): the columns before the token's own
// that its kernels read (DsaGroupReads; the union over a request's tokens is
// the request's read span). kind 0: nothing; 1: Window, [max(0, p - window),
// p]; 2: CompressorState, a token completing a row (p + 1 a multiple of 2^rshift)
// reads the state of [max(0, ((p >> rshift) - back) << rshift), p].
struct FusedReads {
  int kind = 0;
  int32_t window = 0;
  int rshift = 0;
  int32_t back = 0;  // state_coff - 1
};

// list_rows_check's passes fused into one, eight rows at a time (AVX2; a
// power-of-two page size): the request and page column of every row are
// bounds-checked, the block ids read with a masked gather (a row that fails
// its bounds reads nothing), checked against `limit` (block_id_limit) and
// stored in blocks[0, n); with `fr`, the columns each token reads before its
// own are gathered and checked too. Returns whether every row passed; on
// false the contents of `blocks` are unspecified and the caller's scalar
// checks name the error. Needs nra >= 1, stride >= 1 and nra * stride <=
// INT32_MAX (the gather's indices are int32), limit >= 1.
__attribute__((target("avx2"))) bool dsa_gather_block_ids_avx2(const int32_t* rq, const int32_t* ri, std::size_t n,
                                                               const int32_t* table, uint32_t nra, uint32_t stride,
                                                               int shift, uint32_t limit, int32_t* blocks,
                                                               const FusedReads& fr) {
  const __m256i max_req = _mm256_set1_epi32(static_cast<int32_t>(nra - 1));
  const __m256i max_col = _mm256_set1_epi32(static_cast<int32_t>(stride - 1));
  const __m256i max_id = _mm256_set1_epi32(static_cast<int32_t>(limit - 1));
  const __m256i vstride = _mm256_set1_epi32(static_cast<int32_t>(stride));
  const __m128i vshift = _mm_cvtsi32_si128(shift), vr = _mm_cvtsi32_si128(fr.rshift);
  const __m256i zero = _mm256_setzero_si256(), one = _mm256_set1_epi32(1);
  const __m256i vwin = _mm256_set1_epi32(fr.window), vback = _mm256_set1_epi32(fr.back);
  const __m256i rmask = _mm256_set1_epi32((1 << fr.rshift) - 1);
  __m256i all = _mm256_set1_epi32(-1);
  std::size_t k = 0;
  for (; k + 8 <= n; k += 8) {
    const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rq + k));
    const __m256i p = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ri + k));
    // A negative index shifts to a negative column, which fails as unsigned.
    const __m256i col = _mm256_sra_epi32(p, vshift);
    const __m256i in = _mm256_and_si256(dsa_within_avx2(q, max_req), dsa_within_avx2(col, max_col));
    const __m256i idx = _mm256_add_epi32(_mm256_mullo_epi32(q, vstride), col);
    const __m256i id = _mm256_mask_i32gather_epi32(_mm256_setzero_si256(), table, idx, in, 4);
    all = _mm256_and_si256(all, _mm256_and_si256(in, dsa_within_avx2(id, max_id)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(blocks + k), id);
    if (fr.kind == 0) continue;
    // The columns [col_lo, col) this token reads before its own: extra of them.
    __m256i lo;
    if (fr.kind == 1) {
      lo = _mm256_max_epi32(_mm256_sub_epi32(p, vwin), zero);
    } else {
      const __m256i completes = _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_add_epi32(p, one), rmask), zero);
      lo = _mm256_max_epi32(_mm256_sll_epi32(_mm256_sub_epi32(_mm256_sra_epi32(p, vr), vback), vr), zero);
      lo = _mm256_blendv_epi8(p, lo, completes);  // no row completes: nothing before p
    }
    const __m256i extra = _mm256_and_si256(_mm256_sub_epi32(col, _mm256_sra_epi32(lo, vshift)), in);
    __m256i at = idx;
    for (__m256i kk = zero;; kk = _mm256_add_epi32(kk, one)) {
      const __m256i take = _mm256_cmpgt_epi32(extra, kk);
      if (_mm256_testz_si256(take, take)) break;
      at = _mm256_sub_epi32(at, one);
      const __m256i id2 = _mm256_mask_i32gather_epi32(zero, table, at, take, 4);
      all = _mm256_andnot_si256(_mm256_andnot_si256(dsa_within_avx2(id2, max_id), take), all);
    }
  }
  bool ok = _mm256_movemask_epi8(all) == -1;
  for (; k < n; ++k) {
    const auto q = static_cast<uint32_t>(rq[k]);
    const int32_t p = ri[k];
    const auto col = static_cast<uint32_t>(p >> shift);
    if (q >= nra || col >= stride) return false;
    const int32_t* row = table + static_cast<std::size_t>(q) * stride;
    const int32_t id = row[col];
    blocks[k] = id;
    ok &= static_cast<uint32_t>(id) < limit;
    int32_t lo = p;
    if (fr.kind == 1) {
      lo = std::max(p - fr.window, 0);
    } else if (fr.kind == 2 && ((p + 1) & ((1 << fr.rshift) - 1)) == 0) {
      lo = std::max((p >> fr.rshift) - fr.back, 0) << fr.rshift;  // shifted after the clamp: no negative shift
    }
    for (int32_t c = lo >> shift; c < static_cast<int32_t>(col); ++c) ok &= static_cast<uint32_t>(row[c]) < limit;
  }
  return ok;
}
#endif

// The list's rows of one group, checked: a page column past the table or a
// bad block id (the unsigned bound of block_id_limit) sends the step through
// throw_group_row_error, the definition of the errors.
// Returns whether the group's reads (DsaGroupReads) were checked too (the
// fused AVX2 pass of a ratio-1 group); false: check_group_reads must run.
template <class Div>
bool list_rows_check(const DsaStepPlan& step, const DsaGroupInputs& g, const DsaRows& rows, const Div& sdiv,
                     const NonNegDiv& rdiv_checked, const NonNegDiv& sdiv_checked, int32_t* blocks) {
  const auto stride = static_cast<uint32_t>(g.block_table_stride);
  const uint32_t limit = block_id_limit(g);
  const int32_t* const rq = rows.request.data();
  const int32_t* const ri = rows.index.data();
  const int32_t* const table = g.block_table.data();
  const std::size_t n = rows.index.size();
  uint32_t bad = 0;
  bool ok = g.rope_positions == 0 || static_cast<int64_t>(rows.max_index) * rows.ratio < g.rope_positions;
#if AAR_HAVE_X86_DISPATCH
  if constexpr (std::is_same_v<Div, Pow2Div>) {
    const auto nra_u = static_cast<uint32_t>(step.num_reqs_actual);
    // A ratio-1 group's rows are its tokens: the fused pass checks their
    // reads as well (FusedReads), when the state ratio is a power of two.
    FusedReads fr;
    if (rows.ratio == 1 && g.reads == DsaGroupReads::Window) {
      fr.kind = 1;
      fr.window = g.read_window;
    } else if (rows.ratio == 1 && g.reads == DsaGroupReads::CompressorState) {
      const NonNegDiv sr(g.state_ratio);
      if (sr.shift >= 0) {
        fr.kind = 2;
        fr.rshift = sr.shift;
        fr.back = g.state_coff - 1;
      }
    }
    // The fused pass; on any failure the passes below find and name it.
    if (ok && blocks != nullptr && nra_u >= 1 && stride >= 1 && limit >= 1 &&
        static_cast<uint64_t>(nra_u) * stride <= static_cast<uint64_t>(kInt32Max) && detail::cpu_has_avx2() &&
        dsa_gather_block_ids_avx2(rq, ri, n, table, nra_u, stride, sdiv.shift, limit, blocks, fr)) {
      return fr.kind != 0;
    }
  }
#endif
  // A request outside the step can only come from a list of another step;
  // checked before any table read (branch-free, so it vectorises).
  // The page column of every row (a negative index fails too), in the same
  // branch-free pass: the table reads below then need no bound per row.
  const auto nra = static_cast<uint32_t>(step.num_reqs_actual);
  uint32_t foreign = 0, outside = 0;
  for (std::size_t k = 0; k < n; ++k) {
    foreign |= static_cast<uint32_t>(static_cast<uint32_t>(rq[k]) >= nra);
    outside |= static_cast<uint32_t>(static_cast<uint32_t>(sdiv.div(ri[k])) >= stride) |
               (static_cast<uint32_t>(ri[k]) >> 31);
  }
  if (foreign != 0) {
    for (std::size_t k = 0; k < n; ++k) {
      AAR_CHECK_ARG(static_cast<uint32_t>(rq[k]) < nra, "rows.request[", k, "]=", rq[k],
                    " is not a real request of the step (num_reqs_actual=", nra, "): rows are from another step");
    }
  }
  if (outside != 0) ok = false;
  if (ok) {
    auto id = [&](std::size_t k) {
      return table[static_cast<std::size_t>(rq[k]) * stride + static_cast<uint32_t>(sdiv.div(ri[k]))];
    };
    if (blocks != nullptr) {
      for (std::size_t k = 0; k < n; ++k) {
        const int32_t b = id(k);
        blocks[k] = b;
        bad |= static_cast<uint32_t>(static_cast<uint32_t>(b) >= limit);
      }
    } else {
      for (std::size_t k = 0; k < n; ++k) bad |= static_cast<uint32_t>(static_cast<uint32_t>(id(k)) >= limit);
    }
  }
  if (!ok || bad != 0) {
    throw_group_row_error(step, g, rows.ratio, rdiv_checked, sdiv_checked);
    throw_invalid("internal: plan_dsa_group's row-list validation failed where the per-request one did not");
  }
  return false;
}

template <bool kBlockOffset, class Div>
__attribute__((always_inline)) inline void list_rows_write(const DsaGroupInputs& g, const DsaRows& rows,
                                                           const Div& sdiv, const RowOut& out, const int32_t* blocks) {
  const std::size_t stride = static_cast<std::size_t>(g.block_table_stride);
  const int32_t* const rq = rows.request.data();
  const int32_t* const ri = rows.index.data();
  const int32_t* const table = g.block_table.data();
  const std::size_t n = rows.index.size();
  const int32_t sbs = g.storage_block_size, r = rows.ratio;
  int32_t* const slots = out.slots;
  auto put = [&](std::size_t k, int32_t block) {
    if (kBlockOffset) {
      slots[2 * k] = block;
      slots[2 * k + 1] = sdiv.mod(ri[k]);
    } else {
      slots[k] = block * sbs + sdiv.mod(ri[k]);
    }
  };
  if (blocks != nullptr) {  // the ids the validation pass read
    for (std::size_t k = 0; k < n; ++k) put(k, blocks[k]);
  } else {
    for (std::size_t k = 0; k < n; ++k) {
      put(k, table[static_cast<std::size_t>(rq[k]) * stride + static_cast<std::size_t>(sdiv.div(ri[k]))]);
    }
  }
  if (out.index != nullptr) std::copy(ri, ri + n, out.index);
  if (out.request != nullptr) std::copy(rq, rq + n, out.request);
  if (out.position != nullptr) {
    for (std::size_t k = 0; k < n; ++k) out.position[k] = ri[k] * r;
  }
}

// list_rows_write for the builders' case (a power-of-two page size, the ids
// in `blocks`): its loops vectorise eight rows wide in an AVX2 clone.
#if AAR_HAVE_X86_DISPATCH
template <bool kBlockOffset>
__attribute__((target("avx2"))) void list_rows_write_pow2_avx2(const DsaGroupInputs& g, const DsaRows& rows,
                                                               const Pow2Div& sdiv, const RowOut& out,
                                                               const int32_t* blocks) {
  list_rows_write<kBlockOffset>(g, rows, sdiv, out, blocks);
}
#endif
template <bool kBlockOffset>
void list_rows_write_pick(const DsaGroupInputs& g, const DsaRows& rows, const Pow2Div& sdiv, const RowOut& out,
                          const int32_t* blocks) {
#if AAR_HAVE_X86_DISPATCH
  if (blocks != nullptr && detail::cpu_has_avx2()) {
    list_rows_write_pow2_avx2<kBlockOffset>(g, rows, sdiv, out, blocks);
    return;
  }
#endif
  list_rows_write<kBlockOffset>(g, rows, sdiv, out, blocks);
}

}  // namespace

DsaGroupPlan plan_dsa_group(const DsaStepPlan& step, const DsaGroupInputs& g, const DsaGroupBuffers& buf,
                            const DsaRows& rows) {
  const GroupArgs a = check_group_args(step, g, buf);
  AAR_CHECK_ARG(rows.ratio == a.r && rows.num_compressed_tokens == a.num_rows &&
                    rows.request.size() == rows.index.size() && rows.index.size() <= a.rows_u,
                "rows are not plan_dsa_rows of this step at ratio ", a.r, " (rows.ratio=", rows.ratio,
                ", num_compressed_tokens=", rows.num_compressed_tokens, " vs ", a.num_rows, ", ", rows.index.size(),
                " rows)");
  const NonNegDiv rdiv(a.r), sdiv(a.sbs);
  int32_t* const blocks = buf.block_scratch.size() >= rows.index.size() ? buf.block_scratch.data() : nullptr;
  const bool reads_checked = sdiv.shift >= 0 ? list_rows_check(step, g, rows, Pow2Div(sdiv), rdiv, sdiv, blocks)
                                             : list_rows_check(step, g, rows, sdiv, rdiv, sdiv, blocks);
  if (!reads_checked) check_group_reads(step, g, a.r, a.sbs);
  stage_table(step, g, buf, a.stride);
  const RowOut out = row_out(buf);
  const bool block_offset = g.slot_format == SlotFormat::BlockOffset;
  if (sdiv.shift >= 0) {
    const Pow2Div sp2(sdiv);
    block_offset ? list_rows_write_pick<true>(g, rows, sp2, out, blocks)
                 : list_rows_write_pick<false>(g, rows, sp2, out, blocks);
  } else {
    block_offset ? list_rows_write<true>(g, rows, sdiv, out, blocks)
                 : list_rows_write<false>(g, rows, sdiv, out, blocks);
  }
  write_padding_rows(out, rows.index.size(), a.rows_u, g.slot_format, a.sbs, g.block_offset_skip);
  return {a.r, a.num_rows, static_cast<int32_t>(rows.index.size())};
}

int32_t dspark_swa_width(int32_t window, int32_t num_spec, int32_t width) {
  AAR_CHECK_ARG(window >= 1, "window=", window, " must be positive");
  AAR_CHECK_ARG(num_spec >= 0, "num_spec=", num_spec, " is negative");
  const int64_t need = static_cast<int64_t>(window) + num_spec;
  AAR_CHECK_ARG(width >= 0, "width=", width, " is negative");
  if (width == 0) {
    const int64_t w = (need + 127) / 128 * 128;
    AAR_CHECK_ARG(w <= kInt32Max, "window + num_spec = ", need, " is too large");
    return static_cast<int32_t>(w);
  }
  AAR_CHECK_ARG(width >= need, "width=", width, " is smaller than window + num_spec = ", need);
  return width;
}

int32_t build_dspark_swa_indices(const DsparkSwaInputs& in, Span<int32_t> out) {
  const int32_t width = dspark_swa_width(in.window, in.num_spec, in.width);
  const int32_t nra = check_batch(in.query_start_loc, in.seq_lens, in.num_reqs_actual);
  const auto b = static_cast<int32_t>(in.seq_lens.size());
  const CSpan<int32_t> qsl = in.query_start_loc;
  const int32_t bs = in.block_size;
  AAR_CHECK_ARG(bs > 0, "block_size=", bs, " must be positive");
  check_table_size(in.block_table, in.block_table_stride, static_cast<std::size_t>(b));
  AAR_CHECK_ARG(in.num_blocks >= 0, "num_blocks=", in.num_blocks, " is negative");
  AAR_CHECK_ARG(in.num_rows >= 0, "num_rows=", in.num_rows, " is negative");
  const int32_t t = in.num_rows == 0 ? qsl[b] : in.num_rows;
  const auto stride = static_cast<std::size_t>(in.block_table_stride);
  const std::size_t need = static_cast<std::size_t>(t) * static_cast<std::size_t>(width);
  AAR_CHECK_ARG(out.size() >= need, "out has room for ", out.size(), " entries, needs num_rows * width = ", t, " * ",
                width);
  for (int32_t r = 0; r < nra; ++r) {
    const int32_t q = qsl[r + 1] - qsl[r], s = in.seq_lens[r];
    if (q == 0 || qsl[r] >= t) continue;  // no row of this request is written
    const int32_t start = std::max(s - q - in.window, 0);
    const int32_t vis = s - start;
    AAR_CHECK_ARG(vis <= width, "request ", r, " sees ", vis, " positions (query length ", q, ", window ",
                  in.window, ") but width=", width, " (query length must be <= width - window)");
    if (vis == 0) continue;
    const int32_t col_last = (s - 1) / bs;
    AAR_CHECK_ARG(static_cast<std::size_t>(col_last) < stride, "seq_lens[", r, "]=", s, " needs ", col_last + 1,
                  " blocks but block_table_stride=", stride, " (block_size=", bs, ")");
    const int32_t* row = in.block_table.data() + static_cast<std::size_t>(r) * stride;
    for (int32_t col = start / bs; col <= col_last; ++col) {
      AAR_CHECK_ARG(row[col] >= 0 && (in.num_blocks == 0 || row[col] < in.num_blocks), "block_table[", r, "][", col,
                    "]=", row[col], " is out of range [0, ",
                    in.num_blocks == 0 ? std::string("inf") : std::to_string(in.num_blocks), ")");
      AAR_CHECK_ARG(static_cast<int64_t>(row[col]) * bs + (bs - 1) <= kInt32Max, "block_table[", r, "][", col,
                    "]=", row[col], " gives slots beyond int32 (block_size=", bs, ")");
    }
  }

  // Writes: every row -1 first, then each real request's first row and copies.
  std::fill(out.data(), out.data() + need, -1);
  for (int32_t r = 0; r < nra; ++r) {
    const int32_t q = qsl[r + 1] - qsl[r], s = in.seq_lens[r];
    if (q == 0 || qsl[r] >= t) continue;
    const int32_t start = std::max(s - q - in.window, 0);
    const int32_t vis = s - start;
    const int32_t* row = in.block_table.data() + static_cast<std::size_t>(r) * stride;
    int32_t* first = out.data() + static_cast<std::size_t>(qsl[r]) * width;
    for (int32_t j = 0; j < vis; ++j) {
      const int32_t p = start + j;
      first[j] = row[p / bs] * bs + p % bs;
    }
    const int32_t end = std::min(qsl[r + 1], t);
    for (int32_t tok = qsl[r] + 1; tok < end; ++tok) {
      std::copy(first, first + width, out.data() + static_cast<std::size_t>(tok) * width);
    }
  }
  return width;
}

}  // namespace aar::plan
