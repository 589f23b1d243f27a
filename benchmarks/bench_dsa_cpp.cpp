// Host-time benchmark of the DeepSeek-V4 (DSA) metadata builders from C++: one
// step's build over all of a V4 model's KV-cache groups (SWA, C4 KV, C128 KV,
// C4 indexer K, C4 attention state, C4 indexer state, C128 state: one
// StepBuilder::build and seven GroupBuilder::build), decode batches of
// 1/32/256 requests at 4000-token contexts, cache block size 128, the A2
// plan, bf16 R = 64 RoPE tables (rope_theta and compress_rope_theta).
//
// Block tables: each group's scheduler table has cdiv(max_model_len,
// block_size) columns (vLLM's width), max_model_len 8192: SWA 64, C4 KV / C4
// indexer 16, C128 KV 1, C4 states 1024 (8-token blocks), C128 state 256.
// "narrow state tables" gives the state groups 64 columns instead (an engine
// that keeps only the window's blocks for sliding-window state groups).
// Variants: CPU (host buffer = device buffer) with the engine's tables in its
// own arrays (copied into the staging rows each build) or kept in the
// builders' block_table_staging() rows (zero copy), with and without the SAS
// blobs (the metadata operator through the no-compute provider: its host
// cost); separate device buffers (the device path's one copy per builder; on
// the CPU that copy is a synchronous memcpy through at::copy_, so these
// numbers include copy bandwidth an NPU's asynchronous H2D copy does not
// charge to the host).
//
//   build/bench_dsa_cpp [--out benchmarks/results/cpp_dsa.json] [--quick]
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "ascend_attn_rt/dsa/builder.h"
#include "ascend_attn_rt/ops/provider.h"
#include "bench_timing.h"

namespace {

using aar::dsa::DsaCacheKind;

struct Result {
  std::string group, name;
  int batch;
  double us;
};

constexpr int kMaxReqs = 256, kMaxModelLen = 8192, kCtx = 4000;

struct Model {
  std::unique_ptr<aar::dsa::StepBuilder> step;
  std::vector<std::unique_ptr<aar::dsa::GroupBuilder>> groups;
  std::vector<std::vector<int32_t>> tables;
  std::vector<int32_t> strides;
};

Model make_model(bool separate, bool narrow_state, int heads) {
  aar::dsa::StepBuilderConfig sc;
  sc.max_num_reqs = kMaxReqs;
  sc.max_num_tokens = 4096;
  sc.cos_table = at::randn({kMaxModelLen, 64}).to(at::kBFloat16);
  sc.sin_table = at::randn({kMaxModelLen, 64}).to(at::kBFloat16);
  sc.compress_cos_table = at::randn({kMaxModelLen, 64}).to(at::kBFloat16);
  sc.compress_sin_table = at::randn({kMaxModelLen, 64}).to(at::kBFloat16);
  sc.separate_device_buffers = separate;
  Model m;
  m.step = std::make_unique<aar::dsa::StepBuilder>(sc);
  aar::dsa::DsaConfig dc;
  const aar::dsa::AttnKvPlan plan = aar::dsa::make_attn_kv_plan(dc);
  for (DsaCacheKind k : {DsaCacheKind::Swa, DsaCacheKind::C4Kv, DsaCacheKind::C128Kv, DsaCacheKind::C4IndexerK,
                         DsaCacheKind::C4AttnState, DsaCacheKind::C4IndexerState, DsaCacheKind::C128State}) {
    const aar::dsa::DsaCacheSpec spec = aar::dsa::dsa_cache_spec(k, 128, plan);
    const bool state = k == DsaCacheKind::C4AttnState || k == DsaCacheKind::C4IndexerState ||
                       k == DsaCacheKind::C128State;
    int32_t cols = static_cast<int32_t>((kMaxModelLen + spec.block_size - 1) / spec.block_size);
    if (state && narrow_state) cols = 64;
    aar::dsa::GroupConfig gc;
    gc.kind = k;
    gc.cache_block_size = 128;
    gc.plan = plan;
    gc.max_blocks_per_req = cols;
    gc.num_blocks = kMaxReqs * cols;
    gc.num_heads_q = heads;
    m.groups.push_back(std::make_unique<aar::dsa::GroupBuilder>(*m.step, gc));
    m.strides.push_back(cols);
    std::vector<int32_t> t(static_cast<size_t>(kMaxReqs) * cols);
    for (size_t i = 0; i < t.size(); ++i) t[i] = static_cast<int32_t>(i % gc.num_blocks);
    m.tables.push_back(std::move(t));
  }
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  std::string out_path = "benchmarks/results/cpp_dsa.json";
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--out") && i + 1 < argc) out_path = argv[++i];
    if (!std::strcmp(argv[i], "--quick")) quick = true;
  }
  const int scale = quick ? 10 : 1;
  aar::ops::ProviderOverride noop(aar::ops::Provider::NoCompute);
  c10::InferenceMode inference;
  // Host-time measurement: no intra-op thread pool (on the CPU the separate-
  // buffer copies would otherwise spin OpenMP workers on a shared machine).
  at::set_num_threads(1);
  std::vector<Result> results;

