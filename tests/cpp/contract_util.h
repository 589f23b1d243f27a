// The backend contract test's shared part (include/ascend_attn_rt/core/backend.h):
// one adapter per registered backend (tests/cpp/test_rt_contract_<id>.cpp) sets
// up a small model and a small step, and runs the generic checks below on it.
// test_rt_contract.cpp walks core::registered_backends(): a backend without an
// adapter fails the suite.
#pragma once

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <string>
#include <vector>

#include "ascend_attn_rt/core/backend.h"
#include "ascend_attn_rt/core/step.h"
#include "ascend_attn_rt/errors.h"
#include "ascend_attn_rt/graph/graph_params.h"
#include "ascend_attn_rt/graph/provider.h"

namespace aar_contract {

using aar::core::BackendFacts;
using aar::plan::AttentionState;

struct Adapter {
  std::string id;
  std::function<void(const BackendFacts&)> run;
};
std::vector<Adapter>& adapters();
struct AdapterRegistrar {
  AdapterRegistrar(std::string id, std::function<void(const BackendFacts&)> run) {
    adapters().push_back({std::move(id), std::move(run)});
  }
};

constexpr AttentionState kStates[] = {AttentionState::PrefillNoCache, AttentionState::PrefillCacheHit,
                                      AttentionState::DecodeOnly, AttentionState::ChunkedPrefill,
                                      AttentionState::SpecDecoding};

// The counts of a metadata built for `in` (a step without graph padding) against
// the step itself: one meaning per count in every backend (core::StepCounts).
template <class Inputs>
void expect_counts_of(const aar::core::StepCounts& c, const Inputs& in, int decode_threshold) {
  const int B = static_cast<int>(in.seq_lens.size());
  EXPECT_EQ(c.num_reqs, B);
  EXPECT_GE(c.num_kernel_reqs, c.num_reqs);
  EXPECT_EQ(c.num_actual_tokens, in.query_start_loc[B]);
  EXPECT_GE(c.num_input_tokens, c.num_actual_tokens);
  EXPECT_EQ(c.num_decodes + c.num_prefills, c.num_reqs);
  EXPECT_EQ(c.num_decode_tokens + c.num_prefill_tokens, c.num_actual_tokens);
  int max_q = 0, max_s = 0, leading = 0;
  bool in_decodes = true;
  for (int r = 0; r < B; ++r) {
    const int q = in.query_start_loc[r + 1] - in.query_start_loc[r];
    max_q = std::max(max_q, q);
    max_s = std::max(max_s, in.seq_lens[r]);
    in_decodes = in_decodes && q <= decode_threshold;
    leading += in_decodes ? 1 : 0;
  }
  EXPECT_EQ(c.max_query_len, max_q);
  EXPECT_EQ(c.max_seq_len, max_s);
  EXPECT_EQ(c.num_decodes, leading);
}

// The builder part: build, build_for_graph_capture for every state (accepted
// exactly when the facts declare it, refused by name otherwise), and
// build_for_drafting (= build without draft lanes; with them, the main
// metadata stays current). `decode_step` is a decode-only step.
template <class Builder>
void check_builder(Builder& b, const typename Builder::Inputs& decode_step, const BackendFacts& backend,
                   int decode_threshold) {
  static_assert(aar::core::is_builder_v<Builder>, "the builder follows the contract");
  const BackendFacts& f = backend.builder.empty() ? backend : aar::core::backend_facts(backend.builder);
  const auto& md = b.build(decode_step);
  expect_counts_of(md, decode_step, decode_threshold);
  EXPECT_EQ(md.num_decodes, md.num_reqs) << "a decode-only step";
  for (AttentionState s : kStates) {
    SCOPED_TRACE(aar::plan::to_string(s));
    if (aar::core::has_state(f.capturable, s)) {
      const auto& g = b.build_for_graph_capture(decode_step, s);
      EXPECT_EQ(g.attn_state, s);
    } else {
      try {
        b.build_for_graph_capture(decode_step, s);
        ADD_FAILURE() << f.id << ": build_for_graph_capture accepted " << aar::plan::to_string(s)
                      << ", which its facts do not declare capturable";
      } catch (const aar::NotSupported& e) {
        EXPECT_NE(std::string(e.what()).find(aar::plan::to_string(s)), std::string::npos) << e.what();
      }
    }
  }
  const auto& main_md = b.build(decode_step);
  const uint64_t main_generation = main_md.stamp.generation;
  const auto& d = b.build_for_drafting(decode_step, 0);
  expect_counts_of(d, decode_step, decode_threshold);
  if (f.draft_lanes) {
    EXPECT_TRUE(main_md.stamp.current()) << f.id << ": a draft lane's build made the main metadata stale";
    EXPECT_EQ(main_md.stamp.generation, main_generation);
  } else {
    EXPECT_EQ(&d, &main_md) << f.id << ": without draft lanes build_for_drafting is build";
  }
  EXPECT_THROW(b.build_for_drafting(decode_step, -1), aar::InvalidArgument);
}

// The impl part: forward(md) writes and returns `output`; forward(nullptr) is a
// profiling run (output zero-filled); inside a graph capture a forward is
// recorded (it does not run: the output keeps its contents) when the facts
// declare capture, else refused with NotSupported. `forward(md_or_null, out)`
// calls the layer in the contract's order; `md` comes from build_for_graph_capture
// for the capture check.
template <class Md>
void check_impl(const BackendFacts& f, const std::function<const at::Tensor&(const Md*, const at::Tensor&)>& forward,
                const Md& md, const Md& capture_md, const at::Tensor& output_like, int64_t bucket) {
  at::Tensor out = at::full_like(output_like, 7.0);
  const at::Tensor& ret = forward(&md, out);
  EXPECT_EQ(ret.data_ptr(), out.data_ptr()) << f.id << ": forward returns its output";
  EXPECT_FALSE(at::equal(out, at::full_like(out, 7.0))) << f.id << ": forward wrote nothing";
  at::Tensor prof = at::full_like(output_like, 7.0);
  forward(nullptr, prof);
  EXPECT_TRUE(at::equal(prof, at::zeros_like(prof))) << f.id << ": a profiling run zero-fills the output";

  aar::graph::GraphParams g(std::make_shared<aar::graph::RecordingGraphProvider>());
  at::Tensor cap = at::full_like(output_like, 7.0);
  bool recorded = false;
  try {
    aar::graph::CaptureScope scope(g, bucket);
    forward(&capture_md, cap);
    recorded = true;
  } catch (const aar::NotSupported& e) {
    EXPECT_EQ(f.capturable, 0u) << f.id << ": declares capture but refused: " << e.what();
  }
  if (recorded) {
    EXPECT_NE(f.capturable, 0u) << f.id << ": declares no capture but a forward inside one did not refuse";
    EXPECT_TRUE(g.has(bucket));
    EXPECT_TRUE(at::equal(cap, at::full_like(cap, 7.0))) << f.id << ": a captured forward ran eagerly";
  }
  // Inside a capture, a profiling run is refused.
  aar::graph::GraphParams g2(std::make_shared<aar::graph::RecordingGraphProvider>());
  g2.begin_capture(bucket);
  EXPECT_THROW(forward(nullptr, prof), aar::NotSupported) << f.id;
  g2.abort_capture();
}

}  // namespace aar_contract
