// The fused-attention kernels (FIA v1 and v2) as captured calls, for every
// backend that records them (GQA, C8, the GQA DCP decode, the MLA decode; an
// engine's own backend may too). An update refreshes a call's host lists and
// block table from the step; the fused calls of a bucket share one workspace.
// The graph layer sees them through graph::CapturedCall only.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "ascend_attn_rt/graph/graph_params.h"
#include "ascend_attn_rt/ops/fused_infer_attention.h"

namespace aar::graph_calls {

// The name of the bucket's shared fused-attention workspace (GraphParams::shared_workspace).
inline constexpr const char* kFiaWorkspace = "fused_infer_attention";

// What an update refreshes of a fused call.
struct FiaRefresh {
  // KV read through a block table: the block table and per-request KV lengths
  // are refreshed. Otherwise the KV is the step's own tokens and both lists are
  // the cumulative query ends.
  bool paged = true;
  // False for BNSD decode calls (one query row per request, no query-length
  // list): the query list stays as captured and the step must have one
  // one-token request per query row.
  bool q_lens = true;
};

// Where a captured call sits in the bucket.
struct CallKeys {
  int64_t layer_index = -1;
  int32_t group = 0;
};

// Record a fused call in the capture open on `g` (its workspace offered to the
// bucket's shared one first). `out` and `lse` are the buffers it writes.
void capture_fia(graph::GraphParams& g, CallKeys keys, FiaRefresh refresh, ops::FiaTensors t, ops::FiaParams p,
                 at::Tensor out, at::Tensor lse);
void capture_fia_v2(graph::GraphParams& g, CallKeys keys, FiaRefresh refresh, ops::FiaV2Tensors t,
                    ops::FiaV2Params p, at::Tensor out, at::Tensor lse);

// The check every call refreshed from host lists makes: the step must match
// the `rows` query rows the call was captured with in bucket `bucket`. With
// `one_row_per_request` (paged attention, BNSD decode) one one-token request per
// row; otherwise the step's kernel tokens equal the rows (TND). The lists must
// hold one entry per request (the query ends only when `needs_q_ends`).
void check_step_rows(const graph::StepParams& step, int64_t rows, bool one_row_per_request, bool needs_q_ends,
                     int64_t bucket);

}  // namespace aar::graph_calls
