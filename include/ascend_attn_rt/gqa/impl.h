// Per-layer GQA/MHA attention (docs/design/gqa.md §4 and §4.6). `forward` does no
// host metadata work: it picks a path from the metadata, writes the KV cache
// and calls the operators.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ascend_attn_rt/kv_connector.h"
#include "ascend_attn_rt/detail/tensor_binding.h"
#include "ascend_attn_rt/gqa/metadata.h"
#include "ascend_attn_rt/ops/fused_infer_attention.h"
#include "ascend_attn_rt/ops/paged_attention.h"
#include "ascend_attn_rt/plan/workspace.h"

namespace aar::graph {
class GraphParams;
}

namespace aar::gqa {

// The layer's attention type (vLLM's AttentionType). It decides causality and
// whether the layer has a KV cache; the metadata's `causal` must agree:
//   Decoder       causal; a paged KV cache.
//   EncoderOnly   bidirectional (an encoder-only model, e.g. a pooling
//                 model's layers); with a KV cache the new K/V are written and
//                 read back (chunked encoder prefill), without one the layer
//                 attends each request's own tokens (every request new).
//   Encoder       bidirectional, no KV cache (the encoder of an encoder-decoder
//                 model): each request's own tokens; caches are rejected.
//   EncoderDecoder (cross-attention): not supported, rejected.
enum class AttnType : int32_t { Decoder = 0, EncoderOnly = 1, Encoder = 2, EncoderDecoder = 3 };
const char* to_string(AttnType t);
// Shared by the backends on GQA metadata: rejects metadata whose causality
// differs from the layer's type, and caches given to an Encoder layer.
void check_attn_type(AttnType t, const Metadata& md, bool has_cache);
// Rejects metadata with cached context for paths that attend only the step's
// new tokens; `what` names the path.
void check_own_tokens(const Metadata& md, const char* what);

struct ImplConfig {
  int64_t num_heads = 0;
  int64_t head_size = 0;
  double scale = 0.0;                       // 0 = 1/sqrt(head_size)
  int64_t num_kv_heads = 0;                 // 0 = num_heads
  // vLLM semantics: a query at position p attends keys in (p - W, p], W keys.
  std::optional<int64_t> sliding_window;
  std::optional<at::Tensor> sinks;          // (num_heads,) learnable sinks -> FIA v2
  bool has_alibi_slopes = false;            // not supported: rejected
  std::optional<double> logits_soft_cap;    // not supported when > 0: rejected
  std::string kv_cache_dtype = "auto";      // only "auto" (INT8 is the C8 backend)
  AttnType attn_type = AttnType::Decoder;
  bool kv_sharing = false;                  // shares another layer's cache: never writes
  // Paged-attention selection (docs/design/gqa.md §2.6) and device generation.
  plan::DeviceKind device_kind = plan::DeviceKind::A2;
  bool has_speculative_config = false;
  bool full_decode_only_graph = false;
  std::vector<int32_t> pa_shape_list;
  // Graph mode: the layer's index orders its captured calls (updates run in layer
  // order); the KV-cache group selects which metadata refreshes them.
  int64_t layer_index = -1;
  int32_t kv_cache_group = 0;
};

// Which kernel path a forward took (for tests and tracing).
enum class ForwardPath : int32_t {
  None = 0,          // metadata absent: zero output
  FusedPaged = 1,    // FIA v1 over the paged cache
  FusedDense = 2,    // FIA v1 over the new K/V (PrefillNoCache)
  FusedSinks = 3,    // FIA v2 with learnable sinks
  PagedAttention = 4,
  Encoder = 5,       // npu_fusion_attention, bidirectional, dense
  FusedSplit = 6,    // A5 chunked-prefill split into decode + prefill calls
  LargeHead = 7,     // D=512 fallback through npu_fusion_attention
};
const char* to_string(ForwardPath p);

// Thread safety: one thread at a time per layer (forward binds the caches and records
// last_path). Layers share no workspace: layers of different engines may run forward
// concurrently, each over its own caches and output. An open graph capture belongs to the
// thread that began it (graph_params.h). (tests/cpp/test_concurrency.cpp)
class AttentionImpl {
 public:
  // KV-connector hooks of this layer (kv_connector.h); none by default.
  KvHooks kv_hooks;

  explicit AttentionImpl(const ImplConfig& cfg);

  // query (T, N, D); key/value (T, Nkv, D) or absent (no cache write);
  // key_cache/value_cache (num_blocks, block_size, Nkv, D), contiguous (the
  // kernels' layout, Backend::kv_cache_stride_order; any storage offset; other
  // strides are rejected by name before any write), or undefined tensors
  // for encoder-only layers without a cache; output (T, N, D), written in rows
  // [0, metadata.num_kernel_tokens) only. metadata == nullptr (profiling run)
  // zero-fills the output. Returns output. While a graph capture is open on this
  // thread (graph::GraphParams::begin_capture), the calls are recorded into that
  // graph instead of running eagerly (docs/design/graph.md §1.1, §4.1).
  const at::Tensor& forward(const at::Tensor& query, const std::optional<at::Tensor>& key,
                            const std::optional<at::Tensor>& value, const at::Tensor& key_cache,
                            const at::Tensor& value_cache, const Metadata* metadata, const at::Tensor& output);

  const ImplConfig& config() const { return cfg_; }
  ForwardPath last_path() const { return last_path_; }

 private:
  void write_kv(const at::Tensor& key, const at::Tensor& value, const Metadata& md);
  void validate(const at::Tensor& query, const std::optional<at::Tensor>& key,
                const std::optional<at::Tensor>& value, const at::Tensor& key_cache,
                const at::Tensor& value_cache, const Metadata& md, const at::Tensor& output) const;
  ForwardPath choose_path(const Metadata& md, int64_t num_tokens, bool has_cache) const;
  // Operator arguments of each path, shared by the eager and the capture paths.
  at::Tensor fill_paged(const Metadata& md, const at::Tensor& query, const at::Tensor& output,
                        ops::PagedAttentionArgs& a) const;
  void fill_fia(const Metadata& md, const at::Tensor& q, const std::optional<at::Tensor>& key,
                const std::optional<at::Tensor>& value, bool dense, ops::FiaTensors& t, ops::FiaParams& p) const;
  void fill_fia_v2(const Metadata& md, const at::Tensor& q, const std::optional<at::Tensor>& key,
                   const std::optional<at::Tensor>& value, bool dense, ops::FiaV2Tensors& t,
                   ops::FiaV2Params& p) const;
  void capture(graph::GraphParams& g, ForwardPath path, const Metadata& md, const at::Tensor& query,
               const std::optional<at::Tensor>& key, const std::optional<at::Tensor>& value,
               const at::Tensor& output);

  ImplConfig cfg_;
  std::optional<at::Tensor> sinks_fp32_;
  // Caches are bound on first use; the 3-D (nb, bs, Nkv*D) views the fused
  // kernel takes are made once per binding, not per call, and remade when the
  // caller's tensor is another one or describes other memory (set_, resize_).
  detail::BoundNdCaches caches_;
  at::Tensor lse_placeholder_;
  at::Tensor large_head_mask_;  // bool copy of the compressed mask (npu_fusion_attention)
  ForwardPath last_path_ = ForwardPath::None;
};

}  // namespace aar::gqa