  struct Variant {
    const char* name;
    bool separate, narrow, sas, staged;
  };
  const Variant variants[] = {{"cpu (aliased), host tables", false, false, false, false},
                              {"cpu (aliased), staged tables", false, false, false, true},
                              {"cpu (aliased), staged, narrow state", false, true, false, true},
                              {"cpu (aliased), staged + SAS blobs", false, false, true, true},
                              {"separate buffers, host tables", true, false, false, false},
                              {"separate buffers, narrow state", true, true, false, false}};
  const char* only = std::getenv("AAR_BENCH_VARIANT");  // run one variant (its index), e.g. under perf
  for (const Variant& v : variants) {
    if (only != nullptr && std::atoi(only) != &v - variants) continue;
    Model m = make_model(v.separate, v.narrow, v.sas ? 16 : 0);
    for (int B : {1, 32, 256}) {
      // Contexts must fit the narrow state tables: 64 blocks of 8 tokens.
      const int ctx = v.narrow ? 500 : kCtx;
      std::vector<int32_t> qsl(B + 1), seq(B, ctx);
      for (int b = 0; b <= B; ++b) qsl[b] = b;
      aar::dsa::StepInputs in;
      in.query_start_loc = aar::plan::CSpan<int32_t>(qsl.data(), qsl.size());
      in.seq_lens = aar::plan::CSpan<int32_t>(seq.data(), seq.size());
      std::vector<aar::dsa::GroupInputs> gin(m.groups.size());
      for (size_t g = 0; g < m.groups.size(); ++g) {
        const int32_t* src = m.tables[g].data();
        if (v.staged) {
          // The engine keeps its table in the builder's staging rows (zero copy).
          const at::Tensor& t = m.groups[g]->block_table_staging();
          std::memcpy(t.data_ptr<int32_t>(), src, m.tables[g].size() * 4);
          src = t.data_ptr<int32_t>();
        }
        gin[g].block_table = aar::plan::CSpan<int32_t>(src, static_cast<size_t>(B) * m.strides[g]);
        gin[g].block_table_stride = m.strides[g];
      }
      auto step_all = [&] {
        const aar::dsa::StepMetadata& st = m.step->build(in);
        for (size_t g = 0; g < m.groups.size(); ++g) m.groups[g]->build(st, gin[g]);
      };
      const int iters = (B == 256 ? 2000 : 10000) / scale;
      results.push_back({v.name, "step + 7 groups, decode", B, aar_bench::time_us(step_all, iters)});
      results.push_back({v.name, "step only", B, aar_bench::time_us([&] { m.step->build(in); }, iters)});
      const aar::dsa::StepMetadata& st = m.step->build(in);
      const char* names[] = {"group swa", "group c4_kv", "group c128_kv", "group c4_indexer_k",
                             "group c4_attn_state", "group c4_indexer_state", "group c128_state"};
      for (size_t g = 0; g < m.groups.size(); ++g) {
        results.push_back({v.name, names[g], B, aar_bench::time_us([&] { m.groups[g]->build(st, gin[g]); }, iters)});
      }
    }
  }

  std::printf("%-40s %-28s %6s %10s\n", "variant", "case", "batch", "us/call");
  for (const auto& r : results) std::printf("%-40s %-28s %6d %10.3f\n", r.group.c_str(), r.name.c_str(), r.batch, r.us);
  if (!out_path.empty() && out_path != "-") {  // "-": print only
    std::ofstream f(out_path);
    if (!f) {
      std::printf("could not write %s\n", out_path.c_str());
      return 1;
    }
    f << "{\n  \"tool\": \"bench_dsa_cpp\",\n  \"provider\": \"no_compute\",\n  \"hardware_threads\": "
      << std::thread::hardware_concurrency() << ",\n  \"results\": [\n";
    for (size_t i = 0; i < results.size(); ++i) {
      const auto& r = results[i];
      f << "    {\"group\": \"" << r.group << "\", \"case\": \"" << r.name << "\", \"batch\": " << r.batch
        << ", \"us_per_call\": " << r.us << "}" << (i + 1 < results.size() ? "," : "") << "\n";
    }
    f << "  ]\n}\n";
    std::printf("wrote %s\n", out_path.c_str());
  }
  return 0;
}
