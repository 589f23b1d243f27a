// Contract adapter of the DeepSeek-V4 backend ("dsa"): a small C4 layer (it reads
// every kind of KV-cache group) and a decode step of three requests with
// context, one token each. The step builder is the contract's builder
// (contract_util.h); its group builders are checked here for the step's main,
// captured and draft builds: their counts follow the step's, a draft build of an
// SWA group keeps the main group metadata current, a compressed group refuses to
// draft by name.
#include <memory>

#include "ascend_attn_rt/dsa/builder.h"
#include "ascend_attn_rt/dsa/impl.h"
#include "contract_util.h"

namespace aar_contract {
namespace {

using aar::dsa::DsaCacheKind;

constexpr int64_t kHidden = 64, kN = 2, kD = 32, kR = 16, kQ = 32, kNi = 2, kDi = 16, kK = 8, kG = 2, kOl = 8;
constexpr int32_t kW = 8, kCbs = 32, kMbr = 24, kNumBlocks = 3 * kMbr + 1;  // C4 state pages hold 2 rows
// route_layer's order for a ratio-4 layer.
constexpr DsaCacheKind kKinds[] = {DsaCacheKind::Swa, DsaCacheKind::C4Kv, DsaCacheKind::C4AttnState,
                                   DsaCacheKind::C4IndexerK, DsaCacheKind::C4IndexerState};

at::Tensor rnd(at::Generator& g, at::IntArrayRef shape, double scale) {
  return at::randn(shape, g, at::TensorOptions().dtype(at::kFloat)) * scale;
}

aar::dsa::Weights weights() {
  at::Generator g = at::detail::createCPUGenerator(11);
  auto lin = [&](int64_t out, int64_t in) { return rnd(g, {out, in}, 1.0 / std::sqrt(double(in))); };
  auto norm = [&](int64_t n) { return 1.0 + rnd(g, {n}, 0.1); };
  aar::dsa::Weights w;
  w.wq_a = lin(kQ, kHidden);
  w.q_norm = norm(kQ);
  w.wq_b = lin(kN * kD, kQ);
  w.wkv = lin(kD, kHidden);
  w.kv_norm = norm(kD);
  w.attn_sink = rnd(g, {kN}, 1.0);
  w.wo_a = rnd(g, {kG, kN * kD / kG, kOl}, 1.0 / std::sqrt(double(kN * kD / kG)));
  w.wo_b = lin(kHidden, kG * kOl);
  w.cmp_wkv = lin(2 * kD, kHidden);
  w.cmp_wgate = lin(2 * kD, kHidden);
  w.cmp_ape = rnd(g, {4, 2 * kD}, 0.5);
  w.cmp_norm = norm(kD);
  w.idx_wq_b = lin(kNi * kDi, kQ);
  w.idx_weights_proj = lin(kNi, kHidden);
  w.idx_cmp_wkv = lin(2 * kDi, kHidden);
  w.idx_cmp_wgate = lin(2 * kDi, kHidden);
  w.idx_cmp_ape = rnd(g, {4, 2 * kDi}, 0.5);
  w.idx_cmp_norm = norm(kDi);
  return w;
}

aar::dsa::StepBuilderConfig step_config() {
  aar::dsa::StepBuilderConfig c;
  c.max_num_reqs = 4;
  c.max_num_tokens = 16;
  c.num_drafts = 1;  // one draft lane: build_for_drafting(.., 0) keeps the main metadata
  const at::Tensor inv = at::pow(10000.0, -at::arange(0, kR, 2, at::kDouble) / kR);
  const at::Tensor ang = (at::arange(512, at::kDouble).unsqueeze(1) * inv).repeat_interleave(2, -1);
  c.cos_table = c.compress_cos_table = ang.cos().to(at::kFloat);
  c.sin_table = c.compress_sin_table = ang.sin().to(at::kFloat);
  c.model.head_dim = kD;
  c.model.window = kW;
  c.model.num_heads_q = kN;
  c.model.index_topk = kK;
  c.model.index_n_heads = kNi;
  c.model.index_head_dim = kDi;
  return c;
}

// A step builder and the five groups of a C4 layer, and the step's tables.
struct Builders {
  aar::dsa::StepBuilder step{step_config()};
  std::vector<std::unique_ptr<aar::dsa::GroupBuilder>> groups;
  std::vector<int32_t> table;  // every group's: request b owns blocks 1 + b * kMbr ...
  explicit Builders(const aar::dsa::AttnKvPlan& plan) {
    for (DsaCacheKind k : kKinds) {
      aar::dsa::GroupConfig gc;
      gc.kind = k;
      gc.cache_block_size = kCbs;
      gc.plan = plan;
      gc.max_blocks_per_req = kMbr;
      gc.num_blocks = kNumBlocks;
      groups.push_back(std::make_unique<aar::dsa::GroupBuilder>(step, gc));
    }
    for (int32_t b = 0; b < 3; ++b) {
      for (int32_t c = 0; c < kMbr; ++c) table.push_back(1 + b * kMbr + c);
    }
  }
  aar::dsa::GroupInputs group_inputs() const {
    aar::dsa::GroupInputs gi;
    gi.block_table = {table.data(), table.size()};
    gi.block_table_stride = kMbr;
    return gi;
  }
  // The five groups built for `st` (a main-lane step of this builder) and routed for a C4 layer.
  aar::dsa::LayerMetadata route(const aar::dsa::StepMetadata& st) {
    std::vector<const aar::dsa::GroupMetadata*> gm;
    for (auto& g : groups) {
      const aar::dsa::GroupMetadata& m = g->build(st, group_inputs());
      EXPECT_EQ(m.num_reqs, st.num_reqs) << aar::dsa::to_string(m.kind);
      EXPECT_EQ(m.num_kernel_reqs, st.num_kernel_reqs) << aar::dsa::to_string(m.kind);
      EXPECT_EQ(m.block_table.size(0), st.num_kernel_reqs) << aar::dsa::to_string(m.kind);
      EXPECT_TRUE(m.current()) << aar::dsa::to_string(m.kind);
      gm.push_back(&m);
    }
    return aar::dsa::route_layer(4, st, gm[0], gm[1], gm[2], gm[3], gm[4]);
  }
};

struct DecodeStep {
  std::vector<int32_t> qsl{0, 1, 2, 3}, seq{9, 41, 20};
  aar::dsa::StepInputs inputs() const {
    aar::dsa::StepInputs in;
    in.query_start_loc = {qsl.data(), qsl.size()};
    in.seq_lens = {seq.data(), seq.size()};
    return in;
  }
};

const AdapterRegistrar kDsa("dsa", [](const BackendFacts& f) {
  const aar::dsa::AttnKvPlan plan = aar::dsa::make_attn_kv_plan(aar::dsa::DsaConfig{});
  const DecodeStep step;

  // The builder part on the step builder.
  {
    Builders b(plan);
    check_builder(b.step, step.inputs(), f, /*decode_threshold=*/1);
  }

  // The groups for the step's main, captured and draft builds.
  {
    Builders b(plan);
    const aar::dsa::StepMetadata& main = b.step.build(step.inputs());
    const aar::dsa::LayerMetadata routed = b.route(main);
    EXPECT_EQ(routed.step, &main);
    const aar::dsa::GroupMetadata& swa_main = *routed.swa;
    const uint64_t swa_generation = swa_main.stamp.generation;
    const aar::dsa::StepMetadata& draft = b.step.build_for_drafting(step.inputs(), 0);
    EXPECT_TRUE(main.stamp.current());
    const aar::dsa::GroupMetadata& swa_draft = b.groups[0]->build_for_drafting(draft, b.group_inputs(), 0);
    EXPECT_EQ(swa_draft.draft_index, 0);
    EXPECT_EQ(swa_draft.num_reqs, draft.num_reqs);
    EXPECT_TRUE(swa_main.current()) << "a draft lane's group build made the main group metadata stale";
    EXPECT_EQ(swa_main.stamp.generation, swa_generation);
    // A compressed group does not draft: refused by name.
    try {
      b.groups[1]->build_for_drafting(draft, b.group_inputs(), 0);
      ADD_FAILURE() << "a C4 KV group built for drafting";
    } catch (const aar::NotSupported& e) {
      EXPECT_NE(std::string(e.what()).find(aar::dsa::to_string(DsaCacheKind::C4Kv)), std::string::npos) << e.what();
    }
    EXPECT_THROW(b.groups[0]->build_for_drafting(draft, b.group_inputs(), -1), aar::InvalidArgument);
    // A draft step is not the main lane's: a main group build refuses it.
    EXPECT_THROW(b.groups[0]->build(draft, b.group_inputs()), aar::InvalidArgument);
  }

  // The impl part: one layer, caches from the groups' specs, eager and captured metadata
  // from builders of their own (a capture build does not make the eager metadata stale).
  Builders eager_b(plan), capture_b(plan);
  const aar::dsa::LayerMetadata md = eager_b.route(eager_b.step.build(step.inputs()));
  const aar::dsa::LayerMetadata cmd =
      capture_b.route(capture_b.step.build_for_graph_capture(step.inputs(), AttentionState::DecodeOnly));
  std::vector<at::Tensor> caches;
  for (auto& g : eager_b.groups) {
    const aar::dsa::DsaCacheSpec& sp = g->cache_spec();
    caches.push_back(at::zeros(aar::dsa::dsa_kv_cache_shape(sp, kNumBlocks),
                               sp.kind == DsaCacheKind::C4IndexerK ? at::kChar : at::kFloat));
  }
  const aar::dsa::DsaCacheSpec& isp = eager_b.groups[3]->cache_spec();
  const at::Tensor iscale = at::zeros(aar::dsa::dsa_scale_cache_shape(isp, kNumBlocks), at::kHalf);
  const std::vector<at::Tensor> kv =
      aar::dsa::compose_kv_cache(plan, caches[1], caches[0], caches[2], caches[4], caches[3], iscale);
  aar::dsa::ImplConfig ic;
  ic.hidden_size = kHidden;
  ic.num_heads = kN;
  ic.head_dim = kD;
  ic.rope_dim = kR;
  ic.q_lora_rank = kQ;
  ic.compress_ratio = 4;
  ic.index_n_heads = kNi;
  ic.index_head_dim = kDi;
  ic.index_topk = kK;
  ic.o_groups = kG;
  ic.o_lora_rank = kOl;
  ic.plan = plan;
  aar::dsa::Impl layer(ic, weights());
  at::Generator g = at::detail::createCPUGenerator(5);
  const at::Tensor hidden = rnd(g, {3, kHidden}, 1.0);
  check_impl<aar::dsa::LayerMetadata>(
      f,
      [&](const aar::dsa::LayerMetadata* m, const at::Tensor& out) -> const at::Tensor& {
        return layer.forward(hidden, kv, m, out);
      },
      md, cmd, hidden, /*bucket=*/3);
});

}  // namespace
}  // namespace aar_contract
