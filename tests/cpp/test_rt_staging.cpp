// Staging buffers reused while an earlier copy is still in flight, and stale
// metadata. The device copy is simulated by hooks that queue the copies like a
// stream and run them only when a test (or an event wait) drains the queue, so
// a copy "completes late" on the CPU.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <deque>
#include <memory>
#include <vector>

#include "ascend_attn_rt/build_stamp.h"
#include "ascend_attn_rt/core/backend.h"
#include "ascend_attn_rt/errors.h"
#include "ascend_attn_rt/gqa/builder.h"
#include "ascend_attn_rt/mla/builder.h"
#include "ascend_attn_rt/sfa/builder.h"
#include "ascend_attn_rt/staging.h"

namespace {

// A stream: copies and event records run in order, when drained. The copy
// reads its host source when it runs, as a DMA engine does.
class LateCopies : public aar::StagingHooks {
 public:
  // honest_events == false models the builders before this change: no event,
  // so waiting for a buffer returns at once while its copy is still queued.
  explicit LateCopies(bool honest_events) : honest_(honest_events) {}

  void copy(const at::Tensor& dst, const at::Tensor& src) override {
    ++copies_;
    queue_.push_back({dst, src, -1});
  }
  void record(int slot) override { queue_.push_back({at::Tensor(), at::Tensor(), slot}); }
  void wait(int slot) override {
    ++waits_;
    waited_.push_back(slot);
    if (!honest_) return;
    // Run the stream up to the last record of `slot`.
    size_t last = queue_.size();
    for (size_t i = 0; i < queue_.size(); ++i) {
      if (queue_[i].slot == slot) last = i;
    }
    if (last == queue_.size()) return;
    for (size_t i = 0; i <= last; ++i) run_front();
  }
  // Runs the next queued copy (skipping event records); false when none is left.
  bool run_next_copy() {
    while (!queue_.empty()) {
      const bool is_copy = queue_.front().dst.defined();
      run_front();
      if (is_copy) return true;
    }
    return false;
  }
  int waits() const { return waits_; }
  size_t queued() const { return queue_.size(); }
  // Slots waited for, in order, and the copies enqueued so far.
  const std::vector<int>& waited_slots() const { return waited_; }
  int copies() const { return copies_; }

