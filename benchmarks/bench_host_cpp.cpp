// Host-time benchmark from C++: MetadataBuilder::build and per-layer
// AttentionImpl::forward with the no-compute operator provider, so the numbers
// are the runtime's host work plus the dispatcher, not kernel compute.
//
//   build/bench_host_cpp [--out benchmarks/results/cpp_host.json] [--quick]
#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "bench_timing.h"
#include "ascend_attn_rt/c8/backend.h"
#include "ascend_attn_rt/c8/impl.h"
#include "ascend_attn_rt/gqa/builder.h"
#include "ascend_attn_rt/gqa/impl.h"
#include "ascend_attn_rt/ops/fused_infer_attention.h"
#include "ascend_attn_rt/ops/provider.h"

namespace {

using aar::plan::CSpan;

struct Result {
  std::string group, name;
  int batch;
  double us;
};

using aar_bench::time_us;

using aar_bench::Batch;
using aar_bench::make_batch;

aar::gqa::BuildInputs inputs_of(const Batch& b) { return aar_bench::inputs_of<aar::gqa::BuildInputs>(b); }

}  // namespace

int main(int argc, char** argv) {
  const aar_bench::Args args = aar_bench::parse_args(argc, argv, "benchmarks/results/cpp_host.json");
  const int scale = args.quick ? 10 : 1;
  aar::ops::ProviderOverride noop(aar::ops::Provider::NoCompute);
  std::vector<Result> results;

  // ---------------------------------------------------------------- build
  aar::gqa::BuilderConfig bc;
  bc.max_num_reqs = 1024;
  bc.max_num_tokens = 16384;
  bc.max_blocks_per_req = 16;
  bc.block_size = 128;
  bc.num_blocks = 16384;
  aar::gqa::MetadataBuilder builder(bc);
  for (int B : {1, 32, 256, 1024}) {
    Batch b = make_batch(B, 2048, 0, 0, 0, 16, 16384);
    auto in = inputs_of(b);
    results.push_back({"build", "decode, host block table", B, time_us([&] { builder.build(in); }, 20000 / scale)});
    // Zero-copy: the engine keeps its block table in the builder's staging rows.
    std::memcpy(builder.block_table_staging().data_ptr<int32_t>(), b.table.data(), b.table.size() * 4);
    in.block_table = CSpan<int32_t>(builder.block_table_staging().data_ptr<int32_t>(), b.table.size());
    results.push_back({"build", "decode, staged block table", B, time_us([&] { builder.build(in); }, 20000 / scale)});
  }
  {
    Batch b = make_batch(64, 1024, 4, 512, 1024, 16, 16384);
    auto in = inputs_of(b);
    results.push_back({"build", "mixed 64 dec + 4x512 prefill", 68, time_us([&] { builder.build(in); }, 5000 / scale)});
  }
  {
    Batch b = make_batch(0, 0, 8, 2048, 0, 16, 16384);
    auto in = inputs_of(b);
    in.attn_state = aar::plan::AttentionState::PrefillNoCache;
    results.push_back({"build", "prefill 8x2048", 8, time_us([&] { builder.build(in); }, 2000 / scale)});
  }

  // ---------------------------------------------------------------- forward
  // Llama-3-8B attention shapes; the no-compute provider never reads the cache,
  // so every request shares the same 16 blocks (a 4 MiB cache per K and V).
  const int N = 32, Nkv = 8, D = 128, bs = 128, ctx = 2048;
  aar::gqa::BuilderConfig fc = bc;
  fc.max_num_reqs = 256;
  fc.num_blocks = 16;
  aar::gqa::MetadataBuilder fbuilder(fc);
  auto opts = at::TensorOptions().dtype(at::kBFloat16);
  at::Tensor k_cache = at::zeros({16, bs, Nkv, D}, opts), v_cache = at::zeros({16, bs, Nkv, D}, opts);
  for (int B : {1, 32, 256}) {
    Batch b = make_batch(B, ctx, 0, 0, 0, 16, 16);
    const aar::gqa::Metadata& md = fbuilder.build(inputs_of(b));
    at::Tensor q = at::zeros({B, N, D}, opts), k = at::zeros({B, Nkv, D}, opts), v = at::zeros({B, Nkv, D}, opts);
    at::Tensor out = at::empty({B, N, D}, opts);
    std::optional<at::Tensor> ko = k, vo = v;

    aar::gqa::ImplConfig ic;
    ic.num_heads = N;
    ic.num_kv_heads = Nkv;
    ic.head_size = D;
    aar::gqa::AttentionImpl fused(ic);
    ic.full_decode_only_graph = true;
    ic.pa_shape_list = {B};
    aar::gqa::AttentionImpl paged(ic);

    fused.forward(q, ko, vo, k_cache, v_cache, &md, out);
    const std::string fused_path = aar::gqa::to_string(fused.last_path());
    paged.forward(q, ko, vo, k_cache, v_cache, &md, out);
    const std::string paged_path = aar::gqa::to_string(paged.last_path());
    results.push_back({"forward", "per layer, " + fused_path + " + KV write", B,
                       time_us([&] { fused.forward(q, ko, vo, k_cache, v_cache, &md, out); }, 20000 / scale)});
    results.push_back({"forward", "per layer, " + paged_path + " + KV write", B,
                       time_us([&] { paged.forward(q, ko, vo, k_cache, v_cache, &md, out); }, 20000 / scale)});

    // The floor: one bare dispatcher call of the fused kernel with this step's lists.
    aar::ops::FiaTensors t;
    t.query = q;
    t.key = k_cache.view({16, bs, Nkv * D});
    t.value = v_cache.view({16, bs, Nkv * D});
    t.block_table = md.block_tables;
    t.atten_mask = md.attn_mask;
    aar::ops::FiaParams p;
    p.actual_seq_lengths = md.actual_seq_lengths_q;
    p.actual_seq_lengths_kv = md.seq_lens_list;
    p.num_heads = N;
    p.num_key_value_heads = Nkv;
    p.block_size = bs;
    p.sparse_mode = 3;
    at::Tensor lse = at::zeros({1}, at::kFloat);
    results.push_back({"forward", "floor: bare FIA .out dispatch", B, time_us([&] {
                         aar::ops::fused_infer_attention_score_out(t, p, std::nullopt, out, lse);
                       }, 20000 / scale)});
  }

  // ---------------------------------------------------------------- gather paths
  // The paths that attend over a gathered context (C8 prefill over its
  // dequantised INT8 context, the A2/A3 head-size-512 fallback), at 256
  // requests of 2048 tokens (2040 cached + 8 new each, ChunkedPrefill). Every
  // tensor is on the meta device (shapes only): the at:: gathers and the
  // no-compute operators cost their host work alone, as on an NPU, where they
  // are device kernels; the build computes the dense context once per step.
  {
    const int B = 256, seq = 2048, q_new = 8, nb = 4096;
    aar::gqa::BuilderConfig gc;
    gc.max_num_reqs = B;
    gc.max_num_tokens = B * q_new;
    gc.max_blocks_per_req = seq / bs;
    gc.block_size = bs;
    gc.num_blocks = nb;
    gc.device = c10::Device(c10::kMeta);
    gc.dense_context = true;
    aar::gqa::MetadataBuilder gb(gc);
    Batch b = make_batch(0, 0, B, q_new, seq - q_new, seq / bs, nb);
    auto in = inputs_of(b);
    in.attn_state = aar::plan::AttentionState::ChunkedPrefill;
    results.push_back({"gather", "build with dense context (256 x 2048)", B,
                       time_us([&] { gb.build(in); }, 2000 / scale)});
    const aar::gqa::Metadata& md = gb.build(in);
    const int64_t T = int64_t{B} * q_new;
    const auto meta = at::TensorOptions().device(c10::kMeta);

    // C8: Llama-3-8B shapes, int8 NZ caches.
    aar::c8::ImplConfig cc;
    cc.num_heads = N;
    cc.num_kv_heads = Nkv;
    cc.head_size = D;
    cc.scales.k_scale = at::full({1}, 0.05);
    cc.scales.v_scale = at::full({1}, 0.05);
    cc.scales.k_offset = at::zeros({1});
    cc.scales.v_offset = at::zeros({1});
    aar::c8::AttentionImpl c8(cc);
    const auto nz = aar::c8::Backend::kv_cache_shape(nb, bs, Nkv, D);
    at::Tensor kc8 = at::empty(c10::IntArrayRef(nz).slice(1), meta.dtype(at::kChar));
    at::Tensor vc8 = at::empty(c10::IntArrayRef(nz).slice(1), meta.dtype(at::kChar));
    at::Tensor q = at::empty({T, N, D}, meta.dtype(at::kBFloat16));
    std::optional<at::Tensor> k = at::empty({T, Nkv, D}, meta.dtype(at::kBFloat16)), v = *k;
    at::Tensor out = at::empty({T, N, D}, meta.dtype(at::kBFloat16));
    c8.forward(q, k, v, kc8, vc8, &md, out);
    results.push_back({"gather", std::string("per layer, C8 ") + aar::c8::to_string(c8.last_path()), B,
                       time_us([&] { c8.forward(q, k, v, kc8, vc8, &md, out); }, 2000 / scale)});

    // Head size 512 on A2 (the large-head fallback): 16 query heads, 1 KV head.
    aar::gqa::ImplConfig lc;
    lc.num_heads = 16;
    lc.num_kv_heads = 1;
    lc.head_size = 512;
    aar::gqa::AttentionImpl large(lc);
    at::Tensor kcl = at::empty({nb, bs, 1, 512}, meta.dtype(at::kBFloat16)), vcl = kcl.clone();
    at::Tensor ql = at::empty({T, 16, 512}, meta.dtype(at::kBFloat16)), outl = ql.clone();
    std::optional<at::Tensor> kl = at::empty({T, 1, 512}, meta.dtype(at::kBFloat16)), vl = *kl;
    large.forward(ql, kl, vl, kcl, vcl, &md, outl);
    results.push_back({"gather", std::string("per layer, ") + aar::gqa::to_string(large.last_path()), B,
                       time_us([&] { large.forward(ql, kl, vl, kcl, vcl, &md, outl); }, 2000 / scale)});

    // What the C8 path did per layer before the dense context moved into
    // build(): a host list of every context row, copied to the device.
    results.push_back({"gather", "reference: per-layer host gather list (before)", B, time_us([&] {
                         std::vector<int64_t> rows;
                         rows.reserve(static_cast<size_t>(B) * seq);
                         for (int r = 0; r < B; ++r) {
                           for (int j = 0; j < seq; ++j) rows.push_back(int64_t{r} * seq + j);
                         }
                         at::Tensor idx = at::from_blob(rows.data(), {static_cast<int64_t>(rows.size())}, at::kLong)
                                              .to(c10::Device(c10::kMeta));
                       }, 200 / scale)});
  }

  std::printf("%-8s %-40s %6s %12s\n", "group", "case", "batch", "us/call");
  for (const auto& r : results) std::printf("%-8s %-40s %6d %12.3f\n", r.group.c_str(), r.name.c_str(), r.batch, r.us);

  aar_bench::JsonReport report("bench_host_cpp");
  report.hardware_threads();
  for (const auto& r : results) {
    report.add("results", {{"group", r.group}, {"case", r.name}, {"batch", r.batch}, {"us_per_call", r.us}});
  }
  return report.write(args.out) ? 0 : 1;
}
