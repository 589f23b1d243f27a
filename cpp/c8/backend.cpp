#include "ascend_attn_rt/c8/backend.h"

#include "../common/kv_cache.h"
#include "ascend_attn_rt/c8/quant.h"
#include "ascend_attn_rt/errors.h"
#include "ascend_attn_rt/core/backend.h"

namespace aar::c8 {

const char* Backend::name() { return "CUSTOM"; }

const std::vector<int64_t>& Backend::supported_block_sizes() {
  static const std::vector<int64_t> sizes{32, 64, 128};
  return sizes;
}

bool Backend::is_supported_block_size(int64_t block_size) {
  return core::has_block_size(supported_block_sizes(), block_size);
}

std::vector<int64_t> Backend::kv_cache_shape(int64_t num_blocks, int64_t block_size, int64_t num_kv_heads,
                                             int64_t head_size) {
  AAR_CHECK_ARG(num_blocks > 0, "num_blocks must be positive, got ", num_blocks);
  AAR_CHECK_ARG(is_supported_block_size(block_size), "block_size ", block_size,
                " is not supported by the C8 NZ cache (supported: 32, 64, 128)");
  AAR_CHECK_ARG(num_kv_heads > 0, "num_kv_heads must be positive, got ", num_kv_heads);
  AAR_CHECK_ARG(head_size > 0 && head_size % kNzWidth == 0, "head_size must be a positive multiple of 32, got ",
                head_size);
  return {2, num_blocks, num_kv_heads, head_size / kNzWidth, block_size, kNzWidth};
}

std::vector<int64_t> Backend::kv_cache_stride_order(bool include_num_layers_dimension) {
  return detail::identity_stride_order(6, include_num_layers_dimension);
}

core::BackendFacts Backend::facts() {
  core::BackendFacts f;
  f.id = "c8";
  f.name = name();
  f.block_sizes = supported_block_sizes();
  f.dtypes = {c10::kHalf, c10::kBFloat16, c10::kFloat};
  f.builder = "gqa";  // the layers take gqa::MetadataBuilder's metadata
  f.kv_caches = {"key_cache", "value_cache"};  // int8 NZ
  f.capturable = core::state_bit(plan::AttentionState::DecodeOnly);
  return f;
}

namespace {
const core::BackendRegistrar kRegisterC8Backend(&Backend::facts);
}  // namespace

}  // namespace aar::c8
