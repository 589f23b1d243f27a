// The device form of the DCP top-k remap (docs/design/sparse_cp.md §3; the host form and its
// definition: plan::remap_sparse_indices, cp/plan/sparse_cp.h): a replicated-view top-k
// selection (..., K) int32 of global positions (negative = invalid) to the positions this DCP
// rank holds, as local indices in top-k order, then -1. Built from aten operators (integer
// arithmetic and a sort of distinct keys), so it runs wherever the top-k lives.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace aar::sparse {

// world == 1 returns `topk` itself. InvalidArgument on a bad shard (world in [1, 16],
// rank in [0, world), interleave >= 1) or a topk that is not an int32 tensor of >= 1 dims.
at::Tensor remap_topk_to_dcp_rank(const at::Tensor& topk, int32_t world, int32_t rank, int32_t interleave);

// The same remap into `out` (topk's shape, int32; may be a view of a workspace) with a per-row
// limit (docs/design/sparse_cp.md §12.2, the DSA DCP compressed lists): entries >= limit count as
// invalid. limit broadcasts against topk (e.g. (T, 1) int32 for a (T, K) topk); topk may be an
// expanded view. Under the no-compute provider nothing is written. world == 1 is allowed (the
// entries below the limit, compacted). InvalidArgument as above and on a shape mismatch.
void remap_topk_to_dcp_rank_out(const at::Tensor& out, const at::Tensor& topk, const at::Tensor& limit,
                                int32_t world, int32_t rank, int32_t interleave);

}  // namespace aar::sparse
