// Contract adapters of the GQA-family backends ("gqa", "c8", "fa3"): one small
// decode step (three requests with context, one token each) through the GQA
// metadata builder and each family's layer (contract_util.h).
#include <memory>

#include "ascend_attn_rt/c8/backend.h"
#include "ascend_attn_rt/c8/impl.h"
#include "ascend_attn_rt/fa3/impl.h"
#include "ascend_attn_rt/gqa/builder.h"
#include "ascend_attn_rt/gqa/impl.h"
#include "contract_util.h"

namespace aar_contract {
namespace {

constexpr int64_t kHeads = 4, kKvHeads = 2, kHead = 32;

struct GqaStep {
  std::vector<int32_t> qsl{0, 1, 2, 3}, seq{5, 17, 9}, table;
  int32_t stride = 4;
  explicit GqaStep(int32_t bs) {
    for (int i = 0; i < 3 * stride; ++i) table.push_back(i % (64 / bs + 1));  // block ids within num_blocks
  }
  aar::gqa::BuildInputs inputs() const {
    aar::gqa::BuildInputs in;
    in.query_start_loc = {qsl.data(), qsl.size()};
    in.seq_lens = {seq.data(), seq.size()};
    in.block_table = {table.data(), table.size()};
    in.block_table_stride = stride;
    return in;
  }
};

aar::gqa::BuilderConfig builder_config(int32_t bs, int32_t num_blocks) {
  aar::gqa::BuilderConfig c;
  c.max_num_reqs = 4;
  c.max_num_tokens = 16;
  c.max_blocks_per_req = 4;
  c.block_size = bs;
  c.num_blocks = num_blocks;
  return c;
}

// Runs the contract on `layer` (forward in the contract's order) with caches `kc`, `vc`.
template <class Layer>
void run_layer(const BackendFacts& f, Layer& layer, int32_t bs, int32_t num_blocks, const at::Tensor& kc,
               const at::Tensor& vc) {
  const GqaStep step(bs);
  aar::gqa::MetadataBuilder b(builder_config(bs, num_blocks));
  check_builder(b, step.inputs(), f, /*decode_threshold=*/1);
  aar::gqa::MetadataBuilder eager_b(builder_config(bs, num_blocks)), capture_b(builder_config(bs, num_blocks));
  const aar::gqa::Metadata& md = eager_b.build(step.inputs());
  const aar::gqa::Metadata& cmd = capture_b.build_for_graph_capture(step.inputs(), AttentionState::DecodeOnly);
  const at::Tensor q = at::randn({3, kHeads, kHead}), k = at::randn({3, kKvHeads, kHead}), v = at::randn_like(k);
  check_impl<aar::gqa::Metadata>(
      f,
      [&](const aar::gqa::Metadata* m, const at::Tensor& out) -> const at::Tensor& {
        return layer.forward(q, k, v, kc, vc, m, out);
      },
      md, cmd, q, /*bucket=*/3);
}

const AdapterRegistrar kGqa("gqa", [](const BackendFacts& f) {
  aar::gqa::ImplConfig c;
  c.num_heads = kHeads;
  c.num_kv_heads = kKvHeads;
  c.head_size = kHead;
  aar::gqa::AttentionImpl layer(c);
  const at::Tensor kc = at::randn({8, 16, kKvHeads, kHead}), vc = at::randn_like(kc);
  run_layer(f, layer, 16, 8, kc, vc);
});

const AdapterRegistrar kFa3("fa3", [](const BackendFacts& f) {
  aar::fa3::ImplConfig c;
  c.num_heads = kHeads;
  c.num_kv_heads = kKvHeads;
  c.head_size = kHead;
  aar::fa3::AttentionImpl layer(c);
  const at::Tensor kc = at::randn({2, 128, kKvHeads, kHead}), vc = at::randn_like(kc);
  run_layer(f, layer, 128, 2, kc, vc);
});

const AdapterRegistrar kC8("c8", [](const BackendFacts& f) {
  aar::c8::ImplConfig c;
  c.num_heads = kHeads;
  c.num_kv_heads = kKvHeads;
  c.head_size = kHead;
  const int64_t n = kKvHeads * kHead;
  c.scales = {at::full({n}, 0.05), at::zeros({n}), at::full({n}, 0.05), at::zeros({n})};
  aar::c8::AttentionImpl layer(c);
  const auto shape = aar::c8::Backend::kv_cache_shape(4, 32, kKvHeads, kHead);  // (2, nb, Nkv, D/32, bs, 32)
  const at::Tensor kv = at::zeros(shape, at::kChar);
  run_layer(f, layer, 32, 4, kv.select(0, 0), kv.select(0, 1));
});

}  // namespace
}  // namespace aar_contract
