// Per-layer SFA attention (DeepSeek-V3.2): the MLA family's absorbed-query
// preprocess (NATIVE / PROLOG_V3 / MLAPO), the lightning indexer and top-k (or its
// reuse), sparse flash attention, W_UV and o_proj; the C8 variants and the KV-offload
// variant per ImplConfig. forward validates the composed cache tuple before any write
// and does no host metadata work (except the offload's resident path).
// Design: docs/design/sfa.md §4 (forward), §5 (C8), §6 (offload).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ascend_attn_rt/kv_connector.h"
#include "ascend_attn_rt/detail/tensor_binding.h"
#include "ascend_attn_rt/latent/weights.h"
#include "ascend_attn_rt/ops/lightning_indexer.h"
#include "ascend_attn_rt/ops/sparse_flash_attention.h"
#include "ascend_attn_rt/plan/workspace.h"
#include "ascend_attn_rt/sfa/metadata.h"
#include "ascend_attn_rt/sfa/offload.h"
#include "ascend_attn_rt/sfa/preprocess.h"
#include "ascend_attn_rt/sparse/topk_buffer.h"

namespace aar::mla::detail {
class LatentCore;
struct LatentQuery;
}
namespace aar::sfa::detail {
class IndexerWorkspace;
struct IndexerViews;
class OffloadLayer;
}
namespace aar::graph {
class GraphParams;
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

namespace aar::sfa {

// The lightning indexer's weights (docs/design/sparse.md §4), torch layout (out, in).
struct IndexerWeights {
  at::Tensor wq_b;           // (n_head * head_dim, q_lora_rank) (hidden_size without q-LoRA): q_li = c_q W^T
  at::Tensor wk;             // (head_dim, hidden_size): the indexer key
  at::Tensor weights_proj;   // (n_head, hidden_size): the per-head score weights (no extra scaling, docs/design/sparse.md §4)
  at::Tensor k_norm_weight;  // (head_dim) LayerNorm gamma of the key
  at::Tensor k_norm_bias;    // (head_dim) LayerNorm beta
};

struct IndexerConfig {
  int64_t n_head = 64;
  int64_t head_dim = 128;
  int64_t topk = 2048;        // index_topk K
  double k_norm_eps = 1e-6;
  // GLM-MoE-DSA: the indexer RoPE rotates interleaved pairs (2i, 2i+1) instead
  // of the neox halves (docs/design/sparse.md §2), and A2/A3 call torch_npu's indexer.
  bool glm_moe_dsa = false;
};

struct ImplConfig {
  mla::Dims dims;
  double scale = 0.0;  // 0 = 1/sqrt(P+R); DeepSeek-V3.2 passes its YaRN-scaled one
  double q_norm_eps = 1e-6, kv_norm_eps = 1e-6;
  // The layer's indexer; absent: the layer reuses the top-k the last indexer
  // layer left in the model's TopkBuffer (skip_topk, docs/design/sparse.md §6).
  std::optional<IndexerConfig> indexer;
  // A layer with an indexer also writes its top-k into the TopkBuffer for the
  // layers without one (use_index_cache).
  bool use_index_cache = false;
  // SFA C8: the main cache is the packed quantised cache (see above). Needs
  // kv_lora_rank 512, qk_rope_head_dim 64 and fp16/bf16 weights.
  bool sfa_c8 = false;
  // LI C8: the indexer cache holds quantised keys and their scales (see
  // above). Needs an indexer whose head_dim is a power of two.
  bool li_c8 = false;
  // Decides the C8 dtypes (int8 + fp16 scales on A2/A3/310P, float8_e4m3fn +
  // fp32 scales on A5; Backend::c8_dtype) and the operator libraries.
  plan::DeviceKind device_kind = plan::DeviceKind::A2;
  int64_t layer_index = -1;
  int64_t workspace_group = 0;
  // The preprocess selection inputs (docs/design/sfa.md §4.2). `quant` must equal the weights'
  // quant type (mla::Weights::quant); `has_q_lora` is taken from dims;
  // `kv_offload` follows `offload` below (set alone it is rejected).
  PreprocessConfig preprocess;
  // Sparse KV offload (docs/design/sfa.md §6; see above and sfa/offload.h).
  std::optional<OffloadConfig> offload;
  // Decode context parallel with the replicated indexer (docs/design/sparse_cp.md §5): the
  // DCP group (null or one rank: no DCP). Metadata built with dcp_world_size > 1 needs the
  // matching comm (same size and rank); preprocess.dcp_size follows it. LI C8 runs under it (its
  // key bytes and scales at the replicated indexer slots); SFA C8 and KV offload are refused. The
  // comm must outlive the layer.
  cp::Comm* dcp_comm = nullptr;
  // DSA-CP token sharding (docs/design/sparse_cp.md §4, §7): the group the step's tokens are
  // split over (the TP group; null or one rank: none). The layer then computes ALL heads
  // (dims.num_heads, with q_proj / kv_b_proj of all heads) for its token shard; weights.o_proj is
  // this rank's row-parallel shard (hidden, num_heads * v_head_dim / W), columns
  // [rank * C, (rank + 1) * C) of the full o_proj. The layer's output is the COMPLETE output on
  // every rank (no all-reduce after it). Needs metadata built with the same dsa_cp_world_size and
  // rank. NATIVE preprocess only; SFA C8, LI C8 and KV offload are refused with it. Combined with
  // dcp_comm (DSA-CP x DCP, docs/design/sparse_cp.md §9): the DCP group must be this group in the
  // same order (same size and rank, checked here; the same Comm object may be passed for both), and
  // the layer issues every collective on dsa_cp_comm.
  cp::Comm* dsa_cp_comm = nullptr;
  // DSA-CP steps with prefills: the full o_proj (shards all-gathered into a static pool and
  // switched in, sparse/oproj_switch.h) on this rank's tokens, then the outputs all-gathered along
  // the tokens (upstream's enable_dsa_cp_with_o_proj_tp). false: every step takes the decode
  // road (outputs all-to-all'd to head shards, the shard's o_proj, an all-reduce).
  bool dsa_cp_full_o_proj_prefill = true;
  // Prefill context parallel (docs/design/sparse_cp.md §11): the PCP group (null or one rank: none).
  // Metadata built with pcp_world_size > 1 needs the matching comm (same size and rank); the forward
  // then takes this rank's rows (Metadata::pcp.num_local_tokens rows of hidden_states / output). With
  // dcp_comm too (PCP x DCP): the DCP group of this PCP rank, whose ranks hold the same rows and their own
  // heads. Eager only; refused by name with dsa_cp_comm, SFA C8 and KV offload. The comm must
  // outlive the layer.
  cp::Comm* pcp_comm = nullptr;
};

// The context-parallel modes of SFA from its switches (docs/design/sparse_cp.md §1, §11).
enum class CpMode : int32_t { Plain = 0, DsaCp = 1, Dcp = 2, DsaCpDcp = 3, Pcp = 4, PcpDcp = 5 };
const char* to_string(CpMode m);
// The mode of (dsa_cp, dcp_size, pcp_size): InvalidArgument for a size < 1; NotSupported (naming both
// switches) for PCP combined with DSA-CP, which is not built.
CpMode resolve_cp_mode(bool dsa_cp, int64_t dcp_size, int64_t pcp_size = 1);

enum class TopkSource : int32_t { None = 0, Indexer = 1, Reused = 2 };
const char* to_string(TopkSource s);

// Thread safety: one thread at a time per layer. Layers of one shape and
// workspace_group share the decode and indexer workspaces (and, with offload, the offload
// workspace): layers that may run concurrently (engines on different threads) need
// different groups. The TopkBuffer is the engine's: one thread at a time. (tests/cpp/test_concurrency.cpp)
class Impl {
 public:
  // KV-connector hooks of this layer (kv_connector.h); none by default.
  KvHooks kv_hooks;

