// DCP token placement, local lengths, local slot mapping, the speculative-decode
// mask and the chunked-context filter (docs/design/cp.md §2.1, §2.2, §3.1, §3.4, §3.3).
#include "ascend_attn_rt/cp/plan/dcp_layout.h"

#include <algorithm>
#include <cstdint>

#include "ascend_attn_rt/errors.h"
#include "ascend_attn_rt/cp/plan/cp_groups.h"
#include "ascend_attn_rt/plan/seq_lens.h"
#include "../../plan/block_scan.h"
#include "../../plan/internal.h"
#include "dcp_internal.h"

namespace aar::plan {
namespace {

using detail::dcp::check_lens_nonneg;
using detail::dcp::check_shard;
using detail::dcp::check_world_interleave;
using detail::dcp::FastDiv;
using detail::dcp::local_index;
using detail::dcp::local_len;
using detail::dcp::local_len_from;
using detail::dcp::owner;

}  // namespace

int32_t dcp_owner(int64_t x, int32_t world, int32_t interleave) {
  check_world_interleave(world, interleave);
  AAR_CHECK_ARG(x >= 0, "x=", x, " is negative");
  return static_cast<int32_t>(owner(x, world, interleave));
}

int64_t dcp_local_index(int64_t x, int32_t world, int32_t interleave) {
  check_world_interleave(world, interleave);
  AAR_CHECK_ARG(x >= 0, "x=", x, " is negative");
  return local_index(x, world, interleave);
}

int64_t dcp_local_len(int64_t len, int32_t world, int32_t interleave, int32_t rank) {
  check_shard({world, rank, interleave});
  AAR_CHECK_ARG(len >= 0, "len=", len, " is negative");
  return local_len(len, world, interleave, rank);
}

DcpVirtualPosition dcp_virtual_position(int64_t x, int32_t block_size, int32_t world, int32_t interleave) {
  check_world_interleave(world, interleave);
  AAR_CHECK_ARG(x >= 0, "x=", x, " is negative");
  AAR_CHECK_ARG(block_size >= 1, "block_size=", block_size, " must be >= 1");
  AAR_CHECK_ARG(block_size % interleave == 0, "block_size=", block_size, " is not a multiple of interleave=",
                interleave, " (the virtual-block form needs it)");
  const int64_t vbs = static_cast<int64_t>(block_size) * world;
  const int64_t o = x % vbs;
  DcpVirtualPosition v;
  v.virtual_block = x / vbs;
  v.owner = static_cast<int32_t>(o / interleave % world);
  v.local_offset = static_cast<int32_t>(o / (static_cast<int64_t>(world) * interleave) * interleave + o % interleave);
  return v;
}

void dcp_local_seq_lens(CSpan<int32_t> seq_lens, int32_t world, int32_t interleave, Span<int32_t> out) {
  check_world_interleave(world, interleave);
  check_lens_nonneg(seq_lens, "seq_lens");
  const std::size_t n = seq_lens.size(), w = static_cast<std::size_t>(world);
  AAR_CHECK_ARG(out.size() >= n * w, "out has room for ", out.size(), " entries, needs seq_lens.size()*world = ",
                n, "*", w, " = ", n * w);
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t k = 0; k < w; ++k) {
      out[i * w + k] = static_cast<int32_t>(local_len(seq_lens[i], world, interleave, static_cast<int64_t>(k)));
    }
  }
}

void dcp_local_seq_lens_of_rank(CSpan<int32_t> seq_lens, const DcpShard& shard, Span<int32_t> out) {
  check_shard(shard);
  check_lens_nonneg(seq_lens, "seq_lens");
  AAR_CHECK_ARG(out.size() >= seq_lens.size(), "out has room for ", out.size(), " entries, needs ",
                seq_lens.size());
  for (std::size_t i = 0; i < seq_lens.size(); ++i) {
    out[i] = static_cast<int32_t>(local_len(seq_lens[i], shard.world, shard.interleave, shard.rank));
  }
}

