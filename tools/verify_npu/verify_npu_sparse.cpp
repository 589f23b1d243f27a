// verify-npu rows of the SFA (DeepSeek-V3.2 sparse attention) path (cpp/sfa):
// npu_sparse_flash_attention, the lightning indexers (plain and quantised, both
// libraries as the backend dispatches them), npu_kv_quant_sparse_flash_attention
// over the packed C8 rows, npu_dynamic_block_quant (the row packing),
// npu_rotary_mul, npu_scatter_nd_update_ and the indexer's Hadamard rotation.
// Conventions: verify_npu_cases.h.
#include <ATen/ATen.h>

#include <sstream>

#include "ascend_attn_rt/ops/hadamard.h"
#include "ascend_attn_rt/ops/lightning_indexer.h"
#include "ascend_attn_rt/ops/quant.h"
#include "ascend_attn_rt/ops/rotary_mul.h"
#include "ascend_attn_rt/ops/sfa_c8_rows.h"
#include "ascend_attn_rt/ops/sparse_flash_attention.h"
#include "verify_npu_cases.h"

namespace aar::verify::detail {

namespace {

using ops::OpLibrary;

const char* lib_name(OpLibrary l) { return l == OpLibrary::VllmAscend ? "_C_ascend" : "torch_npu"; }

// A mixed TND batch (a decode, a chunked prefill over context, a prefill with
// few keys) over one paged (nb, bs, 1, W) cache per width.
struct SparseBatch {
  std::vector<int64_t> q_lens{1, 4, 3}, kv_lens{70, 20, 5};
  int64_t bs = 16;
  int64_t tokens() const { return 8; }
};

// Top-k index sets (T, 1, K) drawn like an indexer's: the causal-visible
// positions of each row, a random selection, -1 after them.
at::Tensor topk_indices(const SparseBatch& b, int64_t K, uint64_t seed) {
  at::manual_seed(seed);
  at::Tensor idx = at::full({b.tokens(), 1, K}, -1, at::kInt);
  int64_t t = 0;
  for (size_t r = 0; r < b.q_lens.size(); ++r) {
    for (int64_t i = 0; i < b.q_lens[r]; ++i, ++t) {
      const int64_t vis = b.kv_lens[r] - b.q_lens[r] + i + 1;
      const int64_t n = std::min(K, vis);
      idx[t][0].narrow(0, 0, n).copy_(at::randperm(vis, at::kInt).narrow(0, 0, n));
    }
  }
  return idx;
}

Case sparse_flash_attention() {
  return Case{"npu_sparse_flash_attention",
              "_C_ascend TND / PA_BSND bfloat16 N=4, query (T,N,512) + query_rope (T,N,64), latent (nb,16,1,512) + "
              "rope (nb,16,1,64) caches, sparse_indices (T,1,32) with -1 tails, sparse_block_size=1 sparse_mode=3 "
              "attention_mode=2, int32 device lengths",
              "row t scans its indices up to the first -1; an index at or past S_b - q_b + i + 1 is skipped; the "
              "latent is the value",
              5e-3, [](const Side& s) {
                const SparseBatch b;
                const Paged kv = paged(b.kv_lens, b.bs, {1, 512}, at::kBFloat16, 40);
                const at::Tensor kr = like_pages(kv, {1, 64}, at::kBFloat16, 41);
                at::manual_seed(42);
                ops::SparseFlashAttentionArgs a;
                a.query = s.to(rnd({b.tokens(), 4, 512}, at::kBFloat16));
                a.query_rope = s.to(rnd({b.tokens(), 4, 64}, at::kBFloat16));
                a.key = s.to(kv.cache);
                a.value = a.key;
                a.key_rope = s.to(kr);
                a.sparse_indices = s.to(topk_indices(b, 32, 43));
                a.scale_value = 0.04;
                a.block_table = s.to(kv.table);
                a.actual_seq_lengths_query = s.to(i32(cumsum(b.q_lens)));
                a.actual_seq_lengths_kv = s.to(i32(b.kv_lens));
                return on_cpu({std::get<0>(ops::sparse_flash_attention(a, OpLibrary::VllmAscend, s.pv))});
              }};
}

// The indexer inputs: query (T, heads, 128), key cache (nb, bs, 1, 128), weights (T, heads).
struct IndexerIn {
  at::Tensor q, k, w, table, cu, kv;
};
IndexerIn indexer_in(const SparseBatch& b, uint64_t seed) {
  const Paged k = paged(b.kv_lens, b.bs, {1, 128}, at::kFloat, seed);
  at::manual_seed(seed + 1);
  return {at::randn({b.tokens(), 8, 128}), k.cache, at::randn({b.tokens(), 8}), k.table, i32(cumsum(b.q_lens)),
          i32(b.kv_lens)};
}

Case lightning_indexer(OpLibrary lib) {
  std::ostringstream a;
  a << lib_name(lib) << " TND / PA_BSND bfloat16 query (T,8,128), key (nb,16,1,128), weights (T,8), sparse_count=32 "
    << "sparse_mode=3, int32 lengths" << (lib == OpLibrary::TorchNpu ? " (GLM-MoE-DSA / A5)" : " (A2/A3)");
  return Case{"npu_lightning_indexer", a.str(),
              "score(t, s) = sum_h w[t,h] relu(q[t,h] . k[s]) over the causal-visible keys; top sparse_count, -1 after "
              "(compared as sets per row)",
              0.0, [lib](const Side& s) {
                const SparseBatch b;
                const IndexerIn in = indexer_in(b, 44);
                ops::LightningIndexerArgs a;
                a.query = s.to(in.q.to(at::kBFloat16));
                a.key = s.to(in.k.to(at::kBFloat16));
                a.weights = s.to(in.w.to(at::kBFloat16));
                a.actual_seq_lengths_query = s.to(in.cu);
                a.actual_seq_lengths_key = s.to(in.kv);
                a.block_table = s.to(in.table);
                a.sparse_count = 32;
                a.sparse_mode = 3;
                return Outputs{sorted_rows(std::get<0>(ops::lightning_indexer(a, lib, s.pv)))};
              }};
}

Case quant_lightning_indexer(OpLibrary lib) {
  const bool a5 = lib == OpLibrary::TorchNpu;
  std::ostringstream a;
  a << (a5 ? "torch_npu npu_quant_lightning_indexer (A5): float8_e4m3fn query/key, fp32 dequant scales"
           : "_C_ascend npu_lightning_indexer_quant (A2/A3): int8 query/key, float16 dequant scales")
    << ", query (T,8,128) per (token, head), key (nb,16,1,128) per token, float16 weights, query/key_quant_mode=0, "
    << "sparse_count=32 sparse_mode=3";
  return Case{a5 ? "npu_quant_lightning_indexer" : "npu_lightning_indexer_quant", a.str(),
              "the dequant scales multiply the dots before the relu: w * relu(qs * ks * (q8 . k8))", 0.0,
              [=](const Side& s) {
                const SparseBatch b;
                const IndexerIn in = indexer_in(b, 45);
                const at::ScalarType qd = a5 ? at::kFloat8_e4m3fn : at::kChar, sd = a5 ? at::kFloat : at::kHalf;
                const double qmax = a5 ? 448.0 : 127.0;
                // Per row (token, head / token) symmetric, as npu_dynamic_quant makes them.
                auto quant = [&](const at::Tensor& x, at::Tensor& scale) {
                  scale = x.abs().amax(-1) / qmax;
                  const at::Tensor y = x / scale.unsqueeze(-1);
                  return (a5 ? y : y.round().clamp(-qmax, qmax)).to(qd);
                };
                at::Tensor qs, ks;
                const at::Tensor q8 = quant(in.q, qs), k8 = quant(in.k, ks);
                ops::QuantLightningIndexerArgs a;
                a.base.query = s.to(q8);
                a.base.key = s.to(k8);
                a.base.weights = s.to(in.w.to(at::kHalf));
                a.base.actual_seq_lengths_query = s.to(in.cu);
                a.base.actual_seq_lengths_key = s.to(in.kv);
                a.base.block_table = s.to(in.table);
                a.base.sparse_count = 32;
                a.base.sparse_mode = 3;
                a.query_dequant_scale = s.to(qs.to(sd));
                a.key_dequant_scale = s.to(ks.to(sd));  // (nb, bs, 1)
                return Outputs{sorted_rows(ops::quant_lightning_indexer(a, lib, s.pv))};
              }};
}

Case kv_quant_sparse_flash_attention() {
  return Case{"npu_kv_quant_sparse_flash_attention",
              "_C_ascend SFA C8: query (T,4,576) bfloat16 = [ql_nope | q_pe], key = value = packed (nb,16,1,656) int8 "
              "rows, key/value_quant_mode=2 quant_scale_repo_mode=1 tile_size=128 rope_head_dim=64, sparse_indices "
              "(T,1,32), TND / PA_BSND sparse_mode=3 attention_mode=2",
              "the packed row dequantises as k_nope[d] = int8[d] * scale[d / 128], the rope part as stored", 5e-3,
              [](const Side& s) {
                const SparseBatch b;
                const Paged kv = paged(b.kv_lens, b.bs, {1, 512}, at::kFloat, 46);
                const at::Tensor kr = like_pages(kv, {1, 64}, at::kBFloat16, 47);
                const at::Tensor packed = ops::pack_sfa_c8_rows(kv.cache, kr, ops::Provider::Cpu);
                at::manual_seed(48);
                ops::KvQuantSparseFlashAttentionArgs a;
                a.query = s.to(rnd({b.tokens(), 4, 576}, at::kBFloat16));
                a.key = s.to(packed);
                a.value = a.key;
                a.sparse_indices = s.to(topk_indices(b, 32, 49));
                a.scale_value = 0.04;
                a.block_table = s.to(kv.table);
                a.actual_seq_lengths_query = s.to(i32(cumsum(b.q_lens)));
                a.actual_seq_lengths_kv = s.to(i32(b.kv_lens));
                return on_cpu({std::get<0>(ops::kv_quant_sparse_flash_attention(a, OpLibrary::VllmAscend, s.pv))});
              }};
}

Case dynamic_block_quant() {
  return Case{"npu_dynamic_block_quant",
              "pack_sfa_c8_rows: k_nope (tk=7,512) bfloat16, row_block_size=1 col_block_size=128 dst_type=1 (int8) "
              "round_mode=rint, + k_rope (tk,64) bfloat16",
              "per 1 x 128 tile scale = amax / 127, q = rint(x / scale) (compared dequantised)", 1e-2,
              [](const Side& s) {
                at::manual_seed(50);
                const at::Tensor rows = ops::pack_sfa_c8_rows(s.to(rnd({7, 512}, at::kBFloat16)),
                                                              s.to(rnd({7, 64}, at::kBFloat16)), s.pv);
                const ops::SfaC8Unpacked u = ops::unpack_sfa_c8_rows(rows.cpu(), at::kBFloat16);
                return on_cpu({u.k_nope, u.k_rope, u.scale});
              }};
}

Case rotary_mul(bool interleave) {
  return Case{"npu_rotary_mul",
              std::string("indexer RoPE: x (tk=6,1,8,64) BSND bfloat16 (a view of the heads' first R dims), r1/r2 "
                          "(tk,1,1,64), rotary_mode=") +
                  (interleave ? "interleave (GLM-MoE-DSA, angles repeated per pair)" : "half (neox)"),
              interleave ? "'interleave' rotates pairs (x0, x1) -> (-x1, x0): out = r1 x + r2 rot(x)"
                         : "'half' rotates halves (x1, x2) -> (-x2, x1): out = r1 x + r2 rot(x)",
              1e-2, [=](const Side& s) {
                at::manual_seed(51);
                const at::Tensor ang = at::rand({6, 1, 1, 32}) * 6;
                const at::Tensor c = interleave ? ang.cos().repeat_interleave(2, -1) : at::cat({ang.cos(), ang.cos()}, -1);
                const at::Tensor sn = interleave ? ang.sin().repeat_interleave(2, -1) : at::cat({ang.sin(), ang.sin()}, -1);
                const at::Tensor heads = rnd({6, 1, 8, 128}, at::kBFloat16);
                const at::Tensor x = s.to(heads).narrow(-1, 0, 64);
                return on_cpu({ops::rotary_mul(x, s.to(c.to(at::kBFloat16)), s.to(sn.to(at::kBFloat16)),
                                               interleave ? "interleave" : "half", s.pv)});
              }};
}

Case scatter_nd_update() {
  return Case{"npu_scatter_nd_update_",
              "indexer / packed-row cache write: rows (nb*bs=64, 128) bfloat16 view of the cache, int64 slots (tk,1) "
              "with a -1 (graph padding), updates (tk,128)",
              "a negative index is skipped (spec sparse 11.8), later duplicates win", 0.0, [](const Side& s) {
                at::manual_seed(52);
                at::Tensor cache = s.to(rnd({4, 16, 1, 128}, at::kBFloat16));
                at::Tensor rows = cache.view({-1, 128});
                const at::Tensor slots = s.to(at::tensor({3, 17, -1, 40, 63, 0}, at::kLong).view({6, 1}));
                ops::scatter_nd_update_(rows, slots, s.to(rnd({6, 128}, at::kBFloat16)), s.pv);
                return on_cpu({cache});
              }};
}

Case hadamard() {
  return Case{"hadamard_rotate",
              "LI C8 / DSV4 rotate_activation: x (tk=6, heads=8, 128) bfloat16 @ H128 / sqrt(128) (dense::linear on "
              "the device)",
              "the Sylvester H128 scaled by 128^-0.5 is orthonormal and symmetric (x @ H = x H^T)", 1e-2,
              [](const Side& s) {
                at::manual_seed(53);
                const at::Tensor h = ops::hadamard_matrix(128, 1.0 / std::sqrt(128.0), at::kBFloat16, s.dev);
                return on_cpu({ops::hadamard_rotate(s.to(rnd({6, 8, 128}, at::kBFloat16)), h)});
              }};
}

}  // namespace

void add_sparse_cases(std::vector<Case>& c) {
  c.push_back(sparse_flash_attention());
  c.push_back(lightning_indexer(OpLibrary::VllmAscend));
  c.push_back(lightning_indexer(OpLibrary::TorchNpu));
  c.push_back(quant_lightning_indexer(OpLibrary::VllmAscend));
  c.push_back(quant_lightning_indexer(OpLibrary::TorchNpu));
  c.push_back(kv_quant_sparse_flash_attention());
  c.push_back(dynamic_block_quant());
  c.push_back(rotary_mul(false));
  c.push_back(rotary_mul(true));
  c.push_back(scatter_nd_update());
  c.push_back(hadamard());
}

}  // namespace aar::verify::detail
