// Host-time benchmark of the MLA backend from C++ (no Python), with the
// no-compute operator provider. `build`: decode batches of 1/32/256 and a mixed batch
// (32 decodes + 4 prefills of 256 new tokens on 3000 cached tokens, one context
// chunk), at DeepSeek-V2-Lite RoPE width (R=64, bf16 tables), block size 128,
// 64 blocks per request. Each case also runs with separate device buffers (the
// device path on the CPU: the host buffer copied into a second buffer, one
// copy for a decode-only step, three with prefills) and, for decodes, with the block table staged in the builder (zero copy).
// `forward`: Impl::forward per layer for decode batches 1/32/256 at
// DeepSeek-V2-Lite shapes (16 heads, hidden 2048, no q-LoRA, L 512, P/V 128,
// R 64, bf16), the native and (with a q-LoRA of 1536) the fused-prolog decode
// preprocess; the no-compute provider also covers the layer's dense work
// (projections, norms, o_proj), so this is host work only.
//
//   build/bench_mla_cpp [--out benchmarks/results/cpp_mla.json] [--quick]
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "bench_timing.h"
#include "ascend_attn_rt/mla/builder.h"
#include "ascend_attn_rt/mla/impl.h"
#include "ascend_attn_rt/ops/provider.h"

namespace {

using aar::plan::CSpan;

struct Result {
  std::string path, name;
  int batch;
  double us;
};

using aar_bench::time_us;

using aar_bench::Batch;

// Block ids below the benchmarks' 256 * 64 cache blocks.
Batch make_batch(int decodes, int decode_seq, int prefills, int prefill_new, int prefill_ctx, int stride) {
  return aar_bench::make_batch(decodes, decode_seq, prefills, prefill_new, prefill_ctx, stride, 256 * 64);
}

aar::mla::BuildInputs inputs_of(const Batch& b) { return aar_bench::inputs_of<aar::mla::BuildInputs>(b); }

}  // namespace

