#include "ascend_attn_rt/graph_calls/fused_attention_calls.h"

#include <memory>
#include <utility>

#include "ascend_attn_rt/errors.h"

namespace aar::graph_calls {

namespace {

// The two operator versions differ in their argument structs' field names only.
struct V1 {
  using Tensors = ops::FiaTensors;
  using Params = ops::FiaParams;
  static constexpr const char* kKind = "fia";
  template <class P>
  static auto& q_list(P& p) { return p.actual_seq_lengths; }
  template <class P>
  static auto& kv_list(P& p) { return p.actual_seq_lengths_kv; }
  static void run(const Tensors& t, const Params& p, const std::optional<at::Tensor>& ws, at::Tensor& out,
                  at::Tensor& lse) {
    ops::fused_infer_attention_score_out(t, p, ws, out, lse);
  }
  static at::Tensor workspace(const Tensors& t, const Params& p) {
    return ops::fused_infer_attention_score_get_max_workspace(t, p);
  }
};

struct V2 {
  using Tensors = ops::FiaV2Tensors;
  using Params = ops::FiaV2Params;
  static constexpr const char* kKind = "fia_v2";
  template <class P>
  static auto& q_list(P& p) { return p.actual_seq_qlen; }
  template <class P>
  static auto& kv_list(P& p) { return p.actual_seq_kvlen; }
  static void run(const Tensors& t, const Params& p, const std::optional<at::Tensor>& ws, at::Tensor& out,
                  at::Tensor& lse) {
    ops::fused_infer_attention_score_v2_out(t, p, ws, out, lse);
  }
  static at::Tensor workspace(const Tensors& t, const Params& p) {
    return ops::fused_infer_attention_score_v2_get_max_workspace(t, p);
  }
};

std::vector<int64_t> vec(c10::IntArrayRef r) { return std::vector<int64_t>(r.begin(), r.end()); }

template <class Op>
class FusedCall final : public graph::CapturedCall {
 public:
  FusedCall(CallKeys keys, FiaRefresh refresh, typename Op::Tensors t, typename Op::Params p, at::Tensor out,
            at::Tensor lse, graph::SharedWorkspace& ws)
      : CapturedCall(Op::kKind, keys.layer_index, keys.group, /*has_params=*/true),
        r_(refresh),
        t_(std::move(t)),
        p_(std::move(p)),
        out_(std::move(out)),
        lse_(std::move(lse)),
        ws_(&ws) {}

  void check(const graph::StepParams& sp, int64_t bucket) const override {
    check_step_rows(sp, t_.query.sizes()[0], !r_.q_lens, r_.q_lens, bucket);
  }

  // Only what a step changes is replaced, and kept aside (two list views and the
  // block table, moved) until the next refresh: revert() puts it back without a
  // copy of the call's arguments.
  void refresh(const graph::StepParams& sp, const graph::UpdatePass&) override {
    c10::IntArrayRef& q = Op::q_list(p_);
    c10::IntArrayRef& kv = Op::kv_list(p_);
    prev_q_ = q;
    prev_kv_ = kv;
    if (r_.q_lens) q = sp.q_ends;
    if (r_.paged) {
      prev_table_ = std::move(t_.block_table);
      t_.block_table = sp.block_tables;
      kv = sp.kv_lens;
    } else {
      kv = sp.q_ends;
    }
  }

  void revert() noexcept override {
    Op::q_list(p_) = prev_q_;
    Op::kv_list(p_) = prev_kv_;
    if (r_.paged) t_.block_table = std::move(prev_table_);
  }

  void launch() override { Op::run(t_, p_, ws_->tensor, out_, lse_); }

  graph::CallInfo info() const override {
    graph::CallInfo i;
    i.q_ends = vec(Op::q_list(p_));
    i.kv_lens = vec(Op::kv_list(p_));
    i.input = t_.query.defined() ? t_.query.data_ptr() : nullptr;
    i.output = out_.defined() ? out_.data_ptr() : nullptr;
    i.lse = lse_.defined() ? lse_.data_ptr() : nullptr;
    i.table = t_.block_table && t_.block_table->defined() ? t_.block_table->data_ptr() : nullptr;
    return i;
  }

 private:
  FiaRefresh r_;
  typename Op::Tensors t_;
  typename Op::Params p_;
  at::Tensor out_, lse_;
  graph::SharedWorkspace* ws_;  // the bucket's, at a stable address
  c10::IntArrayRef prev_q_, prev_kv_;
  std::optional<at::Tensor> prev_table_;
};

template <class Op>
void capture(graph::GraphParams& g, CallKeys keys, FiaRefresh refresh, typename Op::Tensors t, typename Op::Params p,
             at::Tensor out, at::Tensor lse) {
  graph::SharedWorkspace& ws = g.shared_workspace(kFiaWorkspace);
  g.offer_workspace(ws, [&] { return Op::workspace(t, p); });
  g.capture_call(std::make_unique<FusedCall<Op>>(keys, refresh, std::move(t), std::move(p), std::move(out),
                                                 std::move(lse), ws));
}

}  // namespace

void capture_fia(graph::GraphParams& g, CallKeys keys, FiaRefresh refresh, ops::FiaTensors t, ops::FiaParams p,
                 at::Tensor out, at::Tensor lse) {
  capture<V1>(g, keys, refresh, std::move(t), std::move(p), std::move(out), std::move(lse));
}

void capture_fia_v2(graph::GraphParams& g, CallKeys keys, FiaRefresh refresh, ops::FiaV2Tensors t,
                    ops::FiaV2Params p, at::Tensor out, at::Tensor lse) {
  capture<V2>(g, keys, refresh, std::move(t), std::move(p), std::move(out), std::move(lse));
}

void check_step_rows(const graph::StepParams& sp, int64_t rows, bool one_row_per_request, bool needs_q_ends,
                     int64_t n) {
  if (one_row_per_request) {
    AAR_CHECK_ARG(sp.num_reqs == rows && sp.num_kernel_tokens == sp.num_reqs, "the batch has ", sp.num_real_reqs,
                  " requests (", sp.num_reqs, " with padding, ", sp.num_kernel_tokens, " tokens) but graph bucket ", n,
                  " was captured for ", rows,
                  " one-token requests: pad it with one-token dummies (uniform_decode_padding)");
  } else {
    AAR_CHECK_ARG(sp.num_kernel_tokens == rows, "the batch has ", sp.num_kernel_tokens,
                  " kernel tokens but graph bucket ", n, " attends ", rows,
                  " rows: pad the batch to the bucket (num_input_tokens=", n, ")");
  }
  AAR_CHECK_ARG(static_cast<int64_t>(sp.kv_lens.size()) == sp.num_reqs &&
                    (!needs_q_ends || static_cast<int64_t>(sp.q_ends.size()) == sp.num_reqs),
                "step parameters are inconsistent: ", sp.num_reqs, " requests but ", sp.kv_lens.size(),
                " KV lengths and ", sp.q_ends.size(), " query ends");
}

}  // namespace aar::graph_calls
