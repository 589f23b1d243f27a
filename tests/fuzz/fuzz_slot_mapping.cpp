// compute_slot_mapping (docs/design/gqa.md §2.4) against the naive per-token formula; rejections leave
// slots_out untouched and happen exactly when the batch breaks one of the header's rules.
#include "ascend_attn_rt/plan/slot_mapping.h"
#include "fuzz_util.h"

using namespace aar;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Bytes in(data, size);
  fuzz::Batch b = fuzz::make_batch(in);
  fuzz::current_batch() = &b;
  const int32_t real = b.qsl.back();
  const int32_t extra = in.range(-2, 4);
  const size_t cap = static_cast<size_t>(std::max<int64_t>(0, std::min<int64_t>(int64_t{real} + extra, 4096)));
  auto slots = fuzz::canary<int32_t>(cap, 0x5a5a5a5a);
  fuzz::Snapshot snap;
  snap.add(slots);
  plan::SlotMappingInputs si{b.qsl, b.seq_lens, b.table, b.stride, b.block_size, b.num_blocks};
  const bool ok = fuzz::accepted([&] { plan::compute_slot_mapping(si, slots); }, snap);
  const bool expect = fuzz::batch_valid(b) && real >= 0 && static_cast<size_t>(real) <= cap;
  FUZZ_CHECK(ok == expect);
  if (!ok) return 0;
  for (int32_t r = 0; r < b.B(); ++r)
    for (int32_t t = b.qsl[r]; t < b.qsl[r + 1]; ++t) FUZZ_CHECK(slots[t] == fuzz::naive_slot(b, r, t));
  for (size_t t = real; t < cap; ++t) FUZZ_CHECK(slots[t] == plan::kPadSlot);
  return 0;
}
