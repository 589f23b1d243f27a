// SFA preprocess selection through the C++ API (sfa/preprocess.h, sfa/impl.h):
// the table's rows from C++, the per-call downgrade, and what only a C++ engine
// can get wrong: a PreprocessConfig whose quant type disagrees with the weights,
// or options the layer does not implement, rejected by name at construction.
// (The Python tests run every row and every path on layers.)
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <string>

#include "ascend_attn_rt/errors.h"
#include "ascend_attn_rt/sfa/impl.h"
#include "ascend_attn_rt/sfa/preprocess.h"

namespace {

using aar::mla::QuantType;
using aar::sfa::Preprocess;
using aar::sfa::PreprocessConfig;

aar::mla::Dims dims() {
  aar::mla::Dims d;
  d.num_heads = 2;
  d.hidden_size = 32;
  d.q_lora_rank = 16;
  d.kv_lora_rank = 16;
  d.qk_nope_head_dim = 8;
  d.qk_rope_head_dim = 8;
  d.v_head_dim = 8;
  return d;
}

aar::mla::Weights float_weights(const aar::mla::Dims& d) {
  const int64_t H = d.num_heads, Q = *d.q_lora_rank, L = d.kv_lora_rank, P = d.qk_nope_head_dim,
                R = d.qk_rope_head_dim, V = d.v_head_dim, hid = d.hidden_size;
  aar::mla::Weights w;
  w.q_a_proj = at::randn({Q, hid});
  w.q_a_layernorm = at::ones({Q});
  w.q_proj = at::randn({H * (P + R), Q});
  w.kv_a_proj_with_mqa = at::randn({L + R, hid});
  w.kv_a_layernorm = at::ones({L});
  w.kv_b_proj = at::randn({H * (P + V), L});
  w.o_proj = at::randn({hid, H * V});
  return w;
}

template <typename E, typename F>
void expect_throw_naming(F f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "expected an exception naming " << needle;
  } catch (const E& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

}  // namespace

TEST(SfaPreprocess, TableRowsFromCpp) {
  PreprocessConfig c;
  EXPECT_EQ(aar::sfa::resolve_preprocess(c).kind, Preprocess::Native);
  c.is_kv_consumer = true;
  EXPECT_EQ(aar::sfa::resolve_preprocess(c).kind, Preprocess::PrologV3);
  c.is_kv_producer = true;
  const auto r = aar::sfa::resolve_preprocess(c);
  EXPECT_EQ(r.kind, Preprocess::Native);
  EXPECT_NE(r.reason.find("KV producer"), std::string::npos) << r.reason;
  PreprocessConfig s;
  s.quant = QuantType::W8A8Static;
  s.enable_mlapo = true;
  EXPECT_EQ(aar::sfa::resolve_preprocess(s).kind, Preprocess::Mlapo);
  s.dcp_size = 4;
  EXPECT_EQ(aar::sfa::resolve_preprocess(s).kind, Preprocess::Native);
  s.dcp_size = 0;
  expect_throw_naming<aar::InvalidArgument>([&] { aar::sfa::resolve_preprocess(s); }, "dcp_size");
}

TEST(SfaPreprocess, RuntimeDowngrade) {
  using aar::plan::AttentionState;
  EXPECT_EQ(aar::sfa::runtime_preprocess(Preprocess::Mlapo, AttentionState::DecodeOnly, 1024), Preprocess::Mlapo);
  EXPECT_EQ(aar::sfa::runtime_preprocess(Preprocess::Mlapo, AttentionState::DecodeOnly, 1025), Preprocess::Native);
  EXPECT_EQ(aar::sfa::runtime_preprocess(Preprocess::PrologV3, AttentionState::SpecDecoding, 5000),
            Preprocess::PrologV3);
  EXPECT_EQ(aar::sfa::runtime_preprocess(Preprocess::PrologV3, AttentionState::ChunkedPrefill, 1),
            Preprocess::Native);
  EXPECT_EQ(aar::sfa::runtime_preprocess(Preprocess::Mlapo, AttentionState::PrefillCacheHit, 1), Preprocess::Native);
}

TEST(SfaPreprocess, ImplResolvesOnceAndRejectsWhatItDoesNotImplement) {
  at::manual_seed(0);
  const aar::mla::Dims d = dims();
  aar::sfa::ImplConfig cfg;
  cfg.dims = d;
  cfg.preprocess.is_kv_consumer = true;
  aar::sfa::Impl impl(cfg, float_weights(d), std::nullopt);
  EXPECT_EQ(impl.preprocess(), Preprocess::PrologV3);
  EXPECT_EQ(impl.last_preprocess(), Preprocess::Native);  // no forward yet

  auto with = [&](auto&& edit) {
    aar::sfa::ImplConfig c = cfg;
    edit(c);
    return c;
  };
  // The config's quant type must be the weights'.
  expect_throw_naming<aar::InvalidArgument>(
      [&] {
        aar::sfa::Impl(with([](auto& c) { c.preprocess.quant = QuantType::W8A8Static; }), float_weights(d),
                       std::nullopt);
      },
      "differs from the weights'");
  // The selection's SFA C8 input follows ImplConfig::sfa_c8; set alone it contradicts the layer.
  expect_throw_naming<aar::InvalidArgument>(
      [&] {
        aar::sfa::Impl(with([](auto& c) { c.preprocess.enable_sparse_sfa_c8 = true; }), float_weights(d),
                       std::nullopt);
      },
      "enable_sparse_sfa_c8 is set but sfa_c8 is not");
  // Context parallel is the comm's group (docs/design/sparse_cp.md): a switch without its comm names both.
  expect_throw_naming<aar::InvalidArgument>(
      [&] { aar::sfa::Impl(with([](auto& c) { c.preprocess.dsa_cp = true; }), float_weights(d), std::nullopt); },
      "preprocess.dsa_cp is set but the layer has no dsa_cp_comm");
  expect_throw_naming<aar::InvalidArgument>(
      [&] { aar::sfa::Impl(with([](auto& c) { c.preprocess.dcp_size = 2; }), float_weights(d), std::nullopt); },
      "preprocess.dcp_size=2 but the layer's dcp_comm has 1 rank");
  // The selection's KV-offload input follows ImplConfig::offload; set alone it contradicts the layer.
  expect_throw_naming<aar::InvalidArgument>(
      [&] { aar::sfa::Impl(with([](auto& c) { c.preprocess.kv_offload = true; }), float_weights(d), std::nullopt); },
      "preprocess.kv_offload is set but offload is not");
}
