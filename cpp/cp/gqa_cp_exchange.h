#pragma once
// Private to cpp/: the decode exchange of the GQA context-parallel layers (GQA DCP,
// and the DCP leg of sharded GQA PCP), moved out of the DCP layer so that both run
// and capture the same calls (docs/design/cp.md §4, §6.6). Over a DcpWorkspace
// (stable addresses, one per shape): the query heads gathered (and regrouped
// KV-head-major when a rank holds several KV heads), the local paged fused call's
// arguments, and the partials' exchange and merge. A null comm is a group of one
// (PCP without DCP): the gather and the merge are copies, nothing is sent.
#include <ATen/core/Tensor.h>
#include <c10/util/ArrayRef.h>

#include <cstdint>
#include <memory>
#include <optional>

#include "ascend_attn_rt/comm/comm.h"
#include "ascend_attn_rt/comm/dcp_exchange.h"
#include "ascend_attn_rt/detail/tensor_binding.h"
#include "ascend_attn_rt/ops/fused_infer_attention.h"

namespace aar::cp {

// Thread safety: one thread at a time (the layer's; the workspace is held per forward).
class GqaShardExchange {
 public:
  // heads / kv_heads / head_size: this rank's layer; comm: the DCP group (null: one rank);
  // share_scope: what scopes the workspace's sharing when comm is null (the layer's
  // other group: layers of one engine share it, engines on other threads do not).
  GqaShardExchange(int64_t heads, int64_t kv_heads, int64_t head_size, double scale, Comm* comm,
                   const void* share_scope = nullptr)
      : heads_(heads), kv_heads_(kv_heads), head_size_(head_size), scale_(scale), comm_(comm),
        share_scope_(share_scope) {}

  int64_t world() const { return comm_ == nullptr ? 1 : comm_->size(); }
  // The workspace of the query's shape (shared by the layers of one shape), or null before the first use.
  const std::shared_ptr<DcpWorkspace>& workspace() const { return ws_; }
  // The views for T rows (the workspace made or grown on first need).
  const DcpViews& views(int64_t T, const at::Tensor& query);
  // q_rows (T, H, D) -> the gathered query (T, W*H, D), regrouped when needed.
  void stage_query(const DcpViews& v, const at::Tensor& q_rows) const;
  // The local paged call of the gathered rows over this rank's shard (FIA TND,
  // non-causal within the rows' KV lengths, LSE on): its arguments, out and lse.
  void fill_partial_call(const DcpViews& v, const at::Tensor& key_cache_3d, const at::Tensor& value_cache_3d,
                         const at::Tensor& block_table, c10::IntArrayRef q_ends, c10::IntArrayRef kv_lens,
                         int64_t block_size, ops::FiaTensors& t, ops::FiaParams& p, at::Tensor& out,
                         at::Tensor& lse) const;
  // The partials exchanged and merged into this rank's heads: out_rows (T, H, D)
  // and, when given, lse_rows (T, H, 1) fp32.
  // Without lse_rows over a group, the merge writes a (T*H, D) view of out_rows that is kept while
  // out_rows is the same tensor with the same memory and geometry (detail::TensorBinding): a layer
  // handing the same output each step makes no view (docs/design/cp.md §3.5).
  void combine(const DcpViews& v, const at::Tensor& out_rows,
               const std::optional<at::Tensor>& lse_rows = std::nullopt);

 private:
  int64_t heads_, kv_heads_, head_size_;
  double scale_;
  Comm* comm_;
  const void* share_scope_;
  std::shared_ptr<DcpWorkspace> ws_;
  ::aar::detail::TensorBinding out_src_;  // the out_rows whose (T*H, D) view out_flat_ is
  at::Tensor out_flat_;
};

}  // namespace aar::cp