  Impl(const ImplConfig& cfg, const mla::Weights& weights, const std::optional<IndexerWeights>& indexer_weights);
  ~Impl();
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  // hidden (T, hidden_size), T >= the metadata's kernel tokens (its padded
  // query ends); kv_cache the layer's composed cache tuple (compose_kv_cache
  // with the layer's sfa_c8 / li_c8), every tensor contiguous:
  //   main part:    (latent (nb, bs, 1, L), rope (nb, bs, 1, R)) in the weights'
  //                 dtype, or with SFA C8 (packed (nb, bs, 1, 656) int8 / fp8);
  //   indexer part (layers with an indexer): (indexer k (nb', bs, 1, D_i)) in
  //                 the weights' dtype, or with LI C8 (indexer k int8 / fp8,
  //                 indexer scale (nb', bs, 1, 1) fp16 / fp32).
  // A tuple of another length, dtype (for the layer's device_kind), shape or
  // layout is rejected by name before anything is written. output (T,
  // hidden_size): rows past the kernel tokens get o_proj(0) = 0; topk the
  // model's TopkBuffer (needed by layers without an indexer and with
  // use_index_cache; may be null otherwise). The backend contract's order
  // (core/backend.h): metadata == nullptr (profiling run) zero-fills output
  // and is refused inside a graph capture. While a graph capture is open the
  // layer is captured (every length it reads lives in the builder's stable
  // buffers, so an update re-issues nothing for it). A KV-offloaded layer
  // captures decode-only buckets as three calls, the middle one a host
  // callback whose per-step inputs GraphParams::update brings
  // (sfa/graph.h; docs/design/sfa.md §6.6).
  const at::Tensor& forward(const at::Tensor& hidden, const std::vector<at::Tensor>& kv_cache, const Metadata* metadata,
                            const at::Tensor& output, TopkBuffer* topk = nullptr);

