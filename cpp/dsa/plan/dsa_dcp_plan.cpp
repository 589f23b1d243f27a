// docs/design/sparse_cp.md §12.2: the per-row DCP index lists of a DSA step (dsa_dcp_plan.h).
#include "ascend_attn_rt/dsa/plan/dsa_dcp_plan.h"

#include <algorithm>

#include "ascend_attn_rt/errors.h"
#include "../../cp/plan/dcp_internal.h"

namespace aar::dsa {

namespace {

void check_rows(const DsaDcpRows& r) {
  AAR_CHECK_ARG(r.num_reqs >= 0 && r.num_rows >= 0, "dsa dcp rows: num_reqs=", r.num_reqs, " and num_rows=",
                r.num_rows, " must be >= 0");
  AAR_CHECK_ARG(r.query_start_loc.size() >= static_cast<size_t>(r.num_reqs) + 1 &&
                    r.start_pos.size() >= static_cast<size_t>(r.num_reqs),
                "dsa dcp rows: query_start_loc (", r.query_start_loc.size(), ") and start_pos (", r.start_pos.size(),
                ") must hold num_reqs + 1 and num_reqs=", r.num_reqs, " entries");
  AAR_CHECK_ARG(r.query_start_loc[0] == 0, "dsa dcp rows: query_start_loc[0] must be 0, got ", r.query_start_loc[0]);
  for (int32_t b = 0; b < r.num_reqs; ++b) {
    AAR_CHECK_ARG(r.query_start_loc[static_cast<size_t>(b) + 1] >= r.query_start_loc[static_cast<size_t>(b)] &&
                      r.start_pos[static_cast<size_t>(b)] >= 0,
                  "dsa dcp rows: request ", b, " has query_start_loc ", r.query_start_loc[static_cast<size_t>(b)],
                  "..", r.query_start_loc[static_cast<size_t>(b) + 1], " and start_pos ",
                  r.start_pos[static_cast<size_t>(b)]);
  }
  const plan::DcpShard& s = r.shard;
  AAR_CHECK_ARG(s.world >= 1 && s.rank >= 0 && s.rank < s.world && s.interleave >= 1, "dsa dcp rows: rank ", s.rank,
                " of world ", s.world, " with interleave ", s.interleave, " is not a DCP shard");
}

// Calls f(t, b, p) for every row t < num_rows of a request (rows in request order), and g(t) for the
// rest.
template <class F, class G>
void for_each_row(const DsaDcpRows& r, F&& f, G&& g) {
  const int32_t* qsl = r.query_start_loc.data();
  int64_t t = 0;
  for (int32_t b = 0; b < r.num_reqs && t < r.num_rows; ++b) {
    const int64_t end = std::min<int64_t>(qsl[b + 1], r.num_rows);
    const int64_t base = int64_t{r.start_pos[static_cast<size_t>(b)]} - qsl[b];
    for (; t < end; ++t) f(t, b, base + t);
  }
  for (; t < r.num_rows; ++t) g(t);
}

// #{x < len : owner(x) = rank} (docs/design/cp.md §2.2): the CP plan's unchecked formula (the shard is
// validated once per call).
using plan::detail::dcp::local_len;

}  // namespace

void plan_dsa_dcp_window_slots(const DsaDcpRows& rows, plan::CSpan<int32_t> block_table,
                               int64_t block_table_stride, int64_t storage_block_size, int32_t win_left,
                               plan::Span<int32_t> out) {
  check_rows(rows);
  AAR_CHECK_ARG(win_left >= 0 && storage_block_size >= 1 && block_table_stride >= 0,
                "dsa dcp window slots: win_left=", win_left, ", storage_block_size=", storage_block_size,
                ", block_table_stride=", block_table_stride);
  const int64_t width = int64_t{win_left} + 1;
  AAR_CHECK_ARG(out.size() >= static_cast<size_t>(rows.num_rows * width), "dsa dcp window slots: out holds ",
                out.size(), " words, ", rows.num_rows, " rows of ", width, " need ", rows.num_rows * width);
  AAR_CHECK_ARG(block_table.size() >= static_cast<size_t>(rows.num_reqs * block_table_stride),
                "dsa dcp window slots: block_table holds ", block_table.size(), " ids, ", rows.num_reqs,
                " rows of ", block_table_stride, " need ", rows.num_reqs * block_table_stride);
  const int64_t W = rows.shard.world, I = rows.shard.interleave, rk = rows.shard.rank, sbs = storage_block_size;
  // Every local column first (nothing written on a failure).
  for_each_row(
      rows,
      [&](int64_t t, int32_t b, int64_t p) {
        const int64_t hi = local_len(p + 1, W, I, rk);
        AAR_CHECK_ARG(hi == 0 || (hi - 1) / sbs < block_table_stride, "dsa dcp window slots: row ", t,
                      " (request ", b, ", position ", p, ") reads local column ", (hi - 1) / sbs,
                      " but block_table_stride is ", block_table_stride);
      },
      [](int64_t) {});
  int32_t* o = out.data();
  for_each_row(
      rows,
      [&](int64_t t, int32_t b, int64_t p) {
        int32_t* row = o + t * width;
        const int64_t lo = local_len(std::max<int64_t>(p - win_left, 0), W, I, rk);
        const int64_t hi = local_len(p + 1, W, I, rk);
        const int32_t* bt = block_table.data() + b * block_table_stride;
        // Block by block: one table read and one division per block, not per entry.
        int32_t* o_row = row;
        for (int64_t li = lo; li < hi;) {
          const int64_t col = li / sbs, off = li - col * sbs;
          const int64_t run = std::min<int64_t>(hi - li, sbs - off);
          const int64_t base = int64_t{bt[col]} * sbs + off;
          for (int64_t j = 0; j < run; ++j) *o_row++ = static_cast<int32_t>(base + j);
          li += run;
        }
        std::fill(o_row, row + width, -1);
      },
      [&](int64_t t) { std::fill(o + t * width, o + (t + 1) * width, -1); });
}

void plan_dsa_dcp_cmp_limits(const DsaDcpRows& rows, int32_t ratio, plan::Span<int32_t> out) {
  check_rows(rows);
  AAR_CHECK_ARG(ratio >= 2, "dsa dcp compressed limits: ratio=", ratio, " must be >= 2");
  AAR_CHECK_ARG(out.size() >= static_cast<size_t>(rows.num_rows), "dsa dcp compressed limits: out holds ",
                out.size(), " words, ", rows.num_rows, " rows need as many");
  int32_t* o = out.data();
  for_each_row(
      rows, [&](int64_t t, int32_t, int64_t p) { o[t] = static_cast<int32_t>((p + 1) / ratio); },
      [&](int64_t t) { o[t] = 0; });
}

}  // namespace aar::dsa
