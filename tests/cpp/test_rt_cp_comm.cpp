// cp::Comm against a fake c10d backend in one process: a group of W "mirror"
// ranks that all hold this rank's input (the upstream mocks of docs/design/cp.md §9:
// all-gather = W copies, all-to-all = this rank's block from every peer,
// reduce-scatter = W times this rank's block), reached through the real
// c10d::ProcessGroup and its dispatcher ops. It checks the interface's layout
// work (dims, staging, preallocated outputs), the counter and log, argument
// errors before any collective, failures mapped to CommError, and the group
// registry lookup. The real multi-process checks are tests/python/test_cp_comm.py.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <string>
#include <vector>

#include "ascend_attn_rt/comm/comm.h"
#include "ascend_attn_rt/errors.h"
#include "ascend_attn_rt/sparse/oproj_switch.h"

namespace {

using aar::cp::Comm;
using aar::cp::CommError;
using aar::cp::CommOp;
using aar::cp::CommOptions;

class DoneWork : public c10d::Work {
 public:
  explicit DoneWork(bool fail) : fail_(fail) {}
  bool wait(std::chrono::milliseconds) override {
    if (fail_) TORCH_CHECK(false, "fake peer closed the connection");
    return true;
  }
  bool isCompleted() override { return true; }

 private:
  bool fail_;
};

class MirrorBackend : public c10d::Backend {
 public:
  MirrorBackend(int rank, int size) : Backend(rank, size) {}
  bool fail_on_wait = false;
  bool fail_on_launch = false;
  std::chrono::milliseconds last_timeout{0};

  const std::string getBackendName() const override { return "mirror"; }

  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& out, at::Tensor& in,
                                                 const c10d::AllgatherOptions& o) override {
    start(o.timeout);
    for (int i = 0; i < size_; ++i) out.narrow(0, i * in.size(0), in.size(0)).copy_(in);
    return done();
  }
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& out, at::Tensor& in, std::vector<int64_t>& out_splits,
                                               std::vector<int64_t>& in_splits,
                                               const c10d::AllToAllOptions& o) override {
    start(o.timeout);
    EXPECT_TRUE(out_splits.empty() && in_splits.empty());  // equal splits
    const int64_t b = in.size(0) / size_;
    for (int i = 0; i < size_; ++i) out.narrow(0, i * b, b).copy_(in.narrow(0, rank_ * b, b));
    return done();
  }
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& ts, const c10d::AllreduceOptions& o) override {
    start(o.timeout);
    EXPECT_EQ(o.reduceOp, c10d::ReduceOp::SUM);
    for (auto& t : ts) t.mul_(size_);  // every rank mirrors this one
    return done();
  }
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& out, at::Tensor& in,
                                                      const c10d::ReduceScatterOptions& o) override {
    start(o.timeout);
    EXPECT_EQ(o.reduceOp, c10d::ReduceOp::SUM);
    const int64_t b = in.size(0) / size_;
    out.copy_(in.narrow(0, rank_ * b, b) * size_);
    return done();
  }

 private:
  void start(std::chrono::milliseconds t) {
    last_timeout = t;
    TORCH_CHECK(!fail_on_launch, "fake backend refused the collective");
  }
  c10::intrusive_ptr<c10d::Work> done() { return c10::make_intrusive<DoneWork>(fail_on_wait); }
};

struct Fake {
  c10::intrusive_ptr<c10d::ProcessGroup> pg;
  c10::intrusive_ptr<MirrorBackend> be;
};

Fake make_group(int rank, int size, const std::string& name = "fake") {
  Fake f;
  f.pg = c10::make_intrusive<c10d::ProcessGroup>(rank, size);
  f.be = c10::make_intrusive<MirrorBackend>(rank, size);
  f.pg->setBackend(c10::DeviceType::CPU, c10d::ProcessGroup::BackendType::CUSTOM, f.be);
  f.pg->setDefaultBackend(c10d::ProcessGroup::BackendType::CUSTOM);
  f.pg->setGroupName(name);
  return f;
}

at::Tensor ramp(std::vector<int64_t> shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return at::arange(n, at::kFloat).view(shape);
}

