#include "ascend_attn_rt/gqa/backend.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include "../common/kv_cache.h"
#include "ascend_attn_rt/errors.h"

namespace aar::gqa {

const char* Backend::name() { return "CUSTOM"; }

const std::vector<int64_t>& Backend::supported_block_sizes() {
  static const std::vector<int64_t> sizes{16, 32, 64, 128};
  return sizes;
}

bool Backend::is_supported_block_size(int64_t block_size) {
  for (int64_t s : supported_block_sizes()) {
    if (s == block_size) return true;
  }
  return false;
}

std::vector<int64_t> Backend::kv_cache_shape(int64_t num_blocks, int64_t block_size, int64_t num_kv_heads,
                                             int64_t head_size) {
  AAR_CHECK_ARG(num_blocks > 0, "num_blocks must be positive, got ", num_blocks);
  AAR_CHECK_ARG(block_size > 0, "block_size must be positive, got ", block_size);
  AAR_CHECK_ARG(num_kv_heads > 0, "num_kv_heads must be positive, got ", num_kv_heads);
  AAR_CHECK_ARG(head_size > 0, "head_size must be positive, got ", head_size);
  return {2, num_blocks, block_size, num_kv_heads, head_size};
}

std::vector<int64_t> Backend::kv_cache_stride_order(bool include_num_layers_dimension) {
  return detail::identity_stride_order(5, include_num_layers_dimension);
}

namespace {

// Returns (src, dst) index columns as int64 on `device`, after checking shape
// and range against `num_blocks`.
std::pair<at::Tensor, at::Tensor> block_pairs(const at::Tensor& pairs, int64_t num_src_blocks,
                                              int64_t num_dst_blocks, const char* arg, c10::Device device) {
  AAR_CHECK_ARG(pairs.defined(), arg, " must be a tensor");
  AAR_CHECK_ARG(pairs.dim() == 2 && pairs.size(1) == 2, arg, " must have shape (M, 2), got ", pairs.sizes());
  AAR_CHECK_ARG(!at::isFloatingType(pairs.scalar_type()) && pairs.scalar_type() != at::kBool, arg,
                " must be an integer tensor, got ", pairs.scalar_type());
  at::Tensor p = pairs.to(at::kCPU, at::kLong).contiguous();
  const int64_t* d = p.data_ptr<int64_t>();
  for (int64_t i = 0; i < p.size(0); ++i) {
    AAR_CHECK_ARG(d[2 * i] >= 0 && d[2 * i] < num_src_blocks, arg, "[", i, "][0]=", d[2 * i],
                  " is out of range [0, ", num_src_blocks, ")");
    AAR_CHECK_ARG(d[2 * i + 1] >= 0 && d[2 * i + 1] < num_dst_blocks, arg, "[", i, "][1]=", d[2 * i + 1],
                  " is out of range [0, ", num_dst_blocks, ")");
  }
  return {p.select(1, 0).to(device), p.select(1, 1).to(device)};
}

void check_cache_pair(const at::Tensor& k, const at::Tensor& v, const char* name) {
  AAR_CHECK_ARG(k.defined() && v.defined(), name, " must hold two defined tensors");
  AAR_CHECK_ARG(k.dim() >= 1 && v.dim() >= 1 && k.size(0) == v.size(0), name,
                ": key and value caches must have the same number of blocks, got ", k.sizes(), " and ",
                v.sizes());
}

}  // namespace

void Backend::swap_blocks(const at::Tensor& src_key_cache, const at::Tensor& src_value_cache,
                          at::Tensor& dst_key_cache, at::Tensor& dst_value_cache, const at::Tensor& src_to_dst) {
  check_cache_pair(src_key_cache, src_value_cache, "src_kv_cache");
  check_cache_pair(dst_key_cache, dst_value_cache, "dst_kv_cache");
  AAR_CHECK_ARG(src_key_cache.sizes().slice(1) == dst_key_cache.sizes().slice(1), "dst_kv_cache",
                ": block shape ", dst_key_cache.sizes(), " differs from the source ", src_key_cache.sizes());
  auto [src, dst] = block_pairs(src_to_dst, src_key_cache.size(0), dst_key_cache.size(0), "src_to_dst",
                                dst_key_cache.device());
  c10::AutoGradMode no_grad(false);
  // Gather before scatter, moved to the destination key cache's device.
  at::Tensor k = src_key_cache.index_select(0, src.to(src_key_cache.device())).to(dst_key_cache.device());
  at::Tensor v = src_value_cache.index_select(0, src.to(src_value_cache.device())).to(dst_key_cache.device());
  dst_key_cache.index_copy_(0, dst, k);
  dst_value_cache.index_copy_(0, dst.to(dst_value_cache.device()), v.to(dst_value_cache.device()));
}

void Backend::copy_blocks(const std::vector<std::pair<at::Tensor, at::Tensor>>& kv_caches,
                          const at::Tensor& src_to_dsts) {
  // Validate every layer before touching any.
  std::vector<std::pair<at::Tensor, at::Tensor>> idx;
  idx.reserve(kv_caches.size());
  for (const auto& [k, v] : kv_caches) {
    check_cache_pair(k, v, "kv_caches");
    idx.push_back(block_pairs(src_to_dsts, k.size(0), k.size(0), "src_to_dsts", k.device()));
  }
  c10::AutoGradMode no_grad(false);
  for (size_t i = 0; i < kv_caches.size(); ++i) {
    at::Tensor k = kv_caches[i].first;
    at::Tensor v = kv_caches[i].second;
    const auto& [src, dst] = idx[i];
    at::Tensor kg = k.index_select(0, src);
    at::Tensor vg = v.index_select(0, src.to(v.device()));
    k.index_copy_(0, dst, kg);
    v.index_copy_(0, dst.to(v.device()), vg);
  }
}

}  // namespace aar::gqa
