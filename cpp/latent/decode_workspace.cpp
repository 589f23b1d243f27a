#include "decode_workspace.h"

#include <ATen/ATen.h>

#include "../common/shared_by_shape.h"
#include "ascend_attn_rt/attention_buffer.h"

#include <sstream>
#include "../graph/exclusive_scope.h"

namespace aar::mla::detail {

bool DecodeShape::operator==(const DecodeShape& o) const {
  return device == o.device && dtype == o.dtype && heads == o.heads && heads_padded == o.heads_padded &&
         kv_lora_rank == o.kv_lora_rank && nope_dim == o.nope_dim && rope_dim == o.rope_dim &&
         q_lora_rank == o.q_lora_rank && v_head_dim == o.v_head_dim && group == o.group;
}

DecodeShape decode_shape_of(const Dims& d, int64_t heads_padded, int64_t group, c10::Device device,
                            c10::ScalarType dtype) {
  DecodeShape s;
  s.device = device;
  s.dtype = dtype;
  s.heads = d.num_heads;
  s.heads_padded = heads_padded;
  s.kv_lora_rank = d.kv_lora_rank;
  s.nope_dim = d.qk_nope_head_dim;
  s.rope_dim = d.qk_rope_head_dim;
  s.q_lora_rank = d.q_lora_rank.value_or(0);
  s.v_head_dim = d.v_head_dim;
  s.group = group;
  return s;
}

std::shared_ptr<DecodeWorkspace> DecodeWorkspace::shared(const DecodeShape& shape) {
  return aar::detail::shared_by_shape<DecodeWorkspace>(shape);
}

// The flat buffers live in the process-wide attention-buffer registry
// (attention_buffer.h) under names that carry the shape and the capacity, so an
// engine can find (and share) them; one workspace exists per shape
// (shared_by_shape), so the names are its own. A grow registers the larger
// buffers and releases the registry's hold on the smaller ones (views handed
// out keep theirs alive).
std::string DecodeWorkspace::buffer_name(const char* what, int64_t cap) const {
  const DecodeShape& s = shape_;
  std::ostringstream os;
  os << "mla.decode_workspace/" << s.device << "/" << s.dtype << "/H" << s.heads << "p" << s.heads_padded << "L"
     << s.kv_lora_rank << "P" << s.nope_dim << "R" << s.rope_dim << "Q" << s.q_lora_rank << "V" << s.v_head_dim
     << "g" << s.group << "/" << what << "/cap" << cap;
  return os.str();
}

at::Tensor DecodeWorkspace::buffer(const char* what, int64_t cap, int64_t numel, bool zeros) {
  std::string name = buffer_name(what, cap);
  at::Tensor t = get_or_register_attention_buffer(name, {numel}, shape_.dtype, shape_.device, zeros);
  names_.push_back(std::move(name));
  return t;
}

DecodeWorkspace::~DecodeWorkspace() {
  for (const std::string& n : names_) release_attention_buffer(n);
}

void DecodeWorkspace::grow(int64_t td) {
  const DecodeShape& s = shape_;
  const int64_t cap = std::max<int64_t>(td, 2 * capacity_);
  const int64_t H = s.heads, Hp = s.heads_padded, L = s.kv_lora_rank, P = s.nope_dim, R = s.rope_dim;
  for (const std::string& n : names_) release_attention_buffer(n);
  names_.clear();
  kv_raw_ = buffer("kv_raw", cap, cap * (L + R), false);
  if (s.q_lora_rank > 0) {
    qa_ = buffer("qa", cap, cap * s.q_lora_rank, false);
    qc_ = buffer("qc", cap, cap * s.q_lora_rank, false);
  }
  q_ = buffer("q", cap, cap * H * (P + R), false);
  // Token-major (td, Hp, D): element (t, h, d) sits at the same offset for
  // every td, so the padded heads (h >= H), never written, stay zero.
  qn_ = buffer("qn", cap, cap * Hp * L, true);
  qr_ = buffer("qr", cap, cap * Hp * R, true);
  attn_ = buffer("attn", cap, cap * Hp * L, false);
  y_ = buffer("y", cap, cap * H * s.v_head_dim, false);
  capacity_ = cap;
  ++generation_;
}

DecodeWorkspace::DecodeWorkspace(const DecodeShape& shape)
    : shape_(shape),
      exclusive_(std::make_shared<::aar::detail::ExclusiveUse>(
          "the MLA decode workspace of workspace_group " + std::to_string(shape.group))) {}

const DecodeViews& DecodeWorkspace::views(int64_t td, DecodeLayout layout) {
  graph::use_in_forward(exclusive_);
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
  v.kv_nope = v.kv_raw.narrow(1, 0, L);
  v.kv_rope4 = v.kv4.narrow(3, L, R);
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