  const ImplConfig& config() const { return cfg_; }
  const at::Tensor& w_uk_t() const;
  const at::Tensor& w_uv() const;
  // The layer's o_proj as the layer holds it now (DSA-CP: its shard outside a switch) and the DSA-CP
  // full-weight pool (InvalidArgument without DSA-CP). For tests and tracing.
  const at::Tensor& o_proj_weight() const;
  const at::Tensor& o_proj_full_pool() const;
  TopkSource last_topk_source() const { return last_topk_; }
  // The top-k rows (T, 1, K) of the last forward (the indexer's result, or the
  // reused buffer view). For tests and tracing.
  const at::Tensor& last_topk() const { return last_topk_rows_; }
  // The preprocess resolved at construction (and why), and the one the last
  // forward took (after the per-call downgrade). For tests and tracing.
  Preprocess preprocess() const { return choice_.kind; }
  const std::string& preprocess_reason() const { return choice_.reason; }
  Preprocess last_preprocess() const { return last_pre_; }
  // KV offload: what the last forward's offload path did, the resident
  // buffers (rows, topk_buffer_size, 1, L) / (.., R), the token a resident slot
  // of a row holds (-1: empty; the LRU's state), and the resident rows. For
  // tests and tracing; NotSupported-free: InvalidArgument on a layer without offload.
  const OffloadStepStats& last_offload_stats() const;
  const at::Tensor& resident_k() const;
  const at::Tensor& resident_v() const;
  int32_t resident_token(int32_t row, int32_t slot) const;
  int64_t resident_rows() const;
  // Forgets every resident row (the LRU; the buffers keep their bytes).
  void reset_resident();
  void release_views();
  void reload_weights(const mla::Weights& weights);

