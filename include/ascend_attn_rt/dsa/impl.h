// Per-layer DeepSeek-V4 ("DSA") attention forward (spec sparse.md 1.6, 6.3,
// 6.4, 6.8): the layer of AscendDSAImpl, in its serial order.
//
//   prolog      qr = RMSNorm(x Wq_a) * q_norm; q = qr Wq_b viewed (T, N, D),
//               per-head RMS without weight (fp32 maths), interleave RoPE on
//               q[..., D-R:D] (inplace_partial_rotary_mul); kv = RMSNorm(x Wkv)
//               * kv_norm, RoPE on kv[D-R:D]; kv written into the SWA cache at
//               the SWA group's slots with the plan's scatter kind.
//   C128        compressor (coff 1) over the C128 state cache, the compressed
//               rows scattered at the attention group's compressed-row slots.
//   C4          indexer q (qr Widx_q_b, RoPE on the last R dims, Hadamard
//               rotation), indexer compressor (coff 2, width Di) over the
//               indexer state, Hadamard, the indexer cache write (plan:
//               npu_dynamic_quant int8 + fp16 scale scattered on A2/A3, the
//               indexer_compress_epilog_v2 on A5), weights (x Wproj) * Di^-0.5
//               * n_idx^-0.5 in the plan's li_weights_dtype, top-k through
//               _C_ascend::npu_vllm_quant_lightning_indexer (cmp_ratio 4,
//               sparse_mode 3), then the main compressor (coff 2) and its
//               scatter.
//   attention   the plan's SAS operator with sinks over the SWA cache (window
//               of the SWA group) and the compressed cache (C128: dense, C4:
//               the top-k), softmax scale D^-0.5.
//   output      inverse RoPE (-sin) of the output's rope slice, o_proj: the
//               output viewed (T, G, N D / G) times wo_a (G, N D / G, o_lora)
//               per group (batched), then wo_b; on the MX-fp8 o_proj (below)
//               the view is MX-quantised (npu_dynamic_mx_quant, fp8 e4m3,
//               blocks of 32) and multiplied with the fp8 wo_a and its e8m0
//               scales by npu_transpose_quant_batchmatmul (bf16 result).
//
// The AttnKvPlan (dsa/plan/dsa_kv_plan.h) decides everything device-dependent; this
// file reads its fields, never the device kind.
//
// Decisions where the spec is silent:
//  - Dims are the layer's (ImplConfig): the DSV4 numbers (D 512, R 64, 64 x 128
//    indexer) are not imposed, so small layers test on the CPU. The fp8 plans
//    (640-byte rows) need D = 512, R = 64 (Fp8KvRowLayout). Caches of the
//    model's dims: dsa_cache_spec(kind, cache_block_size, plan, dims) and
//    dsa_kv_cache_shape (dsa/plan/dsa_backend_facts.h), or GroupBuilder::cache_spec().
//  - The window is the model's (the StepBuilder's ModelSettings, carried by
//    GroupMetadata::window); ImplConfig::window 0 takes it, any other value is
//    checked against it before anything is written (InvalidArgument naming
//    window and both values).
//  - Every cache of the tuple has at least its group's num_blocks pages
//    (GroupMetadata::num_blocks), checked before any write (InvalidArgument
//    naming kv_cache[i] (name), its blocks and the group's).
//  - On plans with plain rows the attention caches' dtype is the weights' dtype
//    (the plan's non_a5 dtype is the model dtype; float32 weights are accepted
//    for CPU reference runs, where the caches are float32 too).
//  - Rows past the step's real tokens (query_start_loc[B] .. T, graph padding)
//    are not attended: their output rows are written as zeros (o_proj(0) = 0).
//  - Compressed-row slots and RoPE rows: compressor_metadata's outputs, which
//    the compressed groups' builders make once per build from the group's
//    logical block table and physical storage block size (spec 6.5: "the
//    compressor metadata op generates slots on device") into stable buffers
//    (GroupMetadata::compressed_cos / compressed_sin / compressed_slots).
//  - QLI metadata: the indexer-cache group's blob, which its builder fills
//    (dsa/builder.h; spec 6.5 step 3) in the group's address-stable buffer;
//    the layer checks the blob's index_n_heads / index_head_dim / index_topk
//    against its own (InvalidArgument naming them). A group built without
//    the blob (index_n_heads = 0) runs the operator without metadata, as SAS.
//  - DSpark (spec 6.6, 6.8 ratio <= 1): when the SWA group carries
//    dspark_swa_indices (non-causal drafting, no prefill in the step), the SAS
//    call gets ori_sparse_indices = its first num_actual_tokens rows and the
//    group's window (ori_win_left = W + num_spec - 1); tested end to end on
//    main and draft lanes (tests/python/test_dsa.py).
//  - SAS metadata: the common group's blob when the builder filled it; else the
//    operator runs without one (the CPU twin ignores it).
//  - skip_topk layers read topk_buffer->view(T) instead of running the indexer
//    query / weights / QLI, but still run both compressors and write the
//    indexer cache (spec 1.6.2 step 6: "the compressors still run"), so a later
//    layer of theirs that computes top-k finds its keys; use_index_cache layers
//    (ratio 4 with their own top-k) store their selection into it.
//  - Graph capture (DecodeOnly and SpecDecoding buckets): while a capture is
//    open (graph::GraphParams::current()) forward validates everything, then
//    records the layer as one Prepare call (as sfa::Impl) and runs nothing;
//    the device graph captures its kernels, the CPU recording provider
//    replays the closure. Refused before anything is recorded or written:
//    another attention state (NotSupported naming it), a step with prefills,
//    a step whose rows are not all in requests or hidden / num_input_tokens
//    other than the bucket (InvalidArgument naming the bucket), the
//    plans whose writes or o_proj take per-step host sizes or fresh results
//    (the A5 + BF16 plan's npu_scatter_nd_update_, see below; the MX-fp8
//    o_proj, whose quantised operands have no out-variants here), the
//    kv_compress_epilog plan with non-bf16 weights and li_k_scale_dtype !=
//    indexer_k_scale_dtype (both would cast at fresh addresses; neither
//    occurs in the spec's plans), a top-k buffer shorter than the bucket.
//    The captured layer runs every operator over all T = bucket rows and
//    reads only stable addresses: the builders' buffers (lengths, tables,
//    slots, RoPE and -sin rows, compressor_metadata rows, SAS / QLI blobs),
//    the caches, the top-k buffer and the shared workspace, where every
//    operator result lands (out-variants, ops/out_variants.h: the operators
//    without an out schema are called and their result copied in). No host
//    list is baked in, so an update re-issues nothing for it.
//    Replayed steps: every bucket row belongs to a request (the SAS and QLI
//    operators take T = query_start_loc[B]; their CPU twins check it), so a
//    step with fewer real requests is padded to the bucket's B requests with
//    dummies of decode length (num_reqs_actual = the real ones; a dummy needs
//    seq_len >= its tokens). The builder zeroes the dummies' block-table rows
//    and gives their tokens skip slots and no compressed rows, so they write
//    no KV row; they read block 0 (the null block) and the compressors write
//    their state positions into the state caches' block 0. Their output rows
//    are not meaningful (upstream: "o_proj_input padding rows are
//    uninitialised"); eager forwards keep writing zeros past the real tokens.
//    dsa::graph_step_params / aar.dsa.graph_update (dsa/graph.h) check at
//    update that the step has the bucket's tokens, all in its B requests,
//    and its SWA metadata at the captured addresses (same builder lane, same
//    block-table width). Not checked there (the engine's side): the other
//    groups' block-table widths and that the replayed step is decode-only
//    (a prefill changes the cu_seqlens kinds and the DSpark rows).
//  - The A5 + BF16 plan (spec 7.2: uses_sparse_flash_mla, SparseFlashMla,
//    PA_BBND, bf16 rows of 512) runs whole:
//     * SWA and compressed KV writes: in-place npu_scatter_nd_update_(cache,
//       idx (V, 2), rows (V, 1, D)) over the group's first V = num_valid_rows
//       rows only. torch_npu's docs say the kernel does not support
//       out-of-range indices, so a (-1, x) row must never reach it; the
//       builders emit the valid rows first (padding requests' tokens, padding
//       tokens and the compressor's unemitted rows after them), so the valid
//       rows are a prefix whose length the host already has: a narrow, no
//       device-side compaction (which would need a nonzero and a sync). Graph
//       capture of this plan is refused by name: V changes per step, and a
//       C128 decode step often has V = 0 (a captured write would need a kernel
//       that drops rows, or a reserved scratch page).
//     * attention: ops::sparse_flash_mla with the sharedkv arguments through
//       the spec 7.2 adapter (to_sparse_flash_mla_args: seqused_ori_kv, PA_BBND;
//       compressed layers add the attention group's staged seqused_cmp_kv /
//       cmp_residual_kv; no cu_seqlens_* extras, as on A5) and the group's
//       sparse_flash_mla_metadata blob. The group must carry those lengths (a
//       GroupBuilder of the same plan), else InvalidArgument naming them.
//     * the indexer keeps the A5 fp8 flow (indexer_compress_epilog_v2 through
//       the full view, fp8 query + fp32 scales, fp32 weights), as spec 7.2 says.
//     * o_proj: by the rule below (a BF16 checkpoint, no wo_a_scale: the
//       grouped transpose-bmm in the weights' dtype).
//     * weights bfloat16 (float32 for CPU reference runs, the caches then
//       float32 too); float16 weights are refused naming the plan.
//  - Every layer checks that its groups' slot formats are its plan's
//    (slot_format_for), naming the group: a GroupBuilder configured with
//    another plan would have its slots misread.
//  - The A5 fp8 plan (the "A5 other" plan of spec 7.2: 640-byte MXFP8 rows
//    written by kv_compress_epilog, fp8 indexer through
//    indexer_compress_epilog_v2 and the full byte view, fp8 query + fp32
//    scales and fp32 weights into the QLI, attention through
//    npu_kv_quant_sparse_attn_sharedkv) runs end to end.
//  - o_proj (spec 6.8 step 4), upstream's rule (vllm-ascend dsa_v1.py
//    _forward_o_proj: the MX path when the hardware supports fp8 attention
//    AND wo_a has a weight_scale): the plan says whether the device may take
//    the MX-fp8 o_proj (AttnKvPlan::o_proj == MxFp8QuantBmm on both A5 plans:
//    a property of the hardware, not of the cache dtype), the weights say
//    whether the checkpoint is MX-fp8 (Weights::wo_a_scale given). Both ->
//    OProjKind::MxFp8QuantBmm; a plan without it or a bf16 checkpoint (no
//    scale) -> OProjKind::Bmm, the grouped transpose-bmm in the weights'
//    dtype. Impl::o_proj() reports the choice. A wo_a_scale on a plan whose
//    o_proj is Bmm (A2/A3) is refused by name rather than ignored. The MX
//    call is upstream's: npu_dynamic_mx_quant(o, dst_type=float8_e4m3fn)
//    with the schema's other defaults (axis -1, "rint", block 32, scale_alg 0:
//    the OCP rule), npu_transpose_quant_batchmatmul(y, wo_a, bfloat16,
//    x1_scale = the scales viewed float8_e8m0fnu, x2_scale = wo_a_scale,
//    group_sizes (0, 0, 32), perm_x1 (1, 0, 2), perm_x2 (0, 1, 2), perm_y
//    (1, 0, 2)); its bf16 (T, G, o_lora) result reshaped (T, G o_lora) is
//    cast to the weights' dtype for wo_b (a no-op for bf16 weights). The MX
//    path needs k = N D / G a multiple of 64 (the device's constraint).
//    ImplConfig::o_proj_override, the former escape hatch that ran the A5
//    plan with the plain bmm while the MX path was missing, is gone: a bf16
//    checkpoint on A5 now takes that path by the rule above.
//  - The indexer weights' scale Di^-0.5 n_idx^-0.5 is folded into a copy of
//    idx_weights_proj at construction (rounded once in the weights' dtype).
//  - The inverse RoPE's -sin rows: the step builder's (StepMetadata::neg_sin,
//    GroupMetadata::neg_sin), negated once per step into a stable buffer.
//  - Workspaces (cpp/dsa/workspace.h): the intermediates of decode steps live
//    in buffers shared by the layers of one shape (dims, dtypes, ratio),
//    sized for the largest decode batch seen; eager decodes write the
//    out-variant results there (projections, norms, Hadamard, casts) and take
//    the fresh results of the operators without an out schema (no copy);
//    captured layers copy those in too. Steps with a prefill allocate their
//    intermediates per call, so a long prefill does not grow the shared
//    buffers.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "ascend_attn_rt/kv_connector.h"
#include "ascend_attn_rt/detail/tensor_binding.h"
#include "ascend_attn_rt/dsa/plan/dsa_kv_plan.h"
#include "ascend_attn_rt/dsa/metadata.h"
#include "ascend_attn_rt/sparse/topk_buffer.h"