TEST(CpComm, AllGatherEveryDimMatchesConcatenation) {
  for (int w : {1, 2, 4}) {
    Fake f = make_group(w - 1, w);
    Comm c(f.pg);
    EXPECT_EQ(c.size(), w);
    EXPECT_EQ(c.rank(), w - 1);
    const at::Tensor t = ramp({2, 3, 8});
    for (int64_t dim : {0, 1, 2, -1}) {
      std::vector<at::Tensor> copies(w, t);
      const at::Tensor expect = at::cat(copies, dim);
      EXPECT_TRUE(at::equal(c.all_gather(t, dim), expect)) << "W=" << w << " dim=" << dim;
      at::Tensor out = at::full(expect.sizes(), -1.0f);
      const at::Tensor got = c.all_gather(t, dim, out);
      EXPECT_TRUE(got.is_same(out));
      EXPECT_TRUE(at::equal(out, expect));
    }
    // A transposed (non-contiguous) input.
    const at::Tensor tt = t.transpose(0, 2);
    std::vector<at::Tensor> copies(w, tt);
    EXPECT_TRUE(at::equal(c.all_gather(tt, 1), at::cat(copies, 1)));
    EXPECT_EQ(c.calls(CommOp::AllGather), 9);
    EXPECT_EQ(f.be->last_timeout, std::chrono::milliseconds(60000));  // the bounded default
  }
}

TEST(CpComm, AllToAllAndReduceScatter) {
  Fake f = make_group(1, 4);
  Comm c(f.pg, CommOptions{std::chrono::milliseconds(1500), true});
  const at::Tensor t = ramp({8, 3});
  const at::Tensor blk = t.narrow(0, 2, 2);  // rank 1's block
  EXPECT_TRUE(at::equal(c.all_to_all_single(t), at::cat({blk, blk, blk, blk}, 0)));
  EXPECT_EQ(f.be->last_timeout, std::chrono::milliseconds(1500));
  const at::Tensor r = ramp({4, 8, 2});
  EXPECT_TRUE(at::equal(c.reduce_scatter(r, 0), r.narrow(0, 1, 1) * 4));
  EXPECT_TRUE(at::equal(c.reduce_scatter(r, 1), r.narrow(1, 2, 2) * 4));
  at::Tensor out = at::empty({4, 8, 2}, at::kFloat).narrow(1, 0, 2).contiguous();
  c.reduce_scatter(r, -2, out);
  EXPECT_TRUE(at::equal(out, r.narrow(1, 2, 2) * 4));
  EXPECT_EQ(c.calls(), 4);
  ASSERT_EQ(c.log().size(), 4u);
  EXPECT_EQ(c.log()[0].op, CommOp::AllToAllSingle);
  EXPECT_EQ(c.log()[2].op, CommOp::ReduceScatter);
  EXPECT_EQ(c.log()[2].dim, 1);
  EXPECT_EQ(c.log()[3].dim, 1);  // -2 is logged wrapped
  EXPECT_EQ(c.log()[1].shape, (std::vector<int64_t>{4, 8, 2}));
  EXPECT_EQ(c.log()[1].group, "fake");
  EXPECT_FALSE(c.log()[1].async);
}

TEST(CpComm, AsyncHandles) {
  Fake f = make_group(0, 2);
  Comm c(f.pg, CommOptions{std::chrono::milliseconds(1000), true});
  const at::Tensor t = ramp({2, 8});
  aar::cp::CommWork w = c.all_gather_async(t, 1);
  EXPECT_FALSE(w.waited());
  aar::cp::CommWork moved = std::move(w);
  EXPECT_TRUE(w.waited());  // the moved-from handle owns nothing
  const at::Tensor got = moved.wait();
  EXPECT_TRUE(at::equal(got, at::cat({t, t}, 1)));
  EXPECT_TRUE(moved.wait().is_same(got));
  EXPECT_TRUE(moved.is_completed());
  EXPECT_TRUE(c.log().back().async);
}

