// Host-time benchmark of the DeepSeek-V4 (DSA) layer's two o_proj forms
// (docs/design/dsa.md §5.2), the operator sequences dsa::Impl::run_o_proj issues,
// with the no-compute provider on meta tensors (host work only: dispatch,
// argument passing, views):
//   Bmm            npu_transpose_batchmatmul(o, wo_a), then wo_b
//   MxFp8QuantBmm  npu_dynamic_mx_quant(o, fp8), npu_transpose_quant_batchmatmul
//                  (fp8 o, fp8 wo_a, e8m0 scales, group (0, 0, 32)), then wo_b
// Shapes (DSV4-like, TP 8; an assumption): 16 local heads x 512, o_groups 2
// (k = 4096), o_lora 1024, hidden 7168; T = 1 / 32 / 256 tokens.
//
//   build/bench_dsa_oproj_cpp [--out benchmarks/results/cpp_dsa_oproj.json] [--quick]
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "ascend_attn_rt/ops/dense.h"
#include "ascend_attn_rt/ops/mx_quant.h"
#include "ascend_attn_rt/ops/provider.h"
#include "ascend_attn_rt/ops/transpose_batchmatmul.h"
#include "bench_timing.h"

namespace {

struct Result {
  std::string kind;
  int tokens;
  double us;
};

constexpr int64_t kHid = 7168, kN = 16, kD = 512, kG = 2, kOL = 1024, kK = kN * kD / kG;

}  // namespace

int main(int argc, char** argv) {
  std::string out_path = "benchmarks/results/cpp_dsa_oproj.json";
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--out") && i + 1 < argc) out_path = argv[++i];
    if (!std::strcmp(argv[i], "--quick")) quick = true;
  }
  const int scale = quick ? 10 : 1;
  aar::ops::ProviderOverride noop(aar::ops::Provider::NoCompute);
  c10::InferenceMode inference;
  at::set_num_threads(1);
  const auto meta = at::TensorOptions().device(c10::kMeta);
  const at::Tensor wo_a_bf16 = at::empty({kG, kK, kOL}, meta.dtype(at::kBFloat16));
  const at::Tensor wo_a_fp8 = at::empty({kG, kK, kOL}, meta.dtype(at::kFloat8_e4m3fn));
  const at::Tensor wo_a_scale = at::empty({kG, kK / 64, kOL, 2}, meta.dtype(at::kFloat8_e8m0fnu));
  const at::Tensor wo_b = at::empty({kHid, kG * kOL}, meta.dtype(at::kBFloat16));
  static constexpr int64_t kPerm102[] = {1, 0, 2}, kPerm012[] = {0, 1, 2}, kGroups[] = {0, 0, 32};

  std::vector<Result> results;
  for (int T : {1, 32, 256}) {
    const at::Tensor o = at::empty({T, kN, kD}, meta.dtype(at::kBFloat16));
    const at::Tensor out = at::empty({T, kHid}, meta.dtype(at::kBFloat16));
    results.push_back({"Bmm", T, aar_bench::time_us(
                                     [&] {
                                       const at::Tensor y = aar::ops::transpose_batchmatmul(
                                           o.view({T, kG, kK}), wo_a_bf16, c10::IntArrayRef(kPerm102), std::nullopt,
                                           c10::IntArrayRef(kPerm102));
                                       aar::ops::dense::linear_out(out, y.reshape({T, kG * kOL}), wo_b);
                                     },
                                     20000 / scale)});
    results.push_back({"MxFp8QuantBmm", T,
                       aar_bench::time_us(
                           [&] {
                             aar::ops::DynamicMxQuantArgs q;
                             q.input = o.view({T, kG, kK});
                             q.dst_type = static_cast<int64_t>(at::kFloat8_e4m3fn);
                             const auto [o8, s] = aar::ops::dynamic_mx_quant(q);
                             aar::ops::TransposeQuantBatchMatmulArgs b;
                             b.x1 = o8;
                             b.x2 = wo_a_fp8;
                             b.dtype = static_cast<int64_t>(at::kBFloat16);
                             b.x1_scale = s.view(at::kFloat8_e8m0fnu);
                             b.x2_scale = wo_a_scale;
                             b.group_sizes = c10::IntArrayRef(kGroups);
                             b.perm_x1 = c10::IntArrayRef(kPerm102);
                             b.perm_x2 = c10::IntArrayRef(kPerm012);
                             b.perm_y = c10::IntArrayRef(kPerm102);
                             const at::Tensor y = aar::ops::transpose_quant_batchmatmul(b);
                             aar::ops::dense::linear_out(out, y.reshape({T, kG * kOL}), wo_b);
                           },
                           20000 / scale)});
  }

  std::printf("%-16s %6s %10s\n", "o_proj", "tokens", "us/call");
  for (const auto& r : results) std::printf("%-16s %6d %10.3f\n", r.kind.c_str(), r.tokens, r.us);
  if (!out_path.empty() && out_path != "-") {  // "-": print only
    std::ofstream f(out_path);
    if (!f) {
      std::printf("could not write %s\n", out_path.c_str());
      return 1;
    }
    f << "{\n  \"tool\": \"bench_dsa_oproj_cpp\",\n  \"provider\": \"no_compute\",\n  \"hardware_threads\": "
      << std::thread::hardware_concurrency() << ",\n  \"results\": [\n";
    for (size_t i = 0; i < results.size(); ++i) {
      const auto& r = results[i];
      f << "    {\"o_proj\": \"" << r.kind << "\", \"case\": \"per layer o_proj\", \"tokens\": " << r.tokens
        << ", \"us_per_call\": " << r.us << "}" << (i + 1 < results.size() ? "," : "") << "\n";
    }
    f << "  ]\n}\n";
    std::printf("wrote %s\n", out_path.c_str());
  }
  return 0;
}
