// The GQA decode exchange shared by the DCP and sharded PCP layers (gqa_cp_exchange.h).
#include "gqa_cp_exchange.h"

#include <ATen/ATen.h>

#include "ascend_attn_rt/ops/dense.h"

namespace aar::cp {

const DcpViews& GqaShardExchange::views(int64_t T, const at::Tensor& query) {
  const int64_t W = world();
  DcpWorkspaceShape sh;
  sh.device = query.device();
  sh.q_dtype = sh.out_dtype = query.scalar_type();
  sh.world = W;
  sh.heads = heads_;
  sh.q_dim = sh.out_dim = head_size_;
  sh.regroup = kv_heads_ > 1 && W > 1;
  sh.comm = comm_ != nullptr ? static_cast<const void*>(comm_) : share_scope_;
  if (!ws_ || !(ws_->shape() == sh)) ws_ = DcpWorkspace::shared(sh);
  return ws_->views(T);
}

void GqaShardExchange::stage_query(const DcpViews& v, const at::Tensor& q_rows) const {
  at::Tensor qg = v.gathered_query;
  if (comm_ == nullptr) {
    ops::dense::copy(qg, q_rows);
  } else {
    gather_query_heads(*comm_, q_rows, qg);
  }
  if (!v.staged_query.defined()) return;
  // Gathered heads (rank-major) -> KV-head-major for FIA (the kernel maps head g
  // to KV head g / (W H / Hkv)).
  const int64_t T = qg.size(0), W = world(), kv = kv_heads_, G = heads_ / kv;
  const int64_t D = qg.size(2);
  v.staged_query.view({T, kv, W, G, D}).copy_(qg.view({T, W, kv, G, D}).permute({0, 2, 1, 3, 4}));
}

void GqaShardExchange::fill_partial_call(const DcpViews& v, const at::Tensor& key_cache_3d,
                                         const at::Tensor& value_cache_3d, const at::Tensor& block_table,
                                         c10::IntArrayRef q_ends, c10::IntArrayRef kv_lens, int64_t block_size,
                                         ops::FiaTensors& t, ops::FiaParams& p, at::Tensor& out,
                                         at::Tensor& lse) const {
  const bool regroup = v.staged_query.defined();
  t.query = regroup ? v.staged_query : v.gathered_query;
  t.key = key_cache_3d;
  t.value = value_cache_3d;
  t.block_table = block_table;
  p.actual_seq_lengths = q_ends;
  p.actual_seq_lengths_kv = kv_lens;  // per request with a block table
  p.num_heads = world() * heads_;
  p.num_key_value_heads = kv_heads_;
  p.scale = scale_;
  p.input_layout = "TND";
  p.block_size = block_size;
  p.sparse_mode = 0;
  p.softmax_lse_flag = true;
  out = regroup ? v.staged_out : v.partial_out;
  lse = regroup ? v.staged_lse : v.partial_lse;
}

void GqaShardExchange::combine(const DcpViews& v, const at::Tensor& out_rows,
                               const std::optional<at::Tensor>& lse_rows) {
  if (v.staged_out.defined()) {
    // KV-head-major partials back to the gathered (rank-major) head order.
    const int64_t T = v.partial_out.size(0), W = world(), kv = kv_heads_, G = heads_ / kv;
    const int64_t D = v.partial_out.size(2);
    v.partial_out.view({T, W, kv, G, D}).copy_(v.staged_out.view({T, kv, W, G, D}).permute({0, 2, 1, 3, 4}));
    v.partial_lse.view({T, W, kv, G}).copy_(v.staged_lse.view({T, kv, W, G}).permute({0, 2, 1, 3}));
  }
  if (comm_ == nullptr) {
    // A group of one: the partial is the result.
    ops::dense::copy(out_rows, v.partial_out);
    if (lse_rows.has_value()) ops::dense::copy(lse_rows->view({v.partial_lse.size(0), heads_}), v.lse2);
    return;
  }
  if (!lse_rows.has_value() && out_rows.dim() == 3 && out_rows.is_contiguous()) {
    // The workspace overload (comm/dcp_exchange.h): the merge's result copied into the kept rows view,
    // no per-call view of out_rows or of the merge's result.
    if (!out_src_.same(out_rows)) {
      out_flat_ = out_rows.view({out_rows.size(0) * out_rows.size(1), out_rows.size(2)});
      out_src_.bind(out_rows);
    }
    combine_partials(*comm_, v, out_flat_);
    return;
  }
  at::Tensor out = out_rows;
  combine_partials(*comm_, v.partial_out, v.partial_lse, out, lse_rows, &v);
}

}  // namespace aar::cp
