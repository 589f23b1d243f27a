// Per-layer DeepSeek-V4 ("DSA") attention: prolog and SWA write, the C128 / C4
// compressors and the C4 indexer, shared-KV sparse attention with sinks, inverse
// RoPE and the grouped o_proj. Every device-dependent choice comes from the layer's
// AttnKvPlan (dsa/plan/dsa_kv_plan.h); forward validates everything before the first write,
// does no host metadata work, and inside a graph capture records itself as one call
// or refuses by name. Design: docs/design/dsa.md §5 (forward, o_proj, workspaces, §5.4 the
// W8A8-dynamic prolog, §5.5 multistream),
// §6 (graph capture), §4.2 (the three plans); DSA-CP token sharding (ImplConfig::dsa_cp_comm):
// docs/design/sparse_cp.md §10; DCP of the SWA and compressed caches (ImplConfig::dcp_comm):
// docs/design/sparse_cp.md §12; both together: §14; PCP (ImplConfig::pcp_comm): docs/design/sparse_cp.md §13.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "ascend_attn_rt/kv_connector.h"
#include "ascend_attn_rt/detail/tensor_binding.h"
#include "ascend_attn_rt/dsa/plan/dsa_kv_plan.h"
#include "ascend_attn_rt/dsa/metadata.h"
#include "ascend_attn_rt/sparse/topk_buffer.h"

namespace aar::graph {
class GraphParams;
}
namespace aar::ops {
struct W8A8DynamicInput;
}
namespace aar::cp {
class Comm;
class DcpWorkspace;
struct DcpViews;
}
namespace aar::sparse {
class OProjFullWeight;
namespace detail {
class DsaCpWorkspace;
}
}

