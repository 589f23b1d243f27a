// DSA (DeepSeek-V4) per-step planning (docs/design/dsa.md §3.1, §3.4, §1.2, §2.2, §4.1,
// docs/design/ops.md §4.6): slot formatting, compressed-row counts, the shared step plan and the
// per-group compressed-row slots against brute-force definitions written here
// (loops over every raw position; the docs/design/dsa.md §2.2 geometry derived from logical
// blocks of storage_bs * ratio raw tokens; the docs/design/ops.md §4.6 compressor_metadata
// pseudocode), the DSpark visible slots against a per-position definition,
// upstream's examples, random batches over ratios {1, 4, 128} and block sizes
// {32, 64, 128}, multi-step chunked prefill / speculative decode, graph
// padding, and every error path with the caller buffers unchanged.
#include <algorithm>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "ascend_attn_rt/dsa/plan/dsa_step_plan.h"
#include "ascend_attn_rt/plan/split.h"
#include "test_plan_util.h"

using namespace aar::plan;
using aar_test::lens_to_qsl;

namespace {

constexpr int32_t kSentinel = -777;

// ---- brute-force references ------------------------------------------------

// Encodes a flat slot (negative = skip) the way the header documents.
std::vector<int32_t> encode(const std::vector<int64_t>& flat, int32_t bs, SlotFormat f) {
  std::vector<int32_t> out;
  for (int64_t s : flat) {
    if (f == SlotFormat::Flat) {
      out.push_back(s < 0 ? -1 : static_cast<int32_t>(s));
    } else if (s < 0) {
      out.push_back(-1);
      out.push_back(bs - 1);
    } else {
      out.push_back(static_cast<int32_t>(s / bs));
      out.push_back(static_cast<int32_t>(s % bs));
    }
  }
  return out;
}

struct RefRows {
  std::vector<int64_t> slots;  // flat, -1 = padding
  std::vector<int32_t> index, position, request;
};

// Every raw position the step processes, in request order: a position p with
// (p + 1) % r == 0 completes compressed row c = (p + 1) / r - 1 (docs/design/dsa.md §1.2).
// Its page: the logical block holding raw position c * r covers storage_bs * r
// raw tokens (docs/design/dsa.md §2.2); inside it the row sits at c % storage_bs.
RefRows brute_rows(const std::vector<int32_t>& qsl, const std::vector<int32_t>& seq, int32_t nra,
                   const std::vector<int32_t>& table, int32_t stride, int32_t sbs, int32_t ratio, int32_t t_in) {
  const int32_t r = std::max(ratio, 1);
  const auto b = static_cast<int32_t>(seq.size());
  RefRows ref;
  for (int32_t q_i = 0; q_i < nra; ++q_i) {
    const int32_t q = qsl[q_i + 1] - qsl[q_i];
    for (int32_t p = seq[q_i] - q; p < seq[q_i]; ++p) {
      if ((p + 1) % r != 0) continue;
      const int32_t c = (p + 1) / r - 1;
      const int64_t logical = static_cast<int64_t>(c) * r / (static_cast<int64_t>(sbs) * r);
      ref.slots.push_back(static_cast<int64_t>(table[q_i * stride + logical]) * sbs + c % sbs);
      ref.index.push_back(c);
      ref.position.push_back(c * r);
      ref.request.push_back(q_i);
    }
  }
  const int32_t num_rows = r <= 1 ? t_in : std::min(t_in, t_in / r + b);
  EXPECT_LE(ref.slots.size(), static_cast<std::size_t>(num_rows));
  while (ref.slots.size() < static_cast<std::size_t>(num_rows)) {
    ref.slots.push_back(-1);
    ref.index.push_back(-1);
    ref.position.push_back(0);
    ref.request.push_back(-1);
  }
  return ref;
}

// docs/design/ops.md §4.6's compressor_metadata pseudocode, literally (valid inputs only):
// the slots of num_rows rows, for requests [0, num_reqs_actual).
std::vector<int64_t> spec9_slots(const std::vector<int32_t>& cu, const std::vector<int32_t>& start_pos,
                                 const std::vector<int32_t>& table, int32_t cols, int32_t sbs, int32_t r,
                                 int32_t num_rows, int32_t nra) {
  std::vector<int32_t> prefix(1, 0);
  for (int32_t b = 0; b < nra; ++b) {
    const int32_t q = cu[b + 1] - cu[b], start = start_pos[b];
    const int32_t rows_b = (start >= 0 && q > 0) ? (start + q) / r - start / r : 0;
    prefix.push_back(prefix.back() + rows_b);
  }
  const int32_t valid_rows = std::min(prefix.back(), num_rows);
  std::vector<int64_t> out;
  for (int32_t row = 0; row < num_rows; ++row) {
    bool valid = false;
    int64_t slot = -1;
    if (row < valid_rows) {
      int32_t b = 0;
      while (prefix[b + 1] <= row) ++b;
      const int32_t c = start_pos[b] / r + (row - prefix[b]);
      const int32_t blk_col = c / sbs;
      valid = blk_col < cols && table[b * cols + blk_col] >= 0;
      if (valid) slot = static_cast<int64_t>(table[b * cols + blk_col]) * sbs + c % sbs;
    }
    out.push_back(valid ? slot : -1);
  }
  return out;
}

// docs/design/dsa.md §3.4 per raw position: token rows of request b list, in ascending
// order, the slots of raw positions p < S_b with p >= max(S_b - q_b - W, 0).
std::vector<int32_t> brute_dspark(const std::vector<int32_t>& qsl, const std::vector<int32_t>& seq, int32_t nra,
                                  const std::vector<int32_t>& table, int32_t stride, int32_t bs, int32_t window,
                                  int32_t width, int32_t num_rows) {
  std::vector<int32_t> out(static_cast<std::size_t>(num_rows) * width, -1);
  for (int32_t b = 0; b < nra; ++b) {
    const int32_t q = qsl[b + 1] - qsl[b];
    std::vector<int32_t> row;
    for (int32_t p = 0; p < seq[b]; ++p) {
      if (p >= seq[b] - q - window) row.push_back(table[b * stride + p / bs] * bs + p % bs);
    }
    for (int32_t t = qsl[b]; t < qsl[b + 1] && t < num_rows; ++t) {
      std::copy(row.begin(), row.end(), out.begin() + static_cast<std::size_t>(t) * width);
    }
  }
  return out;
}

// Leading requests with q <= threshold are decodes (decode-first order).
SplitResult brute_split(const std::vector<int32_t>& qsl, int32_t thr) {
  const auto b = static_cast<int32_t>(qsl.size()) - 1;
  int32_t d = 0;
  while (d < b && qsl[d + 1] - qsl[d] <= thr) ++d;
  return {d, b - d, qsl[d], qsl[b] - qsl[d]};
}

// ---- fixtures --------------------------------------------------------------

struct Batch {
  std::vector<int32_t> qsl, seq;
  int32_t nra = -1;
  int32_t t_in = 0;
  int32_t k = 0;
};

struct Group {
  int32_t ratio = 1, sbs = 128, stride = 0, num_blocks = 0;
  SlotFormat format = SlotFormat::BlockOffset;
  std::vector<int32_t> table;
  DsaGroupInputs inputs() const {
    DsaGroupInputs g;
    g.compress_ratio = ratio;
    g.storage_block_size = sbs;
    g.block_table = table;
    g.block_table_stride = stride;
    g.num_blocks = num_blocks;
    g.slot_format = format;
    return g;
  }
};

struct GroupOut {
  std::vector<int32_t> bt, slots, index, position, request;
  void size_for(std::size_t b, int32_t stride, std::size_t rows) {
    bt.assign(b * stride, kSentinel);
    slots.assign(2 * rows + 3, kSentinel);
    for (auto* v : {&index, &position, &request}) v->assign(rows + 3, kSentinel);
  }
  DsaGroupBuffers buffers() {
    DsaGroupBuffers o;
    o.block_table = bt;
    o.slot_mapping = slots;
    o.row_index = index;
    o.row_position = position;
    o.row_request = request;
    return o;
  }
  std::vector<int32_t> all() const {
    std::vector<int32_t> v;
    for (const auto* x : {&bt, &slots, &index, &position, &request}) v.insert(v.end(), x->begin(), x->end());
    return v;
  }
};

template <typename T>
std::vector<T> head(const std::vector<T>& v, std::size_t n) {
  return std::vector<T>(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(n));
}

DsaStepInputs step_inputs(const Batch& bt) {
  DsaStepInputs in;
  in.query_start_loc = bt.qsl;
  in.seq_lens = bt.seq;
  in.num_reqs_actual = bt.nra;
  in.num_input_tokens = bt.t_in;
  in.num_speculative_tokens = bt.k;
  return in;
}

// Runs the step and the group, and checks everything against the references.
void check_group(const Batch& bt, const Group& g, const std::string& what) {
  SCOPED_TRACE(what);
  std::vector<int32_t> start(bt.seq.size() + 2, kSentinel);
  const DsaStepPlan step = plan_dsa_step(step_inputs(bt), start);
  const auto b = static_cast<int32_t>(bt.seq.size());
  const int32_t nra = bt.nra < 0 ? b : bt.nra;
  const int32_t t_in = bt.t_in == 0 ? bt.qsl.back() : bt.t_in;
  // start_pos and the trailing entries untouched.
  for (int32_t i = 0; i < b; ++i) {
    EXPECT_EQ(start[i], i < nra ? bt.seq[i] - (bt.qsl[i + 1] - bt.qsl[i]) : 0) << "start_pos[" << i << "]";
  }
  EXPECT_EQ(start[b], kSentinel);
  EXPECT_EQ(step.num_reqs, b);
  EXPECT_EQ(step.num_reqs_actual, nra);
  EXPECT_EQ(step.num_input_tokens, t_in);
  EXPECT_EQ(step.decode_threshold, 1 + bt.k);
  EXPECT_EQ(step.split, brute_split(bt.qsl, 1 + bt.k));

  const RefRows ref = brute_rows(bt.qsl, bt.seq, nra, g.table, g.stride, g.sbs, g.ratio, t_in);
  const std::size_t rows = ref.slots.size();
  GroupOut out;
  out.size_for(bt.seq.size(), g.stride, rows);
  const DsaGroupPlan gp = plan_dsa_group(step, g.inputs(), out.buffers());
  ASSERT_EQ(static_cast<std::size_t>(gp.num_compressed_tokens), rows);
  EXPECT_EQ(gp.ratio, std::max(g.ratio, 1));
  const int32_t w = g.format == SlotFormat::BlockOffset ? 2 : 1;
  EXPECT_EQ(head(out.slots, rows * w), encode(ref.slots, g.sbs, g.format));
  EXPECT_EQ(out.slots[rows * w], kSentinel);
  EXPECT_EQ(head(out.index, rows), ref.index);
  EXPECT_EQ(head(out.position, rows), ref.position);
  EXPECT_EQ(head(out.request, rows), ref.request);
  EXPECT_EQ(out.index[rows], kSentinel);
  EXPECT_EQ(gp.num_valid_rows, std::count_if(ref.request.begin(), ref.request.end(), [](int32_t x) { return x >= 0; }));

  // docs/design/ops.md §4.6 pseudocode (the device op) agrees on valid input.
  std::vector<int32_t> sp(start.begin(), start.begin() + b);
  EXPECT_EQ(spec9_slots(bt.qsl, sp, g.table, g.stride, g.sbs, std::max(g.ratio, 1), static_cast<int32_t>(rows), nra),
            ref.slots);
  // Staged table: real rows copied, padding rows zeroed.
  for (int32_t i = 0; i < b; ++i) {
    for (int32_t c = 0; c < g.stride; ++c) {
      EXPECT_EQ(out.bt[i * g.stride + c], i < nra ? g.table[i * g.stride + c] : 0) << i << "," << c;
    }
  }
  // For ratio 1 the rows are the tokens: the formatted token slot mapping.
  if (g.ratio <= 1 && nra == b) {
    std::vector<int32_t> tok = aar_test::naive_slots(bt.qsl, bt.seq, g.table, g.stride, g.sbs, t_in);
    std::vector<int32_t> fmt(tok.size() * w, kSentinel);
    format_dsa_slot_mapping(CSpan<int32_t>(tok), g.sbs, g.format, fmt);
    EXPECT_EQ(head(out.slots, rows * w), fmt);
  }
}

// A random table whose rows cover every logical block the lengths need, with
// distinct ids (a permutation) when possible.
Group random_group(std::mt19937& rng, const std::vector<int32_t>& seq, int32_t ratio, int32_t sbs, SlotFormat f) {
  Group g;
  g.ratio = ratio;
  g.sbs = sbs;
  g.format = f;
  const int64_t per_block = static_cast<int64_t>(sbs) * std::max(ratio, 1);
  int32_t need = 0;
  for (int32_t s : seq) need = std::max<int32_t>(need, static_cast<int32_t>((s + per_block - 1) / per_block));
  g.stride = need + static_cast<int32_t>(rng() % 3);
  g.num_blocks = static_cast<int32_t>(seq.size()) * g.stride + 5;
  std::vector<int32_t> ids(g.num_blocks);
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  g.table.assign(ids.begin(), ids.begin() + seq.size() * g.stride);
  return g;
}

}  // namespace

