// One DCP step's host planning (decisions in plan/dcp_step_plan.h). Validation
// and the split come first; the slot mapping validates the batch (sizes, block
// columns and ids) before its first write; everything after it cannot fail.
#include "ascend_attn_rt/cp/plan/dcp_step_plan.h"

#include <algorithm>
#include <climits>

#include "ascend_attn_rt/errors.h"
#include "ascend_attn_rt/plan/slot_mapping.h"
#include "dcp_internal.h"

namespace aar::plan {

namespace {

void check_room(std::size_t have, int64_t need, const char* name) {
  AAR_CHECK_ARG(static_cast<int64_t>(have) >= need, "buffers.", name, " has room for ", have, " entries, needs ",
                need);
}

}  // namespace

void write_dcp_decode_rows(CSpan<int32_t> qsl, CSpan<int32_t> seq_lens, int32_t num_decodes,
                           CSpan<int32_t> block_table, int32_t block_table_stride, const DcpShard& shard, int32_t rows,
                           Span<int64_t> q_ends, Span<int64_t> kv_lens, Span<int32_t> table, int32_t out_stride) {
  const int32_t td = num_decodes > 0 ? qsl[num_decodes] : 0;
  const int64_t os = out_stride;
  const std::size_t is = static_cast<std::size_t>(block_table_stride);
  // The shard and the lengths checked once, before any write; the local lengths then by the
  // shared 32-bit placement (shifts for a power-of-two shard), not a checked division per token.
  if (td > 0) detail::dcp::check_shard(shard);  // (no decode token: nothing reads it)
  for (int32_t r = 0; r < num_decodes; ++r) {
    const int64_t first = int64_t{seq_lens[r]} - (qsl[r + 1] - qsl[r]) + 1;  // the first token's KV length
    AAR_CHECK_ARG(qsl[r + 1] == qsl[r] || first >= 0, "len=", first, " is negative");
  }
  const detail::dcp::DcpMath dm(shard, 1);
  const bool narrow = int64_t{shard.world} * shard.interleave <= int64_t{UINT32_MAX};  // DcpMath's W * I is 32-bit
  const uint32_t me = static_cast<uint32_t>(shard.rank);
  for (int32_t r = 0; r < num_decodes; ++r) {
    const int32_t q = qsl[r + 1] - qsl[r];
    const int64_t h = seq_lens[r] - q;
    const int32_t* src = block_table.data() + static_cast<std::size_t>(r) * is;
    for (int32_t j = 0; j < q; ++j) {
      const int32_t t = qsl[r] + j;
      q_ends[t] = t + 1;
      kv_lens[t] = narrow ? dm.local_len(static_cast<uint32_t>(h + j + 1), me)
                          : detail::dcp::local_len(h + j + 1, shard.world, shard.interleave, shard.rank);
      int32_t* dst = table.data() + static_cast<int64_t>(t) * os;
      std::copy(src, src + is, dst);
      std::fill(dst + is, dst + os, 0);
    }
  }
  for (int32_t t = td; t < rows; ++t) {
    q_ends[t] = t + 1;
    kv_lens[t] = 0;
    std::fill(table.data() + static_cast<int64_t>(t) * os, table.data() + static_cast<int64_t>(t + 1) * os, 0);
  }
}

CSpan<int32_t> draft_step_seq_lens(CSpan<int32_t> query_start_loc, CSpan<int32_t> base_seq_lens,
                                   int32_t draft_index, Span<int32_t> out) {
  if (draft_index == -1) return base_seq_lens;
  const std::size_t b = base_seq_lens.size();
  AAR_CHECK_ARG(draft_index >= 0 && draft_index < 16, "draft_step=", draft_index,
                " is out of range: -1 (not a draft step) or [0, 16) (at most 15 draft steps)");
  AAR_CHECK_ARG(query_start_loc.size() == b + 1, "query_start_loc has ", query_start_loc.size(),
                " entries, expected seq_lens.size()+1 = ", b + 1);
  check_room(out.size(), static_cast<int64_t>(b), "draft_seq_lens");
  for (std::size_t r = 0; r <= b; ++r) {
    AAR_CHECK_ARG(query_start_loc[r] == static_cast<int32_t>(r), "a draft step (draft_step=", draft_index,
                  ") has one query token per request: query_start_loc[", r, "]=", query_start_loc[r],
                  ", expected ", r);
  }
  for (std::size_t r = 0; r < b; ++r) {
    AAR_CHECK_ARG(base_seq_lens[r] >= 0 && base_seq_lens[r] <= INT32_MAX - 16, "draft step: seq_lens[", r, "]=",
                  base_seq_lens[r], " is not a valid base length");
  }
  for (std::size_t r = 0; r < b; ++r) out[r] = base_seq_lens[r] + draft_index + 1;
  return CSpan<int32_t>(out.data(), b);
}

DcpStepPlan build_dcp_step(const DcpStepInputs& in, const DcpStepBuffers& buf) {
  // The step fields this plan has no use for: taken silently, a caller's
  // forced state or draft counts would seem to shape a step they do not.
  AAR_CHECK_ARG(!in.attn_state.has_value(), "attn_state was given, but the DCP step plan does not read it (its "
                "split and lengths serve every state)");
  AAR_CHECK_ARG(in.num_spec_tokens.empty(), "num_spec_tokens was given (", in.num_spec_tokens.size(),
                " entries), but the DCP step plan does not read it (decodes are the requests of at most "
                "decode_threshold tokens)");
  AAR_CHECK_ARG(in.req_ids.empty(), "req_ids was given (", in.req_ids.size(),
                " entries), but the DCP step plan does not read it (it keeps no per-request state)");
  const std::size_t b = in.seq_lens.size();
  const CSpan<int32_t> qsl = in.query_start_loc;
  AAR_CHECK_ARG(qsl.size() == b + 1, "query_start_loc has ", qsl.size(), " entries, expected seq_lens.size()+1 = ",
                b + 1);
  AAR_CHECK_ARG(in.decode_threshold >= 1 && in.decode_threshold <= 16, "decode_threshold=", in.decode_threshold,
                " is out of range [1, 16]");
  AAR_CHECK_ARG(in.is_prefilling.empty() || in.is_prefilling.size() == b, "is_prefilling has ",
                in.is_prefilling.size(), " entries, expected 0 or ", b);
  AAR_CHECK_ARG(in.shard.world >= 1 && in.shard.rank >= 0 && in.shard.rank < in.shard.world &&
                    in.shard.interleave >= 1,
                "DCP shard (world=", in.shard.world, ", rank=", in.shard.rank, ", interleave=", in.shard.interleave,
                ") is invalid");
  AAR_CHECK_ARG(buf.out_stride >= in.block_table_stride, "buffers.out_stride=", buf.out_stride,
                " is smaller than block_table_stride=", in.block_table_stride);
  // query_start_loc[0] first: with it negative, qsl[1] - qsl[0] below overflowed (fuzz_dcp_step).
  AAR_CHECK_ARG(b == 0 || qsl[0] == 0, "query_start_loc[0] must be 0, got ", qsl[0]);
  int32_t maxq = 0, maxs = 0;
  for (std::size_t r = 0; r < b; ++r) {
    AAR_CHECK_ARG(qsl[r + 1] >= qsl[r], "query_start_loc is not non-decreasing at ", r + 1, ": ", qsl[r], " > ",
                  qsl[r + 1]);
    maxq = std::max(maxq, qsl[r + 1] - qsl[r]);
    maxs = std::max(maxs, in.seq_lens[r]);
  }
  const int32_t t_real = b == 0 ? 0 : qsl[b];
  const int32_t t_in = in.num_input_tokens == 0 ? t_real : in.num_input_tokens;
  AAR_CHECK_ARG(t_in >= t_real, "num_input_tokens=", in.num_input_tokens, " is smaller than query_start_loc[", b,
                "]=", t_real);

  SplitInputs si;
  si.query_start_loc = qsl;
  si.num_actual_tokens = t_real;
  si.max_query_len = maxq;
  si.decode_threshold = in.decode_threshold;
  // docs/design/cp.md §3.2: short extends are prefills (by is_prefilling); without it no
  // request is prefilling, which is the "treat as decodes" rule, as with the
  // P/D recompute scheduler.
  si.treat_short_extends_as_decodes = in.is_prefilling.empty() || in.pd_recompute_scheduler;
  if (!si.treat_short_extends_as_decodes) si.is_prefilling = in.is_prefilling;
  const SplitResult split = b == 0 ? SplitResult{} : split_decodes_and_prefills(si);
  const int32_t nd = split.num_decodes, np = static_cast<int32_t>(b) - nd;
  const int32_t td = split.num_decode_tokens, tp = t_real - td;
  const int64_t os = buf.out_stride;
  // The slot mapping is written through a t_in-long view: its room is checked here, the view
  // cannot check it (fuzz_dcp_step found the pad fill running past a short buffer).
  check_room(buf.slot_mapping.size(), t_in, "slot_mapping");
  // Graph buckets: a decode-only step padded to num_input_tokens gets padding rows up to it.
  const int32_t dk = (np == 0 && nd > 0 && t_in > td) ? t_in : td;
  check_room(buf.decode_block_table.size(), static_cast<int64_t>(dk) * os, "decode_block_table");
  check_room(buf.decode_q_ends.size(), dk, "decode_q_ends");
  check_room(buf.decode_kv_lens.size(), dk, "decode_kv_lens");
  check_room(buf.prefill_block_table.size(), static_cast<int64_t>(np) * os, "prefill_block_table");
  check_room(buf.prefill_q_ends.size(), np, "prefill_q_ends");
  check_room(buf.prefill_context_lens.size(), np, "prefill_context_lens");
  check_room(buf.context_token_idx.size(), tp, "context_token_idx");

  for (std::size_t r = 0; r < b; ++r) {
    AAR_CHECK_ARG(in.seq_lens[r] >= qsl[r + 1] - qsl[r], "seq_lens[", r, "]=", in.seq_lens[r],
                  " is smaller than its query length ", qsl[r + 1] - qsl[r]);
  }
  SlotMappingInputs sm;
  sm.query_start_loc = qsl;
  sm.seq_lens = in.seq_lens;
  sm.block_table = in.block_table;
  sm.block_table_stride = in.block_table_stride;
  sm.block_size = in.block_size;
  sm.num_blocks = in.num_blocks;
  // The kernels read each request's local sequence through its row, context
  // included: those ids are checked on every rank alike (the slot mapping
  // checks the written ones only), then the slot mapping's own checks.
  check_dcp_block_table(sm, in.shard.world, in.shard.interleave);
  DcpStepPlan p;
  p.num_local_writes = compute_dcp_slot_mapping(sm, in.shard, buf.slot_mapping.subspan(0, t_in));

  const int32_t W = in.shard.world, I = in.shard.interleave, rk = in.shard.rank;
  const std::size_t is = static_cast<std::size_t>(in.block_table_stride);
  auto copy_row = [&](std::size_t req, int32_t* dst) {
    const int32_t* src = in.block_table.data() + req * is;
    std::copy(src, src + is, dst);
    std::fill(dst + is, dst + os, 0);
  };
  write_dcp_decode_rows(qsl, in.seq_lens, nd, in.block_table, in.block_table_stride, in.shard, dk,
                        buf.decode_q_ends, buf.decode_kv_lens, buf.decode_block_table, buf.out_stride);
  int64_t local_ctx = 0;
  bool has_ctx = false;
  int32_t n_idx = 0;
  for (int32_t i = 0; i < np; ++i) {
    const std::size_t r = static_cast<std::size_t>(nd + i);
    const int32_t q = qsl[r + 1] - qsl[r];
    const int32_t ctx = in.seq_lens[r] - q;
    buf.prefill_q_ends[i] = qsl[r + 1] - td;
    buf.prefill_context_lens[i] = dcp_local_len(ctx, W, I, rk);
    local_ctx += buf.prefill_context_lens[i];
    copy_row(r, buf.prefill_block_table.data() + static_cast<int64_t>(i) * os);
    if (ctx > 0) {
      has_ctx = true;
      for (int32_t j = 0; j < q; ++j) buf.context_token_idx[n_idx++] = qsl[r] - td + j;
    }
  }
  p.split = split;
  p.decode_kernel_rows = dk;
  p.num_reqs = static_cast<int32_t>(b);
  p.num_actual_tokens = t_real;
  p.num_input_tokens = t_in;
  p.max_query_len = maxq;
  p.max_seq_len = maxs;
  p.has_context = has_ctx;
  p.local_context_tokens = local_ctx;
  p.num_context_rows = n_idx;
  return p;
}

}  // namespace aar::plan
