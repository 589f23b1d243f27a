// Internal, TEMPORARY: the DCP exchange of the MLA decode (spec mla.md 7.3,
// cp.md 4 steps 1 and 4-5) until the shared module cp/dcp.h (branch
// h-gqa-dcp) lands; then these two calls become cp::gather_query_heads and
// cp::combine_partials and this file goes.
#pragma once

#include <ATen/ATen.h>

#include <vector>

#include "ascend_attn_rt/cp/comm.h"
#include "ascend_attn_rt/ops/attention_update.h"

namespace aar::mla::detail {

// q (T, H, D) -> (T, W*H, D), head g = rank g / H, local head g % H.
inline at::Tensor gather_query_heads(cp::Comm& comm, const at::Tensor& q) { return comm.all_gather(q, 1); }

// partial_out (T, W*H, D), partial_lse (T, W*H, 1) fp32: this rank's partial
// for every gathered head. Exchanged on the fp32 wire [W*H, D+1, T] (block i
// of dim 0 goes to rank i) and merged in source-rank order for this rank's H
// heads into out (T, H, D) (a view is fine).
inline void combine_partials(cp::Comm& comm, const at::Tensor& partial_out, const at::Tensor& partial_lse,
                             at::Tensor& out) {
  const int64_t W = comm.size(), T = partial_out.size(0), N = partial_out.size(1), D = partial_out.size(2);
  const int64_t H = N / W;
  const at::Tensor wire =
      at::cat({partial_out.to(at::kFloat), partial_lse.reshape({T, N, 1}).to(at::kFloat)}, -1).permute({1, 2, 0});
  const at::Tensor recv = comm.all_to_all_single(wire.contiguous());  // (W*H, D+1, T)
  const at::Tensor parts = recv.view({W, H, D + 1, T}).permute({0, 3, 1, 2});  // (W, T, H, D+1)
  std::vector<at::Tensor> outs, lses;
  outs.reserve(W);
  lses.reserve(W);
  for (int64_t s = 0; s < W; ++s) {
    outs.push_back(parts[s].narrow(-1, 0, D).reshape({T * H, D}).contiguous());
    lses.push_back(parts[s].select(-1, D).reshape({T * H}).contiguous());
  }
  out.copy_(std::get<0>(ops::attention_update(lses, outs, 0)).view({T, H, D}));
}

}  // namespace aar::mla::detail
