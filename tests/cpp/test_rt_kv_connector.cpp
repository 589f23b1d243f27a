// KV-connector hooks (kv_connector.h) on the GQA layer from C++, and the
// attention-buffer registry. The hooks of the other backends are exercised
// from Python (tests/python/test_kv_connector.py: every backend).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "ascend_attn_rt/attention_buffer.h"
#include "ascend_attn_rt/errors.h"
#include "ascend_attn_rt/gqa/builder.h"
#include "ascend_attn_rt/gqa/impl.h"
#include "ascend_attn_rt/kv_connector.h"

namespace {

constexpr int kHeads = 4, kKvHeads = 2, kHead = 32, kBlock = 16, kBlocks = 8;

struct Recording : aar::KvConnector {
  std::vector<std::string> log;
  std::string fail;
  std::vector<at::Tensor> saved;
  const aar::gqa::Metadata* saved_md = nullptr;
  void maybe_fail(const char* hook) {
    if (fail == hook) throw std::runtime_error(std::string("link down in ") + hook);
  }
  void wait_for_layer_load(const std::string& layer) override {
    log.push_back("wait:" + layer);
    maybe_fail("wait_for_layer_load");
  }
  void on_kv_cache_written(const std::string& layer, bool wrote) override {
    log.push_back("written:" + layer + (wrote ? ":1" : ":0"));
    maybe_fail("on_kv_cache_written");
  }
  void save_kv_layer(const std::string& layer, const std::vector<at::Tensor>& kv,
                     const aar::KvLayerMetadata& md) override {
    log.push_back("save:" + layer + ":" + md.backend);
    saved = kv;
    saved_md = md.as<aar::gqa::Metadata>();
    maybe_fail("save_kv_layer");
  }
};

struct Step {
  aar::gqa::MetadataBuilder builder;
  aar::gqa::AttentionImpl layer;
  at::Tensor kc, vc, q, k, v, out;
  const aar::gqa::Metadata* md = nullptr;
  std::vector<int32_t> qsl{0, 5, 12}, seq{5, 7}, table{0, 1, 2, 3};

  static aar::gqa::BuilderConfig bcfg() {
    aar::gqa::BuilderConfig c;
    c.max_num_reqs = 4;
    c.max_num_tokens = 64;
    c.max_blocks_per_req = 2;
    c.block_size = kBlock;
    c.num_blocks = kBlocks;
    return c;
  }
  static aar::gqa::ImplConfig icfg() {
    aar::gqa::ImplConfig c;
    c.num_heads = kHeads;
    c.num_kv_heads = kKvHeads;
    c.head_size = kHead;
    return c;
  }
  Step() : builder(bcfg()), layer(icfg()) {
    at::manual_seed(3);
    kc = at::zeros({kBlocks, kBlock, kKvHeads, kHead});
    vc = at::zeros_like(kc);
    aar::gqa::BuildInputs in;
    in.query_start_loc = {qsl.data(), qsl.size()};
    in.seq_lens = {seq.data(), seq.size()};
    in.block_table = {table.data(), table.size()};
    in.block_table_stride = 2;
    md = &builder.build(in);
    q = at::randn({12, kHeads, kHead});
    k = at::randn({12, kKvHeads, kHead});
    v = at::randn_like(k);
    out = at::full_like(q, 7.0);
  }
  void forward() { layer.forward(q, k, v, kc, vc, md, out); }
  // float64 reference of request r's token i (prefill, causal over its own tokens).
  double max_err() const {
    double worst = 0;
    const double scale = 1.0 / std::sqrt(double(kHead));
    for (int r = 0; r < 2; ++r) {
      for (int i = 0; i < seq[r]; ++i) {
        const int row = qsl[r] + i;
        for (int h = 0; h < kHeads; ++h) {
          const int g = h / (kHeads / kKvHeads);
          auto K = k.narrow(0, qsl[r], i + 1).select(1, g).to(at::kDouble);
          auto V = v.narrow(0, qsl[r], i + 1).select(1, g).to(at::kDouble);
          auto p = at::softmax(at::mv(K, q[row][h].to(at::kDouble)) * scale, 0);
          worst = std::max(worst, (out[row][h].to(at::kDouble) - at::mv(V.t(), p)).abs().max().item<double>());
        }
      }
    }
    return worst;
  }
};

TEST(KvConnector, NoConnectorIsTheDefault) {
  Step s;
  EXPECT_EQ(s.layer.kv_hooks.connector, nullptr);
  s.forward();
  EXPECT_LT(s.max_err(), 1e-5);
}

TEST(KvConnector, OrderArgumentsAndOutput) {
  Step s;
  auto rec = std::make_shared<Recording>();
  s.layer.kv_hooks.set(rec, "model.layers.0.attn");
  s.forward();
  EXPECT_LT(s.max_err(), 1e-5);
  const std::vector<std::string> want = {"wait:model.layers.0.attn", "written:model.layers.0.attn:1",
                                         "save:model.layers.0.attn:gqa"};
  EXPECT_EQ(rec->log, want);
  ASSERT_EQ(rec->saved.size(), 2u);
  EXPECT_TRUE(rec->saved[0].is_same(s.kc));
  EXPECT_TRUE(rec->saved[1].is_same(s.vc));
  EXPECT_EQ(rec->saved_md, s.md);
  // A KV-sharing layer writes no cache and still gets all three.
  aar::gqa::ImplConfig shared_cfg = Step::icfg();
  shared_cfg.kv_sharing = true;
  aar::gqa::AttentionImpl shared(shared_cfg);
  shared.kv_hooks.set(rec, "model.layers.1.attn");
  rec->log.clear();
  const at::Tensor kc0 = s.kc.clone();
  shared.forward(s.q, s.k, s.v, s.kc, s.vc, s.md, s.out);
  const std::vector<std::string> want_shared = {"wait:model.layers.1.attn", "written:model.layers.1.attn:0",
                                                "save:model.layers.1.attn:gqa"};
  EXPECT_EQ(rec->log, want_shared);
  EXPECT_TRUE(at::equal(kc0, s.kc));
  // Profiling run (no metadata): no hook.
  rec->log.clear();
  s.layer.forward(s.q, s.k, s.v, s.kc, s.vc, nullptr, s.out);
  shared.forward(s.q, s.k, s.v, s.kc, s.vc, nullptr, s.out);
  EXPECT_TRUE(rec->log.empty());
}

TEST(KvConnector, ThrowingWaitNamesHookAndLayerAndWritesNothing) {
  Step s;
  auto rec = std::make_shared<Recording>();
  rec->fail = "wait_for_layer_load";
  s.layer.kv_hooks.set(rec, "L3");
  const at::Tensor kc0 = s.kc.clone(), out0 = s.out.clone();
  try {
    s.forward();
    FAIL() << "no error";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("KV connector hook wait_for_layer_load(layer 'L3') failed: link down"),
              std::string::npos)
        << e.what();
  }
  EXPECT_TRUE(at::equal(kc0, s.kc));
  EXPECT_TRUE(at::equal(out0, s.out));
  EXPECT_EQ(rec->log.size(), 1u);
}

