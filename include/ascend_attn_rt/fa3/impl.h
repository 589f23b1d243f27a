// Per-layer FA3-style attention (docs/design/gqa.md §6): K/V are always read from the
// paged cache (written first), in up to two fused-kernel calls: the decodes,
// then the prefills. Runs through FIA over the paged cache (the operator this
// runtime has for flash_attn_with_kvcache's semantics). Metadata from the GQA
// builder.
//
// Upstream slicing quirks fixed here (docs/design/gqa.md §6), each covered by a test:
//  * the prefill block table is sliced by requests ([nd:]), not by decode
//    tokens ([ndt:]);
//  * the prefill part's cumulative query lengths are rebased to 0;
//  * decodes are causal (bottom-right), which matters for multi-token
//    speculative decodes;
//  * the impl's softmax scale is forwarded (upstream uses 1/sqrt(D)).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <string>

#include "ascend_attn_rt/kv_connector.h"
#include "ascend_attn_rt/detail/tensor_binding.h"
#include "ascend_attn_rt/gqa/impl.h"
#include "ascend_attn_rt/gqa/metadata.h"

namespace aar::fa3 {

struct ImplConfig {
  int64_t num_heads = 0;
  int64_t head_size = 0;
  double scale = 0.0;  // 0 = 1/sqrt(head_size)
  int64_t num_kv_heads = 0;
  std::optional<int64_t> sliding_window;  // rejected (upstream ValueError)
  bool has_sinks = false;                 // rejected
  bool has_alibi_slopes = false;          // rejected
  std::optional<double> logits_soft_cap;  // rejected when > 0
  std::string kv_cache_dtype = "auto";    // only "auto"
  gqa::AttnType attn_type = gqa::AttnType::Decoder;
  bool kv_sharing = false;
  // Graph-mode restriction: FULL_DECODE_ONLY graphs need enforce_eager.
  bool enforce_eager = true;
  bool full_decode_only_graph = false;
};

enum class ForwardPath : int32_t {
  None = 0,
  Paged = 1,    // one or two FIA calls over the paged cache
  Encoder = 2,  // pooling, non-causal: the GQA encoder path (dense)
};
const char* to_string(ForwardPath p);

// Thread safety: as gqa::AttentionImpl: one thread at a time per layer; layers share no
// workspace.
class AttentionImpl {
 public:
  // KV-connector hooks of this layer (kv_connector.h); none by default.
  KvHooks kv_hooks;

  explicit AttentionImpl(const ImplConfig& cfg);

  // As gqa::AttentionImpl::forward: query (T, N, D), key/value (T, Nkv, D) or
  // absent, caches (nb, 128, Nkv, D), contiguous; rows [0, num_kernel_tokens)
  // written.
  const at::Tensor& forward(const at::Tensor& query, const std::optional<at::Tensor>& key,
                            const std::optional<at::Tensor>& value, const at::Tensor& key_cache,
                            const at::Tensor& value_cache, const gqa::Metadata* metadata, const at::Tensor& output);

  const ImplConfig& config() const { return cfg_; }
  ForwardPath last_path() const { return last_path_; }
  int32_t last_num_calls() const { return last_num_calls_; }  // kernel calls of the last forward (0-2)

 private:
  void validate(const at::Tensor& query, const std::optional<at::Tensor>& key,
                const std::optional<at::Tensor>& value, const at::Tensor& key_cache,
                const at::Tensor& value_cache, const gqa::Metadata& md, const at::Tensor& output) const;

  ImplConfig cfg_;
  gqa::AttentionImpl encoder_;  // pooling path (inherited upstream)
  // The caches last bound and their 3-D views (see gqa::AttentionImpl).
  detail::BoundNdCaches caches_;
  at::Tensor lse_placeholder_;
  ForwardPath last_path_ = ForwardPath::None;
  int32_t last_num_calls_ = 0;
};

}  // namespace aar::fa3
