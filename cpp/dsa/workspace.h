// Intermediate buffers of the DSA layer forward (internal; dsa/impl.h).
//
// The layer's intermediates (q-LoRA rows, q, kv, the indexer query, weights
// and quantised query, the compressors' rows and the indexer's quantised
// rows, the top-k, the SAS output, the o_proj input) live in flat buffers
// shared by every layer of one shape (layers run one after another on one
// stream, so a layer's intermediates are dead when the next layer starts;
// common/shared_by_shape.h), sized for the largest batch seen so far. The
// views for n tokens (and r compressed rows) are made the first time that
// size is seen and cached, so a steady-state forward makes no tensor for its
// intermediates and a captured graph reads and writes them at stable
// addresses. A buffer that grows is replaced; the old one lives on while a
// captured graph (or a view) still holds it. As MLA's decode workspace: one
// per shape and workspace group in the process, so layers of one shape and
// group must not run forwards concurrently from several threads (one model's
// layers run in order); concurrent engines use different groups.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace aar::detail {
class ExclusiveUse;  // cpp/common/exclusive_use.h
}

namespace aar::dsa::detail {

struct WorkspaceShape {
  c10::Device device = c10::Device(c10::kCPU);
  c10::ScalarType dtype = c10::ScalarType::Undefined;  // the weights'
  int64_t num_heads = 0, head_dim = 0, q_lora_rank = 0, o_groups = 0, o_lora_rank = 0;
  int32_t compress_ratio = 1;
  int64_t group = 0;  // ImplConfig::workspace_group: concurrent engines keep apart
  // ratio 4 only (0 otherwise)
  int64_t index_n_heads = 0, index_head_dim = 0, index_topk = 0;
  c10::ScalarType idx_q = c10::ScalarType::Undefined, idx_q_scale = c10::ScalarType::Undefined,
                  li_weights = c10::ScalarType::Undefined, idx_k = c10::ScalarType::Undefined,
                  idx_k_scale = c10::ScalarType::Undefined;
  // Graph-mode buffers of the optional paths (docs/design/dsa.md §6): the MX-fp8 o_proj's
  // quantised input, the W8A8-dynamic prolog's quantised activations (hidden_size set only
  // then), the A5 + BF16 plan's full-width KV write.
  bool mx_o_proj = false, w8a8 = false, inplace_write = false;
  int64_t hidden_size = 0;
  bool operator==(const WorkspaceShape& o) const;
};

// The A5 + BF16 plan's graph-mode KV write over all m rows of a group (docs/design/dsa.md §6).
struct WriteViews {
  at::Tensor mask;  // (m) bool: the row's block >= 0
  at::Tensor idx;   // (m, 2) int32: its slot, or the group's fill slot
  at::Tensor upd;   // (m, 1, D): its row, or the fill slot's current row
  at::Tensor cur;   // (1, 1, D): the fill slot's current row
};

// Views for one token count n.
struct TokenViews {
  int64_t generation = -1;
  at::Tensor qa;            // (n, Q): the q-LoRA projection, normed in place (qr)
  at::Tensor q2, q;         // (n, N*D) projection target, (n, N, D) the same memory
  at::Tensor kv;            // (n, D)
  at::Tensor o;             // (n, N, D): the SAS output (graph mode)
  at::Tensor o_rows;        // (n N, D): o as the DCP merge's row target
  at::Tensor o_groups;      // (n, G, N*D/G) view of o
  at::Tensor y, y2;         // (n, G, o_lora) transpose-bmm output (graph mode), (n, G*o_lora)
  // ratio 4
  at::Tensor qi2, qi;       // (n, nh*Di), (n, nh, Di): indexer q projection
  at::Tensor qi_rot;        // (n, nh, Di): after the Hadamard rotation
  at::Tensor wts_raw, wts;  // (n, nh) in the weights' dtype / li_weights dtype (the same when equal)
  at::Tensor q_q, q_scale;  // (n, nh, Di) quantised query (graph mode), (n, nh) fp32 scale (graph mode)
  at::Tensor q_scale_c;     // (n, nh) in the QLI's query scale dtype (q_scale when fp32)
  at::Tensor sel;           // (n, 1, K) int32 top-k (graph mode)
  // mx_o_proj (graph mode): the o_proj input quantised per 32 values
  at::Tensor o8;            // (n, G, N*D/G) float8_e4m3fn
  at::Tensor o_mxs, o_mxs_e8m0;  // (n, G, N*D/G / 64, 2) uint8 scale bytes, the same memory as e8m0
  // w8a8 (graph mode): x and qr quantised per token
  at::Tensor x_q, x_scale;  // (n, hidden) int8, (n) fp32
  at::Tensor qr_q, qr_scale;  // (n, Q) int8, (n) fp32
  WriteViews swa_write;     // inplace_write (graph mode): the SWA write over all n rows
};

// Views for r compressed rows.
struct RowViews {
  int64_t generation = -1;
  at::Tensor cmp;           // (r, D): main compressor rows (graph mode)
  // ratio 4
  at::Tensor ik, ik_rot;    // (r, Di): indexer compressor rows (graph mode), rotated
  at::Tensor ik_q, ik_scale;  // (r, Di) quantised (graph mode), (r) fp32 scale (graph mode)
  at::Tensor ik_scale_c;    // (r, 1) in the indexer cache's scale dtype
  at::Tensor ik_scale_c1;   // (r) the same memory (the scale's copy target; no view per forward)
  WriteViews cmp_write;  // inplace_write (graph mode): the compressed-KV write over all r rows
};

class Workspace {
 public:
  explicit Workspace(const WorkspaceShape& shape);
  const WorkspaceShape& shape() const { return shape_; }
  // Grows the buffers when n exceeds the capacity.
  const TokenViews& tokens(int64_t n);
  const RowViews& rows(int64_t r);  // r <= the capacity (tokens(n) first, r <= n)

