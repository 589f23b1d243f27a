// Per-layer DSA forward (docs/design/dsa.md §1.1, §2.3, §5.1); see dsa/impl.h.
#include "ascend_attn_rt/dsa/impl.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <memory>
#include <optional>
#include <tuple>

#include "ascend_attn_rt/comm/comm.h"
#include "ascend_attn_rt/comm/dcp_exchange.h"
#include "ascend_attn_rt/cp/plan/sparse_cp.h"
#include "ascend_attn_rt/sparse/topk_remap.h"
#include "ascend_attn_rt/errors.h"
#include "ascend_attn_rt/graph/graph_params.h"
#include "ascend_attn_rt/ops/dense.h"
#include "ascend_attn_rt/ops/dsa_compressor.h"
#include "ascend_attn_rt/ops/fault_injection.h"
#include "ascend_attn_rt/ops/dsa_inplace_ops.h"
#include "ascend_attn_rt/ops/hadamard.h"
#include "ascend_attn_rt/ops/lightning_indexer.h"
#include "ascend_attn_rt/ops/mx_quant.h"
#include "ascend_attn_rt/ops/quant.h"
#include "ascend_attn_rt/ops/sparse_attn_sharedkv.h"
#include "ascend_attn_rt/ops/sparse_flash_mla.h"
#include "ascend_attn_rt/ops/out_variants.h"
#include "ascend_attn_rt/ops/transpose_batchmatmul.h"
#include "ascend_attn_rt/dsa/graph.h"
#include "ascend_attn_rt/sparse/dsa_cp_road.h"
#include "../sparse/dsa_cp_workspace.h"
#include "ascend_attn_rt/sparse/oproj_switch.h"
#include "streams.h"
#include "workspace.h"
#include "../common/impl_checks.h"
#include "../common/inference_scope.h"
#include "../graph/exclusive_scope.h"