// ---- 1. slot formatting ------------------------------------------------------

TEST(DsaSlotFormat, BlockOffsetFloorAndSkip) {
  const std::vector<int64_t> slots = {0, 1, 127, 128, 300, -1, -5, 5000000000LL};
  std::vector<int32_t> out(2 * slots.size() + 1, kSentinel);
  format_dsa_slot_mapping(CSpan<int64_t>(slots), 128, SlotFormat::BlockOffset, out);
  const std::vector<int32_t> want = {0, 0, 0, 1, 0, 127, 1, 0, 2, 44, -1, 127, -1, 127, 39062500, 0, kSentinel};
  EXPECT_EQ(out, want);
  EXPECT_EQ(slot_format_width(SlotFormat::BlockOffset), 2);
  EXPECT_EQ(slot_format_width(SlotFormat::Flat), 1);
}

TEST(DsaSlotFormat, BlockOffsetMinusOneSkip) {
  // docs/design/dsa.md §4.2 (the A5 + BF16 plan): valid slots split as before, every negative slot -> (-1, -1) by rule, never
  // by a % of the negative value; Flat ignores the choice.
  const std::vector<int64_t> slots = {0, 1, 127, 128, 300, -1, -5, -128, 5000000000LL};
  std::vector<int32_t> out(2 * slots.size() + 1, kSentinel);
  format_dsa_slot_mapping(CSpan<int64_t>(slots), 128, SlotFormat::BlockOffset, out, BlockOffsetSkip::MinusOne);
  const std::vector<int32_t> want = {0, 0, 0, 1, 0, 127, 1, 0, 2, 44, -1, -1, -1, -1, -1, -1, 39062500, 0,
                                     kSentinel};
  EXPECT_EQ(out, want);
  std::vector<int32_t> last(2 * slots.size(), kSentinel);
  format_dsa_slot_mapping(CSpan<int64_t>(slots), 128, SlotFormat::BlockOffset, last);  // default: LastOffset
  for (std::size_t i = 0; i < slots.size(); ++i) {
    EXPECT_EQ(out[2 * i], last[2 * i]) << i;  // the same block, -1 included
    EXPECT_EQ(out[2 * i + 1], slots[i] < 0 ? -1 : last[2 * i + 1]) << i;
  }
  const std::vector<int32_t> flat_in = {7, -1, -9};
  std::vector<int32_t> flat(3, kSentinel);
  format_dsa_slot_mapping(CSpan<int32_t>(flat_in), 64, SlotFormat::Flat, flat, BlockOffsetSkip::MinusOne);
  EXPECT_EQ(flat, (std::vector<int32_t>{7, -1, -1}));
  std::vector<int32_t> keep(6, kSentinel);
  EXPECT_INVALID(format_dsa_slot_mapping(CSpan<int32_t>(flat_in), 64, SlotFormat::BlockOffset, keep,
                                         static_cast<BlockOffsetSkip>(5)),
                 "block_offset_skip=5");
  EXPECT_EQ(keep, std::vector<int32_t>(6, kSentinel));
}

