// The o_proj full-weight switch of DSA-CP (docs/design/sparse_cp.md §7), shared by the sparse
// families' DSA-CP layers: a layer holds its row-parallel o_proj shard (hidden, C) of the full
// (hidden, W*C); for a prefill step the shards are all-gathered over the DSA-CP group into a
// static pool (allocated once: the gather's addresses never move), the layer's o_proj handle is
// switched to the full weight for the computation, and a Guard restores the shard when it ends,
// on every path (an exception included).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace aar::cp {
class Comm;
}

namespace aar::sparse {

// Thread safety: one thread at a time (the layer's).
class OProjFullWeight {
 public:
  // `slot` is the layer's o_proj handle (a (hidden, C) shard, contiguous); it must outlive this
  // object. comm: the DSA-CP group (W ranks), which must outlive it too.
  OProjFullWeight(at::Tensor& slot, cp::Comm& comm);

  // Gathers every rank's shard into the pool (hidden, W*C) in rank order (one all-gather; every
  // rank of the group must call it). Called before each switch: the shard may have been reloaded.
  void gather();
  // The static pool (hidden, W*C) and the shard the slot holds outside a switch.
  const at::Tensor& pool() const { return pool_; }
  const at::Tensor& shard() const { return shard_; }
  bool switched() const { return switched_; }

  // Switches the slot to the pool for its lifetime; restores the shard in its destructor.
  class Guard {
   public:
    explicit Guard(OProjFullWeight& w);
    ~Guard();
    Guard(const Guard&) = delete;
    Guard& operator=(const Guard&) = delete;

   private:
    OProjFullWeight& w_;
  };

 private:
  at::Tensor& slot_;
  cp::Comm& comm_;
  at::Tensor shard_;  // the slot's shard handle (restored by the Guard)
  at::Tensor pool_;
  bool switched_ = false;
};

}  // namespace aar::sparse
