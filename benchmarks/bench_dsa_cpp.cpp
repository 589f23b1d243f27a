// Host-time benchmark of the DeepSeek-V4 (DSA) metadata builders from C++: one
// step's build over all of a V4 model's KV-cache groups (SWA, C4 KV, C128 KV,
// C4 indexer K, C4 attention state, C4 indexer state, C128 state: one
// StepBuilder::build and seven GroupBuilder::build), decode batches of
// 1/32/256/1024 requests at 4000-token contexts, a mixed step (64 decodes +
// 4 x 512 new tokens on 3000 cached) and a prefill (8 x 2048 new tokens, no
// cache) (upstream's build cases: 1024 decodes, mixed, prefill), cache block
// size 128, the A2 plan, bf16 R = 64 RoPE tables (rope_theta and
// compress_rope_theta). Every variant but one makes the SAS metadata blobs
// (the metadata operators through the no-compute provider), as upstream's
// build does; "staged, no SAS blobs" is the same build without them.
//
// Block tables (bench_dsa_model.h): each group's scheduler table has
// cdiv(max_model_len, block_size) columns (vLLM's width), max_model_len 8192:
// SWA 64, C4 KV / C4 indexer 16, C128 KV 1, C4 states 1024 (8-token blocks),
// C128 state 256.
// "narrow state tables" gives the state groups 64 columns instead (an engine
// that keeps only the window's blocks for sliding-window state groups).
// Variants: CPU (host buffer = device buffer) with the engine's tables in its
// own arrays (copied into the staging rows each build) or kept in the
// builders' block_table_staging() rows (zero copy), with the SAS blobs (the
// metadata operator through the no-compute provider: its host cost) and once
// without; separate device buffers (the device path's one copy per builder; on
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
  std::printf("%-40s %-46s %6s %10s\n", "variant", "case", "batch", "us/call");
  auto record = [&](const char* variant, const char* name, int batch, double us) {
    std::printf("%-40s %-46s %6d %10.3f\n", variant, name, batch, us);
    report.add("results", {{"group", variant}, {"case", name}, {"batch", batch}, {"us_per_call", us}});
  };

  struct Variant {
    const char* name;
    bool separate, narrow, sas, staged;
  };
  const Variant variants[] = {{"cpu (aliased), host tables", false, false, true, false},
                              {"cpu (aliased), staged tables", false, false, true, true},
                              {"cpu (aliased), staged, narrow state", false, true, true, true},
                              {"cpu (aliased), staged, no SAS blobs", false, false, false, true},
                              {"separate buffers, host tables", true, false, true, false},
                              {"separate buffers, narrow state", true, true, true, false}};
  // Run one variant (its index) and / or one batch size, e.g. under callgrind.
  const char* only = std::getenv("AAR_BENCH_VARIANT");
  const char* only_batch = std::getenv("AAR_BENCH_BATCH");
  for (const Variant& v : variants) {
    if (only != nullptr && std::atoi(only) != &v - variants) continue;
    aar_bench::DsaModelOptions mo;
    mo.separate = v.separate;
    mo.narrow_state = v.narrow;
    mo.num_heads_q = v.sas ? 16 : 0;
    mo.max_reqs = 1024;
    mo.max_num_tokens = 16384;
    aar_bench::DsaModel m = aar_bench::make_dsa_model(mo);
    struct Case {
      const char* name;
      int B;  // reported batch: requests
      aar_bench::DecodeBatch batch;
    };
    std::vector<Case> cases;
    for (int B : {1, 32, 256, 1024}) {
      // Contexts must fit the narrow state tables: 64 blocks of 8 tokens.
      cases.push_back({"decode", B, aar_bench::DecodeBatch(B, v.narrow ? 500 : kCtx)});
    }
    if (!v.narrow) {
      cases.push_back({"mixed 64 dec + 4x512 prefill", 68, aar_bench::DecodeBatch(64, kCtx, 4, 512, 3000)});
      cases.push_back({"prefill 8x2048", 8, aar_bench::DecodeBatch(0, 0, 8, 2048, 0)});
    }
    for (const Case& c : cases) {
      const int B = c.B;
      if (only_batch != nullptr && std::atoi(only_batch) != B) continue;
      const aar_bench::DecodeBatch& batch = c.batch;
      const aar::dsa::StepInputs in = batch.inputs();
      const int reqs = batch.num_reqs();
      const bool decode = std::strcmp(c.name, "decode") == 0;
      std::vector<aar::dsa::GroupInputs> gin;
      for (size_t g = 0; g < m.groups.size(); ++g) {
        const int32_t* src = m.tables[g].data();
        if (v.staged) {
          // The engine keeps its table in the builder's staging rows (zero copy).
          const at::Tensor& t = m.groups[g]->block_table_staging();
          std::memcpy(t.data_ptr<int32_t>(), src, m.tables[g].size() * 4);
          src = t.data_ptr<int32_t>();
        }
        gin.push_back(aar_bench::dsa_group_inputs(m, g, reqs, src));
      }
      auto step_all = [&] {
        const aar::dsa::StepMetadata& st = m.step->build(in);
        for (size_t g = 0; g < m.groups.size(); ++g) m.groups[g]->build(st, gin[g]);
      };
      const int iters = (!decode || B >= 1024 ? 500 : B == 256 ? 2000 : 10000) / scale;
      const std::string all = std::string("step + 7 groups, ") + c.name;
      record(v.name, all.c_str(), B, aar_bench::time_us(step_all, iters));
      if (!decode) continue;  // the parts for the decode steps only
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
