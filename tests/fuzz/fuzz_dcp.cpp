// The DCP layout (plan/dcp_layout.h): the scalar placement formulas (dcp_owner,
// dcp_local_index, dcp_local_len, dcp_virtual_position), dcp_local_seq_lens and its one-rank
// form, dcp_context_lens, compute_dcp_slot_mapping, check_dcp_block_table, build_dcp_mtp_mask
// and chunked_context_token_indices. The naive model deals the positions of a request out to
// the ranks in runs of I, round robin, and counts: owner, local index and local length come
// from that simulation, not from the header's closed forms.
#include "ascend_attn_rt/cp/plan/dcp_layout.h"
#include "fuzz_util.h"

using namespace aar;

namespace {

// Positions 0..len-1 dealt out in runs of `il` over `w` ranks: owner and local index of each.
struct Deal {
  std::vector<int32_t> owner, index;
  std::vector<int64_t> count;  // per rank, positions owned
  Deal(int64_t len, int32_t w, int32_t il) : count(w, 0) {
    int32_t rank = 0, run = 0;
    for (int64_t x = 0; x < len; ++x) {
      owner.push_back(rank);
      index.push_back(static_cast<int32_t>(count[rank]++));
      if (++run == il) run = 0, rank = (rank + 1) % w;
    }
  }
};

int32_t clamp32(int64_t v) { return static_cast<int32_t>(std::clamp<int64_t>(v, INT32_MIN, INT32_MAX)); }
// Query length of request r, saturated (a corrupted query_start_loc may not be monotonic).
int32_t qlen(const fuzz::Batch& b, int32_t r) { return clamp32(int64_t{b.qsl[r + 1]} - b.qsl[r]); }

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Bytes in(data, size);
  fuzz::Batch b = fuzz::make_batch(in, 6, 24, 400);
  fuzz::current_batch() = &b;
  const int32_t B = b.B();
  plan::DcpShard sh;
  const int32_t world = in.range(1, 8);
  sh.world = in.maybe_bad(world);
  sh.interleave = in.maybe_bad(in.u8() % 2 ? std::max(1, b.block_size) : in.range(1, 4));
  sh.rank = in.maybe_bad(in.range(0, world - 1));
  const bool shard_ok = sh.world >= 1 && sh.interleave >= 1 && sh.rank >= 0 && sh.rank < sh.world;
  // Keep the brute-force model small: a valid shard with a huge world or run is only checked
  // through the scalar formulas' acceptance.
  // and a corrupted (huge) seq_len skips the naive models but not the calls.
  bool tame = true;
  for (int32_t v : b.seq_lens) tame = tame && v <= 4096;
  const bool small = shard_ok && sh.world <= 64 && sh.interleave <= 1024;

  // Scalars.
  {
    const int64_t x = in.flag() ? -static_cast<int64_t>(in.u8()) : in.range(0, 700);
    bool ok = true;
    int32_t o = 0;
    int64_t li = 0, ll = 0;
    try {
      o = plan::dcp_owner(x, sh.world, sh.interleave);
      li = plan::dcp_local_index(x, sh.world, sh.interleave);
      ll = plan::dcp_local_len(x, sh.world, sh.interleave, sh.rank);
    } catch (const InvalidArgument& e) {
      FUZZ_CHECK(e.what()[0] != '\0');
      ok = false;
    }
    FUZZ_CHECK(ok == (shard_ok && x >= 0));
    if (ok && small) {
      const Deal d(x + 1, sh.world, sh.interleave);
      FUZZ_CHECK(o == d.owner[x] && li == d.index[x]);
      const Deal e(x, sh.world, sh.interleave);
      FUZZ_CHECK(ll == e.count[sh.rank]);
      // The virtual-block form agrees with the local form when B % I == 0.
      const int32_t bs = b.block_size;
      bool vok = true;
      plan::DcpVirtualPosition v;
      try {
        v = plan::dcp_virtual_position(x, bs, sh.world, sh.interleave);
      } catch (const InvalidArgument&) {
        vok = false;
      }
      FUZZ_CHECK(vok == (bs >= 1 && bs % sh.interleave == 0));
      if (vok) {
        FUZZ_CHECK(v.owner == o);
        FUZZ_CHECK(v.virtual_block * bs + v.local_offset == li);
        FUZZ_CHECK(v.local_offset >= 0 && v.local_offset < bs);
      }
    }
  }

