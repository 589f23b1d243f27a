// Host-time benchmark of the SFA backend (DeepSeek-V3.2 sparse attention) from
// C++, with the no-compute operator provider. `build`: decode batches of
// 1/32/256/1024 requests at 1000-token contexts (block size 128, a 64-column
// block table, R = 64 bf16 RoPE tables), a mixed batch (32 decodes + 4 x 256
// new tokens on 3000 cached) and a prefill (8 x 2048 new tokens, no cache;
// upstream's build cases: 1024 decodes, mixed, prefill), on the CPU (the host
// buffer is the device buffer) with the block table staged in the builder
// (zero copy) or in a separate host table, and with separate device buffers
// (the device path on the CPU: one copy per step). `forward`: Impl::forward per
// layer for decode batches 1/32/256 at DeepSeek-V3.2 shapes with TP 8 (16
// heads, hidden 7168, q-LoRA 1536, L 512, P/V 128, R 64, bf16; lightning
// indexer 64 x 128, top-k 2048), a layer with an indexer (keys, weights and
// queries, the indexer cache write, the indexer, sparse attention) and one that
// reuses the top-k buffer, every tensor on the meta device (shapes only: the
// layer's operators and tensor ops cost their host work alone, as on an NPU).
// `graph`: GraphParams::update of a captured KV-offload decode bucket (the
// recording provider; 1 and 61 offloaded layers, 32 and 256 decodes at
// 4096-token contexts, block size 128, a 64-column block table): the per-layer
// checks and the host inputs the callbacks read, since docs/design/sfa.md §6.7
// a snapshot copied once per update (the decode rows' lists, the block-table
// rows their lengths reach, the slots). The layers' dimensions are small (the
// update reads none of the layer's tensors).
// Torch runs one intra-op thread (AAR_BENCH_THREADS=N to change it): the host
// path is single-threaded, and the separate-buffer copies would otherwise spin
// OpenMP workers on the second core.
//
//   build/bench_sfa_cpp [--out benchmarks/results/cpp_sfa.json] [--quick] [--only build|forward|graph]
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench_timing.h"
#include "ascend_attn_rt/graph/graph_params.h"
#include "ascend_attn_rt/ops/provider.h"
#include "ascend_attn_rt/sfa/builder.h"
#include "ascend_attn_rt/sfa/graph.h"
#include "ascend_attn_rt/sfa/host_pool.h"
#include "ascend_attn_rt/sfa/impl.h"

namespace {

struct Result {
  std::string group, name;
  int batch;
  double us;
};

using aar_bench::Batch;
using aar_bench::time_us;

constexpr int kMaxReqs = 1024, kMbr = 64, kBs = 128, kR = 64;

Batch make_batch(int decodes, int decode_seq, int prefills, int prefill_new, int prefill_ctx) {
  return aar_bench::make_batch(decodes, decode_seq, prefills, prefill_new, prefill_ctx, kMbr, kMaxReqs * kMbr);
}

aar::sfa::BuildInputs inputs_of(const Batch& b) { return aar_bench::inputs_of<aar::sfa::BuildInputs>(b); }

aar::sfa::BuilderConfig builder_config(c10::Device device, bool separate) {
  aar::sfa::BuilderConfig c;
  c.max_num_reqs = kMaxReqs;
  c.max_num_tokens = 16384;
  c.max_blocks_per_req = kMbr;
  c.block_size = kBs;
  c.num_blocks = kMaxReqs * kMbr;
  c.cos_table = at::randn({kMbr * kBs, kR}).to(at::kBFloat16);
  c.sin_table = at::randn({kMbr * kBs, kR}).to(at::kBFloat16);
  c.device = device;
  c.separate_device_buffers = separate;
  return c;
}

}  // namespace

