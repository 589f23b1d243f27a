// build_step: the slot mapping, the kernels' query ends and KV lengths and the state, each
// against an independent computation; a batch that breaks a slot-mapping rule is rejected with
// every buffer untouched.
#include "ascend_attn_rt/plan/slot_mapping.h"
#include "ascend_attn_rt/gqa/plan/step_plan.h"
#include "fuzz_util.h"

using namespace aar;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Bytes in(data, size);
  fuzz::Batch b = fuzz::make_batch(in);
  fuzz::current_batch() = &b;
  const int32_t B = b.B();
  const int32_t real = b.qsl.back();
  plan::StepInputs si;
  fuzz::fill_step_inputs(si, b, in);
  si.pad_fia_batch = in.flag();
  si.uniform_decode_len = in.u8() % 4 == 0 ? in.range(1, 2) : 0;
  const int32_t T = std::max(0, si.num_input_tokens ? si.num_input_tokens : real);
  const size_t rows = fuzz::room(std::max(B, T)) + 2;
  const int32_t out_stride = b.stride + in.range(0, 1);
  auto qsl = fuzz::canary<int32_t>(rows + 1, -9), seq = fuzz::canary<int32_t>(rows, -9);
  auto slots = fuzz::canary<int32_t>(fuzz::room(T) + in.range(0, 1), -9);
  auto table = fuzz::canary<int32_t>(rows * out_stride, -9);
  auto q_ends = fuzz::canary<int64_t>(rows, -9), kv = fuzz::canary<int64_t>(rows, -9);
  fuzz::Snapshot snap;
  snap.add(qsl), snap.add(seq), snap.add(slots), snap.add(table), snap.add(q_ends), snap.add(kv);
  plan::StepBuffers sb{qsl, seq, slots, table, out_stride, q_ends, kv};
  plan::StepPlan p;
  const bool ok = fuzz::accepted([&] { p = plan::build_step(si, sb); }, snap);
  if (!fuzz::batch_valid(b) || (si.num_input_tokens && si.num_input_tokens < real)) FUZZ_CHECK(!ok);
  if (!ok) return 0;
  FUZZ_CHECK(p.num_reqs == B && p.num_actual_tokens == real && p.num_input_tokens == T);
  for (int32_t r = 0; r < B; ++r) {
    for (int32_t t = b.qsl[r]; t < b.qsl[r + 1]; ++t) FUZZ_CHECK(slots[t] == fuzz::naive_slot(b, r, t));
    FUZZ_CHECK(q_ends[r] == b.qsl[r + 1]);
    FUZZ_CHECK(kv[r] == b.seq_lens[r]);
    FUZZ_CHECK(seq[r] == b.seq_lens[r]);
  }
  for (int32_t t = real; t < T; ++t) FUZZ_CHECK(slots[t] == plan::kPadSlot);
  // The kernels' batch ends where the planned tokens end.
  FUZZ_CHECK(p.fia.num_reqs >= B);
  FUZZ_CHECK(p.fia.num_reqs == 0 || q_ends[p.fia.num_reqs - 1] == p.fia.num_tokens);
  // The state is select_attention_state's on the derived counts.
  std::vector<int32_t> comp(B), sched(B);
  for (int32_t r = 0; r < B; ++r) {
    sched[r] = b.qsl[r + 1] - b.qsl[r];
    comp[r] = b.seq_lens[r] - sched[r];
  }
  FUZZ_CHECK(p.state == plan::select_attention_state({comp, sched, {}, plan::SpecMethod::None, true}));
  return 0;
}