TEST(DsaGroup, MinusOneSkipRowsAfterTheValidPrefix) {
  // Graph padding (two dummies with tokens, padded T): with block_offset_skip = MinusOne the valid rows are those
  // of LastOffset, first; every row past num_valid_rows is (-1, -1) instead of (-1, bs-1).
  Batch bt;
  bt.qsl = {0, 2, 4, 6, 8};
  bt.seq = {515, 128, 3, 2};
  bt.nra = 2;
  bt.k = 1;
  bt.t_in = 10;
  std::mt19937 rng(5);
  for (int32_t r : {1, 4}) {
    Group g = random_group(rng, {515, 128, 515, 515}, r, 32, SlotFormat::BlockOffset);
    std::vector<int32_t> start(4, kSentinel);
    const DsaStepPlan step = plan_dsa_step(step_inputs(bt), start);
    auto run = [&](BlockOffsetSkip skip, std::vector<int32_t>& slots) {
      DsaGroupInputs in = g.inputs();
      in.block_offset_skip = skip;
      slots.assign(2 * 10 + 1, kSentinel);
      DsaGroupBuffers buf;
      buf.slot_mapping = slots;
      return plan_dsa_group(step, in, buf);
    };
    std::vector<int32_t> last, minus;
    const DsaGroupPlan a = run(BlockOffsetSkip::LastOffset, last), b = run(BlockOffsetSkip::MinusOne, minus);
    ASSERT_EQ(a.num_valid_rows, b.num_valid_rows);
    ASSERT_EQ(a.num_compressed_tokens, b.num_compressed_tokens);
    const int32_t rows = b.num_compressed_tokens, valid = b.num_valid_rows;
    EXPECT_EQ(valid, r == 1 ? 4 : 1) << r;  // ratio 1: the real requests' 4 tokens; ratio 4: row 31 of request 1
    for (int32_t i = 0; i < rows; ++i) {
      if (i < valid) {
        EXPECT_GE(minus[2 * i], 0) << r << " row " << i;
        EXPECT_EQ(minus[2 * i], last[2 * i]);
        EXPECT_EQ(minus[2 * i + 1], last[2 * i + 1]);
      } else {
        EXPECT_EQ(minus[2 * i], -1) << r << " row " << i;
        EXPECT_EQ(minus[2 * i + 1], -1) << r << " row " << i;
        EXPECT_EQ(last[2 * i + 1], 31) << r << " row " << i;
      }
    }
    EXPECT_EQ(minus[2 * rows], kSentinel);
  }
}

TEST(DsaSlotFormat, FlatCopiesAndCanonicalisesNegatives) {
  const std::vector<int32_t> slots = {7, 0, -1, -3, 2147483647};
  std::vector<int32_t> out(slots.size(), kSentinel);
  format_dsa_slot_mapping(CSpan<int32_t>(slots), 64, SlotFormat::Flat, out);
  EXPECT_EQ(out, (std::vector<int32_t>{7, 0, -1, -1, 2147483647}));
}

TEST(DsaSlotFormat, MatchesFloorDivisionForEveryValidSlotAndMinusOne) {
  // Upstream's format is floor division; its only negative slot is -1.
  for (int32_t bs : {32, 64, 128, 100}) {
    std::vector<int64_t> slots;
    for (int64_t s = -1; s < 3 * bs + 7; ++s) slots.push_back(s);
    std::vector<int32_t> out(2 * slots.size(), kSentinel);
    format_dsa_slot_mapping(CSpan<int64_t>(slots), bs, SlotFormat::BlockOffset, out);
    for (std::size_t i = 0; i < slots.size(); ++i) {
      const int64_t s = slots[i];
      const int64_t fb = (s >= 0) ? s / bs : -((-s + bs - 1) / bs);  // floor
      EXPECT_EQ(out[2 * i], fb) << s;
      EXPECT_EQ(out[2 * i + 1], s - fb * bs) << s;
    }
  }
}

TEST(DsaSlotFormat, Errors) {
  std::vector<int32_t> out(8, kSentinel);
  const std::vector<int32_t> before = out;
  const std::vector<int64_t> slots = {1, 2, 3};
  EXPECT_INVALID(format_dsa_slot_mapping(CSpan<int64_t>(slots), 0, SlotFormat::Flat, out), "storage_block_size=0");
  EXPECT_INVALID(format_dsa_slot_mapping(CSpan<int64_t>(slots), -4, SlotFormat::BlockOffset, out),
                 "storage_block_size=-4");
  EXPECT_INVALID(format_dsa_slot_mapping(CSpan<int64_t>(slots), 16, static_cast<SlotFormat>(3), out),
                 "slot_format=3");
  EXPECT_INVALID(format_dsa_slot_mapping(CSpan<int64_t>(slots), 16, SlotFormat::BlockOffset, Span<int32_t>(out.data(), 5)),
                 "needs 6");
  const std::vector<int64_t> big = {1, 3000000000LL};
  EXPECT_INVALID(format_dsa_slot_mapping(CSpan<int64_t>(big), 16, SlotFormat::Flat, out), "slots[1]=3000000000");
  const std::vector<int64_t> huge = {0, int64_t{1} << 40};
  EXPECT_INVALID(format_dsa_slot_mapping(CSpan<int64_t>(huge), 16, SlotFormat::BlockOffset, out), "slots[1]=");
  EXPECT_EQ(out, before);
  EXPECT_INVALID(slot_format_width(static_cast<SlotFormat>(0)), "slot_format=0");
}

// ---- 2. counts ---------------------------------------------------------------

TEST(DsaCounts, SpecExamples) {
  EXPECT_EQ(dsa_num_compressed_tokens(13, 3, 1), 13);
  EXPECT_EQ(dsa_num_compressed_tokens(13, 3, 0), 13);
  EXPECT_EQ(dsa_num_compressed_tokens(13, 3, 4), 6);
  EXPECT_EQ(dsa_num_compressed_tokens(13, 3, 128), 3);
  EXPECT_EQ(dsa_num_compressed_tokens(2, 3, 4), 2);  // min with T
  EXPECT_EQ(dsa_num_compressed_tokens(0, 0, 128), 0);
  EXPECT_INVALID(dsa_num_compressed_tokens(-1, 3, 4), "num_tokens=-1");
  EXPECT_INVALID(dsa_num_compressed_tokens(1, -3, 4), "num_reqs=-3");
  EXPECT_INVALID(dsa_num_compressed_tokens(1, 3, -4), "ratio=-4");
}

TEST(DsaCounts, StorageBlockSizeSpecTable) {
  // docs/design/dsa.md §2.2 at cache bs 128 / 64 / 32: every compressed cache stores bs rows a page.
  for (int32_t bs : {32, 64, 128}) {
    EXPECT_EQ(dsa_storage_block_size(bs, 0), bs);
    EXPECT_EQ(dsa_storage_block_size(bs, 1), bs);
    EXPECT_EQ(dsa_storage_block_size(bs * 4, 4), bs);
    EXPECT_EQ(dsa_storage_block_size(bs * 128, 128), bs);
  }
  EXPECT_INVALID(dsa_storage_block_size(130, 4), "block_size=130 is not a multiple of compress_ratio=4");
  EXPECT_INVALID(dsa_storage_block_size(0, 4), "block_size=0");
  EXPECT_INVALID(dsa_storage_block_size(128, -1), "compress_ratio=-1");
}

TEST(DsaCounts, RowsPerRequestAgainstEveryRawPosition) {
  for (int32_t r : {0, 1, 2, 4, 128}) {
    for (int32_t ctx = 0; ctx < 300; ctx += 7) {
      for (int32_t q = 0; q < 300; q += 11) {
        const int32_t rr = std::max(r, 1);
        int32_t count = 0, first = -1;
        for (int32_t p = ctx; p < ctx + q; ++p) {
          if ((p + 1) % rr == 0) {
            if (first < 0) first = (p + 1) / rr - 1;
            ++count;
          }
        }
        const DsaCompressedRows got = dsa_compressed_rows(ctx, q, r);
        EXPECT_EQ(got.count, count) << r << " " << ctx << " " << q;
        if (count > 0) EXPECT_EQ(got.first, first) << r << " " << ctx << " " << q;
        EXPECT_EQ(got.first, ctx / rr);
      }
    }
  }
  EXPECT_INVALID(dsa_compressed_rows(-1, 2, 4), "context_len=-1");
  EXPECT_INVALID(dsa_compressed_rows(1, -2, 4), "query_len=-2");
  EXPECT_INVALID(dsa_compressed_rows(1, 2, -4), "ratio=-4");
  EXPECT_INVALID(dsa_compressed_rows(2147483600, 100, 4), "does not fit int32");
}

// ---- 3/4/6. step + group -----------------------------------------------------

