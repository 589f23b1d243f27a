// The road back of a DSA-CP layer (docs/design/sparse_cp.md §7 step 4, §10).
#include "ascend_attn_rt/sparse/dsa_cp_road.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "ascend_attn_rt/comm/comm.h"
#include "ascend_attn_rt/errors.h"
#include "ascend_attn_rt/ops/dense.h"
#include "ascend_attn_rt/ops/fault_injection.h"
#include "ascend_attn_rt/sparse/oproj_switch.h"

namespace aar::sparse {

DsaCpRows make_dsa_cp_rows(int64_t world, int64_t tpr, int64_t width, int64_t nloc, bool full_road,
                           const at::TensorOptions& options) {
  AAR_CHECK_ARG(world >= 1 && width % world == 0 && nloc >= 0 && nloc <= tpr, "DSA-CP rows: width ", width,
                " over ", world, " ranks, ", nloc, " of ", tpr, " rows");
  DsaCpRows r;
  r.full_road = full_road;
  r.world = world;
  r.tpr = tpr;
  r.width = width;
  const int64_t C = width / world;
  r.buf = full_road ? at::empty({tpr, width}, options) : at::empty({world, tpr, C}, options);
  r.rows = full_road ? r.buf.view({tpr, world, C}) : r.buf.transpose(0, 1);
  if (nloc < tpr) ops::dense::zero(r.rows.narrow(0, nloc, tpr - nloc));
  return r;
}

void dsa_cp_road_back(cp::Comm& comm, const DsaCpRows& r, OProjFullWeight* sw,
                      const std::function<at::Tensor(const at::Tensor&)>& o_proj_full,
                      const std::function<at::Tensor(const at::Tensor&)>& o_proj_shard, const at::Tensor& output,
                      int64_t tk) {
  at::Tensor full;  // (T_pad, hidden)
  if (r.full_road) {
    AAR_CHECK_ARG(sw != nullptr, "DSA-CP prefill road without an o_proj full-weight switch");
    sw->gather();
    at::Tensor part;
    {
      const OProjFullWeight::Guard guard(*sw);
      ops::testing::fault_point();  // a test's fault lands inside the switch (test_sfa_dsa_cp.py, test_dsa_cp.py)
      part = o_proj_full(r.buf);    // (tpr, hidden)
    }
    full = comm.all_gather(part, 0);
  } else {
    // Block i of the exchange is rank i's tokens of this rank's heads.
    const at::Tensor mine = comm.all_to_all_single(r.buf.view({r.world * r.tpr, r.width / r.world}));
    full = o_proj_shard(mine).contiguous();
    comm.all_reduce(full);
  }
  const int64_t out_rows = output.size(0), keep = std::min<int64_t>(tk, out_rows);
  ops::dense::copy(output.narrow(0, 0, keep), full.narrow(0, 0, keep));
  if (out_rows > keep) ops::dense::zero(output.narrow(0, keep, out_rows - keep));
}

}  // namespace aar::sparse