TEST(KvConnector, ThrowingSaveKeepsTheForwardResults) {
  Step s;
  auto rec = std::make_shared<Recording>();
  rec->fail = "save_kv_layer";
  s.layer.kv_hooks.set(rec, "L4");
  EXPECT_THROW(
      {
        try {
          s.forward();
        } catch (const std::runtime_error& e) {
          EXPECT_NE(std::string(e.what()).find("save_kv_layer(layer 'L4')"), std::string::npos);
          throw;
        }
      },
      std::runtime_error);
  EXPECT_LT(s.max_err(), 1e-5);
  EXPECT_GT(s.kc.abs().sum().item<double>(), 0.0);
  EXPECT_EQ(rec->log.size(), 3u);
}

TEST(AttentionBuffer, SameNameSameStorageConflictsNamed) {
  const std::string n = "cpp.test.buffer";
  at::Tensor a = aar::get_or_register_attention_buffer(n, {3, 5}, at::kFloat, c10::Device(c10::kCPU), true);
  at::Tensor b = aar::get_or_register_attention_buffer(n, {3, 5}, at::kFloat, c10::Device(c10::kCPU));
  EXPECT_EQ(a.data_ptr(), b.data_ptr());
  EXPECT_TRUE(at::equal(a, at::zeros({3, 5})));
  try {
    aar::get_or_register_attention_buffer(n, {3, 5}, at::kHalf, c10::Device(c10::kCPU));
    FAIL() << "no error";
  } catch (const aar::InvalidArgument& e) {
    const std::string w = e.what();
    EXPECT_NE(w.find("'cpp.test.buffer'"), std::string::npos) << w;
    EXPECT_NE(w.find("registered with shape [3, 5], dtype Float"), std::string::npos) << w;
    EXPECT_NE(w.find("requested with shape [3, 5], dtype Half"), std::string::npos) << w;
  }
  std::vector<std::thread> ts;
  std::vector<void*> ptrs(8);
  for (int i = 0; i < 8; ++i) {
    ts.emplace_back([&, i] {
      ptrs[i] = aar::get_or_register_attention_buffer(n, {3, 5}, at::kFloat, c10::Device(c10::kCPU)).data_ptr();
    });
  }
  for (auto& t : ts) t.join();
  for (void* p : ptrs) EXPECT_EQ(p, a.data_ptr());
  EXPECT_TRUE(aar::release_attention_buffer(n));
  EXPECT_FALSE(aar::release_attention_buffer(n));
}

}  // namespace
