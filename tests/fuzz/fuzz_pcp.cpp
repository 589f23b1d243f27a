// The legacy PCP split (plan/pcp_split.h, DualChunkSwap with padding): pcp_split_sizes,
// pcp_local_tokens, pcp_pad_counts, pcp_restore_index, pcp_unpad_mask, pcp_padded_slot_mapping,
// pcp_chunk_restore_index, pcp_head_tail_counts / _indices. The naive model builds every rank's
// local buffer explicitly as a list of (request, position) tokens, gathers them rank-major and
// lays the padded-global buffer out request by request, then reads every index list off those
// lists by search (no closed-form offsets).
#include <map>
#include <utility>

#include "ascend_attn_rt/cp/plan/pcp_split.h"
#include "fuzz_util.h"

using namespace aar;

namespace {

struct Tok {
  int32_t req, pos, copy;  // copy: the rank whose copy of a decode token this is (0 for prefills)
  bool operator<(const Tok& o) const {
    return std::make_tuple(req, pos, copy) < std::make_tuple(o.req, o.pos, o.copy);
  }
};

struct Model {
  int32_t wp = 1, nd = 0;
  std::vector<int32_t> q, c;
  std::vector<std::vector<Tok>> local;  // per rank
  std::vector<Tok> global;              // padded-global order
  Model(const std::vector<int32_t>& ql, int32_t num_decodes, int32_t pcp) : wp(pcp), nd(num_decodes), q(ql) {
    local.resize(wp);
    for (int32_t i = 0; i < static_cast<int32_t>(q.size()); ++i) {
      if (i < nd) {
        c.push_back(0);
        for (int32_t r = 0; r < wp; ++r)
          for (int32_t t = 0; t < q[i]; ++t) local[r].push_back({i, t, r});
        for (int32_t t = 0; t < q[i]; ++t)
          for (int32_t r = 0; r < wp; ++r) global.push_back({i, t, r});
        continue;
      }
      int32_t P = 0;
      while (P < q[i]) P += 2 * wp;
      const int32_t ci = P / (2 * wp);
      c.push_back(ci);
      for (int32_t r = 0; r < wp; ++r) {
        for (int32_t t = 0; t < ci; ++t) local[r].push_back({i, r * ci + t, 0});
        for (int32_t t = 0; t < ci; ++t) local[r].push_back({i, (2 * wp - 1 - r) * ci + t, 0});
      }
      for (int32_t x = 0; x < P; ++x) global.push_back({i, x, 0});
    }
  }
  int32_t td() const {
    int32_t s = 0;
    for (int32_t i = 0; i < nd; ++i) s += q[i];
    return s;
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Bytes in(data, size);
  const int32_t N = in.range(0, 6);
  std::vector<int32_t> ql(N);
  int32_t nd = in.range(0, N);
  for (int32_t i = 0; i < N; ++i) ql[i] = i < nd ? in.range(0, 3) : in.range(0, 40);
  if (N && in.u8() % 10 == 0) ql[in.range(0, N - 1)] = in.maybe_bad(5);
  if (in.u8() % 10 == 0) nd = in.maybe_bad(nd);
  const int32_t wp_valid = in.range(1, 4);
  plan::PcpSplitInputs pin;
  pin.query_lens = ql;
  pin.num_decodes = nd;
  pin.pcp_size = in.u8() % 12 == 0 ? in.maybe_bad(wp_valid) : wp_valid;
  const int32_t rank = in.u8() % 12 == 0 ? in.maybe_bad(wp_valid - 1) : in.range(0, wp_valid - 1);

  bool valid = pin.pcp_size >= 1 && nd >= 0 && nd <= N;
  int64_t sched = 0;
  for (int32_t v : ql) valid = valid && v >= 0, sched += std::max(0, v);
  plan::PcpSplitSizes s;
  fuzz::Snapshot none;
  const bool ok = fuzz::accepted([&] { s = plan::pcp_split_sizes(pin); }, none);
  if (!valid) FUZZ_CHECK(!ok);
  if (!ok) {
    // Every function makes the same checks before writing.
    auto a = fuzz::canary<int32_t>(64, -9), b2 = fuzz::canary<int32_t>(64, -9);
    fuzz::Snapshot sn;
    sn.add(a), sn.add(b2);
    FUZZ_CHECK(!fuzz::accepted([&] { plan::pcp_local_tokens(pin, rank, a, b2); }, sn));
    FUZZ_CHECK(!fuzz::accepted([&] { plan::pcp_restore_index(pin, a); }, sn));
    FUZZ_CHECK(!fuzz::accepted([&] { plan::pcp_chunk_restore_index(pin, a, b2); }, sn));
    return 0;
  }
  // A huge accepted pcp_size (only an empty batch fits int32 then) is checked for acceptance,
  // not modelled rank by rank.
  if (pin.pcp_size > 64) {
    auto a = fuzz::canary<int32_t>(64, -9), b2 = fuzz::canary<int32_t>(64, -9);
    fuzz::Snapshot sn;
    sn.add(a), sn.add(b2);
    fuzz::accepted([&] { plan::pcp_local_tokens(pin, rank, a, b2); }, sn);
    fuzz::accepted([&] { plan::pcp_head_tail_counts(pin, rank); }, sn);
    fuzz::accepted([&] { plan::pcp_restore_index(pin, a); }, sn);
    return 0;
  }
  if (sched > 4096) return 0;  // a corrupted (huge) but int32-sized batch: acceptance only
  const Model m(ql, nd, pin.pcp_size);
  const int32_t wp = pin.pcp_size, td = m.td();
  const int32_t tloc = static_cast<int32_t>(m.local[0].size());
  FUZZ_CHECK(s.num_reqs == N && s.num_decode_tokens == td && s.local_tokens == tloc);
  FUZZ_CHECK(s.local_prefill_tokens == tloc - td && s.padded_global_tokens == wp * tloc);
  FUZZ_CHECK(static_cast<int64_t>(m.global.size()) == int64_t{wp} * tloc);
  for (const auto& l : m.local) FUZZ_CHECK(static_cast<int32_t>(l.size()) == tloc);
  auto short_by = [&](int64_t n) { return fuzz::room(in.u8() % 16 == 0 ? n - 1 : n); };

  // Local tokens of `rank`.
  {
    auto lens = fuzz::canary<int32_t>(short_by(N), -9), pos = fuzz::canary<int32_t>(short_by(tloc), -9);
    fuzz::Snapshot sn;
    sn.add(lens), sn.add(pos);
    const bool ok2 = fuzz::accepted([&] { plan::pcp_local_tokens(pin, rank, lens, pos); }, sn);
    if (rank < 0 || rank >= wp || lens.size() < size_t(N) || pos.size() < size_t(tloc)) FUZZ_CHECK(!ok2);
    if (ok2) {
      for (int32_t i = 0; i < N; ++i) FUZZ_CHECK(lens[i] == (i < nd ? ql[i] : 2 * m.c[i]));
      for (int32_t t = 0; t < tloc; ++t) FUZZ_CHECK(pos[t] == m.local[rank][t].pos);
    }
  }
  // Pads.
  {
    auto pads = fuzz::canary<int32_t>(short_by(N), -9);
    fuzz::Snapshot sn;
    sn.add(pads);
    if (fuzz::accepted([&] { plan::pcp_pad_counts(pin, pads); }, sn)) {
      for (int32_t i = 0; i < N; ++i) FUZZ_CHECK(pads[i] == (i < nd ? (wp - 1) * ql[i] : 2 * wp * m.c[i] - ql[i]));
    } else {
      FUZZ_CHECK(pads.size() < size_t(N));
    }
  }
  // Restore index, unpad mask and padded slots over the padded-global buffer.
  std::map<Tok, int32_t> grow;  // token -> its row in the rank-major gather G
  for (int32_t r = 0; r < wp; ++r)
    for (int32_t t = 0; t < tloc; ++t) {
      Tok k = m.local[r][t];
      grow[k] = r * tloc + t;
    }
  const size_t G = m.global.size();
  {
    auto restore = fuzz::canary<int32_t>(short_by(G), -9);
    fuzz::Snapshot sn;
    sn.add(restore);
    if (fuzz::accepted([&] { plan::pcp_restore_index(pin, restore); }, sn)) {
      for (size_t g = 0; g < G; ++g) {
        Tok k = m.global[g];
        if (k.req >= nd) k.copy = 0;
        FUZZ_CHECK(grow.count(k) && restore[g] == grow[k]);
      }
    } else {
      FUZZ_CHECK(restore.size() < G);
    }
    auto mask = fuzz::canary<uint8_t>(short_by(G), 7);
    fuzz::Snapshot sm;
    sm.add(mask);
    if (fuzz::accepted([&] { plan::pcp_unpad_mask(pin, mask); }, sm)) {
      for (size_t g = 0; g < G; ++g) {
        const Tok& k = m.global[g];
        const bool real = k.req < nd ? k.copy == 0 : k.pos < ql[k.req];
        FUZZ_CHECK(mask[g] == (real ? 1 : 0));
      }
    } else {
      FUZZ_CHECK(mask.size() < G);
    }
    // token_slots: one per scheduled token, a recognisable value; sometimes the wrong count.
    std::vector<int32_t> tslots(static_cast<size_t>(sched) + (in.u8() % 16 == 0 ? 1 : 0));
    for (size_t i = 0; i < tslots.size(); ++i) tslots[i] = 1000 + static_cast<int32_t>(i);
    std::vector<int32_t> first(N + 1, 0);
    for (int32_t i = 0; i < N; ++i) first[i + 1] = first[i] + ql[i];
    auto slots = fuzz::canary<int32_t>(short_by(G), -9);
    fuzz::Snapshot ss;
    ss.add(slots);
    if (fuzz::accepted([&] { plan::pcp_padded_slot_mapping(pin, tslots, slots); }, ss)) {
      FUZZ_CHECK(tslots.size() == static_cast<size_t>(sched));
      for (size_t g = 0; g < G; ++g) {
        const Tok& k = m.global[g];
        const bool real = k.req < nd ? k.copy == 0 : k.pos < ql[k.req];
        FUZZ_CHECK(slots[g] == (real ? tslots[first[k.req] + k.pos] : -1));
      }
    } else {
      FUZZ_CHECK(slots.size() < G || tslots.size() != static_cast<size_t>(sched));
    }
  }
  // Prefill-only permutations: G' (rank-major prefill locals) against the prefill region.
  {
    const int32_t tpl = tloc - td;
    std::map<Tok, int32_t> prow;
    for (int32_t r = 0; r < wp; ++r)
      for (int32_t t = td; t < tloc; ++t) prow[m.local[r][t]] = r * tpl + (t - td);
    const size_t rows = static_cast<size_t>(wp) * tpl;
    auto rec = fuzz::canary<int32_t>(short_by(rows), -9), inv = fuzz::canary<int32_t>(short_by(rows), -9);
    fuzz::Snapshot sn;
    sn.add(rec), sn.add(inv);
    if (fuzz::accepted([&] { plan::pcp_chunk_restore_index(pin, rec, inv); }, sn)) {
      const size_t off = static_cast<size_t>(wp) * td;
      FUZZ_CHECK(G - off == rows);
      for (size_t j = 0; j < rows; ++j) {
        const Tok& k = m.global[off + j];
        FUZZ_CHECK(prow.count(k) && rec[j] == prow[k]);
        FUZZ_CHECK(inv[rec[j]] == static_cast<int32_t>(j));
      }
    } else {
      FUZZ_CHECK(rec.size() < rows || inv.size() < rows);
    }
  }
  // Head/tail lists of `rank`.
  {
    plan::PcpHeadTailCounts n;
    fuzz::Snapshot sn0;
    const bool okc = fuzz::accepted([&] { n = plan::pcp_head_tail_counts(pin, rank); }, sn0);
    FUZZ_CHECK(okc == (rank >= 0 && rank < wp));
    if (!okc) return 0;
    const int32_t head = rank, tail = 2 * wp - 1 - rank;
    std::vector<int32_t> qh, qt, khn, khm, ktn, ktm, qf;
    std::vector<int64_t> me, he, te;
    int32_t qo = 0, ko = 0, np = 0, ct = 0;
    for (int32_t i = nd; i < N; ++i) ct += m.c[i];
    for (int32_t i = nd; i < N; ++i, ++np) {
      const int32_t c = m.c[i];
      for (int32_t t = 0; t < c; ++t) {
        qh.push_back(qo + t), qt.push_back(qo + c + t);
        khm.push_back(ko + head * c + t), ktm.push_back(ko + tail * c + t);
      }
      for (int32_t t = 0; t < head * c; ++t) khn.push_back(ko + t);
      for (int32_t t = 0; t < tail * c; ++t) ktn.push_back(ko + t);
      me.push_back((me.empty() ? 0 : me.back()) + c);
      he.push_back((he.empty() ? 0 : he.back()) + int64_t{head} * c);
      te.push_back((te.empty() ? 0 : te.back()) + int64_t{tail} * c);
      qo += 2 * c;
      ko += 2 * c * wp;
    }
    // concat(head rows, tail rows)[q_full] = local order.
    qf.assign(qo, -1);
    for (size_t j = 0; j < qh.size(); ++j) qf[qh[j]] = static_cast<int32_t>(j);
    for (size_t j = 0; j < qt.size(); ++j) qf[qt[j]] = static_cast<int32_t>(qh.size() + j);
    FUZZ_CHECK(n.num_prefills == np && n.chunk_tokens == ct);
    FUZZ_CHECK(n.head_nomask_tokens == static_cast<int32_t>(khn.size()) &&
               n.tail_nomask_tokens == static_cast<int32_t>(ktn.size()));
    auto v32 = [&](size_t len) { return fuzz::canary<int32_t>(short_by(len), -9); };
    auto v64 = [&](size_t len) { return fuzz::canary<int64_t>(short_by(len), -9); };
    auto a = v32(ct), b2 = v32(ct), c2 = v32(khn.size()), d = v32(ct), e = v32(ktn.size()), f = v32(ct),
         g = v32(2 * size_t(ct));
    auto h = v64(np), i2 = v64(np), j2 = v64(np);
    fuzz::Snapshot sn;
    sn.add(a), sn.add(b2), sn.add(c2), sn.add(d), sn.add(e), sn.add(f), sn.add(g), sn.add(h), sn.add(i2), sn.add(j2);
    plan::PcpHeadTailBuffers buf{a, b2, c2, d, e, f, g, h, i2, j2};
    const bool room = a.size() >= size_t(ct) && b2.size() >= size_t(ct) && c2.size() >= khn.size() &&
                      d.size() >= size_t(ct) && e.size() >= ktn.size() && f.size() >= size_t(ct) &&
                      g.size() >= 2 * size_t(ct) && h.size() >= size_t(np) && i2.size() >= size_t(np) &&
                      j2.size() >= size_t(np);
    const bool ok3 = fuzz::accepted([&] { plan::pcp_head_tail_indices(pin, rank, buf); }, sn);
    FUZZ_CHECK(ok3 == room);
    if (!ok3) return 0;
    auto same = [](const auto& got, const auto& want) {
      for (size_t k = 0; k < want.size(); ++k)
        if (got[k] != want[k]) return false;
      return true;
    };
    FUZZ_CHECK(same(a, qh) && same(b2, qt) && same(c2, khn) && same(d, khm) && same(e, ktn) && same(f, ktm));
    FUZZ_CHECK(same(g, qf) && same(h, me) && same(i2, he) && same(j2, te));
  }
  return 0;
}
