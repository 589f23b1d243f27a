// Workspace sizing and kernel-selection rules (docs/design/gqa.md §2.6).
//
// Thread safety: functions without shared state over caller buffers: any number of
// threads at once, each with its own output buffers.
#pragma once

#include <cstdint>

#include "ascend_attn_rt/plan/span.h"

namespace aar::plan {

// 0 if align == 0, else ceil(val / align) * align; InvalidArgument when that
// multiple is outside int64.
int64_t round_up(int64_t val, int64_t align);

// max(min(max(8*max_model_len, 4*max_num_seqs*block_size), 131072), max_num_seqs*block_size);
// InvalidArgument for a negative argument or when max_num_seqs*block_size leaves int64.
int64_t chunked_prefill_workspace_size(int64_t max_model_len, int64_t max_num_seqs, int64_t block_size);

enum class DeviceKind : int32_t { A2 = 0, A3 = 1, A5 = 2, Ascend310P = 3 };

struct PagedAttentionRule {
  bool has_speculative_config = false;
  DeviceKind device = DeviceKind::A2;
  bool full_decode_only_graph = false;  // cudagraph mode == FULL_DECODE_ONLY
  CSpan<int32_t> pa_shape_list;         // additional_config["pa_shape_list"]
};

// docs/design/gqa.md §2.6 decision table. head_size < 0 means "not given".
bool using_paged_attention(int64_t runtime_shape, const PagedAttentionRule& rule, int64_t head_size = -1);

}  // namespace aar::plan
