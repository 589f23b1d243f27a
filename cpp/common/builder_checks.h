#pragma once
// Private to cpp/: the capacity checks the metadata builders share (GQA, GQA DCP, GQA PCP, MLA:
// their configs carry the same size fields). Each builder adds its own checks after these.
#include <cstdint>

#include "ascend_attn_rt/errors.h"

namespace aar::internal {

// Upper bounds on a builder's capacities: its staging regions are sized from them (one row per
// request plus padding dummies, one slot per token, a block-table row per request), so a value near
// INT32_MAX overflowed a region's size or asked the allocator for tens of GiB.
constexpr int64_t kMaxBuilderReqs = int64_t{1} << 20;
constexpr int64_t kMaxBuilderTokens = int64_t{1} << 24;
constexpr int64_t kMaxBlockTableWords = int64_t{1} << 28;  // (max_num_reqs + 1) x max_blocks_per_req, 1 GiB

template <class Config>
void check_capacity_bounds(const Config& cfg) {
  AAR_CHECK_ARG(cfg.max_num_reqs <= kMaxBuilderReqs, "max_num_reqs=", cfg.max_num_reqs, " exceeds ", kMaxBuilderReqs);
  AAR_CHECK_ARG(cfg.max_num_tokens <= kMaxBuilderTokens, "max_num_tokens=", cfg.max_num_tokens, " exceeds ",
                kMaxBuilderTokens);
  AAR_CHECK_ARG((int64_t{cfg.max_num_reqs} + 1) * cfg.max_blocks_per_req <= kMaxBlockTableWords, "max_blocks_per_req=",
                cfg.max_blocks_per_req, " x (max_num_reqs=", cfg.max_num_reqs, " + 1) exceeds the block table's ",
                kMaxBlockTableWords, " entries");
}

// A slot (block * block_size + offset) is int32 in every metadata.
template <class Config>
void check_slot_range(const Config& cfg) {
  AAR_CHECK_ARG(int64_t{cfg.num_blocks} * cfg.block_size <= INT32_MAX, "num_blocks=", cfg.num_blocks,
                " x block_size=", cfg.block_size, " exceeds the int32 slot range");
}

// max_num_reqs / max_num_tokens / max_blocks_per_req / num_blocks positive and bounded, and a block
// size the backend's kernels take (Backend::is_supported_block_size: 16, 32, 64 or 128).
template <class Backend, class Config>
void check_builder_sizes(const Config& cfg) {
  AAR_CHECK_ARG(cfg.max_num_reqs > 0, "max_num_reqs must be positive, got ", cfg.max_num_reqs);
  AAR_CHECK_ARG(cfg.max_num_tokens > 0, "max_num_tokens must be positive, got ", cfg.max_num_tokens);
  AAR_CHECK_ARG(cfg.max_blocks_per_req > 0, "max_blocks_per_req must be positive, got ", cfg.max_blocks_per_req);
  check_capacity_bounds(cfg);
  AAR_CHECK_ARG(Backend::is_supported_block_size(cfg.block_size), "block_size ", cfg.block_size,
                " is not supported (supported: 16, 32, 64, 128)");
  AAR_CHECK_ARG(cfg.num_blocks > 0, "num_blocks must be positive, got ", cfg.num_blocks);
  check_slot_range(cfg);
}

// The decode threshold 1 + n must stay within FIA TND's 16 query rows per request.
template <class Config>
void check_num_speculative_tokens(const Config& cfg) {
  AAR_CHECK_ARG(cfg.num_speculative_tokens >= 0 && cfg.num_speculative_tokens <= 15,
                "num_speculative_tokens must be in [0, 15] (decode threshold 1 + n <= 16, the FIA TND limit), got ",
                cfg.num_speculative_tokens);
}

}  // namespace aar::internal