  // dcp_local_seq_lens / _of_rank.
  {
    const int32_t W = std::max(1, std::min(sh.world, 64));
    const int32_t wq = shard_ok ? W : sh.world;
    const size_t need = static_cast<size_t>(B) * std::max(0, std::min(wq, 64));
    auto out = fuzz::canary<int32_t>(in.u8() % 8 == 0 && need ? need - 1 : need, -9);
    fuzz::Snapshot s;
    s.add(out);
    const bool ok = fuzz::accepted([&] { plan::dcp_local_seq_lens(b.seq_lens, wq, sh.interleave, out); }, s);
    bool lens_ok = true;
    for (int32_t v : b.seq_lens) lens_ok = lens_ok && v >= 0;
    if (!(wq >= 1 && sh.interleave >= 1 && lens_ok)) FUZZ_CHECK(!ok);
    if (ok && wq == W && small && tame) {
      FUZZ_CHECK(out.size() >= need);
      for (int32_t i = 0; i < B; ++i) {
        const Deal d(b.seq_lens[i], W, sh.interleave);
        for (int32_t k = 0; k < W; ++k) FUZZ_CHECK(out[static_cast<size_t>(i) * W + k] == d.count[k]);
      }
    }
    auto col = fuzz::canary<int32_t>(B && in.u8() % 8 == 0 ? B - 1 : B, -9);
    fuzz::Snapshot s2;
    s2.add(col);
    const bool ok2 = fuzz::accepted([&] { plan::dcp_local_seq_lens_of_rank(b.seq_lens, sh, col); }, s2);
    if (!(shard_ok && lens_ok)) FUZZ_CHECK(!ok2);
    if (ok2 && small && tame)
      for (int32_t i = 0; i < B; ++i) FUZZ_CHECK(col[i] == Deal(b.seq_lens[i], sh.world, sh.interleave).count[sh.rank]);
  }

  // dcp_context_lens: decode rows count this step's tokens, prefill rows the context only.
  if (small) {
    const int32_t nd = in.maybe_bad(in.range(0, B));
    auto out = fuzz::canary<int32_t>(static_cast<size_t>(B) * sh.world, -9);
    fuzz::Snapshot s;
    s.add(out);
    const bool ok =
        fuzz::accepted([&] { plan::dcp_context_lens(b.qsl, b.seq_lens, nd, sh.world, sh.interleave, out); }, s);
    bool valid = nd >= 0 && nd <= B && b.qsl[0] == 0;
    for (int32_t r = 0; r < B && valid; ++r) {
      const int64_t q = static_cast<int64_t>(b.qsl[r + 1]) - b.qsl[r];
      valid = q >= 0 && b.seq_lens[r] >= q;
    }
    FUZZ_CHECK(ok == valid);
    if (ok && tame) {
      for (int32_t r = 0; r < B; ++r) {
        const int32_t ctx = r < nd ? b.seq_lens[r] : b.seq_lens[r] - (b.qsl[r + 1] - b.qsl[r]);
        const Deal d(ctx, sh.world, sh.interleave);
        for (int32_t k = 0; k < sh.world; ++k) FUZZ_CHECK(out[static_cast<size_t>(r) * sh.world + k] == d.count[k]);
      }
    }
  }

