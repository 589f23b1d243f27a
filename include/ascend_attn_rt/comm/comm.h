// The collectives of every context-parallel path over a c10d::ProcessGroup (gloo on
// CPU, HCCL on the NPU): all-gather along a dim, equal-split all-to-all along dim 0,
// reduce-scatter (sum) along a dim, sync and async. Bad arguments are InvalidArgument
// before anything is sent; a failed or silent peer is a CommError within the Comm's
// timeout, never a hang. Every rank must issue the same sequence. One thread at a time.
// Under the no-compute operator provider (host-time benchmarks) a collective is checked, noted and
// counted but not run: nothing moves, as with every other device kernel under that provider.
// Design: docs/design/cp.md §1.2.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/intrusive_ptr.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace c10d {
class ProcessGroup;
class Work;
}  // namespace c10d

namespace aar::cp {

enum class CommOp : int32_t { AllGather = 0, AllToAllSingle = 1, ReduceScatter = 2, AllReduce = 3 };
constexpr int32_t kNumCommOps = 4;
const char* to_string(CommOp op);

// A collective failed in the backend (peer gone, timeout). Bad arguments raise
// aar::InvalidArgument instead.
class CommError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct CommRecord {
  std::string group;            // the group's name (c10d group_name)
  CommOp op = CommOp::AllGather;
  std::vector<int64_t> shape;   // the input's shape
  at::ScalarType dtype = at::ScalarType::Undefined;
  int64_t dim = 0;              // the gather / scatter dim (0 for all_to_all_single)
  bool async = false;
};

struct CommOptions {
  std::chrono::milliseconds timeout{60000};
  bool log = false;
};

// The handle of an asynchronous collective.
class CommWork {
 public:
  CommWork() = default;
  CommWork(CommWork&& o) noexcept;
  CommWork& operator=(CommWork&& o) noexcept;
  CommWork(const CommWork&) = delete;
  CommWork& operator=(const CommWork&) = delete;
  ~CommWork();

  // Blocks until the collective has finished (at most the Comm's timeout),
  // completes the copy into `out` where one is needed and returns `out`.
  // A second call returns `out` again. Throws CommError on failure.
  const at::Tensor& wait();
  // Whether the backend reports the collective finished (wait() is still
  // needed for the result and for errors).
  bool is_completed() const;
  bool waited() const { return done_; }
  // The output tensor (its contents are defined after wait()).
  const at::Tensor& output() const { return out_; }

 private:
  friend class Comm;
  c10::intrusive_ptr<c10d::Work> work_;
  at::Tensor out_;
  std::vector<at::Tensor> keep_;   // inputs / staging the backend reads or writes
  std::function<void()> finish_;   // staging -> out copy, run after the wait
  // "cp::Comm all_gather on group 'g' (rank r of W)": the Comm's string for the op, made once at
  // construction and shared (a launch copies no string).
  std::shared_ptr<const std::string> what_;
  std::chrono::milliseconds timeout_{0};
  bool done_ = true;
};

// Thread safety: one thread at a time per Comm (its staging tensor, counters and log are
// unsynchronised; every rank must issue the same sequence of collectives anyway); Comms
// over different groups are independent.
class Comm {
 public:
  explicit Comm(c10::intrusive_ptr<c10d::ProcessGroup> group, CommOptions opts = {});
  // The group torch.distributed registered under `group_name` (its
  // ProcessGroup.group_name): how a C++ engine, or the Python binding, reaches
  // a group created in Python.
  static Comm from_group_name(const std::string& group_name, CommOptions opts = {});

  int rank() const { return rank_; }
  int size() const { return size_; }
  const std::string& group_name() const { return name_; }
  std::chrono::milliseconds timeout() const { return opts_.timeout; }
  const c10::intrusive_ptr<c10d::ProcessGroup>& group() const { return pg_; }

