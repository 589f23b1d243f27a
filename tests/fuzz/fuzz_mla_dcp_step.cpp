// plan_mla_step under decode context parallel (dcp.world > 1, docs/design/mla.md §6, docs/design/cp.md §2.1): the
// local slot mapping and local KV lengths against a brute-force owner model (token p lives on
// rank (p / I) % W at local index (p / (W*I)) * I + p % I), the DCP scratch (rank 0's local
// lengths, the derived is_prefilling flags) and the split rule under DCP (a request still
// prefilling is a prefill whatever its length); rejections leave every buffer untouched,
// the DCP scratch and the per-token decode rows included (plan_mla_step used to write
// dcp_block_lens before its scan could reject the batch).
#include "ascend_attn_rt/mla/plan/mla_plan.h"
#include "fuzz_util.h"
#include "mla_step_buffers.h"

using namespace aar;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Bytes in(data, size);
  fuzz::Batch b = fuzz::make_batch(in);
  fuzz::current_batch() = &b;
  const int32_t B = b.B();
  const int32_t real = b.qsl.back();
  plan::MlaStepInputs si;
  fuzz::fill_step_inputs(si, b, in);
  si.chunked_prefill_enabled = in.u8() % 4 != 0;
  si.workspace_tokens = in.range(0, 4) * 512;
  si.max_chunks = in.range(0, 8);
  si.pad_decode_batch = in.flag();
  // DCP shard: world 2..4 (1 now and then, the non-DCP path through the same checks), a rank
  // (sometimes out of range), an interleave that divides the block size (sometimes not).
  const int32_t world = in.u8() % 8 == 0 ? 1 : in.range(2, 4);
  const int32_t rank = in.u8() % 16 == 0 ? in.maybe_bad(world) : in.range(0, world - 1);
  int32_t interleave = 1;
  switch (in.u8() % 4) {
    case 0: interleave = 1; break;
    case 1: interleave = std::max(1, b.block_size / 2); break;
    case 2: interleave = std::max(1, b.block_size); break;
    default: interleave = in.maybe_bad(2); break;
  }
  si.dcp = plan::DcpShard{world, rank, interleave};
  // is_prefilling: empty (derived) or given, possibly shorter than the batch (right-padded).
  std::vector<uint8_t> given;
  if (in.flag()) {
    const int32_t n = in.flag() ? B : in.range(0, B);
    for (int32_t r = 0; r < n; ++r) given.push_back(in.flag());
    si.is_prefilling = given;
  }
  const int32_t T = std::max(0, si.num_input_tokens ? si.num_input_tokens : real);
  const size_t rows = fuzz::room(std::max(B, T)) + 2;
  const int32_t st = b.stride;
  // The DCP scratch is sometimes one entry short (a rejection naming it).
  const size_t scratch = in.u8() % 16 == 0 ? (B > 0 ? B - 1 : 0) : static_cast<size_t>(B);
  fuzz::MlaStepCanaries cb(rows, st, T, 8, fuzz::room(int64_t{B} * 400), scratch);
  plan::MlaStepBuffers sb = cb.spans();
  plan::MlaStepPlan p;
  const bool ok = fuzz::accepted([&] { p = plan::plan_mla_step(si, sb); }, cb.snap);
  const bool shard_ok = rank >= 0 && rank < world && interleave >= 1 && b.block_size > 0 &&
                        b.block_size % interleave == 0;
  if (!shard_ok || b.block_size <= 0 || b.qsl[0] != 0) FUZZ_CHECK(!ok);
  for (int32_t r = 0; r < B; ++r) {
    const int64_t q = int64_t{b.qsl[r + 1]} - b.qsl[r];
    if (q < 0 || b.seq_lens[r] < q) FUZZ_CHECK(!ok);
  }
  if (si.num_input_tokens && si.num_input_tokens < real) FUZZ_CHECK(!ok);
  if (!ok) return 0;
  const int32_t nd = p.split.num_decodes;
  FUZZ_CHECK(nd >= 0 && nd + p.split.num_prefills == B);
  const int64_t wi = int64_t{world} * interleave;
  for (int32_t r = 0; r < B; ++r) {
    const int32_t q = b.qsl[r + 1] - b.qsl[r];
    const bool prefilling = given.empty() ? b.seq_lens[r] == q
                                          : (static_cast<size_t>(r) < given.size() && given[r] != 0);
    if (world > 1) {
      FUZZ_CHECK(cb.blens[r] == fuzz::naive_local_len(b.seq_lens[r], world, interleave, 0));
      if (given.empty()) FUZZ_CHECK(cb.pre[r] == static_cast<uint8_t>(prefilling));
      if (r < nd) FUZZ_CHECK(!prefilling || q == 0);
    }
    if (r < nd) FUZZ_CHECK(q <= si.decode_threshold);
    for (int32_t t = b.qsl[r]; t < b.qsl[r + 1]; ++t) {
      const int32_t pos = b.seq_lens[r] - q + (t - b.qsl[r]);
      if (r < nd) FUZZ_CHECK(cb.dpos[t] == pos);
      else FUZZ_CHECK(cb.ppos[t - b.qsl[nd]] == pos);
      if (world == 1) {
        FUZZ_CHECK(cb.slots[t] == fuzz::naive_slot(b, r, t));
        continue;
      }
      const bool mine = (pos / interleave) % world == rank;
      const int64_t li = (pos / wi) * interleave + pos % interleave;
      const int64_t want =
          mine ? int64_t{b.table[static_cast<size_t>(r) * st + li / b.block_size]} * b.block_size + li % b.block_size
               : -1;
      FUZZ_CHECK(cb.slots[t] == want);
    }
    const int64_t kv_want = world > 1 ? fuzz::naive_local_len(b.seq_lens[r], world, interleave, rank) : b.seq_lens[r];
    FUZZ_CHECK(cb.kv[r] == kv_want);
  }
  for (int32_t t = real; t < T; ++t) FUZZ_CHECK(cb.slots[t] == -1);
  return 0;
}