  // compute_dcp_slot_mapping and check_dcp_block_table.
  if (small) {
    plan::SlotMappingInputs si{b.qsl, b.seq_lens, b.table, b.stride, b.block_size, b.num_blocks};
    const int32_t real = b.qsl.back();
    const size_t n = fuzz::room(static_cast<int64_t>(real) + in.range(-1, 4));
    auto slots = fuzz::canary<int32_t>(n, -9);
    fuzz::Snapshot s;
    s.add(slots);
    int32_t owned = 0;
    const bool ok = fuzz::accepted([&] { owned = plan::compute_dcp_slot_mapping(si, sh, slots); }, s);
    // Naive acceptance: the basic batch rules, and every token this step writes (on any rank)
    // finds its column in the table and a block id in range.
    bool valid = sh.world <= 16 && b.block_size > 0 && b.num_blocks >= 0 && b.qsl[0] == 0 && real >= 0 &&
                 static_cast<size_t>(real) <= n && int64_t{b.num_blocks} * b.block_size <= INT32_MAX;
    for (int32_t r = 0; r < B && valid && tame; ++r) {
      const int64_t q = static_cast<int64_t>(b.qsl[r + 1]) - b.qsl[r];
      valid = q >= 0 && b.seq_lens[r] >= q;
      if (!valid || q == 0) continue;
      const Deal d(b.seq_lens[r], sh.world, sh.interleave);
      for (int64_t pos = b.seq_lens[r] - q; pos < b.seq_lens[r] && valid; ++pos) {
        const int32_t c = d.index[pos] / b.block_size;
        valid = c < b.stride && b.table[static_cast<size_t>(r) * b.stride + c] >= 0 &&
                b.table[static_cast<size_t>(r) * b.stride + c] < b.num_blocks;
      }
    }
    if (tame) FUZZ_CHECK(ok == valid);
    if (ok && tame) {
      int32_t mine = 0;
      for (int32_t r = 0; r < B; ++r) {
        const int32_t q = b.qsl[r + 1] - b.qsl[r];
        const Deal d(b.seq_lens[r], sh.world, sh.interleave);
        for (int32_t t = b.qsl[r]; t < b.qsl[r + 1]; ++t) {
          const int32_t pos = b.seq_lens[r] - q + (t - b.qsl[r]);
          if (d.owner[pos] != sh.rank) {
            FUZZ_CHECK(slots[t] == -1);
            continue;
          }
          ++mine;
          const int32_t li = d.index[pos];
          FUZZ_CHECK(slots[t] == b.table[static_cast<size_t>(r) * b.stride + li / b.block_size] * b.block_size +
                                     li % b.block_size);
        }
      }
      FUZZ_CHECK(owned == mine);
      for (size_t t = real; t < n; ++t) FUZZ_CHECK(slots[t] == -1);
    }
    // check_dcp_block_table: rank 0's whole local sequence (the most tokens) is covered.
    bool tok = true;
    try {
      plan::check_dcp_block_table(si, sh.world, sh.interleave);
    } catch (const InvalidArgument& e) {
      FUZZ_CHECK(e.what()[0] != '\0');
      tok = false;
    }
    bool tvalid = b.block_size > 0 && b.stride >= 0;
    for (int32_t r = 0; r < B && tvalid && tame; ++r) {
      tvalid = b.seq_lens[r] >= 0;
      if (!tvalid) break;
      const int64_t need = (Deal(b.seq_lens[r], sh.world, sh.interleave).count[0] + b.block_size - 1) / b.block_size;
      tvalid = need <= b.stride;
      for (int64_t c = 0; c < need && tvalid; ++c) {
        const int32_t id = b.table[static_cast<size_t>(r) * b.stride + c];
        tvalid = id >= 0 && id < b.num_blocks;
      }
    }
    if (tame) FUZZ_CHECK(tok == tvalid);
  }

