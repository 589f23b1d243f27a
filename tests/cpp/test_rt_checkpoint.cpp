// Checkpoint weight loading through the C++ API (dsa/checkpoint.h,
// sfa/checkpoint.h): the name tables, the one transposed weight (wo_a), views
// instead of copies, the dtype rules, and every key problem reported by full
// name. tests/python/test_checkpoint_loading.py runs the loaded weights against
// transformers' own layers.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "ascend_attn_rt/dsa/checkpoint.h"
#include "ascend_attn_rt/dsa/impl.h"
#include "ascend_attn_rt/dsa/plan/dsa_kv_plan.h"
#include "ascend_attn_rt/errors.h"
#include "ascend_attn_rt/sfa/checkpoint.h"
#include "ascend_attn_rt/sfa/impl.h"

namespace {

using State = std::map<std::string, at::Tensor>;

aar::dsa::ImplConfig dsa_config(int32_t ratio) {
  aar::dsa::ImplConfig c;
  c.hidden_size = 32;
  c.num_heads = 2;
  c.head_dim = 16;
  c.rope_dim = 8;
  c.q_lora_rank = 8;
  c.compress_ratio = ratio;
  c.index_n_heads = 2;
  c.index_head_dim = 8;
  c.index_topk = 4;
  c.o_groups = 2;
  c.o_lora_rank = 4;
  c.window = 8;
  aar::dsa::DsaConfig p;
  p.model_dtype = aar::dsa::KvDtype::BF16;
  c.plan = aar::dsa::make_attn_kv_plan(p);
  return c;
}

// A ratio-4 layer as a transformers DeepseekV4Attention names it, the norms in
// float32 next to bf16 projections (as transformers keeps them).
State dsa_hf_state(const aar::dsa::ImplConfig& c, const std::string& prefix) {
  const int64_t H = c.hidden_size, N = c.num_heads, D = c.head_dim, Q = c.q_lora_rank, G = c.o_groups,
                O = c.o_lora_rank, Di = c.index_head_dim, n = c.index_n_heads;
  auto lin = [](int64_t o, int64_t i) { return at::randn({o, i}).to(at::kBFloat16); };
  auto f32 = [](int64_t k) { return at::randn({k}); };
  State s;
  s[prefix + "q_a_proj.weight"] = lin(Q, H);
  s[prefix + "q_a_norm.weight"] = f32(Q);
  s[prefix + "q_b_proj.weight"] = lin(N * D, Q);
  s[prefix + "kv_proj.weight"] = lin(D, H);
  s[prefix + "kv_norm.weight"] = f32(D);
  s[prefix + "sinks"] = f32(N);
  s[prefix + "o_a_proj.weight"] = lin(G * O, N * D / G);
  s[prefix + "o_b_proj.weight"] = lin(H, G * O);
  s[prefix + "compressor.kv_proj.weight"] = lin(2 * D, H);
  s[prefix + "compressor.gate_proj.weight"] = lin(2 * D, H);
  s[prefix + "compressor.position_bias"] = at::randn({4, 2 * D});
  s[prefix + "compressor.kv_norm.weight"] = f32(D);
  s[prefix + "compressor.indexer.q_b_proj.weight"] = lin(n * Di, Q);
  s[prefix + "compressor.indexer.scorer.weights_proj.weight"] = lin(n, H);
  s[prefix + "compressor.indexer.kv_proj.weight"] = lin(2 * Di, H);
  s[prefix + "compressor.indexer.gate_proj.weight"] = lin(2 * Di, H);
  s[prefix + "compressor.indexer.position_bias"] = at::randn({4, 2 * Di});
  s[prefix + "compressor.indexer.kv_norm.weight"] = f32(Di);
  return s;
}

// The same tensors (a state under prefix "") under DeepSeek's published names and `prefix`.
State to_published(const State& hf, const std::string& prefix) {
  static const std::pair<const char*, const char*> kRenames[] = {
      {"q_a_proj.weight", "wq_a.weight"},
      {"q_a_norm.weight", "q_norm.weight"},
      {"q_b_proj.weight", "wq_b.weight"},
      {"kv_proj.weight", "wkv.weight"},
      {"kv_norm.weight", "kv_norm.weight"},
      {"sinks", "attn_sink"},
      {"o_a_proj.weight", "wo_a.weight"},
      {"o_b_proj.weight", "wo_b.weight"},
      {"compressor.kv_proj.weight", "compressor.wkv.weight"},
      {"compressor.gate_proj.weight", "compressor.wgate.weight"},
      {"compressor.position_bias", "compressor.ape"},
      {"compressor.kv_norm.weight", "compressor.norm.weight"},
      {"compressor.indexer.q_b_proj.weight", "indexer.wq_b.weight"},
      {"compressor.indexer.scorer.weights_proj.weight", "indexer.weights_proj.weight"},
      {"compressor.indexer.kv_proj.weight", "indexer.compressor.wkv.weight"},
      {"compressor.indexer.gate_proj.weight", "indexer.compressor.wgate.weight"},
      {"compressor.indexer.position_bias", "indexer.compressor.ape"},
      {"compressor.indexer.kv_norm.weight", "indexer.compressor.norm.weight"}};
  State out;
  for (const auto& [from, to] : kRenames) out[prefix + to] = hf.at(from);
  return out;
}

template <class Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const aar::InvalidArgument& e) {
    return std::string("InvalidArgument: ") + e.what();
  } catch (const aar::NotSupported& e) {
    return std::string("NotSupported: ") + e.what();
  }
  return "";
}