TEST(DsaGroup, SpecNineExamples) {
  // C4, start 508, q 8, table [10, 11] -> (10,127), (11,0).
  Batch bt;
  bt.qsl = {0, 8};
  bt.seq = {516};
  Group g;
  g.ratio = 4;
  g.sbs = 128;
  g.stride = 2;
  g.table = {10, 11};
  check_group(bt, g, "c4");
  std::vector<int32_t> start(1);
  const DsaStepPlan step = plan_dsa_step(step_inputs(bt), start);
  std::vector<int32_t> slots(2 * 3, kSentinel);  // num rows = min(8, 8/4 + 1) = 3
  DsaGroupBuffers buf;
  buf.slot_mapping = slots;
  const DsaGroupPlan gp = plan_dsa_group(step, g.inputs(), buf);
  EXPECT_EQ(gp.num_compressed_tokens, 3);
  EXPECT_EQ(gp.num_valid_rows, 2);
  EXPECT_EQ(slots, (std::vector<int32_t>{10, 127, 11, 0, -1, 127}));
  // Flat.
  g.format = SlotFormat::Flat;
  std::vector<int32_t> flat(3, kSentinel);
  buf.slot_mapping = flat;
  plan_dsa_group(step, g.inputs(), buf);
  EXPECT_EQ(flat, (std::vector<int32_t>{10 * 128 + 127, 11 * 128, -1}));

  // C128, start 16256, q 256, table [20, 21] -> (20,127), (21,0).
  Batch b2;
  b2.qsl = {0, 256};
  b2.seq = {16512};
  Group g2;
  g2.ratio = 128;
  g2.sbs = 128;
  g2.stride = 2;
  g2.table = {20, 21};
  check_group(b2, g2, "c128");
  std::vector<int32_t> start2(1);
  const DsaStepPlan step2 = plan_dsa_step(step_inputs(b2), start2);
  std::vector<int32_t> s2(2 * 3, kSentinel);  // min(256, 2 + 1) = 3
  DsaGroupBuffers buf2;
  buf2.slot_mapping = s2;
  plan_dsa_group(step2, g2.inputs(), buf2);
  EXPECT_EQ(s2, (std::vector<int32_t>{20, 127, 21, 0, -1, 127}));
}

TEST(DsaGroup, SpecCountExampleThreeGroupsShareOneStep) {
  // T = 13 over B = 3 (docs/design/dsa.md §3.1): 13 / 6 / 3 rows for ratios 1 / 4 / 128,
  // three groups deriving from the one step plan.
  Batch bt;
  bt.qsl = lens_to_qsl({1, 4, 8});
  bt.seq = {129, 260, 8};
  bt.k = 3;
  std::vector<int32_t> start(3);
  const DsaStepPlan step = plan_dsa_step(step_inputs(bt), start);
  EXPECT_EQ(start, (std::vector<int32_t>{128, 256, 0}));
  EXPECT_EQ(step.split, (SplitResult{2, 1, 5, 8}));  // q=4 <= 1+3 is a decode
  EXPECT_TRUE(step.has_prefill());
  EXPECT_EQ(step.max_seqlen_q, 8);
  EXPECT_EQ(step.max_seqlen_kv, 260);
  std::mt19937 rng(5);
  const int32_t want[] = {13, 6, 3};
  int i = 0;
  for (int32_t r : {1, 4, 128}) {
    Group g = random_group(rng, bt.seq, r, 64, SlotFormat::BlockOffset);
    std::vector<int32_t> slots(2 * 13, kSentinel);
    DsaGroupBuffers buf;
    buf.slot_mapping = slots;
    const DsaGroupPlan gp = plan_dsa_group(step, g.inputs(), buf);
    EXPECT_EQ(gp.num_compressed_tokens, want[i++]) << r;
    check_group(bt, g, "ratio " + std::to_string(r));
  }
  // Ratio 4 emits: request 0 (ctx 128, q 1): none; request 1 (ctx 256, q 4):
  // row 64; request 2 (ctx 0, q 8): rows 0, 1.
  Group g4 = random_group(rng, bt.seq, 4, 64, SlotFormat::Flat);
  std::vector<int32_t> idx(6), slots(6);
  DsaGroupBuffers buf;
  buf.slot_mapping = slots;
  buf.row_index = idx;
  plan_dsa_group(step, g4.inputs(), buf);
  EXPECT_EQ(idx, (std::vector<int32_t>{64, 0, 1, -1, -1, -1}));
  EXPECT_EQ(slots[0], g4.table[1 * g4.stride + 1] * 64 + 0);
}

TEST(DsaGroup, RandomBatchesAllRatiosBlockSizesFormats) {
  for (uint32_t seed = 1; seed <= 60; ++seed) {
    std::mt19937 rng(seed);
    Batch bt;
    bt.k = static_cast<int32_t>(rng() % 4);
    const int32_t b = 1 + static_cast<int32_t>(rng() % 8);
    std::vector<int32_t> q(b);
    std::vector<int32_t> seq(b);
    const int kind = static_cast<int>(seed % 4);  // decode-only, prefill, mixed, speculative
    for (int32_t i = 0; i < b; ++i) {
      const int32_t ctx = (kind == 1 && rng() % 2) ? 0 : static_cast<int32_t>(rng() % 20000);
      if (kind == 0) q[i] = 1;
      else if (kind == 3) q[i] = 1 + static_cast<int32_t>(rng() % (bt.k + 1));
      else q[i] = 1 + static_cast<int32_t>(rng() % 700);
      seq[i] = ctx + q[i];
    }
    if (kind == 2) {  // decode-first: decodes, then prefills
      std::sort(q.begin(), q.end());
      for (int32_t i = 0; i < b; ++i) seq[i] = static_cast<int32_t>(rng() % 9000) + q[i];
    }
    bt.qsl = lens_to_qsl(q);
    bt.seq = seq;
    bt.t_in = (rng() % 2) ? 0 : bt.qsl.back() + static_cast<int32_t>(rng() % 9);
    for (int32_t r : {1, 4, 128}) {
      for (int32_t sbs : {32, 64, 128}) {
        for (SlotFormat f : {SlotFormat::BlockOffset, SlotFormat::Flat}) {
          const Group g = random_group(rng, seq, r, sbs, f);
          check_group(bt, g,
                      "seed " + std::to_string(seed) + " r " + std::to_string(r) + " sbs " + std::to_string(sbs));
          if (::testing::Test::HasFailure()) return;
        }
      }
    }
  }
}

TEST(DsaGroup, GraphPaddingRows) {
  // Two real decodes, two padded dummies (with tokens but no KV), padded T.
  Batch bt;
  bt.qsl = {0, 2, 4, 6, 8};
  bt.seq = {515, 128, 0, 0};
  bt.nra = 2;
  bt.k = 1;
  bt.t_in = 10;
  std::mt19937 rng(11);
  for (int32_t r : {1, 4, 128}) {
    Group g = random_group(rng, {515, 128, 515, 515}, r, 32, SlotFormat::BlockOffset);
    check_group(bt, g, "padding r " + std::to_string(r));
  }
  std::vector<int32_t> start(4, kSentinel);
  const DsaStepPlan step = plan_dsa_step(step_inputs(bt), start);
  EXPECT_EQ(start, (std::vector<int32_t>{513, 126, 0, 0}));
  EXPECT_EQ(step.num_reqs_actual, 2);
  EXPECT_EQ(step.split, (SplitResult{4, 0, 8, 0}));
  // In-place staging: only padding rows are zeroed.
  Group g = random_group(rng, {515, 515, 515, 515}, 4, 32, SlotFormat::Flat);
  std::vector<int32_t> table = g.table;
  g.table = table;
  DsaGroupInputs in = g.inputs();
  in.block_table = table;
  std::vector<int32_t> slots(10, kSentinel);
  DsaGroupBuffers buf;
  buf.block_table = table;
  buf.slot_mapping = slots;
  const DsaGroupPlan gp = plan_dsa_group(step, in, buf);
  EXPECT_EQ(gp.num_compressed_tokens, std::min(10, 10 / 4 + 4));
  for (int32_t i = 0; i < 4 * g.stride; ++i) EXPECT_EQ(table[i], i < 2 * g.stride ? g.table[i] : 0) << i;
  // Request 0 (ctx 513, q 2): 515/4 - 513/4 = 0 rows; request 1 (ctx 126,
  // q 2): row 31.
  EXPECT_EQ(gp.num_valid_rows, 1);
  EXPECT_EQ(slots[0], g.table[1 * g.stride + 0] * 32 + 31);
}