namespace aar::graph {
class GraphParams;
}

namespace aar::dsa {

namespace detail {
class Workspace;
struct TokenViews;
struct RowViews;
}  // namespace detail

struct ImplConfig {
  int64_t hidden_size = 0;
  int64_t num_heads = 0;        // N local attention heads
  int64_t head_dim = kDsaHeadDim;  // D (nope D-R, rope the last R)
  int64_t rope_dim = 64;        // R
  int64_t q_lora_rank = 0;
  // W: 0 = the SWA group's (the StepBuilder's ModelSettings::window, the one
  // source); a layer that gives one is checked against it in forward.
  int64_t window = 0;
  int32_t compress_ratio = 1;   // 1 = SWA only, 4, 128 (check_compress_ratio)
  int64_t index_n_heads = kDsaIndexerHeads;  // ratio 4
  int64_t index_head_dim = kDsaIndexerHeadDim;  // Di, a power of two
  int64_t index_topk = 512;
  double eps = 1e-6;            // every RMS norm of the layer (q, kv, compressors, per-head q)
  int64_t o_groups = 1;         // G
  int64_t o_lora_rank = 0;
  AttnKvPlan plan;
  bool use_index_cache = false;  // write the top-k into the TopkBuffer (needs ratio 4 with an indexer)
  bool skip_topk = false;        // ratio 4 without its own top-k: read the TopkBuffer (IndexCache)
  int64_t layer_index = -1;
  // The intermediates' buffers are shared by the layers of one shape, dtype,
  // device and group (they run one after another on one stream). Impls that may
  // run forward concurrently (two engines on two threads) must use different
  // groups, as MLA / SFA's workspace_group.
  int64_t workspace_group = 0;
};

// The layer's weights, torch layout (out, in), names as tests/python/_dsa_reference.py.
struct Weights {
  at::Tensor wq_a, q_norm, wq_b, wkv, kv_norm, attn_sink, wo_a, wo_b;
  // wo_a's MX scales (upstream's wo_a.weight_scale), undefined for a bf16
  // checkpoint. Given: wo_a is float8_e4m3fn in upstream's load layout (G, k,
  // n) = (G, N D / G, o_lora) (npu_transpose_quant_batchmatmul's x2 with
  // perm_x2 (0, 1, 2)), and wo_a_scale float8_e8m0fnu (uint8 is viewed as it)
  // (G, k / 64, o_lora, 2): the scale of wo_a[g, 32 j : 32 j + 32, c] at
  // [g, j / 2, c, j % 2].
  at::Tensor wo_a_scale;
  at::Tensor cmp_wkv, cmp_wgate, cmp_ape, cmp_norm;                  // ratio > 1
  at::Tensor idx_wq_b, idx_weights_proj;                             // ratio 4
  at::Tensor idx_cmp_wkv, idx_cmp_wgate, idx_cmp_ape, idx_cmp_norm;  // ratio 4
};

// Spec 6.3: the per-layer tuple (compress_kv, swa_kv, state, indexer_state,
// indexer_k, indexer_scale[, indexer_full when plan.indexer_full_view]).
// Undefined tensors stand for None. Checks only the length rule.
std::vector<at::Tensor> compose_kv_cache(const AttnKvPlan& plan, const at::Tensor& compress_kv,
                                         const at::Tensor& swa_kv, const at::Tensor& state,
                                         const at::Tensor& indexer_state, const at::Tensor& indexer_k,
                                         const at::Tensor& indexer_scale,
                                         const at::Tensor& indexer_full = at::Tensor());

// unpack_dsa_forward_kv_cache(ratio) of spec 6.3: ratio 4 -> (t0, t1, t2, t4,
// t5, full); 128 -> (t0, t1, t2, -, -, full); <= 1 -> (-, t1, -, -, -, full).
struct ForwardKv {
  at::Tensor compress_kv, swa_kv, state, indexer_k, indexer_scale, indexer_full;
};
ForwardKv unpack_forward_kv_cache(const std::vector<at::Tensor>& kv, int32_t compress_ratio);
// unpack_dsa_indexer_kv_cache: (t3, t4, t5, full or undefined).
struct IndexerKv {
  at::Tensor indexer_state, indexer_k, indexer_scale, indexer_full;
};
IndexerKv unpack_indexer_kv_cache(const std::vector<at::Tensor>& kv);

// Thread safety: one thread at a time per layer. Layers of one shape and
// workspace_group share their intermediates (ImplConfig::workspace_group): layers that may
// run concurrently (engines on different threads) need different groups. (tests/cpp/test_concurrency.cpp)
class Impl {
 public:
  // KV-connector hooks of this layer (kv_connector.h); none by default.
  KvHooks kv_hooks;

