// A C++ engine embedding the MLA backend without Python: the two paged caches
// of one layer, a metadata builder, the layer (DeepSeek-style, no q-LoRA); a
// prefill step of two requests, then decode steps (the second request joins
// late). Each step's output is checked against a naive double-precision MLA
// written here from the equations (projections, RMSNorm, interleaved RoPE,
// softmax over the full un-absorbed heads, o_proj).
//
// Build: examples/CMakeLists.txt, a project of its own against the installed
// package (find_package(ascend_attn_rt)); ctest `example_embed_mla` runs it.
#include <ATen/ATen.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "ascend_attn_rt/mla/backend.h"
#include "ascend_attn_rt/mla/builder.h"
#include "ascend_attn_rt/mla/impl.h"

namespace {

constexpr int64_t kHeads = 4, kHidden = 64, kL = 32, kP = 16, kR = 8, kV = 16;
constexpr int kBlock = 16, kBlocks = 16, kMaxBlocks = 4;

struct Weights {
  at::Tensor q_proj, kv_a, kv_a_norm, kv_b, o_proj;
};

at::Tensor rms(const at::Tensor& x, const at::Tensor& g) {
  return x / at::sqrt((x * x).mean(-1, true) + 1e-6) * g;
}

// GPT-J (interleaved-pair) RoPE of x (T, ..., R) at positions 0..T-1.
at::Tensor rope(const at::Tensor& x) {
  const int64_t T = x.size(0);
  at::Tensor inv = at::pow(10000.0, -at::arange(0, kR, 2, at::kDouble) / kR);
  at::Tensor ang = at::arange(T, at::kDouble).unsqueeze(1) * inv;  // (T, R/2)
  while (ang.dim() < x.dim()) ang = ang.unsqueeze(1);
  const at::Tensor x0 = x.slice(-1, 0, kR, 2), x1 = x.slice(-1, 1, kR, 2);
  at::Tensor y = at::empty_like(x);
  y.slice(-1, 0, kR, 2).copy_(x0 * ang.cos() - x1 * ang.sin());
  y.slice(-1, 1, kR, 2).copy_(x1 * ang.cos() + x0 * ang.sin());
  return y;
}

// Output (q_len, hidden) of the last q_len tokens of a request with tokens x (s, hidden).
at::Tensor reference(const Weights& w, const at::Tensor& x_in, int64_t q_len) {
  const at::Tensor x = x_in.to(at::kDouble);
  const int64_t s = x.size(0);
  const at::Tensor q = at::matmul(x, w.q_proj.to(at::kDouble).t()).view({s, kHeads, kP + kR});
  const at::Tensor kv = at::matmul(x, w.kv_a.to(at::kDouble).t());
  const at::Tensor c = rms(kv.narrow(1, 0, kL), w.kv_a_norm.to(at::kDouble));
  const at::Tensor k_rope = rope(kv.narrow(1, kL, kR));                      // (s, R)
  const at::Tensor q_rope = rope(q.narrow(2, kP, kR)).narrow(0, s - q_len, q_len);  // (q, H, R)
  const at::Tensor kvb = at::matmul(c, w.kv_b.to(at::kDouble).t()).view({s, kHeads, kP + kV});
  const at::Tensor k_nope = kvb.narrow(2, 0, kP), v = kvb.narrow(2, kP, kV);
  const at::Tensor q_nope = q.narrow(2, 0, kP).narrow(0, s - q_len, q_len);
  const double scale = 1.0 / std::sqrt(static_cast<double>(kP + kR));
  at::Tensor sc = (at::einsum("ihp,jhp->hij", {q_nope, k_nope}) + at::einsum("ihr,jr->hij", {q_rope, k_rope})) * scale;
  const at::Tensor qi = at::arange(s - q_len, s, at::kLong).unsqueeze(1), kj = at::arange(s, at::kLong).unsqueeze(0);
  sc = sc.masked_fill((kj > qi).unsqueeze(0), -INFINITY);
  const at::Tensor o = at::einsum("hij,jhv->ihv", {at::softmax(sc, -1), v}).reshape({q_len, kHeads * kV});
  return at::matmul(o, w.o_proj.to(at::kDouble).t());
}

}  // namespace

