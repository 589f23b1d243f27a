// Internal: the FIA v1/v2 CPU twin core (docs/design/ops.md §4.1). v1 and v2 differ only in
// argument names, the learnable sink, and which arguments exist; both reduce
// to FiaInputs after rejecting what the twin does not implement.
#pragma once

#include <ATen/ATen.h>
#include <c10/util/string_view.h>

#include <optional>
#include <vector>

#include "attention_reference.h"

namespace aar::ops::cpu {

inline const std::optional<at::Tensor>& no_tensor() {
  static const std::optional<at::Tensor> none;
  return none;
}

struct FiaNames {
  const char* op;
  const char* q_lens;     // actual_seq_lengths / actual_seq_qlen
  const char* kv_lens;    // actual_seq_lengths_kv / actual_seq_kvlen
  const char* num_heads;  // num_heads / num_query_heads
};

struct FiaInputs {
  const at::Tensor& query;
  const at::Tensor& key;
  const at::Tensor& value;
  const std::optional<at::Tensor>& atten_mask;
  const std::optional<at::Tensor>& block_table;
  const std::optional<at::Tensor>& learnable_sink;  // v2 only
  at::OptionalSymIntArrayRef q_lens;
  at::OptionalSymIntArrayRef kv_lens;
  int64_t num_heads;
  int64_t num_kv_heads;
  double scale;
  int64_t pre_tokens;
  int64_t next_tokens;
  c10::string_view layout;
  int64_t sparse_mode;
  int64_t inner_precise;
  int64_t block_size;
  FiaNames names;
  // FIA v1 KV antiquant (int8 key/value, key/value_antiquant_mode 0 =
  // per-channel): k = (k_int8 + key_antiquant_offset) * key_antiquant_scale,
  // scale/offset of shape (Nkv, 1, D) [BNSD per-channel] or (1,) [per-tensor];
  // offsets optional (symmetric). Null = argument absent.
  const std::optional<at::Tensor>* key_antiquant_scale = nullptr;
  const std::optional<at::Tensor>* key_antiquant_offset = nullptr;
  const std::optional<at::Tensor>* value_antiquant_scale = nullptr;
  const std::optional<at::Tensor>* value_antiquant_offset = nullptr;
};

// Validated problem: everything the compute loop needs.
struct FiaPlan {
  bool bnsd = false;
  bool paged = false;
  PagedLayout paged_layout = PagedLayout::Hidden3D;
  int64_t batch = 0, heads = 0, kv_heads = 0, head_dim = 0, v_head_dim = 0;
  int64_t q_seq = 0;  // BNSD padded S
  int64_t block_size = 0;
  std::vector<int64_t> q_start, q_len, kv_start, kv_len;
  MaskSpec mask;
  at::Tensor sink;  // (N,) fp32 or undefined
  // KV antiquant, (1, Nkv, D) fp32 each, or undefined (float KV / no offset).
  at::Tensor k_scale, k_offset, v_scale, v_offset;
  std::vector<int64_t> out_shape, lse_shape;
};

FiaPlan plan_fia(const FiaInputs& in);
void run_fia(const FiaPlan& plan, const FiaInputs& in, at::Tensor& out, at::Tensor* lse);

// Functional / .out / workspace entry points shared by v1 and v2.
std::tuple<at::Tensor, at::Tensor> fia_functional(const FiaInputs& in, bool want_lse);
void fia_out(const FiaInputs& in, bool want_lse, at::Tensor& attention_out, at::Tensor& softmax_lse);
at::Tensor fia_workspace(const FiaInputs& in);

}  // namespace aar::ops::cpu