namespace aar::dsa {

namespace detail {
class Workspace;
class SideStream;
class StreamPlan;
struct TokenViews;
struct WriteViews;
struct RowViews;
}  // namespace detail

// docs/design/dsa.md §5.5: which stream a part of the layer ran on (Impl::stream_log).
enum class StreamRole : int32_t { Main = 0, Side = 1 };
struct StreamLogEntry {
  const char* part;   // "fork", "indexer_cache", "compressor", "prolog", "swa_write", "wait_indexer_cache", ...
  StreamRole role;
  int64_t stream_id;  // the c10 stream's id (on CPU both roles are the default stream)
};

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
  // Graph mode (docs/design/dsa.md §6): the KV-cache group whose step parameters a captured call of
  // this layer is checked against at GraphParams::update (groups[kv_cache_group]: the SWA group the
  // layer reads, when a model's layers read several SWA groups, as vLLM's per-layer groups do), as
  // gqa::ImplConfig::kv_cache_group. >= 0.
  int32_t kv_cache_group = 0;
  // The intermediates' buffers are shared by the layers of one shape, dtype,
  // device and group (they run one after another on one stream). Impls that may
  // run forward concurrently (two engines on two threads) must use different
  // groups, as MLA / SFA's workspace_group.
  int64_t workspace_group = 0;
  // DSA-CP (docs/design/sparse_cp.md §10): the group the step's tokens are split over (the TP
  // group, W ranks; must outlive the layer). With W > 1 the layer computes every head for its
  // token slice: num_heads and o_groups are the model's (all of them: wq_b, attn_sink and the
  // query for every head), and it holds its row-parallel o_proj shard, wo_a's groups
  // [r G/W, (r+1) G/W) as (G/W, N D / G, o_lora) and wo_b's matching columns (hidden, G/W o_lora);
  // its output is the complete output on every rank. Needs metadata built with the same
  // dsa_cp_world_size and rank (StepBuilderConfig), W dividing num_heads and o_groups, and the
  // Bmm o_proj (the MX-fp8 one, wo_a_scale, is refused by name). Decode buckets are captured on
  // every plan (the A5 + BF16 plan's full-width KV write included, docs/design/dsa.md §6).
  cp::Comm* dsa_cp_comm = nullptr;
  // Under DSA-CP, steps with prefills: the full o_proj (wo_a and wo_b gathered into static pools
  // and switched in under one guard, sparse/oproj_switch.h) on this rank's tokens, then the
  // outputs all-gathered along the tokens. false: every step takes the decode road (all-to-all,
  // the shard's o_proj, all-reduce).
  bool dsa_cp_full_o_proj_prefill = true;
  // DCP (docs/design/sparse_cp.md §12): the group the SWA and compressed-KV caches are sharded
  // over (W ranks inside the TP group; must outlive the layer). Needs metadata built with the same
  // dcp_world_size and rank (StepBuilderConfig). The layer keeps its own heads: the query is
  // gathered over the group's heads, every rank attends all W * num_heads heads over the keys it
  // holds (its window rows and compressed rows, as explicit index lists) without the sinks, the
  // partials are merged by LSE, and the sinks enter the merged softmax once on the heads' rank.
  // Every step kind (decode, speculative decode, prefill, mixed) eagerly, decode buckets also in
  // a graph capture (the collectives inside each replay, §12.5), the A2/A3 plan; refused by name
  // otherwise. With dsa_cp_comm too (DSA-CP x DCP, §14): the same group (same size and rank, else
  // refused by name); DSA-CP's weights; the slice's query and selection are gathered along the tokens,
  // every row is attended over this rank's shard, and the partials are merged by token block.
  cp::Comm* dcp_comm = nullptr;
  // PCP (docs/design/sparse_cp.md §13): the group the step's prefill tokens are split over (Wp ranks;
  // must outlive the layer). Needs metadata built with the same pcp_world_size and rank
  // (StepBuilderConfig); hidden and output are then this rank's local rows (StepMetadata::pcp,
  // num_local_tokens of them: the decodes, its head and tail chunk of every prefill, pad rows output 0).
  // Every rank all-gathers the local hidden rows, writes every token's SWA, compressor-state, compressed and
  // indexer rows into its complete caches (the global step's slots), then attends its own rows only; one
  // collective per layer and step with prefills. A step without prefill (decode, draft) is replicated: every
  // rank runs the single-rank layer on the step's rows, no collective; such decode buckets are captured and
  // replayed as without PCP (a step with prefills refused at capture and at graph update). The A2/A3 plan;
  // DSA-CP and DCP with it refused by name (multistream and the W8A8 prolog run).
  cp::Comm* pcp_comm = nullptr;
  // docs/design/dsa.md §5.5: compressed layers run their compressor(s) and the indexer's cache write
  // on a second stream (the device's stream pool; on CPU the default stream), overlapping the prolog;
  // events order the side stream after the layer's inputs and the main stream (its attention and
  // collectives) after the KV writes before it reads them. Captured with the layer
  // (docs/design/dsa.md §6); under DSA-CP, DCP and PCP too (docs/design/sparse_cp.md §10, §12, §13).
  bool multistream = false;
  // Record, per forward, which stream each part ran on (Impl::stream_log); off costs nothing.
  bool log_streams = false;
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
  // The W8A8-dynamic prolog (docs/design/dsa.md §5.4), all three or none: given, wq_a, wq_b and wkv
  // are int8 (out, in) and these their float32 per-output-channel dequant scales (out); the
  // activations are quantised per token (npu_dynamic_quant; qr after its RMSNorm) and the three
  // projections run as npu_quant_matmul. The layer's activation dtype is then wo_b's.
  at::Tensor wq_a_scale, wq_b_scale, wkv_scale;
  at::Tensor cmp_wkv, cmp_wgate, cmp_ape, cmp_norm;                  // ratio > 1
  at::Tensor idx_wq_b, idx_weights_proj;                             // ratio 4
  at::Tensor idx_cmp_wkv, idx_cmp_wgate, idx_cmp_ape, idx_cmp_norm;  // ratio 4
};

// docs/design/dsa.md §2.3: the per-layer tuple (compress_kv, swa_kv, state, indexer_state,
// indexer_k, indexer_scale[, indexer_full when plan.indexer_full_view]).
// Undefined tensors stand for None. Checks only the length rule.
std::vector<at::Tensor> compose_kv_cache(const AttnKvPlan& plan, const at::Tensor& compress_kv,
                                         const at::Tensor& swa_kv, const at::Tensor& state,
                                         const at::Tensor& indexer_state, const at::Tensor& indexer_k,
                                         const at::Tensor& indexer_scale,
                                         const at::Tensor& indexer_full = at::Tensor());

