#include "ascend_attn_rt/fa3/backend.h"

#include "../common/kv_cache.h"
#include "ascend_attn_rt/errors.h"
#include "ascend_attn_rt/core/backend.h"

namespace aar::fa3 {

const char* Backend::name() { return "CUSTOM"; }

const std::vector<int64_t>& Backend::supported_block_sizes() {
  static const std::vector<int64_t> sizes{128};
  return sizes;
}

bool Backend::is_supported_block_size(int64_t block_size) { return block_size == 128; }

std::vector<int64_t> Backend::kv_cache_shape(int64_t num_blocks, int64_t block_size, int64_t num_kv_heads,
                                             int64_t head_size) {
  AAR_CHECK_ARG(num_blocks > 0, "num_blocks must be positive, got ", num_blocks);
  AAR_CHECK_ARG(is_supported_block_size(block_size), "block_size ", block_size,
                " is not supported by the FA3 backend (its kernel block size is 128)");
  AAR_CHECK_ARG(num_kv_heads > 0, "num_kv_heads must be positive, got ", num_kv_heads);
  AAR_CHECK_ARG(head_size > 0, "head_size must be positive, got ", head_size);
  return {2, num_blocks, block_size, num_kv_heads, head_size};
}

std::vector<int64_t> Backend::kv_cache_stride_order(bool include_num_layers_dimension) {
  return detail::identity_stride_order(5, include_num_layers_dimension);
}

core::BackendFacts Backend::facts() {
  core::BackendFacts f;
  f.id = "fa3";
  f.name = name();
  f.block_sizes = supported_block_sizes();
  f.dtypes = {c10::kHalf, c10::kBFloat16, c10::kFloat};
  f.builder = "gqa";  // the layers take gqa::MetadataBuilder's metadata
  f.kv_caches = {"key_cache", "value_cache"};
  f.capturable = 0;  // eager only: a forward inside a capture is refused by name
  return f;
}

namespace {
const core::BackendRegistrar kRegisterFa3Backend(&Backend::facts);
}  // namespace

}  // namespace aar::fa3