TEST(DsaCheckpoint, TransformersNamesLoadIntoTheImpl) {
  const auto c = dsa_config(4);
  const std::string pre = "model.layers.1.self_attn.";
  State s = dsa_hf_state(c, pre);
  s["model.layers.10.self_attn.q_a_proj.weight"] = at::zeros({1});  // another layer: outside the prefix
  const aar::dsa::Weights w = aar::dsa::weights_from_checkpoint(s, "model.layers.1.self_attn", c);
  // Projections are the checkpoint's tensors, not copies.
  EXPECT_TRUE(w.wq_a.is_same(s[pre + "q_a_proj.weight"]));
  EXPECT_TRUE(w.idx_weights_proj.is_same(s[pre + "compressor.indexer.scorer.weights_proj.weight"]));
  EXPECT_TRUE(w.cmp_ape.is_same(s[pre + "compressor.position_bias"]));  // any float dtype: as stored
  // wo_a[g, i, o] = o_a_proj.weight[g * o_lora + o, i], dense.
  const at::Tensor oa = s[pre + "o_a_proj.weight"];
  ASSERT_EQ(w.wo_a.sizes(), c10::IntArrayRef({2, 16, 4}));
  EXPECT_TRUE(w.wo_a.is_contiguous());
  for (int64_t g = 0; g < 2; ++g) {
    for (int64_t o = 0; o < 4; ++o) EXPECT_TRUE(at::equal(w.wo_a[g].select(1, o), oa[g * 4 + o]));
  }
  // float32 norms take the projections' dtype; the sinks stay float32.
  EXPECT_EQ(w.q_norm.scalar_type(), at::kBFloat16);
  EXPECT_EQ(w.idx_cmp_norm.scalar_type(), at::kBFloat16);
  EXPECT_TRUE(at::equal(w.q_norm, s[pre + "q_a_norm.weight"].to(at::kBFloat16)));
  EXPECT_TRUE(w.attn_sink.is_same(s[pre + "sinks"]));
  aar::dsa::Impl impl(c, w);  // the Impl's own checks accept them
  EXPECT_EQ(impl.o_proj(), aar::dsa::OProjKind::Bmm);
}

TEST(DsaCheckpoint, PublishedNamesGiveTheSameWeights) {
  const auto c = dsa_config(4);
  const State hf = dsa_hf_state(c, "");
  const State pub = to_published(hf, "layers.1.attn.");
  const aar::dsa::Weights a = aar::dsa::weights_from_checkpoint(hf, "", c);
  const aar::dsa::Weights b = aar::dsa::weights_from_checkpoint(pub, "layers.1.attn.", c);
  EXPECT_TRUE(a.wq_b.is_same(b.wq_b));
  EXPECT_TRUE(at::equal(a.wo_a, b.wo_a));
  EXPECT_TRUE(at::equal(a.cmp_norm, b.cmp_norm));
  EXPECT_TRUE(a.idx_cmp_wgate.is_same(b.idx_cmp_wgate));
}