 private:
  struct Op {
    at::Tensor dst, src;
    int slot;
  };
  void run_front() {
    Op op = queue_.front();
    queue_.pop_front();
    if (op.dst.defined()) op.dst.copy_(op.src);
  }
  bool honest_;
  int waits_ = 0;
  int copies_ = 0;
  std::vector<int> waited_;
  std::deque<Op> queue_;
};

struct Step {
  std::vector<int32_t> qsl, seq, table;
  int32_t stride = 4;
};

// Two decode steps with different lengths and blocks.
Step step_a() { return {{0, 1, 2}, {5, 20}, {3, 0, 0, 0, 7, 1, 0, 0}}; }
Step step_b() { return {{0, 1, 2}, {9, 33}, {6, 0, 0, 0, 2, 5, 4, 0}}; }

// A step as a builder's BuildInputs (gqa:: or mla::, same field names).
template <class Inputs>
Inputs inputs_of(const Step& s) {
  Inputs in;
  in.query_start_loc = {s.qsl.data(), s.qsl.size()};
  in.seq_lens = {s.seq.data(), s.seq.size()};
  in.block_table = {s.table.data(), s.table.size()};
  in.block_table_stride = s.stride;
  return in;
}
aar::gqa::BuildInputs inputs(const Step& s) { return inputs_of<aar::gqa::BuildInputs>(s); }

aar::gqa::BuilderConfig gqa_config(std::shared_ptr<aar::StagingHooks> hooks, int buffers) {
  aar::gqa::BuilderConfig c;
  c.max_num_reqs = 4;
  c.max_num_tokens = 16;
  c.max_blocks_per_req = 4;
  c.block_size = 16;
  c.num_blocks = 8;
  c.separate_device_buffers = true;  // the device path, on the CPU
  c.staging_buffers = buffers;
  c.staging_hooks = std::move(hooks);
  return c;
}

// What the device should hold after a step's copy: the same step built by a
// builder whose device buffer is its host buffer.
struct Expected {
  at::Tensor qsl, slots, table;
};
Expected expected(const Step& s) {
  aar::gqa::BuilderConfig c = gqa_config(nullptr, 1);
  c.separate_device_buffers = false;
  aar::gqa::MetadataBuilder b(c);
  const aar::gqa::Metadata& md = b.build(inputs(s));
  return {md.query_start_loc.clone(), md.slot_mapping.clone(), md.block_tables.clone()};
}

// The device views of a build, held past the next build (they view the
// builder's single device buffer).
Expected device_views(const aar::gqa::Metadata& md) { return {md.query_start_loc, md.slot_mapping, md.block_tables}; }

bool equal(const Expected& got, const Expected& want) {
  return at::equal(got.qsl, want.qsl) && at::equal(got.slots, want.slots) && at::equal(got.table, want.table);
}

TEST(Staging, SingleBufferWithoutEventCorruptsALateCopy) {
  // The old behaviour: one host buffer rewritten by the next build while the
  // first build's copy is still queued. When the stream runs that copy, it
  // sends step B's data for step A.
  auto hooks = std::make_shared<LateCopies>(/*honest_events=*/false);
  aar::gqa::MetadataBuilder b(gqa_config(hooks, 1));
  const Expected a_dev = device_views(b.build(inputs(step_a())));
  b.build(inputs(step_b()));
  ASSERT_TRUE(hooks->run_next_copy());  // step A's copy, late
  EXPECT_FALSE(equal(a_dev, expected(step_a())));
  EXPECT_TRUE(at::equal(a_dev.slots, expected(step_b()).slots));  // step B's slots, under step A
}

TEST(Staging, TwoBuffersInTurnKeepALateCopyIntact) {
  auto hooks = std::make_shared<LateCopies>(/*honest_events=*/true);
  aar::gqa::MetadataBuilder b(gqa_config(hooks, 2));
  const Expected a_dev = device_views(b.build(inputs(step_a())));
  const Expected b_dev = device_views(b.build(inputs(step_b())));
  EXPECT_EQ(hooks->waits(), 0);  // the second build wrote the other buffer: no wait
  ASSERT_TRUE(hooks->run_next_copy());
  EXPECT_TRUE(equal(a_dev, expected(step_a())));
  ASSERT_TRUE(hooks->run_next_copy());
  EXPECT_TRUE(equal(b_dev, expected(step_b())));
  EXPECT_FALSE(hooks->run_next_copy());
}

TEST(Staging, ABufferIsRewrittenOnlyAfterItsCopyCompleted) {
  auto hooks = std::make_shared<LateCopies>(/*honest_events=*/true);
  aar::gqa::MetadataBuilder b(gqa_config(hooks, 2));
  const Expected a_dev = device_views(b.build(inputs(step_a())));
  b.build(inputs(step_b()));
  // The third build takes the first buffer again: it waits for step A's copy,
  // which then runs with step A's data.
  b.build(inputs(step_a()));
  EXPECT_EQ(hooks->waits(), 1);
  // The stream ran up to step A's record; the rest is still queued.
  EXPECT_GT(hooks->queued(), 0u);
  while (hooks->run_next_copy()) {
  }
  EXPECT_TRUE(equal(a_dev, expected(step_a())));
}

TEST(Staging, SingleBufferWaitsForThePreviousCopy) {
  auto hooks = std::make_shared<LateCopies>(/*honest_events=*/true);
  aar::gqa::MetadataBuilder b(gqa_config(hooks, 1));
  const Expected a_dev = device_views(b.build(inputs(step_a())));
  const Expected a_want = expected(step_a());
  b.build(inputs(step_b()));
  EXPECT_EQ(hooks->waits(), 1);
  // Step A's copy ran, with step A's data, before the buffer was rewritten;
  // step B's copy is still queued.
  EXPECT_TRUE(equal(a_dev, a_want));
  EXPECT_EQ(hooks->queued(), 2u);
  ASSERT_TRUE(hooks->run_next_copy());
  EXPECT_TRUE(equal(device_views(b.metadata()), expected(step_b())));
}

TEST(Staging, EngineBlockTableIsFreeOnceBuildReturns) {
  // On the device path block_table_staging is the engine's own table: the
  // build copies its rows, so rewriting it right away cannot reach the device.
  auto hooks = std::make_shared<LateCopies>(/*honest_events=*/true);
  aar::gqa::MetadataBuilder b(gqa_config(hooks, 2));
  at::Tensor t = b.block_table_staging();
  const Step a = step_a();
  for (int r = 0; r < 2; ++r) {
    for (int c = 0; c < 4; ++c) t[r][c] = a.table[r * 4 + c];
  }
  aar::gqa::BuildInputs in = inputs(a);
  in.block_table = {t.data_ptr<int32_t>(), 8};  // the batch's two rows of the engine's table
  const Expected dev = device_views(b.build(in));
  t.fill_(5);  // the engine moves on
  while (hooks->run_next_copy()) {
  }
  EXPECT_TRUE(equal(dev, expected(a)));
}

TEST(Staging, RejectedBuildKeepsTheTurnAndWritesNothing) {
  auto hooks = std::make_shared<LateCopies>(/*honest_events=*/true);
  aar::gqa::MetadataBuilder b(gqa_config(hooks, 2));
  b.build(inputs(step_a()));
  Step bad = step_b();
  bad.table[0] = 99;  // block id out of range
  EXPECT_THROW(b.build(inputs(bad)), aar::InvalidArgument);
  EXPECT_EQ(b.generation(), 1u);
  EXPECT_EQ(hooks->queued(), 2u);  // only step A's copy and record
}

// ---------------------------------------------------------------- MLA

aar::mla::BuilderConfig mla_config(std::shared_ptr<aar::StagingHooks> hooks, int buffers) {
  aar::mla::BuilderConfig c;
  c.max_num_reqs = 4;
  c.max_num_tokens = 16;
  c.max_blocks_per_req = 4;
  c.block_size = 16;
  c.num_blocks = 8;
  c.cos_table = at::arange(64 * 8, at::kFloat).view({64, 8});
  c.sin_table = -at::arange(64 * 8, at::kFloat).view({64, 8});
  c.separate_device_buffers = hooks != nullptr;
  c.staging_buffers = buffers;
  c.staging_hooks = std::move(hooks);
  return c;
}

aar::mla::BuildInputs mla_inputs(const Step& s) { return inputs_of<aar::mla::BuildInputs>(s); }

std::vector<at::Tensor> mla_views(const aar::mla::Metadata& md) {
  return {md.query_start_loc, md.slot_mapping, md.decode.block_table, md.decode.cos, md.decode.sin};
}

std::vector<at::Tensor> mla_expected(const Step& s) {
  aar::mla::MetadataBuilder b(mla_config(nullptr, 1));
  std::vector<at::Tensor> v = mla_views(b.build(mla_inputs(s)));
  for (auto& t : v) t = t.clone();
  return v;
}

bool all_equal(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  for (size_t i = 0; i < a.size(); ++i) {
    if (!at::equal(a[i], b[i])) return false;
  }
  return true;
}

TEST(Staging, MlaSingleBufferWithoutEventCorruptsALateCopy) {
  auto hooks = std::make_shared<LateCopies>(false);
  aar::mla::MetadataBuilder b(mla_config(hooks, 1));
  const auto a_dev = mla_views(b.build(mla_inputs(step_a())));
  b.build(mla_inputs(step_b()));
  ASSERT_TRUE(hooks->run_next_copy());
  EXPECT_FALSE(all_equal(a_dev, mla_expected(step_a())));
}

TEST(Staging, MlaTwoBuffersInTurnKeepALateCopyIntact) {
  auto hooks = std::make_shared<LateCopies>(true);
  aar::mla::MetadataBuilder b(mla_config(hooks, 2));
  const auto a_dev = mla_views(b.build(mla_inputs(step_a())));
  const auto b_dev = mla_views(b.build(mla_inputs(step_b())));
  EXPECT_EQ(hooks->waits(), 0);
  ASSERT_TRUE(hooks->run_next_copy());
  EXPECT_TRUE(all_equal(a_dev, mla_expected(step_a())));
  while (hooks->run_next_copy()) {
  }
  EXPECT_TRUE(all_equal(b_dev, mla_expected(step_b())));
  b.build(mla_inputs(step_a()));
  EXPECT_EQ(hooks->waits(), 1);
}

// ---------------------------------------------------------------- SFA

aar::sfa::BuilderConfig sfa_config(std::shared_ptr<aar::StagingHooks> hooks, int buffers, int drafts = 0) {
  aar::sfa::BuilderConfig c;
  c.max_num_reqs = 4;
  c.max_num_tokens = 16;
  c.max_blocks_per_req = 4;
  c.block_size = 16;
  c.num_blocks = 8;
  c.num_drafts = drafts;
  c.cos_table = at::arange(64 * 8, at::kFloat).view({64, 8});
  c.sin_table = -at::arange(64 * 8, at::kFloat).view({64, 8});
  c.separate_device_buffers = hooks != nullptr;
  c.staging_buffers = buffers;
  c.staging_hooks = std::move(hooks);
  return c;
}

aar::sfa::BuildInputs sfa_inputs(const Step& s) { return inputs_of<aar::sfa::BuildInputs>(s); }

std::vector<at::Tensor> sfa_views(const aar::sfa::Metadata& md) {
  return {md.query_start_loc, md.cum_query_lens, md.seq_lens, md.block_table, md.slot_mapping, md.cos, md.sin};
}

std::vector<at::Tensor> sfa_expected(const Step& s) {
  aar::sfa::MetadataBuilder b(sfa_config(nullptr, 1));
  std::vector<at::Tensor> v = sfa_views(b.build(sfa_inputs(s)));
  for (auto& t : v) t = t.clone();
  return v;
}

// A step with a prefill after a decode (SFA does not reorder).
Step step_mixed() { return {{0, 1, 6}, {9, 21}, {6, 0, 0, 0, 2, 5, 0, 0}}; }

TEST(Staging, SfaSingleBufferWithoutEventCorruptsALateCopy) {
  auto hooks = std::make_shared<LateCopies>(false);
  aar::sfa::MetadataBuilder b(sfa_config(hooks, 1));
  const auto a_dev = sfa_views(b.build(sfa_inputs(step_a())));
  b.build(sfa_inputs(step_b()));
  ASSERT_TRUE(hooks->run_next_copy());
  EXPECT_FALSE(all_equal(a_dev, sfa_expected(step_a())));
}

TEST(Staging, SfaTwoBuffersInTurnKeepALateCopyIntact) {
  auto hooks = std::make_shared<LateCopies>(true);
  aar::sfa::MetadataBuilder b(sfa_config(hooks, 2));
  const auto a_dev = sfa_views(b.build(sfa_inputs(step_a())));
  const auto m_dev = sfa_views(b.build(sfa_inputs(step_mixed())));
  EXPECT_EQ(hooks->waits(), 0);
  ASSERT_TRUE(hooks->run_next_copy());
  EXPECT_TRUE(all_equal(a_dev, sfa_expected(step_a())));
  while (hooks->run_next_copy()) {
  }
  EXPECT_TRUE(all_equal(m_dev, sfa_expected(step_mixed())));
  b.build(sfa_inputs(step_a()));
  EXPECT_EQ(hooks->waits(), 1);
}

TEST(Staging, SfaBuildIsOneCopy) {
  // Decode-only, mixed and padded steps: one host-to-device copy each, covering
  // every view the metadata holds.
  auto hooks = std::make_shared<LateCopies>(true);
  aar::sfa::BuilderConfig c = sfa_config(hooks, 2);
  c.graph_decode_padding = true;
  aar::sfa::MetadataBuilder b(c);
  int copies = 0;
  for (const Step& s : {step_a(), step_mixed(), step_b()}) {
    aar::sfa::BuildInputs in = sfa_inputs(s);
    if (s.qsl.back() == 2) in.num_input_tokens = 4;  // decodes padded to a bucket of 4
    const auto dev = sfa_views(b.build(in));
    EXPECT_EQ(hooks->copies(), ++copies);
    while (hooks->run_next_copy()) {
    }
    aar::sfa::BuilderConfig rc = sfa_config(nullptr, 1);
    rc.graph_decode_padding = true;
    aar::sfa::MetadataBuilder r(rc);
    std::vector<at::Tensor> want = sfa_views(r.build(in));
    EXPECT_TRUE(all_equal(dev, want));
  }
}

TEST(Staging, SfaDraftLanesHaveTheirOwnBuffersSlotsAndStamps) {
  auto hooks = std::make_shared<LateCopies>(true);
  aar::sfa::MetadataBuilder b(sfa_config(hooks, 2, /*drafts=*/2));
  EXPECT_EQ(b.num_drafts(), 2);
  const aar::sfa::Metadata main = b.build(sfa_inputs(step_a()));
  const aar::sfa::Metadata d0 = b.build_for_drafting(sfa_inputs(step_b()), 0);
  const aar::sfa::Metadata d1 = b.build_for_drafting(sfa_inputs(step_mixed()), 1);
  EXPECT_EQ(main.draft_index, -1);
  EXPECT_EQ(d0.draft_index, 0);
  EXPECT_EQ(d1.draft_index, 1);
  // Every lane's metadata stays current: the stamps are per lane.
  EXPECT_TRUE(main.stamp.current());
  EXPECT_TRUE(d0.stamp.current());
  EXPECT_TRUE(d1.stamp.current());
  EXPECT_EQ(b.generation(), 1u);
  EXPECT_EQ(b.draft_generation(0), 1u);
  // No buffer of one lane is another's.
  const auto vm = sfa_views(main), v0 = sfa_views(d0), v1 = sfa_views(d1);
  for (size_t i = 0; i < vm.size(); ++i) {
    EXPECT_NE(vm[i].data_ptr(), v0[i].data_ptr()) << i;
    EXPECT_NE(v0[i].data_ptr(), v1[i].data_ptr()) << i;
  }
  while (hooks->run_next_copy()) {
  }
  EXPECT_TRUE(all_equal(vm, sfa_expected(step_a())));
  EXPECT_TRUE(all_equal(v0, sfa_expected(step_b())));
  EXPECT_TRUE(all_equal(v1, sfa_expected(step_mixed())));
  // Lane i's host buffer j is slot i * 2 + j: the third draft-0 build waits on slot 2.
  b.build_for_drafting(sfa_inputs(step_a()), 0);
  b.build_for_drafting(sfa_inputs(step_a()), 0);
  ASSERT_EQ(hooks->waited_slots().size(), 1u);
  EXPECT_EQ(hooks->waited_slots()[0], 2);
  EXPECT_FALSE(d0.stamp.current());  // its own lane built again
  EXPECT_TRUE(main.stamp.current());
  b.build(sfa_inputs(step_b()));
  EXPECT_FALSE(main.stamp.current());
  EXPECT_TRUE(d1.stamp.current());
  EXPECT_THROW(b.build_for_drafting(sfa_inputs(step_a()), 2), aar::InvalidArgument);
}

TEST(Staging, SfaRejectedBuildKeepsTheTurnAndWritesNothing) {
  auto hooks = std::make_shared<LateCopies>(true);
  aar::sfa::MetadataBuilder b(sfa_config(hooks, 2));
  b.build(sfa_inputs(step_a()));
  Step bad = step_b();
  bad.table[0] = 99;
  EXPECT_THROW(b.build(sfa_inputs(bad)), aar::InvalidArgument);
  EXPECT_EQ(b.generation(), 1u);
  EXPECT_EQ(hooks->queued(), 2u);
}

TEST(Staging, SfaGraphCaptureOnlyForDecodeStates) {
  aar::sfa::MetadataBuilder b(sfa_config(nullptr, 1));
  EXPECT_THROW(b.build_for_graph_capture(sfa_inputs(step_a()), aar::plan::AttentionState::ChunkedPrefill),
               aar::NotSupported);
  EXPECT_EQ(b.generation(), 0u);
  const aar::sfa::Metadata& md = b.build_for_graph_capture(sfa_inputs(step_a()), aar::plan::AttentionState::SpecDecoding);
  EXPECT_EQ(md.attn_state, aar::plan::AttentionState::SpecDecoding);
  aar::sfa::IndexerMetadataBuilder ib;
  EXPECT_EQ(ib.build(sfa_inputs(step_a())), nullptr);
  EXPECT_EQ(ib.build_for_graph_capture(sfa_inputs(step_a())), nullptr);
  EXPECT_FALSE(aar::sfa::IndexerMetadataBuilder::reorder_batch_threshold().has_value());
}

// The indexer cache group is part of the "sfa" backend: its capture build
// refuses what the backend cannot capture, its draft build a negative index.
TEST(Staging, SfaIndexerBuilderFollowsTheContract) {
  aar::sfa::IndexerMetadataBuilder ib;
  EXPECT_THROW(ib.build_for_graph_capture(sfa_inputs(step_a()), aar::plan::AttentionState::ChunkedPrefill),
               aar::NotSupported);
  EXPECT_EQ(ib.build_for_graph_capture(sfa_inputs(step_a()), aar::plan::AttentionState::SpecDecoding), nullptr);
  EXPECT_EQ(ib.build_for_drafting(sfa_inputs(step_a()), 0), nullptr);
  EXPECT_THROW(ib.build_for_drafting(sfa_inputs(step_a()), -1), aar::InvalidArgument);
}

// MLA: the capture build takes the states the backend declares capturable,
// refuses the others before anything is built; the draft build is build().
TEST(Staging, MlaGraphCaptureOnlyForDecodeStatesAndDraftingBuilds) {
  static_assert(aar::core::is_builder_v<aar::mla::MetadataBuilder>);
  static_assert(aar::core::is_builder_v<aar::sfa::MetadataBuilder>);
  aar::mla::MetadataBuilder b(mla_config(nullptr, 1));
  EXPECT_THROW(b.build_for_graph_capture(mla_inputs(step_a()), aar::plan::AttentionState::ChunkedPrefill),
               aar::NotSupported);
  EXPECT_EQ(b.generation(), 0u);
  const aar::mla::Metadata& md =
      b.build_for_graph_capture(mla_inputs(step_a()), aar::plan::AttentionState::SpecDecoding);
  EXPECT_EQ(md.attn_state, aar::plan::AttentionState::SpecDecoding);
  EXPECT_EQ(b.generation(), 1u);
  const aar::mla::Metadata& d = b.build_for_drafting(mla_inputs(step_b()), 0);
  EXPECT_EQ(d.attn_state, aar::plan::AttentionState::DecodeOnly);
  EXPECT_TRUE(all_equal(mla_views(d), mla_expected(step_b())));
  EXPECT_EQ(b.generation(), 2u);
  EXPECT_THROW(b.build_for_drafting(mla_inputs(step_b()), -1), aar::InvalidArgument);
  EXPECT_EQ(b.generation(), 2u);
  EXPECT_EQ(aar::core::backend_facts("mla").capturable,
            aar::core::state_bit(aar::plan::AttentionState::DecodeOnly) |
                aar::core::state_bit(aar::plan::AttentionState::SpecDecoding));
  EXPECT_TRUE(aar::core::backend_facts("sfa").draft_lanes);
}

// ---------------------------------------------------------------- build stamps

TEST(BuildStamp, CopiesOfEarlierBuildsAreStale) {
  aar::gqa::MetadataBuilder b(gqa_config(nullptr, 2));
  const aar::gqa::Metadata first = b.build(inputs(step_a()));  // a copy
  EXPECT_TRUE(first.stamp.current());
  EXPECT_NO_THROW(aar::check_current(first.stamp, "metadata"));
  const aar::gqa::Metadata& latest = b.build(inputs(step_b()));
  EXPECT_FALSE(first.stamp.current());
  EXPECT_TRUE(latest.stamp.current());
  EXPECT_EQ(latest.stamp.generation, first.stamp.generation + 1);
  try {
    aar::check_current(first.stamp, "metadata");
    FAIL() << "a stale metadata was accepted";
  } catch (const aar::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("stale"), std::string::npos) << e.what();
  }
}

TEST(BuildStamp, MetadataOutlivingItsBuilderIsRejected) {
  aar::mla::Metadata kept;
  {
    aar::mla::MetadataBuilder b(mla_config(nullptr, 1));
    kept = b.build(mla_inputs(step_a()));
    EXPECT_TRUE(kept.stamp.current());
  }
  EXPECT_FALSE(kept.stamp.current());
  EXPECT_THROW(aar::check_current(kept.stamp, "metadata"), aar::InvalidArgument);
}

TEST(BuildStamp, HandMadeMetadataIsAlwaysCurrent) {
  aar::gqa::Metadata md;
  EXPECT_TRUE(md.stamp.current());
}

}  // namespace
