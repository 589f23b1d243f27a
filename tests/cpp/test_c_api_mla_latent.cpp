// The C ABI of MLA LatentAttention (include/ascend_attn_rt/c_api.h): the cache
// write, the absorbed decode and the prefill of a mixed step compute exactly what
// mla::LatentAttention computes on the same inputs; bad arguments and handles of
// another type are rejected by name with the caches and outputs untouched.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <vector>

#include "ascend_attn_rt/c_api.h"
#include "ascend_attn_rt/mla/builder.h"
#include "ascend_attn_rt/mla/latent_attention.h"
#include "c_api_test_util.h"

namespace {

using aar_c_api_test::Dl;
using aar_c_api_test::last;

constexpr int64_t H = 4, L = 16, P = 8, R = 8, V = 8, BS = 16, NB = 8, MBR = 3;

template <typename H>
using Owned = std::unique_ptr<H, void (*)(H*)>;

Owned<aar_mla_latent_t> c_latent() {
  aar_mla_latent_config_t c;
  aar_mla_latent_config_init(&c);
  c.num_heads = H;
  c.kv_lora_rank = L;
  c.qk_nope_head_dim = P;
  c.qk_rope_head_dim = R;
  c.v_head_dim = V;
  aar_mla_latent_t* l = nullptr;
  EXPECT_EQ(aar_mla_latent_create(&c, &l), AAR_OK) << last();
  return Owned<aar_mla_latent_t>(l, aar_mla_latent_destroy);
}

aar::mla::LatentAttentionConfig cpp_config() {
  aar::mla::LatentAttentionConfig c;
  c.num_heads = H;
  c.kv_lora_rank = L;
  c.qk_nope_head_dim = P;
  c.qk_rope_head_dim = R;
  c.v_head_dim = V;
  return c;
}

// A mixed step (a decode of 1 token over 20 of context, a prefill of 9 over 31), its
// metadata through both APIs, the step's rows and a context already in the caches.
struct Fixture {
  Fixture() {
    at::manual_seed(41);
    bc.max_num_reqs = 4;
    bc.max_num_tokens = 64;
    bc.max_blocks_per_req = MBR;
    bc.block_size = BS;
    bc.num_blocks = NB;
    bc.cos_table = at::zeros({64, R});
    bc.sin_table = at::zeros({64, R});
    cpp_builder = std::make_unique<aar::mla::MetadataBuilder>(bc);
    aar::mla::BuildInputs in;
    in.query_start_loc = qsl;
    in.seq_lens = seq;
    in.block_table = table;
    in.block_table_stride = MBR;
    md = &cpp_builder->build(in);
    dcos = std::make_unique<Dl>(bc.cos_table);
    dsin = std::make_unique<Dl>(bc.sin_table);
    aar_mla_builder_config_t cbc;
    aar_mla_builder_config_init(&cbc);
    cbc.max_num_reqs = 4;
    cbc.max_num_tokens = 64;
    cbc.max_blocks_per_req = MBR;
    cbc.block_size = BS;
    cbc.num_blocks = NB;
    cbc.cos_table = dcos->get();
    cbc.sin_table = dsin->get();
    aar_mla_builder_t* b = nullptr;
    EXPECT_EQ(aar_mla_builder_create(&cbc, &b), AAR_OK) << last();
    c_builder.reset(b);
    aar_mla_build_inputs_t cin;
    aar_mla_build_inputs_init(&cin);
    cin.query_start_loc = qsl.data();
    cin.query_start_loc_len = qsl.size();
    cin.seq_lens = seq.data();
    cin.seq_lens_len = seq.size();
    cin.block_table = table.data();
    cin.block_table_len = table.size();
    cin.block_table_stride = MBR;
    EXPECT_EQ(aar_mla_builder_build(b, &cin, &cmd), AAR_OK) << last();
    nope = at::randn({NB, BS, 1, L});
    rope = at::randn({NB, BS, 1, R});
    kv_c = at::randn({10, L});
    k_pe = at::randn({10, R});
    q = at::randn({10, H, P + R});
    ql_nope = at::randn({1, H, L});
    kv_b = at::randn({H * (P + V), L}) / std::sqrt(double(L));
    slots = md->slot_mapping.narrow(0, 0, md->num_actual_tokens).clone();
  }
  std::vector<int32_t> qsl{0, 1, 10}, seq{21, 40}, table{5, 2, 0, 7, 1, 3};
  aar::mla::BuilderConfig bc;
  std::unique_ptr<aar::mla::MetadataBuilder> cpp_builder;
  const aar::mla::Metadata* md = nullptr;
  std::unique_ptr<Dl> dcos, dsin;
  Owned<aar_mla_builder_t> c_builder{nullptr, aar_mla_builder_destroy};
  const aar_mla_metadata_t* cmd = nullptr;
  at::Tensor nope, rope, kv_c, k_pe, q, ql_nope, kv_b, slots;
};

TEST(CApiMlaLatent, MatchesTheCppLayerExactly) {
  Fixture f;
  aar::mla::LatentAttention cpp(cpp_config());
  Owned<aar_mla_latent_t> c = c_latent();
  ASSERT_TRUE(c && f.cmd);

  at::Tensor nope_a = f.nope.clone(), rope_a = f.rope.clone(), nope_b = f.nope.clone(), rope_b = f.rope.clone();
  cpp.write_kv(f.kv_c, f.k_pe, f.slots, nope_a, rope_a);
  Dl dkvc(f.kv_c), dkpe(f.k_pe), dslots(f.slots), dnope(nope_b), drope(rope_b);
  ASSERT_EQ(aar_mla_latent_write_kv(c.get(), dkvc.get(), dkpe.get(), dslots.get(), dnope.get(), drope.get()), AAR_OK)
      << last();
  EXPECT_TRUE(at::equal(nope_a, nope_b));
  EXPECT_TRUE(at::equal(rope_a, rope_b));
  EXPECT_FALSE(at::equal(nope_a, f.nope));

  const at::Tensor q_pe = f.q.narrow(0, 0, 1).narrow(-1, P, R);  // strided: any strides are taken
  at::Tensor lat_a = at::full({1, H, L}, 7.0f), lat_b = at::full({1, H, L}, 7.0f);
  cpp.forward_decode(f.ql_nope, q_pe, nope_a, rope_a, f.md, lat_a);
  Dl dql(f.ql_nope), dqpe(q_pe), dlat(lat_b);
  ASSERT_EQ(aar_mla_latent_forward_decode(c.get(), dql.get(), dqpe.get(), dnope.get(), drope.get(), f.cmd, dlat.get()),
            AAR_OK)
      << last();
  EXPECT_TRUE(at::equal(lat_a, lat_b));
  EXPECT_FALSE(at::equal(lat_a, at::full({1, H, L}, 7.0f)));

  const at::Tensor qp = f.q.narrow(0, 1, 9), cp = f.kv_c.narrow(0, 1, 9), pp = f.k_pe.narrow(0, 1, 9);
  at::Tensor out_a = at::full({10, H * V}, 7.0f), out_b = at::full({10, H * V}, 7.0f);
  cpp.forward_prefill(qp, cp, pp, nope_a, rope_a, f.md, out_a.narrow(0, 1, 9), f.kv_b);
  const at::Tensor out_rows = out_b.narrow(0, 1, 9);  // a row slice of a larger output, as DLPack byte_offset
  Dl dqp(qp), dcp(cp), dpp(pp), dout(out_rows), dw(f.kv_b);
  ASSERT_EQ(aar_mla_latent_forward_prefill(c.get(), dqp.get(), dcp.get(), dpp.get(), dnope.get(), drope.get(), f.cmd,
                                           dout.get(), dw.get()),
            AAR_OK)
      << last();
  EXPECT_TRUE(at::equal(out_a, out_b));
  EXPECT_TRUE(at::all(out_b[0] == 7.0).item<bool>());

  // metadata NULL (a profiling run) zero-fills the output.
  ASSERT_EQ(aar_mla_latent_forward_decode(c.get(), dql.get(), dqpe.get(), dnope.get(), drope.get(), nullptr, dlat.get()),
            AAR_OK)
      << last();
  EXPECT_TRUE(at::equal(lat_b, at::zeros({1, H, L})));
}

TEST(CApiMlaLatent, BadArgumentsAreNamedAndWriteNothing) {
  Fixture f;
  Owned<aar_mla_latent_t> c = c_latent();
  ASSERT_TRUE(c && f.cmd);
  const at::Tensor nope0 = f.nope.clone(), rope0 = f.rope.clone();
  Dl dnope(f.nope), drope(f.rope), dkvc(f.kv_c), dkpe(f.k_pe);
  auto untouched = [&] {
    EXPECT_TRUE(at::equal(f.nope, nope0));
    EXPECT_TRUE(at::equal(f.rope, rope0));
  };
  // A slot past the cache (after valid ones): nothing is written.
  at::Tensor bad_slots = f.slots.clone();
  bad_slots[9] = NB * BS;
  Dl dbad(bad_slots);
  EXPECT_EQ(aar_mla_latent_write_kv(c.get(), dkvc.get(), dkpe.get(), dbad.get(), dnope.get(), drope.get()),
            AAR_ERR_INVALID_ARGUMENT);
  EXPECT_NE(last().find("slot"), std::string::npos) << last();
  untouched();
  const at::Tensor wide = at::randn({10, L + 1});
  Dl dwide(wide), dslots(f.slots);
  EXPECT_EQ(aar_mla_latent_write_kv(c.get(), dwide.get(), dkpe.get(), dslots.get(), dnope.get(), drope.get()),
            AAR_ERR_INVALID_ARGUMENT);
  EXPECT_NE(last().find("kv_c"), std::string::npos) << last();
  untouched();
  EXPECT_REJECTED(aar_mla_latent_write_kv(c.get(), dkvc.get(), dkpe.get(), nullptr, dnope.get(), drope.get()),
                  AAR_ERR_INVALID_ARGUMENT, "aar_mla_latent_write_kv: slot_mapping is NULL");
  untouched();
  // A rope cache over the nope cache's memory (a probe found it accepted: the rope rows landed in the
  // nope cache). Each DLPack argument becomes a tensor of its own: two storages over one memory.
  Dl dover(f.nope.view(-1).narrow(0, 0, f.rope.numel()).view(f.rope.sizes()));
  EXPECT_REJECTED(aar_mla_latent_write_kv(c.get(), dkvc.get(), dkpe.get(), dslots.get(), dnope.get(), dover.get()),
                  AAR_ERR_INVALID_ARGUMENT, "nope_cache and rope_cache share memory");
  untouched();

  at::Tensor lat = at::full({1, H, L}, 7.0f);
  const at::Tensor ql_bad = at::randn({1, H, L - 1}), q_pe = at::randn({1, H, R});
  Dl dqlb(ql_bad), dqpe(q_pe), dlat(lat);
  EXPECT_EQ(aar_mla_latent_forward_decode(c.get(), dqlb.get(), dqpe.get(), dnope.get(), drope.get(), f.cmd, dlat.get()),
            AAR_ERR_INVALID_ARGUMENT);
  EXPECT_NE(last().find("ql_nope"), std::string::npos) << last();
  EXPECT_TRUE(at::equal(lat, at::full({1, H, L}, 7.0f)));
  at::Tensor out = at::full({9, H * V}, 7.0f);
  const at::Tensor qp = at::randn({9, H, P + R}), w_bad = at::randn({H * (P + V), L + 1});
  Dl dqp(qp), dcp(f.kv_c.narrow(0, 1, 9)), dpp(f.k_pe.narrow(0, 1, 9)), dout(out), dwb(w_bad);
  EXPECT_EQ(aar_mla_latent_forward_prefill(c.get(), dqp.get(), dcp.get(), dpp.get(), dnope.get(), drope.get(), f.cmd,
                                           dout.get(), dwb.get()),
            AAR_ERR_INVALID_ARGUMENT);
  EXPECT_NE(last().find("kv_b_proj"), std::string::npos) << last();
  EXPECT_TRUE(at::equal(out, at::full({9, H * V}, 7.0f)));
  untouched();

  aar_mla_latent_config_t cfg;
  aar_mla_latent_config_init(&cfg);
  cfg.num_heads = H;
  cfg.prefill_in_bf16 = static_cast<aar_tristate_t>(5);
  aar_mla_latent_t* l = nullptr;
  EXPECT_REJECTED(aar_mla_latent_create(&cfg, &l), AAR_ERR_INVALID_ARGUMENT,
                  "config->prefill_in_bf16 must be AAR_DEFAULT (-1), AAR_FALSE (0) or AAR_TRUE (1), got 5");
  EXPECT_EQ(l, nullptr);
  // Head dims are bounded (INT64_MAX was accepted and wrapped the later shape checks).
  aar_mla_latent_config_init(&cfg);
  cfg.num_heads = H;
  cfg.v_head_dim = INT64_MAX;
  EXPECT_REJECTED(aar_mla_latent_create(&cfg, &l), AAR_ERR_INVALID_ARGUMENT, "v_head_dim must be in [1, 65536]");
  EXPECT_EQ(l, nullptr);
}

TEST(CApiMlaLatent, HandlesOfAnotherTypeAreRejectedByName) {
  Fixture f;
  Owned<aar_mla_latent_t> c = c_latent();
  ASSERT_TRUE(c && f.cmd);
  Dl dnope(f.nope), drope(f.rope), dql(f.ql_nope);
  const at::Tensor q_pe = at::randn({1, H, R});
  at::Tensor lat = at::full({1, H, L}, 7.0f);
  Dl dqpe(q_pe), dlat(lat);
  EXPECT_REJECTED(aar_mla_latent_forward_decode(reinterpret_cast<aar_mla_latent_t*>(f.c_builder.get()), dql.get(),
                                                dqpe.get(), dnope.get(), drope.get(), f.cmd, dlat.get()),
                  AAR_ERR_INVALID_ARGUMENT, "latent is an aar_mla_builder_t, expected an aar_mla_latent_t");
  EXPECT_REJECTED(aar_mla_latent_forward_decode(c.get(), dql.get(), dqpe.get(), dnope.get(), drope.get(),
                                                reinterpret_cast<const aar_mla_metadata_t*>(c.get()), dlat.get()),
                  AAR_ERR_INVALID_ARGUMENT, "metadata is an aar_mla_latent_t, expected an aar_mla_metadata_t");
  aar_mla_impl_destroy(reinterpret_cast<aar_mla_impl_t*>(c.get()));
  EXPECT_NE(last().find("impl is an aar_mla_latent_t, expected an aar_mla_impl_t"), std::string::npos) << last();
  EXPECT_TRUE(at::equal(lat, at::full({1, H, L}, 7.0f)));
  aar_mla_latent_t* l = c.release();
  aar_mla_latent_destroy(l);
  EXPECT_REJECTED(aar_mla_latent_forward_decode(l, dql.get(), dqpe.get(), dnope.get(), drope.get(), f.cmd, dlat.get()),
                  AAR_ERR_INVALID_ARGUMENT, "latent is an aar_mla_latent_t that has been destroyed");
}

}  // namespace
