// The MLA family's DCP query exchange (docs/design/mla.md §6.2, docs/design/sparse_cp.md §5).
#include "dcp_query.h"

#include <ATen/ATen.h>

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
  sh.comm = &comm;
  sh.workspace_group = shape.workspace_group;
  if (!ws || !(ws->shape() == sh)) ws = cp::DcpWorkspace::shared(sh);
  return ws->views(td);
}

std::pair<at::Tensor, at::Tensor> latent_dcp_split_query(const cp::DcpViews& w, int64_t L, int64_t R) {
  const int64_t td = w.staged_query.size(0), N = w.staged_query.size(1);
  const at::Tensor flat = w.staged_query.view({-1});
  return {flat.narrow(0, 0, td * N * L).view({td, N, 1, L}), flat.narrow(0, td * N * L, td * N * R).view({td, N, 1, R})};
}

void latent_dcp_stage_query(cp::Comm& comm, const cp::DcpViews& w, const at::Tensor& qn, const at::Tensor& qr) {
  const int64_t L = qn.size(-1), R = qr.size(-1);
  w.local_query.narrow(-1, 0, L).copy_(qn);
  w.local_query.narrow(-1, L, R).copy_(qr);
  at::Tensor qg = w.gathered_query;
  cp::gather_query_heads(comm, w.local_query, qg);
  auto [gn, gr] = latent_dcp_split_query(w, L, R);
  gn.squeeze(2).copy_(qg.narrow(-1, 0, L));
  gr.squeeze(2).copy_(qg.narrow(-1, L, R));
}

}  // namespace aar::mla::detail