 private:
  struct Caches {
    at::Tensor nope, rope;      // without SFA C8
    at::Tensor packed;          // with SFA C8
    at::Tensor index_k;         // layers with an indexer
    at::Tensor index_scale;     // with LI C8
  };
  Caches validate(const at::Tensor& hidden, const std::vector<at::Tensor>& kv_cache, const Metadata& md,
                  TopkBuffer* topk, const at::Tensor& output) const;
  // The offload's routing (docs/design/sfa.md §6's table) of a validated step of tk tokens.
  void run_offload(const at::Tensor& hidden, const Caches& c, const Metadata& md, TopkBuffer* topk,
                   const at::Tensor& output, int64_t tk);
  // Records the offloaded layer's decode step into the open capture (docs/design/sfa.md §6.6).
  void capture_offload(graph::GraphParams& g, const at::Tensor& hidden, const Caches& c, const Metadata& md,
                       TopkBuffer* topk, const at::Tensor& output, int64_t tk);
  // The top-k of the step's tk tokens: this layer's indexer, or the buffer's.
  const at::Tensor& select_topk(const at::Tensor& x, const mla::detail::LatentQuery& q, const Caches& c,
                                const Metadata& md, TopkBuffer* topk, int64_t tk);
  const detail::OffloadLayer& offload_layer() const;
  // The layer's work on the first tk tokens, without host metadata work; what
  // a graph capture records.
  void run(const at::Tensor& hidden, const Caches& c, const Metadata& md, TopkBuffer* topk, const at::Tensor& output,
           int64_t tk, bool stable);
  at::Tensor indexer_topk(const at::Tensor& x, const at::Tensor& q_c, const Caches& c, const Metadata& md, int64_t tk);
  // RoPE of the indexer's first qk_rope_head_dim dims, in place, through
  // their (tk, 1, heads, R) view.
  void indexer_rope_(const at::Tensor& head, const at::Tensor& cos, const at::Tensor& sin);
  // LI C8: rotation, quantisation, key and scale writes, the quantised indexer.
  at::Tensor quant_indexer_topk(const at::Tensor& k, const at::Tensor& q, const at::Tensor& weights, const Caches& c,
                                const Metadata& md, at::Tensor& k_rows, const at::Tensor& slots);
  // LI C8's two halves: the keys rotated, quantised and written at `slots`; the queries rotated and
  // quantised and the quantised indexer with the given lengths and table (also PCP's, §11).
  void quant_indexer_write_(const at::Tensor& k, const Caches& c, at::Tensor& k_rows, const at::Tensor& slots);
  // The CP modes' gathered [k_rope | k_nope | k_indexer] rows written: latent rows at `slots`, indexer rows at
  // `islots` (docs/design/sparse_cp.md §7, §9, §11).
  void write_gathered_rows_(const Caches& c, const at::Tensor& rows, const at::Tensor& slots, const at::Tensor& islots);
  // DSA-CP (docs/design/sparse_cp.md §15): the gathered raw kv_a rows written by one fused cache write, the
  // indexer rows at their slots, the first n rows of a staged block.
  void write_gathered_kv_(const Caches& c, const at::Tensor& kv_rows, const Metadata& md, int64_t n);
  void write_indexer_rows_(const Caches& c, const at::Tensor& k_idx, const at::Tensor& islots);
  const at::Tensor& staged_rows_(const at::Tensor& staged, int64_t n);
  void write_rows_(const Caches& c, const at::Tensor& k_rope, const at::Tensor& k_nope, const at::Tensor& k_idx,
                   const at::Tensor& slots, const at::Tensor& islots);
  at::Tensor quant_indexer_select_(const at::Tensor& q, const at::Tensor& weights, const Caches& c,
                                   const at::Tensor& cum_query_lens, const at::Tensor& seq_lens,
                                   const at::Tensor& block_table);
  // SFA C8: packs the latent key into 656-byte rows and scatters them by slot.
  void store_packed_rows(const at::Tensor& k_nope, const at::Tensor& k_rope, const Caches& c, const Metadata& md,
                         int64_t tk);
  at::Tensor sparse_attention(const at::Tensor& qn, const at::Tensor& qr, const at::Tensor& topk, const Caches& c,
                              const Metadata& md);
  // DSA-CP (docs/design/sparse_cp.md §7): the whole step of a token-sharded layer.
  void run_dsa_cp(const at::Tensor& hidden, const Caches& c, const Metadata& md, TopkBuffer* topk,
                  const at::Tensor& output, int64_t tk);
  // DSA-CP x DCP (docs/design/sparse_cp.md §9): the whole step, tokens and main KV cache both sharded
  // over the one group.
  void run_dsa_cp_dcp(const at::Tensor& hidden, const Caches& c, const Metadata& md, TopkBuffer* topk,
                      const at::Tensor& output, int64_t tk);
  // The two DSA-CP modes' shared pieces: the preprocess of this rank's token slice, nothing written
  // (its rows packed for the gather, with the query of every head under DSA-CP x DCP), and the road
  // back from the slice's (nloc, N V) rows, padded to tpr, to the step's output (docs/design/sparse_cp.md §7 step 4).
  // PCP (docs/design/sparse_cp.md §11): the whole step of this rank's rows.
  void run_pcp(const at::Tensor& hidden, const Caches& c, const Metadata& md, TopkBuffer* topk,
               const at::Tensor& output, int64_t tk);
  struct DsaCpSlice;
  void dsa_cp_slice(const at::Tensor& hidden, const DsaCpMetadata& shard, bool with_query, DsaCpSlice& out);
  void dsa_cp_output(const at::Tensor& y_local, int64_t nloc, const Metadata& md, const at::Tensor& output,
                     int64_t tk);
  // The indexer's keys of x into v.k (projection, LayerNorm, RoPE), and its weights, queries and
  // selection over the cache with the given lengths and table.
  void indexer_keys_(const detail::IndexerViews& v, const at::Tensor& x, const at::Tensor& cos4,
                     const at::Tensor& sin4);
  at::Tensor indexer_select_(const detail::IndexerViews& v, const at::Tensor& x, const at::Tensor& q_c,
                             const at::Tensor& cos4, const at::Tensor& sin4, const Caches& c,
                             const at::Tensor& cum_query_lens, const at::Tensor& seq_lens,
                             const at::Tensor& block_table);
  // DCP (docs/design/sparse_cp.md §5): the query gathered over the group, the top-k remapped
  // to this rank's positions, sparse attention over the local shard with its LSE, the
  // partials exchanged and merged into this rank's heads: `merged` (tk, H, L), returned.
  const at::Tensor& dcp_sparse_attention(const at::Tensor& qn, const at::Tensor& qr, const at::Tensor& topk,
                                         const Caches& c, const Metadata& md, int64_t tk, at::Tensor& merged);
  // PCP decode-only step (docs/design/sparse_cp.md §11.2): the step's tk rows over this rank's PCP x DCP
  // shard with LSE (merged over DCP first under PCP x DCP), one all-gather of the fp32 wire over PCP and
  // the shared wire merge (cp::pcp_gather_merge_rows) into `merged` (tk, H, L), returned.
  const at::Tensor& pcp_decode_attention(const at::Tensor& qn, const at::Tensor& qr, const at::Tensor& topk,
                                         const Caches& c, const Metadata& md, int64_t tk, at::Tensor& merged);
  // Sparse attention of (T, heads) queries over this rank's DCP shard (local_topk already remapped,
  // sparse_mode 0, docs/design/sparse_cp.md §3): the partial output (T, heads, L); its LSE is written
  // into lse_out (T, heads, 1) fp32 (-inf for an empty selection).
  at::Tensor sparse_attention_lse(const at::Tensor& qn, const at::Tensor& qr, const at::Tensor& local_topk,
                                  const Caches& c, const at::Tensor& block_table, const at::Tensor& cum_query_lens,
                                  const at::Tensor& local_seq_lens, const at::Tensor& lse_out);

