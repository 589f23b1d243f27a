// cp::Comm over c10d::ProcessGroup: argument checks, the dim <-> dim-0 block
// layout, bounded waits, the call counter and log (decisions in comm/comm.h).
#include "ascend_attn_rt/comm/comm.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <chrono>
#include <functional>
#include <numeric>
#include <sstream>
#include <utility>

#include "ascend_attn_rt/errors.h"
#include "tick.h"
#include "ascend_attn_rt/ops/dense.h"

namespace aar::cp {

const char* to_string(CommOp op) {
  switch (op) {
    case CommOp::AllGather:
      return "all_gather";
    case CommOp::AllToAllSingle:
      return "all_to_all_single";
    case CommOp::ReduceScatter:
      return "reduce_scatter";
    case CommOp::AllReduce:
      return "all_reduce";
  }
  return "?";
}

namespace {

std::string error_text(const std::exception& e) {
  if (const auto* c = dynamic_cast<const c10::Error*>(&e)) return c->what_without_backtrace();
  return e.what();
}

int64_t wrap_dim(const at::Tensor& t, int64_t dim, const char* op) {
  const int64_t n = t.dim();
  AAR_CHECK_ARG(n >= 1, "cp::Comm ", op, ": the input must have at least one dimension, got a 0-d tensor");
  AAR_CHECK_ARG(dim >= -n && dim < n, "cp::Comm ", op, ": dim=", dim, " is out of range for a ", n,
                "-d input of shape ", t.sizes());
  return dim < 0 ? dim + n : dim;
}

void check_input(const at::Tensor& t, const char* op) {
  AAR_CHECK_ARG(t.defined(), "cp::Comm ", op, ": the input must be a tensor");
}

// `out` given by the caller: exactly `sizes`, t's dtype and device, contiguous
// (it is written in place; a copy would leave the caller's tensor unwritten).
void check_out(const at::Tensor& out, const at::Tensor& t, c10::IntArrayRef sizes, const char* op) {
  AAR_CHECK_ARG(out.defined(), "cp::Comm ", op, ": out must be a tensor or None");
  AAR_CHECK_ARG(out.sizes() == sizes, "cp::Comm ", op, ": out must have shape ", sizes, ", got ", out.sizes());
  AAR_CHECK_ARG(out.scalar_type() == t.scalar_type(), "cp::Comm ", op, ": out must have the input's dtype ",
                t.scalar_type(), ", got ", out.scalar_type());
  AAR_CHECK_ARG(out.device() == t.device(), "cp::Comm ", op, ": out must be on the input's device ", t.device(),
                ", got ", out.device());
  AAR_CHECK_ARG(out.is_contiguous(), "cp::Comm ", op, ": out must be contiguous, got strides ", out.strides());
  AAR_CHECK_ARG(out.numel() == 0 || t.numel() == 0 || !out.is_alias_of(t), "cp::Comm ", op,
                ": out must not share memory with the input");
}

at::Tensor out_or_new(const std::optional<at::Tensor>& out, const at::Tensor& t, c10::IntArrayRef sizes,
                      const char* op) {
  if (out.has_value()) {
    check_out(*out, t, sizes, op);
    return *out;
  }
  return at::empty(sizes, t.options().memory_format(at::MemoryFormat::Contiguous));
}

}  // namespace

// ------------------------------------------------------------------ CommWork

CommWork::CommWork(CommWork&& o) noexcept
    : work_(std::move(o.work_)),
      out_(std::move(o.out_)),
      keep_(std::move(o.keep_)),
      finish_(std::move(o.finish_)),
      what_(std::move(o.what_)),
      timeout_(o.timeout_),
      done_(o.done_) {
  o.finish_ = nullptr;
  o.done_ = true;  // the moved-from handle owns nothing to wait for
}

CommWork& CommWork::operator=(CommWork&& o) noexcept {
  if (this != &o) {
    if (!done_) {
      try {
        wait();
      } catch (...) {
      }
    }
    work_ = std::move(o.work_);
    out_ = std::move(o.out_);
    keep_ = std::move(o.keep_);
    finish_ = std::move(o.finish_);
    what_ = std::move(o.what_);
    timeout_ = o.timeout_;
    done_ = o.done_;
    o.finish_ = nullptr;
    o.done_ = true;
  }
  return *this;
}

CommWork::~CommWork() {
  if (!done_) {
    try {
      wait();
    } catch (...) {
      // A destructor must not throw; the caller that wanted the error waits.
    }
  }
}

const at::Tensor& CommWork::wait() {
  if (done_) return out_;
  done_ = true;  // one attempt: a failed collective is not waited on twice
  try {
    if (work_) work_->wait(timeout_);
  } catch (const std::exception& e) {
    keep_.clear();
    throw CommError((what_ ? *what_ : std::string("cp::Comm collective")) + " failed: " + error_text(e));
  }
  if (finish_) finish_();
  keep_.clear();
  finish_ = nullptr;
  return out_;
}

bool CommWork::is_completed() const { return done_ || !work_ || work_->isCompleted(); }

// ---------------------------------------------------------------------- Comm

Comm::Comm(c10::intrusive_ptr<c10d::ProcessGroup> group, CommOptions opts) : pg_(std::move(group)), opts_(opts) {
  AAR_CHECK_ARG(pg_.defined(), "cp::Comm: group must be a process group, got none");
  AAR_CHECK_ARG(opts_.timeout.count() > 0, "cp::Comm: timeout must be positive, got ", opts_.timeout.count(), " ms");
  rank_ = pg_->getRank();
  size_ = pg_->getSize();
  name_ = pg_->getGroupName();
  AAR_CHECK_ARG(size_ >= 1 && rank_ >= 0 && rank_ < size_, "cp::Comm: group '", name_, "' has rank ", rank_,
                " of size ", size_);
  auto d = std::make_shared<std::array<std::string, kNumCommOps>>();
  for (int32_t k = 0; k < kNumCommOps; ++k) (*d)[static_cast<size_t>(k)] = describe(static_cast<CommOp>(k));
  descriptions_ = std::move(d);
}

Comm Comm::from_group_name(const std::string& group_name, CommOptions opts) {
  c10::intrusive_ptr<c10d::ProcessGroup> pg;
  try {
    pg = c10d::resolve_process_group(group_name);
  } catch (const std::exception& e) {
    throw_invalid("cp::Comm: no process group is registered under group_name '", group_name,
                  "': ", error_text(e));
  }
  return Comm(std::move(pg), opts);
}

int64_t Comm::calls() const { return std::accumulate(counts_.begin(), counts_.end(), int64_t{0}); }

namespace {

// A synchronous collective timed whole into `ticks` (docs/design/cp.md §8.1): from before `start`
// (the checks and the issue) to the end of the handle's teardown, the completion in between.
template <class Start>
at::Tensor timed_call(int64_t& ticks, Start&& start) {
  const int64_t t0 = detail::ticks();
  at::Tensor o;
  {
    CommWork w = start();
    o = w.wait();
  }
  ticks += detail::ticks() - t0;
  return o;
}

}  // namespace

// The tick rate's reference starts when the library is loaded (tick.h).
[[maybe_unused]] const double kTickReference = detail::ns_per_tick();

int64_t Comm::collective_ns() const {
  return static_cast<int64_t>(static_cast<double>(collective_ticks_) * detail::ns_per_tick() + 0.5);
}

void Comm::reset_counters() {
  counts_.fill(0);
  collective_ticks_ = 0;
  log_.clear();
}

std::string Comm::describe(CommOp op) const {
  std::ostringstream os;
  os << "cp::Comm " << to_string(op) << " on group '" << name_ << "' (rank " << rank_ << " of " << size_ << ")";
  return os.str();
}

void Comm::note(CommOp op, const at::Tensor& t, int64_t dim, bool async) {
  ++counts_[static_cast<size_t>(op)];
  if (opts_.log) log_.push_back(CommRecord{name_, op, t.sizes().vec(), t.scalar_type(), dim, async});
}

CommWork Comm::launch(CommOp op, const std::function<c10::intrusive_ptr<c10d::Work>()>& start, at::Tensor out,
                      std::vector<at::Tensor> keep, std::function<void()> finish) {
  CommWork w;
  if (ops::dense::no_compute()) {
    // The no-compute provider: noted and counted, nothing moves (a collective is a device kernel like
    // any other; every rank skips it alike, so no rank waits on a peer).
    w.out_ = std::move(out);
    w.done_ = true;
    return w;
  }
  const size_t k = static_cast<size_t>(op);
  w.what_ = std::shared_ptr<const std::string>(descriptions_, &(*descriptions_)[k]);  // aliasing: no string copy
  try {
    w.work_ = start();
  } catch (const std::exception& e) {
    throw CommError(*w.what_ + " failed: " + error_text(e));
  }
  w.out_ = std::move(out);
  w.keep_ = std::move(keep);
  w.finish_ = std::move(finish);
  w.timeout_ = opts_.timeout;
  w.done_ = false;
  return w;
}

CommWork Comm::all_gather_async(const at::Tensor& t, int64_t dim, const std::optional<at::Tensor>& out) {
  return start_all_gather(t, dim, out, true);
}

CommWork Comm::start_all_gather(const at::Tensor& t, int64_t dim, const std::optional<at::Tensor>& out, bool async) {
  constexpr const char* op = "all_gather";
  check_input(t, op);
  const int64_t k = wrap_dim(t, dim, op);
  std::vector<int64_t> osz = t.sizes().vec();
  osz[k] *= size_;
  at::Tensor o = out_or_new(out, t, osz, op);
  note(CommOp::AllGather, t, k, async);
  at::Tensor in = t.contiguous();
  c10d::AllgatherOptions opts;
  opts.timeout = opts_.timeout;
  if (k == 0) {
    // Rank blocks are dim-0 blocks of `o`: gather straight into it.
    return launch(CommOp::AllGather, [&] { return pg_->all_gather_single(o, in, opts); }, o, {in}, nullptr);
  }
  // c10d wants the gather buffer as [W * s_0, s_1, ..]; it is read as [W, s_0, ..].
  std::vector<int64_t> ssz = t.sizes().vec();
  ssz[0] *= size_;
  // Reuse the Comm's staging when it fits and nothing else holds its storage
  // (an unfinished async gather keeps a reference until its wait()).
  const int64_t need = std::accumulate(ssz.begin(), ssz.end(), int64_t{1}, std::multiplies<int64_t>());
  at::Tensor& st = gather_staging_;
  if (!st.defined() || st.scalar_type() != in.scalar_type() || st.device() != in.device() || st.numel() < need ||
      st.storage().use_count() > 1) {
    st = at::empty({need}, in.options());
  }
  at::Tensor staging = st.narrow(0, 0, need).view(ssz);
  std::vector<int64_t> sv = t.sizes().vec();
  sv.insert(sv.begin(), size_);
  std::vector<int64_t> ov = t.sizes().vec();  // o viewed as [.., W, s_k, ..]
  ov.insert(ov.begin() + k, size_);
  auto finish = [o, staging, sv, ov, k]() mutable { o.view(ov).copy_(staging.view(sv).movedim(0, k)); };
  return launch(
      CommOp::AllGather, [&] { return pg_->all_gather_single(staging, in, opts); }, o, {in, staging}, finish);
}

at::Tensor Comm::all_gather(const at::Tensor& t, int64_t dim, const std::optional<at::Tensor>& out) {
  return timed_call(collective_ticks_, [&] { return start_all_gather(t, dim, out, false); });
}

CommWork Comm::all_to_all_single_async(const at::Tensor& t, const std::optional<at::Tensor>& out) {
  return start_all_to_all_single(t, out, true);
}

CommWork Comm::start_all_to_all_single(const at::Tensor& t, const std::optional<at::Tensor>& out, bool async) {
  constexpr const char* op = "all_to_all_single";
  check_input(t, op);
  wrap_dim(t, 0, op);
  AAR_CHECK_ARG(t.size(0) % size_ == 0, "cp::Comm ", op, ": dim 0 of the input (", t.size(0),
                ") must be divisible by the group size ", size_, " (equal splits)");
  at::Tensor o = out_or_new(out, t, t.sizes(), op);
  note(CommOp::AllToAllSingle, t, 0, async);
  at::Tensor in = t.contiguous();
  c10d::AllToAllOptions opts;
  opts.timeout = opts_.timeout;
  // Empty split lists mean equal splits to c10d.
  return launch(
      CommOp::AllToAllSingle,
      [&] {
        std::vector<int64_t> no_splits;
        return pg_->all_to_all_single(o, in, no_splits, no_splits, opts);
      },
      o, {in}, nullptr);
}

at::Tensor Comm::all_to_all_single(const at::Tensor& t, const std::optional<at::Tensor>& out) {
  return timed_call(collective_ticks_, [&] { return start_all_to_all_single(t, out, false); });
}

CommWork Comm::reduce_scatter_async(const at::Tensor& t, int64_t dim, const std::optional<at::Tensor>& out) {
  return start_reduce_scatter(t, dim, out, true);
}

CommWork Comm::start_reduce_scatter(const at::Tensor& t, int64_t dim, const std::optional<at::Tensor>& out,
                                    bool async) {
  constexpr const char* op = "reduce_scatter";
  check_input(t, op);
  const int64_t k = wrap_dim(t, dim, op);
  AAR_CHECK_ARG(t.size(k) % size_ == 0, "cp::Comm ", op, ": dim ", k, " of the input (", t.size(k),
                ") must be divisible by the group size ", size_);
  std::vector<int64_t> osz = t.sizes().vec();
  osz[k] /= size_;
  at::Tensor o = out_or_new(out, t, osz, op);
  note(CommOp::ReduceScatter, t, k, async);
  c10d::ReduceScatterOptions opts;
  opts.reduceOp = c10d::ReduceOp::SUM;
  opts.timeout = opts_.timeout;
  if (k == 0) {
    at::Tensor in = t.contiguous();
    return launch(CommOp::ReduceScatter, [&] { return pg_->reduce_scatter_single(o, in, opts); }, o, {in}, nullptr);
  }
  // Rank r's share is the r-th block along k: make k the block dim.
  at::Tensor in = t.movedim(k, 0).contiguous();
  std::vector<int64_t> ssz = in.sizes().vec();
  ssz[0] /= size_;
  at::Tensor staging = at::empty(ssz, in.options());
  auto finish = [o, staging, k]() mutable { o.copy_(staging.movedim(0, k)); };
  return launch(
      CommOp::ReduceScatter, [&] { return pg_->reduce_scatter_single(staging, in, opts); }, o, {in, staging},
      finish);
}

at::Tensor Comm::reduce_scatter(const at::Tensor& t, int64_t dim, const std::optional<at::Tensor>& out) {
  return timed_call(collective_ticks_, [&] { return start_reduce_scatter(t, dim, out, false); });
}

at::Tensor Comm::all_reduce(const at::Tensor& t) {
  const int64_t t0 = detail::ticks();
  constexpr const char* op = "all_reduce";
  check_input(t, op);
  AAR_CHECK_ARG(t.is_contiguous(), "cp::Comm ", op, ": the input is reduced in place and must be contiguous, got "
                "strides ", t.strides());
  note(CommOp::AllReduce, t, 0, false);
  at::Tensor o;
  {
    c10d::AllreduceOptions opts;
    opts.reduceOp = c10d::ReduceOp::SUM;
    opts.timeout = opts_.timeout;
    std::vector<at::Tensor> ts{t};
    CommWork w = launch(CommOp::AllReduce, [&] { return pg_->allreduce(ts, opts); }, t, {t}, nullptr);
    o = w.wait();
  }  // the handle's teardown is the call's too (docs/design/cp.md §8.1)
  collective_ticks_ += detail::ticks() - t0;
  return o;
}

void check_comm_matches(const Comm* comm, int32_t world, int32_t rank, const char* mode, const char* comm_name,
                        const char* world_field) {
  if (world > 1) {
    AAR_CHECK_ARG(comm != nullptr, "metadata was built for ", mode, " rank ", rank, " of ", world,
                  " but the layer has no ", comm_name);
    AAR_CHECK_ARG(comm->size() == world && comm->rank() == rank, "metadata was built for ", mode, " rank ", rank,
                  " of ", world, " but the layer's ", comm_name, " is rank ", comm->rank(), " of ", comm->size());
  } else {
    const int32_t size = comm != nullptr ? comm->size() : 1;
    AAR_CHECK_ARG(size == 1, "the layer's ", comm_name, " has ", size, " ranks but the metadata was built without ",
                  mode, " (", world_field, "=1)");
  }
}

}  // namespace aar::cp
