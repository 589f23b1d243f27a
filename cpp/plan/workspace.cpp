// Workspace sizing and kernel-selection rules (docs/design/gqa.md §2.6).
#include "ascend_attn_rt/plan/workspace.h"

#include <algorithm>

#include "ascend_attn_rt/errors.h"

namespace aar::plan {

int64_t round_up(int64_t val, int64_t align) {
  if (align == 0) return 0;
  if (align == -1) return val;  // every integer is a multiple; INT64_MIN / -1 would overflow
  // Exact integer ceiling of val/align for either sign (C++ division truncates).
  int64_t q = val / align;
  if (val % align != 0 && ((val < 0) == (align < 0))) ++q;
  int64_t out = 0;
  // Near the int64 limits the next multiple does not exist (fuzz_sizes): refuse, never wrap.
  AAR_CHECK_ARG(!__builtin_mul_overflow(q, align, &out), "round_up(", val, ", ", align,
                "): the result overflows int64");
  return out;
}

int64_t chunked_prefill_workspace_size(int64_t max_model_len, int64_t max_num_seqs, int64_t block_size) {
  AAR_CHECK_ARG(max_model_len >= 0, "max_model_len=", max_model_len, " is negative");
  AAR_CHECK_ARG(max_num_seqs >= 0, "max_num_seqs=", max_num_seqs, " is negative");
  AAR_CHECK_ARG(block_size >= 0, "block_size=", block_size, " is negative");
  constexpr int64_t kCap = 131072;
  // max(min(max(8 L, 4 S B), cap), S B): only S B itself can leave int64 (the min caps the
  // rest), so it is checked and the two scaled terms saturate (fuzz_sizes: the products overflowed).
  int64_t seqs_x_block = 0;
  AAR_CHECK_ARG(!__builtin_mul_overflow(max_num_seqs, block_size, &seqs_x_block), "max_num_seqs=", max_num_seqs,
                " x block_size=", block_size, " overflows int64");
  const int64_t l8 = max_model_len > kCap ? kCap : 8 * max_model_len;
  const int64_t sb4 = seqs_x_block > kCap ? kCap : 4 * seqs_x_block;
  return std::max(std::min(std::max(l8, sb4), kCap), seqs_x_block);
}

bool using_paged_attention(int64_t runtime_shape, const PagedAttentionRule& rule, int64_t head_size) {
  if (rule.has_speculative_config) return false;
  if (rule.device == DeviceKind::A5) return false;
  if (head_size == 512) return true;
  if (!rule.full_decode_only_graph) return false;
  return std::find(rule.pa_shape_list.begin(), rule.pa_shape_list.end(), runtime_shape) !=
         rule.pa_shape_list.end();
}

}  // namespace aar::plan
