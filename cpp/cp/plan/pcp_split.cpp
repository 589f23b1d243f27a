// Legacy PCP DualChunkSwap split (docs/design/cp.md §6.1, §6.3, §3.4, §6.4).
#include "ascend_attn_rt/cp/plan/pcp_split.h"

#include <algorithm>
#include <cstdint>

#include "ascend_attn_rt/errors.h"
#include "ascend_attn_rt/cp/plan/cp_groups.h"
#include "ascend_attn_rt/plan/slot_mapping.h"

namespace aar::plan {
namespace {

inline int64_t chunk_len(int64_t q, int64_t wp) { return (q + 2 * wp - 1) / (2 * wp); }

// Walks the requests in batch order, with each request's offsets in the local
// buffer, the padded-global buffer and the scheduled tokens.
struct Region {
  std::size_t req = 0;
  bool decode = false;
  int32_t q = 0;
  int32_t c = 0;              // chunk length (prefill), 0 for decodes
  int32_t local_begin = 0;    // first local row of the request (same on every rank)
  int32_t local_len = 0;      // q (decode) or 2c (prefill)
  int32_t global_begin = 0;   // first padded-global slot
  int32_t token_begin = 0;    // first scheduled token in batch order
};

template <typename Fn>
void for_each_region(const PcpSplitInputs& in, Fn fn) {
  const int32_t wp = in.pcp_size;
  Region r;
  for (std::size_t i = 0; i < in.query_lens.size(); ++i) {
    r.req = i;
    r.q = in.query_lens[i];
    r.decode = i < static_cast<std::size_t>(in.num_decodes);
    r.c = r.decode ? 0 : static_cast<int32_t>(chunk_len(r.q, wp));
    r.local_len = r.decode ? r.q : 2 * r.c;
    fn(r);
    r.local_begin += r.local_len;
    r.global_begin += r.local_len * wp;
    r.token_begin += r.q;
  }
}

// The same walk over the prefill requests only: they follow the decodes, whose
// num_decode_tokens (pcp_split_sizes) give the first prefill's offsets (a decode
// takes q local rows, Wp q padded-global rows and q tokens).
template <typename Fn>
void for_each_prefill_region(const PcpSplitInputs& in, int32_t num_decode_tokens, Fn fn) {
  const int32_t wp = in.pcp_size;
  Region r;
  r.local_begin = num_decode_tokens;
  r.global_begin = num_decode_tokens * wp;
  r.token_begin = num_decode_tokens;
  for (std::size_t i = static_cast<std::size_t>(in.num_decodes); i < in.query_lens.size(); ++i) {
    r.req = i;
    r.q = in.query_lens[i];
    r.c = static_cast<int32_t>(chunk_len(r.q, wp));
    r.local_len = 2 * r.c;
    fn(r);
    r.local_begin += r.local_len;
    r.global_begin += r.local_len * wp;
    r.token_begin += r.q;
  }
}

void check_rank(const PcpSplitInputs& in, int32_t rank) {
  AAR_CHECK_ARG(rank >= 0 && rank < in.pcp_size, "rank=", rank, " is out of range [0, pcp_size=", in.pcp_size,
                ")");
}

void check_room(std::size_t have, int64_t need, const char* name) {
  AAR_CHECK_ARG(have >= static_cast<uint64_t>(need), name, " has room for ", have, " entries, needs ", need);
}

}  // namespace

PcpSplitSizes pcp_split_sizes(const PcpSplitInputs& in) {
  // The sharded layout spreads the KV over Wp * Wd <= kMaxCpMergePartitions ranks (cp_groups.h);
  // the bound also keeps 2 * Wp and the per-rank loops small (fuzz_pcp: 2 * INT32_MAX overflowed).
  AAR_CHECK_ARG(in.pcp_size >= 1, "pcp_size=", in.pcp_size, " must be >= 1");
  AAR_CHECK_ARG(in.pcp_size <= kMaxCpMergePartitions, "pcp_size=", in.pcp_size, " exceeds ",
                kMaxCpMergePartitions, " (the sharded KV spans at most that many ranks)");
  const std::size_t n = in.query_lens.size();
  AAR_CHECK_ARG(in.num_decodes >= 0 && static_cast<std::size_t>(in.num_decodes) <= n, "num_decodes=",
                in.num_decodes, " is out of range [0, ", n, "]");
  // Every PCP plan function starts here, so a step pays this pass several times: the
  // decodes are one branch-free sum (and a sign test), the prefills the per-request chunks.
  const std::size_t nd = static_cast<std::size_t>(in.num_decodes);
  const int32_t* ql = in.query_lens.data();
  int64_t td = 0, local = 0, sched = 0;
  int32_t lowest = 0;
  for (std::size_t i = 0; i < nd; ++i) {
    td += ql[i];
    lowest = std::min(lowest, ql[i]);
  }
  for (std::size_t i = nd; i < n; ++i) {
    lowest = std::min(lowest, ql[i]);
    sched += ql[i];
    local += 2 * chunk_len(ql[i], in.pcp_size);
  }
  if (lowest < 0) {
    for (std::size_t i = 0; i < n; ++i) {
      AAR_CHECK_ARG(ql[i] >= 0, "query_lens[", i, "]=", ql[i], " is negative");
    }
  }
  sched += td;
  local += td;
  const int64_t global = local * in.pcp_size;
  AAR_CHECK_ARG(global <= INT32_MAX && sched <= INT32_MAX, "the padded-global buffer has ", global,
                " rows (pcp_size=", in.pcp_size, "), beyond int32");
  PcpSplitSizes s;
  s.num_reqs = static_cast<int32_t>(n);
  s.num_decode_tokens = static_cast<int32_t>(td);
  s.local_tokens = static_cast<int32_t>(local);
  s.local_prefill_tokens = static_cast<int32_t>(local - td);
  s.padded_global_tokens = static_cast<int32_t>(global);
  s.scheduled_tokens = static_cast<int32_t>(sched);
  return s;
}

void pcp_local_tokens(const PcpSplitInputs& in, int32_t rank, Span<int32_t> local_lens_out,
                      Span<int32_t> positions_out) {
  const PcpSplitSizes s = pcp_split_sizes(in);
  check_rank(in, rank);
  check_room(local_lens_out.size(), s.num_reqs, "local_lens_out");
  check_room(positions_out.size(), s.local_tokens, "positions_out");
  const int32_t head = rank, tail = 2 * in.pcp_size - 1 - rank;
  // The decodes: each its q tokens at positions 0 .. q-1 (one pass, no region walk).
  const std::size_t nd = static_cast<std::size_t>(in.num_decodes);
  const int32_t* ql = in.query_lens.data();
  std::copy_n(ql, nd, local_lens_out.data());
  int32_t* pos = positions_out.data();
  for (std::size_t i = 0; i < nd; ++i) {
    for (int32_t j = 0; j < ql[i]; ++j) *pos++ = j;
  }
  for_each_prefill_region(in, s.num_decode_tokens, [&](const Region& r) {
    local_lens_out[r.req] = r.local_len;
    int32_t* p = positions_out.data() + r.local_begin;
    for (int32_t i = 0; i < r.c; ++i) {
      p[i] = head * r.c + i;
      p[r.c + i] = tail * r.c + i;
    }
  });
}

void pcp_pad_counts(const PcpSplitInputs& in, Span<int32_t> pads_out) {
  const PcpSplitSizes s = pcp_split_sizes(in);
  check_room(pads_out.size(), s.num_reqs, "pads_out");
  for_each_region(in, [&](const Region& r) { pads_out[r.req] = r.local_len * in.pcp_size - r.q; });
}

void pcp_restore_index(const PcpSplitInputs& in, Span<int32_t> restore_out) {
  const PcpSplitSizes s = pcp_split_sizes(in);
  check_room(restore_out.size(), s.padded_global_tokens, "restore_out");
  const int32_t wp = in.pcp_size;
  // restore[slot] = row of G holding the token of that slot (the inverse of the
  // map "G row -> slot", so no argsort is needed).
  // The decode tokens, in batch order from local row and slot 0: token t's Wp copies, rank-major (rank k's
  // is row k L + t), one pass over them whatever the requests.
  int32_t* dst = restore_out.data();
  for (int32_t t = 0; t < s.num_decode_tokens; ++t) {
    for (int32_t rank = 0; rank < wp; ++rank) *dst++ = rank * s.local_tokens + t;
  }
  for_each_prefill_region(in, s.num_decode_tokens, [&](const Region& r) {
    for (int32_t rank = 0; rank < wp; ++rank) {
      const int32_t g = rank * s.local_tokens + r.local_begin;
      const int32_t head = rank, tail = 2 * wp - 1 - rank;
      for (int32_t i = 0; i < r.c; ++i) {
        restore_out[r.global_begin + head * r.c + i] = g + i;
        restore_out[r.global_begin + tail * r.c + i] = g + r.c + i;
      }
    }
  });
}

void pcp_unpad_mask(const PcpSplitInputs& in, Span<uint8_t> mask_out) {
  const PcpSplitSizes s = pcp_split_sizes(in);
  check_room(mask_out.size(), s.padded_global_tokens, "mask_out");
  const int32_t wp = in.pcp_size;
  for_each_region(in, [&](const Region& r) {
    const int32_t len = r.local_len * wp;
    for (int32_t k = 0; k < len; ++k) {
      mask_out[r.global_begin + k] = r.decode ? uint8_t(k % wp == 0) : uint8_t(k < r.q);
    }
  });
}

void pcp_padded_slot_mapping(const PcpSplitInputs& in, CSpan<int32_t> token_slots, Span<int32_t> slots_out) {
  const PcpSplitSizes s = pcp_split_sizes(in);
  AAR_CHECK_ARG(token_slots.size() == static_cast<std::size_t>(s.scheduled_tokens), "token_slots has ",
                token_slots.size(), " entries, expected sum(query_lens)=", s.scheduled_tokens);
  check_room(slots_out.size(), s.padded_global_tokens, "slots_out");
  const int32_t wp = in.pcp_size;
  // A decode token's Wp copies: the first keeps its slot. A prefill: its q slots, then pads.
  int32_t* out = slots_out.data();
  const int32_t* src = token_slots.data();
  // The decode tokens (one pass whatever the requests), then each prefill's slots and pads.
  const int32_t td = s.num_decode_tokens;
  std::fill(out, out + static_cast<int64_t>(td) * wp, kPadSlot);
  for (int32_t t = 0; t < td; ++t) out[static_cast<int64_t>(t) * wp] = src[t];
  for_each_prefill_region(in, td, [&](const Region& r) {
    int32_t* dst = out + r.global_begin;
    std::copy_n(src + r.token_begin, r.q, dst);
    std::fill(dst + r.q, dst + r.local_len * wp, kPadSlot);
  });
}

void pcp_chunk_restore_index(const PcpSplitInputs& in, Span<int32_t> recover_out, Span<int32_t> inverse_out) {
  const PcpSplitSizes s = pcp_split_sizes(in);
  const int64_t rows = static_cast<int64_t>(s.local_prefill_tokens) * in.pcp_size;
  check_room(recover_out.size(), rows, "recover_out");
  check_room(inverse_out.size(), rows, "inverse_out");
  const int32_t wp = in.pcp_size, td = s.num_decode_tokens, tpl = s.local_prefill_tokens;
  for_each_prefill_region(in, td, [&](const Region& r) {
    // Prefill regions follow every decode region (decodes first), so the
    // padded-global prefill index is the slot minus Wp * Td.
    const int32_t pg_begin = r.global_begin - wp * td;
    const int32_t lp_begin = r.local_begin - td;
    for (int32_t rank = 0; rank < wp; ++rank) {
      const int32_t head = rank, tail = 2 * wp - 1 - rank;
      for (int32_t i = 0; i < 2 * r.c; ++i) {
        const int32_t chunk = i < r.c ? head : tail;
        const int32_t pg = pg_begin + chunk * r.c + i % r.c;
        const int32_t g = rank * tpl + lp_begin + i;
        recover_out[pg] = g;
        inverse_out[g] = pg;
      }
    }
  });
}

PcpHeadTailCounts pcp_head_tail_counts(const PcpSplitInputs& in, int32_t rank) {
  const PcpSplitSizes s = pcp_split_sizes(in);
  check_rank(in, rank);
  PcpHeadTailCounts n;
  const int64_t tail = 2 * in.pcp_size - 1 - rank;
  int64_t chunk = 0;
  for_each_prefill_region(in, s.num_decode_tokens, [&](const Region& r) {
    ++n.num_prefills;
    chunk += r.c;
  });
  // 2 * Wp * sum(c) = the padded prefill total, already checked to fit int32.
  n.chunk_tokens = static_cast<int32_t>(chunk);
  n.head_nomask_tokens = static_cast<int32_t>(rank * chunk);
  n.tail_nomask_tokens = static_cast<int32_t>(tail * chunk);
  return n;
}

PcpHeadTailCounts pcp_head_tail_indices(const PcpSplitInputs& in, int32_t rank, const PcpHeadTailBuffers& out) {
  const PcpHeadTailCounts n = pcp_head_tail_counts(in, rank);
  check_room(out.q_head_idx.size(), n.chunk_tokens, "q_head_idx");
  check_room(out.q_tail_idx.size(), n.chunk_tokens, "q_tail_idx");
  check_room(out.kv_head_nomask_idx.size(), n.head_nomask_tokens, "kv_head_nomask_idx");
  check_room(out.kv_head_mask_idx.size(), n.chunk_tokens, "kv_head_mask_idx");
  check_room(out.kv_tail_nomask_idx.size(), n.tail_nomask_tokens, "kv_tail_nomask_idx");
  check_room(out.kv_tail_mask_idx.size(), n.chunk_tokens, "kv_tail_mask_idx");
  check_room(out.q_full_idx.size(), 2 * static_cast<int64_t>(n.chunk_tokens), "q_full_idx");
  check_room(out.mask_seq_ends.size(), n.num_prefills, "mask_seq_ends");
  check_room(out.head_nomask_kv_ends.size(), n.num_prefills, "head_nomask_kv_ends");
  check_room(out.tail_nomask_kv_ends.size(), n.num_prefills, "tail_nomask_kv_ends");

  const int32_t wp = in.pcp_size, head = rank, tail = 2 * wp - 1 - rank;
  int32_t qo = 0, ko = 0, chunk_pos = 0, head_nm = 0, tail_nm = 0, p = 0;
  int64_t mask_end = 0, head_end = 0, tail_end = 0;
  // Only each prefill's chunk length is read (the lists count their own offsets from the first
  // prefill row), so the regions' batch offsets are left unset (0).
  for_each_prefill_region(in, 0, [&](const Region& r) {
    const int32_t c = r.c;
    for (int32_t i = 0; i < c; ++i) {
      out.q_head_idx[chunk_pos + i] = qo + i;
      out.q_tail_idx[chunk_pos + i] = qo + c + i;
      out.kv_head_mask_idx[chunk_pos + i] = ko + head * c + i;
      out.kv_tail_mask_idx[chunk_pos + i] = ko + tail * c + i;
      // concat(q_head, q_tail) holds local query qo+i at chunk_pos+i and qo+c+i
      // at chunk_tokens+chunk_pos+i; q_full_idx is the inverse of that order.
      out.q_full_idx[qo + i] = chunk_pos + i;
      out.q_full_idx[qo + c + i] = n.chunk_tokens + chunk_pos + i;
    }
    for (int32_t i = 0; i < head * c; ++i) out.kv_head_nomask_idx[head_nm + i] = ko + i;
    for (int32_t i = 0; i < tail * c; ++i) out.kv_tail_nomask_idx[tail_nm + i] = ko + i;
    chunk_pos += c;
    head_nm += head * c;
    tail_nm += tail * c;
    mask_end += c;
    head_end += static_cast<int64_t>(head) * c;
    tail_end += static_cast<int64_t>(tail) * c;
    out.mask_seq_ends[p] = mask_end;
    out.head_nomask_kv_ends[p] = head_end;
    out.tail_nomask_kv_ends[p] = tail_end;
    ++p;
    qo += 2 * c;
    ko += 2 * c * wp;
  });
  return n;
}

}  // namespace aar::plan
