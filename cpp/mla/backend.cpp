#include "ascend_attn_rt/mla/backend.h"

#include <ATen/ATen.h>

#include "../common/kv_cache.h"
#include "ascend_attn_rt/core/backend.h"
#include "ascend_attn_rt/errors.h"
#include "ascend_attn_rt/mla/plan/mla_plan.h"

namespace aar::mla {

const char* Backend::name() { return "ASCEND_MLA"; }

const std::vector<int64_t>& Backend::supported_block_sizes() {
  static const std::vector<int64_t> sizes = {16, 32, 64, 128};
  return sizes;
}

bool Backend::is_supported_block_size(int64_t bs) { return bs == 16 || bs == 32 || bs == 64 || bs == 128; }

std::vector<int64_t> Backend::kv_cache_shape(int64_t nb, int64_t bs, int64_t nkv, int64_t head_size) {
  AAR_CHECK_ARG(nb >= 0 && bs > 0 && nkv > 0 && head_size > 0, "kv_cache_shape: bad sizes (", nb, ", ", bs, ", ",
                nkv, ", ", head_size, ")");
  return {nb, bs, nkv, head_size};
}

std::vector<std::vector<int64_t>> Backend::kv_cache_shapes(int64_t nb, int64_t bs, int64_t L, int64_t R) {
  AAR_CHECK_ARG(nb >= 0 && bs > 0 && L > 0 && R > 0, "kv_cache_shapes: bad sizes (num_blocks=", nb,
                ", block_size=", bs, ", kv_lora_rank=", L, ", qk_rope_head_dim=", R, ")");
  return {{nb, bs, 1, L}, {nb, bs, 1, R}};
}

std::vector<int64_t> Backend::nz_cache_shape(int64_t nb, int64_t bs, int64_t dim, int64_t element_size) {
  AAR_CHECK_ARG(element_size == 1 || element_size == 2 || element_size == 4, "nz_cache_shape: element_size ",
                element_size, " must be 1, 2 or 4");
  AAR_CHECK_ARG(nb >= 0 && bs > 0 && dim > 0, "nz_cache_shape: bad sizes (num_blocks=", nb, ", block_size=", bs,
                ", dim=", dim, ")");
  const int64_t c = 32 / element_size;
  AAR_CHECK_ARG(dim % c == 0, "nz_cache_shape: dim ", dim, " must be a multiple of ", c);
  return {nb, 1, dim / c, bs, c};
}

at::Tensor Backend::to_nz(const at::Tensor& nd) {
  AAR_CHECK_ARG(nd.dim() == 4 && nd.size(2) == 1, "to_nz: cache must be (num_blocks, block_size, 1, D), got ",
                nd.sizes());
  const auto s = nz_cache_shape(nd.size(0), nd.size(1), nd.size(3), nd.element_size());
  // (nb, bs, D/c, c) -> (nb, D/c, bs, c)
  return nd.reshape({s[0], s[3], s[2], s[4]}).permute({0, 2, 1, 3}).contiguous().view(s);
}

at::Tensor Backend::from_nz(const at::Tensor& nz) {
  AAR_CHECK_ARG(nz.dim() == 5 && nz.size(1) == 1, "from_nz: cache must be (num_blocks, 1, D/c, block_size, c), got ",
                nz.sizes());
  return nz.select(1, 0).permute({0, 2, 1, 3}).contiguous().view({nz.size(0), nz.size(3), 1, nz.size(2) * nz.size(4)});
}

std::vector<int64_t> Backend::kv_cache_stride_order(bool include_num_layers_dimension) {
  return aar::detail::identity_stride_order(4, include_num_layers_dimension);
}

int64_t Backend::num_heads_padded(int64_t h) {
  AAR_CHECK_ARG(h >= 1 && h <= kMaxHeads, "num_heads=", h, " is not supported: the MLA decode kernel takes 1..",
                kMaxHeads, " query heads (padded to a power of two)");
  return plan::next_power_of_two(h);
}

core::BackendFacts Backend::facts() {
  core::BackendFacts f;
  f.id = "mla";
  f.name = name();
  f.block_sizes = supported_block_sizes();
  f.dtypes = {c10::kHalf, c10::kBFloat16, c10::kFloat};
  f.kv_caches = {"nope_cache", "rope_cache"};
  f.capturable = core::state_bit(plan::AttentionState::DecodeOnly) | core::state_bit(plan::AttentionState::SpecDecoding);
  return f;
}

namespace {
const core::BackendRegistrar kRegisterMlaBackend(&Backend::facts);
}  // namespace

}  // namespace aar::mla
