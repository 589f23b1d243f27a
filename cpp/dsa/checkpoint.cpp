#include "ascend_attn_rt/dsa/checkpoint.h"

#include <ATen/ATen.h>

#include <string>
#include <utility>
#include <vector>

#include "../common/checkpoint_reader.h"
#include "ascend_attn_rt/errors.h"

namespace aar::dsa {

namespace {

namespace ck = ::aar::detail;  // the shared reader (cpp/common), not dsa::detail

// One row of checkpoint.h's table: the published name, then transformers'.
struct Names {
  const char* ckpt;
  const char* hf;
};

constexpr Names kWqA{"wq_a.weight", "q_a_proj.weight"};
constexpr Names kQNorm{"q_norm.weight", "q_a_norm.weight"};
constexpr Names kWqB{"wq_b.weight", "q_b_proj.weight"};
constexpr Names kWkv{"wkv.weight", "kv_proj.weight"};
constexpr Names kKvNorm{"kv_norm.weight", "kv_norm.weight"};
constexpr Names kSink{"attn_sink", "sinks"};
constexpr Names kWoA{"wo_a.weight", "o_a_proj.weight"};
constexpr Names kWoB{"wo_b.weight", "o_b_proj.weight"};
constexpr Names kCmpWkv{"compressor.wkv.weight", "compressor.kv_proj.weight"};
constexpr Names kCmpWgate{"compressor.wgate.weight", "compressor.gate_proj.weight"};
constexpr Names kCmpApe{"compressor.ape", "compressor.position_bias"};
constexpr Names kCmpNorm{"compressor.norm.weight", "compressor.kv_norm.weight"};
constexpr Names kIdxWqB{"indexer.wq_b.weight", "compressor.indexer.q_b_proj.weight"};
constexpr Names kIdxWproj{"indexer.weights_proj.weight", "compressor.indexer.scorer.weights_proj.weight"};
constexpr Names kIdxWkv{"indexer.compressor.wkv.weight", "compressor.indexer.kv_proj.weight"};
constexpr Names kIdxWgate{"indexer.compressor.wgate.weight", "compressor.indexer.gate_proj.weight"};
constexpr Names kIdxApe{"indexer.compressor.ape", "compressor.indexer.position_bias"};
constexpr Names kIdxNorm{"indexer.compressor.norm.weight", "compressor.indexer.kv_norm.weight"};

}  // namespace

Weights weights_from_checkpoint(const std::map<std::string, at::Tensor>& state, std::string_view prefix,
                                const ImplConfig& c) {
  const int64_t H = c.hidden_size, N = c.num_heads, D = c.head_dim, Q = c.q_lora_rank, G = c.o_groups,
                O = c.o_lora_rank, ratio = c.compress_ratio <= 1 ? 1 : c.compress_ratio;
  AAR_CHECK_ARG(H > 0 && N > 0 && D > 0 && Q > 0 && G > 0 && O > 0,
                "hidden_size, num_heads, head_dim, q_lora_rank, o_groups and o_lora_rank must be positive, got ", H,
                ", ", N, ", ", D, ", ", Q, ", ", G, ", ", O);
  AAR_CHECK_ARG(c.compress_ratio == 0 || c.compress_ratio == 1 || c.compress_ratio == 4 || c.compress_ratio == 128,
                "compress_ratio must be 0 or 1 (SWA only), 4 or 128, got ", c.compress_ratio);
  AAR_CHECK_ARG((N * D) % G == 0, "o_groups=", G, " must divide num_heads * head_dim=", N * D);
  if (ratio == 4) {
    AAR_CHECK_ARG(c.index_n_heads > 0 && c.index_head_dim > 0, "index_n_heads and index_head_dim must be positive, "
                  "got ", c.index_n_heads, ", ", c.index_head_dim);
  }

  ck::CheckpointReader r(state, prefix, "DSA");
  const bool hf = !r.has(kWqA.ckpt) && r.has(kWqA.hf);
  auto name = [hf](const Names& n) { return hf ? n.hf : n.ckpt; };
  struct Linear {
    at::Tensor* dst;
    Names names;
  };
  Weights w;
  std::vector<Linear> linears;
  auto linear = [&](at::Tensor& dst, const Names& n, int64_t out, int64_t in) {
    dst = r.take(name(n), {out, in});
    linears.push_back({&dst, n});
  };
  linear(w.wq_a, kWqA, Q, H);
  w.q_norm = r.take(name(kQNorm), {Q});
  linear(w.wq_b, kWqB, N * D, Q);
  linear(w.wkv, kWkv, D, H);
  w.kv_norm = r.take(name(kKvNorm), {D});
  w.attn_sink = r.take(name(kSink), {N});
  linear(w.wo_a, kWoA, G * O, N * D / G);
  linear(w.wo_b, kWoB, H, G * O);
  if (ratio > 1) {
    const int64_t coff = ratio == 4 ? 2 : 1;  // the C4 compressor's overlapping pair of windows
    linear(w.cmp_wkv, kCmpWkv, coff * D, H);
    linear(w.cmp_wgate, kCmpWgate, coff * D, H);
    w.cmp_ape = r.take(name(kCmpApe), {ratio, coff * D});
    w.cmp_norm = r.take(name(kCmpNorm), {D});
  }
  if (ratio == 4) {
    const int64_t Di = c.index_head_dim;
    linear(w.idx_wq_b, kIdxWqB, c.index_n_heads * Di, Q);
    linear(w.idx_weights_proj, kIdxWproj, c.index_n_heads, H);
    linear(w.idx_cmp_wkv, kIdxWkv, 2 * Di, H);
    linear(w.idx_cmp_wgate, kIdxWgate, 2 * Di, H);
    w.idx_cmp_ape = r.take(name(kIdxApe), {4, 2 * Di});
    w.idx_cmp_norm = r.take(name(kIdxNorm), {Di});
  }
  // docs/design/dsa.md §7: a W8A8-dynamic prolog (ModelSlim's names): wq_a, wq_b and wkv int8, each with
  // its weight_scale ((out, 1) or (out)) and optionally a weight_offset that must be zero (symmetric).
  auto companion = [&](const Names& n, const char* suffix) {
    const std::string base = name(n);  // "<linear>.weight"
    return base.substr(0, base.size() - 6) + suffix;
  };
  struct Prolog {
    const Names* names;
    at::Tensor* scale;
    int64_t out;
  };
  const Prolog prolog[] = {{&kWqA, &w.wq_a_scale, Q}, {&kWqB, &w.wq_b_scale, N * D}, {&kWkv, &w.wkv_scale, D}};
  bool w8a8 = false;
  for (const Prolog& p : prolog) w8a8 = w8a8 || r.has(companion(*p.names, "weight_scale"));
  // A per-channel tensor stored (out, 1) or (out): read as (out).
  auto per_channel = [&](const std::string& nm, int64_t out) {
    const auto it = state.find(r.key(nm));
    const bool col = it != state.end() && it->second.defined() && it->second.dim() == 2;
    const at::Tensor t = r.take(nm, col ? std::vector<int64_t>{out, 1} : std::vector<int64_t>{out});
    return t.defined() ? t.reshape({out}) : t;
  };
  std::vector<std::pair<std::string, at::Tensor>> offsets;
  if (w8a8) {
    for (const Prolog& p : prolog) {
      *p.scale = per_channel(companion(*p.names, "weight_scale"), p.out);
      const std::string off = companion(*p.names, "weight_offset");
      if (r.has(off)) offsets.emplace_back(r.key(off), per_channel(off, p.out));
    }
  }
  r.finish();

  // The activation dtype: wq_a's, or (W8A8 prolog) wo_b's, which is never quantised here.
  const at::ScalarType dt = w8a8 ? w.wo_b.scalar_type() : w.wq_a.scalar_type();
  for (const Linear& l : linears) {
    const bool quantised = w8a8 && (l.dst == &w.wq_a || l.dst == &w.wq_b || l.dst == &w.wkv);
    if (!quantised) {
      ck::check_linear_dtype(*l.dst, r.key(name(l.names)), dt);
      continue;
    }
    AAR_CHECK_ARG(l.dst->scalar_type() == at::kChar, "'", r.key(name(l.names)), "' is ", l.dst->scalar_type(),
                  " but the layer's prolog has weight_scale companions (W8A8-dynamic): expected int8");
  }
  for (const Prolog& p : prolog) {
    if (p.scale->defined()) *p.scale = ck::as_dtype(*p.scale, r.key(companion(*p.names, "weight_scale")), at::kFloat);
  }
  for (const auto& [key, t] : offsets) {
    if (t.count_nonzero().item<int64_t>() != 0) {
      throw_not_supported("'", key, "' holds non-zero zero points: the W8A8-dynamic prolog takes symmetric int8 "
                          "weights (weight_offset all zero), asymmetric ones are not implemented");
    }
  }
  if (w.cmp_ape.defined()) ck::check_float(w.cmp_ape, r.key(name(kCmpApe)));
  if (w.idx_cmp_ape.defined()) ck::check_float(w.idx_cmp_ape, r.key(name(kIdxApe)));
  w.q_norm = ck::as_dtype(w.q_norm, r.key(name(kQNorm)), dt);
  w.kv_norm = ck::as_dtype(w.kv_norm, r.key(name(kKvNorm)), dt);
  w.attn_sink = ck::as_dtype(w.attn_sink, r.key(name(kSink)), at::kFloat);
  if (w.cmp_norm.defined()) w.cmp_norm = ck::as_dtype(w.cmp_norm, r.key(name(kCmpNorm)), dt);
  if (w.idx_cmp_norm.defined()) w.idx_cmp_norm = ck::as_dtype(w.idx_cmp_norm, r.key(name(kIdxNorm)), dt);
  w.wo_a = w.wo_a.unflatten(0, {G, O}).transpose(1, 2).contiguous();
  return w;
}

}  // namespace aar::dsa