void dcp_context_lens(CSpan<int32_t> query_start_loc, CSpan<int32_t> seq_lens, int32_t num_decodes,
                      int32_t world, int32_t interleave, Span<int32_t> out) {
  check_world_interleave(world, interleave);
  const std::size_t n = seq_lens.size(), w = static_cast<std::size_t>(world);
  AAR_CHECK_ARG(query_start_loc.size() == n + 1, "query_start_loc has ", query_start_loc.size(),
                " entries, expected seq_lens.size()+1 = ", n + 1);
  validate_start_loc(query_start_loc, "query_start_loc");
  AAR_CHECK_ARG(num_decodes >= 0 && static_cast<std::size_t>(num_decodes) <= n, "num_decodes=", num_decodes,
                " is out of range [0, ", n, "]");
  for (std::size_t i = 0; i < n; ++i) {
    const int32_t q = query_start_loc[i + 1] - query_start_loc[i];
    AAR_CHECK_ARG(seq_lens[i] >= q, "seq_lens[", i, "]=", seq_lens[i], " is smaller than its query length ", q);
  }
  AAR_CHECK_ARG(out.size() >= n * w, "out has room for ", out.size(), " entries, needs seq_lens.size()*world = ",
                n, "*", w, " = ", n * w);
  for (std::size_t i = 0; i < n; ++i) {
    const int32_t q = query_start_loc[i + 1] - query_start_loc[i];
    const int64_t ctx = i < static_cast<std::size_t>(num_decodes) ? seq_lens[i] : seq_lens[i] - q;
    for (std::size_t k = 0; k < w; ++k) {
      out[i * w + k] = static_cast<int32_t>(local_len(ctx, world, interleave, static_cast<int64_t>(k)));
    }
  }
}

