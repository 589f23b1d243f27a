// Intermediate buffers of the MLA decode forward (internal). The projections,
// the absorbed query with its zero head padding and the head-major latent
// attention output live in flat buffers shared by every layer of the same
// shape (layers run one after the other on one stream, so a layer's
// intermediates are dead when the next layer starts), sized for the largest
// decode batch seen so far. The views a decode of `td` tokens needs are made
// the first time `td` is seen and cached, so a steady-state decode forward
// creates no tensor for its intermediates.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ascend_attn_rt/latent/weights.h"

namespace aar::detail {
class ExclusiveUse;  // cpp/common/exclusive_use.h
}

namespace aar::mla::detail {

// FIA v2 query layout of the decode (docs/design/mla.md §5.3 rows A, D, E).
enum class DecodeLayout : int32_t { BNSD = 0, BSND = 1, TND = 2 };

struct DecodeShape {
  c10::Device device = c10::Device(c10::kCPU);
  c10::ScalarType dtype = c10::ScalarType::Undefined;
  int64_t heads = 0, heads_padded = 0, kv_lora_rank = 0, nope_dim = 0, rope_dim = 0, q_lora_rank = 0,
          v_head_dim = 0;
  int64_t group = 0;
  bool operator==(const DecodeShape& o) const;
};

// The workspace shape of a layer with dims `d` (q_lora_rank 0 without q-LoRA).
DecodeShape decode_shape_of(const Dims& d, int64_t heads_padded, int64_t group, c10::Device device,
                            c10::ScalarType dtype);

// Views for one decode token count and layout.
struct DecodeViews {
  int64_t generation = -1;
  DecodeLayout layout = DecodeLayout::BNSD;
  at::Tensor kv_raw, kv4;        // (td, L+R), (td, 1, 1, L+R)
  at::Tensor kv_nope, kv_rope4;  // kv_raw's latent columns (td, L) and kv4's rope columns (td, 1, 1, R)
  at::Tensor qa, qc;             // q-LoRA: (td, Q) down projection, normed
  at::Tensor q;                  // (td, H*(P+R))
  at::Tensor q_nope_t;           // (H, td, P) view of q
  at::Tensor q_pe4;              // (td, H, 1, R) view of q
  at::Tensor qn_heads, qr_heads; // (td, H, L) / (td, H, R): the real heads of the padded queries
  at::Tensor qn_heads_t;         // (H, td, L): W_UK bmm target
  at::Tensor qr_heads4;          // (td, H, 1, R): RoPE result target
  at::Tensor fia_qn, fia_qr;     // the padded queries in the FIA layout
  at::Tensor attn;               // head-major FIA output: (Hp, td, 1, L) or (Hp, td, L) for TND
  at::Tensor attn_heads;         // (H, td, L): the real heads of attn
  at::Tensor y3, y;              // W_UV output, token-major: (td, H, V) and (td, H*V)
};

class DecodeWorkspace {
 public:
  explicit DecodeWorkspace(const DecodeShape& shape);
  ~DecodeWorkspace();
  DecodeWorkspace(const DecodeWorkspace&) = delete;
  DecodeWorkspace& operator=(const DecodeWorkspace&) = delete;
  // The views for td tokens in `layout`, growing the buffers when td exceeds
  // the capacity (earlier buffers stay alive while something references them).
  const DecodeViews& views(int64_t td, DecodeLayout layout);
  const DecodeShape& shape() const { return shape_; }

  // One workspace per shape (and group) in the process.
  static std::shared_ptr<DecodeWorkspace> shared(const DecodeShape& shape);

 private:
  void grow(int64_t td);
  std::string buffer_name(const char* what, int64_t cap) const;
  at::Tensor buffer(const char* what, int64_t cap, int64_t numel, bool zeros);

  DecodeShape shape_;
  std::shared_ptr<::aar::detail::ExclusiveUse> exclusive_;
  int64_t capacity_ = 0, generation_ = 0;
  at::Tensor kv_raw_, qa_, qc_, q_, qn_, qr_, attn_, y_;
  std::vector<DecodeViews> views_;
  std::vector<std::string> names_;  // this workspace's entries in the attention-buffer registry
};

}  // namespace aar::mla::detail
