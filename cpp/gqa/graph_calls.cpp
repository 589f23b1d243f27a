#include "graph_calls.h"

#include <memory>
#include <utility>

#include "ascend_attn_rt/gqa/graph.h"
#include "ascend_attn_rt/ops/kv_cache_write.h"

namespace aar::gqa {

namespace {

const void* address(const at::Tensor& t) { return t.defined() ? t.data_ptr() : nullptr; }

class PagedAttentionCall final : public graph::CapturedCall {
 public:
  PagedAttentionCall(graph_calls::CallKeys keys, ops::PagedAttentionArgs a, at::Tensor out,
                     graph::SharedWorkspace& ws)
      : CapturedCall("paged_attention", keys.layer_index, keys.group, /*has_params=*/true),
        a_(std::move(a)),
        out_(std::move(out)),
        ws_(&ws) {}

  void check(const graph::StepParams& sp, int64_t bucket) const override {
    graph_calls::check_step_rows(sp, a_.query.sizes()[0], /*one_row_per_request=*/true, /*needs_q_ends=*/true,
                                 bucket);
  }

  void refresh(const graph::StepParams& sp, const graph::UpdatePass& pass) override {
    replaced_ws_ = false;
    prev_table_ = std::move(a_.block_table);
    prev_lens_ = std::move(a_.context_lens);
    a_.block_table = sp.block_tables;
    a_.context_lens = sp.seq_lens;
    // The workspace depends on the step's context lengths: one query per
    // update and step serves every paged-attention call of the bucket.
    if (ws_->pass == pass.id && ws_->step == &sp) return;
    at::Tensor w;
    try {
      w = ops::paged_attention_get_workspace(a_, out_);
    } catch (...) {
      revert();
      throw;
    }
    prev_ws_ = std::move(ws_->tensor);
    ws_->tensor = std::move(w);
    ws_->pass = pass.id;
    ws_->step = &sp;
    replaced_ws_ = true;
  }

  void revert() noexcept override {
    a_.block_table = std::move(prev_table_);
    a_.context_lens = std::move(prev_lens_);
    if (replaced_ws_) {
      ws_->tensor = std::move(prev_ws_);
      ws_->pass = 0;
      ws_->step = nullptr;
      replaced_ws_ = false;
    }
  }

  void launch() override { ops::paged_attention(a_, out_, ws_->tensor); }

  graph::CallInfo info() const override {
    graph::CallInfo i;
    const at::Tensor lens = a_.context_lens.to(at::kLong).contiguous();
    i.kv_lens.assign(lens.data_ptr<int64_t>(), lens.data_ptr<int64_t>() + lens.numel());
    i.input = address(a_.query);
    i.output = address(out_);
    i.table = address(a_.block_table);
    return i;
  }

 private:
  ops::PagedAttentionArgs a_;
  at::Tensor out_;
  graph::SharedWorkspace* ws_;  // the bucket's, at a stable address
  at::Tensor prev_table_, prev_lens_;
  std::optional<at::Tensor> prev_ws_;
  bool replaced_ws_ = false;
};

class KvWriteCall final : public graph::CapturedCall {
 public:
  KvWriteCall(graph_calls::CallKeys keys, at::Tensor key, at::Tensor value, at::Tensor key_cache,
              at::Tensor value_cache, at::Tensor slots, bool reshape_and_cache)
      : CapturedCall("kv_write", keys.layer_index, keys.group, /*has_params=*/false),
        key_(std::move(key)),
        value_(std::move(value)),
        key_cache_(std::move(key_cache)),
        value_cache_(std::move(value_cache)),
        slots_(std::move(slots)),
        reshape_and_cache_(reshape_and_cache) {}

  void launch() override {
    if (reshape_and_cache_) {
      ops::reshape_and_cache(key_, value_, key_cache_, value_cache_, slots_);
    } else {
      ops::scatter_pa_kv_cache(key_, value_, key_cache_, value_cache_, slots_, "Norm");
    }
  }

  graph::CallInfo info() const override {
    graph::CallInfo i;
    i.input = address(key_);
    i.output = address(key_cache_);
    i.table = address(slots_);
    return i;
  }

 private:
  at::Tensor key_, value_, key_cache_, value_cache_, slots_;
  bool reshape_and_cache_;
};

}  // namespace

void capture_paged_attention(graph::GraphParams& g, graph_calls::CallKeys keys, ops::PagedAttentionArgs a,
                             at::Tensor out) {
  graph::SharedWorkspace& ws = g.shared_workspace(kPagedAttentionWorkspace);
  g.offer_workspace(ws, [&] { return ops::paged_attention_get_workspace(a, out); });
  g.capture_call(std::make_unique<PagedAttentionCall>(keys, std::move(a), std::move(out), ws));
}

void capture_kv_write(graph::GraphParams& g, graph_calls::CallKeys keys, at::Tensor key, at::Tensor value,
                      at::Tensor key_cache, at::Tensor value_cache, at::Tensor slot_mapping, bool reshape_and_cache) {
  g.capture_call(std::make_unique<KvWriteCall>(keys, std::move(key), std::move(value), std::move(key_cache),
                                               std::move(value_cache), std::move(slot_mapping), reshape_and_cache));
}

graph::StepParams graph_step_params(const Metadata& md) {
  graph::StepParams sp;
  sp.block_tables = md.block_tables;
  sp.seq_lens = md.seq_lens;
  sp.q_ends = md.actual_seq_lengths_q;
  sp.kv_lens = md.seq_lens_list;
  sp.num_reqs = md.num_kernel_reqs;  // the kernels' rows, padding included
  sp.num_real_reqs = md.num_reqs;
  sp.num_kernel_tokens = md.num_kernel_tokens;
  sp.stamp = md.stamp;
  return sp;
}

}  // namespace aar::gqa
