#include "decode_workspace.h"

#include <ATen/ATen.h>

#include "../common/shared_by_shape.h"

namespace aar::mla::detail {

bool DecodeShape::operator==(const DecodeShape& o) const {
  return device == o.device && dtype == o.dtype && heads == o.heads && heads_padded == o.heads_padded &&
         kv_lora_rank == o.kv_lora_rank && nope_dim == o.nope_dim && rope_dim == o.rope_dim &&
         q_lora_rank == o.q_lora_rank && v_head_dim == o.v_head_dim && group == o.group;
}

std::shared_ptr<DecodeWorkspace> DecodeWorkspace::shared(const DecodeShape& shape) {
  return aar::detail::shared_by_shape<DecodeWorkspace>(shape);
}

void DecodeWorkspace::grow(int64_t td) {
  const DecodeShape& s = shape_;
  const int64_t cap = std::max<int64_t>(td, 2 * capacity_);
  const auto opts = at::TensorOptions().dtype(s.dtype).device(s.device);
  const int64_t H = s.heads, Hp = s.heads_padded, L = s.kv_lora_rank, P = s.nope_dim, R = s.rope_dim;
  kv_raw_ = at::empty({cap * (L + R)}, opts);
  if (s.q_lora_rank > 0) {
    qa_ = at::empty({cap * s.q_lora_rank}, opts);
    qc_ = at::empty({cap * s.q_lora_rank}, opts);
  }
  q_ = at::empty({cap * H * (P + R)}, opts);
  // Token-major (td, Hp, D): element (t, h, d) sits at the same offset for
  // every td, so the padded heads (h >= H), never written, stay zero.
  qn_ = at::zeros({cap * Hp * L}, opts);
  qr_ = at::zeros({cap * Hp * R}, opts);
  attn_ = at::empty({cap * Hp * L}, opts);
  y_ = at::empty({cap * H * s.v_head_dim}, opts);
  capacity_ = cap;
  ++generation_;
}

const DecodeViews& DecodeWorkspace::views(int64_t td, DecodeLayout layout) {
  if (td > capacity_) grow(td);
  if (static_cast<int64_t>(views_.size()) <= td) views_.resize(td + 1);
  DecodeViews& v = views_[td];
  if (v.generation == generation_ && v.layout == layout) return v;
  const DecodeShape& s = shape_;
  const int64_t H = s.heads, Hp = s.heads_padded, L = s.kv_lora_rank, P = s.nope_dim, R = s.rope_dim;
  v = DecodeViews{};
  v.generation = generation_;
  v.layout = layout;
  v.kv_raw = kv_raw_.narrow(0, 0, td * (L + R)).view({td, L + R});
  v.kv4 = v.kv_raw.view({td, 1, 1, L + R});
  if (s.q_lora_rank > 0) {
    v.qa = qa_.narrow(0, 0, td * s.q_lora_rank).view({td, s.q_lora_rank});
    v.qc = qc_.narrow(0, 0, td * s.q_lora_rank).view({td, s.q_lora_rank});
  }
  v.q = q_.narrow(0, 0, td * H * (P + R)).view({td, H * (P + R)});
  const at::Tensor q3 = v.q.view({td, H, P + R});
  v.q_nope_t = q3.narrow(2, 0, P).transpose(0, 1);
  v.q_pe4 = q3.narrow(2, P, R).unsqueeze(2);
  const at::Tensor qn = qn_.narrow(0, 0, td * Hp * L).view({td, Hp, L});
  const at::Tensor qr = qr_.narrow(0, 0, td * Hp * R).view({td, Hp, R});
  v.qn_heads = qn.narrow(1, 0, H);
  v.qr_heads = qr.narrow(1, 0, H);
  v.qn_heads_t = v.qn_heads.transpose(0, 1);
  v.qr_heads4 = v.qr_heads.unsqueeze(2);
  const at::Tensor attn = attn_.narrow(0, 0, Hp * td * L);
  switch (layout) {
    case DecodeLayout::TND:
      v.fia_qn = qn;
      v.fia_qr = qr;
      v.attn = attn.view({Hp, td, L});
      break;
    case DecodeLayout::BSND:
      v.fia_qn = qn.view({td, 1, Hp, L});
      v.fia_qr = qr.view({td, 1, Hp, R});
      v.attn = attn.view({Hp, td, 1, L});
      break;
    case DecodeLayout::BNSD:
      v.fia_qn = qn.view({td, Hp, 1, L});
      v.fia_qr = qr.view({td, Hp, 1, R});
      v.attn = attn.view({Hp, td, 1, L});
      break;
  }
  v.attn_heads = attn.narrow(0, 0, H * td * L).view({H, td, L});
  v.y = y_.narrow(0, 0, td * H * s.v_head_dim).view({td, H * s.v_head_dim});
  v.y3 = v.y.view({td, H, s.v_head_dim});
  return v;
}

}  // namespace aar::mla::detail