int32_t compute_dcp_slot_mapping(const SlotMappingInputs& in, const DcpShard& shard, Span<int32_t> slots_out) {
  // Validation, all of it before the first write and independent of shard.rank.
  check_shard(shard);
  // The column checks walk every rank's range of local indices: a world of INT32_MAX (a valid
  // shard otherwise) made that loop run for minutes (fuzz_dcp_step). A KV shard spans at most
  // kMaxCpMergePartitions ranks (cp_groups.h), for DCP and legacy PCP x DCP alike.
  AAR_CHECK_ARG(shard.world <= kMaxCpMergePartitions, "world=", shard.world, " exceeds ", kMaxCpMergePartitions,
                " (the KV shard's ranks, cp_groups.h)");
  detail::validate_slot_mapping_sizes(in, slots_out.size());
  const std::size_t b = in.seq_lens.size();
  const std::size_t stride = static_cast<std::size_t>(in.block_table_stride);
  const int32_t total = in.query_start_loc[b];
  const int64_t bs = in.block_size, w = shard.world, il = shard.interleave;
  // Every position is an int32 (seq_lens are), so the pass's divisions by W * I, I and the block
  // size are multiply-highs when W * I fits 32 bits (docs/design/cp.md §11.8); the same values.
  const bool fast = w * il <= int64_t{UINT32_MAX};
  const FastDiv fd_wi(fast ? static_cast<uint32_t>(w * il) : 1u), fd_i(static_cast<uint32_t>(il)),
      fd_bs(static_cast<uint32_t>(bs));
  constexpr int32_t kTokenCheck = 16;  // up to this many tokens a request's blocks are checked token by token
  // Shifts instead of multiply-highs when W, I and the block size are powers of two (the usual shard).
  const detail::dcp::DcpMath dm(shard, in.block_size);
  const auto local_index_div = [&](uint32_t p) {  // local_index(p) by multiply-highs (fast)
    const uint32_t qwi = fd_wi.div(p), qi = fd_i.div(p);
    return qwi * static_cast<uint32_t>(il) + (p - qi * static_cast<uint32_t>(il));
  };
  for (std::size_t r = 0; r < b; ++r) {
    const int32_t q = in.query_start_loc[r + 1] - in.query_start_loc[r];
    const int32_t seq = in.seq_lens[r];
    AAR_CHECK_ARG(seq >= q, "seq_lens[", r, "]=", seq, " is smaller than its query length ", q);
    if (q == 0) continue;
    const int32_t* row = in.block_table.data() + r * stride;
    // A few tokens (decodes): their blocks on their owners, token by token, are the blocks the
    // ranks' ranges below cover; all in range, the request is done, else the ranges name the first
    // bad one.
    if (fast && q <= kTokenCheck && in.num_blocks > 0) {
      bool ok = true;
      for (uint32_t p = static_cast<uint32_t>(seq - q); p < static_cast<uint32_t>(seq); ++p) {
        const uint32_t blk = dm.pow2 ? dm.local_index(p) >> dm.sbs : fd_bs.div(local_index_div(p));
        if (blk >= stride) {
          ok = false;
          break;
        }
        ok &= static_cast<uint32_t>(row[blk]) < static_cast<uint32_t>(in.num_blocks);
      }
      if (ok) continue;
    }
    // Rank k writes local indices [local_len(seq-q, k), local_len(seq, k)).
    const int64_t lo_q = fast ? fd_wi.div(static_cast<uint32_t>(seq - q)) : 0;
    const int64_t hi_q = fast ? fd_wi.div(static_cast<uint32_t>(seq)) : 0;
    for (int64_t k = 0; k < w; ++k) {
      const int64_t lo = fast ? local_len_from(seq - q, lo_q, w, il, k) : local_len(seq - q, w, il, k);
      const int64_t hi = fast ? local_len_from(seq, hi_q, w, il, k) : local_len(seq, w, il, k);
      if (hi == lo) continue;
      // lo < hi <= seq: 32-bit, so the block divisions are multiply-highs too.
      const int64_t first_blk = fast ? fd_bs.div(static_cast<uint32_t>(lo)) : lo / bs;
      const int64_t last_blk = fast ? fd_bs.div(static_cast<uint32_t>(hi - 1)) : (hi - 1) / bs;
      AAR_CHECK_ARG(last_blk < in.block_table_stride, "seq_lens[", r, "]=", seq, " needs block index ",
                    last_blk, " on DCP rank ", k, " but block_table_stride=", in.block_table_stride,
                    " (block_size=", in.block_size, ", world=", shard.world, ", interleave=", shard.interleave,
                    ")");
      for (int64_t c = first_blk; c <= last_blk; ++c) {
        AAR_CHECK_ARG(row[c] >= 0 && row[c] < in.num_blocks, "block_table[", r, "][", c, "]=", row[c],
                      " is out of range [0, ", in.num_blocks, ")");
      }
    }
  }

  const int32_t ibs = in.block_size;
  const uint32_t me = static_cast<uint32_t>(shard.rank);
  // The write pass over 32-bit positions; place(pos, row, slot) is false when another rank owns pos.
  const auto write_pass = [&](auto place) {
    int32_t owned = 0;
    for (std::size_t r = 0; r < b; ++r) {
      const int32_t begin = in.query_start_loc[r], end = in.query_start_loc[r + 1];
      const int32_t* row = in.block_table.data() + r * stride;
      uint32_t pos = static_cast<uint32_t>(in.seq_lens[r] - (end - begin));
      for (int32_t t = begin; t < end; ++t, ++pos) {
        int32_t slot = kPadSlot;
        owned += place(pos, row, slot) ? 1 : 0;
        slots_out[t] = slot;
      }
    }
    for (std::size_t t = static_cast<std::size_t>(total); t < slots_out.size(); ++t) slots_out[t] = kPadSlot;
    return owned;
  };
  if (fast && dm.pow2) {
    return write_pass([&](uint32_t pos, const int32_t* row, int32_t& slot) {
      if (dm.owner(pos) != me) return false;
      const uint32_t li = dm.local_index(pos);
      slot = row[li >> dm.sbs] * ibs + static_cast<int32_t>(li & (dm.bs - 1));
      return true;
    });
  }
  if (fast) {
    const uint32_t uw = static_cast<uint32_t>(w), ub = static_cast<uint32_t>(ibs);
    return write_pass([&](uint32_t pos, const int32_t* row, int32_t& slot) {
      if (fd_i.div(pos) - fd_wi.div(pos) * uw != me) return false;  // owner(pos) = (pos / I) % W
      const uint32_t li = local_index_div(pos);
      const uint32_t blk = fd_bs.div(li);
      slot = row[blk] * ibs + static_cast<int32_t>(li - blk * ub);
      return true;
    });
  }
  int32_t owned = 0;
  for (std::size_t r = 0; r < b; ++r) {
    const int32_t begin = in.query_start_loc[r], end = in.query_start_loc[r + 1];
    const int32_t* row = in.block_table.data() + r * stride;
    int64_t pos = in.seq_lens[r] - (end - begin);
    for (int32_t t = begin; t < end; ++t, ++pos) {
      if (owner(pos, w, il) != shard.rank) {
        slots_out[t] = kPadSlot;
        continue;
      }
      const int32_t li = static_cast<int32_t>(local_index(pos, w, il));
      slots_out[t] = row[li / ibs] * ibs + li % ibs;
      ++owned;
    }
  }
  for (std::size_t t = static_cast<std::size_t>(total); t < slots_out.size(); ++t) slots_out[t] = kPadSlot;
  return owned;
}

