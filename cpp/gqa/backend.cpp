#include "ascend_attn_rt/gqa/backend.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <string>

#include "../common/kv_cache.h"
#include "ascend_attn_rt/errors.h"
#include "ascend_attn_rt/core/backend.h"

namespace aar::gqa {

const char* Backend::name() { return "CUSTOM"; }

const std::vector<int64_t>& Backend::supported_block_sizes() {
  static const std::vector<int64_t> sizes{16, 32, 64, 128};
  return sizes;
}

bool Backend::is_supported_block_size(int64_t block_size) {
  return core::has_block_size(supported_block_sizes(), block_size);
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

// The (M, 2) block pairs as host int64, with their largest source and
// destination ids, after checking shape, dtype and sign.
struct BlockPairs {
  at::Tensor host;  // (M, 2) int64, contiguous, CPU
  int64_t max_src = -1, max_dst = -1;
};

BlockPairs parse_block_pairs(const at::Tensor& pairs, const char* arg) {
  AAR_CHECK_ARG(pairs.defined(), arg, " must be a tensor");
  AAR_CHECK_ARG(pairs.dim() == 2 && pairs.size(1) == 2, arg, " must have shape (M, 2), got ", pairs.sizes());
  AAR_CHECK_ARG(!at::isFloatingType(pairs.scalar_type()) && !at::isComplexType(pairs.scalar_type()) &&
                    pairs.scalar_type() != at::kBool,
                arg, " must be an integer tensor, got ", pairs.scalar_type());
  BlockPairs b;
  b.host = pairs.to(at::kCPU, at::kLong).contiguous();
  const int64_t* d = b.host.data_ptr<int64_t>();
  for (int64_t i = 0; i < b.host.size(0); ++i) {
    AAR_CHECK_ARG(d[2 * i] >= 0, arg, "[", i, "][0]=", d[2 * i], " is negative");
    AAR_CHECK_ARG(d[2 * i + 1] >= 0, arg, "[", i, "][1]=", d[2 * i + 1], " is negative");
    b.max_src = std::max(b.max_src, d[2 * i]);
    b.max_dst = std::max(b.max_dst, d[2 * i + 1]);
  }
  return b;
}

// Every pair within [0, num_src_blocks) x [0, num_dst_blocks); `what` names the
// caches the bound comes from. The first bad pair is reported.
void check_block_range(const BlockPairs& b, int64_t num_src_blocks, int64_t num_dst_blocks, const char* arg,
                       const std::string& what) {
  if (b.max_src < num_src_blocks && b.max_dst < num_dst_blocks) return;
  const int64_t* d = b.host.data_ptr<int64_t>();
  for (int64_t i = 0; i < b.host.size(0); ++i) {
    AAR_CHECK_ARG(d[2 * i] < num_src_blocks, arg, "[", i, "][0]=", d[2 * i], " is out of range [0, ",
                  num_src_blocks, ") of ", what);
    AAR_CHECK_ARG(d[2 * i + 1] < num_dst_blocks, arg, "[", i, "][1]=", d[2 * i + 1], " is out of range [0, ",
                  num_dst_blocks, ") of ", what);
  }
}

// A (key, value) cache pair of one side or one layer: defined, at least one
// dimension, the same number of blocks and device, no overlapping elements.
void check_cache_pair(const at::Tensor& k, const at::Tensor& v, const std::string& kname, const std::string& vname) {
  AAR_CHECK_ARG(k.defined(), kname, " must be a tensor");
  AAR_CHECK_ARG(v.defined(), vname, " must be a tensor");
  AAR_CHECK_ARG(k.dim() >= 1, kname, " must have a block dimension, got shape ", k.sizes());
  AAR_CHECK_ARG(v.dim() >= 1, vname, " must have a block dimension, got shape ", v.sizes());
  AAR_CHECK_ARG(k.size(0) == v.size(0), vname, " has ", v.size(0), " blocks but ", kname, " has ", k.size(0),
                " (shapes ", v.sizes(), " and ", k.sizes(), ")");
  AAR_CHECK_ARG(k.device() == v.device(), vname, " is on ", v.device(), " but ", kname, " is on ", k.device());
  detail::check_non_overlapping(k, kname.c_str());
  detail::check_non_overlapping(v, vname.c_str());
}

// A destination cache can take the source's blocks: same block shape and dtype.
void check_same_blocks(const at::Tensor& src, const at::Tensor& dst, const char* sname, const char* dname) {
  AAR_CHECK_ARG(src.sizes().slice(1) == dst.sizes().slice(1), dname, " has block shape ", dst.sizes().slice(1),
                " (shape ", dst.sizes(), ") but ", sname, " has ", src.sizes().slice(1), " (shape ", src.sizes(),
                ")");
  AAR_CHECK_ARG(src.scalar_type() == dst.scalar_type(), dname, " dtype ", dst.scalar_type(), " differs from ", sname,
                " dtype ", src.scalar_type());
}

}  // namespace

void Backend::swap_blocks(const at::Tensor& src_key_cache, const at::Tensor& src_value_cache,
                          at::Tensor& dst_key_cache, at::Tensor& dst_value_cache, const at::Tensor& src_to_dst) {
  // Everything is checked before the first copy: a rejected call writes nothing.
  check_cache_pair(src_key_cache, src_value_cache, "src_key_cache", "src_value_cache");
  check_cache_pair(dst_key_cache, dst_value_cache, "dst_key_cache", "dst_value_cache");
  check_same_blocks(src_key_cache, dst_key_cache, "src_key_cache", "dst_key_cache");
  check_same_blocks(src_value_cache, dst_value_cache, "src_value_cache", "dst_value_cache");
  const BlockPairs pairs = parse_block_pairs(src_to_dst, "src_to_dst");
  check_block_range(pairs, src_key_cache.size(0), dst_key_cache.size(0), "src_to_dst",
                    "the source and destination caches");
  c10::AutoGradMode no_grad(false);
  const c10::Device sdev = src_key_cache.device(), ddev = dst_key_cache.device();
  const at::Tensor src = pairs.host.select(1, 0).to(sdev);
  const at::Tensor dst = pairs.host.select(1, 1).to(ddev);
  // Gather both before scattering either (a source may be the destination).
  const at::Tensor k = src_key_cache.index_select(0, src).to(ddev);
  const at::Tensor v = src_value_cache.index_select(0, src).to(ddev);
  dst_key_cache.index_copy_(0, dst, k);
  dst_value_cache.index_copy_(0, dst, v);
}

void Backend::copy_blocks(const std::vector<std::pair<at::Tensor, at::Tensor>>& kv_caches,
                          const at::Tensor& src_to_dsts) {
  // Validate every layer before touching any.
  const BlockPairs pairs = parse_block_pairs(src_to_dsts, "src_to_dsts");
  for (size_t i = 0; i < kv_caches.size(); ++i) {
    const auto& [k, v] = kv_caches[i];
    const std::string kname = "kv_caches[" + std::to_string(i) + "] key cache";
    const std::string vname = "kv_caches[" + std::to_string(i) + "] value cache";
    check_cache_pair(k, v, kname, vname);
    check_block_range(pairs, k.size(0), k.size(0), "src_to_dsts", kname);
  }
  c10::AutoGradMode no_grad(false);
  const at::Tensor src_host = pairs.host.select(1, 0), dst_host = pairs.host.select(1, 1);
  for (const auto& [key, value] : kv_caches) {
    at::Tensor k = key, v = value;
    const at::Tensor src = src_host.to(k.device()), dst = dst_host.to(k.device());
    const at::Tensor kg = k.index_select(0, src);
    const at::Tensor vg = v.index_select(0, src);
    k.index_copy_(0, dst, kg);
    v.index_copy_(0, dst, vg);
  }
}

core::BackendFacts Backend::facts() {
  core::BackendFacts f;
  f.id = "gqa";
  f.name = name();
  f.block_sizes = supported_block_sizes();
  f.dtypes = {c10::kHalf, c10::kBFloat16, c10::kFloat};
  f.kv_caches = {"key_cache", "value_cache"};
  f.capturable = core::state_bit(plan::AttentionState::DecodeOnly) |
                 core::state_bit(plan::AttentionState::ChunkedPrefill) |
                 core::state_bit(plan::AttentionState::SpecDecoding);
  return f;
}

namespace {
const core::BackendRegistrar kRegisterGqaBackend(&Backend::facts);
}  // namespace

}  // namespace aar::gqa
