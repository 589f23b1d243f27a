// C8 (static INT8 KV cache) scales and offsets (docs/design/gqa.md §5.2): per-channel,
// per-KV-head K/V scales and offsets, with tensor-parallel shard selection.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace aar::c8 {

// The four checkpoint parameters of a C8 layer (k_cache_scale, k_cache_offset,
// v_cache_scale, v_cache_offset), any shape; only their flat contents count:
//   1 element             -> per-tensor, broadcast to every head and channel
//                            (upstream keeps a scalar, which breaks its
//                            (Nkv, 1, D) antiquant view; we broadcast)
//   num_kv_heads*D        -> this rank's heads already
//   Nkv_total*D (other)   -> all heads; the TP shard [start, start + Nkv) is
//                            taken, start = tp_rank * Nkv_total / tp_size (with
//                            Nkv_total < tp_size a KV head is replicated).
struct RawScales {
  at::Tensor k_scale, k_offset, v_scale, v_offset;
};

// Prepared once per layer; every tensor is fp32 (1, Nkv, D) on the raw
// scales' device, so quantisation and dequantisation share one set of values.
struct Scales {
  at::Tensor k_scale, k_offset, v_scale, v_offset;
  at::Tensor k_inv_scale, v_inv_scale;
  // FIA antiquant arguments (per-channel, BNSD): (Nkv, 1, D). The kernel
  // computes (x + offset) * scale, so the offset it gets is -offset.
  at::Tensor k_antiquant_scale, v_antiquant_scale;
  at::Tensor k_antiquant_offset, v_antiquant_offset;
  bool has_offset = false;  // any non-zero offset (asymmetric); else the kernel gets no offset
  int64_t num_kv_heads = 0, head_size = 0;

  Scales to(c10::Device device) const;
};

// Validates (floating dtype, finite, non-zero scale, a size that matches one
// of the cases above, tp_rank in [0, tp_size), the head split consistent with
// num_kv_heads) and prepares. Errors are InvalidArgument naming the argument.
Scales prepare_scales(const RawScales& raw, int64_t num_kv_heads, int64_t head_size, int64_t tp_rank = 0,
                      int64_t tp_size = 1);

}  // namespace aar::c8
