// One step's host planning. Phase 1 validates every input and buffer and
// computes everything that can fail (state, split); phase 2 only writes. A
// rejected call therefore leaves every buffer untouched. Nothing is allocated.
#include "ascend_attn_rt/gqa/plan/step_plan.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "ascend_attn_rt/errors.h"
#include "ascend_attn_rt/plan/slot_mapping.h"
#include "../../plan/block_scan.h"
#include "../../plan/internal.h"
#include "../../plan/request_scan.h"

namespace aar::plan {

namespace {

void check_capacity(std::size_t have, std::size_t need, const char* name) {
  AAR_CHECK_ARG(have >= need, name, " has room for ", have, " entries, needs ", need);
}

using detail::BlockCount;
using detail::block_ids_in_range;
using detail::or_of_ids;

}  // namespace


StepPlan build_step(const StepInputs& in, const StepBuffers& buf) {
  // ---------------------------------------------------------------- validate
  const std::size_t b = in.seq_lens.size();
  const CSpan<int32_t> qsl = in.query_start_loc;
  const detail::StepTokens tokens = detail::check_step_batch(in);
  const int32_t t_real = tokens.real, t_in = tokens.input;
  AAR_CHECK_ARG(in.is_prefilling.empty() || in.is_prefilling.size() == b, "is_prefilling has ",
                in.is_prefilling.size(), " entries, expected 0 or ", b);

  const std::size_t in_stride = static_cast<std::size_t>(in.block_table_stride);
  const bool zero_copy = detail::check_block_table_args(in.block_table, b, in.block_table_stride,
                                                        buf.block_table.data(), buf.block_table_stride);

  // Block sizes are powers of two in practice: shifts instead of divisions on
  // the per-request and per-token paths.
  const int32_t bs32 = in.block_size;
  const BlockCount blocks(bs32);
  const bool pow2 = blocks.pow2;
  const int bs_shift = blocks.shift;
  const uint32_t num_blocks_u = static_cast<uint32_t>(in.num_blocks);
  const bool has_spec = !in.num_spec_tokens.empty();
  int32_t max_query_len = 0;
  int32_t max_seq_len = 0;
  // Inputs of the attention-state rule (docs/design/gqa.md §2.1), gathered in the same pass.
  bool all_fresh = true, all_sched_one = true, all_valid_one = true;
  int32_t context_end = 0;  // 1 + the last request with cached context
  int64_t used_blocks = 0;  // block-table entries the kernels will read
  bool checked = false;
  if (pow2 && !has_spec) {
    // Common case, branch-free so it vectorises: flags and maxima in one pass;
    // on any violation the exact loop below runs and names the offender.
    uint32_t bad = 0, not_fresh = 0, not_one = 0;
    int32_t maxq = 0, maxs = 0, ctx_end = 0;
    uint32_t used = 0;
    const uint32_t stride_u = static_cast<uint32_t>(in.block_table_stride);
    for (std::size_t r = 0; r < b; ++r) {
      const int32_t q = qsl[r + 1] - qsl[r];
      const int32_t seq = in.seq_lens[r];
      const uint32_t nblk = blocks(seq);
      bad |= static_cast<uint32_t>(seq < q) | static_cast<uint32_t>(nblk > stride_u);
      not_fresh |= static_cast<uint32_t>(seq != q);
      not_one |= static_cast<uint32_t>(q != 1);
      ctx_end = std::max(ctx_end, seq != q ? static_cast<int32_t>(r + 1) : 0);
      used += nblk;
      maxq = std::max(maxq, q);
      maxs = std::max(maxs, seq);
    }
    if (!bad) {
      checked = true;
      all_fresh = !not_fresh;
      context_end = ctx_end;
      all_sched_one = all_valid_one = !not_one;
      used_blocks = used;
      max_query_len = maxq;
      max_seq_len = maxs;
    }
  }
  for (std::size_t r = 0; r < b && !checked; ++r) {
    const int32_t q = qsl[r + 1] - qsl[r];
    const int32_t seq = in.seq_lens[r];
    AAR_CHECK_ARG(seq >= q, "seq_lens[", r, "]=", seq, " is smaller than its query length ", q);
    const int32_t sp = has_spec ? in.num_spec_tokens[r] : 0;
    if (has_spec) {
      AAR_CHECK_ARG(sp >= 0 && sp <= q, "num_spec_tokens[", r, "]=", sp, " is out of range [0, query length ", q,
                    "]");
    }
    all_fresh &= seq == q;
    if (seq != q) context_end = static_cast<int32_t>(r + 1);
    all_sched_one &= q == 1;
    all_valid_one &= (q - sp) == 1;
    const int64_t nblk = blocks(seq);  // seq >= q >= 0 here
    AAR_CHECK_ARG(nblk <= in.block_table_stride, "seq_lens[", r, "]=", seq, " needs ", nblk,
                  " blocks but block_table_stride=", in.block_table_stride, " (block_size=", in.block_size, ")");
    used_blocks += nblk;
    max_query_len = std::max(max_query_len, q);
    max_seq_len = std::max(max_seq_len, seq);
  }
  // Block ids the kernels read must be in range: a branch-free scan of each
  // row's needed prefix (see block_ids_in_range); the offender is located only
  // on failure. Every block count fits in the stride here (checked above).
  const int32_t* bt = in.block_table.data();
  const int32_t* seqs = in.seq_lens.data();
  // Last needed block id of the first kStashRows rows, for the decode slots.
  constexpr std::size_t kStashRows = 1024;
  int32_t last_ids[kStashRows];
  const std::size_t num_last = std::min(b, kStashRows);
  // When most of the table is in use and num_blocks is a power of two, one OR
  // over the whole rectangle is cheaper still (no per-row work); it also sees
  // stale ids past a row's end, so a miss falls back to the per-row scan.
  bool ok = false, stashed = false;
  const int32_t nb = in.num_blocks;
  if (nb > 0 && (nb & (nb - 1)) == 0 && 2 * used_blocks >= static_cast<int64_t>(b * in_stride)) {
    ok = or_of_ids(bt, b * in_stride) < num_blocks_u;
  }
  if (!ok) {
    ok = block_ids_in_range(bt, in_stride, seqs, b, blocks, blocks(max_seq_len), nb, last_ids, num_last);
    stashed = true;
  }
  if (!ok) {
    for (std::size_t r = 0; r < b; ++r) detail::check_row_block_ids(bt + r * in_stride, blocks(seqs[r]), r, nb);
  }

  const bool add_dummy = in.pad_fia_batch && t_in > t_real;
  // docs/design/gqa.md §2.5: a uniform decode batch (every request has uniform_decode_len
  // tokens) is padded with dummy requests of that length, so kernels that take
  // one row per request (paged attention, BNSD decode) see the padded batch as
  // more requests; otherwise one dummy request takes all padding tokens.
  const int32_t ulen = in.uniform_decode_len;
  AAR_CHECK_ARG(ulen >= 0, "uniform_decode_len=", ulen, " is negative");
  const bool uniform = add_dummy && ulen > 0 && max_query_len == ulen && (t_real == ulen * static_cast<int64_t>(b)) &&
                       (t_in - t_real) % ulen == 0;
  const std::size_t num_dummies = !add_dummy ? 0 : (uniform ? static_cast<std::size_t>((t_in - t_real) / ulen) : 1);
  const std::size_t b_fia = b + num_dummies;
  const std::size_t out_stride = static_cast<std::size_t>(buf.block_table_stride);
  check_capacity(buf.query_start_loc.size(), b_fia + 1, "buffers.query_start_loc");
  check_capacity(buf.seq_lens.size(), b_fia, "buffers.seq_lens");
  check_capacity(buf.slot_mapping.size(), static_cast<std::size_t>(t_in), "buffers.slot_mapping");
  check_capacity(buf.block_table.size(), b_fia * out_stride, "buffers.block_table");
  check_capacity(buf.q_ends.size(), b_fia, "buffers.q_ends");
  check_capacity(buf.kv_lens.size(), b_fia, "buffers.kv_lens");

  // Everything that may still throw is computed before the first write.
  StepPlan plan;
  plan.state = detail::resolve_state(in.attn_state, b == 0, all_fresh, all_sched_one, all_valid_one, in.spec_method,
                                     in.chunked_prefill_enabled, qsl, in.seq_lens);
  SplitInputs split_in;
  split_in.query_start_loc = qsl;
  split_in.num_actual_tokens = t_real;
  split_in.max_query_len = max_query_len;
  split_in.decode_threshold = in.decode_threshold;
  split_in.require_uniform = false;
  split_in.treat_short_extends_as_decodes = in.treat_short_extends_as_decodes;
  split_in.is_prefilling = in.is_prefilling;
  if (b > 0 && max_query_len <= in.decode_threshold && in.treat_short_extends_as_decodes) {
    // split_decodes_and_prefills' fast path (step 5), without its second pass
    // over query_start_loc (validated above; t_real = qsl[B] >= 0).
    plan.split = SplitResult{static_cast<int32_t>(b), 0, t_real, 0};
  } else {
    plan.split = split_decodes_and_prefills(split_in);
  }

  // ---------------------------------------------------------------- write
  std::copy(qsl.begin(), qsl.end(), buf.query_start_loc.begin());
  std::copy(in.seq_lens.begin(), in.seq_lens.end(), buf.seq_lens.begin());
  if (uniform) {
    // Dummies of ulen tokens each; their KV length equals their query length
    // (the smallest valid one), reading block 0.
    for (std::size_t i = 0; i < num_dummies; ++i) {
      buf.query_start_loc[b + 1 + i] = t_real + static_cast<int32_t>((i + 1) * ulen);
      buf.seq_lens[b + i] = ulen;
    }
    plan.fia = detail::write_fia_padding(qsl, in.seq_lens, t_real, buf.q_ends, buf.kv_lens, 1);
    for (std::size_t i = 0; i < num_dummies; ++i) {
      buf.q_ends[b + i] = t_real + static_cast<int64_t>((i + 1) * ulen);
      buf.kv_lens[b + i] = ulen;
    }
    plan.fia.num_reqs = static_cast<int32_t>(b_fia);
    plan.fia.num_tokens = t_in;
    plan.fia.added_dummy = true;
  } else {
    if (add_dummy) {
      buf.query_start_loc[b + 1] = t_in;
      buf.seq_lens[b] = 1;  // as upstream pads short seq_lens buffers (docs/design/gqa.md §2.5)
    }
    plan.fia = detail::write_fia_padding(qsl, in.seq_lens, add_dummy ? t_in : t_real, buf.q_ends, buf.kv_lens, 1);
  }

  if (!zero_copy) detail::copy_block_table_rows(in.block_table.data(), b, in_stride, buf.block_table.data(), out_stride);
  if (add_dummy) {
    int32_t* dst = buf.block_table.data() + b * out_stride;
    std::fill(dst, dst + num_dummies * out_stride, 0);
  }

  // Slot mapping: positions advance one by one, so block and offset are carried
  // instead of divided per token.
  int32_t* slots = buf.slot_mapping.data();
  if (all_sched_one && pow2) {
    // Decode-only batch: one token per request at position seq_len - 1, in the
    // last block the request reads. With that id stashed by the scan the loop
    // has no gather and vectorises.
    const int32_t mask = bs32 - 1;
    const int shift = bs_shift;
    const int32_t* __restrict last = last_ids;
    const int32_t* __restrict sl = seqs;
    int32_t* __restrict out = slots;
    const std::size_t n_stashed = stashed ? num_last : 0;
    for (std::size_t r = 0; r < n_stashed; ++r) out[r] = (last[r] << shift) + ((sl[r] - 1) & mask);
    for (std::size_t r = n_stashed; r < b; ++r) {
      const int32_t pos = sl[r] - 1;
      out[r] = (bt[r * in_stride + (pos >> shift)] << shift) + (pos & mask);
    }
  }
  for (std::size_t r = 0; r < b && !(all_sched_one && pow2); ++r) {
    const int32_t begin = qsl[r], end = qsl[r + 1];
    if (begin == end) continue;
    const int32_t* row = in.block_table.data() + r * in_stride;
    const int32_t pos0 = in.seq_lens[r] - (end - begin);
    int32_t blk = pow2 ? (pos0 >> bs_shift) : pos0 / bs32;
    int32_t off = pos0 - blk * bs32;
    // One run of consecutive slots per block (a branch-free loop the compiler vectorises), stepping
    // to the next block only when a token of this request lands there: the column after the
    // request's last block is not validated and may hold anything (fuzz_build_step: INT32_MIN *
    // block_size overflowed here).
    int32_t t = begin;
    for (;;) {
      const int32_t run = std::min(end - t, bs32 - off);
      const int32_t first = row[blk] * bs32 + off;
      int32_t* __restrict out = slots + t;
      for (int32_t i = 0; i < run; ++i) out[i] = first + i;
      t += run;
      if (t == end) break;
      off = 0;
      ++blk;
    }
  }
  std::fill(slots + t_real, slots + t_in, kPadSlot);

  plan.num_reqs = static_cast<int32_t>(b);
  plan.context_end = context_end;
  plan.num_actual_tokens = t_real;
  plan.num_input_tokens = t_in;
  plan.max_query_len = max_query_len;
  plan.max_seq_len = max_seq_len;
  return plan;
}

}  // namespace aar::plan
