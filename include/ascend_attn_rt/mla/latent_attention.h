// MLA attention without the projections (docs/design/mla.md §5.3, §5.5, §5.6), for
// engines whose model code does the projections itself, as vLLM's
// MLAAttention layer does: it applies RoPE, absorbs W_UK into the decode query
// (ql_nope = q_nope W_UK_T) and applies W_UV to the decode's latent output;
// the attention backend writes the cache rows, attends and returns.
//
//  * write_kv: the step's normalised latent kv_c (T, L) and rotated k_pe
//    (T, R) into the two paged caches at a slot mapping (npu_scatter_pa_kv_cache,
//    negative slots skipped);
//  * decode: the absorbed query [ql_nope | q_pe] over the latent cache through
//    FIA v2 (the same call and layouts as mla::Impl's decode: BNSD, or TND_NTD
//    with a speculative config), heads zero-padded to a power of two in the
//    decode workspace shared with mla::Impl layers of the same shape; the
//    latent output (B, H, L), token-major;
//  * prefill: the un-absorbed attention of the prefill tokens' q (tp, H, P+R)
//    against their own keys (kv_b_proj of kv_c, k_pe) causally and against the
//    cached context, chunk by chunk (gathered, up-projected, merged by LSE):
//    (tp, H*V). The same code as mla::Impl's prefill (cpp/mla/latent_ops.h).
//
// The metadata is mla::MetadataBuilder's; its RoPE rows are not read. DCP
// (docs/design/mla.md §5.8, §6): with a dcp_comm over the DCP group and metadata
// built for the same DCP rank and size, the caches are this rank's shard, the
// decode gathers [ql_nope | q_pe] over the group, attends the shard and merges
// the partials by LSE into this rank's heads (the caller merges nothing), the
// prefill gathers its cached context over the group. Not supported (each raises
// naming it): metadata built for PCP, graph decode padding
// (decode.num_kernel_tokens != num_decode_tokens), NZ caches, the int8 FA-quant
// cache, graph capture of the prefill and of a profiling run.
// Inside a graph capture write_kv records one prepare call over its tensors and
// forward_decode (a decode-only batch of the bucket's tokens) a prepare call, the
// latent attention as a fused call refreshed per update, and a prepare call
// (docs/design/mla.md §5.8; under DCP: the query gather, the shard's call, the
// exchange and merge). Thread safety as mla::Impl.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <utility>

#include "ascend_attn_rt/mla/metadata.h"

namespace aar::mla::detail {
class DecodeWorkspace;
}
namespace aar::cp {
class Comm;
class DcpWorkspace;
}

namespace aar::mla {

struct LatentAttentionConfig {
  int64_t num_heads = 0;
  int64_t kv_lora_rank = 512;     // L
  int64_t qk_nope_head_dim = 128; // P
  int64_t qk_rope_head_dim = 64;  // R
  int64_t v_head_dim = 128;       // V
  double scale = 0.0;             // 0 = 1/sqrt(P+R)
  std::optional<bool> prefill_in_bf16;  // see ImplConfig::prefill_in_bf16
  int64_t workspace_group = 0;          // see ImplConfig::workspace_group
  // The DCP group (not owned; outlives the layer), for metadata built with dcp_world_size > 1.
  cp::Comm* dcp_comm = nullptr;
};

class LatentAttention {
 public:
  explicit LatentAttention(const LatentAttentionConfig& cfg);
  ~LatentAttention();

  const LatentAttentionConfig& config() const { return cfg_; }
  int64_t num_heads_padded() const { return hp_; }

  // One buffer (num_blocks, block_size, L + R) (vLLM's MLA cache, contiguous)
  // viewed as the two caches the kernels read: its first num_blocks*block_size*L
  // elements as the latent cache (num_blocks, block_size, 1, L), the rest as the
  // rope cache (num_blocks, block_size, 1, R). Both alias the buffer.
  static std::pair<at::Tensor, at::Tensor> split_kv_cache(const at::Tensor& kv_cache, int64_t kv_lora_rank);

  // kv_c (T, L) and k_pe (T, R) or (T, 1, R) rows r < slot_mapping.numel() into
  // the caches at slot_mapping[r] (int64 or int32; negative: not written).
  // Everything is checked before the first write.
  void write_kv(const at::Tensor& kv_c, const at::Tensor& k_pe, const at::Tensor& slot_mapping,
                const at::Tensor& nope_cache, const at::Tensor& rope_cache) const;

  // Both forwards take their arguments in the backend contract's order
  // (core/backend.h: activations, caches, metadata, output, extras); md ==
  // nullptr is a profiling run: out is zero-filled (refused inside a graph
  // capture, as forward_prefill always is).

  // The decode tokens (the first md->num_decode_tokens of the step): ql_nope
  // (B, H, L) and q_pe (B, H, R), any strides; out (B, H, L), contiguous,
  // gets the latent attention output. The caches must hold the step's rows.
  void forward_decode(const at::Tensor& ql_nope, const at::Tensor& q_pe, const at::Tensor& nope_cache,
                      const at::Tensor& rope_cache, const Metadata* md, const at::Tensor& out);

  // The prefill tokens (the md->num_prefill_tokens after the decodes): q
  // (tp, H, P+R), kv_c (tp, L), k_pe (tp, R) or (tp, 1, R); out (tp, H*V) (any
  // row-major rows: a row slice of a larger output is fine) gets the attention
  // output; kv_b_proj (H*(P+V), L) in the activations' dtype.
  void forward_prefill(const at::Tensor& q, const at::Tensor& kv_c, const at::Tensor& k_pe,
                       const at::Tensor& nope_cache, const at::Tensor& rope_cache, const Metadata* md,
                       const at::Tensor& out, const at::Tensor& kv_b_proj) const;

 private:
  void check_step(const Metadata& md, const at::Tensor& nope, const at::Tensor& rope, at::ScalarType dtype,
                  c10::Device device, const char* what) const;

  LatentAttentionConfig cfg_;
  int64_t hp_ = 0;
  void forward_decode_dcp(const at::Tensor& ql_nope, const at::Tensor& q_pe, const at::Tensor& nope,
                          const at::Tensor& rope, const Metadata& md, const at::Tensor& out);

  std::shared_ptr<detail::DecodeWorkspace> ws_;
  std::shared_ptr<cp::DcpWorkspace> dcp_ws_;  // the DCP decode's intermediates, shared by layers of one shape
  at::Tensor lse_;  // FIA's LSE output, not requested (one element)
};

}  // namespace aar::mla
