// The graph layer on its own (graph/graph_params.h, graph/captured_call.h): a
// captured call of no backend, written here against the interface, goes through
// capture, update (check, refresh, re-issue, revert) and replay with the store's
// documented contract. The backends' own calls are tested through their layers
// (tests/python/test_graph.py, test_mla_graph.py, test_fault_injection.py).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "ascend_attn_rt/errors.h"
#include "ascend_attn_rt/graph/graph_params.h"

namespace {

using aar::graph::CaptureScope;
using aar::graph::ClosureCall;
using aar::graph::GraphHooks;
using aar::graph::GraphParams;
using aar::graph::HookGraphProvider;
using aar::graph::RecordingGraphProvider;
using aar::graph::StepParams;
using aar::graph::UpdatePass;

constexpr int64_t kBucket = 4;

// A call whose one host parameter is the step's request count. It refuses steps
// of more requests than the bucket, and its launch fails while `fail_launch`.
struct FakeCall final : aar::graph::CapturedCall {
  FakeCall(int64_t layer, std::vector<std::string>* log)
      : CapturedCall("fake", layer, 0, /*has_params=*/true), log(log) {}
  void check(const StepParams& sp, int64_t bucket) const override {
    AAR_CHECK_ARG(sp.num_reqs <= bucket, "fake call of layer ", layer_index(), ": ", sp.num_reqs,
                  " requests do not fit bucket ", bucket);
  }
  void refresh(const StepParams& sp, const UpdatePass&) override {
    prev = value;
    value = sp.num_reqs;
  }
  void revert() noexcept override { value = prev; }
  void launch() override {
    if (fail_launch) throw std::runtime_error("launch failed");
    log->push_back("launch " + std::to_string(layer_index()) + " with " + std::to_string(value));
  }
  int64_t value = 0, prev = 0;
  bool fail_launch = false;
  std::vector<std::string>* log;
};

StepParams step(int64_t reqs) {
  StepParams sp;
  sp.num_reqs = reqs;
  return sp;
}

// Captures layers 2, 0, 1 (out of order) and returns them in layer order.
std::vector<FakeCall*> capture(GraphParams& g, std::vector<std::string>* log) {
  std::vector<FakeCall*> calls(3);
  CaptureScope scope(g, kBucket);
  for (int64_t layer : {2, 0, 1}) {
    auto c = std::make_unique<FakeCall>(layer, log);
    calls[layer] = c.get();
    g.capture_call(std::move(c));
  }
  return calls;
}

std::vector<int64_t> values(const std::vector<FakeCall*>& calls) {
  std::vector<int64_t> v;
  for (const FakeCall* c : calls) v.push_back(c->value);
  return v;
}

TEST(Graph, UpdateRefreshesInLayerOrderAndReplayRunsTheCalls) {
  GraphParams g(std::make_shared<RecordingGraphProvider>());
  std::vector<std::string> log;
  const std::vector<FakeCall*> calls = capture(g, &log);
  EXPECT_TRUE(log.empty());  // the recording provider runs nothing at capture
  EXPECT_THROW(g.replay(kBucket), aar::InvalidArgument);  // not updated yet
  g.update(kBucket, {step(3)});
  EXPECT_EQ(values(calls), (std::vector<int64_t>{3, 3, 3}));
  g.replay(kBucket);
  EXPECT_EQ(log, (std::vector<std::string>{"launch 0 with 3", "launch 1 with 3", "launch 2 with 3"}));
  EXPECT_THROW(g.replay(kBucket), aar::InvalidArgument);  // a replay consumes its update
}

TEST(Graph, ARejectedStepChangesNoCall) {
  GraphParams g(std::make_shared<RecordingGraphProvider>());
  std::vector<std::string> log;
  const std::vector<FakeCall*> calls = capture(g, &log);
  g.update(kBucket, {step(2)});
  try {
    g.update(kBucket, {step(kBucket + 1)});
    FAIL() << "a step that does not fit was accepted";
  } catch (const aar::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("do not fit bucket 4"), std::string::npos) << e.what();
  }
  EXPECT_EQ(values(calls), (std::vector<int64_t>{2, 2, 2}));
  g.replay(kBucket);  // the earlier update still stands
  EXPECT_EQ(log.size(), 3u);
}

