// The DSA-CP o_proj full-weight switch (docs/design/sparse_cp.md §7, §10).
#include "ascend_attn_rt/sparse/oproj_switch.h"

#include <ATen/ATen.h>

#include "ascend_attn_rt/comm/comm.h"
#include "ascend_attn_rt/errors.h"

namespace aar::sparse {

OProjFullWeight::OProjFullWeight(at::Tensor& slot, cp::Comm& comm) : comm_(comm) {
  AAR_CHECK_ARG(slot.defined() && slot.dim() == 2 && slot.is_contiguous(),
                "o_proj shard must be a contiguous (hidden, columns) tensor, got ",
                slot.defined() ? slot.sizes() : c10::IntArrayRef{});
  slots_.push_back({&slot, 1, slot, at::empty({slot.size(0), slot.size(1) * comm_.size()}, slot.options())});
}

OProjFullWeight::OProjFullWeight(const std::vector<Slot>& slots, cp::Comm& comm) : comm_(comm) {
  AAR_CHECK_ARG(!slots.empty(), "o_proj full weight: no slot given");
  for (size_t i = 0; i < slots.size(); ++i) {
    const Slot& s = slots[i];
    AAR_CHECK_ARG(s.handle != nullptr, "o_proj full weight: slot ", i, " has no handle");
    const at::Tensor& t = *s.handle;
    AAR_CHECK_ARG(t.defined() && t.is_contiguous() && s.dim >= 0 && s.dim < t.dim(), "o_proj shard ", i,
                  " must be a contiguous tensor with a gather dim in [0, its rank), got shape ",
                  t.defined() ? t.sizes() : c10::IntArrayRef{}, " and dim ", s.dim);
    std::vector<int64_t> full(t.sizes().begin(), t.sizes().end());
    full[static_cast<size_t>(s.dim)] *= comm_.size();
    slots_.push_back({s.handle, s.dim, t, at::empty(full, t.options())});
  }
}

const at::Tensor& OProjFullWeight::pool(size_t i) const {
  AAR_CHECK_ARG(i < slots_.size(), "o_proj full weight: slot ", i, " of ", slots_.size());
  return slots_[i].pool;
}

const at::Tensor& OProjFullWeight::shard(size_t i) const {
  AAR_CHECK_ARG(i < slots_.size(), "o_proj full weight: slot ", i, " of ", slots_.size());
  return slots_[i].shard;
}

void OProjFullWeight::gather() {
  AAR_CHECK_ARG(!switched_, "o_proj full weight: gather() during a switch");
  // Every handle checked before the first collective (every rank raises alike, or none).
  for (const Held& h : slots_) {
    AAR_CHECK_ARG(h.handle->is_same(h.shard),
                  "o_proj full weight: the layer's o_proj is not the shard it was built with");
  }
  for (Held& h : slots_) comm_.all_gather(h.shard, h.dim, h.pool);
}

OProjFullWeight::Guard::Guard(OProjFullWeight& w) : w_(w) {
  AAR_CHECK_ARG(!w_.switched_, "o_proj full weight: nested switch");
  for (Held& h : w_.slots_) *h.handle = h.pool;
  w_.switched_ = true;
}

OProjFullWeight::Guard::~Guard() {
  for (Held& h : w_.slots_) *h.handle = h.shard;
  w_.switched_ = false;
}

}  // namespace aar::sparse
