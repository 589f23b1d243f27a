// The C ABI of the GQA variants C8 (static INT8 KV cache) and FA3
// (include/ascend_attn_rt/c_api.h): over the GQA builder's metadata each layer
// computes exactly what its C++ layer computes on the same inputs (a prefill, a
// decode, a mixed step); bad arguments and handles of another type are rejected
// by name with the caches and the output untouched.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "ascend_attn_rt/c8/backend.h"
#include "ascend_attn_rt/c8/impl.h"
#include "ascend_attn_rt/c_api.h"
#include "ascend_attn_rt/fa3/impl.h"
#include "ascend_attn_rt/gqa/builder.h"
#include "c_api_test_util.h"

namespace {

using aar_c_api_test::Dl;
using aar_c_api_test::last;

constexpr int64_t kH = 4, kHkv = 2, kD = 32;
constexpr int32_t kBs = 128, kNb = 4, kMbr = 2;

template <typename H>
using Owned = std::unique_ptr<H, void (*)(H*)>;

struct Step {
  std::vector<int32_t> qsl, seq;
};
const std::vector<int32_t> kTable = {0, 1, 2, 3};
// A prefill of 5 + 3 tokens, a decode, a mixed step (a decode, then a 3-token chunk).
const std::vector<Step> kSteps = {{{0, 5, 8}, {5, 3}}, {{0, 1, 2}, {6, 4}}, {{0, 1, 4}, {7, 7}}};

aar::gqa::BuilderConfig cpp_builder_config() {
  aar::gqa::BuilderConfig c;
  c.max_num_reqs = 4;
  c.max_num_tokens = 32;
  c.max_blocks_per_req = kMbr;
  c.block_size = kBs;
  c.num_blocks = kNb;
  return c;
}

aar::gqa::BuildInputs cpp_inputs(const Step& s) {
  aar::gqa::BuildInputs in;
  in.query_start_loc = {s.qsl.data(), s.qsl.size()};
  in.seq_lens = {s.seq.data(), s.seq.size()};
  in.block_table = {kTable.data(), kTable.size()};
  in.block_table_stride = kMbr;
  return in;
}

struct CBuilder {
  CBuilder() {
    aar_gqa_builder_config_t bc;
    aar_gqa_builder_config_init(&bc);
    bc.max_num_reqs = 4;
    bc.max_num_tokens = 32;
    bc.max_blocks_per_req = kMbr;
    bc.block_size = kBs;
    bc.num_blocks = kNb;
    aar_gqa_builder_t* b = nullptr;
    EXPECT_EQ(aar_gqa_builder_create(&bc, &b), AAR_OK) << last();
    builder.reset(b);
  }
  const aar_gqa_metadata_t* build(const Step& s) {
    aar_gqa_build_inputs_t in;
    aar_gqa_build_inputs_init(&in);
    in.query_start_loc = s.qsl.data();
    in.query_start_loc_len = s.qsl.size();
    in.seq_lens = s.seq.data();
    in.seq_lens_len = s.seq.size();
    in.block_table = kTable.data();
    in.block_table_len = kTable.size();
    in.block_table_stride = kMbr;
    const aar_gqa_metadata_t* md = nullptr;
    EXPECT_EQ(aar_gqa_builder_build(builder.get(), &in, &md), AAR_OK) << last();
    return md;
  }
  Owned<aar_gqa_builder_t> builder{nullptr, aar_gqa_builder_destroy};
};

// Per-channel scales and offsets of every KV head.
struct Scales {
  at::Tensor k_scale = 0.02 + 0.01 * at::rand({kHkv * kD}), k_offset = at::randint(-3, 4, {kHkv * kD}).to(at::kFloat),
             v_scale = 0.02 + 0.01 * at::rand({kHkv * kD}), v_offset = at::zeros({kHkv * kD});
};

aar::c8::ImplConfig cpp_c8_config(const Scales& s) {
  aar::c8::ImplConfig c;
  c.num_heads = kH;
  c.num_kv_heads = kHkv;
  c.head_size = kD;
  c.scales = {s.k_scale, s.k_offset, s.v_scale, s.v_offset};
  return c;
}

struct CC8 {
  explicit CC8(const Scales& s) : ks(s.k_scale), ko(s.k_offset), vs(s.v_scale), vo(s.v_offset) {
    aar_c8_impl_config_init(&c);
    c.num_heads = kH;
    c.num_kv_heads = kHkv;
    c.head_size = kD;
    c.k_scale = ks.get();
    c.k_offset = ko.get();
    c.v_scale = vs.get();
    c.v_offset = vo.get();
    aar_c8_impl_t* l = nullptr;
    EXPECT_EQ(aar_c8_impl_create(&c, &l), AAR_OK) << last();
    impl.reset(l);
  }
  Dl ks, ko, vs, vo;
  aar_c8_impl_config_t c;
  Owned<aar_c8_impl_t> impl{nullptr, aar_c8_impl_destroy};
};

Owned<aar_fa3_impl_t> c_fa3() {
  aar_fa3_impl_config_t c;
  aar_fa3_impl_config_init(&c);
  c.num_heads = kH;
  c.num_kv_heads = kHkv;
  c.head_size = kD;
  aar_fa3_impl_t* l = nullptr;
  EXPECT_EQ(aar_fa3_impl_create(&c, &l), AAR_OK) << last();
  return Owned<aar_fa3_impl_t>(l, aar_fa3_impl_destroy);
}

aar::fa3::ImplConfig cpp_fa3_config() {
  aar::fa3::ImplConfig c;
  c.num_heads = kH;
  c.num_kv_heads = kHkv;
  c.head_size = kD;
  return c;
}

// C8's caches: the NZ int8 pair. FA3's: (nb, 128, Nkv, D) float.
std::pair<at::Tensor, at::Tensor> c8_caches() {
  const auto shape = aar::c8::Backend::kv_cache_shape(kNb, kBs, kHkv, kD);
  const std::vector<int64_t> one(shape.begin() + 1, shape.end());
  return {at::zeros(one, at::kChar), at::zeros(one, at::kChar)};
}
std::pair<at::Tensor, at::Tensor> fa3_caches() { return {at::zeros({kNb, kBs, kHkv, kD}), at::zeros({kNb, kBs, kHkv, kD})}; }

// Runs kSteps through a C++ layer and the C layer, comparing outputs and caches bitwise.
template <typename CppImpl, typename CForward, typename CPath, typename CppPath>
void compare(CppImpl& cpp, std::pair<at::Tensor, at::Tensor> caches, CForward c_forward, CPath c_path,
             CppPath cpp_path) {
  aar::gqa::MetadataBuilder cpp_builder(cpp_builder_config());
  CBuilder cb;
  auto [ka, va] = caches;
  at::Tensor kb = ka.clone(), vb = va.clone();
  Dl dkb(kb), dvb(vb);
  for (size_t s = 0; s < kSteps.size(); ++s) {
    const aar::gqa::Metadata& md = cpp_builder.build(cpp_inputs(kSteps[s]));
    const aar_gqa_metadata_t* cmd = cb.build(kSteps[s]);
    ASSERT_NE(cmd, nullptr);
    const int64_t T = kSteps[s].qsl.back();
    const at::Tensor q = at::randn({T, kH, kD}), k = at::randn({T, kHkv, kD}), v = at::randn({T, kHkv, kD});
    at::Tensor out_a = at::zeros({T, kH, kD}), out_b = at::zeros({T, kH, kD});
    cpp.forward(q, k, v, ka, va, &md, out_a);
    Dl dq(q), dk(k), dv(v), dout(out_b);
    ASSERT_EQ(c_forward(dq.get(), dk.get(), dv.get(), dkb.get(), dvb.get(), cmd, dout.get()), AAR_OK) << last();
    EXPECT_STREQ(c_path(), cpp_path()) << "step " << s;
    EXPECT_TRUE(at::equal(out_a, out_b)) << "step " << s << ": max diff " << (out_a - out_b).abs().max().item<float>();
    EXPECT_TRUE(at::equal(ka, kb)) << "step " << s;
    EXPECT_TRUE(at::equal(va, vb)) << "step " << s;
    EXPECT_GT(out_a.abs().sum().item<double>(), 0.0) << "step " << s;
  }
  EXPECT_GT(kb.abs().sum().item<double>(), 0.0);
}

TEST(CApiC8Fa3, C8MatchesTheCppLayerExactly) {
  at::manual_seed(31);
  const Scales sc;
  aar::c8::AttentionImpl cpp(cpp_c8_config(sc));
  CC8 c(sc);
  ASSERT_TRUE(c.impl);
  compare(
      cpp, c8_caches(),
      [&](auto... a) { return aar_c8_impl_forward(c.impl.get(), a...); },
      [&] { return aar_c8_impl_last_path(c.impl.get()); }, [&] { return aar::c8::to_string(cpp.last_path()); });
}

TEST(CApiC8Fa3, Fa3MatchesTheCppLayerExactly) {
  at::manual_seed(32);
  aar::fa3::AttentionImpl cpp(cpp_fa3_config());
  Owned<aar_fa3_impl_t> c = c_fa3();
  ASSERT_TRUE(c);
  compare(
      cpp, fa3_caches(), [&](auto... a) { return aar_fa3_impl_forward(c.get(), a...); },
      [&] { return aar_fa3_impl_last_path(c.get()); }, [&] { return aar::fa3::to_string(cpp.last_path()); });
}

TEST(CApiC8Fa3, BadArgumentsAreNamedAndWriteNothing) {
  at::manual_seed(33);
  const Scales sc;
  CC8 c8(sc);
  Owned<aar_fa3_impl_t> fa3 = c_fa3();
  ASSERT_TRUE(c8.impl && fa3);
  CBuilder cb;
  const aar_gqa_metadata_t* md = cb.build(kSteps[0]);
  const at::Tensor q = at::randn({8, kH, kD}), k = at::randn({8, kHkv, kD}), v = at::randn({8, kHkv, kD});
  at::Tensor out = at::full({8, kH, kD}, 7.0f);
  auto [c8k, c8v] = c8_caches();
  auto [fk, fv] = fa3_caches();
  Dl dq(q), dk(k), dv(v), dout(out), dc8k(c8k), dc8v(c8v), dfk(fk), dfv(fv);
  auto untouched = [&] {
    EXPECT_EQ(c8k.abs().sum().item<int64_t>() + c8v.abs().sum().item<int64_t>(), 0);
    EXPECT_EQ(fk.abs().sum().item<float>() + fv.abs().sum().item<float>(), 0.0f);
    EXPECT_TRUE(at::equal(out, at::full({8, kH, kD}, 7.0f)));
  };
  EXPECT_REJECTED(aar_c8_impl_forward(c8.impl.get(), dq.get(), dk.get(), nullptr, dc8k.get(), dc8v.get(), md, dout.get()),
                  AAR_ERR_INVALID_ARGUMENT, "aar_c8_impl_forward: key and value must both be given or both be NULL");
  EXPECT_REJECTED(aar_fa3_impl_forward(fa3.get(), nullptr, dk.get(), dv.get(), dfk.get(), dfv.get(), md, dout.get()),
                  AAR_ERR_INVALID_ARGUMENT, "aar_fa3_impl_forward: query is NULL");
  // Each layer given the other's caches.
  EXPECT_EQ(aar_c8_impl_forward(c8.impl.get(), dq.get(), dk.get(), dv.get(), dfk.get(), dfv.get(), md, dout.get()),
            AAR_ERR_INVALID_ARGUMENT);
  EXPECT_NE(last().find("key_cache"), std::string::npos) << last();
  EXPECT_EQ(aar_fa3_impl_forward(fa3.get(), dq.get(), dk.get(), dv.get(), dc8k.get(), dc8v.get(), md, dout.get()),
            AAR_ERR_INVALID_ARGUMENT);
  EXPECT_NE(last().find("key_cache"), std::string::npos) << last();
  untouched();
  // One buffer as both caches, or as the output and a cache (a probe found these accepted: V overwrote K,
  // the output overwrote cache blocks). Each DLPack argument becomes a tensor of its own: two storages
  // over one memory.
  EXPECT_REJECTED(aar_c8_impl_forward(c8.impl.get(), dq.get(), dk.get(), dv.get(), dc8k.get(), dc8k.get(), md,
                                      dout.get()),
                  AAR_ERR_INVALID_ARGUMENT, "key_cache and value_cache share memory");
  EXPECT_REJECTED(aar_fa3_impl_forward(fa3.get(), dq.get(), dk.get(), dv.get(), dfk.get(), dfk.get(), md, dout.get()),
                  AAR_ERR_INVALID_ARGUMENT, "key_cache and value_cache share memory");
  Dl dout_in_fk(fk.view(-1).narrow(0, 0, out.numel()).view(out.sizes()));
  EXPECT_REJECTED(aar_fa3_impl_forward(fa3.get(), dq.get(), dk.get(), dv.get(), dfk.get(), dfv.get(), md,
                                       dout_in_fk.get()),
                  AAR_ERR_INVALID_ARGUMENT, "output and key_cache share memory");
  // The C8 caches are int8: an output over their bytes, as a float tensor.
  Dl dout_in_c8v(c8v.view(-1).narrow(0, 0, out.numel() * 4).view(at::kFloat).view(out.sizes()));
  EXPECT_REJECTED(aar_c8_impl_forward(c8.impl.get(), dq.get(), dk.get(), dv.get(), dc8k.get(), dc8v.get(), md,
                                      dout_in_c8v.get()),
                  AAR_ERR_INVALID_ARGUMENT, "output and value_cache share memory");
  // A key inside the output's memory.
  Dl dk_in_out(out.view(-1).narrow(0, 0, k.numel()).view(k.sizes()));
  EXPECT_REJECTED(aar_c8_impl_forward(c8.impl.get(), dq.get(), dk_in_out.get(), dv.get(), dc8k.get(), dc8v.get(), md,
                                      dout.get()),
                  AAR_ERR_INVALID_ARGUMENT, "output and key share memory");
  untouched();

  aar_c8_impl_config_t cc = c8.c;
  cc.kv_transfer = 3;
  aar_c8_impl_t* l = nullptr;
  EXPECT_REJECTED(aar_c8_impl_create(&cc, &l), AAR_ERR_INVALID_ARGUMENT,
                  "config->kv_transfer must be 0 (none), 1 (producer) or 2 (consumer), got 3");
  cc = c8.c;
  cc.head_size = 24;
  EXPECT_EQ(aar_c8_impl_create(&cc, &l), AAR_ERR_INVALID_ARGUMENT) << last();
  EXPECT_NE(last().find("head_size"), std::string::npos) << last();
  cc = c8.c;
  cc.attn_type = 9;
  EXPECT_REJECTED(aar_c8_impl_create(&cc, &l), AAR_ERR_INVALID_ARGUMENT, "config->attn_type must be 0 (decoder)");
  EXPECT_EQ(l, nullptr);
  aar_fa3_impl_config_t fc;
  aar_fa3_impl_config_init(&fc);
  fc.num_heads = kH;
  fc.head_size = kD;
  fc.enforce_eager = 2;
  aar_fa3_impl_t* f = nullptr;
  EXPECT_REJECTED(aar_fa3_impl_create(&fc, &f), AAR_ERR_INVALID_ARGUMENT, "config->enforce_eager must be 0 or 1, got 2");
  fc.struct_size = 0;
  EXPECT_REJECTED(aar_fa3_impl_create(&fc, &f), AAR_ERR_INVALID_ARGUMENT, "config->struct_size is 0");
  EXPECT_EQ(f, nullptr);
}

TEST(CApiC8Fa3, HandlesOfAnotherTypeAreRejectedByName) {
  at::manual_seed(34);
  const Scales sc;
  CC8 c8(sc);
  Owned<aar_fa3_impl_t> fa3 = c_fa3();
  ASSERT_TRUE(c8.impl && fa3);
  CBuilder cb;
  const aar_gqa_metadata_t* md = cb.build(kSteps[0]);
  const at::Tensor q = at::randn({8, kH, kD}), k = at::randn({8, kHkv, kD}), v = at::randn({8, kHkv, kD});
  at::Tensor out = at::zeros({8, kH, kD});
  auto [fk, fv] = fa3_caches();
  Dl dq(q), dk(k), dv(v), dout(out), dfk(fk), dfv(fv);
  EXPECT_REJECTED(aar_fa3_impl_forward(reinterpret_cast<aar_fa3_impl_t*>(c8.impl.get()), dq.get(), dk.get(), dv.get(),
                                       dfk.get(), dfv.get(), md, dout.get()),
                  AAR_ERR_INVALID_ARGUMENT, "impl is an aar_c8_impl_t, expected an aar_fa3_impl_t");
  EXPECT_REJECTED(aar_c8_impl_forward(c8.impl.get(), dq.get(), dk.get(), dv.get(), dfk.get(), dfv.get(),
                                      reinterpret_cast<const aar_gqa_metadata_t*>(fa3.get()), dout.get()),
                  AAR_ERR_INVALID_ARGUMENT, "metadata is an aar_fa3_impl_t, expected an aar_gqa_metadata_t");
  EXPECT_STREQ(aar_c8_impl_last_path(reinterpret_cast<aar_c8_impl_t*>(fa3.get())), "");
  EXPECT_NE(last().find("impl is an aar_fa3_impl_t, expected an aar_c8_impl_t"), std::string::npos) << last();
  aar_gqa_impl_destroy(reinterpret_cast<aar_gqa_impl_t*>(fa3.get()));
  EXPECT_NE(last().find("impl is an aar_fa3_impl_t, expected an aar_gqa_impl_t"), std::string::npos) << last();
  aar_fa3_impl_t* f = fa3.release();
  aar_fa3_impl_destroy(f);
  EXPECT_REJECTED(aar_fa3_impl_forward(f, dq.get(), dk.get(), dv.get(), dfk.get(), dfv.get(), md, dout.get()),
                  AAR_ERR_INVALID_ARGUMENT, "impl is an aar_fa3_impl_t that has been destroyed");
  EXPECT_TRUE(at::equal(out, at::zeros({8, kH, kD})));
}

}  // namespace