TEST(DsaGroup, ChunkedPrefillAndSpeculativeDecodeAcrossSteps) {
  // A long prompt in chunks next to a speculative decoder; across steps every
  // compressed row of every group is emitted exactly once (rejected draft
  // tokens roll the context back, so their rows are emitted again), and
  // each step matches the brute force.
  std::mt19937 rng(99);
  const int32_t prompt = 9000, k = 3;
  std::vector<int32_t> max_seq = {prompt + 2000, prompt + 2000};
  std::vector<Group> groups;
  for (int32_t r : {1, 4, 128}) groups.push_back(random_group(rng, max_seq, r, 64, SlotFormat::BlockOffset));
  int32_t done0 = 0;             // prefilling request: tokens computed
  int32_t ctx1 = 4000;           // decoding request: accepted context
  std::vector<std::vector<int32_t>> emitted(groups.size());  // request 0's rows per group
  int steps = 0;
  while (done0 < prompt + 300) {
    const int32_t chunk = done0 < prompt ? std::min<int32_t>(prompt - done0, 1 + rng() % 1500) : 1;
    const int32_t q1 = 1 + k;
    Batch bt;
    bt.k = k;
    // Decode-first: the speculative decoder, then the chunk (a decode once the
    // prompt is done).
    bt.qsl = lens_to_qsl({q1, chunk});
    bt.seq = {ctx1 + q1, done0 + chunk};
    for (std::size_t gi = 0; gi < groups.size(); ++gi) {
      check_group(bt, groups[gi], "step " + std::to_string(steps));
      std::vector<int32_t> start(2);
      const DsaStepPlan step = plan_dsa_step(step_inputs(bt), start);
      const std::size_t rows = static_cast<std::size_t>(step.num_input_tokens);
      std::vector<int32_t> slots(2 * rows), req(rows), idx(rows);
      DsaGroupBuffers buf;
      buf.slot_mapping = slots;
      buf.row_request = req;
      buf.row_index = idx;
      const DsaGroupPlan gp = plan_dsa_group(step, groups[gi].inputs(), buf);
      for (int32_t i = 0; i < gp.num_compressed_tokens; ++i) {
        if (req[i] == 1) emitted[gi].push_back(idx[i]);
      }
    }
    done0 += chunk;
    ctx1 += 1 + static_cast<int32_t>(rng() % (k + 1));  // accepted tokens
    ++steps;
    if (::testing::Test::HasFailure()) return;
  }
  EXPECT_GT(steps, 8);
  for (std::size_t gi = 0; gi < groups.size(); ++gi) {
    const int32_t r = std::max(groups[gi].ratio, 1);
    std::vector<int32_t> want(done0 / r);
    std::iota(want.begin(), want.end(), 0);
    EXPECT_EQ(emitted[gi], want) << "ratio " << r;
  }
}

TEST(DsaGroup, EmptyStepAndZeroMaxima) {
  Batch bt;
  bt.qsl = {0};
  bt.seq = {};
  std::vector<int32_t> start;
  const DsaStepPlan step = plan_dsa_step(step_inputs(bt), start);
  EXPECT_EQ(step.max_seqlen_q, 0);
  EXPECT_EQ(step.max_seqlen_kv, 0);
  EXPECT_EQ(step.split, SplitResult{});
  Group g;
  g.ratio = 4;
  g.sbs = 128;
  DsaGroupBuffers buf;
  const DsaGroupPlan gp = plan_dsa_group(step, g.inputs(), buf);
  EXPECT_EQ(gp.num_compressed_tokens, 0);
  // Padded tokens only: rows of padding.
  bt.t_in = 5;
  const DsaStepPlan s2 = plan_dsa_step(step_inputs(bt), start);
  std::vector<int32_t> slots(10, kSentinel);
  buf.slot_mapping = slots;
  EXPECT_EQ(plan_dsa_group(s2, g.inputs(), buf).num_compressed_tokens, 1);  // min(5, 5/4 + 0)
  EXPECT_EQ(head(slots, 2), (std::vector<int32_t>{-1, 127}));
  EXPECT_EQ(slots[2], kSentinel);
}

TEST(DsaStep, SplitUsesShortExtendsAsDecodesAndThresholdBound) {
  Batch bt;
  bt.qsl = lens_to_qsl({1, 16, 17, 3});
  bt.seq = {10, 40, 17, 3};
  bt.k = 15;
  std::vector<int32_t> start(4);
  EXPECT_EQ(plan_dsa_step(step_inputs(bt), start).split, (SplitResult{2, 2, 17, 20}));
  EXPECT_EQ(dsa_decode_threshold(0), 1);
  EXPECT_EQ(dsa_decode_threshold(15), 16);
  EXPECT_INVALID(dsa_decode_threshold(16), "num_speculative_tokens=16");
  EXPECT_INVALID(dsa_decode_threshold(-1), "num_speculative_tokens=-1");
}

TEST(DsaStep, AfterTheSharedReorderDecodesLead) {
  // The persistent batch is reordered with plan::reorder_decode_first at the
  // DSA threshold; the step's split then counts every request with context
  // and q <= 1 + k as a decode, and no request after them is one.
  for (uint32_t seed = 1; seed <= 30; ++seed) {
    std::mt19937 rng(seed);
    const int32_t k = static_cast<int32_t>(rng() % 4), thr = dsa_decode_threshold(k);
    const int32_t b = 1 + static_cast<int32_t>(rng() % 10);
    std::vector<int32_t> sched(b), computed(b);
    for (int32_t i = 0; i < b; ++i) {
      sched[i] = (rng() % 2) ? 1 + static_cast<int32_t>(rng() % thr) : thr + 1 + static_cast<int32_t>(rng() % 50);
      computed[i] = (rng() % 4 == 0) ? 0 : 1 + static_cast<int32_t>(rng() % 500);
    }
    const std::vector<uint8_t> prefilling(b, 0);
    std::vector<int32_t> perm(b), swaps(2 * b);
    reorder_decode_first(sched, computed, prefilling, thr, perm, swaps);
    std::vector<int32_t> q(b), seq(b);
    int32_t decodes_with_context = 0;
    for (int32_t i = 0; i < b; ++i) {
      q[i] = sched[perm[i]];
      seq[i] = computed[perm[i]] + q[i];
      decodes_with_context += computed[perm[i]] > 0 && q[i] <= thr;
    }
    Batch bt;
    bt.qsl = lens_to_qsl(q);
    bt.seq = seq;
    bt.k = k;
    std::vector<int32_t> start(b);
    const DsaStepPlan step = plan_dsa_step(step_inputs(bt), start);
    EXPECT_EQ(step.split, brute_split(bt.qsl, thr)) << seed;
    EXPECT_GE(step.split.num_decodes, decodes_with_context) << seed;
    for (int32_t i = step.split.num_decodes; i < b; ++i) {
      EXPECT_TRUE(q[i] > thr || seq[i] == q[i]) << "seed " << seed << " request " << i;
    }
  }
}

TEST(DsaStep, Errors) {
  Batch good;
  good.qsl = lens_to_qsl({1, 5});
  good.seq = {10, 5};
  std::vector<int32_t> start(2, kSentinel);
  auto expect = [&](Batch bt, DsaStepInputs in, Span<int32_t> out, const char* msg) {
    (void)bt;
    EXPECT_INVALID(plan_dsa_step(in, out), msg);
    EXPECT_EQ(start, (std::vector<int32_t>{kSentinel, kSentinel}));
  };
  {
    Batch bt = good;
    bt.qsl = {1, 2, 6};
    expect(bt, step_inputs(bt), start, "query_start_loc[0]=1");
  }
  {
    Batch bt = good;
    bt.qsl = {0, 3, 2};
    expect(bt, step_inputs(bt), start, "query_start_loc must be non-decreasing");
  }
  {
    Batch bt = good;
    bt.qsl = {};
    expect(bt, step_inputs(bt), start, "query_start_loc must have at least one entry");
  }
  {
    Batch bt = good;
    bt.seq = {10};
    expect(bt, step_inputs(bt), start, "seq_lens has 1 entries");
  }
  {
    Batch bt = good;
    bt.seq = {10, 4};
    expect(bt, step_inputs(bt), start, "seq_lens[1]=4 is smaller than its query length 5");
  }
  {
    Batch bt = good;
    bt.seq = {10, -1};
    bt.nra = 1;
    expect(bt, step_inputs(bt), start, "seq_lens[1]=-1 is negative");
  }
  {
    Batch bt = good;
    bt.nra = 3;
    expect(bt, step_inputs(bt), start, "num_reqs_actual=3");
  }
  {
    Batch bt = good;
    bt.nra = -2;
    expect(bt, step_inputs(bt), start, "num_reqs_actual=-2");
  }
  {
    Batch bt = good;
    bt.t_in = 5;
    expect(bt, step_inputs(bt), start, "num_input_tokens=5 is smaller than query_start_loc[B]=6");
  }
  {
    Batch bt = good;
    bt.k = 16;
    expect(bt, step_inputs(bt), start, "num_speculative_tokens=16");
  }
  {
    DsaStepInputs in = step_inputs(good);
    in.max_num_reqs = 1;
    expect(good, in, start, "B=2 exceeds max_num_reqs=1");
    in.max_num_reqs = -1;
    expect(good, in, start, "max_num_reqs=-1");
  }
  {
    DsaStepInputs in = step_inputs(good);
    in.max_num_tokens = 5;
    expect(good, in, start, "num_input_tokens=6 exceeds max_num_tokens=5");
    in.max_num_tokens = -5;
    expect(good, in, start, "max_num_tokens=-5");
  }
  expect(good, step_inputs(good), Span<int32_t>(start.data(), 1), "start_pos_out has room for 1 entries, needs B=2");
}