int main() {
  at::manual_seed(0);
  auto rnd = [](int64_t o, int64_t i) { return at::randn({o, i}, at::kDouble) / std::sqrt(static_cast<double>(i)); };
  const Weights w{rnd(kHeads * (kP + kR), kHidden), rnd(kL + kR, kHidden), 1 + 0.1 * at::randn({kL}, at::kDouble),
                  rnd(kHeads * (kP + kV), kL), rnd(kHidden, kHeads * kV)};

  aar::mla::ImplConfig ic;
  ic.dims = {kHeads, kHidden, std::nullopt, kL, kP, kR, kV};
  aar::mla::Weights mw;
  mw.q_proj = w.q_proj.to(at::kFloat);
  mw.kv_a_proj_with_mqa = w.kv_a.to(at::kFloat);
  mw.kv_a_layernorm = w.kv_a_norm.to(at::kFloat);
  mw.kv_b_proj = w.kv_b.to(at::kFloat);
  mw.o_proj = w.o_proj.to(at::kFloat);
  aar::mla::Impl layer(ic, mw);

  // RoPE tables: (max_position, R), both halves equal (spec 6.1).
  at::Tensor inv = at::pow(10000.0, -at::arange(0, kR, 2, at::kDouble) / kR);
  at::Tensor ang = at::arange(kMaxBlocks * kBlock, at::kDouble).unsqueeze(1) * inv;
  aar::mla::BuilderConfig bc;
  bc.max_num_reqs = 4;
  bc.max_num_tokens = 64;
  bc.max_blocks_per_req = kMaxBlocks;
  bc.block_size = kBlock;
  bc.num_blocks = kBlocks;
  bc.cos_table = at::cat({ang.cos(), ang.cos()}, -1).to(at::kFloat);
  bc.sin_table = at::cat({ang.sin(), ang.sin()}, -1).to(at::kFloat);
  aar::mla::MetadataBuilder builder(bc);

  const auto shapes = aar::mla::Backend::kv_cache_shapes(kBlocks, kBlock, kL, kR);
  at::Tensor nope = at::zeros(shapes[0], at::kFloat), rope_cache = at::zeros(shapes[1], at::kFloat);
  // The engine keeps its block table in the builder's staging rows (zero copy).
  at::Tensor table = builder.block_table_staging();
  table[0].copy_(at::tensor({3, 7, 1, 0}, at::kInt));
  table[1].copy_(at::tensor({5, 2, 9, 0}, at::kInt));

  // Token streams of the two requests (hidden states the layer receives).
  const std::vector<at::Tensor> xs = {at::randn({20, kHidden}, at::kDouble), at::randn({20, kHidden}, at::kDouble)};
  std::vector<int> seen = {0, 0};
  // Steps: (request, new tokens) pairs, decodes first as the builder expects.
  const std::vector<std::vector<std::pair<int, int>>> steps = {
      {{0, 5}}, {{0, 1}}, {{0, 1}, {1, 9}}, {{0, 1}, {1, 1}}, {{0, 1}, {1, 1}}};
  double worst = 0.0;
  for (const auto& step : steps) {
    std::vector<int32_t> qsl = {0}, seq;
    std::vector<at::Tensor> hidden_rows, refs;
    for (const auto& [r, n] : step) {
      qsl.push_back(qsl.back() + n);
      seq.push_back(seen[r] + n);
      hidden_rows.push_back(xs[r].narrow(0, seen[r], n));
      refs.push_back(reference(w, xs[r].narrow(0, 0, seen[r] + n), n));
      seen[r] += n;
    }
    // A step's requests are rows 0.. of the staged table; here step order matches rows.
    aar::mla::BuildInputs in;
    in.query_start_loc = aar::plan::CSpan<int32_t>(qsl.data(), qsl.size());
    in.seq_lens = aar::plan::CSpan<int32_t>(seq.data(), seq.size());
    in.block_table = aar::plan::CSpan<int32_t>(table.data_ptr<int32_t>(), seq.size() * kMaxBlocks);
    in.block_table_stride = kMaxBlocks;
    const aar::mla::Metadata& md = builder.build(in);
    const at::Tensor hidden = at::cat(hidden_rows).to(at::kFloat);
    at::Tensor out = at::empty_like(hidden);
    layer.forward(hidden, nope, rope_cache, &md, out);
    const double diff = (out.to(at::kDouble) - at::cat(refs)).abs().max().item<double>();
    std::printf("step: %d requests, %d tokens (%d decodes, %d prefills): max |out - ref| = %.2e\n",
                md.num_reqs, md.num_actual_tokens, md.num_decodes, md.num_prefills, diff);
    worst = std::max(worst, diff);
  }
  if (!(worst < 1e-4)) {
    std::printf("FAILED: max difference %.3e\n", worst);
    return 1;
  }
  std::printf("OK\n");
  return 0;
}
