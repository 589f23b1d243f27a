// plan_mla_step and plan_context_chunks: the int64 slot mapping and the token positions
// against the naive formulas, the decode/prefill split's boundary, and the context chunks
// covering each prefill's context exactly once; rejections leave every buffer untouched.
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
  si.workspace_tokens = in.range(0, 4) * 128;
  si.max_chunks = in.range(0, 16);
  si.pad_decode_batch = in.flag();
  si.pad_interpolated = si.pad_decode_batch && in.flag();
  si.rope_positions = in.flag() ? 0 : in.range(1, 400);
  const int32_t T = std::max(0, si.num_input_tokens ? si.num_input_tokens : real);
  const size_t rows = fuzz::room(std::max(B, T)) + 2;
  const int32_t st = b.stride;
  fuzz::MlaStepCanaries cb(rows, st, T, 16);
  plan::MlaStepBuffers sb = cb.spans();
  plan::MlaStepPlan p;
  const bool ok = fuzz::accepted([&] { p = plan::plan_mla_step(si, sb); }, cb.snap);
  if (!fuzz::batch_valid(b) || (si.num_input_tokens && si.num_input_tokens < real)) FUZZ_CHECK(!ok);
  if (!ok) return 0;
  const int32_t nd = p.split.num_decodes;
  FUZZ_CHECK(nd + p.split.num_prefills == B);
  for (int32_t r = 0; r < B; ++r) {
    const int32_t q = b.qsl[r + 1] - b.qsl[r];
    for (int32_t t = b.qsl[r]; t < b.qsl[r + 1]; ++t) {
      FUZZ_CHECK(cb.slots[t] == fuzz::naive_slot(b, r, t));
      const int32_t pos = b.seq_lens[r] - q + (t - b.qsl[r]);
      if (r < nd) FUZZ_CHECK(cb.dpos[t] == pos);
      else FUZZ_CHECK(cb.ppos[t - b.qsl[nd]] == pos);
    }
    if (r < nd) FUZZ_CHECK(q <= si.decode_threshold);
  }
  for (int32_t t = real; t < T; ++t) FUZZ_CHECK(cb.slots[t] == -1);
  // Each prefill with context is covered by the chunks exactly.
  const int32_t np = p.split.num_prefills, nc = p.chunks.num_chunks;
  if (nc > 0) {
    FUZZ_CHECK(nc <= si.max_chunks && p.chunks.chunk_size % b.block_size == 0);
    for (int32_t j = 0; j < np; ++j) {
      const int32_t r = nd + j;
      const int64_t ctx = b.seq_lens[r] - (b.qsl[r + 1] - b.qsl[r]);
      int64_t sum = 0;
      for (int32_t c = 0; c < nc; ++c) {
        const int32_t len = cb.clens[static_cast<size_t>(c) * np + j];
        FUZZ_CHECK(len >= 0 && len <= p.chunks.chunk_size);
        FUZZ_CHECK(cb.starts[static_cast<size_t>(c) * np + j] == c * p.chunks.chunk_size);
        sum += len;
      }
      FUZZ_CHECK(sum == ctx);
    }
  } else {
    for (int32_t r = nd; r < B; ++r) FUZZ_CHECK(b.seq_lens[r] == b.qsl[r + 1] - b.qsl[r]);
  }
  return 0;
}