void check_dcp_block_table(const SlotMappingInputs& in, int32_t world, int32_t interleave) {
  AAR_CHECK_ARG(world >= 1, "world=", world, " must be >= 1");
  AAR_CHECK_ARG(interleave >= 1, "interleave=", interleave, " must be >= 1");
  AAR_CHECK_ARG(in.block_size > 0, "block_size=", in.block_size, " must be positive");
  const std::size_t n = in.seq_lens.size();
  const std::size_t stride = static_cast<std::size_t>(std::max(in.block_table_stride, 0));
  AAR_CHECK_ARG(in.block_table_stride >= 0 && in.block_table.size() >= n * stride, "block_table has ",
                in.block_table.size(), " entries, expected ", n, " x ", in.block_table_stride);
  const bool fast = int64_t{world} * interleave <= int64_t{UINT32_MAX};
  const FastDiv fd_wi(fast ? static_cast<uint32_t>(int64_t{world} * interleave) : 1u);
  // The exact check of request r, in the order the errors are named: its length, its block count, its ids.
  const auto check_request = [&](std::size_t r) {
    const int64_t seq = in.seq_lens[r];
    AAR_CHECK_ARG(seq >= 0, "seq_lens[", r, "]=", seq, " is negative");
    const int64_t first = fast ? local_len_from(seq, fd_wi.div(static_cast<uint32_t>(seq)), world, interleave, 0)
                               : local_len(seq, world, interleave, 0);
    const int64_t need = (first + in.block_size - 1) / in.block_size;
    AAR_CHECK_ARG(need <= in.block_table_stride, "seq_lens[", r, "]=", seq, " needs ", need,
                  " blocks per DCP rank but block_table_stride=", in.block_table_stride);
    detail::check_row_block_ids(in.block_table.data() + r * stride, need, r, in.num_blocks);
  };
  // Rank 0 holds the longest local sequence: a row's ids [0, ceil(local_len(seq, 0) / bs)) are what
  // any rank reads. In chunks: the chunk's local lengths first (the first request whose length or
  // block count is bad ends the chunk), then its ids by the single-rank builders' vectorised scan
  // (plan/block_scan.h); any failure is named by the exact check above, request by request.
  constexpr std::size_t kChunk = 256;
  int32_t local[kChunk];
  const detail::BlockCount blocks(in.block_size);
  for (std::size_t r0 = 0; r0 < n; r0 += kChunk) {
    const std::size_t m = std::min(kChunk, n - r0);
    std::size_t good = 0;
    uint32_t max_count = 0;
    for (; good < m; ++good) {
      const int32_t seq = in.seq_lens[r0 + good];
      if (seq < 0 || !fast) break;
      const int64_t first = local_len_from(seq, fd_wi.div(static_cast<uint32_t>(seq)), world, interleave, 0);
      const uint32_t count = blocks(static_cast<int32_t>(first));
      if (count > static_cast<uint32_t>(in.block_table_stride)) break;
      local[good] = static_cast<int32_t>(first);
      max_count = std::max(max_count, count);
    }
    const bool ids_ok = good == 0 || (in.num_blocks >= 0 &&
                                      detail::block_ids_in_range(in.block_table.data() + r0 * stride, stride, local,
                                                                 good, blocks, max_count, in.num_blocks, nullptr, 0));
    if (!ids_ok) {
      for (std::size_t i = 0; i < good; ++i) check_request(r0 + i);
    }
    if (good < m) {
      check_request(r0 + good);  // throws unless only the fast form was out of reach (W * I beyond 32 bits)
      for (std::size_t i = good + 1; i < m; ++i) check_request(r0 + i);
    }
  }
}

