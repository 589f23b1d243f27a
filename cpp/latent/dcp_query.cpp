// The MLA family's DCP query exchange (docs/design/mla.md §6.2, docs/design/sparse_cp.md §5).
#include "dcp_query.h"

#include <ATen/ATen.h>

#include "ascend_attn_rt/errors.h"
#include "ascend_attn_rt/ops/dense.h"

namespace aar::mla::detail {

const cp::DcpViews& latent_dcp_views(cp::Comm& comm, const LatentDcpShape& shape, const at::Tensor& like, int64_t td,
                                     std::shared_ptr<cp::DcpWorkspace>& ws) {
  cp::DcpWorkspaceShape sh;
  sh.device = like.device();
  sh.q_dtype = sh.out_dtype = like.scalar_type();
  sh.world = comm.size();
  sh.heads = shape.heads;
  sh.q_dim = shape.L + shape.R;  // the gathered [ql_nope | q_pe]
  sh.out_dim = shape.L;
  sh.regroup = true;             // the split query halves, the concat input
  sh.q_split = shape.L;
  sh.comm = &comm;
  sh.workspace_group = shape.workspace_group;
  sh.head_major = shape.head_major;
  if (!ws || !(ws->shape() == sh)) ws = cp::DcpWorkspace::shared(sh);
  return ws->views(td);
}

std::pair<at::Tensor, at::Tensor> latent_dcp_split_query(const cp::DcpViews& w, int64_t L, int64_t R) {
  AAR_CHECK_ARG(w.staged_a4.defined() && w.staged_a4.size(-1) == L && w.staged_b4.size(-1) == R,
                "latent_dcp_split_query: the workspace is not split at ", L, " + ", R);
  return {w.staged_a4, w.staged_b4};
}

void latent_dcp_stage_query(cp::Comm& comm, const cp::DcpViews& w, const at::Tensor& qn, const at::Tensor& qr) {
  const int64_t L = qn.size(-1), R = qr.size(-1);
  AAR_CHECK_ARG(w.local_query_a.defined() && w.local_query_a.size(-1) == L && w.local_query_b.size(-1) == R,
                "latent_dcp_stage_query: the workspace is not split at ", L, " + ", R);
  ops::dense::copy(w.local_query_a, qn);
  ops::dense::copy(w.local_query_b, qr);
  at::Tensor qg = w.gathered_query;
  cp::gather_query_heads(comm, w.local_query, qg);
  ops::dense::copy(w.staged_a, w.gathered_query_a);
  ops::dense::copy(w.staged_b, w.gathered_query_b);
}

}  // namespace aar::mla::detail