TEST(CpComm, BadArgumentsBeforeAnyCollective) {
  Fake f = make_group(0, 2);
  Comm c(f.pg, CommOptions{std::chrono::milliseconds(1000), true});
  const at::Tensor t = ramp({3, 4});
  at::Tensor out = at::full({3, 8}, 5.0f);
  EXPECT_THROW(c.all_gather(t, 2), aar::InvalidArgument);
  EXPECT_THROW(c.all_gather(t, 1, at::empty({3, 4})), aar::InvalidArgument);
  EXPECT_THROW(c.all_gather(t, 1, out.to(at::kDouble)), aar::InvalidArgument);
  EXPECT_THROW(c.all_gather(t, 0, at::empty({4, 6}).t()), aar::InvalidArgument);
  EXPECT_THROW(c.all_gather(t, 1, t), aar::InvalidArgument);
  EXPECT_THROW(c.all_to_all_single(t), aar::InvalidArgument);  // 3 rows over 2 ranks
  EXPECT_THROW(c.reduce_scatter(ramp({2, 3}), 1), aar::InvalidArgument);
  EXPECT_THROW(Comm(f.pg, CommOptions{std::chrono::milliseconds(0), false}), aar::InvalidArgument);
  EXPECT_EQ(c.calls(), 0);
  EXPECT_TRUE(c.log().empty());
  EXPECT_TRUE(at::equal(out, at::full({3, 8}, 5.0f)));
}

TEST(CpComm, BackendFailuresAreCommErrors) {
  Fake f = make_group(1, 2, "broken");
  Comm c(f.pg);
  f.be->fail_on_wait = true;
  try {
    c.all_gather(ramp({2, 8}), 0);
    FAIL() << "no error";
  } catch (const CommError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("cp::Comm all_gather on group 'broken' (rank 1 of 2) failed"), std::string::npos) << msg;
    EXPECT_NE(msg.find("fake peer closed the connection"), std::string::npos) << msg;
  }
  f.be->fail_on_wait = false;
  f.be->fail_on_launch = true;
  EXPECT_THROW(c.all_to_all_single(ramp({2, 8})), CommError);
  // A failed exchange still counts (it was issued).
  EXPECT_EQ(c.calls(), 2);
  // A dropped async handle whose wait fails does not throw from its destructor.
  f.be->fail_on_launch = false;
  f.be->fail_on_wait = true;
  { aar::cp::CommWork w = c.reduce_scatter_async(ramp({2, 8}), 0); }
}

TEST(CpComm, FromRegisteredGroupName) {
  Fake f = make_group(0, 2, "aar_test_registered");
  c10d::register_process_group("aar_test_registered", f.pg);
  Comm c = Comm::from_group_name("aar_test_registered");
  EXPECT_EQ(c.group().get(), f.pg.get());
  EXPECT_EQ(c.group_name(), "aar_test_registered");
  c10d::unregister_process_group("aar_test_registered");
  EXPECT_THROW(Comm::from_group_name("aar_test_registered"), aar::InvalidArgument);
}

}  // namespace

TEST(CpComm, AllReduceSumsInPlaceAndIsCounted) {
  Fake f = make_group(0, 3);
  Comm c(f.pg, CommOptions{std::chrono::milliseconds(1000), true});
  at::Tensor t = ramp({2, 3});
  const at::Tensor r = c.all_reduce(t);
  EXPECT_TRUE(r.is_same(t));
  EXPECT_TRUE(at::equal(t, ramp({2, 3}) * 3));
  EXPECT_EQ(c.calls(CommOp::AllReduce), 1);
  EXPECT_EQ(c.log().back().op, CommOp::AllReduce);
  EXPECT_STREQ(aar::cp::to_string(CommOp::AllReduce), "all_reduce");
  at::Tensor nc = ramp({3, 2}).t();
  EXPECT_THROW(c.all_reduce(nc), aar::InvalidArgument);  // in place: contiguous only
  EXPECT_EQ(c.calls(CommOp::AllReduce), 1);
}

