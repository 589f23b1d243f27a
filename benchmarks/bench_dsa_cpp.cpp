// Host-time benchmark of the DeepSeek-V4 (DSA) metadata builders from C++: one
// step's build over all of a V4 model's KV-cache groups (SWA, C4 KV, C128 KV,
// C4 indexer K, C4 attention state, C4 indexer state, C128 state: one
// StepBuilder::build and seven GroupBuilder::build), decode batches of
// 1/32/256 requests at 4000-token contexts, cache block size 128, the A2
// plan, bf16 R = 64 RoPE tables (rope_theta and compress_rope_theta).
//
// Block tables (bench_dsa_model.h): each group's scheduler table has
// cdiv(max_model_len, block_size) columns (vLLM's width), max_model_len 8192:
// SWA 64, C4 KV / C4 indexer 16, C128 KV 1, C4 states 1024 (8-token blocks),
// C128 state 256.
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
#include <string>
#include <vector>

#include "ascend_attn_rt/dsa/builder.h"
#include "ascend_attn_rt/ops/provider.h"
#include "bench_dsa_model.h"
#include "bench_timing.h"

namespace {

constexpr int kCtx = 4000;

}  // namespace

int main(int argc, char** argv) {
  const aar_bench::Args args = aar_bench::parse_args(argc, argv, "benchmarks/results/cpp_dsa.json");
  const int scale = args.quick ? 10 : 1;
  aar::ops::ProviderOverride noop(aar::ops::Provider::NoCompute);
  c10::InferenceMode inference;
  // Host-time measurement: no intra-op thread pool (on the CPU the separate-
  // buffer copies would otherwise spin OpenMP workers on a shared machine).
  at::set_num_threads(1);
  aar_bench::JsonReport report("bench_dsa_cpp");
  report.hardware_threads();
  std::printf("%-40s %-28s %6s %10s\n", "variant", "case", "batch", "us/call");
  auto record = [&](const char* variant, const char* name, int batch, double us) {
    std::printf("%-40s %-28s %6d %10.3f\n", variant, name, batch, us);
    report.add("results", {{"group", variant}, {"case", name}, {"batch", batch}, {"us_per_call", us}});
  };

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
  // Run one variant (its index) and / or one batch size, e.g. under callgrind.
  const char* only = std::getenv("AAR_BENCH_VARIANT");
  const char* only_batch = std::getenv("AAR_BENCH_BATCH");
  for (const Variant& v : variants) {
    if (only != nullptr && std::atoi(only) != &v - variants) continue;
    aar_bench::DsaModelOptions mo;
    mo.separate = v.separate;
    mo.narrow_state = v.narrow;
    mo.num_heads_q = v.sas ? 16 : 0;
    aar_bench::DsaModel m = aar_bench::make_dsa_model(mo);
    for (int B : {1, 32, 256}) {
      if (only_batch != nullptr && std::atoi(only_batch) != B) continue;
      // Contexts must fit the narrow state tables: 64 blocks of 8 tokens.
      const aar_bench::DecodeBatch batch(B, v.narrow ? 500 : kCtx);
      const aar::dsa::StepInputs in = batch.inputs();
      std::vector<aar::dsa::GroupInputs> gin;
      for (size_t g = 0; g < m.groups.size(); ++g) {
        const int32_t* src = m.tables[g].data();
        if (v.staged) {
          // The engine keeps its table in the builder's staging rows (zero copy).
          const at::Tensor& t = m.groups[g]->block_table_staging();
          std::memcpy(t.data_ptr<int32_t>(), src, m.tables[g].size() * 4);
          src = t.data_ptr<int32_t>();
        }
        gin.push_back(aar_bench::dsa_group_inputs(m, g, B, src));
      }
      auto step_all = [&] {
        const aar::dsa::StepMetadata& st = m.step->build(in);
        for (size_t g = 0; g < m.groups.size(); ++g) m.groups[g]->build(st, gin[g]);
      };
      const int iters = (B == 256 ? 2000 : 10000) / scale;
      record(v.name, "step + 7 groups, decode", B, aar_bench::time_us(step_all, iters));
      record(v.name, "step only", B, aar_bench::time_us([&] { m.step->build(in); }, iters));
      const aar::dsa::StepMetadata& st = m.step->build(in);
      for (size_t g = 0; g < m.groups.size(); ++g) {
        record(v.name, aar_bench::kDsaGroupNames[g], B,
               aar_bench::time_us([&] { m.groups[g]->build(st, gin[g]); }, iters));
      }
    }
  }
  return report.write(args.out) ? 0 : 1;
}