TEST(DsaCheckpoint, SwaLayerHasNoCompressorKeys) {
  const auto c4 = dsa_config(4);
  State s = dsa_hf_state(c4, "");
  const auto swa = dsa_config(1);
  // A ratio-4 layer's state read as an SWA layer: its compressor / indexer keys are unexpected.
  const std::string e = error_of([&] { aar::dsa::weights_from_checkpoint(s, "", swa); });
  EXPECT_NE(e.find("InvalidArgument"), std::string::npos) << e;
  EXPECT_NE(e.find("unexpected: 'compressor.gate_proj.weight'"), std::string::npos) << e;
  for (auto it = s.begin(); it != s.end();) it = it->first.rfind("compressor.", 0) == 0 ? s.erase(it) : std::next(it);
  const aar::dsa::Weights w = aar::dsa::weights_from_checkpoint(s, "", swa);
  EXPECT_FALSE(w.cmp_wkv.defined());
  EXPECT_FALSE(w.idx_wq_b.defined());
}

TEST(DsaCheckpoint, EveryKeyProblemIsReportedByFullName) {
  const auto c = dsa_config(128);
  const std::string pre = "layers.2.attn.";
  State s;
  for (const auto& [k, v] : to_published(dsa_hf_state(dsa_config(4), ""), pre)) {
    if (k.find("indexer.") == std::string::npos && k.find("compressor.") == std::string::npos) s[k] = v;
  }
  s[pre + "compressor.wkv.weight"] = at::randn({16, 32}).to(at::kBFloat16);
  s[pre + "compressor.ape"] = at::randn({128, 16});
  s[pre + "compressor.norm.weight"] = at::randn({16});
  // missing compressor.wgate, one misshapen, one unexpected
  s[pre + "wo_b.weight"] = at::randn({32, 9}).to(at::kBFloat16);
  s[pre + "rotary_emb.inv_freq"] = at::randn({4});
  const std::string e = error_of([&] { aar::dsa::weights_from_checkpoint(s, pre, c); });
  EXPECT_NE(e.find("InvalidArgument"), std::string::npos) << e;
  EXPECT_NE(e.find("missing: 'layers.2.attn.compressor.wgate.weight' (16, 32)"), std::string::npos) << e;
  EXPECT_NE(e.find("'layers.2.attn.wo_b.weight' is (32, 9), expected (32, 8)"), std::string::npos) << e;
  EXPECT_NE(e.find("unexpected: 'layers.2.attn.rotary_emb.inv_freq'"), std::string::npos) << e;
}

TEST(DsaCheckpoint, QuantisedOrBiasedProjectionsAreNotSupported) {
  const auto c = dsa_config(1);
  State s;
  for (const auto& [k, v] : dsa_hf_state(dsa_config(4), "")) {
    if (k.rfind("compressor.", 0) != 0) s[k] = v;
  }
  State scaled = s;
  scaled["q_b_proj.weight_scale_inv"] = at::ones({1, 1});
  std::string e = error_of([&] { aar::dsa::weights_from_checkpoint(scaled, "", c); });
  EXPECT_NE(e.find("NotSupported: DSA checkpoint: 'q_b_proj.weight_scale_inv' is a quantisation scale"),
            std::string::npos) << e;
  State biased = s;
  biased["o_b_proj.bias"] = at::zeros({32});
  e = error_of([&] { aar::dsa::weights_from_checkpoint(biased, "", c); });
  EXPECT_NE(e.find("NotSupported: DSA checkpoint: 'o_b_proj.bias' is a bias"), std::string::npos) << e;
  State fp8 = s;
  fp8["kv_proj.weight"] = fp8["kv_proj.weight"].to(at::kFloat8_e4m3fn);
  e = error_of([&] { aar::dsa::weights_from_checkpoint(fp8, "", c); });
  EXPECT_NE(e.find("NotSupported: 'kv_proj.weight' is Float8_e4m3fn"), std::string::npos) << e;
  State mixed = s;
  mixed["kv_proj.weight"] = mixed["kv_proj.weight"].to(at::kHalf);
  e = error_of([&] { aar::dsa::weights_from_checkpoint(mixed, "", c); });
  EXPECT_NE(e.find("InvalidArgument: 'kv_proj.weight' is Half but the layer's projections are BFloat16"),
            std::string::npos) << e;
}

aar::sfa::ImplConfig sfa_config(bool q_lora, bool indexer) {
  aar::sfa::ImplConfig c;
  c.dims.num_heads = 2;
  c.dims.hidden_size = 32;
  if (q_lora) c.dims.q_lora_rank = 16;
  c.dims.kv_lora_rank = 16;
  c.dims.qk_nope_head_dim = 8;
  c.dims.qk_rope_head_dim = 8;
  c.dims.v_head_dim = 8;
  if (indexer) {
    aar::sfa::IndexerConfig ic;
    ic.n_head = 2;
    ic.head_dim = 16;
    ic.topk = 4;
    c.indexer = ic;
  }
  return c;
}

