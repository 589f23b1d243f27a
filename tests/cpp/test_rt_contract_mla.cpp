// Contract adapter of the "mla" backend: one small decode step (three requests
// with context, one token each) through the MLA metadata builder and an MLA
// layer (contract_util.h). mla::LatentAttention takes the same metadata and is
// no backend of its own.
#include <cmath>
#include <optional>

#include "ascend_attn_rt/mla/backend.h"
#include "ascend_attn_rt/mla/builder.h"
#include "ascend_attn_rt/mla/impl.h"
#include "contract_util.h"

namespace aar_contract {
namespace {

constexpr int64_t kH = 4, kHidden = 64, kL = 32, kP = 16, kR = 8, kV = 16;
constexpr int32_t kBlock = 16, kMbr = 4, kNb = 9;

struct MlaStep {
  std::vector<int32_t> qsl{0, 1, 2, 3}, seq{5, 17, 9}, table;
  MlaStep() {
    for (int i = 0; i < 3 * kMbr; ++i) table.push_back(i % kNb);
  }
  aar::mla::BuildInputs inputs() const {
    aar::mla::BuildInputs in;
    in.query_start_loc = {qsl.data(), qsl.size()};
    in.seq_lens = {seq.data(), seq.size()};
    in.block_table = {table.data(), table.size()};
    in.block_table_stride = kMbr;
    return in;
  }
};

aar::mla::BuilderConfig builder_config() {
  aar::mla::BuilderConfig c;
  c.max_num_reqs = 4;
  c.max_num_tokens = 16;
  c.max_blocks_per_req = kMbr;
  c.block_size = kBlock;
  c.num_blocks = kNb;
  // RoPE tables with equal halves (the MLA layout).
  const at::Tensor ang = at::arange(64, at::kDouble).unsqueeze(1) * at::arange(1, kR / 2 + 1, at::kDouble) * 0.1;
  c.cos_table = at::cat({ang.cos(), ang.cos()}, 1).to(at::kFloat);
  c.sin_table = at::cat({ang.sin(), ang.sin()}, 1).to(at::kFloat);
  return c;
}

at::Tensor weight(int64_t o, int64_t i) { return at::randn({o, i}) / std::sqrt(static_cast<double>(i)); }

const AdapterRegistrar kMla("mla", [](const BackendFacts& f) {
  const MlaStep step;
  aar::mla::MetadataBuilder b(builder_config());
  check_builder(b, step.inputs(), f, /*decode_threshold=*/1);

  aar::mla::ImplConfig c;
  c.dims = {kH, kHidden, std::nullopt, kL, kP, kR, kV};
  aar::mla::Weights w;
  w.q_proj = weight(kH * (kP + kR), kHidden);
  w.kv_a_proj_with_mqa = weight(kL + kR, kHidden);
  w.kv_a_layernorm = at::ones({kL});
  w.kv_b_proj = weight(kH * (kP + kV), kL);
  w.o_proj = weight(kHidden, kH * kV);
  aar::mla::Impl layer(c, w);
  const auto shapes = aar::mla::Backend::kv_cache_shapes(kNb, kBlock, kL, kR);
  const at::Tensor nope = at::randn(shapes[0]), rope = at::randn(shapes[1]);
  aar::mla::MetadataBuilder eager_b(builder_config()), capture_b(builder_config());
  const aar::mla::Metadata& md = eager_b.build(step.inputs());
  const aar::mla::Metadata& cmd = capture_b.build_for_graph_capture(step.inputs(), AttentionState::DecodeOnly);
  const at::Tensor hidden = at::randn({3, kHidden});
  check_impl<aar::mla::Metadata>(
      f,
      [&](const aar::mla::Metadata* m, const at::Tensor& out) -> const at::Tensor& {
        return layer.forward(hidden, nope, rope, m, out);
      },
      md, cmd, hidden, /*bucket=*/3);
});

}  // namespace
}  // namespace aar_contract
