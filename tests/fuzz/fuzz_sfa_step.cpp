// plan_sfa_step: the kernels' two length conventions (cumulative query ends, per-request KV
// lengths), the int64 slot mapping and the RoPE positions against the naive formulas; graph
// padding dummies have KV length 0; rejections leave every buffer untouched.
#include "ascend_attn_rt/sfa/plan/sfa_plan.h"
#include "fuzz_util.h"

using namespace aar;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Bytes in(data, size);
  fuzz::Batch b = fuzz::make_batch(in);
  fuzz::current_batch() = &b;
  const int32_t B = b.B();
  const int32_t real = b.qsl.back();
  plan::SfaStepInputs si;
  fuzz::fill_step_inputs(si, b, in);
  si.pad_decode_batch = in.flag();
  si.rope_positions = in.flag() ? 0 : in.range(1, 400);
  const int32_t T = std::max(0, si.num_input_tokens ? si.num_input_tokens : real);
  const size_t rows = fuzz::room(std::max(B, T)) + 2;
  const int32_t st = b.stride;
  auto qsl = fuzz::canary<int32_t>(rows + 1, -9), cq = fuzz::canary<int32_t>(rows, -9),
       seq = fuzz::canary<int32_t>(rows, -9), table = fuzz::canary<int32_t>(rows * st, -9),
       pos = fuzz::canary<int32_t>(fuzz::room(T), -9);
  auto slots = fuzz::canary<int64_t>(fuzz::room(T), -9), cql = fuzz::canary<int64_t>(rows, -9),
       sql = fuzz::canary<int64_t>(rows, -9);
  fuzz::Snapshot snap;
  snap.add(qsl), snap.add(cq), snap.add(seq), snap.add(table), snap.add(pos), snap.add(slots);
  snap.add(cql), snap.add(sql);
  plan::SfaStepBuffers sb{qsl, cq, seq, table, st, slots, pos, cql, sql};
  plan::SfaStepPlan p;
  const bool ok = fuzz::accepted([&] { p = plan::plan_sfa_step(si, sb); }, snap);
  if (!fuzz::batch_valid(b) || (si.num_input_tokens && si.num_input_tokens < real)) FUZZ_CHECK(!ok);
  if (!ok) return 0;
  FUZZ_CHECK(p.num_reqs == B && p.num_kernel_reqs >= B);
  for (int32_t r = 0; r < B; ++r) {
    const int32_t q = b.qsl[r + 1] - b.qsl[r];
    FUZZ_CHECK(cq[r] == b.qsl[r + 1] && seq[r] == b.seq_lens[r] && cql[r] == cq[r] && sql[r] == seq[r]);
    for (int32_t t = b.qsl[r]; t < b.qsl[r + 1]; ++t) {
      FUZZ_CHECK(slots[t] == fuzz::naive_slot(b, r, t));
      FUZZ_CHECK(pos[t] == b.seq_lens[r] - q + (t - b.qsl[r]));
    }
  }
  for (int32_t r = B; r < p.num_kernel_reqs; ++r) FUZZ_CHECK(seq[r] == 0 && cq[r] >= cq[r - 1 < 0 ? 0 : r - 1]);
  if (p.num_kernel_reqs > 0) FUZZ_CHECK(cq[p.num_kernel_reqs - 1] == (p.padded ? T : real));
  for (int32_t t = real; t < T; ++t) FUZZ_CHECK(slots[t] == -1 && pos[t] == 0);
  return 0;
}
