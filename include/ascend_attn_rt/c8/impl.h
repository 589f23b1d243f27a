// Per-layer C8 attention (static INT8 KV cache, docs/design/gqa.md §5): quantises the
// new K/V, writes them into the NZ int8 cache, and attends through the fused
// kernel with antiquant scales (decode) or over dequantised context (prefill).
// Metadata comes from the GQA builder (gqa::MetadataBuilder / gqa::Metadata).
//
// Decision table (upstream's, docs/design/gqa.md §5.4, with its "returns None" cells made correct):
//   metadata absent                         -> zero output
//   kv_transfer Producer                    -> the float GQA path (a producer's
//                                              cache is float), any state; its
//                                              scales are validated, not kept
//   pooling and non-causal                  -> encoder (dense, float K/V)
//   DecodeOnly, one token per request       -> c8_decode: FIA BNSD, int8 NZ
//                                              cache, antiquant scale/offset
//   ChunkedPrefill with 1-token decodes     -> c8_chunked_split: decodes as
//     and prefills                             c8_decode, prefills as below
//   PrefillNoCache with key/value           -> fused_dense: FIA TND over the
//                                              float new K/V
//   anything else                           -> c8_dequant: FIA TND over the
//                                              context dequantised from the
//                                              cache + the float new tokens
// Consumers (kv_transfer Consumer) take the same rows as kv_transfer None
// (upstream returns None for their non-decode states). Prefill paths attend
// the new tokens at full precision (upstream re-reads them through INT8 when
// there is cached context, docs/design/gqa.md §5.4); all dequantisation applies the offset.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>

#include "ascend_attn_rt/kv_connector.h"
#include "ascend_attn_rt/c8/scales.h"
#include "ascend_attn_rt/detail/tensor_binding.h"
#include "ascend_attn_rt/gqa/impl.h"
#include "ascend_attn_rt/gqa/metadata.h"
#include "ascend_attn_rt/ops/fused_infer_attention.h"
#include "ascend_attn_rt/plan/workspace.h"

namespace aar::graph {
class GraphParams;
}

namespace aar::c8 {

enum class KvTransferRole : int32_t { None = 0, Producer = 1, Consumer = 2 };

struct ImplConfig {
  int64_t num_heads = 0;
  int64_t head_size = 0;  // multiple of 32 (NZ)
  double scale = 0.0;     // 0 = 1/sqrt(head_size)
  int64_t num_kv_heads = 0;
  std::optional<int64_t> sliding_window;  // not supported: rejected
  bool has_sinks = false;                 // not supported: rejected
  bool has_alibi_slopes = false;          // not supported: rejected
  std::optional<double> logits_soft_cap;  // not supported when > 0: rejected
  gqa::AttnType attn_type = gqa::AttnType::Decoder;
  bool kv_sharing = false;
  KvTransferRole kv_transfer = KvTransferRole::None;
  plan::DeviceKind device_kind = plan::DeviceKind::A2;
  int64_t tp_rank = 0, tp_size = 1;
  RawScales scales;
  // Graph mode (see gqa::ImplConfig): capture ordering and metadata group.
  int64_t layer_index = -1;
  int32_t kv_cache_group = 0;
};

enum class ForwardPath : int32_t {
  None = 0,
  C8Decode = 1,
  C8ChunkedSplit = 2,
  FusedDense = 3,
  C8Dequant = 4,
  Encoder = 5,
  Float = 6,  // producer: the GQA float path
};
const char* to_string(ForwardPath p);

// The decode call exactly as forward makes it: what a graph capture records and
// a replay updates (block_table, actual_seq_lengths_kv). The length list points
// into the metadata (valid until the builder's next build).
struct DecodeCall {
  ops::FiaTensors tensors;
  ops::FiaParams params;
  at::Tensor output;  // (B, N, 1, D) view of the layer output rows [0, B)
};

// Thread safety: as gqa::AttentionImpl: one thread at a time per layer; layers share no
// workspace.
class AttentionImpl {
 public:
  // KV-connector hooks of this layer (kv_connector.h); none by default.
  KvHooks kv_hooks;

  explicit AttentionImpl(const ImplConfig& cfg);

  // query (T, N, D) float; key/value (T, Nkv, D) of the query dtype, or absent;
  // key_cache/value_cache int8 NZ (nb, Nkv, D/32, bs, 32) or the declared ND
  // shape (nb, bs, Nkv, D) with NZ bytes, contiguous either way (for a
  // Producer: float ND caches as in GQA); undefined for cache-less encoder
  // layers. Rows [0, num_actual_tokens) of output are written (the padded tail
  // is left as is). Returns output.
  const at::Tensor& forward(const at::Tensor& query, const std::optional<at::Tensor>& key,
                            const std::optional<at::Tensor>& value, const at::Tensor& key_cache,
                            const at::Tensor& value_cache, const gqa::Metadata* metadata, const at::Tensor& output);

  // The FIA arguments of the C8 decode call for the first `num_decodes`
  // requests of `md` (one token each), over the bound caches. Throws if no
  // cache has been bound yet (forward binds them).
  DecodeCall decode_call(const at::Tensor& query, const gqa::Metadata& md, int64_t num_decodes,
                         const at::Tensor& output);

  const ImplConfig& config() const { return cfg_; }
  const Scales& scales() const { return scales_; }
  ForwardPath last_path() const { return last_path_; }

 private:
  void validate(const at::Tensor& query, const std::optional<at::Tensor>& key,
                const std::optional<at::Tensor>& value, const at::Tensor& key_cache,
                const at::Tensor& value_cache, const gqa::Metadata& md, const at::Tensor& output) const;
  ForwardPath choose_path(const gqa::Metadata& md, bool has_key, bool has_cache) const;
  void bind_caches(const at::Tensor& key_cache, const at::Tensor& value_cache);
  // Graph capture of a DecodeOnly batch: the quantise + NZ write as a Prepare
  // call, the BNSD decode as a fused call refreshed per step (block table, KV
  // lengths). Other states are not capturable (NotSupported).
  void capture(graph::GraphParams& g, ForwardPath path, const gqa::Metadata& md, const at::Tensor& query,
               const std::optional<at::Tensor>& key, const std::optional<at::Tensor>& value,
               const at::Tensor& output);
  void write_kv(const at::Tensor& key, const at::Tensor& value, const gqa::Metadata& md);
  void run_decode(const at::Tensor& query, const gqa::Metadata& md, int64_t num_decodes, const at::Tensor& output);
  // Every real request, or (prefill_part) the requests after the decodes,
  // over dense K/V: the float new tokens when no request has context, else the
  // dequantised paged context (the build's dense context slots) with the new
  // tokens' rows replaced by their float values (when given).
  void run_prefill(const at::Tensor& query, const std::optional<at::Tensor>& key,
                   const std::optional<at::Tensor>& value, const gqa::Metadata& md, bool prefill_part,
                   const at::Tensor& output);

  ImplConfig cfg_;
  Scales scales_;
  std::optional<gqa::AttentionImpl> float_impl_;  // Producer role
  // The caches last bound (held) and their 5-D NZ views.
  detail::TensorBinding bound_key_, bound_value_;
  at::Tensor key_nz_, value_nz_;
  at::Tensor lse_placeholder_;
  ForwardPath last_path_ = ForwardPath::None;
};

}  // namespace aar::c8
