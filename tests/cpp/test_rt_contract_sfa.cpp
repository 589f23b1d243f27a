// Contract adapter of the "sfa" backend: one small decode step (three requests
// with context, one token each) through the SFA metadata builder (with a draft
// lane: the backend declares draft lanes) and an SFA layer with an indexer
// (contract_util.h). The indexer cache group's builder is part of this backend.
#include <cmath>

#include "ascend_attn_rt/sfa/backend.h"
#include "ascend_attn_rt/sfa/builder.h"
#include "ascend_attn_rt/sfa/impl.h"
#include "contract_util.h"

namespace aar_contract {
namespace {

constexpr int64_t kH = 4, kHidden = 64, kQ = 48, kL = 64, kP = 32, kR = 16, kV = 32;
constexpr int64_t kIdxHeads = 4, kIdxD = 32, kIdxK = 8;
constexpr int32_t kBlock = 16, kMbr = 4, kNb = 8;

struct SfaStep {
  std::vector<int32_t> qsl{0, 1, 2, 3}, seq{5, 17, 9}, table;
  SfaStep() {
    for (int i = 0; i < 3 * kMbr; ++i) table.push_back(i % kNb);
  }
  aar::sfa::BuildInputs inputs() const {
    aar::sfa::BuildInputs in;
    in.query_start_loc = {qsl.data(), qsl.size()};
    in.seq_lens = {seq.data(), seq.size()};
    in.block_table = {table.data(), table.size()};
    in.block_table_stride = kMbr;
    return in;
  }
};

aar::sfa::BuilderConfig builder_config() {
  aar::sfa::BuilderConfig c;
  c.max_num_reqs = 4;
  c.max_num_tokens = 16;
  c.max_blocks_per_req = kMbr;
  c.block_size = kBlock;
  c.num_blocks = kNb;
  c.num_drafts = 1;
  const at::Tensor ang = at::arange(64, at::kDouble).unsqueeze(1) * at::arange(1, kR / 2 + 1, at::kDouble) * 0.1;
  c.cos_table = at::cat({ang.cos(), ang.cos()}, 1).to(at::kFloat);
  c.sin_table = at::cat({ang.sin(), ang.sin()}, 1).to(at::kFloat);
  return c;
}

at::Tensor weight(int64_t o, int64_t i) { return at::randn({o, i}) / std::sqrt(static_cast<double>(i)); }

const AdapterRegistrar kSfa("sfa", [](const BackendFacts& f) {
  const SfaStep step;
  aar::sfa::MetadataBuilder b(builder_config());
  check_builder(b, step.inputs(), f, /*decode_threshold=*/1);
  // The indexer group's builder: no metadata, the backend's capture states.
  aar::sfa::IndexerMetadataBuilder ib;
  for (AttentionState s : kStates) {
    if (aar::core::has_state(f.capturable, s)) {
      EXPECT_EQ(ib.build_for_graph_capture(step.inputs(), s), nullptr);
    } else {
      EXPECT_THROW(ib.build_for_graph_capture(step.inputs(), s), aar::NotSupported);
    }
  }
  EXPECT_EQ(ib.build_for_drafting(step.inputs(), 0), nullptr);

  aar::sfa::ImplConfig c;
  c.dims = {kH, kHidden, kQ, kL, kP, kR, kV};
  aar::sfa::IndexerConfig idx;
  idx.n_head = kIdxHeads;
  idx.head_dim = kIdxD;
  idx.topk = kIdxK;
  c.indexer = idx;
  aar::mla::Weights w;
  w.q_a_proj = weight(kQ, kHidden);
  w.q_a_layernorm = at::ones({kQ});
  w.q_proj = weight(kH * (kP + kR), kQ);
  w.kv_a_proj_with_mqa = weight(kL + kR, kHidden);
  w.kv_a_layernorm = at::ones({kL});
  w.kv_b_proj = weight(kH * (kP + kV), kL);
  w.o_proj = weight(kHidden, kH * kV);
  const aar::sfa::IndexerWeights iw{weight(kIdxHeads * kIdxD, kQ), weight(kIdxD, kHidden),
                                    weight(kIdxHeads, kHidden), at::ones({kIdxD}), at::zeros({kIdxD})};
  aar::sfa::Impl layer(c, w, iw);
  const std::vector<at::Tensor> kv{at::randn({kNb, kBlock, 1, kL}), at::randn({kNb, kBlock, 1, kR}),
                                   at::randn({kNb, kBlock, 1, kIdxD})};
  aar::sfa::MetadataBuilder eager_b(builder_config()), capture_b(builder_config());
  const aar::sfa::Metadata& md = eager_b.build(step.inputs());
  const aar::sfa::Metadata& cmd = capture_b.build_for_graph_capture(step.inputs(), AttentionState::DecodeOnly);
  const at::Tensor hidden = at::randn({3, kHidden});
  check_impl<aar::sfa::Metadata>(
      f,
      [&](const aar::sfa::Metadata* m, const at::Tensor& out) -> const at::Tensor& {
        return layer.forward(hidden, kv, m, out);
      },
      md, cmd, hidden, /*bucket=*/3);
});

}  // namespace
}  // namespace aar_contract
