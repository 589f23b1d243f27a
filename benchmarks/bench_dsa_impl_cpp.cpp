// Host-time benchmark of the DeepSeek-V4 (DSA) layer forward (dsa::Impl) from
// C++ with the no-compute operator provider: every tensor on the meta device
// (shapes only), so each number is the layer's host work alone (validation,
// operator dispatch, tensor views), as on an NPU where kernels run async.
//
// Shapes (DSV4-like, TP 8; an assumption, not read from a checkpoint): hidden
// 7168, 16 local heads x 512 (rope 64), q-LoRA 1536, window 128, indexer 64 x
// 128 with top-k 512, o_groups 2 local with o_lora 1024, bf16, the A2 plan,
// cache block size 128. Per layer kind (SWA only, C4 with its indexer, C4
// reusing the top-k (skip_topk), C128), decode batches of 1/32/256 requests at
// 4000-token contexts. The metadata is built once per batch (not timed here:
// bench_dsa_cpp times the builders).
//
//   build/bench_dsa_impl_cpp [--out benchmarks/results/cpp_dsa_impl.json] [--quick]
//
// AAR_BENCH_LAYER=<text> runs only the layer kinds whose name contains it (for
// a profiler: valgrind --tool=callgrind --toggle-collect='aar::dsa::Impl::forward(*').
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "ascend_attn_rt/dsa/builder.h"
#include "ascend_attn_rt/dsa/impl.h"
#include "ascend_attn_rt/ops/provider.h"
#include "bench_dsa_model.h"
#include "bench_timing.h"

namespace {

constexpr int kCtx = 4000;
constexpr int64_t kHid = 7168, kN = 16, kD = 512, kR = 64, kQ = 1536, kNI = 64, kDI = 128, kK = 512, kG = 2,
                  kOL = 1024;

}  // namespace

