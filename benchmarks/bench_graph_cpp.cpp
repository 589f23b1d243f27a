// Per-step host cost of graph-mode parameter updates from C++: capture a bucket
// once, then time GraphParams::update (every captured attention call re-issued
// with the step's lists), with the no-compute operator provider and no-op graph
// hooks, so only the runtime's host work and the dispatcher are measured.
//
//   build/bench_graph_cpp [--out benchmarks/results/cpp_graph.json] [--quick]
#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "bench_timing.h"
#include "ascend_attn_rt/gqa/builder.h"
#include "ascend_attn_rt/gqa/graph.h"
#include "ascend_attn_rt/gqa/impl.h"
#include "ascend_attn_rt/graph/graph_params.h"
#include "ascend_attn_rt/ops/provider.h"

namespace {

using aar::plan::CSpan;

using aar_bench::time_us;

struct Row {
  std::string path;
  int layers, batch;
  double update_us, per_layer_us, step_with_build_us;
};

}  // namespace

int main(int argc, char** argv) {
  const aar_bench::Args args = aar_bench::parse_args(argc, argv, "benchmarks/results/cpp_graph.json");
  const int iters_scale = args.quick ? 10 : 1;
  aar::ops::ProviderOverride noop(aar::ops::Provider::NoCompute);
  const int N = 32, Nkv = 8, D = 128, bs = 128, ctx = 2048, blocks = 16;
  auto opts = at::TensorOptions().dtype(at::kBFloat16);
  at::Tensor kc = at::zeros({blocks, bs, Nkv, D}, opts), vc = at::zeros({blocks, bs, Nkv, D}, opts);

  std::vector<Row> rows;
  for (const bool paged : {false, true}) {
    for (int layers : {32, 61}) {
      for (int B : {1, 32, 256}) {
        aar::gqa::BuilderConfig bc;
        bc.max_num_reqs = 256;
        bc.max_num_tokens = 512;
        bc.max_blocks_per_req = 16;
        bc.block_size = bs;
        bc.num_blocks = blocks;
        aar::gqa::MetadataBuilder builder(bc);
        std::vector<int32_t> qsl(B + 1), seq(B, ctx), table(static_cast<size_t>(B) * 16);
        for (int i = 0; i <= B; ++i) qsl[i] = i;
        for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<int32_t>(i % blocks);
        aar::gqa::BuildInputs in;
        in.query_start_loc = CSpan<int32_t>(qsl.data(), qsl.size());
        in.seq_lens = CSpan<int32_t>(seq.data(), seq.size());
        in.block_table = CSpan<int32_t>(table.data(), table.size());
        in.block_table_stride = 16;

        aar::gqa::ImplConfig ic;
        ic.num_heads = N;
        ic.num_kv_heads = Nkv;
        ic.head_size = D;
        ic.full_decode_only_graph = paged;
        ic.pa_shape_list = {B};
        std::vector<std::unique_ptr<aar::gqa::AttentionImpl>> impls;
        at::Tensor q = at::zeros({B, N, D}, opts), k = at::zeros({B, Nkv, D}, opts), v = at::zeros({B, Nkv, D}, opts);
        at::Tensor out = at::zeros({B, N, D}, opts);
        std::optional<at::Tensor> ko = k, vo = v;
        aar::graph::GraphParams g(std::make_shared<aar::graph::HookGraphProvider>(aar::graph::GraphHooks{}));
        {
          const aar::gqa::Metadata& md = builder.build_for_graph_capture(in);
          aar::graph::CaptureScope scope(g, B);
          for (int l = 0; l < layers; ++l) {
            ic.layer_index = l;
            impls.push_back(std::make_unique<aar::gqa::AttentionImpl>(ic));
            impls.back()->forward(q, ko, vo, kc, vc, &md, out);
          }
        }
        const std::string path = aar::gqa::to_string(impls.back()->last_path());
        const aar::gqa::Metadata& md = builder.build(in);
        const int iters = std::max(50, 20000 / layers / (B >= 256 ? 2 : 1)) / iters_scale;
        const double upd = time_us([&] { g.update(B, md); }, iters);
        const double step = time_us([&] { g.update(B, builder.build(in)); }, iters);
        rows.push_back({path, layers, B, upd, upd / layers, step});
      }
    }
  }
  std::printf("%-16s %6s %6s %12s %14s %18s\n", "path", "layers", "batch", "update us", "per layer us",
              "build+update us");
  for (const auto& r : rows)
    std::printf("%-16s %6d %6d %12.2f %14.3f %18.2f\n", r.path.c_str(), r.layers, r.batch, r.update_us,
                r.per_layer_us, r.step_with_build_us);
  aar_bench::JsonReport report("bench_graph_cpp");
  report.field("graph_hooks", "noop");
  for (const auto& r : rows) {
    report.add("results", {{"path", r.path}, {"layers", r.layers}, {"batch", r.batch}, {"update_us", r.update_us},
                           {"per_layer_us", r.per_layer_us}, {"build_plus_update_us", r.step_with_build_us}});
  }
  return report.write(args.out) ? 0 : 1;
}
