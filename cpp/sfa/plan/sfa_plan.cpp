// SFA host planning (docs/design/sfa.md §3.1, §3.2, docs/design/sparse.md §8).
#include "ascend_attn_rt/sfa/plan/sfa_plan.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "ascend_attn_rt/errors.h"
#include "ascend_attn_rt/cp/plan/cp_groups.h"
#include "ascend_attn_rt/cp/plan/sparse_cp.h"
#include "ascend_attn_rt/plan/slot_mapping.h"
#include "../../cp/plan/dcp_internal.h"
#include "../../plan/block_scan.h"
#include "../../plan/cpu_features.h"
#include "../../plan/internal.h"
#include "../../plan/request_scan.h"

namespace aar::plan {

namespace {

using detail::dcp::DcpMath;  // the placement's arithmetic, shared with the MLA step plan

void check_room(std::size_t have, std::size_t need, const char* name) {
  AAR_CHECK_ARG(have >= need, name, " has room for ", have, " entries, needs ", need);
}

void check_optional_room(std::size_t have, std::size_t need, const char* name) {
  AAR_CHECK_ARG(have == 0 || have >= need, name, " has room for ", have, " entries, needs ", need,
                " (or pass an empty span: not written)");
}

// The replicated rows of a DCP step with W = 2 (docs/design/sparse_cp.md §2), when whole chunks of eight
// replicated columns (four local ones) stay within both rows: in_stride a multiple of 4 and rs of 8
// (the columns read, ceil(S / bs) <= W * in_stride, were checked by the scan). Row r's ids
// [2a, 2a + 1, 2b, 2b + 1, ...] go out eight at a time, the last chunk masked to its columns (zeros past
// them, which the row holds anyway); then the columns a longer earlier row left past the masked chunk
// are cleared (extent), and extent records the row's columns.
__attribute__((always_inline)) inline void replicated_rows_w2_body(const int32_t* table, std::size_t in_stride,
                                                                   const int32_t* seqs, std::size_t b,
                                                                   const detail::BlockCount& blocks, int32_t* rep,
                                                                   std::size_t rs, int32_t* extent) {
  for (std::size_t r = 0; r < b; ++r) {
    const int32_t* row = table + r * in_stride;
    int32_t* out = rep + r * rs;
    const int32_t cols = static_cast<int32_t>(blocks(seqs[r]));
    int32_t j = 0;
    for (; j < cols; j += 8) {
      const int32_t* mask = detail::kFirstLanes[std::min(cols - j, 8)];
      const detail::I32x4 v = detail::load_i32x4(row + (j >> 1)) << 1;
      const detail::I32x4 o = v | 1;
      const detail::I32x4 lo = __builtin_shufflevector(v, o, 0, 4, 1, 5) & detail::load_i32x4(mask);
      const detail::I32x4 hi = __builtin_shufflevector(v, o, 2, 6, 3, 7) & detail::load_i32x4(mask + 4);
      std::memcpy(out + j, &lo, sizeof lo);
      std::memcpy(out + j + 4, &hi, sizeof hi);
    }
    const int32_t dirty = extent != nullptr ? std::min<int32_t>(extent[r], static_cast<int32_t>(rs))
                                            : static_cast<int32_t>(rs);
    if (dirty > j) std::fill(out + j, out + dirty, 0);
    if (extent != nullptr) extent[r] = cols;
  }
}

void replicated_rows_w2_default(const int32_t* table, std::size_t in_stride, const int32_t* seqs, std::size_t b,
                                const detail::BlockCount& blocks, int32_t* rep, std::size_t rs, int32_t* extent) {
  replicated_rows_w2_body(table, in_stride, seqs, b, blocks, rep, rs, extent);
}

#if AAR_HAVE_X86_DISPATCH
__attribute__((target("avx2"))) void replicated_rows_w2_avx2(const int32_t* table, std::size_t in_stride,
                                                             const int32_t* seqs, std::size_t b,
                                                             const detail::BlockCount& blocks, int32_t* rep,
                                                             std::size_t rs, int32_t* extent) {
  replicated_rows_w2_body(table, in_stride, seqs, b, blocks, rep, rs, extent);
}
#endif

void replicated_rows_w2(const int32_t* table, std::size_t in_stride, const int32_t* seqs, std::size_t b,
                        const detail::BlockCount& blocks, int32_t* rep, std::size_t rs, int32_t* extent) {
#if AAR_HAVE_X86_DISPATCH
  if (aar::detail::cpu_has_avx2()) return replicated_rows_w2_avx2(table, in_stride, seqs, b, blocks, rep, rs, extent);
#endif
  replicated_rows_w2_default(table, in_stride, seqs, b, blocks, rep, rs, extent);
}

// A DCP decode step of one-token requests with W, I and bs powers of two (dm.pow2): request r's token at
// position p = seqs[r] - 1 gets its position, its local slot (kPadSlot off this rank) and its replicated
// slot, and the request its local length lk[r]. ids[r] is the id of local column c = p >> (sbs + sW),
// which both slots read: the local index's column (I | bs) and the replicated column's (j = c * W + k,
// k = (p >> sbs) mod W, replicated id row[c] * W + k; cp/plan/sparse_cp.h). No gather and no branch:
// the loop vectorises (its int64 select needs AVX2's 64-bit lanes, hence the clone below).
__attribute__((always_inline)) inline void one_token_dcp_body(const DcpMath& dm, const int32_t* seqs,
                                                              const int32_t* ids, std::size_t n, int32_t* pos,
                                                              int64_t* slots, int64_t* rslots, int32_t* lk) {
  const int sb = dm.sbs, sw = dm.sW, si = dm.sI, swi = dm.sWI;
  const uint32_t wm = dm.W - 1, im = dm.I - 1, bm = dm.bs - 1, wim = dm.WI - 1, rk = dm.rank;
  const int32_t I = static_cast<int32_t>(dm.I), rki = static_cast<int32_t>(dm.rank << si);
  for (std::size_t r = 0; r < n; ++r) {
    const uint32_t s = static_cast<uint32_t>(seqs[r]), p = s - 1;  // s >= its query length 1
    const int64_t id = ids[r];
    pos[r] = static_cast<int32_t>(p);
    const int64_t local = (id << sb) + ((((p >> swi) << si) | (p & im)) & bm);
    slots[r] = ((p >> si) & wm) == rk ? local : int64_t{kPadSlot};
    rslots[r] = (((id << sw) | ((p >> sb) & wm)) << sb) + (p & bm);
    // local_len(s, rank) with the clamp in 32 bits.
    const int32_t rem = std::min(std::max(static_cast<int32_t>(s & wim) - rki, 0), I);
    lk[r] = static_cast<int32_t>(((s >> swi) << si) + static_cast<uint32_t>(rem));
  }
}

void write_one_token_dcp_default(const DcpMath& dm, const int32_t* seqs, const int32_t* ids, std::size_t n,
                                 int32_t* pos, int64_t* slots, int64_t* rslots, int32_t* lk) {
  one_token_dcp_body(dm, seqs, ids, n, pos, slots, rslots, lk);
}

#if AAR_HAVE_X86_DISPATCH
__attribute__((target("avx2"))) void write_one_token_dcp_avx2(const DcpMath& dm, const int32_t* seqs,
                                                              const int32_t* ids, std::size_t n, int32_t* pos,
                                                              int64_t* slots, int64_t* rslots, int32_t* lk) {
  one_token_dcp_body(dm, seqs, ids, n, pos, slots, rslots, lk);
}
#endif

void write_one_token_dcp(const DcpMath& dm, const int32_t* seqs, const int32_t* ids, std::size_t n, int32_t* pos,
                         int64_t* slots, int64_t* rslots, int32_t* lk) {
#if AAR_HAVE_X86_DISPATCH
  if (n >= 8 && aar::detail::cpu_has_avx2()) return write_one_token_dcp_avx2(dm, seqs, ids, n, pos, slots, rslots, lk);
#endif
  write_one_token_dcp_default(dm, seqs, ids, n, pos, slots, rslots, lk);
}

// DCP: rank 0's local lengths of the requests into out (the block-table columns each reads, for the
// request scan), the seq_len sign check, and whether a request is fresh (seq_len = its query length).
// Out of line, as write_dcp_step.
__attribute__((noinline)) bool dcp_block_lens(const DcpMath& dm, CSpan<int32_t> qsl, const int32_t* seqs, std::size_t b,
                                              int32_t* out) {
  bool any_fresh = false;
  int32_t min_seq = 0;
  if (dm.pow2) {
    // local_len(s, 0) = (s >> sWI << sI) + min(s mod WI, I) in 32-bit lanes: the loop vectorises.
    const int swi = dm.sWI, si = dm.sI;
    const uint32_t wim = dm.WI - 1, I = dm.I;
    const int32_t* q = qsl.data();
    uint32_t fresh = 0;
    for (std::size_t r = 0; r < b; ++r) {
      const uint32_t s = static_cast<uint32_t>(seqs[r]);
      min_seq = std::min(min_seq, seqs[r]);
      out[r] = static_cast<int32_t>(((s >> swi) << si) + std::min(s & wim, I));
      fresh |= static_cast<uint32_t>(seqs[r] == q[r + 1] - q[r]);
    }
    any_fresh = fresh != 0;
  } else {
    for (std::size_t r = 0; r < b; ++r) {
      min_seq = std::min(min_seq, seqs[r]);
      out[r] = dm.local_len(static_cast<uint32_t>(seqs[r]), 0);
      any_fresh |= seqs[r] == qsl[r + 1] - qsl[r];
    }
  }
  if (min_seq < 0) {
    for (std::size_t r = 0; r < b; ++r) AAR_CHECK_ARG(seqs[r] >= 0, "seq_lens[", r, "]=", seqs[r], " is negative");
  }
  return any_fresh;
}

// plan_sfa_step's DCP writes (docs/design/sparse_cp.md §2), out of line: the single-rank path keeps its
// own code. Unchecked (plan_sfa_step validated everything first).
__attribute__((noinline)) void write_dcp_step(const SfaStepInputs& in, const SfaStepBuffers& buf, const DcpMath& dm,
                                              const detail::RequestScan& scan, const int32_t* last_ids,
                                              std::size_t b, std::size_t bk, int32_t t_real, int32_t t_in,
                                              int64_t* slots, int32_t* pos) {
  const CSpan<int32_t> qsl = in.query_start_loc;
  const int32_t* seqs = in.seq_lens.data();
  const int32_t* table = in.block_table.data();
  const std::size_t in_stride = static_cast<std::size_t>(in.block_table_stride);
  const DcpShard& dcp = in.dcp;
  // One pass per request (docs/design/sparse_cp.md §2): the replicated row, this rank's local
  // length, and per token its position, its local slot (the owner writes, -1 elsewhere) and
  // its replicated slot.
  const std::size_t rs = static_cast<std::size_t>(buf.replicated_stride);
  const int32_t W = dcp.world;
  const detail::BlockCount blocks(in.block_size);
  const uint32_t bmask = static_cast<uint32_t>(in.block_size) - 1;
  int32_t* lk = buf.dcp_seq_lens.data();
  int64_t* rslots = buf.replicated_slot_mapping.data();
  int32_t* extent = buf.replicated_extent.empty() ? nullptr : buf.replicated_extent.data();
  const bool one = scan.all_sched_one;
  // Every request one token and W, I, bs powers of two (the usual decode step): the tokens get their
  // own pass after the rows, one request per iteration without a gather, which vectorises.
  const bool one_pow2 = one && dm.pow2;
  // W = 2 with whole chunks in both rows: the rows in their own pass (replicated_rows_w2).
  const bool rows_w2 = one_pow2 && W == 2 && in_stride % 4 == 0 && rs % 8 == 0;
  if (rows_w2) replicated_rows_w2(table, in_stride, seqs, b, blocks, buf.replicated_block_table.data(), rs, extent);
  for (std::size_t r = 0; r < (rows_w2 ? 0 : b); ++r) {
    const int32_t begin = qsl[r], end = qsl[r + 1], seq = seqs[r];
    const int32_t* row = table + r * in_stride;
    int32_t* rep = buf.replicated_block_table.data() + r * rs;
    // Column j = c * W + k is local column c's replicated block k (cp/plan/sparse_cp.h).
    const int32_t cols = static_cast<int32_t>(blocks(seq));
    if (W == 2) {
      // The usual group: each local column gives a pair of ids.
      const int32_t full = cols >> 1;
      int32_t c = 0;
      for (; c + 4 <= full; c += 4) {
        // Four local columns give eight ids: [2a, 2a+1, 2b, 2b+1, ...].
        const detail::I32x4 v = detail::load_i32x4(row + c) << 1;
        const detail::I32x4 o = v | 1;
        const detail::I32x4 lo = __builtin_shufflevector(v, o, 0, 4, 1, 5);
        const detail::I32x4 hi = __builtin_shufflevector(v, o, 2, 6, 3, 7);
        std::memcpy(rep + 2 * c, &lo, sizeof lo);
        std::memcpy(rep + 2 * c + 4, &hi, sizeof hi);
      }
      for (; c < full; ++c) {
        const int32_t base = row[c] << 1;
        rep[2 * c] = base;
        rep[2 * c + 1] = base | 1;
      }
      if (cols & 1) rep[cols - 1] = row[full] << 1;
    } else if (dm.pow2) {
      // W a power of two (dm.pow2): j / W and j mod W as a shift and a mask.
      const int sw = dm.sW;
      const int32_t wm = W - 1;
      for (int32_t j = 0; j < cols; ++j) rep[j] = (row[j >> sw] << sw) | (j & wm);
    } else {
      int32_t j = 0;
      for (int32_t c = 0; j < cols; ++c) {
        const int32_t base = row[c] * W;
        for (int32_t k = 0; k < W && j < cols; ++k, ++j) rep[j] = base + k;
      }
    }
    const int32_t dirty = extent != nullptr ? std::min<int32_t>(extent[r], static_cast<int32_t>(rs))
                                            : static_cast<int32_t>(rs);
    if (dirty > cols) std::fill(rep + cols, rep + dirty, 0);
    if (extent != nullptr) extent[r] = cols;
    if (one_pow2) continue;  // the tokens below, after the rows
    lk[r] = dm.local_len(static_cast<uint32_t>(seq), dm.rank);
    const int32_t pos0 = seq - (end - begin);
    if (one) {
      // Every request one token (the usual decode step): token r at position seq - 1, no inner loop.
      const uint32_t p = static_cast<uint32_t>(seq - 1);
      pos[r] = static_cast<int32_t>(p);
      slots[r] = dm.local_slot(p, row);
      const uint32_t col = blocks.pow2 ? p >> blocks.shift : p / blocks.bs;
      const uint32_t off = blocks.pow2 ? p & bmask : p % blocks.bs;
      rslots[r] = static_cast<int64_t>(rep[col]) * in.block_size + off;
      continue;
    }
    for (int32_t t = begin; t < end; ++t) {
      const uint32_t p = static_cast<uint32_t>(pos0 + (t - begin));
      pos[t] = static_cast<int32_t>(p);
      slots[t] = dm.local_slot(p, row);
      const uint32_t col = blocks.pow2 ? p >> blocks.shift : p / blocks.bs;
      const uint32_t off = blocks.pow2 ? p & bmask : p % blocks.bs;
      rslots[t] = static_cast<int64_t>(rep[col]) * in.block_size + off;
    }
  }
  if (one_pow2) {
    // Local column p >> (sbs + sW) of token r (p = seq - 1) is rank 0's last (docs/design/sparse_cp.md
    // §2: rank 0 owns position c * W * bs < S), the id the scan stashed for the first num_last rows.
    const std::size_t nl = std::min(b, scan.num_last);
    write_one_token_dcp(dm, seqs, last_ids, nl, pos, slots, rslots, lk);
    for (std::size_t r = nl; r < b; ++r) {
      const int32_t id = table[r * in_stride + (static_cast<uint32_t>(seqs[r] - 1) >> (dm.sbs + dm.sW))];
      write_one_token_dcp(dm, seqs + r, &id, 1, pos + r, slots + r, rslots + r, lk + r);
    }
  }
  std::fill(lk + b, lk + bk, 0);
  if (!buf.dcp_seq_lens_list.empty()) std::copy(lk, lk + bk, buf.dcp_seq_lens_list.data());
  std::fill(rslots + t_real, rslots + t_in, int64_t{kPadSlot});
  for (std::size_t r = b; r < bk; ++r) {
    const int32_t dirty = extent != nullptr ? std::min<int32_t>(extent[r], static_cast<int32_t>(rs))
                                            : static_cast<int32_t>(rs);
    std::fill(buf.replicated_block_table.data() + r * rs, buf.replicated_block_table.data() + r * rs + dirty, 0);
    if (extent != nullptr) extent[r] = 0;
  }
}

}  // namespace

SfaStepPlan plan_sfa_step(const SfaStepInputs& in, const SfaStepBuffers& buf) {
  // ---------------------------------------------------------------- validate
  const std::size_t b = in.seq_lens.size();
  const CSpan<int32_t> qsl = in.query_start_loc;
  const detail::StepTokens tokens = detail::check_step_batch(in);
  const int32_t t_real = tokens.real, t_in = tokens.input;
  const std::size_t in_stride = static_cast<std::size_t>(in.block_table_stride);
  const std::size_t stride = static_cast<std::size_t>(buf.block_table_stride);
  const bool zero_copy = detail::check_block_table_args(in.block_table, b, in.block_table_stride,
                                                        buf.block_table.data(), buf.block_table_stride);
  const int32_t* seqs = in.seq_lens.data();
  const int32_t* table = in.block_table.data();
  // DCP (docs/design/sparse_cp.md §2): the block table holds this rank's local blocks, so
  // the columns a request reads follow rank 0's local length (the longest).
  const DcpShard& dcp = in.dcp;
  const bool use_dcp = dcp.world > 1;
  AAR_CHECK_ARG(dcp.world >= 1 && dcp.world <= kMaxCpMergePartitions && dcp.rank >= 0 && dcp.rank < dcp.world,
                "dcp: rank ", dcp.rank, " of world size ", dcp.world, " is not a valid DCP rank (world in [1, ",
                kMaxCpMergePartitions, "])");
  AAR_CHECK_ARG(dcp.interleave >= 1 && in.block_size % dcp.interleave == 0, "dcp: cp_kv_cache_interleave_size=",
                dcp.interleave, " must be positive and divide block_size=", in.block_size);
  const DcpMath dm(dcp, in.block_size);
  bool any_fresh = false;  // DCP: a request whose seq_len is its query length (the split's is_prefilling)
  if (use_dcp) {
    check_room(buf.dcp_block_lens.size(), b, "buffers.dcp_block_lens");
    // (dcp_block_lens is the caller's scratch: written before the check.)
    any_fresh = dcp_block_lens(dm, qsl, seqs, b, buf.dcp_block_lens.data());
  } else {
    AAR_CHECK_ARG(buf.dcp_seq_lens.empty() && buf.replicated_block_table.empty() &&
                      buf.replicated_slot_mapping.empty(),
                  "buffers: the DCP outputs are given but dcp.world is 1");
  }
  int32_t last_ids[detail::kStashRows];
  const detail::RequestScan scan =
      detail::scan_requests(qsl, seqs, b, in.num_spec_tokens.empty() ? nullptr : in.num_spec_tokens.data(), table,
                            in_stride, in.block_size, in.num_blocks, in.rope_positions, last_ids,
                            use_dcp ? buf.dcp_block_lens.data() : nullptr);

  SfaStepPlan plan;
  plan.state = detail::resolve_state(in.attn_state, b == 0, scan.all_fresh, scan.all_sched_one, scan.all_valid_one,
                                     in.spec_method, in.chunked_prefill_enabled, qsl, in.seq_lens);
  const int32_t thr = in.decode_threshold;
  const bool all_decodes = b > 0 && scan.max_query_len <= thr;
  AAR_CHECK_ARG(in.is_prefilling.empty() || in.is_prefilling.size() == b, "is_prefilling has ",
                in.is_prefilling.size(), " entries, expected 0 or one per request (", b, ")");
  const bool short_as_decodes = in.treat_short_extends_as_decodes && !use_dcp;
  if (use_dcp && in.is_prefilling.empty() && all_decodes && !any_fresh) {
    // The DCP split below without a fresh request and with every query within the threshold:
    // no request is a prefill, so all are decodes (split_decodes_and_prefills' step 10).
    plan.split = SplitResult{static_cast<int32_t>(b), 0, t_real, 0};
  } else if (use_dcp && in.is_prefilling.empty()) {
    // Without flags the DCP split's is_prefilling is "a fresh request" (docs/design/sparse_cp.md §2).
    thread_local std::vector<uint8_t> fresh;
    fresh.resize(b);
    for (std::size_t r = 0; r < b; ++r) fresh[r] = seqs[r] == qsl[r + 1] - qsl[r];
    SplitInputs split_in;
    split_in.query_start_loc = qsl;
    split_in.num_actual_tokens = t_real;
    split_in.max_query_len = scan.max_query_len;
    split_in.decode_threshold = thr;
    split_in.treat_short_extends_as_decodes = false;
    split_in.is_prefilling = CSpan<uint8_t>(fresh.data(), b);
    plan.split = split_decodes_and_prefills(split_in);
  } else if (all_decodes && short_as_decodes) {
    // The split rule's fast path (docs/design/gqa.md §2.2), qsl already validated.
    plan.split = SplitResult{static_cast<int32_t>(b), 0, t_real, 0};
  } else {
    SplitInputs split_in;
    split_in.query_start_loc = qsl;
    split_in.num_actual_tokens = t_real;
    split_in.max_query_len = scan.max_query_len;
    split_in.decode_threshold = thr;
    split_in.treat_short_extends_as_decodes = short_as_decodes;
    split_in.is_prefilling = in.is_prefilling;
    plan.split = split_decodes_and_prefills(split_in);
  }

  const int32_t np = plan.split.num_prefills;
  AAR_CHECK_ARG(!in.pad_only_decode_buckets || t_in == t_real || (b > 0 && np == 0), "num_input_tokens=", t_in,
                ": only a decode-only step is padded to a graph bucket here (this one has ", np,
                " prefills; give 0 or query_start_loc[-1]=", t_real, ")");
  if (in.capture_decode_only && (b == 0 || np > 0)) {
    throw_not_supported("build_for_graph_capture: SFA PCP captures decode-only buckets only; this step has ", np,
                        " prefills and ", plan.split.num_decodes, " decodes (a step with prefills keeps its PCP "
                        "head/tail split and runs eagerly, docs/design/sparse_cp.md §11.1)");
  }
  const bool pad = in.pad_decode_batch && all_decodes && t_in > t_real;
  std::size_t num_dummies = 0;
  if (pad) {
    AAR_CHECK_ARG((t_in - t_real) % thr == 0, "graph decode padding: num_input_tokens=", t_in, " pads ", t_real,
                  " decode tokens by ", t_in - t_real, ", not a multiple of the decode length ", thr,
                  " (1 + num_speculative_tokens)");
    num_dummies = static_cast<std::size_t>((t_in - t_real) / thr);
    const std::size_t room = std::min({buf.cum_query_lens.size(), buf.seq_lens.size(),
                                       buf.block_table.size() / std::max<std::size_t>(stride, 1)});
    AAR_CHECK_ARG(b + num_dummies <= room, "graph decode padding: ", b, " decodes + ", num_dummies,
                  " dummy requests (num_input_tokens=", t_in, ") exceed the room for ", room, " requests");
  }
  const std::size_t bk = b + num_dummies;
  const std::size_t ti = static_cast<std::size_t>(t_in);
  check_optional_room(buf.query_start_loc.size(), b + 1, "buffers.query_start_loc");
  check_room(buf.cum_query_lens.size(), bk, "buffers.cum_query_lens");
  check_room(buf.seq_lens.size(), bk, "buffers.seq_lens");
  check_room(buf.block_table.size(), bk * stride, "buffers.block_table");
  check_room(buf.slot_mapping.size(), ti, "buffers.slot_mapping");
  check_room(buf.positions.size(), ti, "buffers.positions");
  check_optional_room(buf.cum_query_lens_list.size(), bk, "buffers.cum_query_lens_list");
  check_optional_room(buf.seq_lens_list.size(), bk, "buffers.seq_lens_list");
  if (use_dcp) {
    check_room(buf.dcp_seq_lens.size(), bk, "buffers.dcp_seq_lens");
    check_optional_room(buf.dcp_seq_lens_list.size(), bk, "buffers.dcp_seq_lens_list");
    check_room(buf.replicated_slot_mapping.size(), ti, "buffers.replicated_slot_mapping");
    AAR_CHECK_ARG(buf.replicated_stride >= in.block_table_stride * dcp.world, "buffers.replicated_stride=",
                  buf.replicated_stride, " is below block_table_stride x world = ", in.block_table_stride, " x ",
                  dcp.world);
    check_room(buf.replicated_block_table.size(), bk * static_cast<std::size_t>(buf.replicated_stride),
               "buffers.replicated_block_table");
    check_optional_room(buf.replicated_extent.size(), bk, "buffers.replicated_extent");
    // What the replicated views (docs/design/sparse_cp.md §2, dcp_replicated_block_table /
    // dcp_replicated_slot_mapping) check beyond the scan above. The columns they read are
    // checked by the scan: with I | bs, rank 0's local length covers local column
    // c_max = floor((ceil(S / bs) - 1) / W) (position c_max * W * bs < S is rank 0's, and the
    // c_max * bs rank-0 positions before it fill c_max blocks), so its ids are in range, and
    // S >= q, the query lengths and the capacities were checked too.
    AAR_CHECK_ARG(static_cast<int64_t>(in.num_blocks) * dcp.world <= INT32_MAX, "num_blocks*world = ",
                  in.num_blocks, "*", dcp.world, " replicated blocks do not fit int32 block ids");
  }

  // ---------------------------------------------------------------- write
  if (!buf.query_start_loc.empty()) std::copy(qsl.begin(), qsl.end(), buf.query_start_loc.begin());
  if (!zero_copy) detail::copy_block_table_rows(table, b, in_stride, buf.block_table.data(), stride);
  int32_t* cql = buf.cum_query_lens.data();
  int32_t* kv = buf.seq_lens.data();
  std::copy(qsl.begin() + 1, qsl.end(), cql);
  std::copy(seqs, seqs + b, kv);
  int64_t* slots = buf.slot_mapping.data();
  int32_t* pos = buf.positions.data();
  if (use_dcp) {
    write_dcp_step(in, buf, dm, scan, last_ids, b, bk, t_real, t_in, slots, pos);
  } else if (scan.all_sched_one && b > 0) {
    detail::write_one_token_slots(seqs, b, table, in_stride, in.block_size, last_ids, scan.num_last, slots, pos);
  } else {
    detail::write_token_slots(qsl, seqs, b, table, in_stride, in.block_size, slots,
                              [&](std::size_t r) { return pos + qsl[r]; });
  }
  std::fill(slots + t_real, slots + t_in, int64_t{kPadSlot});
  std::fill(pos + t_real, pos + t_in, 0);
  for (std::size_t i = 0; i < num_dummies; ++i) {
    cql[b + i] = t_real + static_cast<int32_t>(i + 1) * thr;
    kv[b + i] = 0;
  }
  if (num_dummies > 0) std::fill(buf.block_table.data() + b * stride, buf.block_table.data() + bk * stride, 0);
  if (!buf.cum_query_lens_list.empty()) std::copy(cql, cql + bk, buf.cum_query_lens_list.data());
  if (!buf.seq_lens_list.empty()) std::copy(kv, kv + bk, buf.seq_lens_list.data());

  plan.num_reqs = static_cast<int32_t>(b);
  plan.num_kernel_reqs = static_cast<int32_t>(bk);
  plan.num_actual_tokens = t_real;
  plan.num_input_tokens = t_in;
  plan.max_query_len = scan.max_query_len;
  plan.max_seq_len = scan.max_seq_len;
  plan.padded = num_dummies > 0;
  return plan;
}

namespace {

// build_valid_topk_mask's and mask_invalid_topk's checks; returns the rows.
std::size_t check_topk_mask_args(CSpan<int32_t> topk, int32_t K, CSpan<int32_t> thresholds_per_row,
                                 std::size_t out_size) {
  AAR_CHECK_ARG(K > 0, "K (index_topk) must be positive, got ", K);
  const std::size_t k = static_cast<std::size_t>(K);
  AAR_CHECK_ARG(topk.size() % k == 0, "topk has ", topk.size(), " entries, not a multiple of K=", K);
  const std::size_t rows = topk.size() / k;
  AAR_CHECK_ARG(thresholds_per_row.size() == rows, "thresholds_per_row has ", thresholds_per_row.size(),
                " entries, expected one per top-k row: ", rows);
  AAR_CHECK_ARG(out_size >= topk.size(), "out has room for ", out_size, " entries, needs ", topk.size());
  int32_t min_thr = 0;
  for (std::size_t r = 0; r < rows; ++r) min_thr = std::min(min_thr, thresholds_per_row[r]);
  if (min_thr < 0) {
    for (std::size_t r = 0; r < rows; ++r) {
      AAR_CHECK_ARG(thresholds_per_row[r] >= 0, "thresholds_per_row[", r, "]=", thresholds_per_row[r],
                    " is negative (a threshold is a KV length)");
    }
  }
  return rows;
}

}  // namespace

void mask_invalid_topk(CSpan<int32_t> topk, int32_t K, CSpan<int32_t> thresholds_per_row, Span<int32_t> out) {
  const std::size_t rows = check_topk_mask_args(topk, K, thresholds_per_row, out.size());
  const std::size_t k = static_cast<std::size_t>(K);
  const int32_t* t = topk.data();
  int32_t* o = out.data();
  for (std::size_t r = 0; r < rows; ++r) {
    const uint32_t thr = static_cast<uint32_t>(thresholds_per_row[r]);
    for (std::size_t j = 0; j < k; ++j) {
      const int32_t v = t[r * k + j];
      o[r * k + j] = static_cast<uint32_t>(v) < thr ? v : -1;
    }
  }
}

bool masked_topk_equals(CSpan<int32_t> topk, int32_t K, CSpan<int32_t> thresholds_per_row, CSpan<int32_t> masked) {
  const std::size_t rows = check_topk_mask_args(topk, K, thresholds_per_row, masked.size());
  const std::size_t k = static_cast<std::size_t>(K);
  const int32_t* t = topk.data();
  const int32_t* m = masked.data();
  for (std::size_t r = 0; r < rows; ++r) {
    const uint32_t thr = static_cast<uint32_t>(thresholds_per_row[r]);
    int32_t diff = 0;  // no branch per entry: the row's differences or-ed together
    for (std::size_t j = 0; j < k; ++j) {
      const int32_t v = t[r * k + j];
      diff |= (static_cast<uint32_t>(v) < thr ? v : -1) ^ m[r * k + j];
    }
    if (diff != 0) return false;
  }
  return true;
}

void build_valid_topk_mask(CSpan<int32_t> topk, int32_t K, CSpan<int32_t> thresholds_per_row, Span<uint8_t> out) {
  const std::size_t rows = check_topk_mask_args(topk, K, thresholds_per_row, out.size());
  const std::size_t k = static_cast<std::size_t>(K);
  const int32_t* t = topk.data();
  uint8_t* o = out.data();
  for (std::size_t r = 0; r < rows; ++r) {
    // One unsigned compare per entry: a negative index wraps above any threshold.
    const uint32_t thr = static_cast<uint32_t>(thresholds_per_row[r]);
    for (std::size_t j = 0; j < k; ++j) o[r * k + j] = static_cast<uint8_t>(static_cast<uint32_t>(t[r * k + j]) < thr);
  }
}

}  // namespace aar::plan
