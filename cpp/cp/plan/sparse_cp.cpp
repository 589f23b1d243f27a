// The sparse families' CP planning (docs/design/sparse_cp.md §2, §3, §4): the replicated indexer
// views of SFA DCP, the top-k remap to a DCP rank's local positions, and the DSA-CP token shard.
// Each function checks all of its input first (the same checks on every rank), then writes in
// plain loops that cannot fail.
#include "ascend_attn_rt/cp/plan/sparse_cp.h"

#include <algorithm>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <functional>

#include "ascend_attn_rt/cp/plan/cp_groups.h"
#include "ascend_attn_rt/errors.h"
#include "ascend_attn_rt/plan/seq_lens.h"
#include "ascend_attn_rt/plan/slot_mapping.h"
#include "dcp_internal.h"

namespace aar::plan {

void dcp_replicated_block_table(const DcpReplicatedInputs& in, Span<int32_t> out, int32_t out_stride) {
  // The world bound keeps the replicated ids (local id * W + rank) inside the cache the
  // indexer allocates, num_blocks * W blocks, and matches the KV shards of the rest of DCP.
  AAR_CHECK_ARG(in.world >= 1 && in.world <= kMaxCpMergePartitions, "world=", in.world, " is out of range [1, ",
                kMaxCpMergePartitions, "] (the DCP group's ranks, cp_groups.h)");
  AAR_CHECK_ARG(in.block_size > 0, "block_size=", in.block_size, " must be positive");
  AAR_CHECK_ARG(in.num_blocks >= 0, "num_blocks=", in.num_blocks, " is negative");
  const int64_t w = in.world;
  AAR_CHECK_ARG(static_cast<int64_t>(in.num_blocks) * w <= INT32_MAX, "num_blocks*world = ", in.num_blocks, "*", w,
                " replicated blocks do not fit int32 block ids");
  AAR_CHECK_ARG(in.block_table_stride >= 0, "block_table_stride=", in.block_table_stride, " is negative");
  const std::size_t rows = in.seq_lens.size();
  const std::size_t stride = static_cast<std::size_t>(in.block_table_stride);
  AAR_CHECK_ARG(in.block_table.size() >= rows * stride, "block_table has ", in.block_table.size(),
                " entries, expected ", rows, " x ", in.block_table_stride);
  AAR_CHECK_ARG(static_cast<int64_t>(out_stride) >= static_cast<int64_t>(in.block_table_stride) * w, "out_stride=",
                out_stride, " is smaller than block_table_stride*world = ", in.block_table_stride, "*", w);
  const std::size_t os = static_cast<std::size_t>(out_stride);
  AAR_CHECK_ARG(out.size() >= rows * os, "out has room for ", out.size(), " entries, needs rows*out_stride = ", rows,
                "*", out_stride, " = ", rows * os);
  const int64_t bs = in.block_size;
  for (std::size_t b = 0; b < rows; ++b) {
    const int32_t seq = in.seq_lens[b];
    AAR_CHECK_ARG(seq >= 0, "seq_lens[", b, "]=", seq, " is negative");
    const int64_t cols = (seq + bs - 1) / bs;
    if (cols == 0) continue;
    // Replicated columns [0, cols) read local columns [0, last_local].
    const int64_t last_local = (cols - 1) / w;
    AAR_CHECK_ARG(last_local < in.block_table_stride, "seq_lens[", b, "]=", seq, " needs ", cols,
                  " replicated columns, local column ", last_local, " of the block table, but block_table_stride=",
                  in.block_table_stride, " (block_size=", in.block_size, ", world=", in.world, ")");
    const int32_t* row = in.block_table.data() + b * stride;
    for (int64_t c = 0; c <= last_local; ++c) {
      AAR_CHECK_ARG(row[c] >= 0 && row[c] < in.num_blocks, "block_table[", b, "][", c, "]=", row[c],
                    " is out of range [0, num_blocks=", in.num_blocks, ")");
    }
  }

  for (std::size_t b = 0; b < rows; ++b) {
    const int64_t cols = (in.seq_lens[b] + bs - 1) / bs;
    const int32_t* row = in.block_table.data() + b * stride;
    int32_t* dst = out.data() + b * os;
    // Column j = c * W + k is local column c's replicated block k (no division per entry).
    int64_t j = 0;
    for (int64_t c = 0; j < cols; ++c) {
      const int32_t base = static_cast<int32_t>(row[c] * w);
      for (int64_t k = 0; k < w && j < cols; ++k, ++j) dst[j] = base + static_cast<int32_t>(k);
    }
    std::fill(dst + cols, dst + os, 0);
  }
}

void dcp_replicated_slot_mapping(CSpan<int32_t> query_start_loc, CSpan<int32_t> seq_lens, CSpan<int32_t> rep,
                                 int32_t rep_stride, int32_t block_size, Span<int64_t> out) {
  AAR_CHECK_ARG(block_size > 0, "block_size=", block_size, " must be positive");
  AAR_CHECK_ARG(rep_stride >= 0, "rep_stride=", rep_stride, " is negative");
  const std::size_t n = seq_lens.size();
  AAR_CHECK_ARG(query_start_loc.size() == n + 1, "query_start_loc has ", query_start_loc.size(),
                " entries, expected seq_lens.size()+1 = ", n + 1);
  validate_start_loc(query_start_loc, "query_start_loc");
  const std::size_t stride = static_cast<std::size_t>(rep_stride);
  AAR_CHECK_ARG(rep.size() >= n * stride, "rep has ", rep.size(), " entries, expected ", n, " x ", rep_stride);
  const int32_t total = query_start_loc[n];
  AAR_CHECK_ARG(out.size() >= static_cast<std::size_t>(total), "out has room for ", out.size(),
                " entries, needs query_start_loc[B]=", total);
  for (std::size_t b = 0; b < n; ++b) {
    const int32_t q = query_start_loc[b + 1] - query_start_loc[b];
    const int32_t seq = seq_lens[b];
    AAR_CHECK_ARG(seq >= q, "seq_lens[", b, "]=", seq, " is smaller than its query length ", q);
    if (q == 0) continue;
    const int64_t first = (seq - q) / block_size, last = (seq - 1) / block_size;
    AAR_CHECK_ARG(last < rep_stride, "seq_lens[", b, "]=", seq, " needs replicated column ", last,
                  " but rep_stride=", rep_stride, " (block_size=", block_size, ")");
    const int32_t* row = rep.data() + b * stride;
    for (int64_t c = first; c <= last; ++c) {
      AAR_CHECK_ARG(row[c] >= 0, "rep[", b, "][", c, "]=", row[c], " is negative");
    }
  }

  const int64_t bs = block_size;
  for (std::size_t b = 0; b < n; ++b) {
    const int32_t begin = query_start_loc[b], end = query_start_loc[b + 1];
    const int32_t* row = rep.data() + b * stride;
    const int32_t pos0 = seq_lens[b] - (end - begin);
    if ((bs & (bs - 1)) == 0) {
      const int sh = 63 - __builtin_clzll(static_cast<uint64_t>(bs));
      uint32_t pos = static_cast<uint32_t>(pos0);
      for (int32_t t = begin; t < end; ++t, ++pos) {
        out[t] = (static_cast<int64_t>(row[pos >> sh]) << sh) + (pos & static_cast<uint32_t>(bs - 1));
      }
    } else {
      int64_t pos = pos0;
      for (int32_t t = begin; t < end; ++t, ++pos) out[t] = row[pos / bs] * bs + pos % bs;
    }
  }
  std::fill(out.begin() + total, out.end(), int64_t{kPadSlot});
}

void remap_sparse_indices(CSpan<int32_t> topk, int32_t K, const DcpShard& shard, Span<int32_t> out) {
  AAR_CHECK_ARG(K > 0, "K=", K, " must be positive");
  const std::size_t k = static_cast<std::size_t>(K), n = topk.size();
  AAR_CHECK_ARG(n % k == 0, "topk has ", n, " entries, not a multiple of K=", K);
  detail::dcp::check_shard(shard);
  AAR_CHECK_ARG(out.size() >= n, "out has room for ", out.size(), " entries, needs topk.size()=", n);
  // The compaction writes a row's slot w only after reading its slots <= w, so out == topk works;
  // any other overlap would overwrite entries not read yet.
  const int32_t* src = topk.data();
  int32_t* dst = out.data();
  const std::less<const int32_t*> before;
  const bool overlaps = n > 0 && before(dst, src + n) && before(src, dst + n);
  AAR_CHECK_ARG(dst == src || !overlaps, "out overlaps topk without starting at it (in place needs out.data() == "
                "topk.data())");

  const int64_t w = shard.world, il = shard.interleave, rank = shard.rank;
  for (std::size_t r = 0; r < n; r += k) {
    std::size_t kept = r;
    for (std::size_t j = r; j < r + k; ++j) {
      const int32_t x = src[j];
      if (x >= 0 && detail::dcp::owner(x, w, il) == rank) {
        dst[kept++] = static_cast<int32_t>(detail::dcp::local_index(x, w, il));
      }
    }
    std::fill(dst + kept, dst + r + k, -1);
  }
}

TokenShard plan_token_shard(const TokenShardInputs& in, const TokenShardBuffers& buf) {
  AAR_CHECK_ARG(in.world >= 1, "world=", in.world, " must be >= 1");
  AAR_CHECK_ARG(in.rank >= 0 && in.rank < in.world, "rank=", in.rank, " is out of range [0, world=", in.world, ")");
  const std::size_t n = in.seq_lens.size();
  AAR_CHECK_ARG(in.query_start_loc.size() == n + 1, "query_start_loc has ", in.query_start_loc.size(),
                " entries, expected seq_lens.size()+1 = ", n + 1);
  validate_start_loc(in.query_start_loc, "query_start_loc");
  // seq_lens below a request's query length are accepted: graph padding requests carry tokens
  // and no KV (docs/design/sparse_cp.md §4); the max(., 0) of the local length covers them.
  // (A branch-free minimum first, which vectorises; the offender is named only on failure.)
  int32_t min_seq = 0;
  for (std::size_t b = 0; b < n; ++b) min_seq = std::min(min_seq, in.seq_lens[b]);
  if (min_seq < 0) detail::dcp::check_lens_nonneg(in.seq_lens, "seq_lens");
  const int32_t total = in.query_start_loc[n];
  AAR_CHECK_ARG(in.num_input_tokens >= total, "num_input_tokens=", in.num_input_tokens,
                " is smaller than query_start_loc[B]=", total);
  const int64_t w = in.world;
  const int64_t pad = (static_cast<int64_t>(in.num_input_tokens) + w - 1) / w * w;
  AAR_CHECK_ARG(pad <= INT32_MAX, "num_input_tokens=", in.num_input_tokens, " rounded up to a multiple of world=", w,
                " is ", pad, ", beyond int32");
  const int64_t tpr = pad / w;
  AAR_CHECK_ARG(buf.local_cum_query_lens.size() >= n, "local_cum_query_lens has room for ",
                buf.local_cum_query_lens.size(), " entries, needs B=", n);
  AAR_CHECK_ARG(buf.local_seq_lens.size() >= n, "local_seq_lens has room for ", buf.local_seq_lens.size(),
                " entries, needs B=", n);
  const bool slots = !buf.local_slot_mapping.empty();
  if (slots) {
    AAR_CHECK_ARG(buf.local_slot_mapping.size() >= static_cast<std::size_t>(tpr), "local_slot_mapping has room for ",
                  buf.local_slot_mapping.size(), " entries, needs tokens_per_rank=", tpr);
    AAR_CHECK_ARG(buf.slot_mapping.size() >= static_cast<std::size_t>(total), "slot_mapping has ",
                  buf.slot_mapping.size(), " entries, fewer than query_start_loc[B]=", total);
  }

  TokenShard s;
  s.num_actual_tokens = total;
  s.num_tokens_pad = static_cast<int32_t>(pad);
  s.tokens_per_rank = static_cast<int32_t>(tpr);
  const int64_t start = in.rank * tpr, end_pad = start + tpr;
  s.local_start = static_cast<int32_t>(start);
  s.local_end_with_pad = static_cast<int32_t>(end_pad);
  // A rank whose whole range is padding ends where it starts (upstream's min would end it before).
  s.local_end = static_cast<int32_t>(std::max(start, std::min<int64_t>(end_pad, total)));
  s.num_local_tokens = s.local_end - s.local_start;

  // The requests partition [0, qsl[B]) in order (qsl[0] = 0, non-decreasing), so the local tokens of
  // requests 0..b are those of [0, qsl[b + 1]) in [start, end_pad): the cumulative end is
  // clamp(qsl[b + 1] - start, 0, tpr), without a running sum. Every term fits int32 (qsl and end_pad do,
  // checked above): a branch-free loop that vectorises.
  const int32_t* qsl = in.query_start_loc.data();
  const int32_t* seqs = in.seq_lens.data();
  int32_t* __restrict lcum = buf.local_cum_query_lens.data();
  int32_t* __restrict lseq = buf.local_seq_lens.data();
  const int32_t s32 = static_cast<int32_t>(start), e32 = static_cast<int32_t>(end_pad), t32 = static_cast<int32_t>(tpr);
  for (std::size_t b = 0; b < n; ++b) {
    const int32_t gs = qsl[b], ge = qsl[b + 1];
    const int32_t le = std::min(ge, e32), local = le - std::max(gs, s32);
    lcum[b] = std::min(std::max(ge - s32, 0), t32);
    // The last local query sees the request's keys but for its ge - le later queries.
    const int32_t seq = std::max(seqs[b] - (ge - le), 0);
    lseq[b] = local > 0 ? seq : 0;
  }
  if (slots) {
    const std::size_t have = buf.slot_mapping.size();
    for (int64_t i = 0; i < tpr; ++i) {
      const std::size_t g = static_cast<std::size_t>(start + i);
      buf.local_slot_mapping[static_cast<std::size_t>(i)] = g < have ? buf.slot_mapping[g] : int64_t{kPadSlot};
    }
  }
  return s;
}

// ---- §11 ----

namespace {

int32_t chunk_of(int32_t q, int32_t wp) { return (q + 2 * wp - 1) / (2 * wp); }

}  // namespace

SparsePcpSizes sparse_pcp_sizes(const SparsePcpInputs& in) {
  const std::size_t n = in.seq_lens.size();
  AAR_CHECK_ARG(in.query_start_loc.size() == n + 1, "query_start_loc has ", in.query_start_loc.size(),
                " entries, expected seq_lens.size()+1 = ", n + 1);
  validate_start_loc(in.query_start_loc, "query_start_loc");
  AAR_CHECK_ARG(in.pcp_size >= 1 && in.pcp_size <= kMaxCpMergePartitions, "pcp_size=", in.pcp_size,
                " must be in [1, ", kMaxCpMergePartitions, "]");
  AAR_CHECK_ARG(in.pcp_rank >= 0 && in.pcp_rank < in.pcp_size, "pcp_rank=", in.pcp_rank,
                " is out of range [0, pcp_size=", in.pcp_size, ")");
  AAR_CHECK_ARG(in.num_decodes >= 0 && static_cast<std::size_t>(in.num_decodes) <= n, "num_decodes=",
                in.num_decodes, " is out of range [0, num_reqs=", n, "]");
  SparsePcpSizes s;
  int64_t rows = 0, reqs = 0;
  for (std::size_t b = 0; b < n; ++b) {
    const int32_t q = in.query_start_loc[b + 1] - in.query_start_loc[b];
    AAR_CHECK_ARG(in.seq_lens[b] >= q, "seq_lens[", b, "]=", in.seq_lens[b], " is smaller than its query length ", q);
    if (b < static_cast<std::size_t>(in.num_decodes)) {
      rows += q;
      reqs += q > 0 ? 1 : 0;
      continue;
    }
    const int32_t c = chunk_of(q, in.pcp_size);
    rows += 2 * int64_t{c};
    for (const int32_t k : {in.pcp_rank, 2 * in.pcp_size - 1 - in.pcp_rank}) {
      const int64_t real = std::clamp<int64_t>(int64_t{q} - int64_t{k} * c, 0, c);
      reqs += (real > 0 ? 1 : 0) + (c - real > 0 ? 1 : 0);
    }
  }
  AAR_CHECK_ARG(rows * in.pcp_size <= INT32_MAX, "the step's local rows x pcp_size = ", rows * in.pcp_size,
                " exceed the int32 range");
  s.num_decode_tokens = in.query_start_loc[static_cast<std::size_t>(in.num_decodes)];
  s.local_tokens = static_cast<int32_t>(rows);
  s.indexer_reqs = static_cast<int32_t>(reqs);
  return s;
}

SparsePcpSizes plan_sparse_pcp_rows(const SparsePcpInputs& in, const SparsePcpBuffers& out) {
  const SparsePcpSizes s = sparse_pcp_sizes(in);
  const std::size_t n = in.seq_lens.size(), nd = static_cast<std::size_t>(in.num_decodes);
  const int64_t wp = in.pcp_size, tl = s.local_tokens, total = in.query_start_loc[n];
  auto room = [](std::size_t have, int64_t need, const char* name) {
    AAR_CHECK_ARG(have >= static_cast<uint64_t>(need), name, " has room for ", have, " entries, needs ", need);
  };
  room(out.local_token_index.size(), tl, "local_token_index");
  room(out.positions.size(), tl, "positions");
  room(out.gather_index.size(), total, "gather_index");
  room(out.gathered_cum_query_lens.size(), wp * static_cast<int64_t>(n), "gathered_cum_query_lens");
  room(out.indexer_cum_query_lens.size(), s.indexer_reqs, "indexer_cum_query_lens");
  room(out.indexer_seq_lens.size(), s.indexer_reqs, "indexer_seq_lens");
  room(out.indexer_req.size(), s.indexer_reqs, "indexer_req");

  const int32_t rp = in.pcp_rank, w = in.pcp_size;
  int32_t row = 0, ir = 0;
  auto add_req = [&](int32_t q, int32_t kv, std::size_t b) {
    out.indexer_cum_query_lens[ir] = (ir > 0 ? out.indexer_cum_query_lens[ir - 1] : 0) + q;
    out.indexer_seq_lens[ir] = kv;
    out.indexer_req[ir] = static_cast<int32_t>(b);
    ++ir;
  };
  for (std::size_t b = 0; b < n; ++b) {
    const int32_t start = in.query_start_loc[b], q = in.query_start_loc[b + 1] - start;
    const int32_t ctx = in.seq_lens[b] - q;
    if (b < nd) {
      for (int32_t i = 0; i < q; ++i, ++row) {
        out.local_token_index[row] = start + i;
        out.positions[row] = ctx + i;
        out.gather_index[start + i] = row;  // rank 0's copy
      }
      if (q > 0) add_req(q, in.seq_lens[b], b);
    } else {
      const int32_t c = chunk_of(q, w);
      // This rank's rows: the head chunk, then the tail chunk.
      for (const int32_t k : {rp, 2 * w - 1 - rp}) {
        const int32_t p0 = k * c, real = std::clamp(q - p0, 0, c);
        for (int32_t i = 0; i < c; ++i, ++row) {
          const int32_t p = p0 + i;
          out.local_token_index[row] = p < q ? start + p : -1;
          out.positions[row] = ctx + std::min(p, q - 1);
        }
        if (real > 0) add_req(real, ctx + p0 + real, b);
        if (c - real > 0) add_req(c - real, 0, b);
      }
    }
    for (int64_t j = 0; j < wp; ++j) out.gathered_cum_query_lens[j * n + b] = static_cast<int32_t>(j * tl + row);
  }
  // Every prefill token's row in the gathered buffer: its chunk k's rank j holds it, in j's head
  // (k < Wp) or tail part of the request's rows, which start at the same local row on every rank.
  int32_t base = s.num_decode_tokens;  // the request's first local row
  for (std::size_t b = nd; b < n; ++b) {
    const int32_t start = in.query_start_loc[b], q = in.query_start_loc[b + 1] - start, c = chunk_of(q, w);
    for (int32_t p = 0; p < q; ++p) {
      const int32_t k = p / c, j = k < w ? k : 2 * w - 1 - k;
      const int32_t local = base + (k < w ? 0 : c) + (p - k * c);
      out.gather_index[start + p] = static_cast<int32_t>(j * tl + local);
    }
    base += 2 * c;
  }
  return s;
}

DsaPcpPlan plan_dsa_pcp_step(const SparsePcpInputs& in, const DsaPcpBuffers& out) {
  const SparsePcpSizes s = sparse_pcp_sizes(in);
  const std::size_t ns = static_cast<std::size_t>(s.indexer_reqs);
  AAR_CHECK_ARG(out.sas_seq_lens.size() >= ns, "sas_seq_lens has room for ", out.sas_seq_lens.size(),
                " entries, needs ", ns);
  AAR_CHECK_ARG(out.sas_cu_seqlens_kv.size() >= ns + 1, "sas_cu_seqlens_kv has room for ",
                out.sas_cu_seqlens_kv.size(), " entries, needs ", ns + 1);
  // The segments' SAS lengths of a request sum to at most S_b (a decode) or 2 S_b + q_b (two real
  // chunks and their pads): bounded before anything is written.
  int64_t bound = 0;
  for (std::size_t b = 0; b < in.seq_lens.size(); ++b) {
    const int64_t q = in.query_start_loc[b + 1] - in.query_start_loc[b];
    bound += b < static_cast<std::size_t>(in.num_decodes) ? in.seq_lens[b] : 2 * int64_t{in.seq_lens[b]} + q;
  }
  AAR_CHECK_ARG(bound <= INT32_MAX, "seq_lens: the segments' KV lengths may sum to ", bound,
                ", past the int32 range of sas_cu_seqlens_kv");
  // Checks every other capacity before its first write.
  DsaPcpPlan p;
  p.sizes = plan_sparse_pcp_rows(in, out.rows);
  int64_t cu = 0;
  out.sas_cu_seqlens_kv[0] = 0;
  for (std::size_t i = 0; i < ns; ++i) {
    const int32_t n = out.rows.indexer_cum_query_lens[i] - (i > 0 ? out.rows.indexer_cum_query_lens[i - 1] : 0);
    const int32_t ikv = out.rows.indexer_seq_lens[i];
    // A pad segment (KV 0 for the indexer) reads its request's first n positions (n <= S_b).
    const int32_t kv = ikv > 0 ? ikv : n;
    out.sas_seq_lens[i] = kv;
    cu += kv;
    out.sas_cu_seqlens_kv[i + 1] = static_cast<int32_t>(cu);
    p.max_seqlen_q = std::max(p.max_seqlen_q, n);
    p.max_seqlen_kv = std::max(p.max_seqlen_kv, kv);
    p.max_indexer_seqlen_kv = std::max(p.max_indexer_seqlen_kv, ikv);
  }
  return p;
}

int64_t dsa_dcp_captured_cmp_width(int64_t rope_positions, int32_t ratio) {
  AAR_CHECK_ARG(rope_positions >= 1, "rope_positions=", rope_positions, " must be >= 1 (the RoPE table's rows)");
  AAR_CHECK_ARG(ratio >= 2, "ratio=", ratio, " must be >= 2 (a compressed layer's compress_ratio)");
  // p < P gives floor((p + 1) / r) <= floor(P / r).
  return std::max<int64_t>(rope_positions / ratio, 1);
}

}  // namespace aar::plan