TEST(DsaGroup, Errors) {
  Batch bt;
  bt.qsl = lens_to_qsl({4, 600});
  bt.seq = {2000, 700};
  std::vector<int32_t> start(2);
  const DsaStepPlan step = plan_dsa_step(step_inputs(bt), start);
  std::mt19937 rng(3);
  const Group good = random_group(rng, bt.seq, 4, 32, SlotFormat::BlockOffset);  // stride >= 16
  GroupOut out;
  out.size_for(2, good.stride, 604);
  const std::vector<int32_t> before = out.all();
  auto expect_bad = [&](const DsaGroupInputs& in, const DsaGroupBuffers& buf, const char* msg) {
    EXPECT_INVALID(plan_dsa_group(step, in, buf), msg);
    EXPECT_EQ(out.all(), before);
  };
  DsaGroupInputs in = good.inputs();
  in.storage_block_size = 0;
  expect_bad(in, out.buffers(), "storage_block_size=0");
  in = good.inputs();
  in.compress_ratio = -4;
  expect_bad(in, out.buffers(), "compress_ratio=-4");
  in = good.inputs();
  in.slot_format = static_cast<SlotFormat>(7);
  expect_bad(in, out.buffers(), "slot_format=7");
  in = good.inputs();
  in.block_table_stride = -1;
  expect_bad(in, out.buffers(), "block_table_stride=-1");
  in = good.inputs();
  in.block_table = CSpan<int32_t>(good.table.data(), good.table.size() - 1);
  expect_bad(in, out.buffers(), "block_table has");
  in = good.inputs();
  in.num_blocks = -1;
  expect_bad(in, out.buffers(), "num_blocks=-1");
  in = good.inputs();
  in.rope_positions = -1;
  expect_bad(in, out.buffers(), "rope_positions=-1");
  // Request 0 emits rows 499 (positions 1996..1999): column 499/32 = 15.
  in = good.inputs();
  in.rope_positions = 1996;
  expect_bad(in, out.buffers(), "request 0 emits compressed row 499 at RoPE position 1996 but rope_positions=1996");
  in.rope_positions = 1997;
  {
    GroupOut ok;
    ok.size_for(2, good.stride, 604);
    EXPECT_NO_THROW(plan_dsa_group(step, in, ok.buffers()));
  }
  in = good.inputs();
  in.block_table_stride = 15;
  in.block_table = CSpan<int32_t>(good.table.data(), 30);
  {
    GroupOut o15;
    o15.size_for(2, 15, 604);
    const std::vector<int32_t> b15 = o15.all();
    EXPECT_INVALID(plan_dsa_group(step, in, o15.buffers()), "block-table column 15 but block_table_stride=15");
    EXPECT_EQ(o15.all(), b15);
  }
  std::vector<int32_t> table = good.table;
  table[0 * good.stride + 15] = -1;
  in = good.inputs();
  in.block_table = table;
  expect_bad(in, out.buffers(), "block_table[0][15]=-1 is out of range");
  table = good.table;
  table[1 * good.stride + 3] = good.num_blocks;  // request 1 writes rows 0..174: columns 0..5
  in.block_table = table;
  expect_bad(in, out.buffers(), "block_table[1][3]=");
  table = good.table;
  table[1 * good.stride + 10] = -5;  // a column request 1 does not write: fine
  in.block_table = table;
  {
    GroupOut ok;
    ok.size_for(2, good.stride, 604);
    EXPECT_NO_THROW(plan_dsa_group(step, in, ok.buffers()));
  }
  in = good.inputs();
  in.slot_format = SlotFormat::Flat;
  table = good.table;
  table[0 * good.stride + 15] = 2147483647 / 32 + 1;  // the page's rows overflow int32
  in.block_table = table;
  in.num_blocks = 0;
  expect_bad(in, out.buffers(), "gives flat slots beyond int32");

  // Buffers too small: num rows = min(604, 151 + 2) = 153.
  in = good.inputs();
  DsaGroupBuffers buf = out.buffers();
  buf.slot_mapping = Span<int32_t>(out.slots.data(), 305);
  expect_bad(in, buf, "slot_mapping has room for 305 int32 values, needs 306");
  buf = out.buffers();
  buf.row_index = Span<int32_t>(out.index.data(), 152);
  expect_bad(in, buf, "row_index has room for 152");
  buf = out.buffers();
  buf.row_position = Span<int32_t>(out.position.data(), 1);
  expect_bad(in, buf, "row_position has room for 1");
  buf = out.buffers();
  buf.row_request = Span<int32_t>(out.request.data(), 2);
  expect_bad(in, buf, "row_request has room for 2");
  buf = out.buffers();
  buf.block_table = Span<int32_t>(out.bt.data(), 3);
  expect_bad(in, buf, "block_table buffer has room for 3");
  // A step that is not from plan_dsa_step.
  DsaStepPlan forged = step;
  forged.num_reqs = 3;
  EXPECT_INVALID(plan_dsa_group(forged, good.inputs(), out.buffers()), "step is not a plan from plan_dsa_step");
  // Its arrays changed after planning.
  std::vector<int32_t> seq2 = bt.seq;
  forged = step;
  forged.seq_lens = seq2;
  seq2[1] = 599;
  EXPECT_INVALID(plan_dsa_group(forged, good.inputs(), out.buffers()), "step: seq_lens[1]=599 and query length 600");
  EXPECT_EQ(out.all(), before);
}

// The columns a group's kernels READ (DsaGroupReads) are checked like the
// written ones, before any write, through both plan_dsa_group overloads: a
// bad id where the step writes nothing is accepted only with WrittenRows.
TEST(DsaGroup, ReadColumnsAreCheckedBeforeAnyWrite) {
  struct Case {
    const char* what;
    std::vector<int32_t> q, seq;
    int32_t ratio, sbs;
    DsaGroupReads reads;
    int32_t read_window, state_ratio, state_coff;
    int32_t bad_col;      // request 0's column given an id past num_blocks
    const char* message;  // nullptr: the column is not read, the build passes
  };
  const Case cases[] = {
      // C4 KV / indexer K: rows [0, 2000 / 4 = 500) of request 0 in columns 0..15; a decode writes column 15 only.
      {"prefix", {1}, {2000}, 4, 32, DsaGroupReads::CompressedPrefix, 0, 0, 0, 3,
       "block_table[0][3]=64 is out of range [0, num_blocks=64) (request 0: the attention / indexer reads its "
       "compressed rows [0, 500) there)"},
      // A decode that emits no row (2001 / 4 = 500 rows, as before) still reads them all.
      {"prefix, no row emitted", {1}, {2001}, 4, 32, DsaGroupReads::CompressedPrefix, 0, 0, 0, 0,
       "block_table[0][0]=64"},
      {"prefix, past the rows", {1}, {2000}, 4, 32, DsaGroupReads::CompressedPrefix, 0, 0, 0, 16, nullptr},
      {"written rows only", {1}, {2000}, 4, 32, DsaGroupReads::WrittenRows, 0, 0, 0, 3, nullptr},
      // SWA: the token at 1999 reads [1999 - 127, 2000) = columns 58..62 (it writes column 62).
      {"window", {1}, {2000}, 1, 32, DsaGroupReads::Window, 127, 0, 0, 58,
       "block_table[0][58]=64 is out of range [0, num_blocks=64) (request 0: the sliding-window attention reads "
       "its positions [1872, 2000) there)"},
      {"window, before it", {1}, {2000}, 1, 32, DsaGroupReads::Window, 127, 0, 0, 57, nullptr},
      // A prefill chunk of 40 tokens (writing columns 61..62) reads the window before its first token: 1960 - 40
      // = 1920, column 60.
      {"window of a chunk", {40}, {2000}, 1, 32, DsaGroupReads::Window, 40, 0, 0, 60,
       "block_table[0][60]=64 is out of range [0, num_blocks=64) (request 0: the sliding-window attention"},
      // C4 state (ratio 4, coff 2, 8 positions a page): the token at 2003 completes row 500 and the compressor
      // gathers positions [(500 - 1) * 4, 2003) = [1996, 2003): columns 249..250 (it writes column 250).
      {"state", {1}, {2004}, 1, 8, DsaGroupReads::CompressorState, 0, 4, 2, 249,
       "block_table[0][249]=64 is out of range [0, num_blocks=64) (request 0: the compressor reads the state of "
       "its positions [1996, 2003) there)"},
      // The token at 2002 completes no row: nothing earlier is read.
      {"state, no row completes", {1}, {2003}, 1, 8, DsaGroupReads::CompressorState, 0, 4, 2, 249, nullptr},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    Batch bt;
    bt.qsl = lens_to_qsl(c.q);
    bt.seq = c.seq;
    std::vector<int32_t> start(1);
    const DsaStepPlan step = plan_dsa_step(step_inputs(bt), start);
    Group g;
    g.ratio = c.ratio;
    g.sbs = c.sbs;
    g.stride = 256;
    g.num_blocks = 64;
    g.table.assign(256, 1);  // every column a valid id
    g.table[static_cast<std::size_t>(c.bad_col)] = g.num_blocks;
    DsaGroupInputs in = g.inputs();
    in.reads = c.reads;
    in.read_window = c.read_window;
    in.state_ratio = c.state_ratio;
    in.state_coff = c.state_coff;
    const int32_t r = std::max(c.ratio, 1);
    const std::size_t rows = static_cast<std::size_t>(dsa_num_compressed_tokens(bt.qsl.back(), 1, r));
    std::vector<int32_t> rq(rows), ri(rows);
    const DsaRows list = plan_dsa_rows(step, r, {Span<int32_t>(rq), Span<int32_t>(ri)});
    for (int overload = 0; overload < 3; ++overload) {
      GroupOut out;
      out.size_for(1, g.stride, rows);
      const std::vector<int32_t> before = out.all();
      std::vector<int32_t> scratch(rows);
      DsaGroupBuffers bufs = out.buffers();
      if (overload == 2) bufs.block_scratch = scratch;  // the fused row pass
      auto run = [&] { return overload == 0 ? plan_dsa_group(step, in, bufs) : plan_dsa_group(step, in, bufs, list); };
      if (c.message == nullptr) {
        EXPECT_NO_THROW(run()) << "overload " << overload;
      } else {
        EXPECT_INVALID(run(), c.message);
        EXPECT_EQ(out.all(), before) << "overload " << overload;
      }
    }
  }
}