TEST(Graph, AFailedReissueRevertsItsCallAndLeavesTheBucketNotUpdated) {
  std::vector<std::string> hooks;
  GraphHooks h;
  h.task_update_begin = [&](aar::graph::Handle) { hooks.push_back("begin"); };
  h.task_update_end = [&] { hooks.push_back("end"); };
  GraphParams g(std::make_shared<HookGraphProvider>(h));
  std::vector<std::string> log;
  const std::vector<FakeCall*> calls = capture(g, &log);  // the NPU-like provider launches at capture
  EXPECT_EQ(log.size(), 3u);
  g.update(kBucket, {step(1)});
  calls[1]->fail_launch = true;
  hooks.clear();
  EXPECT_THROW(g.update(kBucket, {step(4)}), std::runtime_error);
  // Layer 0 took the new step, layer 1 (whose re-issue failed) and layer 2 kept the previous one.
  EXPECT_EQ(values(calls), (std::vector<int64_t>{4, 1, 1}));
  EXPECT_EQ(hooks, (std::vector<std::string>{"begin", "end", "begin", "end"}));  // the failed update closed
  EXPECT_FALSE(g.bucket(kBucket).updated);
  calls[1]->fail_launch = false;
  g.update(kBucket, {step(4)});
  EXPECT_EQ(values(calls), (std::vector<int64_t>{4, 4, 4}));
  EXPECT_TRUE(g.bucket(kBucket).updated);
}

TEST(Graph, ABucketOfClosuresReplaysWithoutUpdates) {
  GraphParams g(std::make_shared<RecordingGraphProvider>());
  int runs = 0;
  {
    CaptureScope scope(g, kBucket);
    g.capture_call(std::make_unique<ClosureCall>(0, 0, [&] { ++runs; }));
  }
  g.replay(kBucket);
  g.replay(kBucket);
  EXPECT_EQ(runs, 2);
  EXPECT_EQ(std::string(g.bucket(kBucket).calls[0].call->kind()), "prepare");
}

TEST(Graph, ABucketWhoseLayerIsDestroyedIsRefusedByName) {
  // docs/design/graph.md §4.6: a layer's life token, held weakly by the bucket; once the layer is gone,
  // update, update_draft and replay refuse the bucket naming it, and run nothing.
  GraphParams g(std::make_shared<RecordingGraphProvider>());
  int runs = 0;
  auto life = std::make_shared<const int>(0);
  aar::graph::note_layer_life(life, "test.Layer", 7);  // outside a capture: nothing
  {
    CaptureScope scope(g, kBucket);
    aar::graph::note_layer_life(life, "test.Layer", 7);
    aar::graph::note_layer_life(life, "test.Layer", 7);  // once per layer
    g.capture_call(std::make_unique<ClosureCall>(7, 0, [&] { ++runs; }));
  }
  EXPECT_EQ(g.bucket(kBucket).owners.size(), 1u);
  g.replay(kBucket);
  EXPECT_EQ(runs, 1);
  life.reset();
  const auto refused = [&](const std::function<void()>& f, const std::string& op) {
    try {
      f();
      ADD_FAILURE() << op << " ran on a bucket whose layer is gone";
    } catch (const std::invalid_argument& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find(op + " of bucket"), std::string::npos) << m;
      EXPECT_NE(m.find("test.Layer (layer 7)"), std::string::npos) << m;
      EXPECT_NE(m.find("destroyed"), std::string::npos) << m;
    }
  };
  refused([&] { g.replay(kBucket); }, "replay");
  refused([&] { g.update(kBucket, {step(1)}); }, "update");
  refused([&] { g.update_draft(kBucket, {step(1)}); }, "update_draft");
  EXPECT_EQ(runs, 1);
  g.release(kBucket);
  EXPECT_FALSE(g.has(kBucket));
}