  Impl(const ImplConfig& cfg, const Weights& weights);
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  // hidden (T, hidden_size) with T >= the step's num_actual_tokens; kv_tuple
  // the compose_kv_cache tuple; md route_layer's result for this layer's
  // ratio (nullptr: profiling run, output zero-filled); output (T,
  // hidden_size) in the weights' dtype; topk_buffer needed by skip_topk /
  // use_index_cache layers. Everything is validated before the first write.
  // While a graph capture is open the layer is captured (see "Graph capture"
  // above): nothing runs then; the replay computes the step.
  const at::Tensor& forward(const at::Tensor& hidden, const std::vector<at::Tensor>& kv_tuple,
                            const LayerMetadata* md, const at::Tensor& output,
                            sfa::TopkBuffer* topk_buffer = nullptr);

  const ImplConfig& config() const { return cfg_; }
  // The o_proj this layer runs (the plan's and the weights' rule above).
  OProjKind o_proj() const { return o_proj_; }
  // The C4 selection (T, 1, K) int32 of the last forward (undefined otherwise).
  const at::Tensor& last_topk() const { return last_topk_; }

 private:
  struct Caches {
    at::Tensor compress_kv, swa_kv, state, indexer_state, indexer_k, indexer_scale, indexer_full;
  };
  Caches validate(const at::Tensor& hidden, const std::vector<at::Tensor>& kv, const LayerMetadata& md,
                  const at::Tensor& output, sfa::TopkBuffer* topk) const;
  // The step's per-token views the operators take (RoPE rows, -sin, SWA
  // slots, query ends), remade only when the builder hands out other tensors
  // or the row count changes.
  struct StepViews {
    int64_t n = -1;
    ::aar::detail::TensorBinding cos_src, neg_src, slots_src, qsl_src;
    at::Tensor cos, sin, cos3, sin3, neg_sin3, swa_slots, q_ends;
  };
  const StepViews& step_views(const LayerMetadata& md, int64_t n);
  // valid_rows: the leading rows whose slots are valid (the group's
  // num_valid_rows); only the in-place scatter of the A5 + BF16 plan reads it.
  void write_kv_rows(const at::Tensor& cache, const at::Tensor& slots, const at::Tensor& rows, int64_t valid_rows);
  void indexer_cache_update(const at::Tensor& x, const Caches& c, const LayerMetadata& md,
                            const detail::RowViews& rv, int64_t r, bool graph);
  at::Tensor indexer_topk(const at::Tensor& x, const Caches& c, const LayerMetadata& md, const detail::TokenViews& v,
                          const detail::RowViews& rv, const StepViews& sv, int64_t n, int64_t r, bool graph,
                          sfa::TopkBuffer* topk);
  // The layer over the first n rows of hidden (eager: the step's real
  // tokens; graph: the whole bucket), intermediates in `ws`; graph: every
  // operator result lands in the workspace (stable addresses).
  void run(const at::Tensor& hidden, const Caches& c, const LayerMetadata& md, const at::Tensor& output,
           sfa::TopkBuffer* topk, int64_t n, bool graph, detail::Workspace& ws);
  void capture(graph::GraphParams& g, const at::Tensor& hidden, const Caches& c, const LayerMetadata& md,
               const at::Tensor& output, sfa::TopkBuffer* topk);
  // Spec 6.8 step 4 after the inverse RoPE (eager): o (tk, N, D) -> out (tk, hidden).
  // o_proj of o (n, N*D) into out (n, hidden); ws: the workspace's views (graph
  // mode: the Bmm o_proj's result lands in its stable rows), nullptr eager.
  void run_o_proj(const at::Tensor& o, const at::Tensor& out, const detail::TokenViews* ws = nullptr);

  ImplConfig cfg_;
  Weights w_;
  at::Tensor cmp_ape_f32_, idx_ape_f32_, hadamard_, sinks_f32_, ones_d_, idx_wproj_scaled_;
  at::Tensor last_topk_;
  OProjKind o_proj_ = OProjKind::Bmm;
  std::shared_ptr<detail::Workspace> ws_;
  StepViews step_views_;
};

}  // namespace aar::dsa
