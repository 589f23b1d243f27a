// The model-runner-v2 PCP partition (plan/pcp_segments.h) and the GQA PCP step pieces
// (plan/pcp_step_plan.h): pcp_padded_local_tokens, pcp_rank_segments,
// pcp_segment_gather_indices, pcp_expanded_slot_mapping, pcp_split_flags, pcp_local_batch.
// The naive model lists every rank's candidate segments per request, moves the pure prefills
// last with a stable partition, and reads the gather / restore / slot lists off the rows it
// lays out; it also checks that the split rows of every rank partition each split request.
// pcp_local_batch's `segments` is scratch (its content is unspecified after a rejection), so
// it is not in the snapshot.
#include <algorithm>

#include "ascend_attn_rt/cp/plan/pcp_step_plan.h"
#include "fuzz_util.h"

using namespace aar;

namespace {

struct Seg {
  int32_t req, token_begin, num_tokens, start_pos;
  bool pure;
};

std::vector<Seg> naive_segments(const std::vector<int32_t>& qsl, const std::vector<int32_t>& comp,
                                const std::vector<uint8_t>& pre, int32_t wp, int32_t rank) {
  std::vector<Seg> all;
  for (size_t i = 0; i + 1 < qsl.size(); ++i) {
    const int32_t q = qsl[i + 1] - qsl[i];
    if (q == 0) continue;
    if (!pre[i]) {
      all.push_back({static_cast<int32_t>(i), qsl[i], q, comp[i], false});
      continue;
    }
    int32_t chunk = 0;
    while (int64_t{chunk} * 2 * wp < q) ++chunk;  // ceil(q / 2Wp)
    for (int32_t idx : {rank, 2 * wp - 1 - rank}) {
      const int64_t off = int64_t{idx} * chunk;
      const int64_t len = std::min<int64_t>(chunk, q - off);
      if (len <= 0) continue;
      const int32_t start = comp[i] + static_cast<int32_t>(off);
      all.push_back({static_cast<int32_t>(i), qsl[i] + static_cast<int32_t>(off), static_cast<int32_t>(len), start,
                     start == 0});
    }
  }
  std::stable_partition(all.begin(), all.end(), [](const Seg& s) { return !s.pure; });
  return all;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Bytes in(data, size);
  fuzz::Batch b = fuzz::make_batch(in, 6, 30, 200);
  fuzz::current_batch() = &b;
  const int32_t N = b.B();
  std::vector<int32_t> comp(N);
  std::vector<uint8_t> pre(N);
  for (int32_t i = 0; i < N; ++i) {
    const int64_t ctx = int64_t{b.seq_lens[i]} - std::max<int64_t>(0, int64_t{b.qsl[i + 1]} - b.qsl[i]);
    comp[i] = in.flag() ? 0 : static_cast<int32_t>(std::clamp<int64_t>(ctx, 0, INT32_MAX));
    pre[i] = in.flag();
  }
  if (N && in.u8() % 12 == 0) comp[in.range(0, N - 1)] = in.maybe_bad(3);
  if (in.u8() % 16 == 0) pre.push_back(1);
  const int32_t wp_valid = in.range(1, 4);
  plan::PcpSegmentInputs si;
  si.query_start_loc = b.qsl;
  si.num_computed_tokens = comp;
  si.is_prefilling = pre;
  si.pcp_size = in.u8() % 12 == 0 ? in.maybe_bad(wp_valid) : wp_valid;
  const int32_t rank = in.u8() % 12 == 0 ? in.maybe_bad(wp_valid - 1) : in.range(0, wp_valid - 1);

  bool valid = si.pcp_size >= 1 && pre.size() == size_t(N) && b.qsl[0] == 0;
  for (int32_t i = 0; i < N && valid; ++i) {
    const int64_t q = int64_t{b.qsl[i + 1]} - b.qsl[i];
    valid = q >= 0 && comp[i] >= 0 && comp[i] + q <= INT32_MAX;
  }
  int32_t P = 0;
  fuzz::Snapshot none;
  const bool ok = fuzz::accepted([&] { P = plan::pcp_padded_local_tokens(si); }, none);
  if (!valid) FUZZ_CHECK(!ok);
  // pcp_split_flags checks query_start_loc and the flags only.
  {
    const bool fvalid = b.qsl[0] == 0 && std::is_sorted(b.qsl.begin(), b.qsl.end()) &&
                        (pre.empty() || pre.size() == size_t(N));
    auto flags = fuzz::canary<uint8_t>(N && in.u8() % 16 == 0 ? N - 1 : N, 7);
    fuzz::Snapshot sn;
    sn.add(flags);
    int32_t first = 0;
    const bool fok = fuzz::accepted([&] { first = plan::pcp_split_flags(b.qsl, pre, flags); }, sn);
    FUZZ_CHECK(fok == (fvalid && flags.size() >= size_t(N)));
    if (fok) {
      int32_t f = N;
      for (int32_t i = 0; i < N && f == N; ++i)
        if (b.qsl[i + 1] - b.qsl[i] > 1 || (!pre.empty() && pre[i])) f = i;
      FUZZ_CHECK(first == f);
      for (int32_t i = 0; i < N; ++i) FUZZ_CHECK(flags[i] == (i >= f ? 1 : 0));
    }
  }
  if (!ok) {
    std::vector<plan::PcpSegment> segs(std::max(1, 2 * N));
    auto a = fuzz::canary<int32_t>(256, -9), c = fuzz::canary<int32_t>(256, -9);
    auto m = fuzz::canary<uint8_t>(256, 7);
    fuzz::Snapshot sn;
    sn.add(a), sn.add(c), sn.add(m);
    FUZZ_CHECK(!fuzz::accepted([&] { plan::pcp_segment_gather_indices(si, a, c, m); }, sn));
    return 0;
  }
  if (si.pcp_size > 64 || b.qsl.back() > 4096) return 0;  // acceptance only for huge shapes
  const int32_t wp = si.pcp_size;
  // Rows of every rank.
  std::vector<std::vector<Seg>> rs(wp);
  int32_t maxloc = 0;
  for (int32_t r = 0; r < wp; ++r) {
    rs[r] = naive_segments(b.qsl, comp, pre, wp, r);
    int32_t t = 0;
    for (const Seg& s : rs[r]) t += s.num_tokens;
    maxloc = std::max(maxloc, t);
  }
  FUZZ_CHECK(P == maxloc);
  // Every split request is partitioned by the ranks' split rows.
  for (int32_t i = 0; i < N; ++i) {
    if (!pre[i]) continue;
    std::vector<int32_t> seen(b.qsl[i + 1] - b.qsl[i], 0);
    for (int32_t r = 0; r < wp; ++r)
      for (const Seg& s : rs[r])
        if (s.req == i)
          for (int32_t k = 0; k < s.num_tokens; ++k) ++seen[s.token_begin - b.qsl[i] + k];
    for (int32_t v : seen) FUZZ_CHECK(v == 1);
  }
  // pcp_rank_segments.
  if (rank >= 0 && rank < wp) {
    std::vector<plan::PcpSegment> segs(std::max(1, 2 * N) - (in.u8() % 16 == 0 ? 1 : 0));
    fuzz::Snapshot sn;
    int32_t cnt = 0;
    const bool sok = fuzz::accepted([&] { cnt = plan::pcp_rank_segments(si, rank, segs); }, sn);
    FUZZ_CHECK(sok == (segs.size() >= size_t(std::max(1, 2 * N))));
    if (sok) {
      const auto& want = rs[rank];
      if (want.empty()) {
        FUZZ_CHECK(cnt == 1 && segs[0].req == 0 && segs[0].num_tokens == 0 && segs[0].local_begin == 0);
        FUZZ_CHECK(segs[0].start_pos == (N ? comp[0] : 0));
      } else {
        FUZZ_CHECK(cnt == static_cast<int32_t>(want.size()));
        int32_t loc = 0;
        for (int32_t k = 0; k < cnt; ++k) {
          FUZZ_CHECK(segs[k].req == want[k].req && segs[k].token_begin == want[k].token_begin);
          FUZZ_CHECK(segs[k].num_tokens == want[k].num_tokens && segs[k].start_pos == want[k].start_pos);
          FUZZ_CHECK(segs[k].local_begin == loc);
          loc += want[k].num_tokens;
        }
      }
    }
  } else {
    std::vector<plan::PcpSegment> segs(std::max(1, 2 * N));
    fuzz::Snapshot sn;
    FUZZ_CHECK(!fuzz::accepted([&] { plan::pcp_rank_segments(si, rank, segs); }, sn));
  }
  // Gather indices and the expanded slot mapping.
  const int32_t T = b.qsl.back();
  const size_t rows = static_cast<size_t>(wp) * P;
  std::vector<int32_t> restore(T, -1), gather(rows, 0), eslots(rows, -1);
  std::vector<uint8_t> wmask(rows, 0);
  std::vector<int32_t> tslots(T);
  for (int32_t t = 0; t < T; ++t) tslots[t] = 5000 + t;
  for (int32_t r = 0; r < wp; ++r) {
    int32_t loc = 0;
    for (const Seg& s : rs[r]) {
      const bool write = pre[s.req] || r == 0;
      for (int32_t k = 0; k < s.num_tokens; ++k, ++loc) {
        const size_t row = static_cast<size_t>(r) * P + loc;
        gather[row] = s.token_begin + k;
        if (!write) continue;
        wmask[row] = 1;
        restore[s.token_begin + k] = static_cast<int32_t>(row);
        eslots[row] = tslots[s.token_begin + k];
      }
    }
  }
  for (int32_t v : restore) FUZZ_CHECK(v >= 0);  // every global token has a written row
  auto short_by = [&](size_t n) { return in.u8() % 16 == 0 && n ? n - 1 : n; };
  {
    auto hr = fuzz::canary<int32_t>(short_by(T), -9), pg = fuzz::canary<int32_t>(short_by(rows), -9);
    auto km = fuzz::canary<uint8_t>(short_by(rows), 7);
    fuzz::Snapshot sn;
    sn.add(hr), sn.add(pg), sn.add(km);
    const bool gok = fuzz::accepted([&] { plan::pcp_segment_gather_indices(si, hr, pg, km); }, sn);
    FUZZ_CHECK(gok == (hr.size() >= size_t(T) && pg.size() >= rows && km.size() >= rows));
    if (gok) {
      for (int32_t t = 0; t < T; ++t) FUZZ_CHECK(hr[t] == restore[t]);
      for (size_t r = 0; r < rows; ++r) FUZZ_CHECK(pg[r] == gather[r] && km[r] == wmask[r]);
    }
    std::vector<int32_t> ts = tslots;
    if (in.u8() % 16 == 0) ts.push_back(0);
    auto es = fuzz::canary<int32_t>(short_by(rows), -9);
    fuzz::Snapshot se;
    se.add(es);
    const bool eok = fuzz::accepted([&] { plan::pcp_expanded_slot_mapping(si, ts, es); }, se);
    FUZZ_CHECK(eok == (ts.size() == size_t(T) && es.size() >= rows));
    if (eok)
      for (size_t r = 0; r < rows; ++r) FUZZ_CHECK(es[r] == eslots[r]);
  }
  // pcp_local_batch of `rank`.
  if (rank >= 0 && rank < wp) {
    const int32_t st = b.stride;
    const size_t k = std::max<size_t>(1, rs[rank].size());
    std::vector<plan::PcpSegment> segs(std::max(1, 2 * N));
    auto lq = fuzz::canary<int32_t>(short_by(k + 1), -9), ls = fuzz::canary<int32_t>(short_by(k), -9);
    auto lt = fuzz::canary<int32_t>(k * st, -9);
    auto lp = fuzz::canary<uint8_t>(short_by(k), 7);
    fuzz::Snapshot sn;
    sn.add(lq), sn.add(ls), sn.add(lt), sn.add(lp);
    int32_t nrows = 0;
    const bool lok = fuzz::accepted(
        [&] { nrows = plan::pcp_local_batch(si, rank, b.table, st, {lq, ls, lt, lp, segs}); }, sn);
    FUZZ_CHECK(lok == (lq.size() >= k + 1 && ls.size() >= k && lp.size() >= k));
    if (lok) {
      FUZZ_CHECK(nrows == static_cast<int32_t>(k) && lq[0] == 0);
      for (size_t i = 0; i < rs[rank].size(); ++i) {
        const Seg& s = rs[rank][i];
        FUZZ_CHECK(lq[i + 1] - lq[i] == s.num_tokens && ls[i] == s.start_pos + s.num_tokens);
        FUZZ_CHECK(lp[i] == pre[s.req]);
        for (int32_t c = 0; c < st; ++c) FUZZ_CHECK(lt[i * st + c] == b.table[static_cast<size_t>(s.req) * st + c]);
      }
      if (rs[rank].empty()) {
        FUZZ_CHECK(lq[1] == 0 && ls[0] == (N ? comp[0] : 0) && lp[0] == (N ? pre[0] : 0));
        for (int32_t c = 0; c < st; ++c) FUZZ_CHECK(lt[c] == (N ? b.table[c] : 0));
      }
    }
  }
  return 0;
}
