// MLA host planning (docs/design/mla.md §3.2, §3.4, §3.5).
#include "ascend_attn_rt/mla/plan/mla_plan.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <vector>

#include "ascend_attn_rt/errors.h"
#include "ascend_attn_rt/cp/plan/dcp_step_plan.h"
#include "ascend_attn_rt/plan/seq_lens.h"
#include "ascend_attn_rt/plan/slot_mapping.h"
#include "ascend_attn_rt/plan/split.h"
#include "ascend_attn_rt/plan/workspace.h"
#include "../../plan/block_scan.h"
#include "../../plan/internal.h"
#include "../../plan/request_scan.h"
#include "../../cp/plan/dcp_internal.h"

namespace aar::plan {

int32_t mla_reorder_batch(CSpan<int32_t> num_scheduled, int32_t decode_threshold, Span<int32_t> perm_out,
                          Span<int32_t> swaps_out) {
  const std::size_t b = num_scheduled.size();
  AAR_CHECK_ARG(decode_threshold >= 1 && decode_threshold <= 16, "decode_threshold=", decode_threshold,
                " is out of range [1, 16]");
  AAR_CHECK_ARG(perm_out.size() == b, "perm_out has ", perm_out.size(), " entries, expected ", b);
  AAR_CHECK_ARG(swaps_out.size() >= 2 * b, "swaps_out has room for ", swaps_out.size(),
                " entries, needs at least 2*B = ", 2 * b);
  // Validate every entry before the first write: a rejected call leaves perm_out untouched
  // (found by fuzz_reorder: the identity used to be written while validating).
  int32_t num_dec = 0;
  for (std::size_t i = 0; i < b; ++i) {
    AAR_CHECK_ARG(num_scheduled[i] >= 0, "num_scheduled[", i, "]=", num_scheduled[i], " is negative");
    if (num_scheduled[i] <= decode_threshold) ++num_dec;
  }
  for (std::size_t i = 0; i < b; ++i) perm_out[i] = static_cast<int32_t>(i);
  const int32_t n = static_cast<int32_t>(b);
  const int32_t num_pre = n - num_dec;
  // dec[#dec - i] walks the decodes from the back; pre[k] the prefills from the front.
  int32_t dec_cursor = n - 1;  // next decode from the back
  int32_t pre_cursor = 0;      // next prefill from the front
  int32_t swaps = 0;
  for (int32_t i = 1; i <= std::min(num_dec, num_pre); ++i) {
    while (dec_cursor >= 0 && num_scheduled[dec_cursor] > decode_threshold) --dec_cursor;
    if (dec_cursor < num_dec) break;
    while (num_scheduled[pre_cursor] <= decode_threshold) ++pre_cursor;
    const int32_t d = dec_cursor, p = pre_cursor;
    std::swap(perm_out[d], perm_out[p]);
    swaps_out[2 * swaps] = std::min(d, p);
    swaps_out[2 * swaps + 1] = std::max(d, p);
    ++swaps;
    --dec_cursor;
    ++pre_cursor;
  }
  return swaps;
}

namespace {

// docs/design/mla.md §3.4 geometry (chunk size and count) from the context statistics;
// validates, writes nothing.
ContextChunkPlan chunk_geometry(int32_t num_with_context, int32_t max_context, int64_t workspace_tokens,
                                int32_t block_size, int32_t max_chunks) {
  ContextChunkPlan p;
  p.num_with_context = num_with_context;
  p.max_context = max_context;
  if (num_with_context == 0) return p;
  AAR_CHECK_ARG(workspace_tokens > 0, "workspace_tokens must be positive, got ", workspace_tokens);
  const int64_t bs = block_size;
  // Capped at the largest int32 multiple of the block: chunk_size is int32, and a huge
  // workspace wrapped it (fuzz_sizes); no context is longer, so the chunk count is unchanged.
  int64_t chunk = std::min<int64_t>((workspace_tokens / num_with_context) / bs * bs, INT32_MAX / bs * bs);
  AAR_CHECK_ARG(chunk > 0, "workspace_tokens=", workspace_tokens, " is too small: ", num_with_context,
                " prefills with context need at least one block of ", bs, " tokens each");
  int64_t chunks = (max_context + chunk - 1) / chunk;
  if (chunks > max_chunks) {
    chunk = round_up((int64_t{max_context} + max_chunks - 1) / max_chunks, bs);  // int64: max_context may be INT32_MAX
    chunks = (max_context + chunk - 1) / chunk;
    p.bounded = true;
    // chunk_size is int32: a context that needs a chunk past it within max_chunks is refused
    // (fuzz_sizes: max_context = INT32_MAX with max_chunks = 1 wrapped it negative).
    AAR_CHECK_ARG(chunk <= INT32_MAX, "max_context=", max_context, " needs chunks of ", chunk,
                  " tokens to fit max_chunks=", max_chunks, ", beyond int32");
  }
  p.chunk_size = static_cast<int32_t>(chunk);
  p.num_chunks = static_cast<int32_t>(chunks);
  return p;
}

void check_chunk_args(int32_t block_size, int32_t max_chunks) {
  AAR_CHECK_ARG(block_size > 0, "block_size must be positive, got ", block_size);
  AAR_CHECK_ARG(max_chunks >= 1 && max_chunks <= kMaxContextChunks, "max_chunks must be in [1, ",
                kMaxContextChunks, "] (npu_attention_update merges at most 16 partial results), got ", max_chunks);
}

void check_chunk_capacity(std::size_t np, int32_t max_chunks, const ContextChunkBuffers& buf) {
  const std::size_t cap = static_cast<std::size_t>(max_chunks);
  AAR_CHECK_ARG(buf.cu_seq_lens.size() >= cap * (np + 1), "cu_seq_lens has room for ", buf.cu_seq_lens.size(),
                " entries, needs max_chunks*(NP+1) = ", cap * (np + 1));
  AAR_CHECK_ARG(buf.starts.size() >= cap * np && buf.chunk_seq_lens.size() >= cap * np &&
                    buf.kv_ends.size() >= cap * np,
                "starts / chunk_seq_lens / kv_ends need room for max_chunks*NP = ", cap * np, " entries, got ",
                buf.starts.size(), " / ", buf.chunk_seq_lens.size(), " / ", buf.kv_ends.size());
  AAR_CHECK_ARG(buf.seq_tot.size() >= cap && buf.max_seq_lens.size() >= cap,
                "seq_tot / max_seq_lens need room for max_chunks = ", cap, " entries");
}

// Unchecked writer; ctx(b) is the context length of prefill b.
template <typename Ctx>
void write_chunks(std::size_t np, Ctx ctx, const ContextChunkPlan& p, const ContextChunkBuffers& buf) {
  const int64_t chunk = p.chunk_size;
  for (int64_t c = 0; c < p.num_chunks; ++c) {
    int32_t* cu = buf.cu_seq_lens.data() + c * (np + 1);
    int32_t* starts = buf.starts.data() + c * np;
    int32_t* lens = buf.chunk_seq_lens.data() + c * np;
    int64_t* ends = buf.kv_ends.data() + c * np;
    const int64_t start = c * chunk;
    cu[0] = 0;
    int64_t tot = 0, mx = 0;
    for (std::size_t b = 0; b < np; ++b) {
      const int64_t len = std::max<int64_t>(0, std::min<int64_t>(ctx(b), start + chunk) - start);
      starts[b] = static_cast<int32_t>(start);
      lens[b] = static_cast<int32_t>(len);
      tot += len;
      mx = std::max(mx, len);
      cu[b + 1] = static_cast<int32_t>(tot);
      ends[b] = tot;
    }
    buf.seq_tot[c] = tot;
    buf.max_seq_lens[c] = mx;
  }
}

// cu_seq_lens are int32: the tokens of one chunk over every request must fit. Chunk 0 holds
// the most (a request's share of chunk c never grows with c). (fuzz_sizes, in CI's smoke pass:
// contexts near INT32_MAX over several requests wrapped cu_seq_lens.)
template <class Ctx>
void check_chunk_totals(std::size_t np, Ctx ctx, const ContextChunkPlan& p) {
  int64_t tot = 0;
  for (std::size_t b = 0; b < np; ++b) tot += std::min<int64_t>(ctx(b), p.chunk_size);
  AAR_CHECK_ARG(tot <= INT32_MAX, "context chunks: chunk 0 gathers ", tot, " tokens over ", np,
                " prefills (chunk_size=", p.chunk_size, "), more than the int32 cu_seq_lens hold");
}

// docs/design/mla.md §6.1 / §6.3 over the global chunks written by write_chunks (chunk
// a multiple of B * W): local starts c * Cl (Cl = chunk / W), the padded local
// lengths every rank gathers, plen[c][b] = max(0, min(pad_ctx_b, (c+1) Cl) -
// c Cl) with pad_ctx_b = ceil(ctx_b / (I W)) I (no rank holds more of the
// request), and the rows of the all-gathered [W * sum_b plen[c][b]] buffer
// that hold real tokens: for request b and rank k, n_k = min(max(0,
// local_len(ctx_b, k) - c Cl), plen[c][b]) rows from k * toks + src_b.
// Unchecked.
template <typename Ctx>
void write_dcp_chunks(std::size_t np, Ctx ctx, const ContextChunkPlan& p, const DcpShard& dcp,
                      const ContextChunkBuffers& buf) {
  const int64_t W = dcp.world, I = dcp.interleave;
  const int64_t cl = p.chunk_size / W;
  int64_t at = 0;
  for (int64_t c = 0; c < p.num_chunks; ++c) {
    int32_t* starts = buf.starts.data() + c * np;
    int32_t* plen = buf.padded_chunk_seq_lens.data() + c * np;
    const int64_t lstart = c * cl;
    int64_t toks = 0;
    for (std::size_t b = 0; b < np; ++b) {
      const int64_t pad_ctx = (ctx(b) + I * W - 1) / (I * W) * I;
      starts[b] = static_cast<int32_t>(lstart);
      plen[b] = static_cast<int32_t>(std::max<int64_t>(0, std::min(pad_ctx, lstart + cl) - lstart));
      toks += plen[b];
    }
    buf.local_seq_tot[c] = toks;
    buf.reorg_offsets[c] = at;
    int64_t src = 0;
    for (std::size_t b = 0; b < np; ++b) {
      for (int64_t k = 0; k < W; ++k) {
        const int64_t local = dcp_local_len(ctx(b), dcp.world, dcp.interleave, static_cast<int32_t>(k));
        const int64_t n = std::min<int64_t>(std::max<int64_t>(0, local - lstart), plen[b]);
        for (int64_t i = 0; i < n; ++i) buf.reorg_index[at++] = k * toks + src + i;
      }
      src += plen[b];
    }
  }
  buf.reorg_offsets[p.num_chunks] = at;
}

void check_room(std::size_t have, std::size_t need, const char* name) {
  AAR_CHECK_ARG(have >= need, name, " has room for ", have, " entries, needs ", need);
}

}  // namespace

ContextChunkPlan plan_context_chunks(const ContextChunkInputs& in, const ContextChunkBuffers& buf) {
  const std::size_t np = in.context_lens.size();
  check_chunk_args(in.block_size, in.max_chunks);
  int32_t nwc = 0, max_ctx = 0;
  for (std::size_t b = 0; b < np; ++b) {
    AAR_CHECK_ARG(in.context_lens[b] >= 0, "context_lens[", b, "]=", in.context_lens[b], " is negative");
    if (in.context_lens[b] > 0) ++nwc;
    max_ctx = std::max(max_ctx, in.context_lens[b]);
  }
  const ContextChunkPlan p = chunk_geometry(nwc, max_ctx, in.workspace_tokens, in.block_size, in.max_chunks);
  if (p.num_chunks == 0) return p;
  check_chunk_capacity(np, in.max_chunks, buf);
  auto ctx = [&](std::size_t b) { return in.context_lens[b]; };
  check_chunk_totals(np, ctx, p);
  write_chunks(np, ctx, p, buf);
  return p;
}

MlaStepPlan plan_mla_step(const MlaStepInputs& in, const MlaStepBuffers& buf) {
  // ---------------------------------------------------------------- validate
  // The batch checks plan::build_step makes (same messages), then the MLA ones.
  const std::size_t b = in.seq_lens.size();
  const CSpan<int32_t> qsl = in.query_start_loc;
  const detail::StepTokens tokens = detail::check_step_batch(in);
  const int32_t t_real = tokens.real, t_in = tokens.input;
  check_chunk_args(in.block_size, in.max_chunks);
  const std::size_t in_stride = static_cast<std::size_t>(in.block_table_stride);
  const std::size_t stride = static_cast<std::size_t>(buf.block_table_stride);
  const bool zero_copy = detail::check_block_table_args(in.block_table, b, in.block_table_stride,
                                                        buf.block_table.data(), buf.block_table_stride);

  const int32_t bs = in.block_size;
  const bool has_spec = !in.num_spec_tokens.empty();
  const int32_t* seqs = in.seq_lens.data();
  const int32_t* table = in.block_table.data();
  MlaStepPlan plan;
  // Decode context parallel (docs/design/mla.md §6): the shard, then rank 0's local
  // lengths as the block-table extent of every request.
  const DcpShard& dcp = in.dcp;
  const bool use_dcp = dcp.world > 1;
  AAR_CHECK_ARG(dcp.world >= 1 && dcp.rank >= 0 && dcp.rank < dcp.world, "dcp: rank ", dcp.rank,
                " of world size ", dcp.world, " is not a valid DCP rank");
  AAR_CHECK_ARG(dcp.interleave >= 1 && bs % dcp.interleave == 0, "dcp: cp_kv_cache_interleave_size=",
                dcp.interleave, " must be positive and divide block_size=", bs, " (docs/design/cp.md §1.1)");
  // The DCP lengths and flags are computed into this thread's scratch and copied
  // into the caller's buffers in the write phase: a rejected step leaves them
  // unchanged like every other buffer (they used to be written before the scan).
  thread_local std::vector<int32_t> dcp_lens, dcp_mine;
  thread_local std::vector<uint8_t> dcp_pre;
  // The shard's divisors as multiply-highs when they fit 32 bits (every real shard: W <= 16 and I
  // divides the block size); a larger one keeps the plain divisions.
  const int64_t dcp_wi = int64_t{dcp.world} * dcp.interleave;
  const bool fast_dcp = use_dcp && dcp_wi <= int64_t{UINT32_MAX};
  const detail::dcp::FastDiv fd_wi(fast_dcp ? static_cast<uint32_t>(dcp_wi) : 1u);
  const detail::dcp::DcpMath dm(dcp, bs);  // shifts when W, I and the block size are powers of two
  // Pointers into the scratch taken once (a thread_local's address is a call in a shared library).
  int32_t* lens = nullptr;
  int32_t* mine = nullptr;
  uint8_t* pre = nullptr;
  bool any_fresh = false;  // a request whose seq_len is its query length (nothing of it computed yet)
  if (use_dcp) {
    check_room(buf.dcp_block_lens.size(), b, "buffers.dcp_block_lens");
    if (in.is_prefilling.empty()) check_room(buf.dcp_is_prefilling.size(), b, "buffers.dcp_is_prefilling");
    if (dcp_lens.size() < b) dcp_lens.resize(b), dcp_pre.resize(b), dcp_mine.resize(b);
    lens = dcp_lens.data();
    mine = dcp_mine.data();
    pre = dcp_pre.data();
    // One pass: rank 0's and this rank's local lengths, and the "still prefilling" flag the DCP split
    // reads when no flags are given (qsl's size was checked; its order is the scan's below). The shard in
    // locals (and in dm): the stores below are int32 like in.dcp's fields, so the compiler would reload
    // those after each one.
    const int32_t W = dcp.world, I = dcp.interleave, rank = dcp.rank;
    for (std::size_t r = 0; r < b; ++r) {
      // Negative lengths are named by the scan below; 0 blocks meanwhile.
      const int32_t len = std::max(seqs[r], 0);
      if (dm.pow2) {
        // W, I and the block size powers of two (the usual shard): shifts (detail::dcp::DcpMath).
        lens[r] = dm.local_len(static_cast<uint32_t>(len), 0);
        mine[r] = dm.local_len(static_cast<uint32_t>(len), dm.rank);
      } else if (fast_dcp) {
        // docs/design/cp.md §11.7: both local lengths from one multiply-high division per request
        // (the shard was checked above).
        const detail::dcp::LocalLens l = detail::dcp::local_lens_fast(len, fd_wi, W, I, rank);
        lens[r] = static_cast<int32_t>(l.first);
        mine[r] = static_cast<int32_t>(l.mine);
      } else {
        lens[r] = static_cast<int32_t>(dcp_local_len(len, W, I, 0));
      }
      const bool fresh = seqs[r] == qsl[r + 1] - qsl[r];
      pre[r] = fresh;
      any_fresh |= fresh;
    }
  }
  // The per-request rules, the inputs of the state rule (docs/design/gqa.md §2.1), the
  // maxima and the block ids each request reads, in one branch-free pass (the
  // offender is named only on failure); the last needed block id of the first
  // rows is stashed for the decode slots.
  int32_t last_ids[detail::kStashRows];
  const detail::RequestScan scan =
      detail::scan_requests(qsl, seqs, b, has_spec ? in.num_spec_tokens.data() : nullptr, table, in_stride, bs,
                            in.num_blocks, in.rope_positions, last_ids,
                            lens);
  const std::size_t num_last = scan.num_last;
  const bool all_fresh = scan.all_fresh, all_sched_one = scan.all_sched_one, all_valid_one = scan.all_valid_one;
  const int32_t max_q = scan.max_query_len, max_seq = scan.max_seq_len;
  plan.state = detail::resolve_state(in.attn_state, b == 0, all_fresh, all_sched_one, all_valid_one, in.spec_method,
                                     in.chunked_prefill_enabled, qsl, in.seq_lens);
  SplitInputs split_in;
  split_in.query_start_loc = qsl;
  split_in.num_actual_tokens = t_real;
  split_in.max_query_len = max_q;
  split_in.decode_threshold = in.decode_threshold;
  // MLA: short extends are decodes without DCP, prefills while still
  // prefilling under DCP (docs/design/mla.md §3.3); the P/D recompute scheduler keeps
  // the "decodes" rule under DCP too (docs/design/cp.md §3.2).
  const bool dcp_split = use_dcp && !in.pd_recompute_scheduler;
  split_in.treat_short_extends_as_decodes = !dcp_split;
  if (dcp_split) {
    // No flags given: a request is still prefilling when nothing of it is computed (the pass above).
    split_in.is_prefilling = in.is_prefilling.empty() ? CSpan<uint8_t>(pre, b) : in.is_prefilling;
  }
  if (dcp_split && in.is_prefilling.empty() && !any_fresh && b > 0 && max_q <= in.decode_threshold) {
    // The DCP split without a fresh request and every query within the threshold: no request is a
    // prefill, so all are decodes (the split's step 10; qsl was validated by the scan).
    plan.split = SplitResult{static_cast<int32_t>(b), 0, t_real, 0};
  } else {
    plan.split = split_decodes_and_prefills(split_in);
  }
  const std::size_t nd = static_cast<std::size_t>(plan.split.num_decodes);
  const std::size_t np = static_cast<std::size_t>(plan.split.num_prefills);

  int32_t nwc = 0, max_ctx = 0;
  for (std::size_t r = nd; r < b; ++r) {
    const int32_t q = qsl[r + 1] - qsl[r], ctx = in.seq_lens[r] - q;
    AAR_CHECK_ARG(ctx == 0 || in.chunked_prefill_enabled, "request ", r, " has ", ctx,
                  " cached context tokens but chunked_prefill_enabled is false (its context would be ignored)");
    if (ctx > 0) ++nwc;
    max_ctx = std::max(max_ctx, ctx);
    plan.prefill_max_query_len = std::max(plan.prefill_max_query_len, q);
    plan.prefill_max_seq_len = std::max(plan.prefill_max_seq_len, in.seq_lens[r]);
  }
  // Under DCP the chunk is a multiple of B * W (see mla_plan.h), so every
  // rank's local chunk start is a block multiple.
  // (fuzz_mla_dcp_step: bs * W overflowed int32 for a huge block size.)
  const int64_t chunk_align = int64_t{bs} * (use_dcp ? dcp.world : 1);
  AAR_CHECK_ARG(chunk_align <= INT32_MAX, "dcp: block_size=", bs, " times the DCP world size ", dcp.world,
                " exceeds int32 (the context-chunk alignment)");
  plan.chunks = chunk_geometry(nwc, max_ctx, in.workspace_tokens, static_cast<int32_t>(chunk_align), in.max_chunks);
  if (plan.chunks.num_chunks > 0) {
    check_chunk_capacity(np, in.max_chunks, buf.chunks);
    check_chunk_totals(np, [&](std::size_t i) { return seqs[nd + i] - (qsl[nd + i + 1] - qsl[nd + i]); }, plan.chunks);
  }
  if (use_dcp && plan.chunks.num_chunks > 0) {
    const std::size_t cap = static_cast<std::size_t>(in.max_chunks);
    int64_t total_ctx = 0;
    for (std::size_t r = nd; r < b; ++r) total_ctx += in.seq_lens[r] - (qsl[r + 1] - qsl[r]);
    check_room(buf.chunks.padded_chunk_seq_lens.size(), cap * np, "chunks.padded_chunk_seq_lens");
    check_room(buf.chunks.local_seq_tot.size(), cap, "chunks.local_seq_tot");
    check_room(buf.chunks.reorg_offsets.size(), cap + 1, "chunks.reorg_offsets");
    check_room(buf.chunks.reorg_index.size(), static_cast<std::size_t>(total_ctx), "chunks.reorg_index");
  }
  // docs/design/mla.md §3.5 graph padding of a decode-only step (enable-pad or disable-pad mode).
  const int32_t td = plan.split.num_decode_tokens;
  // Enable-pad pads tokens (t_in > tokens); disable-pad pads rows (t_in > requests),
  // as upstream pads whenever graph_pad_size > num_reqs.
  const bool decode_only = np == 0 && nd > 0;
  AAR_CHECK_ARG(!in.pad_only_decode_buckets || decode_only || t_in == t_real, "num_input_tokens=", t_in,
                ": only a decode-only step is padded to a graph bucket here (this one has ", np,
                " prefills; give 0 or query_start_loc[-1]=", t_real, ")");
  const bool interp = in.pad_decode_batch && in.pad_interpolated && decode_only && static_cast<std::size_t>(t_in) > nd;
  const bool pad = interp || (in.pad_decode_batch && !in.pad_interpolated && decode_only && t_in > t_real);
  const int32_t dlen = in.decode_threshold;
  std::size_t num_dummies = 0;
  if (interp) {
    num_dummies = static_cast<std::size_t>(t_in) - nd;
  } else if (pad) {
    AAR_CHECK_ARG((t_in - t_real) % dlen == 0, "graph decode padding: num_input_tokens=", t_in, " pads ",
                  t_real, " decode tokens by ", t_in - t_real, ", not a multiple of the decode length ", dlen,
                  " (1 + num_speculative_tokens)");
    num_dummies = static_cast<std::size_t>((t_in - t_real) / dlen);
  }
  if (pad) {
    const std::size_t room = std::min(buf.q_ends.size(), buf.block_table.size() / std::max<std::size_t>(stride, 1));
    AAR_CHECK_ARG(nd + num_dummies <= room, "graph decode padding: ", nd, " decodes + ", num_dummies,
                  " dummy requests (num_input_tokens=", t_in, ") exceed the room for ", room, " requests");
  }
  const std::size_t b_dec = nd + num_dummies;
  plan.decode_kernel_reqs = static_cast<int32_t>(b_dec);
  plan.decode_kernel_tokens = pad ? t_in : td;
  // DCP with multi-token decodes: one decode row per token (the padding, if
  // any, as rows of KV length 0), see mla_plan.h.
  const bool token_rows = use_dcp && in.decode_threshold > 1 && nd > 0;
  if (token_rows) {
    const std::size_t rows = static_cast<std::size_t>(plan.decode_kernel_tokens);
    check_room(buf.dcp_decode_block_table.size(), rows * stride, "buffers.dcp_decode_block_table");
    check_room(buf.dcp_decode_q_ends.size(), rows, "buffers.dcp_decode_q_ends");
    check_room(buf.dcp_decode_kv_lens.size(), rows, "buffers.dcp_decode_kv_lens");
    plan.decode_kernel_reqs = plan.decode_kernel_tokens;
    plan.dcp_token_rows = true;
  }
  check_room(buf.query_start_loc.size(), b + 1, "buffers.query_start_loc");
  check_room(buf.block_table.size(), (b + num_dummies) * stride, "buffers.block_table");
  check_room(buf.q_ends.size(), b + num_dummies, "buffers.q_ends");
  check_room(buf.kv_lens.size(), b + num_dummies, "buffers.kv_lens");
  check_room(buf.slot_mapping.size(), static_cast<std::size_t>(t_in), "buffers.slot_mapping");
  check_room(buf.decode_positions.size(), static_cast<std::size_t>(plan.decode_kernel_tokens),
             "buffers.decode_positions");
  check_room(buf.prefill_positions.size(), static_cast<std::size_t>(plan.split.num_prefill_tokens),
             "buffers.prefill_positions");
  check_room(buf.prefill_block_table.size(), np * stride, "buffers.prefill_block_table");
  check_room(buf.prefill_q_ends.size(), np, "buffers.prefill_q_ends");

  // ---------------------------------------------------------------- write
  std::copy(qsl.begin(), qsl.end(), buf.query_start_loc.begin());
  if (use_dcp) {
    std::copy(lens, lens + b, buf.dcp_block_lens.begin());
    if (in.is_prefilling.empty()) {
      // The derived flags (all false under the P/D recompute scheduler, whose split reads none).
      if (dcp_split) {
        std::copy(pre, pre + b, buf.dcp_is_prefilling.begin());
      } else {
        std::fill(buf.dcp_is_prefilling.begin(), buf.dcp_is_prefilling.begin() + b, uint8_t{0});
      }
    }
  }
  if (!zero_copy) detail::copy_block_table_rows(table, b, in_stride, buf.block_table.data(), stride);
  int64_t* slots = buf.slot_mapping.data();
  int64_t* q_ends = buf.q_ends.data();
  int64_t* kv_lens = buf.kv_lens.data();
  int32_t* dpos = buf.decode_positions.data();
  for (std::size_t r = 0; r < b; ++r) {
    q_ends[r] = qsl[r + 1];
    kv_lens[r] = seqs[r];
  }
  if (fast_dcp) {
    // The loop below with the divisions by W * I, I and the block size as multiply-highs, this
    // rank's local lengths from the scan's pass (docs/design/cp.md §11.7).
    const int32_t pbase = qsl[nd];
    int32_t* ppos = buf.prefill_positions.data();
    const detail::dcp::FastDiv fd_i(static_cast<uint32_t>(dcp.interleave)), fd_bs(static_cast<uint32_t>(bs));
    const uint32_t I = static_cast<uint32_t>(dcp.interleave), wi = static_cast<uint32_t>(dcp_wi);
    const uint32_t rank = static_cast<uint32_t>(dcp.rank), ubs = static_cast<uint32_t>(bs);
    if (all_sched_one && nd == b) {
      // The steady decode step: request r is token r at position seq_len - 1.
      int32_t mx = 0;
      for (std::size_t r = 0; r < b; ++r) {
        const uint32_t p = static_cast<uint32_t>(seqs[r] - 1);
        dpos[r] = static_cast<int32_t>(p);
        if (dm.pow2) {
          slots[r] = dm.local_slot(p, table + r * in_stride);  // shifts and masks
        } else {
          const uint32_t q = fd_wi.div(p), rm = p - q * wi;
          const uint32_t o = fd_i.div(rm);
          const uint32_t li = q * I + (rm - o * I);
          const uint32_t blk = fd_bs.div(li);
          slots[r] = o == rank ? static_cast<int64_t>(table[r * in_stride + blk]) * bs + (li - blk * ubs)
                               : int64_t{kPadSlot};
        }
        kv_lens[r] = mine[r];
        mx = std::max(mx, mine[r]);
      }
      plan.decode_max_seq_len = mx;
    }
    for (std::size_t r = 0; r < b && !(all_sched_one && nd == b); ++r) {
      const int32_t begin = qsl[r], end = qsl[r + 1];
      const int32_t pos0 = seqs[r] - (end - begin);
      int32_t* pos = r < nd ? dpos + begin : ppos + (begin - pbase);
      const int32_t* row = table + r * in_stride;
      for (int32_t t = begin; t < end; ++t) {
        const uint32_t p = static_cast<uint32_t>(pos0 + (t - begin));
        pos[t - begin] = static_cast<int32_t>(p);
        const uint32_t q = fd_wi.div(p), rm = p - q * wi;  // p = q W I + rm
        const uint32_t o = fd_i.div(rm);                   // the owner
        const uint32_t li = q * I + (rm - o * I);          // the local index
        const uint32_t blk = fd_bs.div(li);
        slots[t] = o == rank ? static_cast<int64_t>(row[blk]) * bs + (li - blk * ubs) : int64_t{kPadSlot};
      }
      kv_lens[r] = mine[r];
      if (r < nd) plan.decode_max_seq_len = std::max<int32_t>(plan.decode_max_seq_len, mine[r]);
      if (r >= nd) buf.prefill_q_ends[r - nd] = end - pbase;
    }
  } else if (use_dcp) {
    // Local slots (docs/design/cp.md §2.1): the owner writes the token at its local
    // index through the shared block table; every other rank gets -1.
    const int32_t pbase = qsl[nd];
    int32_t* ppos = buf.prefill_positions.data();
    const int64_t wi = int64_t{dcp.world} * dcp.interleave;
    for (std::size_t r = 0; r < b; ++r) {
      const int32_t begin = qsl[r], end = qsl[r + 1];
      const int32_t pos0 = seqs[r] - (end - begin);
      int32_t* pos = r < nd ? dpos + begin : ppos + (begin - pbase);
      const int32_t* row = table + r * in_stride;
      for (int32_t t = begin; t < end; ++t) {
        const int32_t p = pos0 + (t - begin);
        pos[t - begin] = p;
        const bool mine = (p / dcp.interleave) % dcp.world == dcp.rank;
        const int64_t li = (p / wi) * dcp.interleave + p % dcp.interleave;
        slots[t] = mine ? static_cast<int64_t>(row[li / bs]) * bs + li % bs : int64_t{kPadSlot};
      }
      kv_lens[r] = dcp_local_len(seqs[r], dcp.world, dcp.interleave, dcp.rank);
      if (r < nd) plan.decode_max_seq_len = std::max<int32_t>(plan.decode_max_seq_len, static_cast<int32_t>(kv_lens[r]));
      if (r >= nd) buf.prefill_q_ends[r - nd] = end - pbase;
    }
  } else if (all_sched_one && b > 0) {
    // Decode-only, one token per request (the steady state): every request is
    // a decode.
    detail::write_one_token_slots(seqs, b, table, in_stride, bs, last_ids, num_last, slots, dpos);
    plan.decode_max_seq_len = max_seq;
  } else {
    const int32_t pbase = qsl[nd];
    int32_t* ppos = buf.prefill_positions.data();
    detail::write_token_slots(qsl, seqs, b, table, in_stride, bs, slots, [&](std::size_t r) {
      return r < nd ? dpos + qsl[r] : ppos + (qsl[r] - pbase);
    });
    for (std::size_t r = 0; r < nd; ++r) plan.decode_max_seq_len = std::max(plan.decode_max_seq_len, seqs[r]);
    for (std::size_t r = nd; r < b; ++r) buf.prefill_q_ends[r - nd] = qsl[r + 1] - pbase;
  }
  std::fill(slots + t_real, slots + t_in, int64_t{kPadSlot});
  if (pad) {
    // b == nd here (decode-only): the dummies follow the real requests.
    if (interp) {
      pad_actual_q_disable_mode(CSpan<int64_t>(q_ends, b), static_cast<int32_t>(b), t_in,
                                Span<int64_t>(q_ends, b + num_dummies));
    } else {
      for (std::size_t i = 0; i < num_dummies; ++i) q_ends[b + i] = t_real + static_cast<int64_t>(i + 1) * dlen;
    }
    std::fill(kv_lens + b, kv_lens + b + num_dummies, int64_t{0});
    std::fill(buf.block_table.data() + b * stride, buf.block_table.data() + (b + num_dummies) * stride, 0);
    std::fill(dpos + td, dpos + t_in, 0);
  }
  if (token_rows) {
    write_dcp_decode_rows(qsl, in.seq_lens, static_cast<int32_t>(nd), in.block_table, in.block_table_stride, dcp,
                          plan.decode_kernel_tokens, buf.dcp_decode_q_ends, buf.dcp_decode_kv_lens,
                          buf.dcp_decode_block_table, static_cast<int32_t>(stride));
  }
  if (np > 0) {
    const int32_t* rows = buf.block_table.data() + nd * stride;
    std::copy(rows, rows + np * stride, buf.prefill_block_table.data());
    if (plan.chunks.num_chunks > 0) {
      auto ctx = [&](std::size_t i) { return seqs[nd + i] - (qsl[nd + i + 1] - qsl[nd + i]); };
      write_chunks(np, ctx, plan.chunks, buf.chunks);
      if (use_dcp) {
        plan.local_chunk_size = plan.chunks.chunk_size / dcp.world;
        write_dcp_chunks(np, ctx, plan.chunks, dcp, buf.chunks);
      }
    }
  }
  plan.num_reqs = static_cast<int32_t>(b);
  plan.num_kernel_reqs = static_cast<int32_t>(b + num_dummies);
  plan.num_actual_tokens = t_real;
  plan.num_input_tokens = t_in;
  plan.max_query_len = max_q;
  plan.max_seq_len = max_seq;
  return plan;
}

namespace {

// interp's ends must be exact in a double (and b - a fit int64): token counts are far below
// 2^52 (fuzz_mla_pad: b - a overflowed int64, and a double past 2^63 has no int64 value). The
// padding modes check their ends with it before their first write. `what` names the value.
template <class... What>
void check_interp_end(int64_t v, const What&... what) {
  constexpr int64_t kExact = int64_t{1} << 52;
  AAR_CHECK_ARG(v >= -kExact && v <= kExact, what..., v, " is outside [-2^52, 2^52]");
}

}  // namespace

void interp_round_half_even(int64_t a, int64_t b, int32_t n, Span<int64_t> out) {
  AAR_CHECK_ARG(n >= 0, "interp: step count must be non-negative, got ", n);
  AAR_CHECK_ARG(out.size() >= static_cast<std::size_t>(n), "interp: output has room for ", out.size(),
                " values, needs ", n);
  check_interp_end(a, "interp: start ");
  check_interp_end(b, "interp: end ");
  for (int32_t i = 1; i <= n; ++i) {
    // numpy linspace: a + i*step, with the endpoint set exactly to b.
    const double v = i == n ? static_cast<double>(b)
                            : static_cast<double>(a) + i * (static_cast<double>(b - a) / n);
    out[i - 1] = static_cast<int64_t>(std::nearbyint(v));  // default rounding mode: half to even
  }
}

// Both padding modes validate everything before their first write (fuzz_mla_pad: they copied
// actual_q into out and then rejected graph_pad_size / ref).
int32_t pad_actual_q_disable_mode(CSpan<int64_t> actual_q, int32_t num_reqs, int32_t graph_pad_size,
                                  Span<int64_t> out) {
  AAR_CHECK_ARG(!actual_q.empty(), "actual_q must not be empty");
  AAR_CHECK_ARG(num_reqs >= 0, "num_reqs must be non-negative, got ", num_reqs);
  const int64_t pad64 = std::max<int64_t>(0, int64_t{graph_pad_size} - num_reqs);
  const int32_t pad = static_cast<int32_t>(pad64);  // <= graph_pad_size
  const std::size_t n = actual_q.size();
  AAR_CHECK_ARG(out.size() >= n && out.size() - n >= static_cast<std::size_t>(pad), "output has room for ",
                out.size(), " values, needs ", n + static_cast<std::size_t>(pad));
  if (pad > 0) {
    AAR_CHECK_ARG(actual_q.back() <= graph_pad_size, "actual_q.back()=", actual_q.back(),
                  " exceeds graph_pad_size=", graph_pad_size);
    check_interp_end(actual_q.back(), "actual_q.back()=");  // the end, graph_pad_size, is an int32
  }
  for (std::size_t i = 0; i < n; ++i) out[i] = actual_q[i];
  if (pad > 0) {
    interp_round_half_even(actual_q.back(), static_cast<int64_t>(num_reqs) + pad, pad, out.subspan(n, pad));
  }
  return static_cast<int32_t>(n + pad);
}

int32_t pad_actual_q_enable_mode(CSpan<int64_t> actual_q, int32_t num_reqs, int32_t req_pad, CSpan<int64_t> ref,
                                 Span<int64_t> out) {
  AAR_CHECK_ARG(!actual_q.empty(), "actual_q must not be empty");
  AAR_CHECK_ARG(req_pad >= 0, "req_pad must be non-negative, got ", req_pad);
  AAR_CHECK_ARG(num_reqs >= 0, "num_reqs must be non-negative, got ", num_reqs);
  const std::size_t n = actual_q.size();
  AAR_CHECK_ARG(out.size() >= n && out.size() - n >= static_cast<std::size_t>(req_pad), "output has room for ",
                out.size(), " values, needs ", n + static_cast<std::size_t>(req_pad));
  const std::size_t nr = static_cast<std::size_t>(num_reqs);
  const int64_t last = actual_q.back();
  // ref[nr] - last > 16, without the int64 overflow of the subtraction.
  const bool interp = req_pad != 0 && ref.size() > nr && ref[nr] > last &&
                      static_cast<uint64_t>(ref[nr]) - static_cast<uint64_t>(last) > 16u;
  if (req_pad != 0) {
    AAR_CHECK_ARG(ref.size() >= nr + static_cast<std::size_t>(req_pad), "ref (actual_seq_lengths_q) has ",
                  ref.size(), " entries, needs ", nr + static_cast<std::size_t>(req_pad), " (num_reqs + req_pad)");
  }
  if (interp) {
    check_interp_end(last, "actual_q.back()=");
    check_interp_end(ref[nr + req_pad - 1], "ref[", nr + req_pad - 1, "]=");
  }
  for (std::size_t i = 0; i < n; ++i) out[i] = actual_q[i];
  if (req_pad == 0) return static_cast<int32_t>(n);
  if (interp) {
    interp_round_half_even(last, ref[nr + req_pad - 1], req_pad, out.subspan(n, req_pad));
  } else {
    for (int32_t i = 0; i < req_pad; ++i) out[n + i] = ref[nr + i];
  }
  return static_cast<int32_t>(n + req_pad);
}

int64_t next_power_of_two(int64_t n) {
  AAR_CHECK_ARG(n >= 1 && n <= (int64_t{1} << 30), "next_power_of_two: n must be in [1, 2^30], got ", n);
  int64_t p = 1;
  while (p < n) p <<= 1;
  return p;
}

}  // namespace aar::plan
