// GQA context parallel (DCP, PCP) on the step core (core/step.h) and the backend
// contract (core/backend.h), from C++: the types, the StepInput fields a
// builder does not read (refused by name before anything is built), and PCP's
// staging configuration reaching both of its staging buffers.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "ascend_attn_rt/core/backend.h"
#include "ascend_attn_rt/core/step.h"
#include "ascend_attn_rt/cp/gqa_pcp.h"
#include "ascend_attn_rt/errors.h"
#include "ascend_attn_rt/cp/gqa_dcp.h"
#include "ascend_attn_rt/staging.h"

namespace aar {
namespace {

static_assert(core::is_builder_v<gqa::DcpMetadataBuilder> && core::is_builder_v<cp::PcpMetadataBuilder>);
static_assert(std::is_base_of_v<core::BuilderCore, gqa::DcpBuilderConfig> &&
              std::is_base_of_v<core::BuilderCore, cp::PcpConfig>);
static_assert(std::is_base_of_v<core::StepInput, gqa::DcpBuildInputs> &&
              std::is_base_of_v<core::StepInput, cp::PcpBuildInputs>);
static_assert(std::is_base_of_v<core::StepCounts, gqa::DcpMetadata> &&
              std::is_base_of_v<core::StepCounts, cp::PcpMetadata>);

// The message of the InvalidArgument `f` throws ("" if none).
template <class F>
std::string invalid(F&& f) {
  try {
    f();
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

bool mentions(const std::string& msg, const std::string& part) { return msg.find(part) != std::string::npos; }

// One batch: a decode (1 token, 8 cached) and a prefill of 5 over 4 cached tokens.
struct Batch {
  std::vector<int32_t> qsl{0, 1, 6}, seq{9, 9}, bt{1, 2, 3, 4};
  std::vector<int32_t> spec{0, 0};
  std::vector<uint64_t> ids{7, 8};
  template <class In>
  In inputs() const {
    In in;
    in.query_start_loc = plan::CSpan<int32_t>(qsl.data(), qsl.size());
    in.seq_lens = plan::CSpan<int32_t>(seq.data(), seq.size());
    in.block_table = plan::CSpan<int32_t>(bt.data(), bt.size());
    in.block_table_stride = 2;
    return in;
  }
};

template <class Builder, class In>
void expect_unread_fields_refused(Builder& b, const Batch& batch, const char* who) {
  const auto& md = b.build(batch.template inputs<In>());
  ASSERT_TRUE(md.stamp.current());
  In in = batch.template inputs<In>();
  in.attn_state = plan::AttentionState::ChunkedPrefill;
  EXPECT_TRUE(mentions(invalid([&] { b.build(in); }), "attn_state was given")) << who;
  in = batch.template inputs<In>();
  in.num_spec_tokens = plan::CSpan<int32_t>(batch.spec.data(), batch.spec.size());
  EXPECT_TRUE(mentions(invalid([&] { b.build(in); }), "num_spec_tokens was given")) << who;
  in = batch.template inputs<In>();
  in.req_ids = plan::CSpan<uint64_t>(batch.ids.data(), batch.ids.size());
  EXPECT_TRUE(mentions(invalid([&] { b.build(in); }), "req_ids was given")) << who;
  EXPECT_TRUE(md.stamp.current()) << who << ": a refused build must leave the previous metadata valid";
}

TEST(GqaCpContract, DcpRefusesStepFieldsItDoesNotRead) {
  gqa::DcpBuilderConfig c;
  c.max_num_reqs = 4;
  c.max_num_tokens = 16;
  c.max_blocks_per_req = 2;
  c.block_size = 16;
  c.num_blocks = 8;
  c.shard = plan::DcpShard{2, 1, 1};
  gqa::DcpMetadataBuilder b(c);
  expect_unread_fields_refused<gqa::DcpMetadataBuilder, gqa::DcpBuildInputs>(b, Batch{}, "gqa_dcp");
}

cp::PcpConfig pcp_config(plan::PcpKvMode mode) {
  cp::PcpConfig c;
  c.max_num_reqs = 4;
  c.max_num_tokens = 32;
  c.max_blocks_per_req = 2;
  c.block_size = 16;
  c.num_blocks = 8;
  c.pcp_size = 2;
  c.pcp_rank = 1;
  c.kv_mode = mode;
  return c;
}

TEST(GqaCpContract, PcpRefusesStepFieldsItDoesNotReadAndGraphPadding) {
  for (plan::PcpKvMode mode : {plan::PcpKvMode::Sharded, plan::PcpKvMode::Replicated}) {
    cp::PcpMetadataBuilder b(pcp_config(mode));
    const Batch batch;
    expect_unread_fields_refused<cp::PcpMetadataBuilder, cp::PcpBuildInputs>(b, batch, "gqa_pcp");
    const cp::PcpMetadata& md = b.metadata();
    cp::PcpBuildInputs in = batch.inputs<cp::PcpBuildInputs>();
    in.num_input_tokens = 8;  // a graph bucket over a step with a prefill: refused by name
    std::string msg;
    try {
      b.build(in);
    } catch (const NotSupported& e) {
      msg = e.what();
    }
    EXPECT_TRUE(mentions(msg, "num_input_tokens=8 pads a step with 1 prefills")) << msg;
    EXPECT_TRUE(md.stamp.current());
    in.num_input_tokens = 6;  // the unpadded count is the step itself
    EXPECT_EQ(b.build(in).num_input_tokens, 6);
    // A decode-only step padded to a bucket: padding decode rows (docs/design/cp.md §6.6).
    cp::PcpBuildInputs dec = batch.inputs<cp::PcpBuildInputs>();
    const std::vector<int32_t> qsl{0, 1}, seq{9}, bt{1, 2};
    dec.query_start_loc = plan::CSpan<int32_t>(qsl.data(), qsl.size());
    dec.seq_lens = plan::CSpan<int32_t>(seq.data(), seq.size());
    dec.block_table = plan::CSpan<int32_t>(bt.data(), bt.size());
    dec.num_input_tokens = 4;
    const cp::PcpMetadata& padded = b.build(dec);
    EXPECT_EQ(padded.num_input_tokens, 4);
    EXPECT_EQ(padded.num_local_tokens, 4);
    EXPECT_EQ(padded.num_kernel_reqs, 4);
  }
}

// Records which staging slots a builder waits on and records, and counts its copies.
class SlotLog : public StagingHooks {
 public:
  void copy(const at::Tensor& dst, const at::Tensor& src) override {
    ++copies;
    dst.copy_(src);
  }
  void record(int slot) override { recorded.push_back(slot); }
  void wait(int) override {}
  int copies = 0;
  std::vector<int> recorded;
};

TEST(GqaCpContract, PcpStagingConfigReachesBothBuffers) {
  for (plan::PcpKvMode mode : {plan::PcpKvMode::Sharded, plan::PcpKvMode::Replicated}) {
    auto hooks = std::make_shared<SlotLog>();
    cp::PcpConfig c = pcp_config(mode);
    c.separate_device_buffers = true;
    c.staging_buffers = 3;
    c.staging_hooks = hooks;
    cp::PcpMetadataBuilder b(c);
    const Batch batch;
    for (int i = 0; i < 4; ++i) b.build(batch.inputs<cp::PcpBuildInputs>());
    EXPECT_GT(hooks->copies, 0);
    // Sharded: PCP's own 3 buffers in turn. Replicated: the inner GQA builder's
    // (slots 0..2) and PCP's write-slot buffers after them (3..5), never shared.
    const std::vector<int> want = mode == plan::PcpKvMode::Sharded
                                      ? std::vector<int>{0, 1, 2, 0}
                                      : std::vector<int>{0, 3, 1, 4, 2, 5, 0, 3};
    EXPECT_EQ(hooks->recorded, want);
  }
}

}  // namespace
}  // namespace aar
