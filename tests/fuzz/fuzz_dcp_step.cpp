// build_dcp_step (plan/dcp_step_plan.h): the split, the local slot of every token against the
// naive deal of positions to ranks (runs of I, round robin), one decode row per decode token
// with KV length = this rank's keys at or before its position, the prefill rows' local
// context, the chunked-context row filter and the copied block-table rows; every buffer is
// sometimes one entry short, and a rejection leaves them all untouched.
#include "ascend_attn_rt/cp/plan/dcp_step_plan.h"
#include "fuzz_util.h"

using namespace aar;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Bytes in(data, size);
  fuzz::Batch b = fuzz::make_batch(in, 6, 24, 300);
  fuzz::current_batch() = &b;
  // The shared batch maker never corrupts query_start_loc[0]; this planner checks it itself.
  if (in.u8() % 16 == 0) b.qsl[0] = in.maybe_bad(0);
  const int32_t B = b.B();
  plan::DcpStepInputs si;
  fuzz::fill_step_inputs(si, b, in);
  if (in.u8() % 16 == 0) si.decode_threshold = in.maybe_bad(17);  // sometimes outside [1, 16]
  std::vector<uint8_t> pre;
  if (in.flag()) {
    for (int32_t r = 0; r < B; ++r) pre.push_back(in.u8() % 4 == 0);
    if (in.u8() % 16 == 0) pre.push_back(0);
  }
  si.is_prefilling = pre;
  const int32_t world = in.range(1, 8);
  si.shard.world = in.maybe_bad(world);
  si.shard.interleave = in.flag() ? std::max(1, b.block_size) : in.range(1, 4);
  if (in.u8() % 16 == 0) si.shard.interleave = in.maybe_bad(si.shard.interleave);
  si.shard.rank = in.maybe_bad(in.range(0, world - 1));

  // Buffers: sized for the batch as given (saturated), each sometimes one short.
  const int32_t T = std::max(0, si.num_input_tokens ? si.num_input_tokens : b.qsl.back());
  const int32_t os = std::max(0, b.stride + (in.u8() % 16 == 0 ? -1 : in.range(0, 2)));
  // Capped well below fuzz::room's limit: a corrupted batch asks for absurd sizes, and eight
  // 16k-entry canaries per input would dominate the run time.
  auto sz = [&](int64_t n) { return fuzz::room(std::min<int64_t>(in.u8() % 24 == 0 ? n - 1 : n, 2048)); };
  const int64_t rows = std::max<int64_t>(T, B);
  auto slots = fuzz::canary<int32_t>(sz(T), -9);
  auto dtab = fuzz::canary<int32_t>(sz(rows * os), -9);
  auto dq = fuzz::canary<int64_t>(sz(rows), -9), dkv = fuzz::canary<int64_t>(sz(rows), -9);
  auto ptab = fuzz::canary<int32_t>(sz(int64_t{B} * os), -9);
  auto pq = fuzz::canary<int64_t>(sz(B), -9), pctx = fuzz::canary<int64_t>(sz(B), -9);
  auto cidx = fuzz::canary<int32_t>(sz(rows), -9);
  fuzz::Snapshot snap;
  snap.add(slots), snap.add(dtab), snap.add(dq), snap.add(dkv), snap.add(ptab), snap.add(pq), snap.add(pctx);
  snap.add(cidx);
  plan::DcpStepBuffers buf{slots, dtab, dq, dkv, ptab, pq, pctx, cidx, os};
  plan::DcpStepPlan p;
  const bool ok = fuzz::accepted([&] { p = plan::build_dcp_step(si, buf); }, snap);
  const plan::DcpShard sh = si.shard;
  const bool sh_world_too_big = sh.world > 16;  // kMaxCpMergePartitions
  const bool shard_ok = sh.world >= 1 && sh.interleave >= 1 && sh.rank >= 0 && sh.rank < sh.world;
  // The batch rules short of the block columns (which DCP counts per rank, not per position).
  bool basic = b.block_size > 0 && b.num_blocks >= 0 && b.qsl[0] == 0 && b.stride >= 0 &&
               int64_t{b.num_blocks} * b.block_size <= INT32_MAX;
  for (int32_t r = 0; r < B && basic; ++r) {
    const int64_t q = int64_t{b.qsl[r + 1]} - b.qsl[r];
    basic = q >= 0 && b.seq_lens[r] >= q;
  }
  if (!basic || !shard_ok || sh_world_too_big || si.decode_threshold < 1 || si.decode_threshold > 16 ||
      (si.num_input_tokens && si.num_input_tokens < b.qsl.back()) || (!pre.empty() && pre.size() != size_t(B)) ||
      os < b.stride || slots.size() < static_cast<size_t>(T))
    FUZZ_CHECK(!ok);
  if (!ok) return 0;
  // A huge seq_len passes with a huge interleave (few local keys): acceptance only, the
  // position-by-position model would take too long.
  for (int32_t L : b.seq_lens)
    if (L > 4096) return 0;
  const int32_t W = sh.world, I = sh.interleave, rk = sh.rank;
  const int32_t nd = p.split.num_decodes, td = p.split.num_decode_tokens;
  FUZZ_CHECK(nd >= 0 && nd <= B && p.num_reqs == B && td == b.qsl[nd]);
  FUZZ_CHECK(p.num_input_tokens == T && p.num_actual_tokens == b.qsl.back());
  // The split: decodes are short and not prefilling; the first prefill is not.
  auto is_decode = [&](int32_t r) {
    const bool flagged = !pre.empty() && pre[r];
    return b.qsl[r + 1] - b.qsl[r] <= si.decode_threshold && !flagged;
  };
  for (int32_t r = 0; r < nd; ++r) FUZZ_CHECK(is_decode(r));
  if (nd > 0 && nd < B) FUZZ_CHECK(!is_decode(nd));
  // Slots: this rank's tokens at their local index, every other entry -1.
  int32_t writes = 0;
  for (int32_t r = 0; r < B; ++r) {
    const int32_t q = b.qsl[r + 1] - b.qsl[r];
    for (int32_t t = b.qsl[r]; t < b.qsl[r + 1]; ++t) {
      const int64_t pos = b.seq_lens[r] - q + (t - b.qsl[r]);
      if ((pos / I) % W != rk) {
        FUZZ_CHECK(slots[t] == -1);
        continue;
      }
      ++writes;
      const int64_t li = fuzz::naive_local_len(pos, W, I, rk);
      FUZZ_CHECK(slots[t] == static_cast<int64_t>(b.table[static_cast<size_t>(r) * b.stride + li / b.block_size]) *
                                     b.block_size +
                                 li % b.block_size);
    }
  }
  for (int32_t t = b.qsl.back(); t < T; ++t) FUZZ_CHECK(slots[t] == -1);
  FUZZ_CHECK(p.num_local_writes == writes);
  auto row_copied = [&](const std::vector<int32_t>& dst, int64_t at, int32_t r) {
    for (int32_t c = 0; c < os; ++c)
      if (dst[at * os + c] != (c < b.stride ? b.table[static_cast<size_t>(r) * b.stride + c] : 0)) return false;
    return true;
  };
  // Decode rows: one per token, KV = this rank's keys at positions <= p.
  for (int32_t r = 0; r < nd; ++r) {
    const int32_t q = b.qsl[r + 1] - b.qsl[r];
    for (int32_t j = 0; j < q; ++j) {
      const int32_t t = b.qsl[r] + j;
      FUZZ_CHECK(dq[t] == t + 1);
      FUZZ_CHECK(dkv[t] == fuzz::naive_local_len(b.seq_lens[r] - q + j + 1, W, I, rk));
      FUZZ_CHECK(row_copied(dtab, t, r));
    }
  }
  // Prefill rows.
  int64_t local_ctx = 0;
  int32_t k = 0;
  bool has_ctx = false;
  for (int32_t i = 0; i < B - nd; ++i) {
    const int32_t r = nd + i, q = b.qsl[r + 1] - b.qsl[r], ctx = b.seq_lens[r] - q;
    FUZZ_CHECK(pq[i] == b.qsl[r + 1] - td);
    FUZZ_CHECK(pctx[i] == fuzz::naive_local_len(ctx, W, I, rk));
    FUZZ_CHECK(row_copied(ptab, i, r));
    local_ctx += pctx[i];
    if (ctx > 0) {
      has_ctx = true;
      for (int32_t j = 0; j < q; ++j) FUZZ_CHECK(cidx[k++] == b.qsl[r] - td + j);
    }
  }
  FUZZ_CHECK(p.local_context_tokens == local_ctx && p.num_context_rows == k && p.has_context == has_ctx);
  return 0;
}
