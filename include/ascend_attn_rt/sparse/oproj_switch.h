// The o_proj full-weight switch of DSA-CP (docs/design/sparse_cp.md §7, §10), shared by the sparse
// families' DSA-CP layers: a layer holds its row-parallel o_proj shard(s) of the full weights;
// for a prefill step the shards are all-gathered over the DSA-CP group into static pools
// (allocated once: the gathers' addresses never move), the layer's o_proj handles are switched to
// the full weights for the computation, and one Guard restores every shard when it ends, on every
// path (an exception included). SFA switches one slot (o_proj (hidden, C) of (hidden, W*C), along
// dim 1); DSA switches two under one guard (wo_a (G/W, k, o_lora) along its groups, dim 0, and
// wo_b (hidden, G/W*o_lora) along its columns, dim 1).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace aar::cp {
class Comm;
}

namespace aar::sparse {

// Thread safety: one thread at a time (the layer's).
class OProjFullWeight {
 public:
  // One switched handle: the layer's shard, gathered along `dim`.
  struct Slot {
    at::Tensor* handle = nullptr;
    int64_t dim = 1;
  };
  // `slot` is the layer's o_proj handle (a (hidden, C) shard, contiguous), gathered along dim 1; it
  // must outlive this object. comm: the DSA-CP group (W ranks), which must outlive it too.
  OProjFullWeight(at::Tensor& slot, cp::Comm& comm);
  // Several handles switched together (each contiguous, gathered along its dim in [0, its rank)),
  // every one of which must outlive this object.
  OProjFullWeight(const std::vector<Slot>& slots, cp::Comm& comm);

  // Gathers every rank's shards into the pools in rank order (one all-gather per slot; every rank
  // of the group must call it). Called before each switch: the shards may have been reloaded.
  void gather();
  size_t num_slots() const { return slots_.size(); }
  // The static pool of slot i (its shard's shape with size(dim) * W) and the shard the handle
  // holds outside a switch.
  const at::Tensor& pool(size_t i = 0) const;
  const at::Tensor& shard(size_t i = 0) const;
  bool switched() const { return switched_; }

  // Switches every handle to its pool for its lifetime; restores every shard in its destructor.
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
  struct Held {
    at::Tensor* handle = nullptr;
    int64_t dim = 1;
    at::Tensor shard;  // the handle's shard (restored by the Guard)
    at::Tensor pool;
  };
  cp::Comm& comm_;
  std::vector<Held> slots_;
  bool switched_ = false;
};

}  // namespace aar::sparse