// unpack_dsa_forward_kv_cache(ratio) of docs/design/dsa.md §2.3: ratio 4 -> (t0, t1, t2, t4,
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
  ~Impl();
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
  // Whether the prolog's projections are W8A8-dynamic (Weights::wq_a_scale given).
  bool w8a8_prolog() const { return w8a8_; }
  // The last forward's parts and their streams, in issue order (ImplConfig::log_streams; empty otherwise).
  const std::vector<StreamLogEntry>& stream_log() const { return stream_log_; }
  // The C4 selection (T, 1, K) int32 of the last forward (undefined otherwise).
  const at::Tensor& last_topk() const { return last_topk_; }
  // The o_proj weights as the layer holds them now (under DSA-CP: its shards outside a switch),
  // and (DSA-CP only) the full-weight pools of the switch: 0 wo_a, 1 wo_b.
  const at::Tensor& wo_a() const { return w_.wo_a; }
  const at::Tensor& wo_b() const { return w_.wo_b; }
  const at::Tensor& o_proj_full_pool(int64_t i) const;
  int32_t dsa_cp_world_size() const;

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
  // gw, fill: graph mode on the in-place scatter plan (every row, skip rows to the fill slot).
  void write_kv_rows(const at::Tensor& cache, const at::Tensor& slots, const at::Tensor& rows, int64_t valid_rows,
                     const detail::WriteViews* gw = nullptr, const at::Tensor& fill = at::Tensor());
  void indexer_cache_update(const at::Tensor& x, const Caches& c, const LayerMetadata& md,
                            const detail::RowViews& rv, int64_t r, bool graph);
  // The C4 selection of the n query rows x (their q-LoRA rows in v.qa): the indexer query with
  // RoPE rows cos3 / sin3 (n, 1, R), the weights, QLI with the cumulative query ends q_ends and
  // the KV lengths k_lens (the step's, or under DSA-CP the slice's local ones).
  at::Tensor indexer_select(const at::Tensor& x, const Caches& c, const LayerMetadata& md,
                            const detail::TokenViews& v, const at::Tensor& cos3, const at::Tensor& sin3,
                            const at::Tensor& q_ends, const at::Tensor& k_lens, int64_t n, bool graph,
                            sfa::TopkBuffer* topk);
  // The layer over the first n rows of hidden (eager: the step's real
  // tokens; graph: the whole bucket), intermediates in `ws`; graph: every
  // operator result lands in the workspace (stable addresses).
  void run(const at::Tensor& hidden, const Caches& c, const LayerMetadata& md, const at::Tensor& output,
           sfa::TopkBuffer* topk, int64_t n, bool graph, detail::Workspace& ws);
  // docs/design/dsa.md §5.1: SAS attention of the query rows q (TND) with cumulative query starts
  // cu_q (B+1) and KV lengths seqused (the step's, or under DSA-CP the slice's), the C4 selection
  // sel, DSpark's ori_sparse rows (undefined: none); into out when defined (graph mode), else a
  // new tensor.
  // With lse (the DCP partials): the softmax LSE is returned there and the sinks are left out
  // when with_sinks is false.
  at::Tensor attend(const Caches& c, const LayerMetadata& md, const at::Tensor& q, const at::Tensor& cu_q,
                    const at::Tensor& seqused, const at::Tensor& sel, const at::Tensor& ori_sparse,
                    const at::Tensor& out, bool with_sinks = true, at::Tensor* lse = nullptr) const;
  // docs/design/sparse_cp.md §12: the DCP attention of the n query rows q (n, N, D) with the
  // step's global C4 selection sel (undefined for other ratios): (n, N, D), sinks applied.
  // graph (a captured bucket's replay, §12.5): no host value of the step is read (C128's list
  // width from the RoPE table's rows instead of max_seqlen_kv).
  // The lists come from the group builds (GroupMetadata::dcp_ori_indices / dcp_cmp_limit); the
  // compressed list, the merged LSE and the merge's wire in the workspaces; the result is v.o.
  at::Tensor attend_dcp(const Caches& c, const LayerMetadata& md, const at::Tensor& q, const at::Tensor& sel,
                        int64_t n, bool graph, detail::Workspace& ws, const detail::TokenViews& v) const;
  // DCP's key lists of the step's first n rows (docs/design/sparse_cp.md §12.2 step 3): this rank's window
  // slots (n, 1, win_left + 1) and, compressed layers, its compressed rows below each row's limit (C4: of the
  // step's selection sel, (n, 1, K); C128: every row) as local indices in the workspace (undefined at ratio 1).
  std::pair<at::Tensor, at::Tensor> dcp_key_lists(const LayerMetadata& md, const at::Tensor& sel, int64_t n,
                                                  bool graph, detail::Workspace& ws) const;
  // The sinks on a merged DCP softmax: merged (n, N, D) *= sigmoid(mlse - sink) in place; mlse (n, N) fp32 is
  // overwritten (docs/design/sparse_cp.md §12.2 step 6).
  void apply_sinks_after_merge(const at::Tensor& merged, const at::Tensor& mlse) const;
  // DSA-CP x DCP (docs/design/sparse_cp.md §14): the slice's query q (nloc, N, D) and C4 selection sel
  // (nloc, 1, K; undefined for other ratios or a skip_topk layer) gathered along the tokens, every one of the
  // step's tk rows attended over this rank's shard, the partials exchanged by token block and merged, the
  // sinks applied: the slice's (tpr, N, D) rows (the first nloc are its tokens). Sets last_topk_ (tk rows).
  const at::Tensor& attend_dsa_cp_dcp(const Caches& c, const LayerMetadata& md, const at::Tensor& q, const at::Tensor& sel,
                               int64_t tk, bool graph, detail::Workspace& ws, sfa::TopkBuffer* topk);
  // Its buffers and views for slices of tpr rows and a step of tk rows (the exchange's workspace shared by
  // shape and comm; the padded query / selection and the merged rows the layer's, made once per (tpr, tk)).
  struct CpDcpViews {
    int64_t cap = 0, tpr = -1, tk = -1, generation = -1;
    const cp::DcpViews* mw = nullptr;
    std::shared_ptr<cp::DcpWorkspace> ws;  // mw's workspace, held (so its address is never reused meanwhile)
    at::Tensor q_buf, sel_buf, merged_buf, mlse_buf;
    std::vector<at::Tensor> kept;  // grown-out buffers (a captured replay may read them)
    at::Tensor mw_out, mw_lse, q_pad, q_all, q_all_tk, part_tk, lse_tk, part_rest, lse_rest, merged, merged3, mlse,
        mlse2, sel_pad;
    at::Tensor merged_rows, mlse_rows;  // merged / mlse as (tpr N, D) / (tpr N): combine_partials' row targets
  };
  const CpDcpViews& dsa_cp_dcp_views(int64_t tpr, int64_t tk);
  // C128 under DCP: 0..L-1 as (1, 1, L) int32 on the layer's device (kept, grown on demand).
  const at::Tensor& dcp_columns(int64_t L) const;
  // The whole step's cache writes from its tk hidden rows x (the step's RoPE rows and slots): the SWA KV,
  // C4's indexer compressor and cache, the compressors and their compressed rows (DSA-CP and PCP;
  // graph: a captured DSA-CP replay, whose A5 + BF16 writes take every row). With multistream (sp) the
  // compressed caches' writers go to the side stream after a fork; the caller waits for them
  // (docs/design/dsa.md §5.5). xq (W8A8 layers, may be nullptr): receives x's per-token quantisation.
  void write_step_caches(const at::Tensor& x, const Caches& c, const LayerMetadata& md, int64_t tk,
                         detail::Workspace& ws, detail::StreamPlan& sp, bool graph = false,
                         ops::W8A8DynamicInput* xq = nullptr);
  // docs/design/dsa.md §5.5: this forward's streams (the side stream only on compressed layers with
  // multistream, made on first use), logging into stream_log_ with log_streams.
  detail::StreamPlan stream_plan(c10::Device device);
  // docs/design/sparse_cp.md §13: the PCP forward (eager; impl_pcp.cpp): hidden / output the rank's local rows.
  void run_pcp(const at::Tensor& hidden, const Caches& c, const LayerMetadata& md, const at::Tensor& output,
               sfa::TopkBuffer* topk, detail::Workspace& ws);
  // docs/design/sparse_cp.md §10: the DSA-CP forward over the step's tk tokens; graph: a captured
  // bucket's replay (the A5 + BF16 plan's KV writes then take every row, docs/design/dsa.md §6).
  void run_dsa_cp(const at::Tensor& hidden, const Caches& c, const LayerMetadata& md, const at::Tensor& output,
                  sfa::TopkBuffer* topk, int64_t tk, detail::Workspace& ws, bool graph = false);
  // The Bmm o_proj of o (n, groups * N D / G) with the wo_a / wo_b the layer holds now (groups:
  // wo_a's leading size), into a new (n, hidden) tensor, or into `out` (n, hidden) when given.
  at::Tensor bmm_o_proj(const at::Tensor& o, int64_t groups, const at::Tensor& out = at::Tensor()) const;
  void capture(graph::GraphParams& g, const at::Tensor& hidden, const Caches& c, const LayerMetadata& md,
               const at::Tensor& output, sfa::TopkBuffer* topk);
  // docs/design/dsa.md §5.2 after the inverse RoPE (eager): o (tk, N, D) -> out (tk, hidden).
  // o_proj of o (n, N*D) into out (n, hidden); ws: the workspace's views (graph
  // mode: the Bmm o_proj's result lands in its stable rows), nullptr eager.
  void run_o_proj(const at::Tensor& o, const at::Tensor& out, const detail::TokenViews* ws = nullptr);
  // docs/design/dsa.md §5.4: the prolog's projections, float or W8A8-dynamic, on whatever rows the mode
  // computes (single rank and DCP: every row; DSA-CP: kv of every row, the query of the slice's; PCP: kv
  // of the global step's rows, the query of the rank's). quantize_x (W8A8 only): x's rows quantised per
  // token, one quantisation for both of x's projections (graph: into v's x_q / x_scale, v of x's rows).
  ops::W8A8DynamicInput quantize_x(const at::Tensor& x, const detail::TokenViews& v, bool graph) const;
  // The query projections of x's rows into v.qa (qr, normed) and v.q2 (qr W_q_b^T); xq: x quantised
  // (W8A8 layers; unused otherwise). graph: the W8A8 products and qr's quantisation in the workspace.
  void project_q(const at::Tensor& x, const ops::W8A8DynamicInput* xq, const detail::TokenViews& v,
                 bool graph) const;
  // x W_kv^T into kv (before its norm); xq as project_q's.
  void project_kv(const at::Tensor& x, const ops::W8A8DynamicInput* xq, const at::Tensor& kv, bool graph) const;

  ImplConfig cfg_;
  // Held weakly by the graph buckets that recorded calls reaching this object (graph::note_layer_life):
  // update / replay of such a bucket refuse it by name once the object is gone.
  std::shared_ptr<const int> life_ = std::make_shared<const int>(0);
  Weights w_;
  at::Tensor cmp_ape_f32_, idx_ape_f32_, hadamard_, sinks_f32_, ones_d_, idx_wproj_scaled_;
  at::Tensor last_topk_;
  OProjKind o_proj_ = OProjKind::Bmm;
  bool w8a8_ = false;
  std::unique_ptr<detail::SideStream> side_;  // multistream: made on the first forward
  std::vector<StreamLogEntry> stream_log_;
  at::ScalarType act_dtype_ = at::kBFloat16;  // the activations' (wq_a's, or wo_b's for a W8A8 prolog)
  at::Tensor wq_a_t_, wq_b_t_, wkv_t_;      // W8A8 prolog: the int8 weights as npu_quant_matmul's x2 (in, out)
  std::shared_ptr<detail::Workspace> ws_;
  StepViews step_views_;
  std::unique_ptr<sparse::OProjFullWeight> oproj_full_;  // DSA-CP: the o_proj full-weight switch
  std::shared_ptr<sparse::detail::DsaCpWorkspace> cpws_;  // DSA-CP: the slice's buffers (shared by shape)
  std::shared_ptr<cp::DcpWorkspace> dcp_ws_;  // DCP: the query gather and the merge's wire (shared by shape)
  std::shared_ptr<cp::DcpWorkspace> cpdcp_ws_;  // DSA-CP x DCP: the slice's token-block exchange (by tpr)
  CpDcpViews cpdcp_;                            // DSA-CP x DCP: dsa_cp_dcp_views()
  // DSA-CP: views of the step's metadata and of the layer's buffers a forward takes, kept across calls
  // (docs/design/sparse_cp.md §15.1): the slice's RoPE rows (nloc, 1, R) and, under DSA-CP x DCP, the
  // slice's merged rows (nloc, N, D) and their road view (nloc, W, N D / W).
  struct SliceViews {
    ::aar::detail::KeptView cos3, sin3, neg3, merged, merged_road;
  };
  SliceViews slice_views_;
  struct SliceRope {
    const at::Tensor& cos3;
    const at::Tensor& sin3;
    const at::Tensor& neg3;
  };
  // The slice's nloc RoPE rows of the layer's table (compressed layers: compress_rope_theta's) as
  // (nloc, 1, R), kept in slice_views_.
  SliceRope slice_rope(const DsaCpStepMetadata& sh, int64_t nloc);
  mutable at::Tensor dcp_cols_, dcp_cols_view_;  // DCP, C128: dcp_columns()
  // DCP: dcp_key_lists' views of the step's lists (the window slots' rows, the compressed limits as
  // (n, 1, 1), C128's columns expanded to n rows), kept across calls.
  struct DcpListViews {
    ::aar::detail::KeptView ori, limit, cols;
  };
  mutable DcpListViews dcp_list_views_;
  mutable ::aar::detail::KeptView o_proj_in_;  // bmm_o_proj's (n, groups, k) view of its input
};

}  // namespace aar::dsa
