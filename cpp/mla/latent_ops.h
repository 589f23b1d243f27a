// Internal: the latent attention calls shared by mla::Impl (hidden states in,
// projections inside) and mla::LatentAttention (the attention alone, for
// engines that project themselves, e.g. vLLM's MLAAttention):
//  * the cache checks (docs/design/mla.md §1: the latent and rope caches, ND or NZ);
//  * the FIA v2 arguments of the absorbed latent decode that depend on the
//    metadata alone (docs/design/mla.md §5.3 rows A, D, E: layout, mask, lengths);
//  * the un-absorbed prefill attention (docs/design/mla.md §5.5 / §5.6): the new tokens
//    causally, then each cached context chunk gathered from the caches,
//    up-projected by kv_b_proj, attended and merged by LSE (DCP: docs/design/mla.md §6.3; PCP:
//    docs/design/cp.md §11, the new tokens as head and tail chunks over every PCP rank's keys).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>

#include "ascend_attn_rt/mla/metadata.h"
#include "ascend_attn_rt/ops/fused_infer_attention.h"
#include "../latent/decode_workspace.h"

namespace aar::cp {
class Comm;
}

namespace aar::mla::detail {

// Assignments that skip the reference-count traffic when the tensor is already
// there (the decode's FIA arguments persist between calls).
inline void assign(at::Tensor& dst, const at::Tensor& src) {
  if (!dst.is_same(src)) dst = src;
}
inline void assign(std::optional<at::Tensor>& dst, const at::Tensor& src) {
  if (!dst.has_value() || !dst->is_same(src)) dst = src;
}

// docs/design/mla.md §5.3 rows A (speculative: TND), D (NZ caches: BSND), E (BNSD).
DecodeLayout decode_layout_of(const Metadata& md, bool kv_nz);

// Checks one of a layer's caches: nope (width L) or rope (width R), ND
// (nb, bs, 1, D) or, with `nz`, the 5-D NZ form; contiguous; at least the
// metadata's blocks; dtype `want` (`why` says where the dtype comes from).
void check_latent_cache(const at::Tensor& c, bool is_nope, int64_t width, const Metadata& md, bool nz,
                        at::ScalarType want, const char* why);

// The metadata's part of the latent decode's FIA v2 call: heads (padded),
// one KV head, scale, block size and table, KV lengths, and per layout the
// mask, sparse mode, layout string and query ends.
void set_latent_decode_params(const Metadata& md, DecodeLayout layout, int64_t heads_padded, double scale,
                              ops::FiaV2Tensors& t, ops::FiaV2Params& p);

// The latent call over this rank's KV shard under DCP / PCP (docs/design/mla.md §6.2): FIA v1
// BNSD over the queries qn (td, N, 1, L) / qr (td, N, 1, R) (N: the gathered heads), one KV
// head, the decode rows' block table and this rank's local KV lengths (one row per decode
// token), LSE returned. Shared by mla::Impl and mla::LatentAttention.
void set_latent_shard_params(const at::Tensor& qn, const at::Tensor& qr, const at::Tensor& nope_cache,
                             const at::Tensor& rope_cache, const Metadata& md, double scale, ops::FiaTensors& t,
                             ops::FiaParams& p);

// The prefill attention's fixed inputs.
struct PrefillSpec {
  int64_t heads = 0, heads_padded = 0;  // concatenated q/k when they differ (docs/design/mla.md §5.5)
  int64_t kv_lora_rank = 0, nope_dim = 0, rope_dim = 0, v_head_dim = 0;
  double scale = 0.0;
  at::Tensor kv_b_proj;                  // (H*(P+V), L): the context chunks' up-projection
  std::optional<double> kv_cache_scale;  // FA-quant: the int8 latent cache's dequant scale
  std::optional<bool> in_bf16;           // see ImplConfig::prefill_in_bf16
  cp::Comm* dcp_comm = nullptr;          // with metadata built for DCP
  cp::Comm* pcp_comm = nullptr;          // with metadata built for PCP
};

// The prefill tokens' attention (q_nope (tp, H, P), q_pe (tp, H, R), k_nope
// (tp, H, P), k_pe (tp, H, R), value (tp, H, V)) over themselves (causal) and
// their cached context chunks: (tp, H*V), new. With PCP metadata the queries are this
// rank's local prefill rows and the keys / values the restored prefill rows of every PCP
// rank (Wp * tp rows, padded-global order; docs/design/cp.md §11).
at::Tensor latent_prefill_attention(const PrefillSpec& s, const at::Tensor& q_nope, const at::Tensor& q_pe,
                                    const at::Tensor& k_nope, const at::Tensor& k_pe, const at::Tensor& value,
                                    const at::Tensor& nope_cache, const at::Tensor& rope_cache, const Metadata& md);

}  // namespace aar::mla::detail