TEST(Graph, SharedWorkspacesFollowTheStorePolicy) {
  for (auto policy : {aar::graph::WorkspacePolicy::FirstWins, aar::graph::WorkspacePolicy::MaxOverLayers}) {
    GraphParams g(std::make_shared<RecordingGraphProvider>(), policy);
    int queries = 0;
    {
      CaptureScope scope(g, kBucket);
      for (int64_t n : {8, 32, 16}) {
        g.offer_workspace(g.shared_workspace("ws"), [&] {
          ++queries;
          return at::empty({n}, at::kByte);
        });
      }
    }
    const std::optional<at::Tensor> ws = g.bucket(kBucket).workspace("ws");
    ASSERT_TRUE(ws.has_value());
    if (policy == aar::graph::WorkspacePolicy::FirstWins) {
      EXPECT_EQ(queries, 1);  // the kept workspace is not recomputed
      EXPECT_EQ(ws->numel(), 8);
    } else {
      EXPECT_EQ(queries, 3);
      EXPECT_EQ(ws->numel(), 32);
    }
    EXPECT_FALSE(g.bucket(kBucket).workspace("other").has_value());
  }
}

}  // namespace

// docs/design/graph.md §1.5: a host callback between device work.
TEST(Graph, AHostCallbackRunsInOrderAndTakesEachStepFromTheUpdate) {
  GraphParams g(std::make_shared<RecordingGraphProvider>());
  std::vector<std::string> log;
  int64_t taken = -1;
  {
    CaptureScope scope(g, kBucket);
    g.capture_call(std::make_unique<ClosureCall>(0, 0, [&] { log.push_back("before"); }));
    g.capture_call(std::make_unique<aar::graph::HostCallbackCall>(
        0, 0, [&] { log.push_back("host " + std::to_string(taken)); },
        [](const StepParams& sp, int64_t bucket, const aar::graph::UpdatePass&) {
          AAR_CHECK_ARG(sp.num_reqs <= bucket, "host callback: ", sp.num_reqs, " requests");
        },
        [&](const StepParams& sp, const aar::graph::UpdatePass&) { taken = sp.num_reqs; }));
    g.capture_call(std::make_unique<ClosureCall>(0, 0, [&] { log.push_back("after"); }));
  }
  EXPECT_TRUE(log.empty());  // nothing ran at capture
  EXPECT_FALSE(g.bucket(kBucket).updated);  // the callback takes its step from an update
  EXPECT_THROW(g.replay(kBucket), std::invalid_argument);
  EXPECT_THROW(g.update(kBucket, {step(kBucket + 1)}), std::invalid_argument);  // checked, nothing taken
  EXPECT_EQ(taken, -1);
  g.update(kBucket, {step(3)});
  g.replay(kBucket);
  EXPECT_EQ(log, (std::vector<std::string>{"before", "host 3", "after"}));
  EXPECT_THROW(g.replay(kBucket), std::invalid_argument);  // a replay consumes the update
  EXPECT_THROW(g.update_draft(kBucket, {step(2)}), aar::NotSupported);
  g.update(kBucket, {step(2)});
  g.replay(kBucket);
  EXPECT_EQ(log.back(), "after");
  EXPECT_EQ(log[log.size() - 2], "host 2");
}