// The DSA-CP o_proj full-weight switch (docs/design/sparse_cp.md §7): the pool is allocated once and
// gathered in rank order; a Guard switches the layer's handle to it and restores the shard on every
// path, an exception included; the pool is intact afterwards.
TEST(OProjFullWeight, GuardRestoresTheShardOnEveryPath) {
  Fake f = make_group(1, 2);
  Comm c(f.pg);
  at::Tensor slot = ramp({4, 3});
  const at::Tensor shard = slot;
  aar::sparse::OProjFullWeight w(slot, c);
  const void* pool_addr = w.pool().data_ptr();
  ASSERT_EQ(w.pool().sizes(), (c10::IntArrayRef{4, 6}));
  w.gather();
  EXPECT_TRUE(at::equal(w.pool(), at::cat({shard, shard}, 1)));  // the mirror: every rank holds this shard
  EXPECT_EQ(c.calls(CommOp::AllGather), 1);
  {
    aar::sparse::OProjFullWeight::Guard g(w);
    EXPECT_TRUE(slot.is_same(w.pool()));
    EXPECT_TRUE(w.switched());
    EXPECT_THROW({ aar::sparse::OProjFullWeight::Guard nested(w); }, aar::InvalidArgument);  // no nesting
    EXPECT_THROW(w.gather(), aar::InvalidArgument);                               // not during a switch
  }
  EXPECT_TRUE(slot.is_same(shard));
  EXPECT_FALSE(w.switched());
  const at::Tensor pool_before = w.pool().clone();
  try {
    aar::sparse::OProjFullWeight::Guard g(w);
    EXPECT_TRUE(slot.is_same(w.pool()));
    throw std::runtime_error("failure mid-switch");
  } catch (const std::runtime_error&) {
  }
  EXPECT_TRUE(slot.is_same(shard));
  EXPECT_TRUE(at::equal(shard, ramp({4, 3})));
  EXPECT_TRUE(at::equal(w.pool(), pool_before));
  EXPECT_EQ(w.pool().data_ptr(), pool_addr);
  w.gather();  // the next switch gathers into the same pool
  EXPECT_EQ(w.pool().data_ptr(), pool_addr);
  // A handle replaced behind the switch's back is refused by name.
  slot = ramp({4, 3});
  EXPECT_THROW(w.gather(), aar::InvalidArgument);
  slot = shard;
  at::Tensor nc = ramp({3, 4}).t();
  EXPECT_THROW({ aar::sparse::OProjFullWeight bad(nc, c); }, aar::InvalidArgument);
}

// Several slots under one guard (DSA's wo_a along dim 0 and wo_b along dim 1, docs/design/sparse_cp.md §10):
// one all-gather per slot, every handle switched and restored together, an exception included.
TEST(OProjFullWeight, SeveralSlotsSwitchUnderOneGuard) {
  Fake f = make_group(1, 2);
  Comm c(f.pg);
  at::Tensor a = ramp({2, 3, 4}), b = ramp({5, 6});
  const at::Tensor sa = a, sb = b;
  aar::sparse::OProjFullWeight w({{&a, 0}, {&b, 1}}, c);
  ASSERT_EQ(w.num_slots(), 2u);
  ASSERT_EQ(w.pool(0).sizes(), (c10::IntArrayRef{4, 3, 4}));
  ASSERT_EQ(w.pool(1).sizes(), (c10::IntArrayRef{5, 12}));
  w.gather();
  EXPECT_EQ(c.calls(CommOp::AllGather), 2);
  EXPECT_TRUE(at::equal(w.pool(0), at::cat({sa, sa}, 0)));
  EXPECT_TRUE(at::equal(w.pool(1), at::cat({sb, sb}, 1)));
  try {
    aar::sparse::OProjFullWeight::Guard g(w);
    EXPECT_TRUE(a.is_same(w.pool(0)) && b.is_same(w.pool(1)));
    throw std::runtime_error("failure mid-switch");
  } catch (const std::runtime_error&) {
  }
  EXPECT_TRUE(a.is_same(sa) && b.is_same(sb));
  EXPECT_FALSE(w.switched());
  // A replaced handle is refused before any collective.
  b = ramp({5, 6});
  const int64_t before = c.calls();
  EXPECT_THROW(w.gather(), aar::InvalidArgument);
  EXPECT_EQ(c.calls(), before);
  b = sb;
  EXPECT_THROW(w.pool(2), aar::InvalidArgument);
  at::Tensor nc = ramp({3, 4}).t();
  EXPECT_THROW({ aar::sparse::OProjFullWeight bad({{&a, 0}, {&nc, 1}}, c); }, aar::InvalidArgument);
  EXPECT_THROW({ aar::sparse::OProjFullWeight bad({{&a, 3}}, c); }, aar::InvalidArgument);
}
