// The DSA-CP o_proj full-weight switch (docs/design/sparse_cp.md §7).
#include "ascend_attn_rt/sparse/oproj_switch.h"

#include <ATen/ATen.h>

#include "ascend_attn_rt/comm/comm.h"
#include "ascend_attn_rt/errors.h"

namespace aar::sparse {

OProjFullWeight::OProjFullWeight(at::Tensor& slot, cp::Comm& comm) : slot_(slot), comm_(comm), shard_(slot) {
  AAR_CHECK_ARG(shard_.defined() && shard_.dim() == 2 && shard_.is_contiguous(),
                "o_proj shard must be a contiguous (hidden, columns) tensor, got ",
                shard_.defined() ? shard_.sizes() : c10::IntArrayRef{});
  pool_ = at::empty({shard_.size(0), shard_.size(1) * comm_.size()}, shard_.options());
}

void OProjFullWeight::gather() {
  AAR_CHECK_ARG(!switched_, "o_proj full weight: gather() during a switch");
  AAR_CHECK_ARG(slot_.is_same(shard_), "o_proj full weight: the layer's o_proj is not the shard it was built with");
  comm_.all_gather(shard_, 1, pool_);
}

OProjFullWeight::Guard::Guard(OProjFullWeight& w) : w_(w) {
  AAR_CHECK_ARG(!w_.switched_, "o_proj full weight: nested switch");
  w_.slot_ = w_.pool_;
  w_.switched_ = true;
}

OProjFullWeight::Guard::~Guard() {
  w_.slot_ = w_.shard_;
  w_.switched_ = false;
}

}  // namespace aar::sparse