  ImplConfig cfg_;
  // Held weakly by the graph buckets that recorded calls reaching this object (graph::note_layer_life):
  // update / replay of such a bucket refuse it by name once the object is gone.
  std::shared_ptr<const int> life_ = std::make_shared<const int>(0);
  std::shared_ptr<mla::detail::LatentCore> core_;
  at::Tensor no_rope_;  // SFA C8 + PROLOG_V3: the empty kr_cache
  std::optional<IndexerWeights> iw_;
  std::shared_ptr<detail::IndexerWorkspace> iws_;  // the indexer's intermediates, shared by the layers of one shape
  std::unique_ptr<detail::OffloadLayer> offload_;  // ImplConfig::offload
  ops::LightningIndexerArgs li_args_;              // kept between calls: a steady-state call assigns nothing new
  ops::SparseFlashAttentionArgs sfa_args_;
  ops::SparseFlashAttentionArgs dcp_sfa_args_;
  std::shared_ptr<cp::DcpWorkspace> dcp_ws_;  // DCP intermediates, shared by the layers of one shape
  // PCP decode-only (docs/design/sparse_cp.md §11.2): the PCP merge workspace of this rank's (rows, H, L + 1)
  // fp32 wire [out | LSE] and its all-gather (cp::pcp_wire_views; shared by the layers of one shape).
  std::shared_ptr<cp::DcpWorkspace> pcp_wire_ws_;
  // The token-block merges of DSA-CP x DCP and PCP (and PCP x DCP's head merge): merge-only DCP
  // workspaces, shared by the layers of one shape (docs/design/sparse_cp.md §9, §11).
  std::shared_ptr<cp::DcpWorkspace> merge_ws_, merge_ws2_;
  // DSA-CP x DCP and PCP: the merged rows, in the decode workspace (see impl.cpp).
  at::Tensor& merged_rows_(int64_t rows, at::ScalarType dtype);
  const cp::DcpViews& merge_views_(std::shared_ptr<cp::DcpWorkspace>& slot, cp::Comm& comm, int64_t heads,
                                   int64_t rows, at::ScalarType dtype);
  std::unique_ptr<sparse::OProjFullWeight> oproj_full_;  // DSA-CP: the o_proj full-weight switch
  std::shared_ptr<sparse::detail::DsaCpWorkspace> cpws_;  // DSA-CP: the slice's buffers (shared by shape)
  at::Tensor hadamard_;  // LI C8: H_D / sqrt(D) in the weights' dtype
  TopkSource last_topk_ = TopkSource::None;
  PreprocessChoice choice_;
  Preprocess last_pre_ = Preprocess::Native;
  at::Tensor last_topk_rows_;
  struct Seen {
    ::aar::detail::TensorBinding nope_src, rope_src, idx_src, scale_src, packed_src, cos_src, sin_src, slots_src;
    // the SFA kernel's cache views; the indexer k cache as (rows, D_i), its
    // scale cache as (rows, 1); the packed cache as (rows, 656); the step's
    // RoPE rows as (tk, 1, 1, R) and slots as (tk, 1) for the indexer
    at::Tensor nope, rope, idx_rows, scale_rows, packed_rows, cos4, sin4, slots2;
    // DCP: the merged heads (tk, H, L), token-major, in the decode workspace's attention buffer
    // (which the SFA kernels' own outputs leave unused)
    ::aar::detail::TensorBinding merged_src;
    at::Tensor merged, merged_rows;  // merged_rows: the same as (tk H, L), cp::combine_partials' destination
    // DSA-CP x DCP and PCP: the merge workspace's partials as (rows, N, L) / (rows, N, 1), and the merged
    // rows in the decode workspace's attention buffer as (1, rows N, L) and (rows, N, L) (same dtype only)
    // DSA-CP slice: the query's column blocks of the pack as (nloc, N, L) / (nloc, N, R); DSA-CP x DCP:
    // the gathered query's staged blocks as (tk, N, L) / (tk, N, R)
    ::aar::detail::TensorBinding pack_qn_src, pack_qr_src, staged_qn_src, staged_qr_src;
    at::Tensor pack_qn, pack_qr, staged_qn, staged_qr;
    // DSA-CP output: the slice's W_UV rows as (nloc, W, N V / W)
    ::aar::detail::TensorBinding y_road_src;
    at::Tensor y_road;
    // CP row writes (write_rows_): the latent and rope caches as (rows, L) / (rows, R) in nope / rope
    // (nope_src / rope_src), the slots and indexer slots as (n, 1); DSA-CP slice: the hidden rows
    // [xl_start, xl_start + nloc)
    ::aar::detail::TensorBinding wr_slots_src, wr_islots_src, xl_src;
    at::Tensor wr_slots, wr_islots, xl;
    // DSA-CP gathered writes (§15): the raw kv_a rows as (n, 1, 1, L + R), the step's RoPE rows as
    // (n, 1, 1, R), its slots (n) and the staged indexer rows (n, Di)
    ::aar::detail::TensorBinding gkv_src, gcos_src, gsin_src, gslots_src, gidx_src;
    at::Tensor gkv4, gcos4, gsin4, gslots, gidx;
    int64_t xl_start = -1;
    ::aar::detail::TensorBinding part_src, part_lse_src, cp_merged_src;
    at::Tensor part, part_lse, cp_merged, cp_merged3, cp_merged2;  // cp_merged2: (rows N, L)
    int64_t cp_merged_rows = -1;
  } seen_;
};

}  // namespace aar::sfa