int main(int argc, char** argv) {
  // Without --out it prints only (its default since it was written).
  const aar_bench::Args args = aar_bench::parse_args(argc, argv, "");
  const int scale = args.quick ? 10 : 1;
  aar::ops::ProviderOverride noop(aar::ops::Provider::NoCompute);
  c10::InferenceMode guard;
  at::set_num_threads(1);

  const int bs = 128, mbr = 64, R = 64, max_reqs = 256;
  // RoPE tables as in bench_mla_host.py: (max_position, R) bf16, halves equal.
  at::Tensor inv = at::pow(10000.0, -at::arange(0, R, 2, at::kDouble) / R);
  at::Tensor ang = at::arange(mbr * bs, at::kDouble).unsqueeze(1) * inv;
  at::Tensor cos = at::cat({ang.cos(), ang.cos()}, -1).to(at::kBFloat16);
  at::Tensor sin = at::cat({ang.sin(), ang.sin()}, -1).to(at::kBFloat16);

  auto builder_config = [&](bool separate) {
    aar::mla::BuilderConfig bc;
    bc.max_num_reqs = max_reqs;
    bc.max_num_tokens = 4096;
    bc.max_blocks_per_req = mbr;
    bc.block_size = bs;
    bc.num_blocks = max_reqs * mbr;
    bc.max_model_len = mbr * bs;
    bc.cos_table = cos;
    bc.sin_table = sin;
    bc.separate_device_buffers = separate;
    return bc;
  };

  std::vector<Result> results;
  for (bool separate : {false, true}) {
    aar::mla::MetadataBuilder builder(builder_config(separate));
    const std::string path = separate ? "separate buffers" : "cpu (aliased)";
    for (int B : {1, 32, 256}) {
      Batch b = make_batch(B, 1000, 0, 0, 0, mbr);
      auto in = inputs_of(b);
      results.push_back({path, "decode, host block table", B, time_us([&] { builder.build(in); }, 20000 / scale)});
      // Zero copy: the engine keeps its block table in the builder's staging rows.
      std::memcpy(builder.block_table_staging().data_ptr<int32_t>(), b.table.data(), b.table.size() * 4);
      in.block_table = CSpan<int32_t>(builder.block_table_staging().data_ptr<int32_t>(), b.table.size());
      results.push_back({path, "decode, staged block table", B, time_us([&] { builder.build(in); }, 20000 / scale)});
    }
    {
      Batch b = make_batch(32, 1000, 4, 256, 3000, mbr);
      auto in = inputs_of(b);
      const auto& md = builder.build(in);
      const std::string name = "mixed 32 dec + 4x256 prefill, " + std::to_string(md.prefill.chunked.num_chunks) +
                               " ctx chunk";
      results.push_back({path, name, 36, time_us([&] { builder.build(in); }, 5000 / scale)});
    }
  }

  // ---------------------------------------------------------------- forward
  std::vector<Result> fwd;
  {
    aar::mla::MetadataBuilder builder(builder_config(false));
    const int64_t H = 16, hid = 2048, L = 512, P = 128, V = 128, Q = 1536;
    auto w = [](int64_t o, int64_t i) { return (at::randn({o, i}) / std::sqrt(double(i))).to(at::kBFloat16); };
    const at::Tensor nope = at::zeros({int64_t{max_reqs} * mbr, bs, 1, L}, at::kBFloat16);
    const at::Tensor rope = at::zeros({int64_t{max_reqs} * mbr, bs, 1, R}, at::kBFloat16);
    for (bool prolog : {false, true}) {
      aar::mla::ImplConfig ic;
      ic.dims.num_heads = H;
      ic.dims.hidden_size = hid;
      ic.dims.kv_lora_rank = L;
      ic.dims.qk_nope_head_dim = P;
      ic.dims.qk_rope_head_dim = R;
      ic.dims.v_head_dim = V;
      aar::mla::Weights ws;
      if (prolog) {
        ic.dims.q_lora_rank = Q;
        ic.enable_prolog = true;
        ws.q_a_proj = w(Q, hid);
        ws.q_a_layernorm = at::ones({Q}, at::kBFloat16);
      }
      ws.q_proj = w(H * (P + R), prolog ? Q : hid);
      ws.kv_a_proj_with_mqa = w(L + R, hid);
      ws.kv_a_layernorm = at::ones({L}, at::kBFloat16);
      ws.kv_b_proj = w(H * (P + V), L);
      ws.o_proj = w(hid, H * V);
      aar::mla::Impl impl(ic, ws);
      const std::string path = prolog ? "decode, npu_mla_prolog_v3" : "decode, native preprocess";
      for (int B : {1, 32, 256}) {
        Batch b = make_batch(B, 1000, 0, 0, 0, mbr);
        const auto& md = builder.build(inputs_of(b));
        const at::Tensor x = at::randn({B, hid}).to(at::kBFloat16);
        const at::Tensor out = at::empty_like(x);
        fwd.push_back({path, "forward per layer", B,
                       time_us([&] { impl.forward(x, nope, rope, &md, out); }, 20000 / scale)});
      }
    }
  }

  std::printf("%-18s %-42s %6s %10s\n", "path", "case", "batch", "us/build");
  for (const auto& r : results) std::printf("%-18s %-42s %6d %10.3f\n", r.path.c_str(), r.name.c_str(), r.batch, r.us);

  std::printf("\n%-28s %-20s %6s %10s\n", "path", "case", "batch", "us/layer");
  for (const auto& r : fwd) std::printf("%-28s %-20s %6d %10.3f\n", r.path.c_str(), r.name.c_str(), r.batch, r.us);

  aar_bench::JsonReport report("bench_mla_cpp");
  report.hardware_threads();
  for (const auto& r : results) {
    report.add("results", {{"path", r.path}, {"case", r.name}, {"batch", r.batch}, {"us_per_build", r.us}});
  }
  report.array("forward");
  for (const auto& r : fwd) report.add("forward", {{"path", r.path}, {"batch", r.batch}, {"us_per_layer", r.us}});
  return report.write(args.out) ? 0 : 1;
}
