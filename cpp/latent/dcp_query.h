// Internal: the DCP exchange of the MLA family's absorbed query, shared by MLA's DCP decode
// and SFA's DCP path (docs/design/mla.md §6.2, docs/design/sparse_cp.md §5): the workspace of
// one (comm, group, shape), [ql_nope | q_pe] gathered along the heads over the DCP group and
// split into two contiguous halves for the kernel. Every intermediate lives in the shared
// cp::DcpWorkspace (stable addresses for graph capture).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <utility>

#include "ascend_attn_rt/comm/dcp_exchange.h"

namespace aar::mla::detail {

struct LatentDcpShape {
  int64_t heads = 0;     // this rank's query heads H
  int64_t L = 0, R = 0;  // kv_lora_rank, qk_rope_head_dim
  int64_t workspace_group = 0;
  bool head_major = false;  // the merge order (cp::DcpWorkspaceShape::head_major)
};

// The views for td rows of the workspace of (comm, shape, like's dtype and device); `ws`
// keeps the layer's handle (replaced when the shape changes).
const cp::DcpViews& latent_dcp_views(cp::Comm& comm, const LatentDcpShape& shape, const at::Tensor& like, int64_t td,
                                     std::shared_ptr<cp::DcpWorkspace>& ws);

// The gathered query's halves, contiguous, carved from the staged query: (td, W*H, 1, L) and
// (td, W*H, 1, R).
std::pair<at::Tensor, at::Tensor> latent_dcp_split_query(const cp::DcpViews& w, int64_t L, int64_t R);

// [qn | qr] (td, H, L) / (td, H, R) (any strides) into the local query, gathered along the
// heads over `comm` and split into latent_dcp_split_query's halves.
void latent_dcp_stage_query(cp::Comm& comm, const cp::DcpViews& w, const at::Tensor& qn, const at::Tensor& qr);

}  // namespace aar::mla::detail
