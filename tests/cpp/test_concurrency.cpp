// Concurrency suite (issue 15): the thread-safety contracts of the public headers ("Thread safety:"
// paragraphs), run under ThreadSanitizer by `make test-tsan` (and uninstrumented by `make test`).
//
//   (a) engines on threads: several threads, each driving its own builder(s) and layers (each engine its own
//       workspace_group where the family shares workspaces by shape), concurrently for several steps of a
//       continuous-batching schedule (prefill, decode + chunked prefill, decodes): GQA, MLA, SFA, DSA. Every
//       output equals (bit for bit) the same engine run alone on one thread; GQA's also a float64 reference.
//       The functional suites check the single-threaded runs of MLA / SFA / DSA against float64 references.
//   (b) shared objects used from many threads at once: schema tables, operator handles (first resolution
//       raced), a MaskBuilder, the attention-buffer registry, shared_by_shape, the per-thread fault hook.
//   (c) graph mode as an engine runs it: each engine's GraphParams captured on one thread, then updated and
//       replayed on another (GQA and MLA decode buckets), two engines at once; replays equal eager forwards.
//
// Every thread's inputs are made up front on the main thread (the global generator is not used from workers),
// and intra-op parallelism is off (at::set_num_threads(1)): outputs are then deterministic, and libgomp, which
// is not instrumented, stays out of TSan's view (its synchronisation is invisible to it).
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "../../cpp/common/shared_by_shape.h"
#include "../../cpp/graph/exclusive_scope.h"
#include "../../cpp/ops/op_handle.h"
#include "../../cpp/ops/op_signatures.h"
#include "ascend_attn_rt/attention_buffer.h"
#include "ascend_attn_rt/dsa/builder.h"
#include "ascend_attn_rt/dsa/impl.h"
#include "ascend_attn_rt/errors.h"
#include "ascend_attn_rt/gqa/builder.h"
#include "ascend_attn_rt/gqa/impl.h"
#include "ascend_attn_rt/gqa/mask.h"
#include "ascend_attn_rt/graph/graph_params.h"
#include "ascend_attn_rt/kv_connector.h"
#include "ascend_attn_rt/mla/backend.h"
#include "ascend_attn_rt/mla/builder.h"
#include "ascend_attn_rt/mla/graph.h"
#include "ascend_attn_rt/mla/impl.h"
#include "ascend_attn_rt/ops/fault_injection.h"
#include "ascend_attn_rt/ops/interleave_rope.h"
#include "ascend_attn_rt/ops/schemas.h"
#include "ascend_attn_rt/sfa/builder.h"
#include "ascend_attn_rt/sfa/impl.h"