// Random batches (up to 20 requests: the vector passes take eight at a time)
// and tables with a few bad ids: plan_dsa_group accepts exactly the tables
// whose written and read columns (a brute-force span per request, from the
// DsaGroupReads definitions) are all inside the row and in [0, num_blocks).
TEST(DsaGroup, ReadChecksAgreeWithABruteForceDefinition) {
  std::mt19937 rng(26);
  struct Kind {
    DsaGroupReads reads;
    int32_t ratio, sbs, read_window, state_ratio, state_coff;
  };
  const Kind kinds[] = {{DsaGroupReads::CompressedPrefix, 4, 32, 0, 0, 0},
                        {DsaGroupReads::CompressedPrefix, 128, 32, 0, 0, 0},
                        {DsaGroupReads::CompressedPrefix, 3, 5, 0, 0, 0},  // not powers of two
                        {DsaGroupReads::Window, 1, 32, 40, 0, 0},
                        {DsaGroupReads::Window, 1, 16, 127, 0, 0},
                        {DsaGroupReads::CompressorState, 1, 8, 0, 4, 2},
                        {DsaGroupReads::CompressorState, 1, 32, 0, 128, 1},
                        {DsaGroupReads::CompressorState, 1, 6, 0, 3, 2}};
  int rejected = 0, accepted = 0;
  for (int iter = 0; iter < 400; ++iter) {
    const Kind& k = kinds[iter % (sizeof(kinds) / sizeof(kinds[0]))];
    const int32_t b = 1 + static_cast<int32_t>(rng() % 20);
    std::vector<int32_t> q(b), seq(b);
    for (int32_t i = 0; i < b; ++i) {
      q[i] = rng() % 3 == 0 ? static_cast<int32_t>(rng() % 40) : 1;
      seq[i] = q[i] + static_cast<int32_t>(rng() % 3000);
    }
    std::sort(q.begin(), q.end());  // decode-first
    for (int32_t i = 0; i < b; ++i) seq[i] = std::max(seq[i], q[i]);
    Batch bt;
    bt.qsl = lens_to_qsl(q);
    bt.seq = seq;
    std::vector<int32_t> start(b);
    const DsaStepPlan step = plan_dsa_step(step_inputs(bt), start);
    Group g;
    g.ratio = k.ratio;
    g.sbs = k.sbs;
    g.num_blocks = 4000;
    const int64_t per_block = static_cast<int64_t>(k.sbs) * std::max(k.ratio, 1);
    int32_t need = 1;
    for (int32_t x : seq) need = std::max<int32_t>(need, static_cast<int32_t>((x + per_block - 1) / per_block));
    g.stride = need + static_cast<int32_t>(rng() % 3) - (rng() % 6 == 0 ? 1 : 0);  // sometimes a column short
    g.stride = std::max(g.stride, 1);
    g.table.resize(static_cast<std::size_t>(b) * g.stride);
    for (int32_t& id : g.table) id = static_cast<int32_t>(rng() % 4000);
    for (int bad = static_cast<int>(rng() % 3); bad > 0; --bad) {
      g.table[rng() % g.table.size()] = rng() % 2 ? -1 - static_cast<int32_t>(rng() % 5) : 4000 + static_cast<int32_t>(rng() % 5);
    }
    DsaGroupInputs in = g.inputs();
    in.reads = k.reads;
    in.read_window = k.read_window;
    in.state_ratio = k.state_ratio;
    in.state_coff = k.state_coff;
    // Brute force: every column a request writes or reads.
    bool ok = true;
    for (int32_t i = 0; i < b && ok; ++i) {
      const int32_t st = seq[i] - q[i], r = std::max(k.ratio, 1);
      std::vector<int64_t> rows;  // rows (compressed rows, or positions) touched
      for (int64_t c = st / r; c < seq[i] / r; ++c) rows.push_back(c);  // written
      if (q[i] == 0) {
        // no tokens: no query reads anything
      } else if (k.reads == DsaGroupReads::CompressedPrefix) {
        for (int64_t c = 0; c < seq[i] / r; ++c) rows.push_back(c);
      } else if (k.reads == DsaGroupReads::Window) {
        for (int64_t p = std::max(st - k.read_window, 0); p < seq[i]; ++p) rows.push_back(p);
      } else if (seq[i] / k.state_ratio > st / k.state_ratio) {
        const int64_t lo = std::max<int64_t>((st / k.state_ratio - k.state_coff + 1) * k.state_ratio, 0);
        for (int64_t p = lo; p < st; ++p) rows.push_back(p);
      }
      for (int64_t c : rows) {
        const int64_t col = c / k.sbs;
        if (col >= g.stride) {
          ok = false;
          break;
        }
        const int32_t id = g.table[static_cast<std::size_t>(i) * g.stride + col];
        if (id < 0 || id >= g.num_blocks) {
          ok = false;
          break;
        }
      }
    }
    const std::size_t nrows = static_cast<std::size_t>(dsa_num_compressed_tokens(bt.qsl.back(), b, std::max(k.ratio, 1)));
    std::vector<int32_t> rq(nrows), ri(nrows);
    const DsaRows list = plan_dsa_rows(step, std::max(k.ratio, 1), {Span<int32_t>(rq), Span<int32_t>(ri)});
    // The plain overload; the row-list one without and with the block scratch (its fused pass checks a ratio-1
    // group's reads with its rows).
    for (int overload = 0; overload < 3; ++overload) {
      GroupOut out;
      out.size_for(static_cast<std::size_t>(b), g.stride, nrows);
      const std::vector<int32_t> before = out.all();
      std::vector<int32_t> scratch(nrows);
      DsaGroupBuffers bufs = out.buffers();
      if (overload == 2) bufs.block_scratch = scratch;
      bool threw = false;
      try {
        if (overload == 0) {
          plan_dsa_group(step, in, bufs);
        } else {
          plan_dsa_group(step, in, bufs, list);
        }
      } catch (const aar::InvalidArgument&) {
        threw = true;
        EXPECT_EQ(out.all(), before);
      }
      ASSERT_EQ(threw, !ok) << "iter " << iter << " overload " << overload << " B=" << b;
    }
    (ok ? accepted : rejected) += 1;
  }
  EXPECT_GT(accepted, 50);
  EXPECT_GT(rejected, 50);
}

