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

void dsa_cp_road_back(cp::Comm& comm, const DsaCpRows& r, OProjFullWeight* sw,
                      const std::function<at::Tensor(const at::Tensor&)>& o_proj_full,
                      const std::function<at::Tensor(const at::Tensor&, const at::Tensor&)>& o_proj_shard,
                      const at::Tensor& output, int64_t tk) {
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
    comm.all_to_all_single(r.send, r.exchange);
    const int64_t rows = output.size(0);
    if (rows == r.exchange.size(0) && tk >= rows && output.is_contiguous()) {
      // The usual decode step: the partial sums straight into the output, reduced there.
      o_proj_shard(r.exchange, output);
      comm.all_reduce(output);
      return;
    }
    full = o_proj_shard(r.exchange, at::Tensor());
    if (!full.is_contiguous()) full = full.contiguous();  // reduced in place
    comm.all_reduce(full);
  }
  const int64_t out_rows = output.size(0), keep = std::min<int64_t>(tk, out_rows);
  if (keep == out_rows && keep == full.size(0)) {
    ops::dense::copy(output, full);  // the usual step (no reference count taken for a view)
  } else {
    ops::dense::copy(output.narrow(0, 0, keep), full.narrow(0, 0, keep));
  }
  if (out_rows > keep) ops::dense::zero(output.narrow(0, keep, out_rows - keep));
}

}  // namespace aar::sparse
