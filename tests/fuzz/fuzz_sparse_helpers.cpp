// The smaller plan functions of the sparse backends, each against the rule its header states
// (written out here): format_dsa_slot_mapping (both overloads, both formats, both skip
// encodings), build_dspark_swa_indices with dspark_swa_width (docs/design/dsa.md §3.4's visible slots, one
// row per token), dsa_decode_threshold, dsa_storage_block_size, build_valid_topk_mask and
// mask_invalid_topk (docs/design/sparse.md §8), and the query_start_loc helpers of seq_lens.h. Rejections
// leave every output untouched.
#include "ascend_attn_rt/dsa/plan/dsa_step_plan.h"
#include "ascend_attn_rt/plan/seq_lens.h"
#include "ascend_attn_rt/sfa/plan/sfa_plan.h"
#include <string>

#include "fuzz_util.h"

using namespace aar;

namespace {

void check_slot_format(fuzz::Bytes& in) {
  const bool wide = in.flag();
  std::vector<int64_t> s64(in.range(0, 12));
  for (auto& s : s64) {
    switch (in.u8() % 8) {
      case 0: s = -1; break;
      case 1: s = -static_cast<int64_t>(in.u32()); break;
      case 2: s = wide ? static_cast<int64_t>(in.u32()) << in.range(0, 31) : static_cast<int64_t>(in.u32()) >> 1; break;
      default: s = in.range(0, 5000);
    }
  }
  std::vector<int32_t> s32(s64.begin(), s64.end());
  if (!wide) for (size_t i = 0; i < s64.size(); ++i) s64[i] = s32[i];  // the int32 overload's values
  const int32_t bs = in.u8() % 8 == 0 ? in.maybe_bad(16) : (in.flag() ? 128 : in.range(1, 64));
  const bool flat = in.flag();
  const plan::SlotFormat fmt = flat ? plan::SlotFormat::Flat : plan::SlotFormat::BlockOffset;
  const plan::BlockOffsetSkip skip = in.flag() ? plan::BlockOffsetSkip::MinusOne : plan::BlockOffsetSkip::LastOffset;
  const size_t w = flat ? 1 : 2;
  const size_t room = in.u8() % 8 == 0 ? static_cast<size_t>(in.range(0, 24)) : s64.size() * w;
  auto out = fuzz::canary<int32_t>(room, -9);
  fuzz::Snapshot snap;
  snap.add(out);
  const bool ok = fuzz::accepted(
      [&] {
        if (wide) plan::format_dsa_slot_mapping(plan::CSpan<int64_t>(s64), bs, fmt, out, skip);
        else plan::format_dsa_slot_mapping(plan::CSpan<int32_t>(s32), bs, fmt, out, skip);
      },
      snap);
  bool valid = bs > 0 && room >= s64.size() * w;
  for (int64_t s : s64) {
    if (s >= 0) valid = valid && (flat ? s <= INT32_MAX : s / std::max(bs, 1) <= INT32_MAX);
  }
  FUZZ_CHECK(ok == valid);
  if (!ok) return;
  for (size_t i = 0; i < s64.size(); ++i) {
    const int64_t s = s64[i];
    if (flat) {
      FUZZ_CHECK(out[i] == (s >= 0 ? s : -1));
    } else if (s >= 0) {
      FUZZ_CHECK(out[2 * i] == s / bs && out[2 * i + 1] == s % bs);
    } else {
      FUZZ_CHECK(out[2 * i] == -1 && out[2 * i + 1] == (skip == plan::BlockOffsetSkip::MinusOne ? -1 : bs - 1));
    }
  }
  for (size_t i = s64.size() * w; i < out.size(); ++i) FUZZ_CHECK(out[i] == -9);
}

void check_dspark(fuzz::Bytes& in) {
  fuzz::Batch b = fuzz::make_batch(in, 5, 6, 300);
  fuzz::current_batch() = &b;
  plan::DsparkSwaInputs si;
  si.query_start_loc = b.qsl;
  si.seq_lens = b.seq_lens;
  si.block_table = b.table;
  si.block_table_stride = b.stride;
  si.block_size = b.block_size;
  si.num_blocks = in.flag() ? 0 : b.num_blocks;
  si.window = in.u8() % 8 == 0 ? in.maybe_bad(8) : in.range(1, 160);
  si.num_spec = in.u8() % 8 == 0 ? in.maybe_bad(2) : in.range(0, 7);
  si.width = in.flag() ? 0 : in.range(0, 300);
  const int32_t real = b.qsl.back();
  si.num_rows = in.flag() ? 0 : static_cast<int32_t>(std::clamp<int64_t>(int64_t{real} + in.range(-1, 3), 0, 1 << 12));
  si.num_reqs_actual = in.flag() ? -1 : in.range(0, b.B());
  int32_t width = -1;
  try {
    width = plan::dspark_swa_width(si.window, si.num_spec, si.width);
  } catch (const InvalidArgument&) {
  }
  const int64_t rows = si.num_rows ? si.num_rows : std::max(0, real);
  const size_t need = width > 0 ? fuzz::room(rows * width) : 0;
  const size_t room = in.u8() % 8 == 0 ? static_cast<size_t>(in.range(0, 64)) : need;
  auto out = fuzz::canary<int32_t>(room, -9);
  fuzz::Snapshot snap;
  snap.add(out);
  int32_t got = -1;
  const bool ok = fuzz::accepted([&] { got = plan::build_dspark_swa_indices(si, out); }, snap);
  // Structural breaks must be refused (block ids are checked only against a given num_blocks;
  // graph-padding requests, r >= num_reqs_actual, need only seq_len >= 0).
  const int32_t nra0 = si.num_reqs_actual < 0 ? b.B() : si.num_reqs_actual;
  bool broken = width < 0 || b.block_size <= 0 || b.qsl[0] != 0;
  for (int32_t r = 0; r < b.B(); ++r) {
    const int64_t q = int64_t{b.qsl[r + 1]} - b.qsl[r];
    broken = broken || q < 0 || b.seq_lens[r] < 0 || (r < nra0 && b.seq_lens[r] < q);
  }
  if (broken) FUZZ_CHECK(!ok);
  if (!ok) return;
  FUZZ_CHECK(got == width);
  FUZZ_CHECK(width >= si.window + si.num_spec && (si.width != 0 || width % 128 == 0));
  const int32_t nreal = si.num_reqs_actual < 0 ? b.B() : si.num_reqs_actual;
  // The expected rows, built token by token (docs/design/dsa.md §3.4).
  std::vector<int32_t> want(static_cast<size_t>(rows) * width, -1);
  for (int32_t r = 0; r < nreal; ++r) {
    const int64_t q = b.qsl[r + 1] - b.qsl[r], seq = b.seq_lens[r];
    const int64_t start = std::max<int64_t>(seq - q - si.window, 0), vis = seq - start;
    for (int64_t t = b.qsl[r]; t < b.qsl[r + 1] && t < rows; ++t) {
      for (int64_t j = 0; j < vis && j < width; ++j) {
        const int64_t p = start + j;
        want[t * width + j] = b.table[static_cast<size_t>(r) * b.stride + p / b.block_size] * b.block_size +
                              static_cast<int32_t>(p % b.block_size);
      }
    }
  }
  for (size_t i = 0; i < want.size(); ++i) FUZZ_CHECK(out[i] == want[i]);
}

void check_topk(fuzz::Bytes& in) {
  const int32_t K = in.u8() % 8 == 0 ? in.maybe_bad(4) : in.range(1, 8);
  const int32_t rows = in.range(0, 6);
  std::vector<int32_t> topk(static_cast<size_t>(rows) * std::clamp(K, 1, 64) + (in.u8() % 8 == 0 ? 1 : 0));
  for (auto& v : topk) v = in.range(-3, 40);
  std::vector<int32_t> thr(in.u8() % 8 == 0 ? in.range(0, 7) : rows);
  for (auto& t : thr) t = in.u8() % 16 == 0 ? -1 : in.range(0, 40);
  const size_t room = in.u8() % 8 == 0 ? static_cast<size_t>(in.range(0, 48)) : topk.size();
  auto mask = fuzz::canary<uint8_t>(room, 0xAB);
  auto masked = fuzz::canary<int32_t>(room, -9);
  fuzz::Snapshot snap;
  snap.add(mask), snap.add(masked);
  const bool ok1 = fuzz::accepted([&] { plan::build_valid_topk_mask(topk, K, thr, mask); }, snap);
  const bool ok2 = fuzz::accepted([&] { plan::mask_invalid_topk(topk, K, thr, masked); }, snap);
  bool valid = K > 0 && topk.size() % K == 0 && room >= topk.size() && thr.size() == topk.size() / K;
  for (int32_t t : thr) valid = valid && t >= 0;
  // The header allows more threshold rows than needed? It says one per row: exactly.
  FUZZ_CHECK(ok1 == ok2);
  if (valid) FUZZ_CHECK(ok1);
  // masked_topk_equals: the same checks (its compared array is `masked`), and true exactly when the mask
  // writes `masked` (compared against the mask itself, and against it with one entry changed).
  bool eq = false;
  const bool ok3 = fuzz::accepted([&] { eq = plan::masked_topk_equals(topk, K, thr, masked); }, snap);
  FUZZ_CHECK(ok3 == ok1);
  if (!ok1) return;
  FUZZ_CHECK(eq);
  for (size_t i = 0; i < topk.size(); ++i) {
    const bool keep = topk[i] >= 0 && topk[i] < thr[i / K];
    FUZZ_CHECK(mask[i] == keep);
    FUZZ_CHECK(masked[i] == (keep ? topk[i] : -1));
  }
  if (!topk.empty()) {
    std::vector<int32_t> other(masked.begin(), masked.begin() + static_cast<std::ptrdiff_t>(topk.size()));
    const size_t at = in.range(0, static_cast<int32_t>(topk.size()) - 1);
    other[at] = other[at] == -1 ? in.range(0, 40) : (in.flag() ? -1 : other[at] + 1);
    FUZZ_CHECK(!plan::masked_topk_equals(topk, K, thr, other));
  }
}

void check_seq_lens(fuzz::Bytes& in) {
  std::vector<int32_t> qsl(in.range(0, 8));
  int32_t x = 0;
  for (auto& v : qsl) {
    x = in.u8() % 16 == 0 ? in.maybe_bad(x) : (x > INT32_MAX - 5 ? x : x + in.range(0, 5));
    v = x;
  }
  if (!qsl.empty() && in.u8() % 8 == 0) qsl[0] = in.maybe_bad(0);
  bool valid = !qsl.empty() && qsl[0] == 0;
  for (size_t i = 1; i < qsl.size(); ++i) valid = valid && qsl[i] >= qsl[i - 1];
  bool ok = true;
  try {
    plan::validate_start_loc(qsl, "qsl");
  } catch (const InvalidArgument& e) {
    FUZZ_CHECK(std::string(e.what()).find("qsl") != std::string::npos);
    ok = false;
  }
  FUZZ_CHECK(ok == valid);
  const size_t n = qsl.empty() ? 0 : qsl.size() - 1;
  const size_t room = in.u8() % 8 == 0 ? static_cast<size_t>(in.range(0, 8)) : n;
  auto ends = fuzz::canary<int64_t>(room, -9);
  auto lens = fuzz::canary<int32_t>(room, -9);
  auto ends2 = fuzz::canary<int64_t>(room, -9);
  fuzz::Snapshot snap;
  snap.add(ends), snap.add(lens), snap.add(ends2);
  const bool e_ok = fuzz::accepted([&] { plan::start_loc_to_ends(qsl, ends); }, snap);
  const bool l_ok = fuzz::accepted([&] { plan::start_loc_to_lens(qsl, lens); }, snap);
  if (!valid) FUZZ_CHECK(!l_ok);
  if (e_ok) {
    for (size_t i = 0; i < n; ++i) FUZZ_CHECK(ends[i] == qsl[i + 1]);
  }
  if (!l_ok) return;
  for (size_t i = 0; i < n; ++i) FUZZ_CHECK(lens[i] == qsl[i + 1] - qsl[i]);
  const bool s_ok = fuzz::accepted([&] { plan::lens_to_ends(plan::CSpan<int32_t>(lens.data(), n), ends2); }, snap);
  if (room >= n) FUZZ_CHECK(s_ok);
  if (s_ok) {
    for (size_t i = 0; i < n; ++i) FUZZ_CHECK(ends2[i] == qsl[i + 1]);
  }
}

void check_dsa_scalars(fuzz::Bytes& in) {
  const int32_t ns = in.u8() % 4 == 0 ? in.maybe_bad(3) : in.range(0, 20);
  int32_t thr = -1;
  bool ok = true;
  try {
    thr = plan::dsa_decode_threshold(ns);
  } catch (const InvalidArgument&) {
    ok = false;
  }
  FUZZ_CHECK(ok == (ns >= 0 && int64_t{ns} + 1 <= plan::kDsaMaxDecodeThreshold));
  if (ok) FUZZ_CHECK(thr == ns + 1);
  const int32_t bs = in.u8() % 4 == 0 ? in.maybe_bad(512) : in.range(1, 1024);
  const int32_t r = in.u8() % 4 == 0 ? in.maybe_bad(4) : (in.flag() ? 4 : 128);
  int32_t sb = -1;
  ok = true;
  try {
    sb = plan::dsa_storage_block_size(bs, r);
  } catch (const InvalidArgument&) {
    ok = false;
  }
  FUZZ_CHECK(ok == (bs > 0 && r >= 0 && (r <= 1 || bs % r == 0)));
  if (ok) FUZZ_CHECK(sb == (r <= 1 ? bs : bs / r));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Bytes in(data, size);
  switch (in.u8() % 5) {
    case 0: check_slot_format(in); break;
    case 1: check_dspark(in); break;
    case 2: check_topk(in); break;
    case 3: check_seq_lens(in); break;
    default: check_dsa_scalars(in); break;
  }
  return 0;
}
