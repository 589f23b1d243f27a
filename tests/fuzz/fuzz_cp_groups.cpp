// The CP process-group layout (plan/cp_groups.h): validate_cp_layout, cp_rank_place,
// cp_num_groups / cp_group_size / cp_group_ranks and cp_max_blocks_per_request. The naive
// model lays the ranks out as an explicit 5-d array arange(world).reshape(ext, DP, PP, PCP, TP)
// and collects the groups from it (TP: the last axis; DCP: Wd-long runs of a TP group; PCP:
// the PCP axis at a fixed (ext, DP, PP, TP index)), numbered in row order; every group list and
// every rank's place must match it, and the groups of each kind must partition the ranks.
#include <map>

#include "ascend_attn_rt/cp/plan/cp_groups.h"
#include "fuzz_util.h"

using namespace aar;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Bytes in(data, size);
  plan::CpLayoutConfig c;
  const int32_t pick[] = {1, 1, 2, 2, 4, 8, 3, 16};
  c.tensor_parallel_size = pick[in.u8() % 8];
  c.decode_context_parallel_size = pick[in.u8() % 6];
  c.prefill_context_parallel_size = pick[in.u8() % 6];
  c.data_parallel_size = pick[in.u8() % 4];
  c.pipeline_parallel_size = pick[in.u8() % 4];
  const int32_t ext = in.range(1, 2);
  c.world_size = ext * c.data_parallel_size * c.pipeline_parallel_size * c.prefill_context_parallel_size *
                 c.tensor_parallel_size;
  c.pcp_kv_mode = in.flag() ? plan::PcpKvMode::Replicated : plan::PcpKvMode::Sharded;
  c.use_mla = in.flag();
  c.total_num_kv_heads = c.use_mla ? 0 : pick[in.u8() % 8];
  c.total_num_q_heads = std::max(1, c.total_num_kv_heads) * pick[in.u8() % 8] * in.range(1, 2);
  c.block_size = pick[in.u8() % 8] * 16;
  c.interleave_size = in.flag() ? c.block_size : pick[in.u8() % 6];
  c.has_kv_connector = in.u8() % 4 == 0;
  c.sfa_sharded_indexer = in.u8() % 4 == 0;
  // One corruption.
  int32_t* fields[] = {&c.world_size, &c.data_parallel_size, &c.pipeline_parallel_size,
                       &c.prefill_context_parallel_size, &c.tensor_parallel_size, &c.decode_context_parallel_size,
                       &c.total_num_q_heads, &c.total_num_kv_heads, &c.block_size, &c.interleave_size};
  const uint8_t f = in.u8();
  if (f < 10 * 6) *fields[f % 10] = in.maybe_bad(*fields[f % 10]);
  if (in.u8() % 32 == 0) c.pcp_kv_mode = static_cast<plan::PcpKvMode>(in.range(-1, 3));

  bool ok = true;
  try {
    plan::validate_cp_layout(c);
  } catch (const InvalidArgument& e) {
    FUZZ_CHECK(e.what()[0] != '\0');
    ok = false;
  } catch (const NotSupported& e) {
    // Only the replicated-KV PCP with DCP > 1.
    FUZZ_CHECK(c.pcp_kv_mode == plan::PcpKvMode::Replicated && c.prefill_context_parallel_size > 1 &&
               c.decode_context_parallel_size > 1);
    ok = false;
  }
  const int32_t W = c.world_size, TP = c.tensor_parallel_size, WD = c.decode_context_parallel_size,
                WP = c.prefill_context_parallel_size;
  // Rules a layout must meet whatever else the validator adds.
  const bool sizes_ok = W >= 1 && c.data_parallel_size >= 1 && c.pipeline_parallel_size >= 1 && WP >= 1 &&
                        TP >= 1 && WD >= 1;
  if (!sizes_ok || W % (int64_t{c.data_parallel_size} * c.pipeline_parallel_size * WP * TP) != 0 || TP % WD != 0 ||
      c.block_size < 1 || c.interleave_size < 1 || c.block_size % c.interleave_size != 0 ||
      (c.pcp_kv_mode == plan::PcpKvMode::Sharded ? int64_t{WP} * WD : WD) > plan::kMaxCpMergePartitions ||
      (c.use_mla && c.total_num_kv_heads != 0) || c.total_num_q_heads < 1 ||
      (c.pcp_kv_mode != plan::PcpKvMode::Sharded && c.pcp_kv_mode != plan::PcpKvMode::Replicated))
    FUZZ_CHECK(!ok);

  // cp_max_blocks_per_request on its own (any int64 length).
  {
    const uint8_t lk = in.u8() % 8;
    const int64_t len = lk == 0   ? INT64_MAX - in.u8()
                        : lk < 4 ? static_cast<int64_t>(in.u32()) << (in.u8() % 31)
                                 : in.range(-1, 100000);
    const int32_t bs = in.maybe_bad(c.block_size > 0 ? c.block_size : 16), ks = in.maybe_bad(in.range(1, 16));
    int32_t blocks = -1;
    bool bok = true;
    try {
      blocks = plan::cp_max_blocks_per_request(len, bs, ks);
    } catch (const InvalidArgument& e) {
      FUZZ_CHECK(e.what()[0] != '\0');
      bok = false;
    }
    const __int128 vb = static_cast<__int128>(bs) * ks;
    const bool args = len >= 0 && bs >= 1 && ks >= 1;
    if (!args) FUZZ_CHECK(!bok);
    if (args) {
      const __int128 want = (static_cast<__int128>(len) + vb - 1) / vb;
      FUZZ_CHECK(bok == (want <= INT32_MAX));
      if (bok) FUZZ_CHECK(blocks == want);
    }
  }
  if (!ok) {
    std::vector<int32_t> ranks(64, -9);
    fuzz::Snapshot s;
    s.add(ranks);
    try {
      plan::cp_group_ranks(c, plan::CpGroupKind::Tp, 0, ranks);
      FUZZ_CHECK(false);
    } catch (const InvalidArgument&) {
      FUZZ_CHECK(s.unchanged());
    } catch (const NotSupported&) {
      FUZZ_CHECK(s.unchanged());
    }
    return 0;
  }
  if (W > 4096) return 0;  // e.g. world = INT32_MAX (a prime) with every size 1: acceptance only
  // The explicit array: rank = (((e * DP + d) * PP + p) * WP + pp) * TP + t.
  const int32_t outer = W / (WP * TP);  // ext * DP * PP
  std::map<plan::CpGroupKind, std::vector<std::vector<int32_t>>> groups;
  for (int32_t o = 0; o < outer; ++o)
    for (int32_t pp = 0; pp < WP; ++pp) {
      std::vector<int32_t> tpg;
      for (int32_t t = 0; t < TP; ++t) tpg.push_back((o * WP + pp) * TP + t);
      groups[plan::CpGroupKind::Tp].push_back(tpg);
      for (int32_t k = 0; k < TP; k += WD)
        groups[plan::CpGroupKind::Dcp].push_back(std::vector<int32_t>(tpg.begin() + k, tpg.begin() + k + WD));
    }
  for (int32_t o = 0; o < outer; ++o)
    for (int32_t t = 0; t < TP; ++t) {
      std::vector<int32_t> g;
      for (int32_t pp = 0; pp < WP; ++pp) g.push_back((o * WP + pp) * TP + t);
      groups[plan::CpGroupKind::Pcp].push_back(g);
    }
  // Row order of reshape(-1, size): sort each kind's groups by their first rank.
  for (auto& [kind, gs] : groups) std::sort(gs.begin(), gs.end());
  for (auto& kv : groups) {
    const plan::CpGroupKind kind = kv.first;
    const auto& gs = kv.second;
    const int32_t ngroups = static_cast<int32_t>(gs.size());
    FUZZ_CHECK(plan::cp_num_groups(c, kind) == static_cast<int32_t>(gs.size()));
    const int32_t gsize = plan::cp_group_size(c, kind);
    std::vector<int32_t> seen(W, 0);
    for (int32_t gi = 0; gi < static_cast<int32_t>(gs.size()); ++gi) {
      std::vector<int32_t> out(gsize + 1, -9);
      plan::cp_group_ranks(c, kind, gi, out);
      FUZZ_CHECK(static_cast<int32_t>(gs[gi].size()) == gsize);
      for (int32_t k = 0; k < gsize; ++k) {
        FUZZ_CHECK(out[k] == gs[gi][k]);
        ++seen[out[k]];
      }
      FUZZ_CHECK(out[gsize] == -9);
    }
    for (int32_t v : seen) FUZZ_CHECK(v == 1);
    // Out-of-range group index and a short buffer are rejected untouched.
    std::vector<int32_t> shortb(std::max(0, gsize - 1), -9);
    fuzz::Snapshot s;
    s.add(shortb);
    FUZZ_CHECK(!fuzz::accepted([&] { plan::cp_group_ranks(c, kind, 0, shortb); }, s));
    std::vector<int32_t> full(gsize, -9);
    fuzz::Snapshot s2;
    s2.add(full);
    FUZZ_CHECK(!fuzz::accepted([&] { plan::cp_group_ranks(c, kind, ngroups, full); }, s2));
    FUZZ_CHECK(!fuzz::accepted([&] { plan::cp_group_ranks(c, kind, -1, full); }, s2));
  }
  // Places: a rank's index in each group it belongs to.
  auto where = [&](plan::CpGroupKind kind, int32_t r, int32_t& gi, int32_t& pos) {
    const auto& gs = groups[kind];
    for (gi = 0; gi < static_cast<int32_t>(gs.size()); ++gi)
      for (pos = 0; pos < static_cast<int32_t>(gs[gi].size()); ++pos)
        if (gs[gi][pos] == r) return;
    FUZZ_CHECK(false);
  };
  for (int32_t r = 0; r < W; r += std::max(1, W / 7)) {
    const plan::CpRankPlace p = plan::cp_rank_place(c, r);
    int32_t g = 0, k = 0;
    where(plan::CpGroupKind::Tp, r, g, k);
    FUZZ_CHECK(p.tp_group == g && p.tp_rank == k && p.tp_size == TP);
    where(plan::CpGroupKind::Dcp, r, g, k);
    FUZZ_CHECK(p.dcp_group == g && p.dcp_rank == k && p.dcp_size == WD);
    where(plan::CpGroupKind::Pcp, r, g, k);
    FUZZ_CHECK(p.pcp_group == g && p.pcp_rank == k && p.pcp_size == WP);
    const bool sharded = c.pcp_kv_mode == plan::PcpKvMode::Sharded;
    FUZZ_CHECK(p.kv_shard_size == (sharded ? WP * WD : WD) && p.num_decode_partials == p.kv_shard_size);
    FUZZ_CHECK(p.kv_shard_rank == (sharded ? p.pcp_rank * WD + p.dcp_rank : p.dcp_rank));
    FUZZ_CHECK(p.kv_shard_rank >= 0 && p.kv_shard_rank < p.kv_shard_size);
    FUZZ_CHECK(p.num_q_heads * TP == c.total_num_q_heads && p.num_gathered_q_heads == p.num_q_heads * WD);
    const bool any_cp = WP * WD > 1;
    const int32_t il = any_cp && c.sfa_sharded_indexer ? c.block_size : c.interleave_size;
    FUZZ_CHECK(p.interleave_size == il && p.interleave_overridden == (il != c.interleave_size));
    if (any_cp && c.has_kv_connector) FUZZ_CHECK(p.interleave_size == c.block_size);
    if (c.use_mla) FUZZ_CHECK(p.num_kv_heads == 1);
    else FUZZ_CHECK(p.num_kv_heads == std::max(1, c.total_num_kv_heads / TP));
  }
  bool bad_rank = true;
  try {
    plan::cp_rank_place(c, in.flag() ? W : -1);
    bad_rank = false;
  } catch (const InvalidArgument&) {
  }
  FUZZ_CHECK(bad_rank);
  return 0;
}