namespace {

using aar::plan::CSpan;

constexpr int kEngines = 3;   // threads in (a); TSan's cost grows with the thread count
constexpr int kThreads = 8;   // threads in (b)

class Concurrency : public ::testing::Test {
 protected:
  void SetUp() override { at::set_num_threads(1); }
};

// Runs fn(i) for i in [0, n) on n threads released together; rethrows the first exception on this thread.
void run_threads(int n, const std::function<void(int)>& fn) {
  std::atomic<int> waiting{n};
  std::vector<std::exception_ptr> errors(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      waiting.fetch_sub(1);
      while (waiting.load() > 0) std::this_thread::yield();
      try {
        fn(i);
      } catch (...) {
        errors[static_cast<size_t>(i)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

void expect_equal_runs(const std::vector<std::vector<at::Tensor>>& alone,
                       const std::vector<std::vector<at::Tensor>>& together, const char* what) {
  ASSERT_EQ(alone.size(), together.size());
  for (size_t e = 0; e < alone.size(); ++e) {
    ASSERT_EQ(alone[e].size(), together[e].size());
    for (size_t s = 0; s < alone[e].size(); ++s) {
      EXPECT_TRUE(at::equal(alone[e][s], together[e][s]))
          << what << ": engine " << e << ", output " << s << " differs from the single-threaded run (max |diff| "
          << (alone[e][s] - together[e][s]).abs().max().item<double>() << ")";
    }
  }
}

// Runs kEngines engines (engine e gets inputs make(seed + e) and workspace group e) first one
// after another, then on one thread each, and expects bit-identical outputs. Returns the inputs
// and the threaded outputs for checks against a reference.
template <class Make, class Run>
auto engines_alone_and_together(int seed, const char* what, Make make, Run run) {
  using Inputs = decltype(make(0));
  std::vector<Inputs> inputs;
  for (int e = 0; e < kEngines; ++e) inputs.push_back(make(seed + e));
  std::vector<std::vector<at::Tensor>> alone, together(kEngines);
  for (int e = 0; e < kEngines; ++e) alone.push_back(run(inputs[e], e));
  run_threads(kEngines, [&](int e) { together[e] = run(inputs[e], e); });
  expect_equal_runs(alone, together, what);
  return std::make_pair(std::move(inputs), std::move(together));
}

// ------------------------------------------------------------------ the step schedule of (a)
// Two requests; a step is (request, new tokens) pairs, decodes first (the builders' reorder contract).
using Step = std::vector<std::pair<int, int>>;
const std::vector<Step>& schedule() {
  static const std::vector<Step> s = {{{0, 12}}, {{0, 1}, {1, 9}}, {{0, 1}, {1, 1}}, {{0, 1}, {1, 4}}, {{0, 1}, {1, 1}}};
  return s;
}

// Host lists of one step: query_start_loc, seq_lens and the requests' block-table rows.
struct StepLists {
  std::vector<int32_t> qsl{0}, seq, table;
  int tokens() const { return qsl.back(); }
};

// Request r owns blocks [first + r * mbr, first + (r + 1) * mbr).
StepLists step_lists(const Step& step, std::vector<int>& seen, int mbr, int first = 0) {
  StepLists l;
  for (const auto& [r, n] : step) {
    l.qsl.push_back(l.qsl.back() + n);
    seen[static_cast<size_t>(r)] += n;
    l.seq.push_back(seen[static_cast<size_t>(r)]);
    for (int j = 0; j < mbr; ++j) l.table.push_back(first + r * mbr + j);
  }
  return l;
}

template <class In>
In build_inputs(const std::vector<int32_t>& qsl, const std::vector<int32_t>& seq, const std::vector<int32_t>& table,
                int mbr) {
  In in;
  in.query_start_loc = CSpan<int32_t>(qsl.data(), qsl.size());
  in.seq_lens = CSpan<int32_t>(seq.data(), seq.size());
  in.block_table = CSpan<int32_t>(table.data(), table.size());
  in.block_table_stride = mbr;
  return in;
}
template <class In>
In build_inputs(const StepLists& l, int mbr) {
  return build_inputs<In>(l.qsl, l.seq, l.table, mbr);
}

at::Tensor rnd(at::Generator& g, at::IntArrayRef shape, double scale = 1.0) {
  return at::randn(shape, g, at::kDouble).mul_(scale).to(at::kFloat);
}
at::Tensor weight(at::Generator& g, int64_t o, int64_t i) { return rnd(g, {o, i}, 1.0 / std::sqrt(double(i))); }
at::Tensor norm_weight(at::Generator& g, int64_t n) { return 1 + rnd(g, {n}, 0.1); }

// MLA-half RoPE tables (max_pos, R): both halves equal.
std::pair<at::Tensor, at::Tensor> half_rope_tables(int64_t max_pos, int64_t R) {
  at::Tensor inv = at::pow(10000.0, -at::arange(0, R, 2, at::kDouble) / R);
  at::Tensor ang = at::arange(max_pos, at::kDouble).unsqueeze(1) * inv;
  return {at::cat({ang.cos(), ang.cos()}, -1).to(at::kFloat), at::cat({ang.sin(), ang.sin()}, -1).to(at::kFloat)};
}

// ------------------------------------------------------------------ (a) GQA
constexpr int kGqaHeads = 8, kGqaKv = 2, kGqaD = 32, kGqaBlock = 16, kGqaMbr = 4, kGqaLayers = 2;

// One engine's inputs: per step the new q / k / v rows of every layer.
struct GqaInputs {
  std::vector<std::vector<at::Tensor>> q, k, v;  // [step][layer]
};

GqaInputs gqa_inputs(uint64_t seed) {
  at::Generator g = at::detail::createCPUGenerator(seed);
  GqaInputs in;
  for (const Step& step : schedule()) {
    int T = 0;
    for (const auto& rn : step) T += rn.second;
    in.q.emplace_back();
    in.k.emplace_back();
    in.v.emplace_back();
    for (int l = 0; l < kGqaLayers; ++l) {
      in.q.back().push_back(rnd(g, {T, kGqaHeads, kGqaD}));
      in.k.back().push_back(rnd(g, {T, kGqaKv, kGqaD}));
      in.v.back().push_back(rnd(g, {T, kGqaKv, kGqaD}));
    }
  }
  return in;
}

// Runs the schedule on a fresh engine (builder, layers, caches); returns every step's output of every layer.
std::vector<at::Tensor> run_gqa_engine(const GqaInputs& x) {
  aar::gqa::BuilderConfig bc;
  bc.max_num_reqs = 4;
  bc.max_num_tokens = 64;
  bc.max_blocks_per_req = kGqaMbr;
  bc.block_size = kGqaBlock;
  bc.num_blocks = 2 * kGqaMbr;
  aar::gqa::MetadataBuilder builder(bc);
  std::vector<std::unique_ptr<aar::gqa::AttentionImpl>> layers;
  std::vector<at::Tensor> kc, vc;
  for (int l = 0; l < kGqaLayers; ++l) {
    aar::gqa::ImplConfig ic;
    ic.num_heads = kGqaHeads;
    ic.num_kv_heads = kGqaKv;
    ic.head_size = kGqaD;
    ic.layer_index = l;
    layers.push_back(std::make_unique<aar::gqa::AttentionImpl>(ic));
    kc.push_back(at::zeros({bc.num_blocks, kGqaBlock, kGqaKv, kGqaD}));
    vc.push_back(at::zeros_like(kc.back()));
  }
  std::vector<int> seen(2, 0);
  std::vector<at::Tensor> outs;
  for (size_t s = 0; s < schedule().size(); ++s) {
    const StepLists l = step_lists(schedule()[s], seen, kGqaMbr);
    const aar::gqa::Metadata& md = builder.build(build_inputs<aar::gqa::BuildInputs>(l, kGqaMbr));
    for (int i = 0; i < kGqaLayers; ++i) {
      at::Tensor out = at::zeros_like(x.q[s][i]);
      layers[i]->forward(x.q[s][i], x.k[s][i], x.v[s][i], kc[i], vc[i], &md, out);
      outs.push_back(out);
    }
  }
  return outs;
}

// float64 causal attention over each request's whole K/V history, for every step and layer (explicit mask).
std::vector<at::Tensor> gqa_reference(const GqaInputs& x) {
  std::vector<at::Tensor> outs;
  std::vector<std::vector<std::vector<at::Tensor>>> hist_k(kGqaLayers, std::vector<std::vector<at::Tensor>>(2)),
      hist_v = hist_k;
  const double scale = 1.0 / std::sqrt(static_cast<double>(kGqaD));
  for (size_t s = 0; s < schedule().size(); ++s) {
    for (int l = 0; l < kGqaLayers; ++l) {
      std::vector<at::Tensor> rows;
      int t0 = 0;
      for (const auto& [r, n] : schedule()[s]) {
        hist_k[l][r].push_back(x.k[s][l].narrow(0, t0, n).to(at::kDouble));
        hist_v[l][r].push_back(x.v[s][l].narrow(0, t0, n).to(at::kDouble));
        const at::Tensor K = at::cat(hist_k[l][r]).repeat_interleave(kGqaHeads / kGqaKv, 1);  // (S, H, D)
        const at::Tensor V = at::cat(hist_v[l][r]).repeat_interleave(kGqaHeads / kGqaKv, 1);
        const int64_t S = K.size(0);
        const at::Tensor q = x.q[s][l].narrow(0, t0, n).to(at::kDouble);
        at::Tensor sc = at::einsum("qhd,khd->hqk", {q, K}) * scale;
        const at::Tensor qi = at::arange(S - n, S, at::kLong).unsqueeze(1), kj = at::arange(S, at::kLong).unsqueeze(0);
        sc = sc.masked_fill((kj > qi).unsqueeze(0), -INFINITY);
        rows.push_back(at::einsum("hqk,khd->qhd", {at::softmax(sc, -1), V}));
        t0 += n;
      }
      outs.push_back(at::cat(rows));
    }
  }
  return outs;
}

TEST_F(Concurrency, GqaEnginesOnThreadsEqualSingleThreadedRuns) {
  auto [inputs, together] = engines_alone_and_together(
      100, "GQA", gqa_inputs, [](const GqaInputs& in, int) { return run_gqa_engine(in); });
  for (int e = 0; e < kEngines; ++e) {
    const std::vector<at::Tensor> ref = gqa_reference(inputs[e]);
    ASSERT_EQ(ref.size(), together[e].size());
    for (size_t i = 0; i < ref.size(); ++i) {
      EXPECT_LT((together[e][i].to(at::kDouble) - ref[i]).abs().max().item<double>(), 1e-5)
          << "engine " << e << ", output " << i;
    }
  }
}

// ------------------------------------------------------------------ (a) MLA
constexpr int64_t kMlaH = 4, kMlaHidden = 64, kMlaL = 32, kMlaP = 16, kMlaR = 8, kMlaV = 16;
constexpr int kMlaBlock = 16, kMlaMbr = 4, kMlaLayers = 2;

struct MlaInputs {
  std::vector<aar::mla::Weights> w;     // per layer
  std::vector<at::Tensor> hidden;       // per step
};

MlaInputs mla_inputs(uint64_t seed) {
  at::Generator g = at::detail::createCPUGenerator(seed);
  MlaInputs in;
  for (int l = 0; l < kMlaLayers; ++l) {
    aar::mla::Weights w;
    w.q_proj = weight(g, kMlaH * (kMlaP + kMlaR), kMlaHidden);
    w.kv_a_proj_with_mqa = weight(g, kMlaL + kMlaR, kMlaHidden);
    w.kv_a_layernorm = norm_weight(g, kMlaL);
    w.kv_b_proj = weight(g, kMlaH * (kMlaP + kMlaV), kMlaL);
    w.o_proj = weight(g, kMlaHidden, kMlaH * kMlaV);
    in.w.push_back(w);
  }
  for (const Step& step : schedule()) {
    int T = 0;
    for (const auto& rn : step) T += rn.second;
    in.hidden.push_back(rnd(g, {T, kMlaHidden}));
  }
  return in;
}

aar::mla::BuilderConfig mla_builder_config() {
  aar::mla::BuilderConfig bc;
  bc.max_num_reqs = 4;
  bc.max_num_tokens = 64;
  bc.max_blocks_per_req = kMlaMbr;
  bc.block_size = kMlaBlock;
  bc.num_blocks = 2 * kMlaMbr + 1;
  std::tie(bc.cos_table, bc.sin_table) = half_rope_tables(kMlaMbr * kMlaBlock, kMlaR);
  return bc;
}

aar::mla::ImplConfig mla_impl_config(int layer, int64_t group) {
  aar::mla::ImplConfig ic;
  ic.dims = {kMlaH, kMlaHidden, std::nullopt, kMlaL, kMlaP, kMlaR, kMlaV};
  ic.layer_index = layer;
  ic.workspace_group = group;
  return ic;
}

std::vector<at::Tensor> run_mla_engine(const MlaInputs& x, int64_t group) {
  aar::mla::MetadataBuilder builder(mla_builder_config());
  const auto shapes = aar::mla::Backend::kv_cache_shapes(2 * kMlaMbr + 1, kMlaBlock, kMlaL, kMlaR);
  std::vector<std::unique_ptr<aar::mla::Impl>> layers;
  std::vector<at::Tensor> nope, rope;
  for (int l = 0; l < kMlaLayers; ++l) {
    layers.push_back(std::make_unique<aar::mla::Impl>(mla_impl_config(l, group), x.w[l]));
    nope.push_back(at::zeros(shapes[0]));
    rope.push_back(at::zeros(shapes[1]));
  }
  std::vector<int> seen(2, 0);
  std::vector<at::Tensor> outs;
  for (size_t s = 0; s < schedule().size(); ++s) {
    const StepLists l = step_lists(schedule()[s], seen, kMlaMbr, 1);
    const aar::mla::Metadata& md = builder.build(build_inputs<aar::mla::BuildInputs>(l, kMlaMbr));
    at::Tensor h = x.hidden[s];
    for (int i = 0; i < kMlaLayers; ++i) {
      at::Tensor out = at::zeros_like(h);
      layers[i]->forward(h, nope[i], rope[i], &md, out);
      outs.push_back(out);
      h = out;  // the next layer reads this one's output, as in a model
    }
  }
  return outs;
}

TEST_F(Concurrency, MlaEnginesOnThreadsEqualSingleThreadedRuns) {
  // Each engine its own workspace group: layers of one shape and group share the decode workspace.
  engines_alone_and_together(200, "MLA", mla_inputs, run_mla_engine);
}

// ------------------------------------------------------------------ a shared workspace on two threads
// Layers of one shape and workspace_group share the MLA decode workspace. Two engines on two threads with
// the same group must not both be inside it: the second is refused by name, and nothing is corrupted.

// Holds the forward that calls its save hook until `release` (hook points 2-3 run at the forward's end,
// while the forward still holds its workspaces).
class BlockingConnector : public aar::KvConnector {
 public:
  std::atomic<bool> inside{false}, release{false};
  void wait_for_layer_load(const std::string&) override {}
  void on_kv_cache_written(const std::string&, bool) override {}
  void save_kv_layer(const std::string&, const std::vector<at::Tensor>&, const aar::KvLayerMetadata&) override {
    inside = true;
    while (!release) std::this_thread::yield();
  }
};

struct MlaDecodeEngine {
  aar::mla::MetadataBuilder builder{mla_builder_config()};
  std::unique_ptr<aar::mla::Impl> layer;
  at::Tensor nope, rope;
  std::vector<int32_t> qsl{0, 1, 2}, seq{5, 9}, table;
  MlaDecodeEngine(const aar::mla::Weights& w, int64_t group) {
    layer = std::make_unique<aar::mla::Impl>(mla_impl_config(0, group), w);
    const auto shapes = aar::mla::Backend::kv_cache_shapes(2 * kMlaMbr + 1, kMlaBlock, kMlaL, kMlaR);
    nope = at::zeros(shapes[0]);
    rope = at::zeros(shapes[1]);
    for (int i = 0; i < 2 * kMlaMbr; ++i) table.push_back(i + 1);
  }
  // One decode step (two requests with context) through the layer.
  at::Tensor step(const at::Tensor& hidden) {
    aar::mla::BuildInputs in;
    in.query_start_loc = CSpan<int32_t>(qsl.data(), qsl.size());
    in.seq_lens = CSpan<int32_t>(seq.data(), seq.size());
    in.block_table = CSpan<int32_t>(table.data(), table.size());
    in.block_table_stride = kMlaMbr;
    const aar::mla::Metadata& md = builder.build(in);
    at::Tensor out = at::zeros_like(hidden);
    layer->forward(hidden, nope, rope, &md, out);
    return out;
  }
};

TEST_F(Concurrency, SharedWorkspaceIsRefusedToASecondThreadNotCorrupted) {
  const MlaInputs x = mla_inputs(300);
  at::Generator g = at::detail::createCPUGenerator(301);
  const at::Tensor hidden = rnd(g, {2, kMlaHidden});
  MlaDecodeEngine a(x.w[0], 0), b(x.w[0], 0), c(x.w[0], 1);
  const at::Tensor expected = MlaDecodeEngine(x.w[0], 2).step(hidden);
  auto conn = std::make_shared<BlockingConnector>();
  a.layer->kv_hooks.set(conn, "layer.0");
  at::Tensor out_a;
  std::thread ta([&] { out_a = a.step(hidden); });
  while (!conn->inside) std::this_thread::yield();
  // Thread a is inside its forward: the same group's workspace is refused to this thread, by name ...
  try {
    b.step(hidden);
    ADD_FAILURE() << "a forward on a second thread entered a workspace in use";
  } catch (const aar::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("MLA decode workspace of workspace_group 0"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("in use by another thread"), std::string::npos) << e.what();
  }
  // ... and another group's is not.
  EXPECT_TRUE(at::equal(c.step(hidden), expected));
  conn->release = true;
  ta.join();
  EXPECT_TRUE(at::equal(out_a, expected));
  // Once thread a has left, the group is free again.
  EXPECT_TRUE(at::equal(b.step(hidden), expected));
}

// ------------------------------------------------------------------ (a) SFA
constexpr int64_t kSfaH = 4, kSfaHidden = 64, kSfaQ = 48, kSfaL = 64, kSfaP = 32, kSfaR = 16, kSfaV = 32;
constexpr int64_t kIdxHeads = 4, kIdxD = 32, kIdxK = 8;
constexpr int kSfaBlock = 16, kSfaMbr = 4;

struct SfaInputs {
  aar::mla::Weights w0, w1;
  aar::sfa::IndexerWeights iw;
  std::vector<at::Tensor> hidden;
};

aar::mla::Weights sfa_weights(at::Generator& g) {
  aar::mla::Weights w;
  w.q_a_proj = weight(g, kSfaQ, kSfaHidden);
  w.q_a_layernorm = norm_weight(g, kSfaQ);
  w.q_proj = weight(g, kSfaH * (kSfaP + kSfaR), kSfaQ);
  w.kv_a_proj_with_mqa = weight(g, kSfaL + kSfaR, kSfaHidden);
  w.kv_a_layernorm = norm_weight(g, kSfaL);
  w.kv_b_proj = weight(g, kSfaH * (kSfaP + kSfaV), kSfaL);
  w.o_proj = weight(g, kSfaHidden, kSfaH * kSfaV);
  return w;
}

SfaInputs sfa_inputs(uint64_t seed) {
  at::Generator g = at::detail::createCPUGenerator(seed);
  SfaInputs in;
  in.w0 = sfa_weights(g);
  in.w1 = sfa_weights(g);
  in.iw = {weight(g, kIdxHeads * kIdxD, kSfaQ), weight(g, kIdxD, kSfaHidden), weight(g, kIdxHeads, kSfaHidden),
           norm_weight(g, kIdxD), rnd(g, {kIdxD}, 0.1)};
  for (const Step& step : schedule()) {
    int T = 0;
    for (const auto& rn : step) T += rn.second;
    in.hidden.push_back(rnd(g, {T, kSfaHidden}));
  }
  return in;
}

aar::sfa::ImplConfig sfa_impl_config(int layer, int64_t group, bool indexer) {
  aar::sfa::ImplConfig ic;
  ic.dims = {kSfaH, kSfaHidden, kSfaQ, kSfaL, kSfaP, kSfaR, kSfaV};
  ic.layer_index = layer;
  ic.workspace_group = group;
  if (indexer) {
    aar::sfa::IndexerConfig idx;
    idx.n_head = kIdxHeads;
    idx.head_dim = kIdxD;
    idx.topk = kIdxK;
    ic.indexer = idx;
    ic.use_index_cache = true;  // layer 1 (no indexer) reuses layer 0's top-k
  }
  return ic;
}

std::vector<at::Tensor> run_sfa_engine(const SfaInputs& x, int64_t group) {
  aar::sfa::BuilderConfig bc;
  bc.max_num_reqs = 4;
  bc.max_num_tokens = 64;
  bc.max_blocks_per_req = kSfaMbr;
  bc.block_size = kSfaBlock;
  bc.num_blocks = 2 * kSfaMbr;
  std::tie(bc.cos_table, bc.sin_table) = half_rope_tables(kSfaMbr * kSfaBlock, kSfaR);
  aar::sfa::MetadataBuilder builder(bc);
  aar::sfa::Impl l0(sfa_impl_config(0, group, true), x.w0, x.iw);
  aar::sfa::Impl l1(sfa_impl_config(1, group, false), x.w1, std::nullopt);
  aar::sfa::TopkBuffer topk(64, kIdxK);
  const int64_t nb = bc.num_blocks;
  const std::vector<at::Tensor> kv0{at::zeros({nb, kSfaBlock, 1, kSfaL}), at::zeros({nb, kSfaBlock, 1, kSfaR}),
                                    at::zeros({nb, kSfaBlock, 1, kIdxD})};
  const std::vector<at::Tensor> kv1{at::zeros({nb, kSfaBlock, 1, kSfaL}), at::zeros({nb, kSfaBlock, 1, kSfaR})};
  std::vector<int> seen(2, 0);
  std::vector<at::Tensor> outs;
  for (size_t s = 0; s < schedule().size(); ++s) {
    const StepLists l = step_lists(schedule()[s], seen, kSfaMbr);
    const aar::sfa::Metadata& md = builder.build(build_inputs<aar::mla::BuildInputs>(l, kSfaMbr));
    at::Tensor o0 = at::zeros_like(x.hidden[s]), o1 = at::zeros_like(x.hidden[s]);
    l0.forward(x.hidden[s], kv0, &md, o0, &topk);
    l1.forward(o0, kv1, &md, o1, &topk);
    outs.push_back(o0);
    outs.push_back(o1);
    outs.push_back(l0.last_topk().clone());
  }
  return outs;
}

TEST_F(Concurrency, SfaEnginesOnThreadsEqualSingleThreadedRuns) {
  engines_alone_and_together(300, "SFA", sfa_inputs, run_sfa_engine);
}

// ------------------------------------------------------------------ (a) DSA
// A C4 layer (compressor, quantised indexer, sparse shared-KV attention with sinks) and an SWA layer, the A2 plan.
constexpr int64_t kDsaHidden = 128, kDsaN = 4, kDsaD = 64, kDsaR = 16, kDsaQ = 48, kDsaW = 8, kDsaNi = 4,
                  kDsaDi = 32, kDsaK = 8, kDsaG = 2, kDsaOl = 16;
constexpr int kDsaCbs = 32, kDsaMbr = 8;

struct DsaInputs {
  aar::dsa::Weights c4, swa;
  std::vector<at::Tensor> hidden;
};

aar::dsa::Weights dsa_weights(at::Generator& g, int ratio) {
  aar::dsa::Weights w;
  w.wq_a = weight(g, kDsaQ, kDsaHidden);
  w.q_norm = norm_weight(g, kDsaQ);
  w.wq_b = weight(g, kDsaN * kDsaD, kDsaQ);
  w.wkv = weight(g, kDsaD, kDsaHidden);
  w.kv_norm = norm_weight(g, kDsaD);
  w.attn_sink = rnd(g, {kDsaN});
  w.wo_a = rnd(g, {kDsaG, kDsaN * kDsaD / kDsaG, kDsaOl}, 1.0 / std::sqrt(double(kDsaN * kDsaD / kDsaG)));
  w.wo_b = weight(g, kDsaHidden, kDsaG * kDsaOl);
  if (ratio == 4) {
    w.cmp_wkv = weight(g, 2 * kDsaD, kDsaHidden);
    w.cmp_wgate = weight(g, 2 * kDsaD, kDsaHidden);
    w.cmp_ape = rnd(g, {4, 2 * kDsaD}, 0.5);
    w.cmp_norm = norm_weight(g, kDsaD);
    w.idx_wq_b = weight(g, kDsaNi * kDsaDi, kDsaQ);
    w.idx_weights_proj = weight(g, kDsaNi, kDsaHidden);
    w.idx_cmp_wkv = weight(g, 2 * kDsaDi, kDsaHidden);
    w.idx_cmp_wgate = weight(g, 2 * kDsaDi, kDsaHidden);
    w.idx_cmp_ape = rnd(g, {4, 2 * kDsaDi}, 0.5);
    w.idx_cmp_norm = norm_weight(g, kDsaDi);
  }
  return w;
}

DsaInputs dsa_inputs(uint64_t seed) {
  at::Generator g = at::detail::createCPUGenerator(seed);
  DsaInputs in;
  in.c4 = dsa_weights(g, 4);
  in.swa = dsa_weights(g, 1);
  for (const Step& step : schedule()) {
    int T = 0;
    for (const auto& rn : step) T += rn.second;
    in.hidden.push_back(rnd(g, {T, kDsaHidden}));
  }
  return in;
}

aar::dsa::ImplConfig dsa_impl_config(const aar::dsa::AttnKvPlan& plan, int ratio, int layer, int64_t group) {
  aar::dsa::ImplConfig ic;
  ic.hidden_size = kDsaHidden;
  ic.num_heads = kDsaN;
  ic.head_dim = kDsaD;
  ic.rope_dim = kDsaR;
  ic.q_lora_rank = kDsaQ;
  ic.window = kDsaW;
  ic.compress_ratio = ratio;
  ic.index_n_heads = kDsaNi;
  ic.index_head_dim = kDsaDi;
  ic.index_topk = kDsaK;
  ic.o_groups = kDsaG;
  ic.o_lora_rank = kDsaOl;
  ic.plan = plan;
  ic.layer_index = layer;
  ic.workspace_group = group;
  return ic;
}

std::vector<at::Tensor> run_dsa_engine(const DsaInputs& x, int64_t group) {
  using aar::dsa::DsaCacheKind;
  const aar::dsa::AttnKvPlan plan = aar::dsa::make_attn_kv_plan(aar::dsa::DsaConfig{});
  aar::dsa::StepBuilderConfig sc;
  sc.max_num_reqs = 4;
  sc.max_num_tokens = 64;
  // Repeat-interleaved tables (column 2i and 2i+1 hold one angle), as DeepSeek-V4's RoPE.
  at::Tensor inv = at::pow(10000.0, -at::arange(0, kDsaR, 2, at::kDouble) / kDsaR);
  at::Tensor ang = (at::arange(1024, at::kDouble).unsqueeze(1) * inv).repeat_interleave(2, -1);
  sc.cos_table = sc.compress_cos_table = ang.cos().to(at::kFloat);
  sc.sin_table = sc.compress_sin_table = ang.sin().to(at::kFloat);
  sc.model.head_dim = kDsaD;
  sc.model.window = kDsaW;
  sc.model.num_heads_q = kDsaN;
  sc.model.index_topk = kDsaK;
  sc.model.index_n_heads = kDsaNi;
  sc.model.index_head_dim = kDsaDi;
  aar::dsa::StepBuilder step(sc);
  // The groups a C4 layer reads (route_layer's order) and the SWA layer's.
  const DsaCacheKind kinds[] = {DsaCacheKind::Swa, DsaCacheKind::C4Kv, DsaCacheKind::C4AttnState,
                                DsaCacheKind::C4IndexerK, DsaCacheKind::C4IndexerState};
  const int32_t nb = 2 * kDsaMbr + 1;
  std::vector<std::unique_ptr<aar::dsa::GroupBuilder>> groups;
  std::vector<int64_t> rows;
  for (DsaCacheKind k : kinds) {
    aar::dsa::GroupConfig gc;
    gc.kind = k;
    gc.cache_block_size = kDsaCbs;
    gc.plan = plan;
    gc.max_blocks_per_req = kDsaMbr;
    gc.num_blocks = nb;
    groups.push_back(std::make_unique<aar::dsa::GroupBuilder>(step, gc));
    rows.push_back(groups.back()->storage_block_size());
  }
  const at::Tensor swa0 = at::zeros({nb, rows[0], 1, kDsaD}), cmp = at::zeros({nb, rows[1], 1, kDsaD}),
                   state = at::zeros({nb, rows[2], 4 * kDsaD}), ik = at::zeros({nb, rows[3], 1, kDsaDi}, at::kChar),
                   isc = at::zeros({nb, rows[3], 1}, at::kHalf), istate = at::zeros({nb, rows[4], 4 * kDsaDi}),
                   swa1 = at::zeros({nb, rows[0], 1, kDsaD});
  const std::vector<at::Tensor> kv_c4 = aar::dsa::compose_kv_cache(plan, cmp, swa0, state, istate, ik, isc);
  const std::vector<at::Tensor> kv_swa =
      aar::dsa::compose_kv_cache(plan, at::Tensor(), swa1, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor());
  aar::dsa::Impl c4(dsa_impl_config(plan, 4, 0, group), x.c4);
  aar::dsa::Impl swa(dsa_impl_config(plan, 1, 1, group), x.swa);
  std::vector<int> seen(2, 0);
  std::vector<at::Tensor> outs;
  for (size_t s = 0; s < schedule().size(); ++s) {
    const StepLists l = step_lists(schedule()[s], seen, kDsaMbr, 1);
    aar::dsa::StepInputs si;
    si.query_start_loc = CSpan<int32_t>(l.qsl.data(), l.qsl.size());
    si.seq_lens = CSpan<int32_t>(l.seq.data(), l.seq.size());
    const aar::dsa::StepMetadata& st = step.build(si);
    std::vector<const aar::dsa::GroupMetadata*> gm;
    for (auto& g : groups) {
      aar::dsa::GroupInputs gi;
      gi.block_table = CSpan<int32_t>(l.table.data(), l.table.size());
      gi.block_table_stride = kDsaMbr;
      gm.push_back(&g->build(st, gi));
    }
    const aar::dsa::LayerMetadata m4 = aar::dsa::route_layer(4, st, gm[0], gm[1], gm[2], gm[3], gm[4]);
    const aar::dsa::LayerMetadata m1 = aar::dsa::route_layer(1, st, gm[0]);
    at::Tensor o0 = at::zeros_like(x.hidden[s]), o1 = at::zeros_like(x.hidden[s]);
    c4.forward(x.hidden[s], kv_c4, &m4, o0);
    swa.forward(o0, kv_swa, &m1, o1);
    outs.push_back(o0);
    outs.push_back(o1);
  }
  return outs;
}

TEST_F(Concurrency, DsaEnginesOnThreadsEqualSingleThreadedRuns) {
  engines_alone_and_together(400, "DSA", dsa_inputs, run_dsa_engine);
}

// ------------------------------------------------------------------ (b) shared objects
// A workspace made for one call (the DSA prefill path) can be destroyed while the
// forward's scope is still open: the scope keeps what it entered alive and leaves it
// at its end (before, it kept a raw pointer and left freed memory: ASan
// heap-use-after-free in the DSA engines test).
TEST_F(Concurrency, ForwardScopeOutlivesAWorkspaceDestroyedInside) {
  std::weak_ptr<aar::detail::ExclusiveUse> seen;
  {
    aar::graph::ForwardScope scope;
    auto use = std::make_shared<aar::detail::ExclusiveUse>("a workspace made for one call");
    seen = use;
    aar::graph::use_in_forward(use);
    use.reset();
    EXPECT_FALSE(seen.expired()) << "the scope must own what it entered until it ends";
  }
  EXPECT_TRUE(seen.expired());
  // Entered and left: another thread may take a fresh one of the same kind.
  auto again = std::make_shared<aar::detail::ExclusiveUse>("w");
  std::thread([&] {
    aar::graph::ForwardScope scope;
    EXPECT_NO_THROW(aar::graph::use_in_forward(again));
  }).join();
  aar::graph::ForwardScope scope;
  EXPECT_NO_THROW(aar::graph::use_in_forward(again));
}

TEST_F(Concurrency, SchemaTablesFromManyThreads) {
  std::vector<std::vector<const aar::ops::OpSchema*>> seen(kThreads);
  run_threads(kThreads, [&](int i) {
    // Every thread asks in another order: whichever is first makes the table.
    for (int k = 0; k < 3; ++k) {
      switch ((i + k) % 3) {
        case 0: seen[i].push_back(aar::ops::op_schemas().data()); break;
        case 1: seen[i].push_back(aar::ops::vllm_ascend_op_schemas().data()); break;
        default: seen[i].push_back(aar::ops::cann_ops_transformer_op_schemas().data()); break;
      }
    }
  });
  const std::set<const aar::ops::OpSchema*> tables = {aar::ops::op_schemas().data(),
                                                      aar::ops::vllm_ascend_op_schemas().data(),
                                                      aar::ops::cann_ops_transformer_op_schemas().data()};
  for (const auto& s : seen) EXPECT_EQ(std::set<const aar::ops::OpSchema*>(s.begin(), s.end()), tables);
}

TEST_F(Concurrency, OperatorHandleFirstResolutionRacedFromManyThreads) {
  // A handle of our own, resolved for the first time by every thread at once.
  aar::ops::detail::OpHandle<aar::ops::sig::InterleaveRope> handle("npu_interleave_rope", "",
                                                                   aar::ops::OpLibrary::TorchNpu);
  std::vector<const void*> got(kThreads);
  run_threads(kThreads, [&](int i) { got[i] = &handle.get(aar::ops::Provider::Cpu); });
  for (const void* p : got) EXPECT_EQ(p, got[0]);
  // The wrapper's own (namespace-scope) handle: first calls raced, results equal a call alone. This test runs in
  // a process of its own (one ctest per test), so these are the process's first calls of the operator.
  at::Generator g = at::detail::createCPUGenerator(7);
  const at::Tensor x = rnd(g, {4, 2, 1, 16}), cos = rnd(g, {4, 1, 1, 16}), sin = rnd(g, {4, 1, 1, 16});
  std::vector<at::Tensor> outs(kThreads);
  run_threads(kThreads, [&](int i) { outs[i] = aar::ops::interleave_rope(x, cos, sin); });
  const at::Tensor alone = aar::ops::interleave_rope(x, cos, sin);
  for (const auto& o : outs) EXPECT_TRUE(at::equal(o, alone));
}

TEST_F(Concurrency, MaskBuilderSharedByManyThreads) {
  aar::gqa::MaskBuilder masks(c10::Device(c10::kCPU));
  const at::ScalarType dtypes[] = {at::kHalf, at::kBool, at::kFloat, at::kBFloat16};
  std::vector<std::vector<at::Tensor>> got(kThreads);
  run_threads(kThreads, [&](int i) {
    // Growing lengths in every dtype slot from every thread: the caches are regenerated while others read them.
    for (int k = 0; k < 6; ++k) {
      const int64_t L = 8 + 24 * ((i + k) % 6);
      got[i].push_back(masks.attn_mask(L, dtypes[(i + k) % 4]));
      got[i].push_back(masks.splitfuse_mask());
      got[i].push_back(*masks.attention_mask(true, (i + k) % 2 == 0));
    }
  });
  const at::Tensor splitfuse = at::ones({2048, 2048}, at::kBool).triu(1).to(at::kChar);
  for (int i = 0; i < kThreads; ++i) {
    for (int k = 0; k < 6; ++k) {
      const int64_t L = 8 + 24 * ((i + k) % 6);
      const at::ScalarType dt = dtypes[(i + k) % 4];
      const at::Tensor upper = at::ones({L, L}, at::kBool).triu(1);
      const at::Tensor want = dt == at::kHalf ? at::zeros({L, L}, at::kHalf).masked_fill(upper, -INFINITY)
                                              : upper.to(dt);
      EXPECT_TRUE(at::equal(got[i][3 * k], want)) << "attn_mask(" << L << ", " << dt << ")";
      EXPECT_TRUE(at::equal(got[i][3 * k + 1], splitfuse));
      EXPECT_EQ(got[i][3 * k + 2].size(0), aar::gqa::kCompressedMaskSize);
    }
  }
}

TEST_F(Concurrency, AttentionBufferRegistryFromManyThreads) {
  std::vector<std::vector<at::Tensor>> got(kThreads);
  run_threads(kThreads, [&](int i) {
    for (int k = 0; k < 20; ++k) {
      // Every thread registers the same shared names, and churns one of its own.
      got[i].push_back(aar::get_or_register_attention_buffer("tsan.shared/" + std::to_string(k % 4), {64},
                                                             at::kFloat, c10::Device(c10::kCPU), true));
      const std::string own = "tsan.own/" + std::to_string(i);
      aar::get_or_register_attention_buffer(own, {16}, at::kInt, c10::Device(c10::kCPU));
      EXPECT_TRUE(aar::release_attention_buffer(own));
      EXPECT_THROW(aar::get_or_register_attention_buffer("tsan.shared/0", {65}, at::kFloat, c10::Device(c10::kCPU)),
                   aar::InvalidArgument);
      (void)aar::attention_buffer_names();
    }
  });
  for (int k = 0; k < 4; ++k) {
    const void* p = got[0][k].data_ptr();
    for (int i = 0; i < kThreads; ++i) {
      for (size_t j = k; j < got[i].size(); j += 4) {
        EXPECT_EQ(got[i][j].data_ptr(), p);
      }
    }
    EXPECT_TRUE(aar::release_attention_buffer("tsan.shared/" + std::to_string(k)));
  }
}

struct ToyShape {
  int a = 0, group = 0;
  bool operator==(const ToyShape& o) const { return a == o.a && group == o.group; }
};
struct ToyWorkspace {
  explicit ToyWorkspace(const ToyShape& s) : shape_(s) {}
  const ToyShape& shape() const { return shape_; }
  ToyShape shape_;
};

TEST_F(Concurrency, SharedByShapeFromManyThreads) {
  std::vector<std::vector<std::shared_ptr<ToyWorkspace>>> got(kThreads);
  run_threads(kThreads, [&](int i) {
    for (int k = 0; k < 50; ++k) {
      // Shapes 0..3 kept (one object each); shape 4 + i dropped at once (entries expire while others scan).
      got[i].push_back(aar::detail::shared_by_shape<ToyWorkspace>(ToyShape{k % 4, 0}));
      auto tmp = aar::detail::shared_by_shape<ToyWorkspace>(ToyShape{4 + i, k});
      EXPECT_EQ(tmp->shape().a, 4 + i);
    }
  });
  for (int i = 0; i < kThreads; ++i) {
    for (size_t j = 0; j < got[i].size(); ++j) {
      EXPECT_EQ(got[i][j].get(), got[0][j % 4].get());
      EXPECT_EQ(got[i][j]->shape().a, static_cast<int>(j % 4));
    }
  }
}

TEST_F(Concurrency, FaultHookIsPerThread) {
  // One thread armed to fail at its first operator call; the others run the same calls unaffected.
  at::Generator g = at::detail::createCPUGenerator(9);
  const at::Tensor x = rnd(g, {4, 2, 1, 16}), cos = rnd(g, {4, 1, 1, 16}), sin = rnd(g, {4, 1, 1, 16});
  std::vector<int> failed(kThreads, 0);
  run_threads(kThreads, [&](int i) {
    if (i == 0) aar::ops::testing::arm_fault(1);
    for (int k = 0; k < 3; ++k) {
      try {
        aar::ops::interleave_rope(x, cos, sin);
      } catch (const aar::ops::testing::FaultInjected&) {
        ++failed[i];
      }
    }
    if (i == 0) {
      EXPECT_EQ(aar::ops::testing::disarm_fault(), 3);
    }
  });
  EXPECT_EQ(failed[0], 1);
  for (int i = 1; i < kThreads; ++i) EXPECT_EQ(failed[i], 0);
}

// ------------------------------------------------------------------ (c) graph params across threads
constexpr int kBucket = 2;  // two one-token decodes

TEST_F(Concurrency, GqaGraphCapturedOnOneThreadUpdatedAndReplayedOnAnother) {
  constexpr int kGraphEngines = 2;
  struct Engine {
    std::unique_ptr<aar::gqa::MetadataBuilder> builder, eager_builder;
    std::vector<std::unique_ptr<aar::gqa::AttentionImpl>> layers, eager_layers;
    std::vector<at::Tensor> kc, vc, eager_kc, eager_vc, outs;
    at::Tensor q, k, v;  // static inputs
    std::unique_ptr<aar::graph::GraphParams> graph;
    std::vector<std::vector<at::Tensor>> qkv;  // per step: q, k, v
  };
  std::vector<Engine> engines(kGraphEngines);
  aar::gqa::BuilderConfig bc;
  bc.max_num_reqs = 4;
  bc.max_num_tokens = 16;
  bc.max_blocks_per_req = kGqaMbr;
  bc.block_size = kGqaBlock;
  bc.num_blocks = 2 * kGqaMbr;
  const std::vector<int32_t> qsl = {0, 1, 2}, table = {0, 1, 2, 3, 4, 5, 6, 7};
  const std::vector<std::vector<int32_t>> seqs = {{5, 17}, {6, 18}, {40, 3}, {41, 4}};
  auto inputs = [&](const std::vector<int32_t>& seq) {
    return build_inputs<aar::gqa::BuildInputs>(qsl, seq, table, kGqaMbr);
  };
  for (int e = 0; e < kGraphEngines; ++e) {
    Engine& en = engines[e];
    at::Generator g = at::detail::createCPUGenerator(500 + e);
    for (size_t s = 0; s < seqs.size(); ++s) {
      en.qkv.push_back({rnd(g, {kBucket, kGqaHeads, kGqaD}), rnd(g, {kBucket, kGqaKv, kGqaD}),
                        rnd(g, {kBucket, kGqaKv, kGqaD})});
    }
    en.q = at::zeros({kBucket, kGqaHeads, kGqaD});
    en.k = at::zeros({kBucket, kGqaKv, kGqaD});
    en.v = at::zeros_like(en.k);
    for (int l = 0; l < kGqaLayers; ++l) {
      const at::Tensor c = rnd(g, {bc.num_blocks, kGqaBlock, kGqaKv, kGqaD});
      en.kc.push_back(c.clone());
      en.eager_kc.push_back(c.clone());
      const at::Tensor cv = rnd(g, {bc.num_blocks, kGqaBlock, kGqaKv, kGqaD});
      en.vc.push_back(cv.clone());
      en.eager_vc.push_back(cv.clone());
      en.outs.push_back(at::zeros({kBucket, kGqaHeads, kGqaD}));
    }
  }
  // Capture thread: each engine builds its layers and captures the bucket.
  run_threads(kGraphEngines, [&](int e) {
    Engine& en = engines[e];
    en.builder = std::make_unique<aar::gqa::MetadataBuilder>(bc);
    en.graph = std::make_unique<aar::graph::GraphParams>(std::make_shared<aar::graph::RecordingGraphProvider>());
    for (int l = 0; l < kGqaLayers; ++l) {
      aar::gqa::ImplConfig ic;
      ic.num_heads = kGqaHeads;
      ic.num_kv_heads = kGqaKv;
      ic.head_size = kGqaD;
      ic.layer_index = l;
      en.layers.push_back(std::make_unique<aar::gqa::AttentionImpl>(ic));
      en.eager_layers.push_back(std::make_unique<aar::gqa::AttentionImpl>(ic));
    }
    const aar::gqa::Metadata& md = en.builder->build_for_graph_capture(inputs(seqs[0]));
    aar::graph::CaptureScope scope(*en.graph, kBucket);
    for (int l = 0; l < kGqaLayers; ++l) {
      en.layers[l]->forward(en.q, en.k, en.v, en.kc[l], en.vc[l], &md, en.outs[l]);
    }
  });
  // Step thread (another one): build, copy the step's inputs into the static tensors, update, replay.
  std::vector<std::vector<at::Tensor>> replayed(kGraphEngines);
  run_threads(kGraphEngines, [&](int e) {
    Engine& en = engines[e];
    EXPECT_EQ(aar::graph::GraphParams::current(), nullptr);
    for (size_t s = 0; s < seqs.size(); ++s) {
      en.q.copy_(en.qkv[s][0]);
      en.k.copy_(en.qkv[s][1]);
      en.v.copy_(en.qkv[s][2]);
      en.graph->update(kBucket, en.builder->build(inputs(seqs[s])));
      en.graph->replay(kBucket);
      for (int l = 0; l < kGqaLayers; ++l) replayed[e].push_back(en.outs[l].clone());
    }
  });
  // The same steps eagerly, on this thread, on copies of the caches.
  for (int e = 0; e < kGraphEngines; ++e) {
    Engine& en = engines[e];
    en.eager_builder = std::make_unique<aar::gqa::MetadataBuilder>(bc);
    size_t i = 0;
    for (size_t s = 0; s < seqs.size(); ++s) {
      const aar::gqa::Metadata& md = en.eager_builder->build(inputs(seqs[s]));
      for (int l = 0; l < kGqaLayers; ++l, ++i) {
        at::Tensor out = at::zeros({kBucket, kGqaHeads, kGqaD});
        en.eager_layers[l]->forward(en.qkv[s][0], en.qkv[s][1], en.qkv[s][2], en.eager_kc[l], en.eager_vc[l], &md,
                                    out);
        EXPECT_TRUE(at::allclose(replayed[e][i], out, 1e-5, 1e-5)) << "engine " << e << " step " << s << " layer " << l;
      }
    }
    for (int l = 0; l < kGqaLayers; ++l) {
      EXPECT_TRUE(at::equal(en.kc[l], en.eager_kc[l]));
      EXPECT_TRUE(at::equal(en.vc[l], en.eager_vc[l]));
    }
  }
}

TEST_F(Concurrency, MlaGraphCapturedOnOneThreadUpdatedAndReplayedOnAnother) {
  constexpr int kGraphEngines = 2;
  struct Engine {
    MlaInputs x;
    std::unique_ptr<aar::mla::MetadataBuilder> builder;
    std::vector<std::unique_ptr<aar::mla::Impl>> layers;
    std::vector<at::Tensor> nope, rope, eager_nope, eager_rope, outs;
    at::Tensor hidden;  // static input
    std::vector<at::Tensor> steps;
    std::unique_ptr<aar::graph::GraphParams> graph;
  };
  std::vector<Engine> engines(kGraphEngines);
  const int nb = 2 * kMlaMbr + 1;
  const auto shapes = aar::mla::Backend::kv_cache_shapes(nb, kMlaBlock, kMlaL, kMlaR);
  const std::vector<int32_t> qsl = {0, 1, 2}, table = {1, 2, 3, 4, 5, 6, 7, 8};
  const std::vector<std::vector<int32_t>> seqs = {{16, 16}, {5, 17}, {40, 2}, {63, 30}};
  auto inputs = [&](const std::vector<int32_t>& seq) {
    return build_inputs<aar::mla::BuildInputs>(qsl, seq, table, kMlaMbr);
  };
  for (int e = 0; e < kGraphEngines; ++e) {
    Engine& en = engines[e];
    en.x = mla_inputs(600 + e);
    at::Generator g = at::detail::createCPUGenerator(700 + e);
    for (size_t s = 0; s < seqs.size(); ++s) en.steps.push_back(rnd(g, {kBucket, kMlaHidden}));
    en.hidden = at::zeros({kBucket, kMlaHidden});
    for (int l = 0; l < kMlaLayers; ++l) {
      const at::Tensor n = rnd(g, shapes[0]), r = rnd(g, shapes[1]);
      en.nope.push_back(n.clone());
      en.rope.push_back(r.clone());
      en.eager_nope.push_back(n.clone());
      en.eager_rope.push_back(r.clone());
      en.outs.push_back(at::zeros({kBucket, kMlaHidden}));
    }
  }
  run_threads(kGraphEngines, [&](int e) {
    Engine& en = engines[e];
    en.builder = std::make_unique<aar::mla::MetadataBuilder>(mla_builder_config());
    en.graph = std::make_unique<aar::graph::GraphParams>(std::make_shared<aar::graph::RecordingGraphProvider>());
    for (int l = 0; l < kMlaLayers; ++l) {
      en.layers.push_back(std::make_unique<aar::mla::Impl>(mla_impl_config(l, e), en.x.w[l]));
    }
    const aar::mla::Metadata& md = en.builder->build(inputs(seqs[0]));
    aar::graph::CaptureScope scope(*en.graph, kBucket);
    for (int l = 0; l < kMlaLayers; ++l) en.layers[l]->forward(en.hidden, en.nope[l], en.rope[l], &md, en.outs[l]);
  });
  std::vector<std::vector<at::Tensor>> replayed(kGraphEngines);
  run_threads(kGraphEngines, [&](int e) {
    Engine& en = engines[e];
    for (size_t s = 0; s < seqs.size(); ++s) {
      en.hidden.copy_(en.steps[s]);
      en.graph->update(kBucket, std::vector<aar::graph::StepParams>{
                                     aar::mla::graph_step_params(en.builder->build(inputs(seqs[s])))});
      en.graph->replay(kBucket);
      for (int l = 0; l < kMlaLayers; ++l) replayed[e].push_back(en.outs[l].clone());
    }
  });
  // Eagerly on this thread: fresh layers (another workspace group) over copies of the caches.
  for (int e = 0; e < kGraphEngines; ++e) {
    Engine& en = engines[e];
    aar::mla::MetadataBuilder builder(mla_builder_config());
    std::vector<std::unique_ptr<aar::mla::Impl>> layers;
    for (int l = 0; l < kMlaLayers; ++l) {
      layers.push_back(std::make_unique<aar::mla::Impl>(mla_impl_config(l, 100 + e), en.x.w[l]));
    }
    size_t i = 0;
    for (size_t s = 0; s < seqs.size(); ++s) {
      const aar::mla::Metadata& md = builder.build(inputs(seqs[s]));
      for (int l = 0; l < kMlaLayers; ++l, ++i) {
        at::Tensor out = at::zeros({kBucket, kMlaHidden});
        layers[l]->forward(en.steps[s], en.eager_nope[l], en.eager_rope[l], &md, out);
        EXPECT_TRUE(at::allclose(replayed[e][i], out, 1e-5, 1e-5)) << "engine " << e << " step " << s << " layer " << l;
      }
    }
    for (int l = 0; l < kMlaLayers; ++l) {
      EXPECT_TRUE(at::equal(en.nope[l], en.eager_nope[l]));
      EXPECT_TRUE(at::equal(en.rope[l], en.eager_rope[l]));
    }
  }
}

}  // namespace