  static std::shared_ptr<Workspace> shared(const WorkspaceShape& shape);
  // DCP (docs/design/sparse_cp.md §12.2), made on first use: the compressed-row list of n rows of
  // `width` entries ((n, 1, width) int32) and the merged LSE of n rows ((n, num_heads) fp32). Views
  // cached per (n, width) / n; a buffer that grows is replaced (as the others).
  const at::Tensor& dcp_cmp(int64_t n, int64_t width);
  const at::Tensor& dcp_lse(int64_t n);
  // The same LSE as (n num_heads) rows (the DCP merge's row target).
  const at::Tensor& dcp_lse_rows(int64_t n);

 private:
  void grow(int64_t n);

  WorkspaceShape shape_;
  std::shared_ptr<::aar::detail::ExclusiveUse> exclusive_;
  int64_t capacity_ = 0, generation_ = 0;
  at::Tensor qa_, q_, kv_, o_, y_, qi_, qi_rot_, wts_raw_, wts_, q_q_, q_scale_, q_scale_c_, sel_;
  at::Tensor cmp_, ik_, ik_rot_, ik_q_, ik_scale_, ik_scale_c_;
  at::Tensor o8_, o_mxs_, x_q_, x_scale_, qr_q_, qr_scale_;
  // the full-width writes' buffers: SWA (n rows), compressed KV (r rows)
  at::Tensor sw_mask_, sw_idx_, sw_upd_, sw_cur_, cw_mask_, cw_idx_, cw_upd_, cw_cur_;
  at::Tensor dcp_cmp_, dcp_lse_;  // DCP: grown on demand (dcp_cmp / dcp_lse)
  struct DcpCmpView {
    int64_t n = 0, width = 0;
    at::Tensor view;
  };
  std::vector<DcpCmpView> dcp_cmp_views_;
  std::vector<at::Tensor> dcp_lse_views_, dcp_lse_rows_;
  std::vector<TokenViews> tokens_;
  std::vector<RowViews> rows_;
};

}  // namespace aar::dsa::detail
