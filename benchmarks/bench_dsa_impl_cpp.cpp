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
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "ascend_attn_rt/dsa/builder.h"
#include "ascend_attn_rt/dsa/impl.h"
#include "ascend_attn_rt/ops/provider.h"
#include "bench_timing.h"

namespace {

using aar::dsa::DsaCacheKind;

struct Result {
  std::string layer;
  int batch;
  double us;
};

constexpr int kMaxReqs = 256, kMaxModelLen = 8192, kCtx = 4000, kCbs = 128;
constexpr int64_t kHid = 7168, kN = 16, kD = 512, kR = 64, kQ = 1536, kNI = 64, kDI = 128, kK = 512, kG = 2,
                  kOL = 1024;

}  // namespace

int main(int argc, char** argv) {
  std::string out_path = "benchmarks/results/cpp_dsa_impl.json";
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--out") && i + 1 < argc) out_path = argv[++i];
    if (!std::strcmp(argv[i], "--quick")) quick = true;
  }
  const int scale = quick ? 10 : 1;
  aar::ops::ProviderOverride noop(aar::ops::Provider::NoCompute);
  c10::InferenceMode inference;
  at::set_num_threads(1);
  const c10::Device meta(c10::kMeta);
  const auto opts = at::TensorOptions().dtype(at::kBFloat16).device(meta);
  const auto f32 = at::TensorOptions().dtype(at::kFloat).device(meta);

  aar::dsa::StepBuilderConfig sc;
  sc.max_num_reqs = kMaxReqs;
  sc.max_num_tokens = 4096;
  sc.cos_table = at::randn({kMaxModelLen, kR}).to(at::kBFloat16);
  sc.sin_table = at::randn({kMaxModelLen, kR}).to(at::kBFloat16);
  sc.compress_cos_table = at::randn({kMaxModelLen, kR}).to(at::kBFloat16);
  sc.compress_sin_table = at::randn({kMaxModelLen, kR}).to(at::kBFloat16);
  sc.device = meta;
  aar::dsa::StepBuilder step(sc);
  const aar::dsa::AttnKvPlan plan = aar::dsa::make_attn_kv_plan(aar::dsa::DsaConfig{});
  const DsaCacheKind kinds[] = {DsaCacheKind::Swa,        DsaCacheKind::C4Kv,          DsaCacheKind::C128Kv,
                                DsaCacheKind::C4IndexerK, DsaCacheKind::C4AttnState,   DsaCacheKind::C4IndexerState,
                                DsaCacheKind::C128State};
  std::vector<std::unique_ptr<aar::dsa::GroupBuilder>> groups;
  std::vector<std::vector<int32_t>> tables;
  std::vector<int32_t> cols;
  std::vector<int64_t> rows, nbs;
  for (DsaCacheKind k : kinds) {
    const aar::dsa::DsaCacheSpec spec = aar::dsa::dsa_cache_spec(k, kCbs, plan);
    const int32_t c = static_cast<int32_t>((kMaxModelLen + spec.block_size - 1) / spec.block_size);
    aar::dsa::GroupConfig gc;
    gc.kind = k;
    gc.cache_block_size = kCbs;
    gc.plan = plan;
    gc.max_blocks_per_req = c;
    gc.num_blocks = kMaxReqs * c;
    gc.num_heads_q = static_cast<int32_t>(kN);
    gc.index_topk = static_cast<int32_t>(kK);
    gc.index_n_heads = static_cast<int32_t>(kNI);
    gc.index_head_dim = static_cast<int32_t>(kDI);
    groups.push_back(std::make_unique<aar::dsa::GroupBuilder>(step, gc));
    std::vector<int32_t> t(static_cast<size_t>(kMaxReqs) * c);
    for (size_t i = 0; i < t.size(); ++i) t[i] = static_cast<int32_t>(i);
    tables.push_back(std::move(t));
    cols.push_back(c);
    rows.push_back(spec.storage_block_size);
    nbs.push_back(gc.num_blocks);
  }
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
  std::vector<Result> results;
  for (const LayerKind& lk : layer_kinds) {
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
      std::vector<int32_t> qsl(B + 1), seq(B, kCtx);
      for (int b = 0; b <= B; ++b) qsl[b] = b;
      aar::dsa::StepInputs in;
      in.query_start_loc = aar::plan::CSpan<int32_t>(qsl.data(), qsl.size());
      in.seq_lens = aar::plan::CSpan<int32_t>(seq.data(), seq.size());
      const aar::dsa::StepMetadata& st = step.build(in);
      std::vector<const aar::dsa::GroupMetadata*> gm;
      for (size_t g = 0; g < groups.size(); ++g) {
        aar::dsa::GroupInputs gi;
        gi.block_table = aar::plan::CSpan<int32_t>(tables[g].data(), static_cast<size_t>(B) * cols[g]);
        gi.block_table_stride = cols[g];
        gm.push_back(&groups[g]->build(st, gi));
      }
      aar::dsa::LayerMetadata md =
          lk.ratio == 1   ? aar::dsa::route_layer(1, st, gm[0])
          : lk.ratio == 4 ? aar::dsa::route_layer(4, st, gm[0], gm[1], gm[4], gm[3], gm[5])
                          : aar::dsa::route_layer(128, st, gm[0], gm[2], gm[6]);
      const at::Tensor x = at::empty({B, kHid}, opts), out = at::empty({B, kHid}, opts);
      results.push_back({lk.name, B, aar_bench::time_us([&] { impl.forward(x, kv, &md, out, &topk); },
                                                        (B == 256 ? 5000 : 10000) / scale)});
    }
  }

  std::printf("%-24s %6s %10s\n", "layer", "batch", "us/call");
  for (const auto& r : results) std::printf("%-24s %6d %10.3f\n", r.layer.c_str(), r.batch, r.us);
  if (!out_path.empty() && out_path != "-") {  // "-": print only
    std::ofstream f(out_path);
    if (!f) {
      std::printf("could not write %s\n", out_path.c_str());
      return 1;
    }
    f << "{\n  \"tool\": \"bench_dsa_impl_cpp\",\n  \"provider\": \"no_compute\",\n  \"hardware_threads\": "
      << std::thread::hardware_concurrency() << ",\n  \"results\": [\n";
    for (size_t i = 0; i < results.size(); ++i) {
      const auto& r = results[i];
      f << "    {\"layer\": \"" << r.layer << "\", \"case\": \"decode, per layer forward\", \"batch\": " << r.batch
        << ", \"us_per_call\": " << r.us << "}" << (i + 1 < results.size() ? "," : "") << "\n";
    }
    f << "  ]\n}\n";
    std::printf("wrote %s\n", out_path.c_str());
  }
  return 0;
}
