// The host KV pool of the SFA KV-offload variant: per layer the latent and rope rows
// (bf16), indexed by the engine's block ids, in POSIX shared memory. One process owns
// it and is its only writer; others attach read-only by name. Tensors handed out keep
// the mapping alive; pinning is the engine's callbacks; a stale name is refused at
// attach and removed by unlink(). Design: docs/design/sfa.md §6.4.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace aar::sfa {

struct HostKvPoolConfig {
  // POSIX shared-memory name ("/name"; a leading '/' is added when missing; no
  // other '/'). Empty: "/aar_kv_pool_<pid>_<n>", unique in the process.
  std::string name;
  int64_t num_layers = 0;       // required: the offloaded SFA layers
  int64_t block_size = 128;     // the main cache's block size
  int64_t kv_lora_rank = 512;   // k_cpu rows
  int64_t qk_rope_head_dim = 64;  // v_cpu rows
  int64_t budget_bytes = 0;     // required: upstream's dram_size_per_dp_GB
  // Blocks the pool must hold at least (an engine passes what its model needs,
  // e.g. cdiv(max_model_len, block_size) for one full-length request).
  int64_t min_blocks = 1;
  std::function<void(void* ptr, std::size_t bytes)> pin;  // optional (see above)
  std::function<void(void* ptr)> unpin;                   // optional, with pin
};

// Thread safety: one thread at a time (the engine's step thread and its offload layers,
// in order); pools share nothing.
class HostKvPool {
 public:
  // Creates the segment (the caller is the owner). InvalidArgument for a bad
  // configuration or a budget too small; std::runtime_error when the name is
  // taken or the system refuses (the message carries strerror).
  static std::shared_ptr<HostKvPool> create(const HostKvPoolConfig& cfg);
  // Attaches to the pool another process created under `name` (read-only).
  static std::shared_ptr<HostKvPool> attach(const std::string& name,
                                            std::function<void(void*, std::size_t)> pin = nullptr,
                                            std::function<void(void*)> unpin = nullptr);
  // Removes a name (a pool whose owner died); false when there was none.
  static bool unlink(const std::string& name);
  // Bytes one block takes over all layers: num_layers * block_size * (L + R) * 2.
  static int64_t block_bytes(int64_t num_layers, int64_t block_size, int64_t kv_lora_rank, int64_t qk_rope_head_dim);
  // Blocks a budget holds (the rule above), without creating anything.
  static int64_t blocks_for_budget(int64_t budget_bytes, int64_t num_layers, int64_t block_size, int64_t kv_lora_rank,
                                   int64_t qk_rope_head_dim);

  ~HostKvPool();
  HostKvPool(const HostKvPool&) = delete;
  HostKvPool& operator=(const HostKvPool&) = delete;

  bool is_owner() const { return owner_; }
  // Whether the process that created the pool is still running (always true
  // on the owner).
  bool owner_alive() const;
  const std::string& name() const { return name_; }
  int64_t num_layers() const { return num_layers_; }
  int64_t num_blocks() const { return num_blocks_; }
  int64_t block_size() const { return block_size_; }
  int64_t kv_lora_rank() const { return k_dim_; }
  int64_t qk_rope_head_dim() const { return v_dim_; }
  int64_t segment_bytes() const;  // the mapping, header included

  // Layer l's k_cpu (num_blocks, block_size, 1, kv_lora_rank) and v_cpu
  // (num_blocks, block_size, 1, qk_rope_head_dim), bf16 host tensors (read-only
  // memory in a process that attached), and the same as rows (num_blocks *
  // block_size, D): row = slot.
  const at::Tensor& k(int64_t layer) const;
  const at::Tensor& v(int64_t layer) const;
  const at::Tensor& k_rows(int64_t layer) const;
  const at::Tensor& v_rows(int64_t layer) const;

 private:
  struct Mapping;
  HostKvPool() = default;
  void make_views();
  void check_layer(int64_t layer) const;

  bool owner_ = false;
  int64_t owner_pid_ = 0, owner_start_ = 0;
  std::string name_;
  int64_t num_layers_ = 0, num_blocks_ = 0, block_size_ = 0, k_dim_ = 0, v_dim_ = 0;
  std::shared_ptr<Mapping> map_;
  std::vector<at::Tensor> k_, v_, k_rows_, v_rows_;
};

}  // namespace aar::sfa