TEST(DsaGroup, ReadChecksNameTheTableWidthAndTheirArguments) {
  Batch bt;
  bt.qsl = lens_to_qsl({1});
  bt.seq = {2001};  // emits no C4 row, reads rows [0, 500): column 15 at 32 rows a page
  std::vector<int32_t> start(1);
  const DsaStepPlan step = plan_dsa_step(step_inputs(bt), start);
  Group g;
  g.ratio = 4;
  g.sbs = 32;
  g.stride = 15;
  g.num_blocks = 64;
  g.table.assign(15, 1);
  GroupOut out;
  out.size_for(1, g.stride, 2);
  const std::vector<int32_t> before = out.all();
  DsaGroupInputs in = g.inputs();
  in.reads = DsaGroupReads::CompressedPrefix;
  EXPECT_INVALID(plan_dsa_group(step, in, out.buffers()),
                 "request 0: the attention / indexer reads its compressed rows [0, 500), up to block-table column 15, "
                 "but block_table_stride=15");
  in.reads = DsaGroupReads::Window;
  in.read_window = -1;
  EXPECT_INVALID(plan_dsa_group(step, in, out.buffers()), "read_window=-1 is negative");
  in.read_window = 8;
  EXPECT_INVALID(plan_dsa_group(step, in, out.buffers()), "reads=Window is the sliding window of an uncompressed group");
  in.reads = DsaGroupReads::CompressorState;
  EXPECT_INVALID(plan_dsa_group(step, in, out.buffers()), "state_ratio >= 1 and state_coff >= 1, got 0 and 0");
  in.reads = static_cast<DsaGroupReads>(9);
  EXPECT_INVALID(plan_dsa_group(step, in, out.buffers()), "reads=9 is not a DsaGroupReads");
  EXPECT_EQ(out.all(), before);
}

// ---- 5. DSpark ---------------------------------------------------------------

TEST(Dspark, WidthRule) {
  EXPECT_EQ(dspark_swa_width(128, 0), 128);
  EXPECT_EQ(dspark_swa_width(128, 1), 256);
  EXPECT_EQ(dspark_swa_width(128, 4, 132), 132);
  EXPECT_EQ(dspark_swa_width(100, 28), 128);
  EXPECT_INVALID(dspark_swa_width(128, 4, 131), "width=131 is smaller than window + num_spec = 132");
  EXPECT_INVALID(dspark_swa_width(0, 4), "window=0");
  EXPECT_INVALID(dspark_swa_width(128, -1), "num_spec=-1");
  EXPECT_INVALID(dspark_swa_width(128, 1, -2), "width=-2");
}

TEST(Dspark, HandExample) {
  // W = 4, bs = 4, num_spec = 2, width 8: request 0 (S = 9, q = 2): prefix 7,
  // start 3, vis 6 -> positions 3..8; request 1 (S = 3, q = 3): start 0, vis 3.
  DsparkSwaInputs in;
  const std::vector<int32_t> qsl = {0, 2, 5}, seq = {9, 3}, table = {7, 2, 5, 1, 0, 0};
  in.query_start_loc = qsl;
  in.seq_lens = seq;
  in.block_table = table;
  in.block_table_stride = 3;
  in.block_size = 4;
  in.window = 4;
  in.num_spec = 2;
  in.width = 8;
  in.num_rows = 6;
  std::vector<int32_t> out(6 * 8 + 1, kSentinel);
  EXPECT_EQ(build_dspark_swa_indices(in, out), 8);
  const std::vector<int32_t> r0 = {31, 8, 9, 10, 11, 20, -1, -1};
  const std::vector<int32_t> r1 = {4, 5, 6, -1, -1, -1, -1, -1};
  std::vector<int32_t> want;
  for (const auto* r : {&r0, &r0, &r1, &r1, &r1}) want.insert(want.end(), r->begin(), r->end());
  want.insert(want.end(), 8, -1);
  want.push_back(kSentinel);
  EXPECT_EQ(out, want);
  // Truncated to 3 rows.
  in.num_rows = 3;
  std::vector<int32_t> out3(3 * 8, kSentinel);
  build_dspark_swa_indices(in, out3);
  EXPECT_EQ(out3, std::vector<int32_t>(want.begin(), want.begin() + 24));
}

TEST(Dspark, RandomAgainstBruteForce) {
  for (uint32_t seed = 1; seed <= 40; ++seed) {
    std::mt19937 rng(seed);
    const int32_t bs = 32 << (seed % 3);
    const int32_t window = (seed % 2) ? 128 : 1 + static_cast<int32_t>(rng() % 200);
    const int32_t num_spec = 1 + static_cast<int32_t>(rng() % 8);
    const int32_t b = 1 + static_cast<int32_t>(rng() % 6);
    std::vector<int32_t> q(b), seq(b);
    for (int32_t i = 0; i < b; ++i) {
      q[i] = static_cast<int32_t>(rng() % (num_spec + 1));
      seq[i] = q[i] + static_cast<int32_t>(rng() % 1000);
    }
    const std::vector<int32_t> qsl = lens_to_qsl(q);
    const int32_t nra = (seed % 5 == 0) ? b / 2 : b;
    if (nra < b) {
      for (int32_t i = nra; i < b; ++i) seq[i] = static_cast<int32_t>(rng() % 3);  // dummies
    }
    int32_t stride = 0;
    for (int32_t s : seq) stride = std::max(stride, (s + bs - 1) / bs);
    const int32_t num_blocks = b * stride + 3;
    std::vector<int32_t> ids(num_blocks);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    const std::vector<int32_t> table(ids.begin(), ids.begin() + b * stride);
    DsparkSwaInputs in;
    in.query_start_loc = qsl;
    in.seq_lens = seq;
    in.block_table = table;
    in.block_table_stride = stride;
    in.block_size = bs;
    in.num_blocks = num_blocks;
    in.window = window;
    in.num_spec = num_spec;
    in.num_reqs_actual = nra;
    in.num_rows = (seed % 3 == 0) ? qsl.back() + 3 : 0;
    const int32_t rows = in.num_rows == 0 ? qsl.back() : in.num_rows;
    const int32_t width = dspark_swa_width(window, num_spec);
    std::vector<int32_t> out(static_cast<std::size_t>(rows) * width + 2, kSentinel);
    ASSERT_EQ(build_dspark_swa_indices(in, out), width);
    const std::vector<int32_t> want = brute_dspark(qsl, seq, nra, table, stride, bs, window, width, rows);
    EXPECT_EQ(head(out, want.size()), want) << "seed " << seed;
    EXPECT_EQ(out[want.size()], kSentinel);
  }
}

TEST(Dspark, Errors) {
  const std::vector<int32_t> qsl = {0, 2, 5}, seq = {9, 3}, table = {7, 2, 5, 1, 0, 0};
  DsparkSwaInputs good;
  good.query_start_loc = qsl;
  good.seq_lens = seq;
  good.block_table = table;
  good.block_table_stride = 3;
  good.block_size = 4;
  good.window = 4;
  good.num_spec = 2;
  good.width = 8;
  std::vector<int32_t> out(5 * 8, kSentinel);
  const std::vector<int32_t> before = out;
  auto expect_bad = [&](const DsparkSwaInputs& in, Span<int32_t> o, const char* msg) {
    EXPECT_INVALID(build_dspark_swa_indices(in, o), msg);
    EXPECT_EQ(out, before);
  };
  DsparkSwaInputs in = good;
  in.width = 5;
  expect_bad(in, out, "width=5 is smaller than window + num_spec = 6");
  in = good;
  in.block_size = 0;
  expect_bad(in, out, "block_size=0");
  in = good;
  const std::vector<int32_t> bad_qsl = {0, 3, 2};
  in.query_start_loc = bad_qsl;
  expect_bad(in, out, "query_start_loc must be non-decreasing");
  in = good;
  const std::vector<int32_t> short_seq = {9, 2};
  in.seq_lens = short_seq;
  expect_bad(in, out, "seq_lens[1]=2 is smaller than its query length 3");
  in = good;
  in.num_reqs_actual = 3;
  expect_bad(in, out, "num_reqs_actual=3");
  in = good;
  in.num_rows = -1;
  expect_bad(in, out, "num_rows=-1");
  in = good;
  expect_bad(in, Span<int32_t>(out.data(), 39), "out has room for 39 entries");
  in = good;
  in.block_table_stride = 2;
  const std::vector<int32_t> t2 = {7, 2, 5, 1};
  in.block_table = t2;
  expect_bad(in, out, "seq_lens[0]=9 needs 3 blocks but block_table_stride=2");
  in = good;
  in.block_table = CSpan<int32_t>(table.data(), 5);
  expect_bad(in, out, "block_table has 5 entries");
  in = good;
  std::vector<int32_t> neg = table;
  neg[3] = -1;
  in.block_table = neg;
  expect_bad(in, out, "block_table[1][0]=-1 is out of range");
  in = good;
  in.num_blocks = 7;
  expect_bad(in, out, "block_table[0][0]=7 is out of range [0, 7)");
  in = good;
  in.num_spec = 0;
  in.width = 5;  // request 1 sees 3, request 0 sees 6 > 5 (q=2 > width - W = 1)
  expect_bad(in, out, "request 0 sees 6 positions");
  in = good;
  in.num_blocks = -1;
  expect_bad(in, out, "num_blocks=-1");
}