  // out = the W ranks' `t` concatenated along `dim` in rank order (dim may be
  // negative). `out`, when given, must be contiguous with t's dtype/device and
  // t's shape with size(dim) * W.
  at::Tensor all_gather(const at::Tensor& t, int64_t dim, const std::optional<at::Tensor>& out = std::nullopt);
  CommWork all_gather_async(const at::Tensor& t, int64_t dim, const std::optional<at::Tensor>& out = std::nullopt);

  // Equal splits over dim 0: block i of `out` is block `rank` of rank i's `t`
  // (t.size(0) divisible by W; out of t's shape).
  at::Tensor all_to_all_single(const at::Tensor& t, const std::optional<at::Tensor>& out = std::nullopt);
  CommWork all_to_all_single_async(const at::Tensor& t, const std::optional<at::Tensor>& out = std::nullopt);

  // out = block `rank` (along `dim`, W equal blocks) of the sum over ranks of `t`.
  at::Tensor reduce_scatter(const at::Tensor& t, int64_t dim, const std::optional<at::Tensor>& out = std::nullopt);
  CommWork reduce_scatter_async(const at::Tensor& t, int64_t dim,
                                const std::optional<at::Tensor>& out = std::nullopt);
  // In place: t (contiguous) becomes the sum over ranks of t. Returns t.
  at::Tensor all_reduce(const at::Tensor& t);

  // Calls issued so far (all ops, or one op); the log when CommOptions::log.
  int64_t calls() const;
  int64_t calls(CommOp op) const { return counts_[static_cast<size_t>(op)]; }
  // Wall time spent inside the synchronous calls (entry to return: the checks,
  // the issue, the completion, the staging copy and the handle's teardown), so
  // a benchmark can report a step's host time with the collectives excluded.
  // Async calls are not timed (their wait overlaps work).
  int64_t collective_ns() const;
  const std::vector<CommRecord>& log() const { return log_; }
  void reset_counters();

 private:
  CommWork start_all_gather(const at::Tensor& t, int64_t dim, const std::optional<at::Tensor>& out, bool async);
  CommWork start_all_to_all_single(const at::Tensor& t, const std::optional<at::Tensor>& out, bool async);
  CommWork start_reduce_scatter(const at::Tensor& t, int64_t dim, const std::optional<at::Tensor>& out, bool async);
  void note(CommOp op, const at::Tensor& t, int64_t dim, bool async);
  // Starts the backend's collective (errors mapped to CommError) and packs the handle.
  CommWork launch(CommOp op, const std::function<c10::intrusive_ptr<c10d::Work>()>& start, at::Tensor out,
                  std::vector<at::Tensor> keep, std::function<void()> finish);
  std::string describe(CommOp op) const;

  c10::intrusive_ptr<c10d::ProcessGroup> pg_;
  CommOptions opts_;
  int rank_ = 0;
  int size_ = 1;
  std::string name_;
  std::array<int64_t, kNumCommOps> counts_{};
  // describe(op) of every op, made once in the constructor; a CommWork shares the one it needs.
  std::shared_ptr<const std::array<std::string, kNumCommOps>> descriptions_;
  std::vector<CommRecord> log_;
  int64_t collective_ticks_ = 0;  // collective_ns in cpp/comm/tick.h's ticks
  // all_gather's dim != 0 staging (see Layout above); grown, never shrunk.
  at::Tensor gather_staging_;
};

// A context-parallel layer's check of its comm against the metadata it is given, one wording for
// every mode (DCP, PCP, DSA-CP): metadata built for `world` > 1 ranks needs a comm of that size in
// which this process is `rank`; metadata built for one rank refuses a comm of several. `mode` names
// the mode ("DCP"), `comm_name` the layer's option ("dcp_comm"), `world_field` the builder's
// ("dcp_world_size"). InvalidArgument otherwise.
void check_comm_matches(const Comm* comm, int32_t world, int32_t rank, const char* mode, const char* comm_name,
                        const char* world_field);

}  // namespace aar::cp