int main(int argc, char** argv) {
  const aar_bench::Args args = aar_bench::parse_args(argc, argv, "benchmarks/results/cpp_dsa_impl.json");
  const int scale = args.quick ? 10 : 1;
  aar::ops::ProviderOverride noop(aar::ops::Provider::NoCompute);
  c10::InferenceMode inference;
  at::set_num_threads(1);
  const c10::Device meta(c10::kMeta);
  const auto opts = at::TensorOptions().dtype(at::kBFloat16).device(meta);
  const auto f32 = at::TensorOptions().dtype(at::kFloat).device(meta);

  aar_bench::DsaModelOptions mo;
  mo.device = meta;
  mo.num_heads_q = static_cast<int32_t>(kN);
  mo.index_topk = static_cast<int32_t>(kK);
  mo.index_n_heads = static_cast<int32_t>(kNI);
  mo.index_head_dim = static_cast<int32_t>(kDI);
  mo.wrap_table_ids = false;
  aar_bench::DsaModel model = aar_bench::make_dsa_model(mo);
  aar::dsa::StepBuilder& step = *model.step;
  const aar::dsa::AttnKvPlan plan = model.plan;
  const std::vector<int64_t>& rows = model.storage_block_sizes;
  const std::vector<int64_t>& nbs = model.num_blocks;
  // Caches (meta): SWA, compressed KV, states, indexer k / scale.
  auto cache = [&](size_t g, int64_t width) { return at::empty({nbs[g], rows[g], 1, width}, opts); };
  const at::Tensor swa = cache(0, kD), c4kv = cache(1, kD), c128kv = cache(2, kD);
  const at::Tensor ik = at::empty({nbs[3], rows[3], 1, kDI}, opts.dtype(at::kChar));
  const at::Tensor isc = at::empty({nbs[3], rows[3], 1}, opts.dtype(at::kHalf));
  const at::Tensor c4st = at::empty({nbs[4], rows[4], 4 * kD}, f32), ist = at::empty({nbs[5], rows[5], 4 * kDI}, f32),
                   c128st = at::empty({nbs[6], rows[6], 2 * kD}, f32);

  auto w = [&](int64_t o, int64_t i) { return at::empty({o, i}, opts); };
  auto layer_weights = [&](int r) {
    aar::dsa::Weights ws;
    ws.wq_a = w(kQ, kHid);
    ws.q_norm = at::empty({kQ}, opts);
    ws.wq_b = w(kN * kD, kQ);
    ws.wkv = w(kD, kHid);
    ws.kv_norm = at::empty({kD}, opts);
    ws.attn_sink = at::empty({kN}, f32);
    ws.wo_a = at::empty({kG, kN * kD / kG, kOL}, opts);
    ws.wo_b = w(kHid, kG * kOL);
    if (r > 1) {
      const int64_t coff = r == 4 ? 2 : 1;
      ws.cmp_wkv = w(coff * kD, kHid);
      ws.cmp_wgate = w(coff * kD, kHid);
      ws.cmp_ape = at::empty({r, coff * kD}, opts);
      ws.cmp_norm = at::empty({kD}, opts);
    }
    if (r == 4) {
      ws.idx_wq_b = w(kNI * kDI, kQ);
      ws.idx_weights_proj = w(kNI, kHid);
      ws.idx_cmp_wkv = w(2 * kDI, kHid);
      ws.idx_cmp_wgate = w(2 * kDI, kHid);
      ws.idx_cmp_ape = at::empty({4, 2 * kDI}, opts);
      ws.idx_cmp_norm = at::empty({kDI}, opts);
    }
    return ws;
  };
  struct LayerKind {
    const char* name;
    int ratio;
    bool skip;
  };
  const LayerKind layer_kinds[] = {{"SWA (ratio 1)", 1, false},
                                   {"C4 + indexer top-k", 4, false},
                                   {"C4, top-k reused", 4, true},
                                   {"C128", 128, false}};
  aar::sfa::TopkBuffer topk(4096, kK, meta);
  aar_bench::JsonReport report("bench_dsa_impl_cpp");
  report.hardware_threads();
  std::printf("%-24s %6s %10s\n", "layer", "batch", "us/call");
  const char* only = std::getenv("AAR_BENCH_LAYER");
  for (const LayerKind& lk : layer_kinds) {
    if (only != nullptr && std::string(lk.name).find(only) == std::string::npos) continue;
    aar::dsa::ImplConfig ic;
    ic.hidden_size = kHid;
    ic.num_heads = kN;
    ic.head_dim = kD;
    ic.rope_dim = kR;
    ic.q_lora_rank = kQ;
    ic.window = 128;
    ic.compress_ratio = lk.ratio;
    ic.index_n_heads = kNI;
    ic.index_head_dim = kDI;
    ic.index_topk = kK;
    ic.o_groups = kG;
    ic.o_lora_rank = kOL;
    ic.plan = plan;
    ic.skip_topk = lk.skip;
    aar::dsa::Impl impl(ic, layer_weights(lk.ratio));
    std::vector<at::Tensor> kv = aar::dsa::compose_kv_cache(
        plan, lk.ratio == 4 ? c4kv : (lk.ratio == 128 ? c128kv : at::Tensor()), swa,
        lk.ratio == 4 ? c4st : (lk.ratio == 128 ? c128st : at::Tensor()), lk.ratio == 4 ? ist : at::Tensor(),
        lk.ratio == 4 ? ik : at::Tensor(), lk.ratio == 4 ? isc : at::Tensor());
    for (int B : {1, 32, 256}) {
      const aar_bench::DecodeBatch batch(B, kCtx);
      const aar::dsa::StepMetadata& st = step.build(batch.inputs());
      std::vector<const aar::dsa::GroupMetadata*> gm;
      for (size_t g = 0; g < model.groups.size(); ++g) {
        gm.push_back(&model.groups[g]->build(st, aar_bench::dsa_group_inputs(model, g, B)));
      }
      aar::dsa::LayerMetadata md =
          lk.ratio == 1   ? aar::dsa::route_layer(1, st, gm[0])
          : lk.ratio == 4 ? aar::dsa::route_layer(4, st, gm[0], gm[1], gm[4], gm[3], gm[5])
                          : aar::dsa::route_layer(128, st, gm[0], gm[2], gm[6]);
      const at::Tensor x = at::empty({B, kHid}, opts), out = at::empty({B, kHid}, opts);
      const double us =
          aar_bench::time_us([&] { impl.forward(x, kv, &md, out, &topk); }, (B == 256 ? 5000 : 10000) / scale);
      std::printf("%-24s %6d %10.3f\n", lk.name, B, us);
      report.add("results", {{"layer", lk.name}, {"case", "decode, per layer forward"}, {"batch", B},
                             {"us_per_call", us}});
    }
  }
  return report.write(args.out) ? 0 : 1;
}
