#pragma once
// Private to cpp/: the capacity checks the metadata builders share (GQA, GQA DCP, GQA PCP, MLA:
// their configs carry the same size fields). Each builder adds its own checks after these.
#include "ascend_attn_rt/errors.h"

namespace aar::internal {

// max_num_reqs / max_num_tokens / max_blocks_per_req / num_blocks positive, and a block size the
// backend's kernels take (Backend::is_supported_block_size: 16, 32, 64 or 128).
template <class Backend, class Config>
void check_builder_sizes(const Config& cfg) {
  AAR_CHECK_ARG(cfg.max_num_reqs > 0, "max_num_reqs must be positive, got ", cfg.max_num_reqs);
  AAR_CHECK_ARG(cfg.max_num_tokens > 0, "max_num_tokens must be positive, got ", cfg.max_num_tokens);
  AAR_CHECK_ARG(cfg.max_blocks_per_req > 0, "max_blocks_per_req must be positive, got ", cfg.max_blocks_per_req);
  AAR_CHECK_ARG(Backend::is_supported_block_size(cfg.block_size), "block_size ", cfg.block_size,
                " is not supported (supported: 16, 32, 64, 128)");
  AAR_CHECK_ARG(cfg.num_blocks > 0, "num_blocks must be positive, got ", cfg.num_blocks);
}

// The decode threshold 1 + n must stay within FIA TND's 16 query rows per request.
template <class Config>
void check_num_speculative_tokens(const Config& cfg) {
  AAR_CHECK_ARG(cfg.num_speculative_tokens >= 0 && cfg.num_speculative_tokens <= 15,
                "num_speculative_tokens must be in [0, 15] (decode threshold 1 + n <= 16, the FIA TND limit), got ",
                cfg.num_speculative_tokens);
}

}  // namespace aar::internal