// docs/design/graph.md §1.6: the recording provider's deferred mode models the stream a device's host
// callbacks wait on; each update's pass tells the callbacks whether it replaces an unreplayed one.
TEST(Graph, DeferredHostCallbacksRunLaterInStreamOrder) {
  auto rec = std::make_shared<RecordingGraphProvider>();
  GraphParams g(rec);
  std::vector<std::string> log;
  std::vector<std::pair<uint64_t, uint64_t>> passes;  // (id, unreplayed) of every refresh
  int64_t taken = -1;
  auto life = std::make_shared<int>(0);  // a layer's life token
  {
    CaptureScope scope(g, kBucket);
    g.note_owner(life, "the test layer");
    g.capture_call(std::make_unique<ClosureCall>(0, 0, [&] { log.push_back("before " + std::to_string(taken)); }));
    g.capture_call(std::make_unique<aar::graph::HostCallbackCall>(
        0, 0, [&] { log.push_back("host " + std::to_string(taken)); }, aar::graph::HostCallbackCall::Check{},
        [&](const StepParams& sp, const UpdatePass& pass) {
          taken = sp.num_reqs;
          passes.emplace_back(pass.id, pass.unreplayed);
        }));
    g.capture_call(std::make_unique<ClosureCall>(0, 0, [&] { log.push_back("after " + std::to_string(taken)); }));
  }
  EXPECT_FALSE(rec->defers_host_callbacks());  // off by default
  rec->set_defer_host_callbacks(true);
  g.update(kBucket, {step(1)});
  g.replay(kBucket);
  // Up to the host callback at once, the rest queued (a device stream waits on the callback).
  EXPECT_EQ(log, (std::vector<std::string>{"before 1"}));
  EXPECT_EQ(rec->deferred(), 2u);
  g.update(kBucket, {step(2)});  // the host moved on
  g.replay(kBucket);             // queued whole behind the pending work
  EXPECT_EQ(log.size(), 1u);
  EXPECT_EQ(rec->deferred(), 5u);
  EXPECT_EQ(rec->run_deferred(), 5);
  // The queued work ran in order, after the second update (the callback read taken = 2: what a
  // callback reading the builder's lists instead of a snapshot would see).
  EXPECT_EQ(log, (std::vector<std::string>{"before 1", "host 2", "after 2", "before 2", "host 2", "after 2"}));
  // An update nobody replayed is replaced by the next (the CPU provider sees it), a replayed one is not.
  ASSERT_EQ(passes.size(), 2u);
  EXPECT_EQ(passes[1].second, 0u);
  g.update(kBucket, {step(3)});
  g.update(kBucket, {step(3)});
  ASSERT_EQ(passes.size(), 4u);
  EXPECT_EQ(passes[2].second, 0u);
  EXPECT_EQ(passes[3].second, passes[2].first);
  // Queued work of a destroyed layer or a released bucket refuses to run.
  g.replay(kBucket);
  g.update(kBucket, {step(3)});
  g.replay(kBucket);
  EXPECT_EQ(rec->deferred(), 5u);
  const size_t ran = log.size();
  life.reset();
  EXPECT_THROW(rec->run_deferred(), std::invalid_argument);
  EXPECT_EQ(rec->deferred(), 4u);  // the failing entry is dropped, the rest stay
  g.release(kBucket);
  EXPECT_THROW(rec->run_deferred(), std::invalid_argument);
  EXPECT_EQ(rec->deferred(), 3u);
  rec->drop_deferred();
  EXPECT_EQ(rec->deferred(), 0u);
  EXPECT_EQ(log.size(), ran);  // none of it ran
}

TEST(Graph, ADeviceProviderLaunchesTheHostCallbackAndKeepsItsError) {
  // Without the hook the capture is refused (the work would silently not run) and the bucket dropped.
  {
    GraphParams g(std::make_shared<HookGraphProvider>(GraphHooks{}));
    EXPECT_THROW(
        {
          CaptureScope scope(g, kBucket);
          g.capture_call(std::make_unique<aar::graph::HostCallbackCall>(0, 0, [] {}));
        },
        aar::NotSupported);
    EXPECT_FALSE(g.has(kBucket));
  }
  std::vector<std::pair<void (*)(void*), void*>> launched;
  GraphHooks h;
  h.launch_host_func = [&](void (*fn)(void*), void* arg) { launched.emplace_back(fn, arg); };
  GraphParams g(std::make_shared<HookGraphProvider>(h));
  bool fail = false;
  int runs = 0;
  {
    CaptureScope scope(g, kBucket);
    g.capture_call(std::make_unique<aar::graph::HostCallbackCall>(
        0, 0,
        [&] {
          if (fail) throw std::runtime_error("callback failed");
          ++runs;
        },
        aar::graph::HostCallbackCall::Check{}, [](const StepParams&, const aar::graph::UpdatePass&) {}));
  }
  ASSERT_EQ(launched.size(), 1u);
  EXPECT_EQ(runs, 0);  // launched into the device graph, not run
  g.update(kBucket, {step(1)});
  launched[0].first(launched[0].second);  // what a device replay does
  EXPECT_EQ(runs, 1);
  fail = true;
  launched[0].first(launched[0].second);  // the error cannot cross the stream: kept...
  EXPECT_THROW(g.update(kBucket, {step(1)}), std::runtime_error);  // ...and raised by the next update
  fail = false;
  g.update(kBucket, {step(1)});  // once
  launched[0].first(launched[0].second);
  EXPECT_EQ(runs, 2);
}
