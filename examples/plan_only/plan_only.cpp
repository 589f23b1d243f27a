// The plan layer alone, with no torch: one step's host planning (attention
// state, decode/prefill split, slot mapping, the kernels' length lists) into
// buffers the engine owns, checked against values computed here by hand; then a
// bad step, rejected by name before anything is written.
//
// Build: examples/plan_only/CMakeLists.txt (find_package(ascend_attn_rt
// COMPONENTS plan)); ctest `example_plan_only` runs it.
#include <cstdio>
#include <vector>

#include "ascend_attn_rt/errors.h"
#include "ascend_attn_rt/gqa/plan/step_plan.h"

namespace plan = aar::plan;

int main() {
  constexpr int32_t kBlock = 4, kStride = 3;
  // Two decodes (one new token after 9 and 4 cached) and a prefill of 4 tokens after 3 cached.
  const std::vector<int32_t> qsl = {0, 1, 2, 6};
  const std::vector<int32_t> seq = {10, 5, 7};
  const std::vector<int32_t> table = {7, 2, 5,  /**/ 1, 3, 0,  /**/ 4, 6, 0};
  const int32_t B = 3, T = qsl.back();

  std::vector<int32_t> qsl_buf(B + 2), seq_buf(B + 1), slots(T, -7), bt_buf((B + 1) * kStride);
  std::vector<int64_t> q_ends(B + 1), kv_lens(B + 1);
  plan::StepBuffers buf;
  buf.query_start_loc = plan::Span<int32_t>(qsl_buf.data(), qsl_buf.size());
  buf.seq_lens = plan::Span<int32_t>(seq_buf.data(), seq_buf.size());
  buf.slot_mapping = plan::Span<int32_t>(slots.data(), slots.size());
  buf.block_table = plan::Span<int32_t>(bt_buf.data(), bt_buf.size());
  buf.block_table_stride = kStride;
  buf.q_ends = plan::Span<int64_t>(q_ends.data(), q_ends.size());
  buf.kv_lens = plan::Span<int64_t>(kv_lens.data(), kv_lens.size());

  plan::StepInputs in;
  in.query_start_loc = plan::CSpan<int32_t>(qsl.data(), qsl.size());
  in.seq_lens = plan::CSpan<int32_t>(seq.data(), seq.size());
  in.block_table = plan::CSpan<int32_t>(table.data(), table.size());
  in.block_table_stride = kStride;
  in.block_size = kBlock;
  in.num_blocks = 8;
  const plan::StepPlan p = plan::build_step(in, buf);

  // By hand: token i of request r sits at position seq[r] - q_len[r] + i, in
  // block table[r][pos / kBlock] at offset pos % kBlock.
  bool ok = p.state == plan::AttentionState::ChunkedPrefill && p.split.num_decodes == 2 &&
            p.split.num_prefills == 1 && p.num_actual_tokens == T;
  for (int32_t r = 0; r < B; ++r) {
    const int32_t q_len = qsl[r + 1] - qsl[r];
    ok = ok && q_ends[r] == qsl[r + 1] && kv_lens[r] == seq[r];
    for (int32_t i = 0; i < q_len; ++i) {
      const int32_t pos = seq[r] - q_len + i;
      const int32_t want = table[r * kStride + pos / kBlock] * kBlock + pos % kBlock;
      ok = ok && slots[qsl[r] + i] == want;
    }
  }
  std::printf("step: state=%s decodes=%d prefills=%d slots=[", plan::to_string(p.state), p.split.num_decodes,
              p.split.num_prefills);
  for (int32_t s : slots) std::printf(" %d", s);
  std::printf(" ] %s\n", ok ? "as computed by hand" : "MISMATCH");

  // A request whose KV length is shorter than its query: rejected by name, nothing written.
  const std::vector<int32_t> bad_seq = {10, 5, 3};
  in.seq_lens = plan::CSpan<int32_t>(bad_seq.data(), bad_seq.size());
  const std::vector<int32_t> before = slots;
  bool rejected = false;
  try {
    plan::build_step(in, buf);
  } catch (const aar::InvalidArgument& e) {
    rejected = true;
    std::printf("bad step rejected: %s\n", e.what());
  }
  ok = ok && rejected && slots == before;

  std::printf("%s\n", ok ? "plan_only: OK" : "plan_only: FAILED");
  return ok ? 0 : 1;
}
