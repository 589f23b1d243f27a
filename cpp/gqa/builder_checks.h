#pragma once
// Private to cpp/gqa: the size checks the GQA builder and the GQA DCP builder share (both
// configs carry the same size fields; each builder adds its own checks after these).
#include "ascend_attn_rt/errors.h"
#include "ascend_attn_rt/gqa/backend.h"

namespace aar::gqa::internal {

template <class Config>
void check_builder_sizes(const Config& cfg) {
  AAR_CHECK_ARG(cfg.max_num_reqs > 0, "max_num_reqs must be positive, got ", cfg.max_num_reqs);
  AAR_CHECK_ARG(cfg.max_num_tokens > 0, "max_num_tokens must be positive, got ", cfg.max_num_tokens);
  AAR_CHECK_ARG(cfg.max_blocks_per_req > 0, "max_blocks_per_req must be positive, got ", cfg.max_blocks_per_req);
  AAR_CHECK_ARG(Backend::is_supported_block_size(cfg.block_size), "block_size ", cfg.block_size,
                " is not supported (supported: 16, 32, 64, 128)");
  AAR_CHECK_ARG(cfg.num_blocks > 0, "num_blocks must be positive, got ", cfg.num_blocks);
  AAR_CHECK_ARG(cfg.num_speculative_tokens >= 0 && cfg.num_speculative_tokens <= 15,
                "num_speculative_tokens must be in [0, 15] (decode threshold 1 + n <= 16, the FIA TND limit), got ",
                cfg.num_speculative_tokens);
}

}  // namespace aar::gqa::internal
