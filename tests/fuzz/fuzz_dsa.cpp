// plan_dsa_step, plan_dsa_rows and both plan_dsa_group overloads: start positions S - q, the
// emitted compressed rows of each request (docs/design/dsa.md §1.2, dsa_compressed_rows) in order, their
// slots in the group's table, the skip encoding past them, and the two group overloads
// agreeing bit for bit; rejections leave every buffer untouched.
#include "ascend_attn_rt/dsa/plan/dsa_step_plan.h"
#include "fuzz_util.h"

using namespace aar;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Bytes in(data, size);
  fuzz::Batch b = fuzz::make_batch(in, 6, 20, 600);
  fuzz::current_batch() = &b;
  const int32_t B = b.B();
  const int32_t real = b.qsl.back();
  plan::DsaStepInputs si;
  si.query_start_loc = b.qsl;
  si.seq_lens = b.seq_lens;
  si.num_reqs_actual = in.flag() ? -1 : in.range(-1, B + 1);
  si.num_input_tokens = fuzz::input_tokens(in, real);
  si.num_speculative_tokens = in.range(0, 16);
  auto start = fuzz::canary<int32_t>(B + (in.u8() % 8 == 0 ? -1 : 0) < 0 ? 0 : B, -9);
  fuzz::Snapshot s0;
  s0.add(start);
  plan::DsaStepPlan step;
  if (!fuzz::accepted([&] { step = plan::plan_dsa_step(si, start); }, s0)) return 0;
  const int32_t actual = si.num_reqs_actual < 0 ? B : si.num_reqs_actual;
  for (int32_t r = 0; r < B; ++r) {
    const int32_t q = b.qsl[r + 1] - b.qsl[r];
    FUZZ_CHECK(q >= 0 && b.seq_lens[r] >= 0);
    FUZZ_CHECK(start[r] == (r < actual ? b.seq_lens[r] - q : 0));
  }
  const int32_t ratios[] = {0, 1, 4, 128};
  const int32_t ratio = ratios[in.u8() % 4];
  const int32_t r1 = std::max(ratio, 1);
  const int32_t sbs = in.range(1, 8) * (in.flag() ? 1 : 16);
  // The group's table: one entry per sbs compressed rows.
  plan::DsaGroupInputs g;
  g.compress_ratio = ratio;
  g.storage_block_size = in.maybe_bad(sbs);
  const int64_t max_rows = (b.qsl.empty() ? 0 : 700) / r1 + 1;
  const int32_t stride = static_cast<int32_t>(max_rows / sbs + in.range(0, 2));
  std::vector<int32_t> table(static_cast<size_t>(B) * stride);
  const int32_t nblocks = std::max(1, stride * B + 1);
  for (auto& id : table) id = in.range(0, nblocks - 1);
  if (!table.empty() && in.u8() % 8 == 0) table[in.range(0, static_cast<int32_t>(table.size()) - 1)] = -1;
  g.block_table = table;
  g.block_table_stride = stride;
  g.num_blocks = in.flag() ? 0 : nblocks;
  g.slot_format = in.flag() ? plan::SlotFormat::Flat : plan::SlotFormat::BlockOffset;
  g.block_offset_skip = in.flag() ? plan::BlockOffsetSkip::MinusOne : plan::BlockOffsetSkip::LastOffset;
  const int32_t T = step.num_input_tokens;
  const int32_t rows = plan::dsa_num_compressed_tokens(T, B, ratio);
  const int32_t w = plan::slot_format_width(g.slot_format);
  auto gtable = fuzz::canary<int32_t>(static_cast<size_t>(B) * stride, -9);
  auto slots = fuzz::canary<int32_t>(fuzz::room(int64_t{rows} * w), -9);
  auto ridx = fuzz::canary<int32_t>(fuzz::room(rows), -9), rpos = fuzz::canary<int32_t>(fuzz::room(rows), -9),
       rreq = fuzz::canary<int32_t>(fuzz::room(rows), -9);
  fuzz::Snapshot s1;
  s1.add(gtable), s1.add(slots), s1.add(ridx), s1.add(rpos), s1.add(rreq);
  plan::DsaGroupPlan gp;
  const bool ok = fuzz::accepted(
      [&] { gp = plan::plan_dsa_group(step, g, {gtable, slots, ridx, rpos, rreq}); }, s1);
  // The rows list and the second overload: the same acceptance and the same bytes.
  auto lreq = fuzz::canary<int32_t>(fuzz::room(rows), -9), lidx = fuzz::canary<int32_t>(fuzz::room(rows), -9);
  fuzz::Snapshot s2;
  s2.add(lreq), s2.add(lidx);
  plan::DsaRows list;
  const bool rows_ok = fuzz::accepted([&] { list = plan::plan_dsa_rows(step, ratio, {lreq, lidx}); }, s2);
  // The rows list needs room for the emitted rows only; it is refused exactly when the buffers
  // (sized for every row, emitted or skip) could not hold them, i.e. never when rows fit.
  if (static_cast<size_t>(rows) <= lreq.size()) FUZZ_CHECK(rows_ok);
  if (!rows_ok) return 0;
  auto gtable2 = fuzz::canary<int32_t>(gtable.size(), -9), slots2 = fuzz::canary<int32_t>(slots.size(), -9);
  auto ridx2 = fuzz::canary<int32_t>(ridx.size(), -9), rpos2 = fuzz::canary<int32_t>(ridx.size(), -9),
       rreq2 = fuzz::canary<int32_t>(ridx.size(), -9);
  fuzz::Snapshot s3;
  s3.add(gtable2), s3.add(slots2), s3.add(ridx2), s3.add(rpos2), s3.add(rreq2);
  plan::DsaGroupPlan gp2;
  const bool ok2 = fuzz::accepted(
      [&] { gp2 = plan::plan_dsa_group(step, g, {gtable2, slots2, ridx2, rpos2, rreq2}, list); }, s3);
  // The same again with the block-id scratch (the fused validation pass, AVX2 where the CPU has it).
  auto gtable3 = fuzz::canary<int32_t>(gtable.size(), -9), slots3 = fuzz::canary<int32_t>(slots.size(), -9);
  auto ridx3 = fuzz::canary<int32_t>(ridx.size(), -9), rpos3 = fuzz::canary<int32_t>(ridx.size(), -9),
       rreq3 = fuzz::canary<int32_t>(ridx.size(), -9);
  auto scratch = fuzz::canary<int32_t>(fuzz::room(rows), -9);
  fuzz::Snapshot s4;
  s4.add(gtable3), s4.add(slots3), s4.add(ridx3), s4.add(rpos3), s4.add(rreq3);
  plan::DsaGroupPlan gp3;
  const bool ok3 = fuzz::accepted(
      [&] { gp3 = plan::plan_dsa_group(step, g, {gtable3, slots3, ridx3, rpos3, rreq3, scratch}, list); }, s4);
  FUZZ_CHECK(ok == ok2 && ok == ok3);
  if (!ok) return 0;
  FUZZ_CHECK(gtable == gtable2 && slots == slots2 && ridx == ridx2 && rpos == rpos2 && rreq == rreq2);
  FUZZ_CHECK(gtable == gtable3 && slots == slots3 && ridx == ridx3 && rpos == rpos3 && rreq == rreq3);
  FUZZ_CHECK(gp3.num_valid_rows == gp.num_valid_rows);
  FUZZ_CHECK(gp.num_compressed_tokens == rows && gp2.num_valid_rows == gp.num_valid_rows);
  // Naive model of the emitted rows.
  int32_t k = 0;
  for (int32_t r = 0; r < actual; ++r) {
    const int32_t q = b.qsl[r + 1] - b.qsl[r];
    const plan::DsaCompressedRows cr = plan::dsa_compressed_rows(b.seq_lens[r] - q, q, ratio);
    for (int32_t c = cr.first; c < cr.first + cr.count; ++c, ++k) {
      FUZZ_CHECK(k < rows);
      FUZZ_CHECK(rreq[k] == r && ridx[k] == c && rpos[k] == c * r1);
      FUZZ_CHECK(lreq[k] == r && lidx[k] == c);
      const int32_t gs = g.storage_block_size;  // accepted: positive
      const int32_t blk = table[static_cast<size_t>(r) * stride + c / gs];
      if (g.slot_format == plan::SlotFormat::Flat) {
        FUZZ_CHECK(slots[k] == static_cast<int64_t>(blk) * gs + c % gs);
      } else {
        FUZZ_CHECK(slots[2 * k] == blk && slots[2 * k + 1] == c % gs);
      }
    }
  }
  FUZZ_CHECK(k == gp.num_valid_rows);
  for (int32_t j = k; j < rows; ++j) {
    FUZZ_CHECK(rreq[j] == -1 && ridx[j] == -1 && rpos[j] == 0);
    if (g.slot_format == plan::SlotFormat::Flat) FUZZ_CHECK(slots[j] == -1);
    else FUZZ_CHECK(slots[2 * j] == -1);
  }
  for (int32_t r = actual; r < B; ++r)
    for (int32_t c = 0; c < stride; ++c) FUZZ_CHECK(gtable[static_cast<size_t>(r) * stride + c] == 0);
  return 0;
}
