// Internal: the SFA caches' checks (docs/design/sfa.md §2.2), shared by sfa::Impl and the
// engine-side pieces (sfa::IndexerStep, sfa::SparseAttention, docs/design/sfa.md §4.5).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

#include "../common/kv_cache.h"
#include "ascend_attn_rt/errors.h"
#include "ascend_attn_rt/sfa/metadata.h"

namespace aar::sfa::detail {

// The layout every SFA cache is read in (contiguous, docs/design/sfa.md §2.2).
constexpr const char* kCacheLayout = "(num_blocks, block_size, 1, head_dim)";

inline bool is_one_byte_cache_dtype(at::ScalarType t) {
  return t == at::kChar || t == at::kFloat8_e4m3fn || t == at::kFloat8_e5m2;
}

// One cache: (num_blocks >= the metadata's (x replicas), block_size, 1, width) in `dtype` (what
// `dtype_is` says it must be), on `device` (what `device_is` names), contiguous.
inline void check_cache(const at::Tensor& c, const char* name, int64_t width, const Metadata& md, at::ScalarType dtype,
                        const char* dtype_is, c10::Device device, int64_t replicas = 1,
                        const char* device_is = "the layer's weights") {
  AAR_CHECK_ARG(c.defined() && c.dim() == 4 && c.size(1) == md.block_size && c.size(2) == 1 && c.size(3) == width,
                name, " must have shape (num_blocks, block_size=", md.block_size, ", 1, ", width, "), got ",
                c.defined() ? c.sizes() : c10::IntArrayRef{});
  AAR_CHECK_ARG(c.size(0) >= md.num_blocks * replicas, name, " has ", c.size(0), " blocks, fewer than the metadata's ",
                md.num_blocks, replicas > 1 ? " x dcp_world_size=" : "", replicas > 1 ? std::to_string(replicas) : "",
                replicas > 1 ? " (the indexer cache is replicated over the DCP group, docs/design/sparse_cp.md §2)" : "");
  AAR_CHECK_ARG(c.scalar_type() == dtype, name, " dtype ", c.scalar_type(), " is not ", dtype, " (", dtype_is, ")",
                is_one_byte_cache_dtype(c.scalar_type()) != is_one_byte_cache_dtype(dtype)
                    ? (is_one_byte_cache_dtype(c.scalar_type()) ? "; a quantised cache: the layer's C8 flag for it is off"
                                                         : "; the layer's C8 flag for it is on: it takes the quantised "
                                                           "cache")
                    : "");
  AAR_CHECK_ARG(c.device() == device, name, " is on ", c.device(), " but ", device_is, " are on ", device);
  ::aar::detail::check_kv_cache_layout(c, name, kCacheLayout);
}

}  // namespace aar::sfa::detail