namespace aar::dsa {

namespace {

// npu_dynamic_quant: graph mode into the workspace's stable (q, scale) rows,
// eager the operator's own results (no copy).
std::tuple<at::Tensor, at::Tensor> dynamic_quant_into(const ops::DynamicQuantArgs& qa, bool graph,
                                                      const at::Tensor& q_ws, const at::Tensor& scale_ws) {
  if (!graph) return ops::dynamic_quant(qa);
  ops::dynamic_quant_out(qa, q_ws, scale_ws);
  return {q_ws, scale_ws};
}

at::ScalarType scalar_of(KvDtype d) {
  switch (d) {
    case KvDtype::BF16: return at::kBFloat16;
    case KvDtype::FP16: return at::kHalf;
    case KvDtype::FP32: return at::kFloat;
    case KvDtype::INT8: return at::kChar;
    case KvDtype::FP8_E4M3: return at::kFloat8_e4m3fn;
  }
  throw_invalid("KvDtype value ", static_cast<int>(d), " is outside the enum");
}

c10::IntArrayRef sizes_of(const at::Tensor& t) { return t.defined() ? t.sizes() : c10::IntArrayRef{}; }

// The cache's pages against its group's: the group's block table addresses
// blocks [0, num_blocks), so a cache with fewer would be written and read out
// of bounds (or have some of its rows dropped by a kernel that skips them).
void check_blocks(int64_t blocks, const char* name, const GroupMetadata& g, const char* group) {
  AAR_CHECK_ARG(blocks >= g.num_blocks, name, " has ", blocks, " blocks, fewer than metadata.", group,
                "'s num_blocks=", g.num_blocks, " (its GroupBuilder's)");
}

// A paged cache (nb, rows, 1, width) with unit stride in its last dim (page
// strides may be padded: docs/design/dsa.md §2.2's tiers), of at least the group's blocks.
void check_paged(const at::Tensor& c, const char* name, const GroupMetadata& g, const char* group, int64_t rows,
                 int64_t width, at::ScalarType dtype, c10::Device device) {
  AAR_CHECK_ARG(c.defined(), name, " is None but the layer needs it (docs/design/dsa.md §2.3 tuple)");
  // The sizes and strides read once (each size(i) / stride(i) call wraps and checks its index).
  const c10::IntArrayRef sz = c.sizes();
  AAR_CHECK_ARG(sz.size() == 4 && sz[1] == rows && sz[2] == 1 && sz[3] == width, name,
                " must have shape (num_blocks, ", rows, ", 1, ", width, "), got ", sz);
  check_blocks(sz[0], name, g, group);
  AAR_CHECK_ARG(c.scalar_type() == dtype, name, " dtype ", c.scalar_type(), " is not ", dtype);
  AAR_CHECK_ARG(c.device() == device, name, " is on ", c.device(), ", the layer's weights on ", device);
  const c10::IntArrayRef st = c.strides();
  AAR_CHECK_ARG(st[3] == 1 && st[1] == width, name, " rows must be dense (strides ", st, ")");
}

void check_group(const GroupMetadata* g, const char* name) {
  AAR_CHECK_ARG(g != nullptr, "metadata.", name, " is missing for this layer's ratio (docs/design/dsa.md §3.3)");
  check_current(*g, name);
}

}  // namespace

// ------------------------------------------------------------------ docs/design/dsa.md §2.3 tuple

std::vector<at::Tensor> compose_kv_cache(const AttnKvPlan& plan, const at::Tensor& compress_kv,
                                         const at::Tensor& swa_kv, const at::Tensor& state,
                                         const at::Tensor& indexer_state, const at::Tensor& indexer_k,
                                         const at::Tensor& indexer_scale, const at::Tensor& indexer_full) {
  AAR_CHECK_ARG(swa_kv.defined(), "swa_kv must be given: every DSA layer has an SWA cache (docs/design/dsa.md §2.3)");
  AAR_CHECK_ARG(plan.indexer_full_view || !indexer_full.defined(), "indexer_full is given but the plan has no "
                "full indexer view (indexer_full_view=False): the tuple has 6 entries");
  std::vector<at::Tensor> t{compress_kv, swa_kv, state, indexer_state, indexer_k, indexer_scale};
  if (plan.indexer_full_view) t.push_back(indexer_full);
  return t;
}

ForwardKv unpack_forward_kv_cache(const std::vector<at::Tensor>& kv, int32_t ratio) {
  AAR_CHECK_ARG(kv.size() == 6 || kv.size() == 7, "kv_cache must be the 6- or 7-entry DSA tuple (docs/design/dsa.md §2.3), got ",
                kv.size(), " entries");
  ForwardKv f;
  f.swa_kv = kv[1];
  if (kv.size() == 7) f.indexer_full = kv[6];
  if (ratio > 1) {
    f.compress_kv = kv[0];
    f.state = kv[2];
  }
  if (ratio == 4) {
    f.indexer_k = kv[4];
    f.indexer_scale = kv[5];
  }
  return f;
}

IndexerKv unpack_indexer_kv_cache(const std::vector<at::Tensor>& kv) {
  AAR_CHECK_ARG(kv.size() == 6 || kv.size() == 7, "kv_cache must be the 6- or 7-entry DSA tuple (docs/design/dsa.md §2.3), got ",
                kv.size(), " entries");
  return {kv[3], kv[4], kv[5], kv.size() == 7 ? kv[6] : at::Tensor()};
}

// ------------------------------------------------------------------ Impl

Impl::Impl(const ImplConfig& cfg, const Weights& w) : cfg_(cfg), w_(w) {
  ImplConfig& c = cfg_;
  internal::check_norm_eps(c.eps, "eps");
  check_compress_ratio(c.compress_ratio);
  // DCP (docs/design/sparse_cp.md §12).
  const int64_t Wd = c.dcp_comm != nullptr ? c.dcp_comm->size() : 1;
  if (Wd > 1) {
    const int64_t Wc = c.dsa_cp_comm != nullptr ? c.dsa_cp_comm->size() : 1;
    if (Wc > 1 && (Wc != Wd || c.dsa_cp_comm->rank() != c.dcp_comm->rank())) {
      // docs/design/sparse_cp.md §14: DCP rank r holds token slice r; every collective goes through
      // dsa_cp_comm (the same object may be passed for both).
      throw_not_supported("dcp_comm rank ", c.dcp_comm->rank(), " of ", Wd, " with dsa_cp_comm rank ",
                          c.dsa_cp_comm->rank(), " of ", Wc, ": DSA DCP x DSA-CP is built for a DCP group that is "
                          "the DSA-CP group (same size, same rank; docs/design/sparse_cp.md §14)");
    }
    if (c.plan.sparse_attn != SparseAttnPath::SharedKv) {
      throw_not_supported("dcp_comm of ", Wd, " ranks with the ", c.plan.sparse_attn_op, " plan: DSA DCP is built "
                          "for the A2/A3 npu_sparse_attn_sharedkv plan only (docs/design/sparse_cp.md §12)");
    }
  }
  // PCP (docs/design/sparse_cp.md §13).
  const int64_t Wp = c.pcp_comm != nullptr ? c.pcp_comm->size() : 1;
  if (Wp > 1) {
    const int64_t Wc = c.dsa_cp_comm != nullptr ? c.dsa_cp_comm->size() : 1;
    if (Wc > 1) {
      throw_not_supported("pcp_comm of ", Wp, " ranks with dsa_cp_comm of ", Wc, " ranks: DSA-CP x PCP is not "
                          "implemented (both split the step's tokens; docs/design/sparse_cp.md §13)");
    }
    if (Wd > 1) {
      throw_not_supported("pcp_comm of ", Wp, " ranks with dcp_comm of ", Wd, " ranks: DSA PCP x DCP is not "
                          "implemented (docs/design/sparse_cp.md §13)");
    }
    if (c.plan.sparse_attn != SparseAttnPath::SharedKv) {
      throw_not_supported("pcp_comm of ", Wp, " ranks with the ", c.plan.sparse_attn_op, " plan: DSA PCP is built "
                          "for the A2/A3 npu_sparse_attn_sharedkv plan only (docs/design/sparse_cp.md §13)");
    }
  }
  using internal::dim_in_range;
  AAR_CHECK_ARG(dim_in_range(c.hidden_size) && dim_in_range(c.num_heads) && dim_in_range(c.head_dim) &&
                    dim_in_range(c.q_lora_rank) && dim_in_range(c.o_lora_rank),
                "hidden_size, num_heads, head_dim, q_lora_rank and o_lora_rank must be in [1, ",
                internal::kMaxModelDim, "], got ", c.hidden_size, ", ", c.num_heads, ", ", c.head_dim, ", ",
                c.q_lora_rank, ", ", c.o_lora_rank);
  AAR_CHECK_ARG(c.rope_dim > 0 && c.rope_dim % 2 == 0 && c.rope_dim <= c.head_dim, "rope_dim=", c.rope_dim,
                " must be even and in (0, head_dim=", c.head_dim, "]");
  AAR_CHECK_ARG(c.window >= 0, "window must be >= 0 (0: the SWA group's, set once on the StepBuilder), got ",
                c.window);
  AAR_CHECK_ARG(c.eps > 0, "eps must be positive, got ", c.eps);
  AAR_CHECK_ARG(c.kv_cache_group >= 0, "kv_cache_group must be >= 0, got ", c.kv_cache_group);
  AAR_CHECK_ARG(c.o_groups > 0 && (c.num_heads * c.head_dim) % c.o_groups == 0, "o_groups=", c.o_groups,
                " must divide num_heads * head_dim = ", c.num_heads * c.head_dim);
  const bool c4 = c.compress_ratio == 4;
  if (c4) {
    AAR_CHECK_ARG(dim_in_range(c.index_n_heads) && dim_in_range(c.index_topk) &&
                      c.index_head_dim <= internal::kMaxModelDim,
                  "index_n_heads, index_topk and index_head_dim must be in [1, ", internal::kMaxModelDim, "], got ",
                  c.index_n_heads, ", ", c.index_topk, ", ", c.index_head_dim);
    AAR_CHECK_ARG(c.index_head_dim > 0 && (c.index_head_dim & (c.index_head_dim - 1)) == 0 &&
                      c.rope_dim <= c.index_head_dim,
                  "index_head_dim=", c.index_head_dim, " must be a power of two (Hadamard, docs/design/sparse.md §3) and >= rope_dim=",
                  c.rope_dim);
  }
  AAR_CHECK_ARG(!c.skip_topk || c4, "skip_topk reuses a C4 selection: the layer's compress_ratio must be 4, got ",
                c.compress_ratio);
  AAR_CHECK_ARG(!c.use_index_cache || (c4 && !c.skip_topk), "use_index_cache stores this layer's top-k: it needs a "
                "ratio-4 layer that computes one (skip_topk=False)");
  AAR_CHECK_ARG(c.plan.uses_sparse_flash_mla == (c.plan.sparse_attn == SparseAttnPath::SparseFlashMla),
                "plan uses_sparse_flash_mla=", c.plan.uses_sparse_flash_mla ? "True" : "False",
                " contradicts plan sparse_attn=", to_string(c.plan.sparse_attn));
  if (c.plan.fp8_kv_rows) {
    AAR_CHECK_ARG(c.head_dim == Fp8KvRowLayout::kNopeDims + Fp8KvRowLayout::kRopeDims &&
                      c.rope_dim == Fp8KvRowLayout::kRopeDims,
                  "the plan's 640-byte fp8 rows hold head_dim 512 and rope_dim 64, got ", c.head_dim, ", ",
                  c.rope_dim);
  }

  // DSA-CP (docs/design/sparse_cp.md §10): every head's query, the o_proj shard of W ranks.
  const int64_t W = c.dsa_cp_comm != nullptr ? c.dsa_cp_comm->size() : 1;
  if (W > 1) {
    AAR_CHECK_ARG(c.num_heads % W == 0 && c.o_groups % W == 0, "dsa_cp_comm has ", W,
                  " ranks, which must divide num_heads=", c.num_heads, " and o_groups=", c.o_groups,
                  " (under DSA-CP they are the model's; each rank's o_proj shard holds whole heads and groups)");
    if (w.wo_a_scale.defined()) {
      throw_not_supported("the MX-fp8 o_proj (weight wo_a_scale) under DSA-CP (dsa_cp_comm of ", W, " ranks) is "
                          "not implemented: its all-to-all road and full-weight switch take the Bmm o_proj "
                          "(docs/design/sparse_cp.md §10); pass a bf16 wo_a without wo_a_scale");
    }
  }
  // Weights.
  AAR_CHECK_ARG(w.wq_a.defined(), "weight wq_a must be given");
  // docs/design/dsa.md §5.4: the W8A8-dynamic prolog, selected by its scales (all three or none).
  const int n_scales = int(w.wq_a_scale.defined()) + int(w.wq_b_scale.defined()) + int(w.wkv_scale.defined());
  AAR_CHECK_ARG(n_scales == 0 || n_scales == 3, "the W8A8-dynamic prolog needs wq_a_scale, wq_b_scale and "
                "wkv_scale together, got ", w.wq_a_scale.defined() ? "wq_a_scale " : "",
                w.wq_b_scale.defined() ? "wq_b_scale " : "", w.wkv_scale.defined() ? "wkv_scale " : "",
                "only");
  w8a8_ = n_scales == 3;
  // Every plan and mode: the int8 projections run on whatever rows the mode computes, and their float
  // results feed the same code as a float layer's (the fp8-row plan's epilog takes the bf16 kv rows).
  if (w8a8_) {
    AAR_CHECK_ARG(w.wo_b.defined(), "weight wo_b must be given (a W8A8-dynamic layer's activation dtype is wo_b's)");
  }
  const at::ScalarType dt = w8a8_ ? w.wo_b.scalar_type() : w.wq_a.scalar_type();
  act_dtype_ = dt;
  const c10::Device dev = w.wq_a.device();
  AAR_CHECK_ARG(dt == at::kBFloat16 || dt == at::kHalf || dt == at::kFloat,
                "the weights' dtype must be bfloat16, float16 or float32, got ", dt);
  // The A5 + BF16 plan's caches are bf16 (float32 only for CPU reference
  // runs, as on every plain-row plan): float16 weights would make float16
  // caches, which is not that plan.
  AAR_CHECK_ARG(!c.plan.uses_sparse_flash_mla || dt != at::kHalf, "the weights are float16 but plan sparse_attn="
                "SparseFlashMla (A5 + bfloat16 cache) keeps bfloat16 KV rows: use bfloat16 weights (float32 for "
                "CPU reference runs)");
  auto check = [&](const at::Tensor& t, const char* name, std::vector<int64_t> shape, bool fp32 = false) {
    AAR_CHECK_ARG(t.defined() && t.sizes() == c10::IntArrayRef(shape), "weight ", name, " must have shape ",
                  c10::IntArrayRef(shape), ", got ", sizes_of(t));
    AAR_CHECK_ARG(fp32 ? t.scalar_type() == at::kFloat : t.scalar_type() == dt, "weight ", name, " is ",
                  t.scalar_type(), ", expected ", fp32 ? at::kFloat : dt);
    AAR_CHECK_ARG(t.device() == dev, "weight ", name, " is on ", t.device(), ", wq_a on ", dev);
  };
  const int64_t H = c.hidden_size, N = c.num_heads, D = c.head_dim, G = c.o_groups;
  if (w8a8_) {
    // int8 (out, in) and its float32 (out) scale, held transposed (in, out) as npu_quant_matmul's x2.
    auto check_q = [&](const at::Tensor& t, const at::Tensor& s, const char* name, int64_t out, int64_t in) {
      AAR_CHECK_ARG(t.defined() && t.sizes() == c10::IntArrayRef({out, in}), "weight ", name, " must have shape ",
                    c10::IntArrayRef({out, in}), ", got ", sizes_of(t));
      AAR_CHECK_ARG(t.scalar_type() == at::kChar, "weight ", name, " is ", t.scalar_type(), ", expected Char (int8): "
                    "its ", name, "_scale makes it a W8A8-dynamic projection");
      AAR_CHECK_ARG(t.device() == dev, "weight ", name, " is on ", t.device(), ", wq_a on ", dev);
      AAR_CHECK_ARG(s.sizes() == c10::IntArrayRef({out}), "weight ", name, "_scale must have shape (", out,
                    "), one per output channel, got ", s.sizes());
      AAR_CHECK_ARG(s.scalar_type() == at::kFloat, "weight ", name, "_scale is ", s.scalar_type(), ", expected Float");
      AAR_CHECK_ARG(s.device() == dev, "weight ", name, "_scale is on ", s.device(), ", wq_a on ", dev);
      return t.t().contiguous();
    };
    wq_a_t_ = check_q(w.wq_a, w.wq_a_scale, "wq_a", c.q_lora_rank, H);
    wq_b_t_ = check_q(w.wq_b, w.wq_b_scale, "wq_b", N * D, c.q_lora_rank);
    wkv_t_ = check_q(w.wkv, w.wkv_scale, "wkv", D, H);
    w_.wq_a_scale = w.wq_a_scale.contiguous();
    w_.wq_b_scale = w.wq_b_scale.contiguous();
    w_.wkv_scale = w.wkv_scale.contiguous();
  } else {
    check(w.wq_a, "wq_a", {c.q_lora_rank, H});
    check(w.wq_b, "wq_b", {N * D, c.q_lora_rank});
    check(w.wkv, "wkv", {D, H});
  }
  check(w.q_norm, "q_norm", {c.q_lora_rank});
  check(w.kv_norm, "kv_norm", {D});
  check(w.attn_sink, "attn_sink", {N}, /*fp32=*/true);
  const int64_t Gs = G / W;  // the groups of this rank's o_proj shard (all of them without DSA-CP)
  // o_proj (docs/design/dsa.md §5.2): the plan allows the MX-fp8 path, the checkpoint's wo_a_scale selects it (impl.h).
  if (w.wo_a_scale.defined()) {
    AAR_CHECK_ARG(c.plan.o_proj == OProjKind::MxFp8QuantBmm, "weight wo_a_scale is given but the plan's o_proj is ",
                  to_string(c.plan.o_proj), ": the MX-fp8 o_proj runs only on the A5 plans (device_kind a5); pass "
                  "a bf16 wo_a without wo_a_scale");
    o_proj_ = OProjKind::MxFp8QuantBmm;
    const int64_t k = N * D / G;
    AAR_CHECK_ARG(k % 64 == 0, "the MX-fp8 o_proj needs N * D / o_groups = ", k,
                  " to be a multiple of 64 (npu_transpose_quant_batchmatmul's MX mode)");
    AAR_CHECK_ARG(w.wo_a.defined() && w.wo_a.sizes() == c10::IntArrayRef({G, k, c.o_lora_rank}),
                  "weight wo_a must have shape ", c10::IntArrayRef({G, k, c.o_lora_rank}), ", got ", sizes_of(w.wo_a));
    AAR_CHECK_ARG(w.wo_a.scalar_type() == at::kFloat8_e4m3fn, "weight wo_a is ", w.wo_a.scalar_type(),
                  ", expected Float8_e4m3fn: wo_a_scale makes it the MX-fp8 checkpoint's weight");
    AAR_CHECK_ARG(w.wo_a.device() == dev, "weight wo_a is on ", w.wo_a.device(), ", wq_a on ", dev);
    const std::vector<int64_t> ss{G, k / 64, c.o_lora_rank, 2};
    AAR_CHECK_ARG(w.wo_a_scale.sizes() == c10::IntArrayRef(ss), "weight wo_a_scale must have shape (G, k / 64, "
                  "o_lora, 2) = ", c10::IntArrayRef(ss), ", got ", w.wo_a_scale.sizes());
    AAR_CHECK_ARG(w.wo_a_scale.scalar_type() == at::kFloat8_e8m0fnu || w.wo_a_scale.scalar_type() == at::kByte,
                  "weight wo_a_scale is ", w.wo_a_scale.scalar_type(), ", expected Float8_e8m0fnu (or its uint8 bytes)");
    AAR_CHECK_ARG(w.wo_a_scale.device() == dev, "weight wo_a_scale is on ", w.wo_a_scale.device(), ", wq_a on ", dev);
    w_.wo_a_scale = w.wo_a_scale.view(at::kFloat8_e8m0fnu);
  } else {
    AAR_CHECK_ARG(!w.wo_a.defined() || w.wo_a.scalar_type() != at::kFloat8_e4m3fn, "weight wo_a is Float8_e4m3fn "
                  "but wo_a_scale is not given: an MX-fp8 wo_a needs its scales (G, k / 64, o_lora, 2)");
    check(w.wo_a, "wo_a", {Gs, N * D / G, c.o_lora_rank});
  }
  check(w.wo_b, "wo_b", {H, Gs * c.o_lora_rank});
  if (c.compress_ratio > 1) {
    const int64_t coff = c4 ? 2 : 1;
    check(w.cmp_wkv, "cmp_wkv", {coff * D, H});
    check(w.cmp_wgate, "cmp_wgate", {coff * D, H});
    AAR_CHECK_ARG(w.cmp_ape.defined() && w.cmp_ape.sizes() == c10::IntArrayRef({c.compress_ratio, coff * D}),
                  "weight cmp_ape must have shape (", c.compress_ratio, ", ", coff * D, "), got ", sizes_of(w.cmp_ape));
    check(w.cmp_norm, "cmp_norm", {D});
    cmp_ape_f32_ = w.cmp_ape.to(at::kFloat).contiguous();
  }
  if (c4) {
    const int64_t Di = c.index_head_dim;
    check(w.idx_wq_b, "idx_wq_b", {c.index_n_heads * Di, c.q_lora_rank});
    check(w.idx_weights_proj, "idx_weights_proj", {c.index_n_heads, H});
    check(w.idx_cmp_wkv, "idx_cmp_wkv", {2 * Di, H});
    check(w.idx_cmp_wgate, "idx_cmp_wgate", {2 * Di, H});
    AAR_CHECK_ARG(w.idx_cmp_ape.defined() && w.idx_cmp_ape.sizes() == c10::IntArrayRef({4, 2 * Di}),
                  "weight idx_cmp_ape must have shape (4, ", 2 * Di, "), got ", sizes_of(w.idx_cmp_ape));
    check(w.idx_cmp_norm, "idx_cmp_norm", {Di});
    idx_ape_f32_ = w.idx_cmp_ape.to(at::kFloat).contiguous();
    // rotate_activation (docs/design/sparse.md §3 DSV4): x H / sqrt(Di), Di a power of two.
    hadamard_ = ops::hadamard_matrix(Di, 1.0 / std::sqrt(static_cast<double>(Di)), dt, dev);
    // docs/design/dsa.md §1.3's Di^-0.5 n_idx^-0.5 folded into the projection (one matmul per call instead of three ops).
    idx_wproj_scaled_ = (w.idx_weights_proj.to(at::kFloat) *
                         (1.0 / std::sqrt(static_cast<double>(Di)) / std::sqrt(static_cast<double>(c.index_n_heads))))
                            .to(dt);
  }
  sinks_f32_ = w.attn_sink.contiguous();
  // The intermediates' buffers, shared by the layers of this shape (workspace.h).
  detail::WorkspaceShape ws;
  ws.device = dev;
  ws.dtype = dt;
  ws.num_heads = N;
  ws.head_dim = D;
  ws.q_lora_rank = c.q_lora_rank;
  ws.o_groups = G;
  ws.o_lora_rank = c.o_lora_rank;
  ws.compress_ratio = c.compress_ratio;
  ws.group = c.workspace_group;
  // docs/design/dsa.md §6: the graph-mode buffers of the optional paths.
  ws.mx_o_proj = o_proj_ == OProjKind::MxFp8QuantBmm;
  ws.w8a8 = w8a8_;
  ws.hidden_size = w8a8_ ? c.hidden_size : 0;
  ws.inplace_write = c.plan.kv_scatter == KvScatterKind::ScatterNdUpdateInplace;
  if (c4) {
    ws.index_n_heads = c.index_n_heads;
    ws.index_head_dim = c.index_head_dim;
    ws.index_topk = c.index_topk;
    ws.idx_q = scalar_of(c.plan.indexer_q_dtype);
    ws.idx_q_scale = scalar_of(c.plan.indexer_q_scale_dtype);
    ws.li_weights = scalar_of(c.plan.li_weights_dtype);
    ws.idx_k = scalar_of(c.plan.indexer_k_dtype);
    ws.idx_k_scale = scalar_of(c.plan.indexer_k_scale_dtype);
  }
  ws_ = detail::Workspace::shared(ws);
  if (Wd > 1 && W <= 1) {
    // docs/design/sparse_cp.md §12.2: the query gather's target and the merge's wire, shared by the
    // DCP layers of this shape on this comm (DSA-CP x DCP sizes its own per slice, §14).
    cp::DcpWorkspaceShape dsh;
    dsh.device = dev;
    dsh.q_dtype = dsh.out_dtype = dt;
    dsh.world = Wd;
    dsh.heads = N;
    dsh.q_dim = dsh.out_dim = D;
    dsh.comm = c.dcp_comm;
    dsh.workspace_group = c.workspace_group;
    dcp_ws_ = cp::DcpWorkspace::shared(dsh);
  }
  ones_d_ = at::ones({D}, w.wq_a.options().dtype(dt));  // the weightless per-head RMS (gamma 1 is exact in any dtype)
  if (W > 1) {
    // wo_a gathered along its groups, wo_b along its columns: switched together (one guard).
    oproj_full_ = std::make_unique<sparse::OProjFullWeight>(
        std::vector<sparse::OProjFullWeight::Slot>{{&w_.wo_a, 0}, {&w_.wo_b, 1}}, *c.dsa_cp_comm);
    sparse::detail::DsaCpShape cs;  // the road's head blocks (docs/design/sparse_cp.md §7.1)
    cs.device = w.wq_a.device();
    cs.dtype = dt;
    cs.world = W;
    cs.road_width = c.num_heads * c.head_dim;
    cs.group = c.workspace_group;
    cpws_ = sparse::detail::DsaCpWorkspace::shared(cs);
  }
}

Impl::~Impl() = default;

const at::Tensor& Impl::o_proj_full_pool(int64_t i) const {
  AAR_CHECK_ARG(oproj_full_ != nullptr, "the layer has no DSA-CP (dsa_cp_comm of more than one rank): no o_proj "
                "full-weight pool");
  AAR_CHECK_ARG(i == 0 || i == 1, "o_proj full-weight pool index must be 0 (wo_a) or 1 (wo_b), got ", i);
  return oproj_full_->pool(static_cast<size_t>(i));
}

int32_t Impl::dsa_cp_world_size() const { return cfg_.dsa_cp_comm != nullptr ? cfg_.dsa_cp_comm->size() : 1; }

Impl::Caches Impl::validate(const at::Tensor& hidden, const std::vector<at::Tensor>& kv, const LayerMetadata& md,
                            const at::Tensor& output, sfa::TopkBuffer* topk) const {
  const ImplConfig& c = cfg_;
  const at::ScalarType dt = act_dtype_;
  const c10::Device dev = w_.wq_a.device();
  AAR_CHECK_ARG(md.compress_ratio == c.compress_ratio, "metadata was routed for compress_ratio ", md.compress_ratio,
                " but the layer's is ", c.compress_ratio);
  AAR_CHECK_ARG(md.step != nullptr, "metadata.step is missing");
  check_current(md.step->stamp, "metadata.step");
  // docs/design/sparse_cp.md §10: the layer's group against the step's token shard.
  cp::check_comm_matches(c.dsa_cp_comm, md.step->dsa_cp.world_size, md.step->dsa_cp.rank, "DSA-CP", "dsa_cp_comm",
                         "dsa_cp_world_size");
  // docs/design/sparse_cp.md §12: the layer's DCP group against the step's.
  cp::check_comm_matches(c.dcp_comm, md.step->dcp.world_size, md.step->dcp.rank, "DCP", "dcp_comm",
                         "dcp_world_size");
  // docs/design/sparse_cp.md §13: the layer's PCP group against the step's.
  cp::check_comm_matches(c.pcp_comm, md.step->pcp.world_size, md.step->pcp.rank, "PCP", "pcp_comm",
                         "pcp_world_size");
  check_group(md.swa, "swa");
  // The window is the model's, set once on the StepBuilder; a layer that
  // names one of its own must name the same (it would attend another span
  // than the builders' metadata describes).
  AAR_CHECK_ARG(c.window == 0 || c.window == md.swa->window, "window=", c.window, " (the layer's) differs from "
                "the SWA group's window=", md.swa->window, " (the StepBuilder's model settings): pass the same "
                "window, or window=0 to take the builders'");
  if (c.compress_ratio > 1) {
    check_group(md.attention, "attention");
    check_group(md.compressor_state, "compressor_state");
  }
  // The KV writes index with the groups' slots: they must be in the plan's format (a group built under another
  // plan would be misread).
  auto check_format = [&](const GroupMetadata& g, const char* name, DsaCacheKind kind) {
    const SlotFormat want = slot_format_for(c.plan, kind);
    AAR_CHECK_ARG(g.slot_format == want, "metadata.", name, " has ", to_string(g.slot_format),
                  " slots but the layer's plan (sparse_attn=", to_string(c.plan.sparse_attn), ") writes ",
                  to_string(want), " slots: its GroupBuilder was configured with another plan");
  };
  check_format(*md.swa, "swa", DsaCacheKind::Swa);
  if (c.compress_ratio > 1) {
    check_format(*md.attention, "attention", md.attention->kind);
    // docs/design/dsa.md §4.2: SparseFlashMla takes the compressed lengths the builder stages for this plan only.
    AAR_CHECK_ARG(!c.plan.uses_sparse_flash_mla ||
                      (md.attention->seqused_cmp_kv.defined() && md.attention->cmp_residual_kv.defined()),
                  "metadata.attention has no seqused_cmp_kv / cmp_residual_kv: plan sparse_attn=SparseFlashMla "
                  "needs its GroupBuilder built with the same (A5 + bfloat16) plan");
  }
  if (c.compress_ratio == 4) {
    check_group(md.indexer_cache, "indexer_cache");
    check_group(md.indexer_state, "indexer_state");
    const GroupMetadata& ig = *md.indexer_cache;
    if (ig.qli_metadata_filled && !c.skip_topk) {  // skip_topk layers do not read the blob
      AAR_CHECK_ARG(ig.qli_num_heads == c.index_n_heads && ig.qli_head_dim == c.index_head_dim &&
                        ig.qli_sparse_count == c.index_topk,
                    "metadata.indexer_cache's QLI blob was made for index_n_heads=", ig.qli_num_heads,
                    ", index_head_dim=", ig.qli_head_dim, ", index_topk=", ig.qli_sparse_count,
                    " but the layer has ", c.index_n_heads, ", ", c.index_head_dim, ", ", c.index_topk,
                    ": give the StepBuilder (whose settings every group reads) the layer's index_n_heads / "
                    "index_head_dim / index_topk");
    }
  }
  // The per-step rows the builders make (dsa/metadata.h); metadata filled in
  // by hand must carry them too.
  auto check_rows = [&](const GroupMetadata* g, const char* name) {
    AAR_CHECK_ARG(g->compressed_cos.defined() && g->compressed_sin.defined() && g->compressed_slots.defined(),
                  "metadata.", name, " has no compressed_cos / compressed_sin / compressed_slots (its GroupBuilder "
                  "makes them with compressor_metadata)");
  };
  AAR_CHECK_ARG(md.common().neg_sin.defined(), "metadata.", md.attention != nullptr ? "attention" : "swa",
                " has no neg_sin rows (the StepBuilder makes them)");
  if (c.compress_ratio > 1) check_rows(md.attention, "attention");
  if (c.compress_ratio == 4) check_rows(md.indexer_cache, "indexer_cache");
  const StepMetadata& st = *md.step;
  // Graph-padding requests the builder accepts with tokens but no KV (a dummy
  // of q > 0 tokens and seq_len < q) would reach the SAS operator, which needs
  // seq_len >= query_len, after the caches were written: refused here, before
  // any write. Padding requests of 0 tokens (the bucket's extra rows counted
  // by num_input_tokens) are what the layer takes.
  for (int32_t b = st.num_reqs; b < st.num_kernel_reqs; ++b) {
    const size_t ub = static_cast<size_t>(b);
    const int32_t q = st.query_start_loc_host[ub + 1] - st.query_start_loc_host[ub];
    const int32_t s = st.seq_lens_host[ub];
    AAR_CHECK_ARG(q == 0 || s >= q, "query_start_loc: graph-padding request ", b, " has ", q,
                  " token(s) but seq_lens[", b, "]=", s, " < ", q, ": the DSA layer's SAS call needs seq_len >= "
                  "query_len; give padding requests 0 tokens (the bucket's extra rows via num_input_tokens) or "
                  "seq_len >= their tokens");
  }
  AAR_CHECK_ARG(hidden.defined() && hidden.dim() == 2 && hidden.size(1) == c.hidden_size, "hidden must be (T, ",
                c.hidden_size, "), got ", sizes_of(hidden));
  AAR_CHECK_ARG(hidden.scalar_type() == dt && hidden.device() == dev, "hidden is ", hidden.scalar_type(), " on ",
                hidden.device(), "; the layer's weights are ", dt, " on ", dev);
  // PCP (docs/design/sparse_cp.md §13): hidden holds exactly this rank's local rows (a replicated step's: the
  // step's num_input_tokens rows, §13.4).
  const bool pcp = st.pcp.world_size > 1;
  if (pcp) {
    AAR_CHECK_ARG(hidden.size(0) == st.pcp.num_local_tokens, "hidden has ", hidden.size(0), " rows; under PCP (",
                  "pcp_world_size=", st.pcp.world_size, ") it holds this rank's local rows, num_local_tokens=",
                  st.pcp.num_local_tokens, " (metadata.local_token_index)");
    for (const GroupMetadata* g : {md.swa, md.attention, md.indexer_cache}) {
      AAR_CHECK_ARG(g == nullptr || !st.pcp_split() || g->pcp_block_table.defined(), "metadata group ",
                    to_string(g->kind), " has no pcp_block_table: its GroupBuilder must build from the PCP step");
    }
  } else {
    AAR_CHECK_ARG(hidden.size(0) >= st.num_kernel_tokens, "hidden has ", hidden.size(0),
                  " rows, fewer than the step's tokens in requests (num_kernel_tokens=", st.num_kernel_tokens, ")");
  }
  AAR_CHECK_ARG(output.defined() && output.sizes() == hidden.sizes() && output.scalar_type() == dt &&
                    output.device() == dev && output.is_contiguous(),
                "output must be a contiguous ", hidden.sizes(), " ", dt, " tensor on ", dev, ", got ",
                sizes_of(output));
  internal::check_output_disjoint(output, hidden, "hidden");
  if (c.skip_topk || c.use_index_cache) {
    AAR_CHECK_ARG(topk != nullptr, "topk_buffer must be given (skip_topk / use_index_cache)");
    const int64_t trows = pcp ? st.pcp.num_local_tokens : st.num_kernel_tokens;
    AAR_CHECK_ARG(topk->index_topk() == c.index_topk && topk->max_num_tokens() >= trows,
                  "topk_buffer is (", topk->max_num_tokens(), ", ", topk->index_topk(), "); the layer needs index_topk=",
                  c.index_topk, " and >= ", trows, " rows");
  }

  const ForwardKv f = unpack_forward_kv_cache(kv, c.compress_ratio);
  AAR_CHECK_ARG(c.plan.indexer_full_view == (kv.size() == 7), "kv_cache has ", kv.size(), " entries; the plan (",
                "indexer_full_view=", c.plan.indexer_full_view ? "True" : "False", ") needs ",
                c.plan.indexer_full_view ? 7 : 6);
  Caches out;
  const bool fp8 = c.plan.fp8_kv_rows;
  const at::ScalarType kv_dt = fp8 ? scalar_of(c.plan.attn_kv_dtype) : dt;
  const int64_t width = fp8 ? c.plan.attn_head_size : c.head_dim;
  check_paged(f.swa_kv, "kv_cache[1] (swa_kv)", *md.swa, "swa", md.swa->storage_block_size, width, kv_dt, dev);
  out.swa_kv = f.swa_kv;
  if (c.compress_ratio > 1) {
    check_paged(f.compress_kv, "kv_cache[0] (compress_kv)", *md.attention, "attention",
                md.attention->storage_block_size, width, kv_dt, dev);
    const int64_t coff = c.compress_ratio == 4 ? 2 : 1;
    const at::Tensor& s = f.state;
    const c10::IntArrayRef ss = sizes_of(s);
    AAR_CHECK_ARG(ss.size() == 3 && ss[1] == md.compressor_state->storage_block_size &&
                      ss[2] == 2 * coff * c.head_dim && s.scalar_type() == at::kFloat && s.device() == dev,
                  "kv_cache[2] (state) must be float32 (num_blocks, ", md.compressor_state->storage_block_size, ", ",
                  2 * coff * c.head_dim, ") on ", dev, ", got ", sizes_of(s));
    check_blocks(ss[0], "kv_cache[2] (state)", *md.compressor_state, "compressor_state");
    out.compress_kv = f.compress_kv;
    out.state = s;
  }
  if (c.compress_ratio == 4) {
    const IndexerKv ik = unpack_indexer_kv_cache(kv);
    const int64_t Di = c.index_head_dim, rows = md.indexer_cache->storage_block_size;
    const at::Tensor& s = ik.indexer_state;
    const c10::IntArrayRef ss = sizes_of(s);
    AAR_CHECK_ARG(ss.size() == 3 && ss[1] == md.indexer_state->storage_block_size && ss[2] == 4 * Di &&
                      s.scalar_type() == at::kFloat && s.device() == dev,
                  "kv_cache[3] (indexer_state) must be float32 (num_blocks, ", md.indexer_state->storage_block_size,
                  ", ", 4 * Di, ") on ", dev, ", got ", sizes_of(s));
    check_blocks(ss[0], "kv_cache[3] (indexer_state)", *md.indexer_state, "indexer_state");
    const GroupMetadata& ig = *md.indexer_cache;
    check_paged(ik.indexer_k, "kv_cache[4] (indexer_k)", ig, "indexer_cache", rows, Di,
                scalar_of(c.plan.indexer_k_dtype), dev);
    const at::Tensor& sc = ik.indexer_scale;
    const c10::IntArrayRef scs = sizes_of(sc);
    AAR_CHECK_ARG(scs.size() == 3 && scs[1] == rows && scs[2] == 1 &&
                      sc.scalar_type() == scalar_of(c.plan.indexer_k_scale_dtype) && sc.device() == dev,
                  "kv_cache[5] (indexer_scale) must be ", scalar_of(c.plan.indexer_k_scale_dtype),
                  " (num_blocks, ", rows, ", 1) on ", dev, ", got ", sizes_of(sc));
    check_blocks(scs[0], "kv_cache[5] (indexer_scale)", ig, "indexer_cache");
    AAR_CHECK_ARG(scs[0] == sizes_of(ik.indexer_k)[0], "kv_cache[5] (indexer_scale) has ", scs[0],
                  " blocks but kv_cache[4] (indexer_k) has ", sizes_of(ik.indexer_k)[0], " (one scale per key row)");
    if (c.plan.indexer_full_view) {
      const at::Tensor& fv = ik.indexer_full;
      const int64_t full_w = Di * element_size(c.plan.indexer_k_dtype) + element_size(c.plan.indexer_k_scale_dtype);
      const c10::IntArrayRef fs = sizes_of(fv);
      AAR_CHECK_ARG(fs.size() == 4 && fs[1] == rows && fs[2] == 1 && fs[3] == full_w && fv.element_size() == 1 &&
                        fv.device() == dev && fv.stride(3) == 1,
                    "kv_cache[6] (indexer_full) must be the (num_blocks, ", rows, ", 1, ", full_w,
                    ") one-byte view of the indexer pages on ", dev, ", got ", sizes_of(fv), " ",
                    fv.defined() ? fv.scalar_type() : at::kByte);
      check_blocks(fs[0], "kv_cache[6] (indexer_full)", ig, "indexer_cache");
    }
    out.indexer_state = s;
    out.indexer_k = ik.indexer_k;
    out.indexer_scale = sc;
    out.indexer_full = ik.indexer_full;
  }
  // The output and the top-k buffer against the entries the layer uses (ratio 1: swa_kv and
  // indexer_full; 128: also compress_kv and state; 4: all), after each entry's own checks. The
  // entries themselves may share memory: each is a cache of its own KV-cache group (vLLM may place
  // groups in one tensor, their block ids apart; docs/design/dsa.md §2.3), and indexer_k,
  // indexer_scale and indexer_full are strided views of one page.
  internal::TupleApart apart;
  apart.may_share = 0x7Fu;
  apart.used = c.compress_ratio == 4 ? 0x7Fu : c.compress_ratio == 128 ? 0x47u : 0x42u;
  if (topk != nullptr) {
    apart.topk_buffer = &topk->buffer();
    apart.hidden = &hidden;
    apart.hidden_name = "hidden";
  }
  internal::check_tuple_disjoint(kv, output, apart);
  return out;
}

void Impl::write_kv_rows(const at::Tensor& cache, const at::Tensor& slots, const at::Tensor& rows,
                         int64_t valid_rows, const detail::WriteViews* gw, const at::Tensor& fill) {
  // docs/design/dsa.md §4.1 / §4.2: the plan's scatter kind and slot format. The v2 scatter
  // and kv_compress_epilog skip the rows of block / slot -1 themselves.
  at::Tensor var = cache;
  switch (cfg_.plan.kv_scatter) {
    case KvScatterKind::ScatterNdUpdateV2:
      ops::scatter_nd_update_v2(var, slots, rows);
      return;
    case KvScatterKind::KvCompressEpilog: {
      ops::KvCompressEpilogArgs a;
      a.kv_compress_cache = cache.view({-1, 1, cfg_.plan.attn_head_size});
      a.x = rows.scalar_type() == at::kBFloat16 ? rows : rows.to(at::kBFloat16);
      a.slot_mapping = slots;
      a.quant_group_size = cfg_.plan.epilog_quant_group_size;
      a.quant_mode = cfg_.plan.epilog_quant_mode;
      a.round_scale_flag = cfg_.plan.epilog_round_scale;
      a.layout = cfg_.plan.epilog_layout;
      ops::kv_compress_epilog(a);
      return;
    }
    case KvScatterKind::ScatterNdUpdateInplace: {
      if (gw != nullptr) {
        // Graph mode (docs/design/dsa.md §6): every row, through the workspace's stable buffers,
        // since a replay cannot change a host row count. A skip row (block < 0) goes to the
        // group's fill slot, which no valid row of the step writes, carrying that slot's current
        // row: the cache changes exactly as under the eager prefix write.
        const int64_t m = rows.size(0);
        AAR_CHECK_ARG(fill.defined() && gw->mask.defined() && gw->mask.size(0) == m && slots.dim() == 2 &&
                          slots.size(0) == m,
                      "internal: the graph KV write of ", m, " rows needs the group's fill slot and as many "
                      "(block, offset) slots, got ", slots.sizes());
        ops::dense::nonneg_out(gw->mask, slots.select(1, 0));
        ops::dense::where_out(gw->idx, gw->mask.unsqueeze(1), slots, fill);
        ops::dense::index2_out(gw->cur, cache, fill.select(1, 0), fill.select(1, 1));
        ops::dense::where_out(gw->upd, gw->mask.view({m, 1, 1}), rows.view({m, 1, rows.size(1)}), gw->cur);
        ops::scatter_nd_update_(var, gw->idx, gw->upd);
        return;
      }
      // npu_scatter_nd_update_ does not support out-of-range indices (torch_npu
      // docs), so no skip row reaches it: the builders put the valid rows first
      // (num_valid_rows, a host value: no sync), and only that prefix is
      // written. Its updates are indices.shape[:-1] + cache.shape[2:] = (V, 1, D).
      AAR_CHECK_ARG(valid_rows >= 0 && valid_rows <= rows.size(0) && valid_rows <= slots.size(0),
                    "internal: ", valid_rows, " valid KV rows of ", rows.size(0), " rows / ", slots.size(0),
                    " slots");
      if (valid_rows == 0) return;
      const at::Tensor idx = valid_rows == slots.size(0) ? slots : slots.narrow(0, 0, valid_rows);
      const at::Tensor upd = (valid_rows == rows.size(0) ? rows : rows.narrow(0, 0, valid_rows))
                                 .view({valid_rows, 1, rows.size(1)});
      ops::scatter_nd_update_(var, idx, upd);
      return;
    }
  }
  throw_invalid("plan kv_scatter value ", static_cast<int>(cfg_.plan.kv_scatter), " is outside the enum");
}

namespace {

at::Tensor run_compressor(const at::Tensor& x, const at::Tensor& wkv, const at::Tensor& wgate, const at::Tensor& ape,
                          const at::Tensor& norm, const at::Tensor& state, const GroupMetadata& state_g,
                          const GroupMetadata& out_g, int64_t R, int64_t ratio, int64_t coff, double eps,
                          const at::Tensor& out) {
  ops::CompressorArgs a;
  a.x = x;
  a.wkv = wkv;
  a.wgate = wgate;
  a.state_cache = state;
  a.ape = ape;
  a.norm_weight = norm;
  // compressor_metadata's rows for the group's compressed rows (made by its builder).
  a.rope_cos = out_g.compressed_cos;
  a.rope_sin = out_g.compressed_sin;
  a.state_block_table = state_g.block_table;
  a.cu_seqlens = out_g.query_start_loc;
  a.seqused = out_g.seq_lens;
  a.start_pos = out_g.start_pos;
  a.rope_head_dim = R;
  a.cmp_ratio = ratio;
  a.coff = coff;
  a.norm_eps = eps;
  if (out.defined()) {
    ops::compressor_out(a, out);
    return out;
  }
  return ops::compressor(a);
}

using ::aar::detail::first_rows;  // a group's per-row tensor's first r rows

}  // namespace

const Impl::StepViews& Impl::step_views(const LayerMetadata& md, int64_t n) {
  // The builders hand out the same view per size, so these narrowed views
  // are remade only when the step's size (or the builder) changes.
  const GroupMetadata& common = md.common();
  StepViews& s = step_views_;
  if (s.n == n && s.cos_src.same(common.cos) && s.neg_src.same(common.neg_sin) && s.slots_src.same(md.swa->slot_mapping) &&
      s.qsl_src.same(common.query_start_loc)) {
    return s;
  }
  const int64_t R = cfg_.rope_dim;
  s.n = n;
  s.cos = first_rows(common.cos, n);
  s.sin = first_rows(common.sin, n);
  s.cos3 = s.cos.view({n, 1, R});
  s.sin3 = s.sin.view({n, 1, R});
  s.neg_sin3 = first_rows(common.neg_sin, n).view({n, 1, R});
  s.swa_slots = first_rows(md.swa->slot_mapping, n);
  s.q_ends = common.query_start_loc.narrow(0, 1, common.query_start_loc.size(0) - 1);
  s.cos_src.bind(common.cos);
  s.neg_src.bind(common.neg_sin);
  s.slots_src.bind(md.swa->slot_mapping);
  s.qsl_src.bind(common.query_start_loc);
  return s;
}

void Impl::indexer_cache_update(const at::Tensor& x, const Caches& c, const LayerMetadata& md,
                                const detail::RowViews& rv, int64_t r, bool graph) {
  // docs/design/dsa.md §1.3: the C4Li compressor over its state, Hadamard, the indexer cache write.
  const ImplConfig& cf = cfg_;
  const GroupMetadata& ig = *md.indexer_cache;
  const at::Tensor k = run_compressor(x, w_.idx_cmp_wkv, w_.idx_cmp_wgate, idx_ape_f32_, w_.idx_cmp_norm,
                                      c.indexer_state, *md.indexer_state, ig, cf.rope_dim, 4, 2, cf.eps,
                                      graph ? rv.ik : at::Tensor());
  ops::hadamard_rotate_out(rv.ik_rot, k, hadamard_);
  // The compressor emits min(n, n / 4 + B) rows for the n rows it is given;
  // the group's slots are counted from num_input_tokens (>= n under graph
  // padding when eager): its emitted rows come first, the rest are skip rows.
  const at::Tensor islots = first_rows(ig.compressed_slots, r);
  if (cf.plan.indexer_k_write == IndexerKWriteKind::CompressEpilogV2) {
    ops::IndexerCompressEpilogArgs e;
    e.indexer_compress_cache = c.indexer_full;
    e.x = rv.ik_rot;
    e.slot_mapping = islots;
    ops::indexer_compress_epilog_v2(e);
    return;
  }
  ops::DynamicQuantArgs qa;
  if (cf.plan.indexer_k_dtype != KvDtype::INT8) qa.dst_type = static_cast<int64_t>(scalar_of(cf.plan.indexer_k_dtype));
  qa.input = rv.ik_rot;
  const auto [k_q, k_scale] = dynamic_quant_into(qa, graph, rv.ik_q, rv.ik_scale);
  at::Tensor kc = c.indexer_k, sc = c.indexer_scale;
  // The scale in the cache's dtype: the workspace's rows (a converting copy),
  // or the fp32 scale itself when the cache is fp32.
  at::Tensor scale_rows;
  if (rv.ik_scale_c.is_alias_of(rv.ik_scale) && graph) {
    scale_rows = rv.ik_scale_c;
  } else {
    ops::dense::copy(rv.ik_scale_c1, k_scale);
    scale_rows = rv.ik_scale_c;
  }
  ops::scatter_nd_update_v2(kc, islots, k_q);
  ops::scatter_nd_update_v2(sc, islots, scale_rows);
}

at::Tensor Impl::indexer_select(const at::Tensor& x, const Caches& c, const LayerMetadata& md,
                                const detail::TokenViews& v, const at::Tensor& cos3, const at::Tensor& sin3,
                                const at::Tensor& q_ends, const at::Tensor& k_lens, int64_t n, bool graph,
                                sfa::TopkBuffer* topk) {
  const ImplConfig& cf = cfg_;
  const int64_t Di = cf.index_head_dim, R = cf.rope_dim;
  const GroupMetadata& ig = *md.indexer_cache;
  // 1. indexer q: RoPE on the last R dims, then rotate_activation. (2., the indexer compressor and
  // cache write, is indexer_cache_update, run before: the whole step's, under DSA-CP too.)
  ops::dense::linear_out(v.qi2, v.qa, w_.idx_wq_b);
  at::Tensor qi = v.qi;
  ops::inplace_partial_rotary_mul(qi, cos3, sin3, "interleave", {Di - R, Di});
  ops::hadamard_rotate_out(v.qi_rot, v.qi, hadamard_);
  // 3. weights (the scale folded into the projection) in the plan's dtype.
  ops::dense::linear_out(v.wts_raw, x, idx_wproj_scaled_);
  if (!v.wts.is_same(v.wts_raw)) ops::dense::copy(v.wts, v.wts_raw);
  // 4. per (token, head) query quantisation.
  ops::DynamicQuantArgs qa;
  if (cf.plan.indexer_q_dtype != KvDtype::INT8) qa.dst_type = static_cast<int64_t>(scalar_of(cf.plan.indexer_q_dtype));
  qa.input = v.qi_rot;
  auto [q_q, q_scale] = dynamic_quant_into(qa, graph, v.q_q, v.q_scale);
  if (!(graph && v.q_scale_c.is_same(v.q_scale))) {
    ops::dense::copy(v.q_scale_c, q_scale);
    q_scale = v.q_scale_c;
  }
  // 5. QLI, cmp_ratio 4.
  ops::VllmQuantLightningIndexerArgs a;
  ops::LightningIndexerArgs& b = a.quant.base;
  b.query = q_q;
  b.key = c.indexer_k;
  b.weights = v.wts;
  b.actual_seq_lengths_query = q_ends;
  b.actual_seq_lengths_key = k_lens;
  b.block_table = ig.block_table;
  b.layout_query = "TND";
  b.layout_key = "PA_BSND";
  b.sparse_count = cf.index_topk;
  b.sparse_mode = 3;
  a.quant.query_dequant_scale = q_scale;
  // The plans keep the cache's scale dtype (li_k_scale_dtype ==
  // indexer_k_scale_dtype): the cast returns the cache's tensor itself.
  a.quant.key_dequant_scale = ops::dense::cast(c.indexer_scale, scalar_of(cf.plan.li_k_scale_dtype));
  a.cmp_ratio = 4;
  // docs/design/dsa.md §3.2: the indexer group's builder made the blob (validated
  // against this layer in validate()); without one the operator runs bare.
  if (ig.qli_metadata_filled) a.metadata = ig.qli_metadata;
  if (graph) {
    const at::Tensor& dst = cf.use_index_cache ? topk->view(n) : v.sel;
    ops::vllm_quant_lightning_indexer_out(a, dst);
    return dst;
  }
  const at::Tensor sel = std::get<0>(ops::vllm_quant_lightning_indexer(a));
  return cf.use_index_cache ? topk->store(sel) : sel;
}

at::Tensor Impl::attend(const Caches& c, const LayerMetadata& md, const at::Tensor& q, const at::Tensor& cu_q,
                        const at::Tensor& seqused, const at::Tensor& sel, const at::Tensor& ori_sparse,
                        const at::Tensor& out, bool with_sinks, at::Tensor* lse) const {
  const ImplConfig& cf = cfg_;
  const GroupMetadata& common = md.common();
  const GroupMetadata& swa = *md.swa;
  ops::SparseAttnSharedKvArgs a;
  a.q = q;
  a.ori_kv = c.swa_kv;
  a.ori_block_table = swa.block_table;
  a.cu_seqlens_q = cu_q;
  a.seqused_kv = seqused;
  if (with_sinks) a.sinks = sinks_f32_;
  a.return_softmax_lse = lse != nullptr;
  if (common.sas_metadata_filled) a.metadata = common.sas_metadata;
  a.softmax_scale = 1.0 / std::sqrt(static_cast<double>(cf.head_dim));
  a.cmp_ratio = std::max<int64_t>(cf.compress_ratio, 1);
  a.ori_mask_mode = 4;
  a.ori_win_left = swa.ori_win_left;
  a.ori_win_right = swa.ori_win_right;
  a.layout_q = "TND";
  a.layout_kv = to_string(cf.plan.layout_kv);
  if (cf.plan.passes_cu_seqlens_kv_extras) {
    if (common.cu_seqlens_ori_kv.defined()) a.cu_seqlens_ori_kv = common.cu_seqlens_ori_kv;
    if (cf.compress_ratio > 1 && common.cu_seqlens_cmp_kv.defined()) a.cu_seqlens_cmp_kv = common.cu_seqlens_cmp_kv;
  }
  // DSpark's rows, or (DCP, docs/design/sparse_cp.md §12) this rank's window slots.
  if (ori_sparse.defined()) a.ori_sparse_indices = ori_sparse;
  if (cf.compress_ratio > 1) {
    a.cmp_kv = c.compress_kv;
    a.cmp_block_table = md.attention->block_table;
    a.cmp_mask_mode = 3;
    // The C4 selection; under DCP this rank's local compressed rows (C128 too).
    if (sel.defined()) a.cmp_sparse_indices = sel;
  }
  const bool kv_quant = cf.plan.sparse_attn == SparseAttnPath::KvQuantSharedKv;
  // Made only on that plan (its many optional tensors cost a construction and
  // a destruction per call otherwise).
  std::optional<ops::KvQuantSparseAttnSharedKvArgs> qa;
  if (kv_quant) {
    qa.emplace();
    qa->base = a;
    qa->kv_quant_mode = cf.plan.kv_quant_mode;
    qa->tile_size = cf.plan.tile_size;
    qa->rope_head_dim = cf.plan.rope_head_dim;
  }
  if (cf.plan.sparse_attn == SparseAttnPath::SparseFlashMla) {
    // docs/design/dsa.md §4.2: the sharedkv arguments through the adapter (seqused_kv ->
    // seqused_ori_kv, layout PA_BBND; compressed layers add the builder's
    // staged S / r and S % r). The blob is the group's sparse_flash_mla_metadata.
    // Graph mode: into `out` (docs/design/dsa.md §6).
    std::optional<ops::FlashMlaCmpLengthTensors> cmp;
    if (cf.compress_ratio > 1) {
      cmp = ops::FlashMlaCmpLengthTensors{md.attention->seqused_cmp_kv, md.attention->cmp_residual_kv};
    }
    if (out.defined()) {
      ops::sparse_flash_mla_out(ops::to_sparse_flash_mla_args(a, cmp), out);
      return out;
    }
    return std::get<0>(ops::sparse_flash_mla(ops::to_sparse_flash_mla_args(a, cmp)));
  }
  if (out.defined()) {
    if (kv_quant) {
      ops::kv_quant_sparse_attn_sharedkv_out(*qa, out);
    } else {
      ops::sparse_attn_sharedkv_out(a, out);
    }
    return out;
  }
  if (lse != nullptr) {
    AAR_CHECK_ARG(!kv_quant, "internal: the DCP partials take the npu_sparse_attn_sharedkv plan");
    auto res = ops::sparse_attn_sharedkv(a);
    *lse = std::get<1>(res);
    return std::get<0>(res);
  }
  return std::get<0>(kv_quant ? ops::kv_quant_sparse_attn_sharedkv(*qa) : ops::sparse_attn_sharedkv(a));
}

std::pair<at::Tensor, at::Tensor> Impl::dcp_key_lists(const LayerMetadata& md, const at::Tensor& sel, int64_t n,
                                                      bool graph, detail::Workspace& ws) const {
  // docs/design/sparse_cp.md §12.2 step 3: the per-row lists come from the group builds
  // (GroupMetadata::dcp_ori_indices / dcp_cmp_limit, once per step, for every row of the step); only
  // the compressed list is remapped here, into the workspace.
  const ImplConfig& cf = cfg_;
  const StepMetadata& st = *md.step;
  const DcpStepMetadata& d = st.dcp;
  const GroupMetadata& swa = *md.swa;
  AAR_CHECK_ARG(swa.dcp_ori_indices.defined() && swa.dcp_ori_indices.size(0) >= n &&
                    swa.dcp_ori_indices.size(2) == int64_t{swa.ori_win_left} + 1,
                "internal: the SWA group carries no DCP window list for ", n, " rows (built without dcp_world_size?)");
  // The window [p - win_left, p]: the positions this rank owns, as physical slots of its shard.
  const at::Tensor& ori_all = swa.dcp_ori_indices;
  DcpListViews& kv = dcp_list_views_;  // kept across calls (docs/design/sparse_cp.md §15.1)
  at::Tensor ori = kv.ori.get(ori_all, n, [&] { return first_rows(ori_all, n); });
  // The compressed rows (C4: the selection; C128: every row) below each row's limit (p + 1) / r,
  // as this rank's local indices.
  at::Tensor cmp;
  if (cf.compress_ratio > 1) {
    const GroupMetadata& ag = *md.attention;
    AAR_CHECK_ARG(ag.dcp_cmp_limit.defined() && ag.dcp_cmp_limit.size(0) >= n,
                  "internal: the compressed group carries no DCP row limits for ", n, " rows");
    const at::Tensor& limit =
        kv.limit.get(ag.dcp_cmp_limit, n, [&] { return first_rows(ag.dcp_cmp_limit, n).view({n, 1, 1}); });
    at::Tensor g;
    if (cf.compress_ratio == 4) {
      g = ops::dense::cast(sel, at::kInt);  // (n, 1, K)
    } else {
      // Eager: the step's longest request bounds every limit. A replay reads no host value of the
      // step (the captured one's max_seqlen_kv is stale): the width every position below the
      // RoPE table's rows fits (§12.5).
      const int64_t L = graph ? plan::dsa_dcp_captured_cmp_width(st.rope_cos_table.size(0), cf.compress_ratio)
                              : std::max<int64_t>(st.max_seqlen_kv / cf.compress_ratio, 1);
      const at::Tensor& cols = dcp_columns(L);
      g = kv.cols.get(cols, n, [&] { return cols.expand({n, 1, L}); });
    }
    cmp = ws.dcp_cmp(n, g.size(2));
    sparse::remap_topk_to_dcp_rank_out(cmp, g, limit, d.world_size, d.rank, d.interleave);
  }
  return {std::move(ori), std::move(cmp)};
}

void Impl::apply_sinks_after_merge(const at::Tensor& merged, const at::Tensor& mlse) const {
  // docs/design/sparse_cp.md §12.2 step 6: the sinks once, in the merged softmax: out = merged e^lse /
  // (e^lse + e^sink) = merged sigmoid(lse - sink), computed in fp32 and rounded once into merged's dtype.
  // merged (n, N, D), mlse (n, N) fp32 over the layer's N heads (overwritten).
  if (ops::dense::no_compute()) return;
  at::Tensor l = mlse;
  l.sub_(sinks_f32_).sigmoid_();
  at::Tensor m = merged;
  m.mul_(l.unsqueeze(2));
}

at::Tensor Impl::attend_dcp(const Caches& c, const LayerMetadata& md, const at::Tensor& q, const at::Tensor& sel,
                            int64_t n, bool graph, detail::Workspace& ws, const detail::TokenViews& v) const {
  // docs/design/sparse_cp.md §12. Every rank issues the same two collectives (the query gather,
  // the partials' exchange), whatever its shard holds. The intermediates live in the workspaces, so
  // a forward makes no index tensor of its own.
  const StepMetadata& st = *md.step;
  cp::Comm& comm = *cfg_.dcp_comm;
  const auto [ori, cmp] = dcp_key_lists(md, sel, n, graph, ws);
  // Every head of the group over this rank's keys, without the sinks, with the LSE.
  const cp::DcpViews& w = dcp_ws_->views(n);
  const at::Tensor qg = cp::gather_query_heads(comm, q, w.gathered_query);
  at::Tensor plse;
  const at::Tensor po = attend(c, md, qg, st.query_start_loc, st.seq_lens, cmp, ori, at::Tensor(),
                               /*with_sinks=*/false, &plse);
  // Merged into the workspace's o rows (what the inverse RoPE and o_proj read) with its LSE, through
  // the kept row views (docs/design/sparse_cp.md §15.1).
  const at::Tensor& mlse = ws.dcp_lse(n);
  cp::combine_partials(comm, w, po, plse, v.o_rows, ws.dcp_lse_rows(n));
  apply_sinks_after_merge(v.o, mlse);
  return v.o;
}

const Impl::CpDcpViews& Impl::dsa_cp_dcp_views(int64_t tpr, int64_t tk) {
  // docs/design/sparse_cp.md §14.2: one exchange of the (1, T_pad N, D) token-block view: its W head
  // blocks of tpr N "heads" are the W token slices (the exchange's buffers shared by the layers of this
  // shape and comm). The padded query and selection, the merged rows and LSE live in buffers of this
  // layer, grown to the largest slice (earlier ones kept: a captured replay may hold their addresses), and
  // every view a step takes is made once per (tpr, tk).
  const int64_t W = cfg_.dsa_cp_comm->size(), N = cfg_.num_heads, D = cfg_.head_dim, Tp = W * tpr;
  cp::DcpWorkspaceShape sh;
  sh.device = w_.wq_a.device();
  sh.q_dtype = sh.out_dtype = act_dtype_;
  sh.world = W;
  sh.heads = tpr * N;
  sh.q_dim = sh.out_dim = D;
  sh.comm = cfg_.dsa_cp_comm;
  sh.workspace_group = cfg_.workspace_group;
  if (!cpdcp_ws_ || !(cpdcp_ws_->shape() == sh)) cpdcp_ws_ = cp::DcpWorkspace::shared(sh);
  const cp::DcpViews& mw = cpdcp_ws_->views(1);
  CpDcpViews& v = cpdcp_;
  if (v.tpr == tpr && v.tk == tk && v.ws == cpdcp_ws_ && v.mw == &mw && v.generation == mw.generation) return v;
  const int64_t K = cfg_.compress_ratio == 4 ? cfg_.index_topk : 0;
  if (v.cap < tpr) {
    if (v.q_buf.defined()) v.kept.insert(v.kept.end(), {v.q_buf, v.sel_buf, v.merged_buf, v.mlse_buf});
    const int64_t cap = std::max<int64_t>(tpr, 2 * v.cap);
    const auto o = w_.wq_a.options().dtype(act_dtype_);
    v.q_buf = at::zeros({cap * N * D}, o);
    v.merged_buf = at::empty({cap * N * D}, o);
    v.mlse_buf = at::empty({cap * N}, o.dtype(at::kFloat));
    v.sel_buf = at::full({std::max<int64_t>(cap * K, 1)}, -1, o.dtype(at::kInt));
    v.cap = cap;
  }
  v.tpr = tpr;
  v.tk = tk;
  v.mw = &mw;
  v.ws = cpdcp_ws_;
  v.generation = mw.generation;
  v.mw_out = mw.partial_out;
  v.mw_lse = mw.partial_lse;
  v.q_pad = v.q_buf.narrow(0, 0, tpr * N * D).view({tpr, N, D});
  v.q_all = mw.gathered_query.view({Tp, N, D});
  v.q_all_tk = v.q_all.narrow(0, 0, tk);
  const at::Tensor part = mw.partial_out.view({Tp, N, D});
  const at::Tensor part_lse = mw.partial_lse.view({Tp, N});
  v.part_tk = part.narrow(0, 0, tk);
  v.lse_tk = part_lse.narrow(0, 0, tk);
  v.part_rest = tk < Tp ? part.narrow(0, tk, Tp - tk) : at::Tensor();
  v.lse_rest = tk < Tp ? part_lse.narrow(0, tk, Tp - tk) : at::Tensor();
  v.merged = v.merged_buf.narrow(0, 0, tpr * N * D).view({1, tpr * N, D});
  v.merged3 = v.merged.view({tpr, N, D});
  v.mlse = v.mlse_buf.narrow(0, 0, tpr * N).view({1, tpr * N});
  v.mlse2 = v.mlse.view({tpr, N});
  v.merged_rows = v.merged.view({tpr * N, D});
  v.mlse_rows = v.mlse.view({tpr * N});
  v.sel_pad = K > 0 ? v.sel_buf.narrow(0, 0, tpr * K).view({tpr, 1, K}) : at::Tensor();
  return v;
}

const at::Tensor& Impl::attend_dsa_cp_dcp(const Caches& c, const LayerMetadata& md, const at::Tensor& q,
                                          const at::Tensor& sel, int64_t tk, bool graph, detail::Workspace& ws,
                                          sfa::TopkBuffer* topk) {
  // docs/design/sparse_cp.md §14.2: every collective on dsa_cp_comm (the DCP group is the same group),
  // issued by every rank in the same order whatever its slice holds.
  const ImplConfig& cf = cfg_;
  const StepMetadata& st = *md.step;
  const DsaCpStepMetadata& sh = st.dsa_cp;
  cp::Comm& comm = *cf.dsa_cp_comm;
  const int64_t tpr = sh.tokens_per_rank, Tp = sh.num_tokens_pad, nloc = sh.num_local_tokens();
  const CpDcpViews& v = dsa_cp_dcp_views(tpr, tk);
  // 1. The slice's query rows (zeros past its real tokens: the padding rows of the buffer are zeroed once
  //    per step) gathered along the tokens: every token's query of every head, (T_pad, N, D).
  at::Tensor mine = q;
  if (nloc < tpr) {
    mine = v.q_pad;
    if (nloc > 0) ops::dense::copy(mine.narrow(0, 0, nloc), q);
    ops::dense::zero(mine.narrow(0, nloc, tpr - nloc));
  }
  comm.all_gather(mine, 0, v.q_all);
  // 2. C4: the slice's selection (the single-rank rows: the indexer reads the replicated cache with the
  //    slice's local ends and global lengths) padded with -1 rows and gathered, so every rank holds every
  //    token's rows; a skip_topk layer reads all of them from the buffer, which a use_index_cache layer
  //    fills with them (no gather of its own).
  at::Tensor sel_all;
  if (cf.compress_ratio == 4) {
    if (cf.skip_topk) {
      sel_all = topk->view(tk);
    } else {
      // A use_index_cache layer's selection is already the buffer's first rows (indexer_select stored it),
      // which the gather below overwrites: it is staged first, as a padded slice is.
      at::Tensor smine = sel;
      if (nloc < tpr || cf.use_index_cache) {
        smine = v.sel_pad;
        if (nloc > 0) ops::dense::copy(smine.narrow(0, 0, nloc), sel);
        ops::dense::fill(smine.narrow(0, nloc, tpr - nloc), -1);
      }
      const bool keep = cf.use_index_cache && Tp <= topk->max_num_tokens();
      const at::Tensor g = keep ? comm.all_gather(smine, 0, topk->view(Tp)) : comm.all_gather(smine, 0);
      sel_all = tk == Tp ? g : g.narrow(0, 0, tk);
      if (cf.use_index_cache) sel_all = topk->store(sel_all);
    }
  }
  last_topk_ = sel_all;
  // 3. Every head of every token of the step over this rank's shard (the DCP lists of every row, the
  //    global lengths and blob), without the sinks, with the LSE.
  const auto [ori, cmp] = dcp_key_lists(md, sel_all, tk, graph, ws);
  at::Tensor plse;
  const at::Tensor po = attend(c, md, v.q_all_tk, st.query_start_loc, st.seq_lens, cmp, ori, at::Tensor(),
                               /*with_sinks=*/false, &plse);
  // 4. The partials padded to T_pad (zeros, LSE -inf) and exchanged along the tokens: on the
  //    (1, T_pad N, D) view the head-block exchange of combine_partials is the token-block exchange, so
  //    this rank merges the W partials of its own slice.
  ops::dense::copy(v.part_tk, po);
  ops::dense::copy(v.lse_tk, plse.dim() == 2 ? plse : plse.view({tk, cf.num_heads}));
  if (tk < Tp) {
    ops::dense::zero(v.part_rest);
    ops::dense::fill(v.lse_rest, -std::numeric_limits<double>::infinity());
  }
  cp::combine_partials(comm, *v.mw, v.merged_rows, v.mlse_rows);  // the workspace's own partials, into rows
  // 5. The sinks once per head, on the merged softmax of the slice's rows.
  apply_sinks_after_merge(v.merged3, v.mlse2);
  return v.merged3;
}

const at::Tensor& Impl::dcp_columns(int64_t L) const {
  // 0..L-1 (1, 1, L) int32, grown on demand: C128's "every compressed row" list before its limit.
  if (!dcp_cols_.defined() || dcp_cols_.size(2) < L) {
    dcp_cols_ = at::arange(std::max<int64_t>(L, 2 * (dcp_cols_.defined() ? dcp_cols_.size(2) : 0)),
                           sinks_f32_.options().dtype(at::kInt))
                    .view({1, 1, -1});
    dcp_cols_view_ = at::Tensor();
  }
  if (!dcp_cols_view_.defined() || dcp_cols_view_.size(2) != L) dcp_cols_view_ = dcp_cols_.narrow(2, 0, L);
  return dcp_cols_view_;
}

void Impl::run(const at::Tensor& hidden, const Caches& c, const LayerMetadata& md, const at::Tensor& output,
               sfa::TopkBuffer* topk, int64_t n, bool graph, detail::Workspace& ws) {
  const ImplConfig& cf = cfg_;
  const StepMetadata& st = *md.step;
  const GroupMetadata& common = md.common();
  const int64_t T = hidden.size(0);
  const int64_t D = cf.head_dim, R = cf.rope_dim;
  const detail::TokenViews& v = ws.tokens(n);
  // The compressors emit min(n, n / r + B) rows for n rows of B requests.
  const int64_t r = cf.compress_ratio > 1 ? std::min<int64_t>(n, n / cf.compress_ratio + st.num_kernel_reqs) : 0;
  const detail::RowViews& rv = ws.rows(r);
  const StepViews& sv = step_views(md, n);
  const at::Tensor x = n == T ? hidden : hidden.narrow(0, 0, n);

  // docs/design/dsa.md §5.5: the compressed caches' writers, on the side stream with multistream
  // (issued first, so they overlap the prolog), else in the serial order below.
  detail::StreamPlan sp = stream_plan(x.device());
  auto indexer_cache = [&] { indexer_cache_update(x, c, md, rv, r, graph); };
  auto compress = [&] {
    const GroupMetadata& ag = *md.attention;
    const at::Tensor rows = run_compressor(x, w_.cmp_wkv, w_.cmp_wgate, cmp_ape_f32_, w_.cmp_norm, c.state,
                                           *md.compressor_state, ag, R, cf.compress_ratio,
                                           cf.compress_ratio == 4 ? 2 : 1, cf.eps, graph ? rv.cmp : at::Tensor());
    // As the indexer's: the slots past the compressor's rows (num_input_tokens > n) are skip rows.
    if (r > 0) {
      write_kv_rows(c.compress_kv, first_rows(ag.compressed_slots, r), rows, ag.num_valid_rows,
                    graph ? &rv.cmp_write : nullptr, ag.graph_fill_slot);
    }
  };
  if (sp.multistream()) {
    sp.fork();
    if (cf.compress_ratio == 4) sp.on_side("indexer_cache", detail::StreamPlan::kIndexerCache, indexer_cache);
    sp.on_side("compressor", detail::StreamPlan::kCompressedKv, compress);
  }

  // ---- prolog (docs/design/dsa.md §1.1; §5.4 the W8A8-dynamic projections)
  sp.on_main("prolog");
  std::optional<ops::W8A8DynamicInput> xq;
  if (w8a8_) xq = quantize_x(x, v, graph);  // one quantisation of x for wq_a and wkv
  project_q(x, xq ? &*xq : nullptr, v, graph);
  // per-head RMS without weight, fp32 maths (plan q_norm: RmsFp32 / QNormWithoutWeight, the same maths)
  ops::dense::rms_norm_out(v.q, v.q, ones_d_, cf.eps);
  at::Tensor q = v.q, kvr = v.kv;
  ops::inplace_partial_rotary_mul(q, sv.cos3, sv.sin3, "interleave", {D - R, D});
  project_kv(x, xq ? &*xq : nullptr, v.kv, graph);
  ops::dense::rms_norm_out(v.kv, v.kv, w_.kv_norm, cf.eps);
  ops::inplace_partial_rotary_mul(kvr, sv.cos, sv.sin, "interleave", {D - R, D});
  const GroupMetadata& swa = *md.swa;
  sp.on_main("swa_write");
  write_kv_rows(c.swa_kv, sv.swa_slots, v.kv, swa.num_valid_rows, graph ? &v.swa_write : nullptr,
                swa.graph_fill_slot);

  // ---- compressed caches and the C4 selection (docs/design/dsa.md §5.1)
  at::Tensor sel;
  if (cf.compress_ratio == 4) {
    // docs/design/sparse.md §6: skip_topk layers still run both compressors.
    if (sp.multistream()) {
      sp.wait(detail::StreamPlan::kIndexerCache, "wait_indexer_cache");
    } else {
      sp.on_side("indexer_cache", detail::StreamPlan::kIndexerCache, indexer_cache);
    }
    if (cf.skip_topk) {
      sp.on_main("topk_reuse");
      sel = topk->view(n);
    } else {
      sp.on_main("indexer_select");
      sel = indexer_select(x, c, md, v, sv.cos3, sv.sin3, sv.q_ends, md.indexer_cache->seq_lens, n, graph, topk);
    }
  }
  if (cf.compress_ratio > 1) {
    if (sp.multistream()) {
      sp.wait(detail::StreamPlan::kCompressedKv, "wait_compressed_kv");
    } else {
      sp.on_side("compressor", detail::StreamPlan::kCompressedKv, compress);
    }
  }
  last_topk_ = sel;

  // ---- SAS attention (docs/design/dsa.md §5.1)
  sp.on_main("attention");
  at::Tensor o = st.dcp.world_size > 1
                     ? attend_dcp(c, md, v.q, sel, n, graph, ws, v)  // docs/design/sparse_cp.md §12
                     : attend(c, md, v.q, common.query_start_loc, common.seq_lens, sel,
                              cf.compress_ratio <= 1 && swa.dspark_swa_indices.defined()
                                  ? first_rows(swa.dspark_swa_indices, n)
                                  : at::Tensor(),
                              graph ? v.o : at::Tensor());

  // Graph mode reads the o_proj's input from the workspace (run_o_proj): the DCP merge's result
  // (allocated per call, docs/design/sparse_cp.md §12.5) goes there.
  if (graph && !o.is_same(v.o)) {
    ops::dense::copy(v.o, o);
    o = v.o;
  }

  // ---- inverse RoPE and o_proj (docs/design/dsa.md §5.2)
  ops::inplace_partial_rotary_mul(o, sv.cos3, sv.neg_sin3, "interleave", {D - R, D});
  const at::Tensor out_n = n == T ? output : output.narrow(0, 0, n);
  // Graph mode: into the workspace (both o_proj kinds).
  sp.on_main("o_proj");
  run_o_proj(o, out_n, graph ? &v : nullptr);
  if (n < T) ops::dense::zero(output.narrow(0, n, T - n));
}

void Impl::write_step_caches(const at::Tensor& x, const Caches& c, const LayerMetadata& md, int64_t tk,
                             detail::Workspace& ws, detail::StreamPlan& sp, bool graph, ops::W8A8DynamicInput* xq) {
  const ImplConfig& cf = cfg_;
  const StepMetadata& st = *md.step;
  const int64_t D = cf.head_dim, R = cf.rope_dim;
  const int32_t ratio = cf.compress_ratio;
  const detail::TokenViews& vf = ws.tokens(tk);
  const int64_t r = ratio > 1 ? std::min<int64_t>(tk, tk / ratio + st.num_kernel_reqs) : 0;
  const detail::RowViews& rv = ws.rows(r);
  const StepViews& sv = step_views(md, tk);
  auto indexer_cache = [&] { indexer_cache_update(x, c, md, rv, r, /*graph=*/false); };
  auto compress = [&] {
    const GroupMetadata& ag = *md.attention;
    const at::Tensor rows = run_compressor(x, w_.cmp_wkv, w_.cmp_wgate, cmp_ape_f32_, w_.cmp_norm, c.state,
                                           *md.compressor_state, ag, R, ratio, ratio == 4 ? 2 : 1, cf.eps,
                                           at::Tensor());
    if (r > 0) {
      write_kv_rows(c.compress_kv, first_rows(ag.compressed_slots, r), rows, ag.num_valid_rows,
                    graph ? &rv.cmp_write : nullptr, ag.graph_fill_slot);
    }
  };
  // docs/design/dsa.md §5.5: with multistream the compressed caches' writers go first, to the side
  // stream (the caller joins them before its selection and attention); else the serial order below.
  if (sp.multistream()) {
    sp.fork();
    if (ratio == 4) sp.on_side("indexer_cache", detail::StreamPlan::kIndexerCache, indexer_cache);
    sp.on_side("compressor", detail::StreamPlan::kCompressedKv, compress);
  }
  sp.on_main("swa_write");
  if (w8a8_) {
    const ops::W8A8DynamicInput q = quantize_x(x, vf, graph);
    project_kv(x, &q, vf.kv, graph);
    if (xq != nullptr) *xq = q;
  } else {
    project_kv(x, nullptr, vf.kv, graph);
  }
  ops::dense::rms_norm_out(vf.kv, vf.kv, w_.kv_norm, cf.eps);
  at::Tensor kvr = vf.kv;
  ops::inplace_partial_rotary_mul(kvr, sv.cos, sv.sin, "interleave", {D - R, D});
  write_kv_rows(c.swa_kv, sv.swa_slots, vf.kv, md.swa->num_valid_rows, graph ? &vf.swa_write : nullptr,
                md.swa->graph_fill_slot);
  if (!sp.multistream()) {
    if (ratio == 4) sp.on_side("indexer_cache", detail::StreamPlan::kIndexerCache, indexer_cache);
    if (ratio > 1) sp.on_side("compressor", detail::StreamPlan::kCompressedKv, compress);
  }
}

detail::StreamPlan Impl::stream_plan(c10::Device device) {
  const bool multi = cfg_.multistream && cfg_.compress_ratio > 1;
  if (multi && !side_) side_ = std::make_unique<detail::SideStream>(device);
  return detail::StreamPlan(multi ? side_.get() : nullptr, device, cfg_.log_streams ? &stream_log_ : nullptr);
}

Impl::SliceRope Impl::slice_rope(const DsaCpStepMetadata& sh, int64_t nloc) {
  const bool ctab = cfg_.compress_ratio > 1;
  const int64_t R = cfg_.rope_dim;
  const auto rows3 = [&](::aar::detail::KeptView& k, const at::Tensor& t) -> const at::Tensor& {
    return k.get(t, nloc, [&] { return first_rows(t, nloc).view({nloc, 1, R}); });
  };
  SliceViews& v = slice_views_;
  return {rows3(v.cos3, ctab ? sh.compress_cos : sh.cos), rows3(v.sin3, ctab ? sh.compress_sin : sh.sin),
          rows3(v.neg3, ctab ? sh.compress_neg_sin : sh.neg_sin)};
}

void Impl::run_dsa_cp(const at::Tensor& hidden, const Caches& c, const LayerMetadata& md, const at::Tensor& output,
                      sfa::TopkBuffer* topk, int64_t tk, detail::Workspace& ws, bool graph) {
  // docs/design/sparse_cp.md §10. Every rank holds the whole step's hidden states, writes every
  // token's KV / compressor / indexer rows into its complete caches, and computes every head for
  // its token slice [local_start, local_end) (padding rows up to tokens_per_rank take part in the
  // collectives as zeros). Every collective below is issued by every rank in the same order,
  // whatever its slice holds.
  const ImplConfig& cf = cfg_;
  const StepMetadata& st = *md.step;
  const DsaCpStepMetadata& sh = st.dsa_cp;
  cp::Comm& comm = *cf.dsa_cp_comm;
  const int64_t W = sh.world_size, tpr = sh.tokens_per_rank, nloc = sh.num_local_tokens();
  const int64_t T = hidden.size(0), N = cf.num_heads, D = cf.head_dim, R = cf.rope_dim;
  const int32_t ratio = cf.compress_ratio;
  const at::Tensor x = tk == T ? hidden : hidden.narrow(0, 0, tk);

  // ---- 1. the whole step: the SWA KV, the compressors and the indexer cache (the step's RoPE
  // rows, global lengths), as without DSA-CP; with multistream the compressed caches' writers on the
  // side stream (docs/design/dsa.md §5.5), joined below before the selection and the attention read
  // them, so the collectives of step 3 (main stream) come after them too. A W8A8 layer keeps x's
  // per-token quantisation: the slice's query projection reads its rows.
  detail::StreamPlan sp = stream_plan(hidden.device());
  ops::W8A8DynamicInput xq;
  write_step_caches(x, c, md, tk, ws, sp, graph, w8a8_ ? &xq : nullptr);

  // ---- 2. the slice: every head's query, the selection and SAS attention with the local lengths.
  // The slice's rows (tpr, N D), zeros past its real tokens. The decode road keeps them in the
  // all-to-all's layout, head blocks (W, tpr, N D / W), written through the (tpr, W, N D / W) view:
  // no reorder copy before the exchange, and only the padding rows are zeroed.
  const bool decode_state =
      st.attn_state == plan::AttentionState::DecodeOnly || st.attn_state == plan::AttentionState::SpecDecoding;
  const bool full_road = !decode_state && cf.dsa_cp_full_o_proj_prefill;
  const int64_t C = N * D / W;
  const sparse::DsaCpRows road = cpws_->road_rows(tpr, nloc, full_road);  // (tpr, W, C) rows
  const bool dcp = st.dcp.world_size > 1;  // DSA-CP x DCP (docs/design/sparse_cp.md §14)
  at::Tensor q_slice, sel_slice;
  if (nloc > 0) {
    const at::Tensor xl = nloc == T ? hidden : ::aar::detail::leading_rows(hidden, sh.local_start, nloc);
    const detail::TokenViews& v = ws.tokens(nloc);
    // The query rotates with the rows of the layer's table (compressed layers: compress_rope_theta).
    const auto& [cos3, sin3, neg3] = slice_rope(sh, nloc);
    sp.on_main("prolog");
    // W8A8: the slice's rows of the step's quantised x (per token: the codes of a row are the row's own).
    const ops::W8A8DynamicInput xql{w8a8_ ? xq.q.narrow(0, sh.local_start, nloc) : at::Tensor(),
                                    w8a8_ ? xq.scale.narrow(0, sh.local_start, nloc) : at::Tensor()};
    project_q(xl, w8a8_ ? &xql : nullptr, v, /*graph=*/false);
    ops::dense::rms_norm_out(v.q, v.q, ones_d_, cf.eps);
    at::Tensor q = v.q;
    ops::inplace_partial_rotary_mul(q, cos3, sin3, "interleave", {D - R, D});
    at::Tensor sel;
    if (ratio == 4) {
      sp.wait(detail::StreamPlan::kIndexerCache, "wait_indexer_cache");
      // A layer without its own selection reads the buffer's rows of the slice (every layer of a
      // step sees the same slice).
      sp.on_main(cf.skip_topk ? "topk_reuse" : "indexer_select");
      sel = cf.skip_topk ? topk->view(nloc)
                         : indexer_select(xl, c, md, v, cos3, sin3, sh.q_ends, sh.seq_lens, nloc, /*graph=*/false,
                                          topk);
    }
    last_topk_ = sel;
    if (ratio > 1) sp.wait(detail::StreamPlan::kCompressedKv, "wait_compressed_kv");
    sp.on_main("attention");
    if (dcp) {
      // DSA-CP x DCP (docs/design/sparse_cp.md §14): the slice's query and selection go to every rank; the
      // attention of every row runs below, on every rank.
      q_slice = v.q;
      sel_slice = sel;
    } else {
      // The builder's local blob and cu_seqlens tensors (docs/design/sparse_cp.md §10.1).
      at::Tensor o = attend(c, md, v.q, sh.query_start_loc, sh.seq_lens, sel, at::Tensor(), at::Tensor());
      ops::inplace_partial_rotary_mul(o, cos3, neg3, "interleave", {D - R, D});
      ops::dense::copy(road.real, o.view({nloc, W, C}));
    }
  } else {
    // An empty slice reads no cache, but the road's collectives still follow the side stream's writes.
    if (ratio == 4) sp.wait(detail::StreamPlan::kIndexerCache, "wait_indexer_cache");
    if (ratio > 1) sp.wait(detail::StreamPlan::kCompressedKv, "wait_compressed_kv");
    last_topk_ = ratio == 4 ? at::empty({0, 1, cf.index_topk}, hidden.options().dtype(at::kInt)) : at::Tensor();
  }
  if (dcp) {
    // docs/design/sparse_cp.md §14.2: the query and selection gathers, every row over this rank's shard,
    // the partials' token-block exchange and merge, the sinks; then the slice's rows as without DCP.
    sp.on_main("dcp_attention");
    const at::Tensor& m = attend_dsa_cp_dcp(c, md, q_slice, sel_slice, tk, graph, ws, topk);
    if (nloc > 0) {
      const auto& [cos3, sin3, neg3] = slice_rope(sh, nloc);
      SliceViews& kv = slice_views_;
      at::Tensor o = kv.merged.get(m, nloc, [&] { return first_rows(m, nloc); });
      const at::Tensor& o_road = kv.merged_road.get(o, nloc, [&] { return o.view({nloc, W, C}); });
      ops::inplace_partial_rotary_mul(o, cos3, neg3, "interleave", {D - R, D});
      ops::dense::copy(road.real, o_road);
    }
  }

  // ---- 3. back to the whole step's tokens.
  // The full o_proj (wo_a and wo_b switched in under one guard) or this rank's groups [r G/W,
  // (r+1) G/W) with the partial sums reduced (sparse/dsa_cp_road.h); rows past the requests' tokens
  // are zeros, as without DSA-CP.
  sp.on_main("o_proj_road");
  sparse::dsa_cp_road_back(
      comm, road, oproj_full_.get(), [&](const at::Tensor& x) { return bmm_o_proj(x, cf.o_groups); },
      [&](const at::Tensor& x, const at::Tensor& out) { return bmm_o_proj(x, cf.o_groups / W, out); }, output, tk);
}

ops::W8A8DynamicInput Impl::quantize_x(const at::Tensor& x, const detail::TokenViews& v, bool graph) const {
  // docs/design/dsa.md §6: graph mode quantises into the workspace's stable rows.
  return graph ? ops::quantize_per_token_out(x, v.x_q, v.x_scale) : ops::quantize_per_token(x);
}

void Impl::project_q(const at::Tensor& x, const ops::W8A8DynamicInput* xq, const detail::TokenViews& v,
                     bool graph) const {
  if (!w8a8_) {
    ops::dense::linear_out(v.qa, x, w_.wq_a);
    ops::dense::rms_norm_out(v.qa, v.qa, w_.q_norm, cfg_.eps);  // qr
    ops::dense::linear_out(v.q2, v.qa, w_.wq_b);
    return;
  }
  // docs/design/dsa.md §5.4: x quantised per token (xq, shared with wkv) for wq_a; qr after its RMSNorm
  // quantised per token for wq_b. A layer whose indexer reads the float qr (C4 with its own selection)
  // runs the norm, then npu_dynamic_quant, and keeps qr in v.qa; every other layer needs only qr's codes:
  // upstream's fused npu_rms_norm_dynamic_quant (the normed row quantised before any rounding to the
  // activation dtype).
  AAR_CHECK_ARG(xq != nullptr && xq->q.size(0) == x.size(0), "internal: the W8A8 query projection needs x's ",
                x.size(0), " rows quantised");
  if (!(cfg_.compress_ratio == 4 && !cfg_.skip_topk)) {
    ops::RmsNormDynamicQuantArgs n;
    n.gamma = w_.q_norm;
    n.epsilon = cfg_.eps;
    if (graph) {
      ops::w8a8_dynamic_matmul_out(*xq, wq_a_t_, w_.wq_a_scale, v.qa);
      n.x = v.qa;
      ops::w8a8_dynamic_matmul_out(ops::rms_norm_dynamic_quant_out(n, v.qr_q, v.qr_scale), wq_b_t_, w_.wq_b_scale,
                                   v.q2);
      return;
    }
    n.x = ops::w8a8_dynamic_matmul(*xq, wq_a_t_, w_.wq_a_scale, act_dtype_);
    ops::dense::copy(v.q2, ops::w8a8_dynamic_matmul(ops::rms_norm_dynamic_quant(n), wq_b_t_, w_.wq_b_scale,
                                                    act_dtype_));
    return;
  }
  if (graph) {
    // docs/design/dsa.md §6: the quantised activations and the products in the workspace.
    ops::w8a8_dynamic_matmul_out(*xq, wq_a_t_, w_.wq_a_scale, v.qa);
    ops::dense::rms_norm_out(v.qa, v.qa, w_.q_norm, cfg_.eps);  // qr
    ops::w8a8_dynamic_matmul_out(ops::quantize_per_token_out(v.qa, v.qr_q, v.qr_scale), wq_b_t_, w_.wq_b_scale,
                                 v.q2);
    return;
  }
  ops::dense::copy(v.qa, ops::w8a8_dynamic_matmul(*xq, wq_a_t_, w_.wq_a_scale, act_dtype_));
  ops::dense::rms_norm_out(v.qa, v.qa, w_.q_norm, cfg_.eps);  // qr
  ops::dense::copy(v.q2, ops::w8a8_dynamic_matmul(ops::quantize_per_token(v.qa), wq_b_t_, w_.wq_b_scale, act_dtype_));
}

void Impl::project_kv(const at::Tensor& x, const ops::W8A8DynamicInput* xq, const at::Tensor& kv, bool graph) const {
  if (!w8a8_) {
    ops::dense::linear_out(kv, x, w_.wkv);
    return;
  }
  AAR_CHECK_ARG(xq != nullptr && xq->q.size(0) == x.size(0), "internal: the W8A8 kv projection needs x's ",
                x.size(0), " rows quantised");
  if (graph) {
    ops::w8a8_dynamic_matmul_out(*xq, wkv_t_, w_.wkv_scale, kv);
    return;
  }
  ops::dense::copy(kv, ops::w8a8_dynamic_matmul(*xq, wkv_t_, w_.wkv_scale, act_dtype_));
}

at::Tensor Impl::bmm_o_proj(const at::Tensor& o, int64_t groups, const at::Tensor& out) const {
  static constexpr int64_t kPerm102[] = {1, 0, 2};
  const int64_t n = o.size(0), k = cfg_.num_heads * cfg_.head_dim / cfg_.o_groups;
  // (n, groups, k): kept across calls when o is (the DSA-CP road's rows are a workspace buffer).
  const at::Tensor& og = o_proj_in_.get(o, n * groups, [&] { return o.view({n, groups, k}); });
  const at::Tensor yg = ops::transpose_batchmatmul(og, w_.wo_a, c10::IntArrayRef(kPerm102), std::nullopt,
                                                   c10::IntArrayRef(kPerm102));
  const std::array<int64_t, 2> y2{n, groups * cfg_.o_lora_rank};
  const at::Tensor y = yg.is_contiguous() ? yg.view(y2) : yg.reshape(y2);
  if (!out.defined()) return ops::dense::linear(y, w_.wo_b);
  ops::dense::linear_out(out, y, w_.wo_b);  // into the caller's (n, hidden) rows
  return out;
}

namespace {

// What a captured layer reads at replay, by value: the caller's metadata
// objects may be gone by then. The tensors are views of the builders'
// persistent buffers (refilled in place by every later build of the same
// size), the caches and the workspace.
struct CapturedLayer {
  StepMetadata step;
  GroupMetadata swa, attention, compressor_state, indexer_cache, indexer_state;
  LayerMetadata md;
  at::Tensor hidden, output;
  std::shared_ptr<detail::Workspace> ws;
  int64_t bucket = 0, num_reqs = 0;
  at::Tensor swa_block_table;  // what an update's step must still sit at
};

}  // namespace

void Impl::capture(graph::GraphParams& g, const at::Tensor& hidden, const Caches& c, const LayerMetadata& md,
                   const at::Tensor& output, sfa::TopkBuffer* topk) {
  const ImplConfig& cf = cfg_;
  const StepMetadata& st = *md.step;
  const int64_t n = g.capturing_bucket();
  // DSA PCP (docs/design/sparse_cp.md §13.4): a decode-only step is replicated on every rank and captured as
  // without PCP (the single-rank road, no collective); a step with prefills splits its rows over the ranks
  // behind a hidden-state gather, which is not captured.
  if (st.pcp_split()) {
    throw_not_supported("DSA graph capture under PCP (pcp_world_size=", st.pcp.world_size, ") of a step with ",
                        st.plan.split.num_prefills, " prefill request(s): its rows are split over the PCP ranks "
                        "behind a hidden-state all-gather, which runs eagerly; decode-only steps are captured "
                        "(docs/design/sparse_cp.md §13.4)");
  }
  // Bucket and state checks, before anything is recorded or written.
  if (st.attn_state != plan::AttentionState::DecodeOnly && st.attn_state != plan::AttentionState::SpecDecoding) {
    throw_not_supported("DSA graph capture takes DecodeOnly and SpecDecoding steps (docs/design/dsa.md §3.1: "
                        "StepBuilder::build_for_graph_capture), got attention state ",
                        plan::to_string(st.attn_state));
  }
  if (st.has_prefill()) {
    throw_not_supported("DSA graph capture takes decode-only steps, got ", st.plan.split.num_prefills,
                        " prefill request(s)");
  }
  AAR_CHECK_ARG(hidden.size(0) == n && st.num_input_tokens == n && st.num_kernel_tokens == n,
                "DSA graph capture of bucket ", n, " needs hidden of ", n, " rows and a step of ", n,
                " tokens in requests (num_input_tokens = query_start_loc[B] = ", n, "; got hidden ", hidden.size(0),
                " rows, num_input_tokens=", st.num_input_tokens, ", query_start_loc[B]=", st.num_kernel_tokens,
                "): pad the batch to the bucket with dummy requests of decode length (seq_len >= their tokens)");
  if (cf.plan.kv_scatter == KvScatterKind::KvCompressEpilog && act_dtype_ != at::kBFloat16) {
    throw_not_supported("DSA graph capture of the kv_compress_epilog plan needs bfloat16 weights (the epilog takes "
                        "bf16 rows; a ", act_dtype_, " layer would cast them at a fresh address)");
  }
  if (o_proj_ == OProjKind::MxFp8QuantBmm && act_dtype_ != at::kBFloat16) {
    throw_not_supported("DSA graph capture with the MX-fp8 o_proj needs bfloat16 weights (the quantised bmm returns "
                        "bf16 rows; a ", act_dtype_, " layer would cast them at a fresh address)");
  }
  if (cf.plan.kv_scatter == KvScatterKind::ScatterNdUpdateInplace) {
    // docs/design/dsa.md §6: the full-width in-place write sends skip rows to the group's fill slot.
    const auto need_fill = [](const GroupMetadata* g, const char* name) {
      AAR_CHECK_ARG(g == nullptr || g->graph_fill_slot.defined(), "metadata.", name, " has no graph_fill_slot: "
                    "graph capture on the A5 + bfloat16 plan needs its GroupBuilder built with the same plan");
    };
    need_fill(md.swa, "swa");
    need_fill(md.attention, "attention");
  }
  if (cf.compress_ratio == 4 && scalar_of(cf.plan.li_k_scale_dtype) != scalar_of(cf.plan.indexer_k_scale_dtype)) {
    throw_not_supported("DSA graph capture: plan li_k_scale_dtype differs from indexer_k_scale_dtype (the "
                        "indexer's key scales would be cast at a fresh address)");
  }
  if (cf.skip_topk || cf.use_index_cache) {
    AAR_CHECK_ARG(topk->max_num_tokens() >= n, "topk_buffer has ", topk->max_num_tokens(),
                  " rows; the captured bucket ", n, " needs as many");
  }
  if (st.dcp.world_size > 1) {
    // DSA DCP (docs/design/sparse_cp.md §12.5). The builders and the constructor refuse these
    // already; a capture names them again before anything is recorded, as it fixes what a replay runs.
    // Under DSA-CP x DCP the replay runs the DSA-CP road with the DCP attention (§14.3).
    if (md.swa->dspark_width > 0) {
      throw_not_supported("DSA graph capture under DCP (dcp_world_size=", st.dcp.world_size, ") of a DSpark SWA "
                          "group (dspark_width=", md.swa->dspark_width, "): DSpark under DSA DCP is not "
                          "implemented (docs/design/sparse_cp.md §12.3)");
    }
    if (cf.plan.sparse_attn != SparseAttnPath::SharedKv) {
      throw_not_supported("DSA graph capture under DCP (dcp_world_size=", st.dcp.world_size, ") on the ",
                          cf.plan.sparse_attn_op, " plan: DSA DCP is built for the A2/A3 npu_sparse_attn_sharedkv "
                          "plan only, the A5 plans are not (docs/design/sparse_cp.md §12.3)");
    }
    AAR_CHECK_ARG(st.rope_cos_table.defined() && st.rope_cos_table.size(0) >= 1, "DSA graph capture under DCP "
                  "needs the step's RoPE table (its rows bound the C128 list width, docs/design/sparse_cp.md §12.5)");
  }
  // docs/design/dsa.md §6: with multistream the side stream and its events are the layer's from here on; the
  // captured fork / join (events recorded and waited inside the device graph) replays with the kernels.
  if (cf.multistream && cf.compress_ratio > 1 && !side_) side_ = std::make_unique<detail::SideStream>(hidden.device());
  auto cl = std::make_shared<CapturedLayer>();
  cl->step = st;
  cl->md = md;
  cl->md.step = &cl->step;
  auto keep = [](const GroupMetadata* src, GroupMetadata& dst) -> const GroupMetadata* {
    if (src == nullptr) return nullptr;
    dst = *src;
    return &dst;
  };
  cl->md.swa = keep(md.swa, cl->swa);
  cl->md.attention = keep(md.attention, cl->attention);
  cl->md.compressor_state = keep(md.compressor_state, cl->compressor_state);
  cl->md.indexer_cache = keep(md.indexer_cache, cl->indexer_cache);
  cl->md.indexer_state = keep(md.indexer_state, cl->indexer_state);
  cl->hidden = hidden;
  cl->output = output;
  cl->ws = ws_;
  cl->bucket = n;
  cl->num_reqs = st.num_kernel_reqs;
  cl->swa_block_table = md.swa->block_table;
  // The workspace's views for the bucket exist from here on (a replay makes no tensor for them).
  ws_->tokens(n);
  // Every operator of the layer reads and writes tensors at stable addresses
  // (the builders' buffers, the caches, the workspace, the top-k buffer) and
  // no host list: the device graph captures them as they are and an update
  // has nothing to re-issue; the CPU recording provider replays the closure.
  // DSA-CP (docs/design/sparse_cp.md §10): the replay runs the decode road, its collectives
  // issued inside the replayed step (every rank replays in the same order); its host values
  // (tpr, the slice) follow from the bucket, its device lengths and RoPE rows are the step
  // builder's stable views, and its intermediates past the workspace are allocated per call (on
  // the device, inside a capture, from the graph's private pool, as SFA's DSA-CP decode road).
  // DCP (docs/design/sparse_cp.md §12.5) likewise: the replay runs the layer's DCP attention, its
  // query gather and partials' all-to-all inside the replayed step; its index lists and the
  // merge's tensors are made per replay from the step builder's stable views (no host value of
  // the step: C128's list width comes from the RoPE table), the result copied into the workspace.
  const bool dsa_cp = st.dsa_cp.world_size > 1;
  auto run_layer = [this, cl, c, topk, dsa_cp]() {
    if (dsa_cp) {
      run_dsa_cp(cl->hidden, c, cl->md, cl->output, topk, cl->bucket, *cl->ws, /*graph=*/true);
    } else {
      run(cl->hidden, c, cl->md, cl->output, topk, cl->bucket, /*graph=*/true, *cl->ws);
    }
  };
  // At each update: the step must fit what the layer was captured with.
  auto fits = [cl, layer = cf.layer_index](const graph::StepParams& sp, int64_t bucket) {
    const at::Tensor& bt = cl->swa_block_table;
    // The captured step takes decodes only (a PCP step with prefills would also split its rows over the
    // ranks, docs/design/sparse_cp.md §13.4): refused before any replay.
    if (const StepMetadata* s = sp.backend_metadata_as<StepMetadata>(); s != nullptr && s->has_prefill()) {
      throw_not_supported("DSA layer ", layer, ": graph bucket ", bucket, " was captured for a decode-only step; ",
                          "the step has ", s->plan.split.num_prefills, " prefill request(s)",
                          s->pcp.world_size > 1 ? " (under PCP its rows are split over the ranks: run it eagerly)"
                                                : " (run it eagerly)");
    }
    AAR_CHECK_ARG(sp.num_input_tokens == cl->bucket && sp.num_kernel_tokens == cl->bucket &&
                      sp.num_reqs == cl->num_reqs,
                  "DSA layer ", layer, ": graph bucket ", bucket, " was captured for ", cl->bucket, " tokens of ",
                  cl->num_reqs, " requests (dummy requests included), but the step has ", sp.num_input_tokens,
                  " tokens (", sp.num_kernel_tokens, " in requests) of ", sp.num_reqs, " requests: pad it to ",
                  cl->num_reqs,
                  " requests holding all ", cl->bucket, " tokens (num_input_tokens=", cl->bucket, ")");
    AAR_CHECK_ARG(sp.stamp.live == cl->swa.stamp.live && sp.block_tables.defined() &&
                      sp.block_tables.data_ptr() == bt.data_ptr() && sp.block_tables.sizes() == bt.sizes() &&
                      sp.block_tables.strides() == bt.strides(),
                  "DSA layer ", layer, ": the step's SWA metadata is not at the addresses graph bucket ", bucket,
                  " was captured with (another GroupBuilder, or a block table of another width: captured ",
                  bt.sizes(), ", got ", sp.block_tables.defined() ? sp.block_tables.sizes() : c10::IntArrayRef{},
                  ")");
  };
  g.capture_call(std::make_unique<graph::ClosureCall>(cf.layer_index, cf.kv_cache_group, std::move(run_layer), std::move(fits)));
}

const at::Tensor& Impl::forward(const at::Tensor& hidden, const std::vector<at::Tensor>& kv,
                                const LayerMetadata* md_ptr, const at::Tensor& output, sfa::TopkBuffer* topk) {
  // Shared workspaces used below are held for this forward (one thread at a time).
  graph::ForwardScope exclusive_scope;
  if (md_ptr == nullptr) {
    graph::refuse_if_capturing("a DSA forward without metadata (profiling run)");
    last_topk_ = at::Tensor();
    return internal::zero_profiling_output(output, hidden, "hidden");
  }
  const LayerMetadata& md = *md_ptr;
  const Caches c = validate(hidden, kv, md, output, topk);
  const KvHookScope<LayerMetadata> kv_scope(kv_hooks, kv, md.step->num_kernel_tokens > 0, md, "dsa");
  const aar::detail::InferenceScope inference;
  if (graph::GraphParams* g = graph::GraphParams::current()) {
    graph::note_layer_life(life_, "dsa.Impl", cfg_.layer_index);  // the recorded closure calls this layer
    capture(*g, hidden, c, md, output, topk);
    return output;
  }
  const StepMetadata& st = *md.step;
  // Every token in a request (a padding request's too); rows past them are zeros.
  const int64_t tk = st.num_kernel_tokens;
  if (tk == 0) {
    output.zero_();
    return output;
  }
  if (st.pcp_split()) {
    // docs/design/sparse_cp.md §13: a step with prefills (the same on every rank: every rank gathers). A
    // step without is replicated (§13.4): the single-rank road below, no collective.
    detail::Workspace local(ws_->shape());
    run_pcp(hidden, c, md, output, topk, local);
  } else if (st.dsa_cp.world_size > 1) {
    // tk is the step's (rank-independent): every rank runs the same collectives or none (tk 0).
    if (st.has_prefill()) {
      detail::Workspace local(ws_->shape());
      run_dsa_cp(hidden, c, md, output, topk, tk, local);
    } else {
      run_dsa_cp(hidden, c, md, output, topk, tk, *ws_);
    }
  } else if (st.has_prefill()) {
    // Prefill batches may be long: their intermediates are allocated for the
    // call, so the shared workspace stays sized for decode batches.
    detail::Workspace local(ws_->shape());
    run(hidden, c, md, output, topk, tk, /*graph=*/false, local);
  } else {
    run(hidden, c, md, output, topk, tk, /*graph=*/false, *ws_);
  }
  return output;
}

void Impl::run_o_proj(const at::Tensor& o, const at::Tensor& out, const detail::TokenViews* ws) {
  const ImplConfig& cf = cfg_;
  const int64_t tk = o.size(0), G = cf.o_groups, k = cf.num_heads * cf.head_dim / G;
  static constexpr int64_t kPerm102[] = {1, 0, 2};
  at::Tensor y;
  if (o_proj_ == OProjKind::MxFp8QuantBmm) {
    // A5, MX-fp8 checkpoint: quantise the grouped view per 32 values, then the
    // quantised bmm with the fp8 wo_a (upstream's call, impl.h).
    static constexpr int64_t kPerm012[] = {0, 1, 2};
    static constexpr int64_t kGroups[] = {0, 0, 32};
    ops::DynamicMxQuantArgs q;
    q.input = o.view({tk, G, k});
    q.dst_type = static_cast<int64_t>(at::kFloat8_e4m3fn);
    ops::TransposeQuantBatchMatmulArgs b;
    b.x2 = w_.wo_a;
    b.dtype = static_cast<int64_t>(at::kBFloat16);
    b.x2_scale = w_.wo_a_scale;
    b.group_sizes = c10::IntArrayRef(kGroups);
    b.perm_x1 = c10::IntArrayRef(kPerm102);
    b.perm_x2 = c10::IntArrayRef(kPerm012);
    b.perm_y = c10::IntArrayRef(kPerm102);
    if (ws != nullptr) {
      // Graph mode (docs/design/dsa.md §6): the quantised input and its scales, then the product,
      // in the workspace's stable rows (the bf16 result is the layer's dtype: capture() checks).
      ops::dynamic_mx_quant_out(q, ws->o8, ws->o_mxs);
      b.x1 = ws->o8;
      b.x1_scale = ws->o_mxs_e8m0;
      ops::transpose_quant_batchmatmul_out(b, ws->y);
      ops::dense::linear_out(out, ws->y2, w_.wo_b);
      return;
    }
    const auto [o8, o_scale] = ops::dynamic_mx_quant(q);
    b.x1 = o8;
    b.x1_scale = o_scale.view(at::kFloat8_e8m0fnu);
    y = ops::dense::cast(ops::transpose_quant_batchmatmul(b), w_.wo_b.scalar_type());
  } else if (ws != nullptr) {
    // grouped o_proj into the workspace's stable rows (graph mode), views made once per size
    ops::transpose_batchmatmul_out(ws->o_groups, w_.wo_a, c10::IntArrayRef(kPerm102), std::nullopt,
                                   c10::IntArrayRef(kPerm102), ws->y);
    ops::dense::linear_out(out, ws->y2, w_.wo_b);
    return;
  } else {
    // grouped o_proj: (tk, G, in) -> per group @ wo_a[g] -> (tk, G, o_lora), the transpose-bmm
    y = ops::transpose_batchmatmul(o.view({tk, G, k}), w_.wo_a, c10::IntArrayRef(kPerm102), std::nullopt,
                                   c10::IntArrayRef(kPerm102));
  }
  // A contiguous result (the operator's own) takes the view directly: reshape
  // would dispatch twice (reshape, then the same view).
  const std::array<int64_t, 2> y2{tk, G * cf.o_lora_rank};
  ops::dense::linear_out(out, y.is_contiguous() ? y.view(y2) : y.reshape(y2), w_.wo_b);
}

graph::StepParams graph_step_params(const LayerMetadata& md) {
  AAR_CHECK_ARG(md.step != nullptr && md.swa != nullptr, "graph_step_params: the layer metadata needs its step and "
                "swa group");
  const StepMetadata& st = *md.step;
  graph::StepParams sp;
  sp.block_tables = md.swa->block_table;
  sp.seq_lens = st.seq_lens;
  sp.num_reqs = st.num_kernel_reqs;
  sp.num_real_reqs = st.num_reqs;
  sp.num_kernel_tokens = st.num_kernel_tokens;
  sp.num_input_tokens = st.num_input_tokens;
  sp.stamp = md.swa->stamp;
  sp.set_backend_metadata(st);  // a captured layer's update refuses a step with prefills
  return sp;
}

}  // namespace aar::dsa
