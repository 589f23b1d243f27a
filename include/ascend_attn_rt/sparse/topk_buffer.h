// The top-k index buffer shared by the SFA layers of one model
// (docs/design/sparse.md §6): a persistent (max_num_tokens, index_topk) int32 device tensor.
// A layer with an indexer writes its selection into it (use_index_cache); a
// layer without one reads the last indexer layer's selection from it instead
// of running the indexer (skip_topk). Allocated once, so its views keep stable
// addresses across steps (graph capture records them).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <deque>

namespace aar::sfa {

// Thread safety: one thread at a time (view() caches its views, also from const calls):
// one buffer per engine, used by its layers in order.
class TopkBuffer {
 public:
  // Filled with -1 (no valid index: a layer that reads before any indexer
  // layer wrote attends to nothing rather than to garbage). Both sizes must be
  // positive and their product at most 2^31 - 1 entries; a failed allocation
  // is an InvalidArgument naming both (never a bare allocator error).
  TopkBuffer(int64_t max_num_tokens, int64_t index_topk, c10::Device device = c10::Device(c10::kCPU));
  TopkBuffer(const TopkBuffer&) = delete;
  TopkBuffer& operator=(const TopkBuffer&) = delete;

  int64_t max_num_tokens() const { return buffer_.size(0); }
  int64_t index_topk() const { return buffer_.size(1); }
  const at::Tensor& buffer() const { return buffer_; }  // (max_num_tokens, index_topk) int32
  // The first num_tokens rows as (num_tokens, 1, index_topk), the kernels'
  // top-k layout; the same tensor (same address) for every call with that
  // size. 0 <= num_tokens <= max_num_tokens.
  const at::Tensor& view(int64_t num_tokens) const;
  // Copies a selection, (T, 1, K) or (T, K) int32 on the buffer's device with
  // K == index_topk and T <= max_num_tokens, into the first T rows (a device
  // copy; validated before it; none when topk already is view(T), e.g. a collective's output placed
  // there). Returns view(T).
  const at::Tensor& store(const at::Tensor& topk);

 private:
  at::Tensor buffer_;
  // By num_tokens, grown on demand; a deque keeps the references view()
  // returned valid when it grows.
  mutable std::deque<at::Tensor> views_;
};

}  // namespace aar::sfa