State sfa_state(const aar::sfa::ImplConfig& c, const std::string& pre) {
  const auto& d = c.dims;
  const int64_t H = d.num_heads, hid = d.hidden_size, L = d.kv_lora_rank, P = d.qk_nope_head_dim,
                R = d.qk_rope_head_dim, V = d.v_head_dim, q_in = d.q_lora_rank.value_or(hid);
  State s;
  if (d.q_lora_rank) {
    s[pre + "q_a_proj.weight"] = at::randn({*d.q_lora_rank, hid});
    s[pre + "q_a_layernorm.weight"] = at::randn({*d.q_lora_rank}).to(at::kDouble);  // any float: cast
    s[pre + "q_b_proj.weight"] = at::randn({H * (P + R), q_in});
  } else {
    s[pre + "q_proj.weight"] = at::randn({H * (P + R), q_in});
  }
  s[pre + "kv_a_proj_with_mqa.weight"] = at::randn({L + R, hid});
  s[pre + "kv_a_layernorm.weight"] = at::randn({L});
  s[pre + "kv_b_proj.weight"] = at::randn({H * (P + V), L});
  s[pre + "o_proj.weight"] = at::randn({hid, H * V});
  if (c.indexer) {
    const int64_t n = c.indexer->n_head, Di = c.indexer->head_dim;
    s[pre + "indexer.wq_b.weight"] = at::randn({n * Di, q_in});
    s[pre + "indexer.wk.weight"] = at::randn({Di, hid});
    s[pre + "indexer.weights_proj.weight"] = at::randn({n, hid});
    s[pre + "indexer.k_norm.weight"] = at::randn({Di});
    s[pre + "indexer.k_norm.bias"] = at::randn({Di});
  }
  return s;
}

TEST(SfaCheckpoint, NamesLoadIntoTheImpl) {
  for (bool q_lora : {true, false}) {
    const auto c = sfa_config(q_lora, true);
    const State s = sfa_state(c, "model.layers.0.self_attn.");
    const aar::sfa::CheckpointWeights w = aar::sfa::weights_from_checkpoint(s, "model.layers.0.self_attn", c);
    EXPECT_TRUE(w.weights.q_proj.is_same(s.at(q_lora ? "model.layers.0.self_attn.q_b_proj.weight"
                                                     : "model.layers.0.self_attn.q_proj.weight")));
    EXPECT_EQ(w.weights.q_a_proj.has_value(), q_lora);
    if (q_lora) EXPECT_EQ(w.weights.q_a_layernorm->scalar_type(), at::kFloat);
    ASSERT_TRUE(w.indexer.has_value());
    EXPECT_TRUE(w.indexer->k_norm_bias.is_same(s.at("model.layers.0.self_attn.indexer.k_norm.bias")));
    aar::sfa::Impl impl(c, w.weights, w.indexer);
  }
}

TEST(SfaCheckpoint, KeyProblemsAndUnsupportedCompanions) {
  const auto with_idx = sfa_config(true, true);
  State s = sfa_state(with_idx, "");
  // A layer without an indexer finds the indexer's keys unexpected.
  std::string e = error_of([&] { aar::sfa::weights_from_checkpoint(s, "", sfa_config(true, false)); });
  EXPECT_NE(e.find("unexpected: 'indexer.k_norm.bias', 'indexer.k_norm.weight'"), std::string::npos) << e;
  State bad = s;
  bad.erase("kv_b_proj.weight");
  bad["o_proj.weight"] = at::randn({32, 15});
  e = error_of([&] { aar::sfa::weights_from_checkpoint(bad, "", with_idx); });
  EXPECT_NE(e.find("missing: 'kv_b_proj.weight' (32, 16)"), std::string::npos) << e;
  EXPECT_NE(e.find("'o_proj.weight' is (32, 15), expected (32, 16)"), std::string::npos) << e;
  State biased = s;
  biased["kv_a_proj_with_mqa.bias"] = at::zeros({24});
  e = error_of([&] { aar::sfa::weights_from_checkpoint(biased, "", with_idx); });
  EXPECT_NE(e.find("NotSupported: SFA checkpoint: 'kv_a_proj_with_mqa.bias' is a bias"), std::string::npos) << e;
}

}  // namespace