int main(int argc, char** argv) {
  const aar_bench::Args args = aar_bench::parse_args(argc, argv, "benchmarks/results/cpp_sfa.json", true);
  const std::string& only = args.only;
  const int scale = args.quick ? 10 : 1;
  aar::ops::ProviderOverride noop(aar::ops::Provider::NoCompute);
  c10::InferenceMode inference;  // as serving engines run the model
  const char* threads_env = std::getenv("AAR_BENCH_THREADS");
  const int threads = threads_env != nullptr ? std::atoi(threads_env) : 1;
  at::set_num_threads(threads);
  std::vector<Result> results;

  // ---------------------------------------------------------------- build
  for (bool separate : {false, true}) {
    if (only == "forward" || only == "graph" || (separate && std::getenv("AAR_BENCH_BATCH"))) break;
    aar::sfa::MetadataBuilder builder(builder_config(c10::Device(c10::kCPU), separate));
    const std::string path = separate ? "build, separate buffers" : "build, cpu (aliased)";
    for (int B : {1, 32, 256, 1024}) {
      if (const char* only_b = std::getenv("AAR_BENCH_BATCH"); only_b && std::atoi(only_b) != B) continue;
      Batch b = make_batch(B, 1000, 0, 0, 0);
      auto in = inputs_of(b);
      results.push_back({path, "decode, host block table", B, time_us([&] { builder.build(in); }, 20000 / scale)});
      std::memcpy(builder.block_table_staging().data_ptr<int32_t>(), b.table.data(), b.table.size() * 4);
      in.block_table = aar::plan::CSpan<int32_t>(builder.block_table_staging().data_ptr<int32_t>(), b.table.size());
      results.push_back({path, "decode, staged block table", B, time_us([&] { builder.build(in); }, 20000 / scale)});
    }
    Batch b = make_batch(32, 1000, 4, 256, 3000);
    auto in = inputs_of(b);
    results.push_back({path, "mixed 32 dec + 4x256 prefill", 36, time_us([&] { builder.build(in); }, 5000 / scale)});
    Batch p = make_batch(0, 0, 8, 2048, 0);
    auto pin = inputs_of(p);
    results.push_back({path, "prefill 8x2048", 8, time_us([&] { builder.build(pin); }, 2000 / scale)});
  }

  // ---------------------------------------------------------------- forward
  if (only != "build" && only != "graph") {
    const c10::Device meta(c10::kMeta);
    aar::sfa::MetadataBuilder builder(builder_config(meta, false));
    const int64_t H = 16, hid = 7168, Q = 1536, L = 512, P = 128, V = 128, NI = 64, DI = 128, K = 2048;
    const auto opts = at::TensorOptions().dtype(at::kBFloat16).device(meta);
    auto w = [&](int64_t o, int64_t i) { return at::empty({o, i}, opts); };
    aar::mla::Weights ws;
    ws.q_a_proj = w(Q, hid);
    ws.q_a_layernorm = at::empty({Q}, opts);
    ws.q_proj = w(H * (P + kR), Q);
    ws.kv_a_proj_with_mqa = w(L + kR, hid);
    ws.kv_a_layernorm = at::empty({L}, opts);
    ws.kv_b_proj = w(H * (P + V), L);
    ws.o_proj = w(hid, H * V);
    aar::sfa::IndexerWeights iw{w(NI * DI, Q), w(DI, hid), w(NI, hid), at::empty({DI}, opts), at::empty({DI}, opts)};
    const int64_t nb = int64_t{kMaxReqs} * kMbr;
    const std::vector<at::Tensor> caches{at::empty({nb, kBs, 1, L}, opts), at::empty({nb, kBs, 1, kR}, opts),
                                         at::empty({nb, kBs, 1, DI}, opts)};
    const std::vector<at::Tensor> main_caches{caches[0], caches[1]};
    aar::sfa::TopkBuffer topk(4096, K, meta);
    for (bool indexer : {true, false}) {
      aar::sfa::ImplConfig ic;
      ic.dims.num_heads = H;
      ic.dims.hidden_size = hid;
      ic.dims.q_lora_rank = Q;
      ic.dims.kv_lora_rank = L;
      ic.dims.qk_nope_head_dim = P;
      ic.dims.qk_rope_head_dim = kR;
      ic.dims.v_head_dim = V;
      if (indexer) {
        aar::sfa::IndexerConfig idx;
        idx.n_head = NI;
        idx.head_dim = DI;
        idx.topk = K;
        ic.indexer = idx;
        ic.use_index_cache = true;
      }
      aar::sfa::Impl impl(ic, ws, indexer ? std::optional<aar::sfa::IndexerWeights>(iw) : std::nullopt);
      const std::string path = indexer ? "forward, indexer layer" : "forward, top-k reused";
      for (int B : {1, 32, 256}) {
        if (const char* only_b = std::getenv("AAR_BENCH_BATCH"); only_b && std::atoi(only_b) != B) continue;
        Batch b = make_batch(B, 1000, 0, 0, 0);
        const auto& md = builder.build(inputs_of(b));
        const at::Tensor x = at::empty({B, hid}, opts);
        const at::Tensor out = at::empty({B, hid}, opts);
        const auto& kv = indexer ? caches : main_caches;
        results.push_back({path, "decode, per layer", B,
                           time_us([&] { impl.forward(x, kv, &md, out, &topk); }, 20000 / scale)});
      }
    }
  }

  // ---------------------------------------------------------------- graph update of an offloaded bucket
  if (only != "build" && only != "forward") {
    const int64_t H = 1, hid = 64, Q = 32, L = 16, P = 16, V = 16, R = 8, NI = 2, DI = 16, K = 128, ctx = 4096;
    const int64_t blocks = 256 * (ctx / kBs);
    const auto opts = at::TensorOptions().dtype(at::kBFloat16);
    auto w = [&](int64_t o, int64_t i) { return at::zeros({o, i}, opts); };
    aar::mla::Weights ws;
    ws.q_a_proj = w(Q, hid);
    ws.q_a_layernorm = at::ones({Q}, opts);
    ws.q_proj = w(H * (P + R), Q);
    ws.kv_a_proj_with_mqa = w(L + R, hid);
    ws.kv_a_layernorm = at::ones({L}, opts);
    ws.kv_b_proj = w(H * (P + V), L);
    ws.o_proj = w(hid, H * V);
    aar::sfa::IndexerWeights iw{w(NI * DI, Q), w(DI, hid), w(NI, hid), at::ones({DI}, opts), at::zeros({DI}, opts)};
    const std::vector<at::Tensor> caches{at::zeros({blocks, kBs, 1, DI}, opts)};  // the indexer's (the rest: the pool)
    aar::sfa::HostKvPoolConfig pc;
    pc.num_layers = 1;
    pc.block_size = kBs;
    pc.kv_lora_rank = L;
    pc.qk_rope_head_dim = R;
    pc.budget_bytes = blocks * aar::sfa::HostKvPool::block_bytes(1, kBs, L, R);
    const std::shared_ptr<aar::sfa::HostKvPool> pool = aar::sfa::HostKvPool::create(pc);
    for (int layers : {1, 61}) {
      for (int B : {32, 256}) {
        aar::sfa::BuilderConfig bc;
        bc.max_num_reqs = 256;
        bc.max_num_tokens = 256;
        bc.max_blocks_per_req = kMbr;
        bc.block_size = kBs;
        bc.num_blocks = blocks;
        bc.cos_table = at::zeros({kMbr * kBs, R}, opts);
        bc.sin_table = at::zeros({kMbr * kBs, R}, opts);
        bc.graph_decode_padding = true;
        bc.offload = aar::sfa::BuilderOffloadConfig{/*is_decode_consumer=*/true};
        aar::sfa::MetadataBuilder builder(bc);
        Batch b = aar_bench::make_batch(B, ctx, 0, 0, 0, kMbr, static_cast<int>(blocks));
        std::vector<uint64_t> ids(static_cast<size_t>(B));
        for (int i = 0; i < B; ++i) ids[static_cast<size_t>(i)] = 1000 + static_cast<uint64_t>(i);
        auto in = inputs_of(b);
        in.req_ids = aar::plan::CSpan<uint64_t>(ids.data(), ids.size());
        in.num_input_tokens = B;
        std::vector<std::unique_ptr<aar::sfa::Impl>> impls;
        aar::graph::GraphParams g(std::make_shared<aar::graph::RecordingGraphProvider>());
        const at::Tensor x = at::zeros({B, hid}, opts);
        std::vector<at::Tensor> outs;
        {
          const aar::sfa::Metadata& md = builder.build_for_graph_capture(in);
          aar::graph::CaptureScope scope(g, B);
          for (int l = 0; l < layers; ++l) {
            aar::sfa::ImplConfig ic;
            ic.dims.num_heads = H;
            ic.dims.hidden_size = hid;
            ic.dims.q_lora_rank = Q;
            ic.dims.kv_lora_rank = L;
            ic.dims.qk_nope_head_dim = P;
            ic.dims.qk_rope_head_dim = R;
            ic.dims.v_head_dim = V;
            ic.scale = 1.0;
            aar::sfa::IndexerConfig idx;
            idx.n_head = NI;
            idx.head_dim = DI;
            idx.topk = K;
            ic.indexer = idx;
            ic.layer_index = l;
            aar::sfa::OffloadConfig oc;
            oc.pool = pool;
            oc.pool_layer = 0;  // every layer on the pool's one layer: nothing is copied at update
            oc.topk_buffer_size = kBs;
            oc.is_decode_consumer = true;
            oc.max_num_reqs = 256;
            oc.max_num_tokens = 256;
            ic.offload = oc;
            impls.push_back(std::make_unique<aar::sfa::Impl>(ic, ws, iw));
            outs.push_back(at::zeros({B, hid}, opts));
            impls.back()->forward(x, caches, &md, outs.back());
          }
        }
        const aar::sfa::Metadata& md = builder.build(in);
        // Short repeats, many of them: on a loaded machine a long repeat mostly measures preemption.
        const double us = time_us([&] { g.update(B, md); }, (layers == 1 ? 400 : 100) / scale, 25);
        results.push_back({"graph update, offload", std::to_string(layers) + " layers, ctx " + std::to_string(ctx),
                           B, us});
      }
    }
  }

  std::printf("%-26s %-32s %6s %10s\n", "group", "case", "batch", "us/call");
  for (const auto& r : results) {
    std::printf("%-26s %-32s %6d %10.3f\n", r.group.c_str(), r.name.c_str(), r.batch, r.us);
  }
  aar_bench::JsonReport report("bench_sfa_cpp");
  report.hardware_threads();
  report.field("torch_threads", threads);
  for (const auto& r : results) {
    report.add("results", {{"group", r.group}, {"case", r.name}, {"batch", r.batch}, {"us_per_call", r.us}});
  }
  return report.write(args.out) ? 0 : 1;
}