void build_dcp_mtp_mask(const DcpMtpMaskInputs& in, Span<uint8_t> mask_out) {
  check_shard(in.shard);
  const std::size_t n = in.seq_lens.size();
  AAR_CHECK_ARG(in.query_lens.size() == n, "query_lens has ", in.query_lens.size(),
                " entries, seq_lens has ", n);
  AAR_CHECK_ARG(in.max_query_len >= 0, "max_query_len=", in.max_query_len, " is negative");
  AAR_CHECK_ARG(in.max_kv_len >= 0, "max_kv_len=", in.max_kv_len, " is negative");
  const int64_t w = in.shard.world, il = in.shard.interleave, r = in.shard.rank;
  for (std::size_t b = 0; b < n; ++b) {
    const int32_t len = in.seq_lens[b], q = in.query_lens[b];
    AAR_CHECK_ARG(q >= 0 && q <= in.max_query_len, "query_lens[", b, "]=", q, " is out of range [0, max_query_len=",
                  in.max_query_len, "]");
    AAR_CHECK_ARG(len >= q, "seq_lens[", b, "]=", len, " is smaller than query_lens[", b, "]=", q);
    // Rank 0 holds the longest local sequence: checking it keeps the check rank-independent.
    const int64_t longest = local_len(len, w, il, 0);
    AAR_CHECK_ARG(longest <= in.max_kv_len, "seq_lens[", b, "]=", len, " has ", longest,
                  " local tokens on DCP rank 0, more than max_kv_len=", in.max_kv_len);
  }
  const std::size_t s = static_cast<std::size_t>(in.max_query_len), kmax = static_cast<std::size_t>(in.max_kv_len);
  // The product of two int32 dims and the batch can wrap size_t (5 x 1718039348 x 2147418113
  // is 4 mod 2^64): a wrapped count would pass the room check and the fill would overrun.
  std::size_t need = 0;
  const bool wraps = __builtin_mul_overflow(n, s, &need) || __builtin_mul_overflow(need, kmax, &need);
  AAR_CHECK_ARG(!wraps, "num_reqs*max_query_len*max_kv_len = ", n, "*", s, "*", kmax, " overflows the mask size");
  AAR_CHECK_ARG(mask_out.size() >= need, "mask_out has room for ", mask_out.size(),
                " entries, needs num_reqs*max_query_len*max_kv_len = ", n, "*", s, "*", kmax, " = ", need);
  // An empty mask (max_kv_len = 0 with a huge max_query_len, say) has nothing to write; walking
  // its rows anyway took minutes (fuzz_dcp, a timeout).
  if (need == 0) return;

  for (std::size_t b = 0; b < n; ++b) {
    const int64_t len = in.seq_lens[b], q = in.query_lens[b], h = len - q;
    const int64_t k_len = local_len(len, w, il, r);
    for (std::size_t j = 0; j < s; ++j) {
      uint8_t* row = mask_out.data() + (b * s + j) * kmax;
      // Keys [0, visible) are open, [visible, k_len) masked, [k_len, kmax) left 0.
      int64_t visible = k_len;
      if (static_cast<int64_t>(j) < q && k_len > 0) {
        visible = local_len(h + static_cast<int64_t>(j) + 1, w, il, r);  // upper_j + 1
        if (visible == 0 && in.reproduce_upstream_unmasked_rows) visible = k_len;
      }
      std::fill(row, row + visible, uint8_t{0});
      std::fill(row + visible, row + k_len, uint8_t{1});
      std::fill(row + k_len, row + kmax, uint8_t{0});
    }
  }
}

int32_t chunked_context_token_indices(CSpan<int32_t> query_lens, CSpan<int32_t> context_lens, Span<int32_t> out) {
  AAR_CHECK_ARG(context_lens.size() == query_lens.size(), "context_lens has ", context_lens.size(),
                " entries, query_lens has ", query_lens.size());
  check_lens_nonneg(query_lens, "query_lens");
  check_lens_nonneg(context_lens, "context_lens");
  int64_t total = 0;
  for (int32_t q : query_lens) total += q;
  AAR_CHECK_ARG(total <= INT32_MAX, "sum(query_lens)=", total, " exceeds int32");
  AAR_CHECK_ARG(out.size() >= static_cast<std::size_t>(total), "out has room for ", out.size(),
                " entries, needs sum(query_lens)=", total);
  int32_t count = 0, tok = 0;
  for (std::size_t i = 0; i < query_lens.size(); ++i) {
    if (context_lens[i] > 0) {
      for (int32_t j = 0; j < query_lens[i]; ++j) out[count++] = tok + j;
    }
    tok += query_lens[i];
  }
  return count;
}

}  // namespace aar::plan
