// The road back of a DSA-CP layer (docs/design/sparse_cp.md §7 step 4 for SFA, §10 for DSA), shared
// by the sparse families: from this rank's token slice (every head, `width` = heads x head dim
// values per token, padded to tokens_per_rank rows) to the whole step's output, complete on every
// rank. Decode road: an all-to-all of head blocks, the rank's row-parallel o_proj shard and an
// all-reduce. Prefill road (the full-weight switch): the shards gathered and switched in under one
// guard, the full o_proj on the slice, the tokens all-gathered. Every rank issues the same
// collectives, whatever its slice holds.
#pragma once
#include <ATen/core/Tensor.h>
#include <cstdint>
#include <functional>

namespace aar::cp {
class Comm;
}

namespace aar::sparse {

class OProjFullWeight;

// The slice's rows in the layout of the road that takes them: the prefill road's (tpr, width), or
// the decode road's head blocks (W, tpr, width / W), so that no reorder copy precedes the
// exchange. `rows` is the (tpr, W, width / W) view of either, `real` its first nloc rows (the slice's
// tokens, written by the layer); the padding rows [nloc, tpr) are zeros. The decode road's all-to-all
// sends `send` (`buf` as (W tpr, width / W)) into `exchange`. The layers take them from their DSA-CP workspace
// (cpp/sparse/dsa_cp_workspace.h: buffers shared by the layers of one shape, views cached per slice).
struct DsaCpRows {
  bool full_road = false;
  int64_t world = 1, tpr = 0, width = 0;
  at::Tensor buf;
  at::Tensor rows;
  at::Tensor real;
  at::Tensor send, exchange;
};

// o_proj_full(x (tpr, width)) -> (tpr, hidden), run with the full weights switched in (`sw`);
// o_proj_shard(x (T_pad, width / W), out) -> the (T_pad, hidden) partial sums of this rank's heads,
// written into `out` when it is defined (and returned), else into a new tensor. Writes
// output[:min(tk, rows)] and zeroes its other rows; when output is exactly the T_pad rows
// (contiguous, no padding token) the decode road writes and reduces them in place in output (no copy).
void dsa_cp_road_back(cp::Comm& comm, const DsaCpRows& r, OProjFullWeight* sw,
                      const std::function<at::Tensor(const at::Tensor&)>& o_proj_full,
                      const std::function<at::Tensor(const at::Tensor&, const at::Tensor&)>& o_proj_shard,
                      const at::Tensor& output, int64_t tk);

}  // namespace aar::sparse