  // build_dcp_mtp_mask over the decode-like requests of the batch; the dimensions are sometimes
  // arbitrary int32 (their product must not wrap the capacity check).
  if (small && tame) {
    plan::DcpMtpMaskInputs mi;
    std::vector<int32_t> qlens(B);
    for (int32_t r = 0; r < B; ++r) qlens[r] = std::min(qlen(b, r), 4);
    if (B && in.u8() % 8 == 0) qlens[in.range(0, B - 1)] = in.maybe_bad(2);
    mi.seq_lens = b.seq_lens;
    mi.query_lens = qlens;
    mi.shard = sh;
    const bool raw = in.u8() % 32 == 0;
    mi.max_query_len = raw ? static_cast<int32_t>(in.u32()) : in.maybe_bad(in.range(0, 4));
    int32_t longest = 0;
    for (int32_t L : b.seq_lens) longest = std::max<int32_t>(longest, L > 0 ? Deal(L, sh.world, sh.interleave).count[0] : 0);
    mi.max_kv_len = raw ? static_cast<int32_t>(in.u32()) : in.maybe_bad(longest + in.range(0, 3));
    mi.reproduce_upstream_unmasked_rows = in.flag();
    const __int128 need = static_cast<__int128>(B) * std::max(0, mi.max_query_len) * std::max(0, mi.max_kv_len);
    auto mask = fuzz::canary<uint8_t>(fuzz::room(need > (1 << 20) ? int64_t{1} << 20 : static_cast<int64_t>(need) + in.range(-1, 3)), 7);
    fuzz::Snapshot s;
    s.add(mask);
    const bool ok = fuzz::accepted([&] { plan::build_dcp_mtp_mask(mi, mask); }, s);
    bool valid = mi.max_query_len >= 0 && mi.max_kv_len >= 0 && need <= static_cast<__int128>(mask.size());
    for (int32_t r = 0; r < B && valid; ++r) {
      const int32_t L = b.seq_lens[r], q = qlens[r];
      valid = q >= 0 && q <= mi.max_query_len && L >= q && Deal(L, sh.world, sh.interleave).count[0] <= mi.max_kv_len;
    }
    FUZZ_CHECK(ok == valid);
    if (ok && need > 0) {  // an empty mask (a zero dimension) has nothing to check
      const size_t S = mi.max_query_len, K = mi.max_kv_len;
      for (int32_t r = 0; r < B; ++r) {
        const int32_t L = b.seq_lens[r], q = qlens[r], h = L - q;
        const Deal d(L, sh.world, sh.interleave);
        const int64_t klen = d.count[sh.rank];
        for (size_t j = 0; j < S; ++j) {
          // Local keys at positions <= p = h + j: the last one is upper_j.
          int64_t upper = -1;
          if (static_cast<int64_t>(j) < q)
            for (int32_t x = 0; x <= h + static_cast<int32_t>(j); ++x)
              if (d.owner[x] == sh.rank) upper = d.index[x];
          for (size_t k = 0; k < K; ++k) {
            bool m = static_cast<int64_t>(j) < q && static_cast<int64_t>(k) < klen && static_cast<int64_t>(k) > upper;
            if (upper == -1 && mi.reproduce_upstream_unmasked_rows) m = false;
            FUZZ_CHECK(mask[(static_cast<size_t>(r) * S + j) * K + k] == (m ? 1 : 0));
          }
        }
      }
    }
  }

  // chunked_context_token_indices: the prefill-local rows of the requests with context.
  {
    std::vector<int32_t> qlens(B), ctx(B + (in.u8() % 16 == 0 ? 1 : 0));
    for (int32_t r = 0; r < B; ++r) qlens[r] = qlen(b, r);
    for (int32_t r = 0; r < B; ++r) ctx[r] = clamp32(int64_t{b.seq_lens[r]} - qlens[r]);
    int64_t total = 0;
    bool valid = ctx.size() == qlens.size();
    for (int32_t r = 0; r < B; ++r) {
      valid = valid && qlens[r] >= 0 && ctx[r] >= 0;
      total += std::max(0, qlens[r]);
    }
    const size_t n = fuzz::room(total + in.range(-1, 2));
    valid = valid && static_cast<size_t>(total) <= n;
    auto out = fuzz::canary<int32_t>(n, -9);
    fuzz::Snapshot s;
    s.add(out);
    int32_t count = 0;
    const bool ok = fuzz::accepted([&] { count = plan::chunked_context_token_indices(qlens, ctx, out); }, s);
    FUZZ_CHECK(ok == valid);
    if (ok) {
      int32_t k = 0, tok = 0;
      for (int32_t r = 0; r < B; ++r) {
        for (int32_t j = 0; j < qlens[r]; ++j, ++tok)
          if (ctx[r] > 0) FUZZ_CHECK(out[k++] == tok);
      }
      FUZZ_CHECK(count == k);
      for (size_t i = k; i < n; ++i) FUZZ_CHECK(out[i] == -9);
    }
  }
  return 0;
}
