// The C ABI (include/ascend_attn_rt/c_api.h) from C++: bad arguments give a
// status and a per-thread message naming them, never a crash, and write
// nothing; returned tensors are owned by the caller; the MLA entry points
// compute exactly what the C++ layer computes. The GQA path end to end against
// a float64 reference (eager and graph mode) is examples/c/c_attention.c, a C11
// program linked against the installed package (ctest example_c_attention).
#include <ATen/ATen.h>
#include <ATen/DLConvertor.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "ascend_attn_rt/c_api.h"
#include "ascend_attn_rt/mla/backend.h"
#include "ascend_attn_rt/mla/builder.h"
#include "ascend_attn_rt/mla/impl.h"
#include "c_api_test_util.h"

namespace {

using aar_c_api_test::Dl;
using aar_c_api_test::last;

constexpr int H = 4, HKV = 2, D = 16, BS = 16, NB = 8, W = 4;

struct Gqa {
  Gqa() {
    aar_gqa_builder_config_t bc;
    aar_gqa_builder_config_init(&bc);
    bc.max_num_reqs = 4;
    bc.max_num_tokens = 32;
    bc.max_blocks_per_req = W;
    bc.block_size = BS;
    bc.num_blocks = NB;
    EXPECT_EQ(aar_gqa_builder_create(&bc, &builder), AAR_OK) << last();
    aar_gqa_impl_config_t ic;
    aar_gqa_impl_config_init(&ic);
    ic.num_heads = H;
    ic.num_kv_heads = HKV;
    ic.head_size = D;
    EXPECT_EQ(aar_gqa_impl_create(&ic, &impl), AAR_OK) << last();
    aar_gqa_build_inputs_init(&in);
    in.query_start_loc = qsl.data();
    in.query_start_loc_len = qsl.size();
    in.seq_lens = seq.data();
    in.seq_lens_len = seq.size();
    in.block_table = table.data();
    in.block_table_len = table.size();
    in.block_table_stride = W;
  }
  ~Gqa() {
    aar_gqa_impl_destroy(impl);
    aar_gqa_builder_destroy(builder);
  }
  aar_gqa_builder_t* builder = nullptr;
  aar_gqa_impl_t* impl = nullptr;
  std::vector<int32_t> qsl = {0, 3, 5}, seq = {3, 2}, table = {0, 1, 2, 3, 4, 5, 6, 7};
  aar_gqa_build_inputs_t in;
};

// A small MLA builder and layer (no q-LoRA) over weights and RoPE tables the struct owns.
struct Mla {
  static constexpr int64_t kH = 2, kHidden = 32, kL = 16, kP = 8, kR = 8, kV = 8;
  static constexpr int kB = 16, kNb = 4, kMax = 2;
  Mla()
      : cos(at::ones({kMax * kB, kR})),
        sin(at::zeros({kMax * kB, kR})),
        q_proj(at::randn({kH * (kP + kR), kHidden})),
        kv_a(at::randn({kL + kR, kHidden})),
        kv_norm(at::ones({kL})),
        kv_b(at::randn({kH * (kP + kV), kL})),
        o_proj(at::randn({kHidden, kH * kV})),
        dcos(cos), dsin(sin), dq(q_proj), dkva(kv_a), dnorm(kv_norm), dkvb(kv_b), dout(o_proj) {
    aar_mla_builder_config_t bc;
    aar_mla_builder_config_init(&bc);
    bc.max_num_reqs = 2;
    bc.max_num_tokens = 16;
    bc.max_blocks_per_req = kMax;
    bc.block_size = kB;
    bc.num_blocks = kNb;
    bc.cos_table = dcos.get();
    bc.sin_table = dsin.get();
    EXPECT_EQ(aar_mla_builder_create(&bc, &builder), AAR_OK) << last();
    aar_mla_impl_config_t ic;
    aar_mla_impl_config_init(&ic);
    ic.num_heads = kH;
    ic.hidden_size = kHidden;
    ic.kv_lora_rank = kL;
    ic.qk_nope_head_dim = kP;
    ic.qk_rope_head_dim = kR;
    ic.v_head_dim = kV;
    aar_mla_weights_t w;
    aar_mla_weights_init(&w);
    w.q_proj = dq.get();
    w.kv_a_proj_with_mqa = dkva.get();
    w.kv_a_layernorm = dnorm.get();
    w.kv_b_proj = dkvb.get();
    w.o_proj = dout.get();
    EXPECT_EQ(aar_mla_impl_create(&ic, &w, &impl), AAR_OK) << last();
  }
  ~Mla() {
    aar_mla_impl_destroy(impl);
    aar_mla_builder_destroy(builder);
  }
  at::Tensor cos, sin, q_proj, kv_a, kv_norm, kv_b, o_proj;
  Dl dcos, dsin, dq, dkva, dnorm, dkvb, dout;
  aar_mla_builder_t* builder = nullptr;
  aar_mla_impl_t* impl = nullptr;
};

TEST(CApi, NullHandlesAndOutputsAreNamed) {
  const aar_gqa_metadata_t* md = nullptr;
  aar_gqa_build_inputs_t in;
  aar_gqa_build_inputs_init(&in);
  EXPECT_REJECTED(aar_gqa_builder_build(nullptr, &in, &md), AAR_ERR_INVALID_ARGUMENT, "aar_gqa_builder_build: builder is NULL");
  EXPECT_REJECTED(aar_gqa_builder_create(nullptr, nullptr), AAR_ERR_INVALID_ARGUMENT, "config is NULL");
  aar_gqa_builder_config_t bc;
  aar_gqa_builder_config_init(&bc);
  EXPECT_REJECTED(aar_gqa_builder_create(&bc, nullptr), AAR_ERR_INVALID_ARGUMENT, "out is NULL");
  EXPECT_REJECTED(aar_gqa_impl_forward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr),
                  AAR_ERR_INVALID_ARGUMENT, "impl is NULL");
  EXPECT_REJECTED(aar_mla_impl_forward(nullptr, nullptr, nullptr, nullptr, nullptr, nullptr),
                  AAR_ERR_INVALID_ARGUMENT, "impl is NULL");
  EXPECT_REJECTED(aar_graph_replay(nullptr, 4), AAR_ERR_INVALID_ARGUMENT, "graph is NULL");
  // Destroying NULL is a no-op.
  aar_gqa_builder_destroy(nullptr);
  aar_gqa_impl_destroy(nullptr);
  aar_mla_builder_destroy(nullptr);
  aar_mla_impl_destroy(nullptr);
  aar_graph_params_destroy(nullptr);
  EXPECT_STREQ(aar_gqa_impl_last_path(nullptr), "");
}

TEST(CApi, ConfigFieldsAreCheckedByName) {
  aar_gqa_builder_t* b = nullptr;
  aar_gqa_builder_config_t bc;
  std::memset(&bc, 0, sizeof(bc));
  EXPECT_REJECTED(aar_gqa_builder_create(&bc, &b), AAR_ERR_INVALID_ARGUMENT, "config->struct_size is 0");
  aar_gqa_builder_config_init(&bc);
  bc.num_blocks = 8;
  bc.pad_fia_batch = 2;
  EXPECT_REJECTED(aar_gqa_builder_create(&bc, &b), AAR_ERR_INVALID_ARGUMENT, "config->pad_fia_batch must be 0 or 1, got 2");
  bc.pad_fia_batch = 1;
  bc.device.device_type = kDLCUDA;
  EXPECT_REJECTED(aar_gqa_builder_create(&bc, &b), AAR_ERR_INVALID_ARGUMENT, "config->device.device_type 2");
  bc.device.device_type = kDLCPU;
  bc.separate_device_buffers = static_cast<aar_tristate_t>(7);
  EXPECT_REJECTED(aar_gqa_builder_create(&bc, &b), AAR_ERR_INVALID_ARGUMENT, "config->separate_device_buffers");
  bc.separate_device_buffers = AAR_DEFAULT;
  bc.num_blocks = 0;  // the C++ builder's own check, message passed through
  EXPECT_REJECTED(aar_gqa_builder_create(&bc, &b), AAR_ERR_INVALID_ARGUMENT, "num_blocks");
  EXPECT_EQ(b, nullptr);

  aar_gqa_impl_t* impl = nullptr;
  aar_gqa_impl_config_t ic;
  aar_gqa_impl_config_init(&ic);
  ic.num_heads = H;
  ic.head_size = D;
  ic.sliding_window = -3;
  EXPECT_REJECTED(aar_gqa_impl_create(&ic, &impl), AAR_ERR_INVALID_ARGUMENT, "config->sliding_window");
  ic.sliding_window = 0;
  ic.has_alibi_slopes = 1;
  EXPECT_EQ(aar_gqa_impl_create(&ic, &impl), AAR_ERR_NOT_SUPPORTED) << last();
  EXPECT_NE(last().find("aar_gqa_impl_create: "), std::string::npos) << last();
  ic.has_alibi_slopes = 0;
  ic.attn_type = 9;
  EXPECT_REJECTED(aar_gqa_impl_create(&ic, &impl), AAR_ERR_INVALID_ARGUMENT, "config->attn_type");
  EXPECT_EQ(impl, nullptr);

  aar_graph_params_t* g = nullptr;
  EXPECT_REJECTED(aar_graph_params_create("cuda", nullptr, 0, &g), AAR_ERR_INVALID_ARGUMENT, "provider must be");
  aar_graph_hooks_t hooks;
  aar_graph_hooks_init(&hooks);
  EXPECT_REJECTED(aar_graph_params_create("recording", &hooks, 0, &g), AAR_ERR_INVALID_ARGUMENT, "hooks must be NULL");
  EXPECT_REJECTED(aar_graph_params_create("hooks", nullptr, 0, &g), AAR_ERR_INVALID_ARGUMENT, "hooks is NULL");
  EXPECT_REJECTED(aar_graph_params_create("recording", nullptr, 3, &g), AAR_ERR_INVALID_ARGUMENT, "use_max_workspace");
  EXPECT_EQ(g, nullptr);
  EXPECT_REJECTED(aar_set_provider(static_cast<aar_provider_t>(9)), AAR_ERR_INVALID_ARGUMENT, "provider");
}

TEST(CApi, BuildRejectsBadHostArraysAndKeepsThePreviousMetadata) {
  Gqa s;
  const aar_gqa_metadata_t* md = nullptr;
  ASSERT_EQ(aar_gqa_builder_build(s.builder, &s.in, &md), AAR_OK) << last();
  aar_gqa_metadata_info_t info;
  info.struct_size = sizeof(info);
  ASSERT_EQ(aar_gqa_metadata_get_info(md, &info), AAR_OK);
  EXPECT_EQ(info.num_actual_tokens, 5);
  EXPECT_EQ(info.generation, 1u);
  EXPECT_EQ(info.attn_state, AAR_STATE_PREFILL_NO_CACHE);

  const aar_gqa_metadata_t* md2 = nullptr;
  s.seq[1] = 1;  // shorter than its query (2 tokens)
  EXPECT_REJECTED(aar_gqa_builder_build(s.builder, &s.in, &md2), AAR_ERR_INVALID_ARGUMENT, "seq_lens");
  EXPECT_EQ(md2, nullptr);
  s.seq[1] = 2;
  s.in.seq_lens = nullptr;
  EXPECT_REJECTED(aar_gqa_builder_build(s.builder, &s.in, &md2), AAR_ERR_INVALID_ARGUMENT,
                  "inputs->seq_lens is NULL with length 2");
  s.in.seq_lens = s.seq.data();
  s.in.attn_state = static_cast<aar_attn_state_t>(11);
  EXPECT_REJECTED(aar_gqa_builder_build(s.builder, &s.in, &md2), AAR_ERR_INVALID_ARGUMENT, "inputs->attn_state");
  s.in.attn_state = AAR_STATE_AUTO;
  EXPECT_REJECTED(aar_gqa_builder_build_for_graph_capture(s.builder, &s.in, AAR_STATE_AUTO, &md2),
                  AAR_ERR_INVALID_ARGUMENT, "state must be");
  info.struct_size = 3;
  EXPECT_REJECTED(aar_gqa_metadata_get_info(md, &info), AAR_ERR_INVALID_ARGUMENT, "info->struct_size is 3");
  // The rejected builds left the first build's metadata as it was.
  info.struct_size = sizeof(info);
  ASSERT_EQ(aar_gqa_metadata_get_info(md, &info), AAR_OK);
  EXPECT_EQ(info.generation, 1u);
  EXPECT_EQ(info.num_actual_tokens, 5);
}

TEST(CApi, MalformedDlpackTensorsAreRejectedBeforeAnyWrite) {
  Gqa s;
  const aar_gqa_metadata_t* md = nullptr;
  ASSERT_EQ(aar_gqa_builder_build(s.builder, &s.in, &md), AAR_OK) << last();
  at::Tensor q = at::randn({5, H, D}), k = at::randn({5, HKV, D}), v = at::randn({5, HKV, D});
  at::Tensor kc = at::randn({NB, BS, HKV, D}), vc = at::randn({NB, BS, HKV, D}), out = at::zeros({5, H, D});
  const at::Tensor kc0 = kc.clone(), vc0 = vc.clone();
  Dl dq(q), dk(k), dv(v), dkc(kc), dvc(vc), dout(out);
  auto forward = [&](DLManagedTensor* query) {
    return aar_gqa_impl_forward(s.impl, query, dk.get(), dv.get(), dkc.get(), dvc.get(), md, dout.get());
  };

  DLManagedTensor bad = *dq.get();
  bad.dl_tensor.ndim = -1;
  EXPECT_REJECTED(forward(&bad), AAR_ERR_INVALID_ARGUMENT, "query.ndim must be in [0, 16], got -1");
  bad = *dq.get();
  bad.dl_tensor.shape = nullptr;
  EXPECT_REJECTED(forward(&bad), AAR_ERR_INVALID_ARGUMENT, "query.shape is NULL");
  bad = *dq.get();
  int64_t neg_shape[3] = {5, -4, D};
  bad.dl_tensor.shape = neg_shape;
  EXPECT_REJECTED(forward(&bad), AAR_ERR_INVALID_ARGUMENT, "query.shape[1] is negative");
  bad = *dq.get();
  bad.dl_tensor.data = nullptr;
  EXPECT_REJECTED(forward(&bad), AAR_ERR_INVALID_ARGUMENT, "query.data is NULL");
  bad = *dq.get();
  bad.dl_tensor.dtype.lanes = 4;
  EXPECT_REJECTED(forward(&bad), AAR_ERR_INVALID_ARGUMENT, "query.dtype.lanes must be 1");
  bad = *dq.get();
  bad.dl_tensor.dtype.code = 77;
  EXPECT_REJECTED(forward(&bad), AAR_ERR_INVALID_ARGUMENT, "query.dtype (code 77");
  bad = *dq.get();
  bad.dl_tensor.device.device_type = kDLMetal;
  EXPECT_REJECTED(forward(&bad), AAR_ERR_INVALID_ARGUMENT, "query.device.device_type 8");
  // The layer's own checks, through the boundary: a query of the wrong head count.
  at::Tensor q5 = at::randn({5, H + 1, D});
  Dl dq5(q5);
  EXPECT_REJECTED(forward(dq5.get()), AAR_ERR_INVALID_ARGUMENT, "query");
  EXPECT_REJECTED(aar_gqa_impl_forward(s.impl, dq.get(), dk.get(), nullptr, dkc.get(), dvc.get(), md, dout.get()),
                  AAR_ERR_INVALID_ARGUMENT, "key and value must both be given");
  EXPECT_REJECTED(aar_gqa_impl_forward(s.impl, dq.get(), dk.get(), dv.get(), dkc.get(), nullptr, md, dout.get()),
                  AAR_ERR_INVALID_ARGUMENT, "key_cache and value_cache must both be given");
  EXPECT_TRUE(at::equal(kc, kc0));
  EXPECT_TRUE(at::equal(vc, vc0));
  EXPECT_EQ(out.abs().sum().item<float>(), 0.0f);

  // And the same call, well formed, runs (and writes the new K/V).
  ASSERT_EQ(forward(dq.get()), AAR_OK) << last();
  EXPECT_EQ(last(), "");
  EXPECT_FALSE(at::equal(kc, kc0));
  EXPECT_STREQ(aar_gqa_impl_last_path(s.impl), "fused_dense");
}

TEST(CApi, ErrorMessagesArePerThread) {
  EXPECT_EQ(aar_graph_replay(nullptr, 1), AAR_ERR_INVALID_ARGUMENT);
  const std::string here = last();
  std::string there = "unset";
  std::thread([&] { there = aar_last_error(); }).join();
  EXPECT_EQ(there, "");
  EXPECT_EQ(last(), here);
  EXPECT_EQ(aar_set_provider(AAR_PROVIDER_AUTO), AAR_OK);
  EXPECT_EQ(last(), "");  // a success clears the thread's message
  EXPECT_STREQ(aar_status_name(AAR_ERR_NOT_SUPPORTED), "AAR_ERR_NOT_SUPPORTED");
  EXPECT_EQ(aar_c_api_version(), AAR_C_API_VERSION);
}

TEST(CApi, ReturnedBlockTableIsOwnedByTheCallerAndAliasesTheStaging) {
  Gqa s;
  DLManagedTensor* t = nullptr;
  ASSERT_EQ(aar_gqa_builder_block_table(s.builder, &t), AAR_OK) << last();
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->dl_tensor.ndim, 2);
  EXPECT_EQ(t->dl_tensor.shape[1], W);
  EXPECT_EQ(t->dl_tensor.dtype.code, kDLInt);
  EXPECT_EQ(t->dl_tensor.dtype.bits, 32);
  // The engine keeps its table there and passes it back (zero copy on the CPU).
  auto* rows = static_cast<int32_t*>(t->dl_tensor.data);
  for (int i = 0; i < 2 * W; ++i) rows[i] = i;
  s.in.block_table = rows;
  const aar_gqa_metadata_t* md = nullptr;
  EXPECT_EQ(aar_gqa_builder_build(s.builder, &s.in, &md), AAR_OK) << last();
  t->deleter(t);
}

TEST(CApi, GraphErrorsAreStatusesNotCrashes) {
  aar_graph_params_t* g = nullptr;
  ASSERT_EQ(aar_graph_params_create("recording", nullptr, 0, &g), AAR_OK) << last();
  EXPECT_REJECTED(aar_graph_update_gqa(g, 4, nullptr, 0), AAR_ERR_INVALID_ARGUMENT, "groups must be a non-empty array");
  const aar_gqa_metadata_t* none[1] = {nullptr};
  EXPECT_REJECTED(aar_graph_update_gqa(g, 4, none, 1), AAR_ERR_INVALID_ARGUMENT, "groups[0] is NULL");
  EXPECT_NE(aar_graph_replay(g, 4), AAR_OK);  // no such bucket
  EXPECT_NE(last().find("aar_graph_replay: "), std::string::npos) << last();
  EXPECT_NE(aar_graph_end_capture(g), AAR_OK);  // none open
  int32_t has = 7;
  ASSERT_EQ(aar_graph_has(g, 4, &has), AAR_OK);
  EXPECT_EQ(has, 0);
  ASSERT_EQ(aar_graph_begin_capture(g, 4), AAR_OK) << last();
  aar_graph_params_destroy(g);  // with the capture open: aborted, not left dangling on this thread
  ASSERT_EQ(aar_graph_params_create("noop", nullptr, 1, &g), AAR_OK) << last();
  aar_graph_params_destroy(g);
}

// The MLA entry points against the C++ layer on the same inputs: identical
// outputs and caches (the C++ layer itself is checked against a float64 MLA in
// examples/embed_mla.cpp and tests/python/test_mla*.py).
TEST(CApi, MlaMatchesTheCppLayerExactly) {
  constexpr int64_t kH = 2, kHidden = 32, kL = 16, kP = 8, kR = 8, kV = 8;
  constexpr int kB = 16, kNb = 8, kMax = 4;
  at::manual_seed(3);
  auto rnd = [](int64_t o, int64_t i) { return at::randn({o, i}) / std::sqrt(static_cast<double>(i)); };
  const at::Tensor q_proj = rnd(kH * (kP + kR), kHidden), kv_a = rnd(kL + kR, kHidden),
                   kv_norm = 1 + 0.1 * at::randn({kL}), kv_b = rnd(kH * (kP + kV), kL), o_proj = rnd(kHidden, kH * kV);
  const at::Tensor inv = at::pow(10000.0, -at::arange(0, kR, 2, at::kDouble) / kR);
  const at::Tensor ang = at::arange(kMax * kB, at::kDouble).unsqueeze(1) * inv;
  const at::Tensor cos = at::cat({ang.cos(), ang.cos()}, -1).to(at::kFloat),
                   sin = at::cat({ang.sin(), ang.sin()}, -1).to(at::kFloat);

  // C++
  aar::mla::ImplConfig ic;
  ic.dims = {kH, kHidden, std::nullopt, kL, kP, kR, kV};
  aar::mla::Weights w;
  w.q_proj = q_proj;
  w.kv_a_proj_with_mqa = kv_a;
  w.kv_a_layernorm = kv_norm;
  w.kv_b_proj = kv_b;
  w.o_proj = o_proj;
  aar::mla::Impl cpp_layer(ic, w);
  aar::mla::BuilderConfig bc;
  bc.max_num_reqs = 4;
  bc.max_num_tokens = 32;
  bc.max_blocks_per_req = kMax;
  bc.block_size = kB;
  bc.num_blocks = kNb;
  bc.cos_table = cos;
  bc.sin_table = sin;
  aar::mla::MetadataBuilder cpp_builder(bc);

  // C
  Dl dcos(cos), dsin(sin), dq(q_proj), dkva(kv_a), dnorm(kv_norm), dkvb(kv_b), dout(o_proj);
  aar_mla_builder_config_t cbc;
  aar_mla_builder_config_init(&cbc);
  cbc.max_num_reqs = 4;
  cbc.max_num_tokens = 32;
  cbc.max_blocks_per_req = kMax;
  cbc.block_size = kB;
  cbc.num_blocks = kNb;
  aar_mla_builder_t* cb = nullptr;
  EXPECT_REJECTED(aar_mla_builder_create(&cbc, &cb), AAR_ERR_INVALID_ARGUMENT, "config->cos_table is NULL");
  cbc.cos_table = dcos.get();
  cbc.sin_table = dsin.get();
  ASSERT_EQ(aar_mla_builder_create(&cbc, &cb), AAR_OK) << last();
  std::unique_ptr<aar_mla_builder_t, void (*)(aar_mla_builder_t*)> cb_owner(cb, aar_mla_builder_destroy);
  aar_mla_impl_config_t cic;
  aar_mla_impl_config_init(&cic);
  cic.num_heads = kH;
  cic.hidden_size = kHidden;
  cic.kv_lora_rank = kL;
  cic.qk_nope_head_dim = kP;
  cic.qk_rope_head_dim = kR;
  cic.v_head_dim = kV;
  aar_mla_weights_t cw;
  aar_mla_weights_init(&cw);
  cw.q_proj = dq.get();
  cw.kv_a_proj_with_mqa = dkva.get();
  cw.kv_a_layernorm = dnorm.get();
  cw.kv_b_proj = dkvb.get();
  aar_mla_impl_t* cl = nullptr;
  EXPECT_REJECTED(aar_mla_impl_create(&cic, &cw, &cl), AAR_ERR_INVALID_ARGUMENT, "weights->o_proj is NULL");
  cw.o_proj = dout.get();
  cic.q_lora_rank = 4;
  EXPECT_REJECTED(aar_mla_impl_create(&cic, &cw, &cl), AAR_ERR_INVALID_ARGUMENT, "weights->q_a_proj must be given");
  cic.q_lora_rank = 0;
  ASSERT_EQ(aar_mla_impl_create(&cic, &cw, &cl), AAR_OK) << last();
  std::unique_ptr<aar_mla_impl_t, void (*)(aar_mla_impl_t*)> cl_owner(cl, aar_mla_impl_destroy);

  const auto shapes = aar::mla::Backend::kv_cache_shapes(kNb, kB, kL, kR);
  at::Tensor nope_a = at::zeros(shapes[0]), rope_a = at::zeros(shapes[1]);
  at::Tensor nope_b = at::zeros(shapes[0]), rope_b = at::zeros(shapes[1]);
  Dl dnope(nope_b), drope(rope_b);
  const std::vector<int32_t> table = {3, 1, 0, 0, 5, 2, 0, 0};
  // Prefill of 5 + 3 tokens, then two decode steps.
  const std::vector<std::vector<int32_t>> qsls = {{0, 5, 8}, {0, 1, 2}, {0, 1, 2}};
  const std::vector<std::vector<int32_t>> seqs = {{5, 3}, {6, 4}, {7, 5}};
  for (size_t step = 0; step < qsls.size(); ++step) {
    const auto& qsl = qsls[step];
    const auto& seq = seqs[step];
    aar::mla::BuildInputs in;
    in.query_start_loc = aar::plan::CSpan<int32_t>(qsl.data(), qsl.size());
    in.seq_lens = aar::plan::CSpan<int32_t>(seq.data(), seq.size());
    in.block_table = aar::plan::CSpan<int32_t>(table.data(), table.size());
    in.block_table_stride = kMax;
    const aar::mla::Metadata& md = cpp_builder.build(in);
    aar_mla_build_inputs_t cin;
    aar_mla_build_inputs_init(&cin);
    cin.query_start_loc = qsl.data();
    cin.query_start_loc_len = qsl.size();
    cin.seq_lens = seq.data();
    cin.seq_lens_len = seq.size();
    cin.block_table = table.data();
    cin.block_table_len = table.size();
    cin.block_table_stride = kMax;
    const aar_mla_metadata_t* cmd = nullptr;
    ASSERT_EQ(aar_mla_builder_build(cb, &cin, &cmd), AAR_OK) << last();
    aar_mla_metadata_info_t info;
    info.struct_size = sizeof(info);
    ASSERT_EQ(aar_mla_metadata_get_info(cmd, &info), AAR_OK) << last();
    EXPECT_EQ(info.num_decodes, md.num_decodes);
    EXPECT_EQ(info.num_prefills, md.num_prefills);

    const int64_t T = qsl.back();
    const at::Tensor hidden = at::randn({T, kHidden});
    at::Tensor out_a = at::empty({T, kHidden}), out_b = at::full({T, kHidden}, 7.0f);
    cpp_layer.forward(hidden, nope_a, rope_a, &md, out_a);
    Dl dh(hidden), dob(out_b);
    ASSERT_EQ(aar_mla_impl_forward(cl, dh.get(), dnope.get(), drope.get(), cmd, dob.get()), AAR_OK) << last();
    EXPECT_TRUE(at::equal(out_a, out_b)) << "step " << step << ": max diff " << (out_a - out_b).abs().max().item<float>();
    EXPECT_TRUE(at::equal(nope_a, nope_b));
    EXPECT_TRUE(at::equal(rope_a, rope_b));
  }
}

// The info's counts mean what they mean in every backend (core::StepCounts):
// num_reqs the scheduled requests, num_kernel_reqs those plus graph decode
// padding's dummy requests.
TEST(CApi, MlaInfoCountsRealAndKernelRequests) {
  const at::Tensor cos = at::ones({64, 8}), sin = at::zeros({64, 8});
  Dl dcos(cos), dsin(sin);
  aar_mla_builder_config_t bc;
  aar_mla_builder_config_init(&bc);
  bc.max_num_reqs = 4;
  bc.max_num_tokens = 8;
  bc.max_blocks_per_req = 2;
  bc.block_size = 16;
  bc.num_blocks = 8;
  bc.graph_decode_padding = 1;
  bc.cos_table = dcos.get();
  bc.sin_table = dsin.get();
  aar_mla_builder_t* b = nullptr;
  ASSERT_EQ(aar_mla_builder_create(&bc, &b), AAR_OK) << last();
  const std::vector<int32_t> qsl = {0, 1, 2}, seq = {5, 9}, table = {1, 0, 2, 0};
  aar_mla_build_inputs_t in;
  aar_mla_build_inputs_init(&in);
  in.query_start_loc = qsl.data();
  in.query_start_loc_len = qsl.size();
  in.seq_lens = seq.data();
  in.seq_lens_len = seq.size();
  in.block_table = table.data();
  in.block_table_len = table.size();
  in.block_table_stride = 2;
  in.num_input_tokens = 4;  // a bucket of 4: two dummy decode requests
  const aar_mla_metadata_t* md = nullptr;
  ASSERT_EQ(aar_mla_builder_build(b, &in, &md), AAR_OK) << last();
  aar_mla_metadata_info_t info;
  info.struct_size = sizeof(info);
  ASSERT_EQ(aar_mla_metadata_get_info(md, &info), AAR_OK) << last();
  EXPECT_EQ(info.num_reqs, 2);
  EXPECT_EQ(info.num_kernel_reqs, 4);
  EXPECT_EQ(info.num_actual_tokens, 2);
  EXPECT_EQ(info.num_input_tokens, 4);
  EXPECT_EQ(info.num_decodes, 2);
  EXPECT_EQ(info.num_decode_tokens, 2);
  in.num_input_tokens = 0;  // unpadded: the kernels see the scheduled requests
  ASSERT_EQ(aar_mla_builder_build(b, &in, &md), AAR_OK) << last();
  ASSERT_EQ(aar_mla_metadata_get_info(md, &info), AAR_OK) << last();
  EXPECT_EQ(info.num_reqs, 2);
  EXPECT_EQ(info.num_kernel_reqs, 2);
  aar_mla_builder_destroy(b);
}

// Every handle carries a type tag: a handle of another type is rejected by
// name (argument, expected type, what it is) before anything is read through
// it or written, instead of being read as the wrong struct.
TEST(CApi, HandlesOfAnotherTypeAreRejectedByName) {
  Gqa s;
  const aar_gqa_metadata_t* md = nullptr;
  ASSERT_EQ(aar_gqa_builder_build(s.builder, &s.in, &md), AAR_OK) << last();
  const auto* gqa_as_mla = reinterpret_cast<const aar_mla_metadata_t*>(md);

  // GQA metadata where MLA metadata is expected: nothing read, nothing written.
  aar_mla_metadata_info_t minfo;
  std::memset(&minfo, 0x5a, sizeof(minfo));
  minfo.struct_size = sizeof(minfo);
  const aar_mla_metadata_info_t minfo0 = minfo;
  EXPECT_REJECTED(aar_mla_metadata_get_info(gqa_as_mla, &minfo), AAR_ERR_INVALID_ARGUMENT,
                  "aar_mla_metadata_get_info: metadata is an aar_gqa_metadata_t, expected an aar_mla_metadata_t");
  EXPECT_EQ(std::memcmp(&minfo, &minfo0, sizeof(minfo)), 0);
  aar_graph_params_t* g = nullptr;
  ASSERT_EQ(aar_graph_params_create("recording", nullptr, 0, &g), AAR_OK) << last();
  EXPECT_REJECTED(aar_graph_update_mla(g, 4, gqa_as_mla), AAR_ERR_INVALID_ARGUMENT,
                  "metadata is an aar_gqa_metadata_t, expected an aar_mla_metadata_t");
  {
    Mla m;
    at::Tensor hidden = at::randn({5, Mla::kHidden}), out = at::zeros({5, Mla::kHidden});
    const auto shapes = aar::mla::Backend::kv_cache_shapes(Mla::kNb, Mla::kB, Mla::kL, Mla::kR);
    at::Tensor nope = at::randn(shapes[0]), rope = at::randn(shapes[1]);
    const at::Tensor nope0 = nope.clone(), rope0 = rope.clone();
    Dl dh(hidden), dout(out), dnope(nope), drope(rope);
    EXPECT_REJECTED(aar_mla_impl_forward(m.impl, dh.get(), dnope.get(), drope.get(), gqa_as_mla, dout.get()),
                    AAR_ERR_INVALID_ARGUMENT, "metadata is an aar_gqa_metadata_t, expected an aar_mla_metadata_t");
    EXPECT_REJECTED(aar_mla_impl_forward(reinterpret_cast<aar_mla_impl_t*>(m.builder), dh.get(), dnope.get(),
                                         drope.get(), nullptr, dout.get()),
                    AAR_ERR_INVALID_ARGUMENT, "impl is an aar_mla_builder_t, expected an aar_mla_impl_t");
    EXPECT_TRUE(at::equal(nope, nope0));
    EXPECT_TRUE(at::equal(rope, rope0));
    EXPECT_EQ(out.abs().sum().item<float>(), 0.0f);
  }

  // Builders, impls and graph params swapped.
  const aar_gqa_metadata_t* md2 = md;
  EXPECT_REJECTED(aar_gqa_builder_build(reinterpret_cast<aar_gqa_builder_t*>(s.impl), &s.in, &md2),
                  AAR_ERR_INVALID_ARGUMENT,
                  "aar_gqa_builder_build: builder is an aar_gqa_impl_t, expected an aar_gqa_builder_t");
  EXPECT_EQ(md2, md);
  EXPECT_REJECTED(aar_graph_replay(reinterpret_cast<aar_graph_params_t*>(s.builder), 4), AAR_ERR_INVALID_ARGUMENT,
                  "graph is an aar_gqa_builder_t, expected an aar_graph_params_t");
  DLManagedTensor* bt = nullptr;
  EXPECT_REJECTED(aar_gqa_builder_block_table(reinterpret_cast<aar_gqa_builder_t*>(g), &bt),
                  AAR_ERR_INVALID_ARGUMENT, "builder is an aar_graph_params_t, expected an aar_gqa_builder_t");
  EXPECT_EQ(bt, nullptr);
  EXPECT_STREQ(aar_gqa_impl_last_path(reinterpret_cast<aar_gqa_impl_t*>(s.builder)), "");
  EXPECT_NE(last().find("impl is an aar_gqa_builder_t, expected an aar_gqa_impl_t"), std::string::npos) << last();

  // A forward given a builder as its metadata writes neither the caches nor the output.
  at::Tensor q = at::randn({5, H, D}), k = at::randn({5, HKV, D}), v = at::randn({5, HKV, D});
  at::Tensor kc = at::randn({NB, BS, HKV, D}), vc = at::randn({NB, BS, HKV, D}), out = at::zeros({5, H, D});
  const at::Tensor kc0 = kc.clone(), vc0 = vc.clone();
  Dl dq(q), dk(k), dv(v), dkc(kc), dvc(vc), dout(out);
  EXPECT_REJECTED(aar_gqa_impl_forward(s.impl, dq.get(), dk.get(), dv.get(), dkc.get(), dvc.get(),
                                       reinterpret_cast<const aar_gqa_metadata_t*>(s.builder), dout.get()),
                  AAR_ERR_INVALID_ARGUMENT, "metadata is an aar_gqa_builder_t, expected an aar_gqa_metadata_t");
  EXPECT_REJECTED(aar_gqa_impl_forward(reinterpret_cast<aar_gqa_impl_t*>(s.builder), dq.get(), dk.get(), dv.get(),
                                       dkc.get(), dvc.get(), md, dout.get()),
                  AAR_ERR_INVALID_ARGUMENT, "impl is an aar_gqa_builder_t, expected an aar_gqa_impl_t");
  EXPECT_TRUE(at::equal(kc, kc0));
  EXPECT_TRUE(at::equal(vc, vc0));
  EXPECT_EQ(out.abs().sum().item<float>(), 0.0f);

  // One bad element of a metadata array, named by its index.
  const aar_gqa_metadata_t* groups[2] = {md, reinterpret_cast<const aar_gqa_metadata_t*>(s.impl)};
  EXPECT_REJECTED(aar_graph_update_gqa(g, 4, groups, 2), AAR_ERR_INVALID_ARGUMENT,
                  "groups[1] is an aar_gqa_impl_t, expected an aar_gqa_metadata_t");
  // A pointer that is no handle at all.
  const uint64_t not_a_handle[2] = {0x1234, 0};
  EXPECT_REJECTED(aar_gqa_metadata_get_info(reinterpret_cast<const aar_gqa_metadata_t*>(not_a_handle), nullptr),
                  AAR_ERR_INVALID_ARGUMENT, "metadata is not a handle of this API");
  EXPECT_NE(last().find("expected an aar_gqa_metadata_t"), std::string::npos) << last();
  EXPECT_REJECTED(aar_gqa_metadata_get_info(nullptr, nullptr), AAR_ERR_INVALID_ARGUMENT,
                  "metadata is NULL, expected an aar_gqa_metadata_t");

  // The wrong destroy frees nothing: the builder and the graph params still work.
  aar_gqa_impl_destroy(reinterpret_cast<aar_gqa_impl_t*>(s.builder));
  EXPECT_NE(last().find("aar_gqa_impl_destroy: impl is an aar_gqa_builder_t"), std::string::npos) << last();
  aar_mla_builder_destroy(reinterpret_cast<aar_mla_builder_t*>(g));
  EXPECT_NE(last().find("builder is an aar_graph_params_t, expected an aar_mla_builder_t"), std::string::npos)
      << last();
  ASSERT_EQ(aar_gqa_builder_build(s.builder, &s.in, &md2), AAR_OK) << last();
  EXPECT_EQ(md2, md);  // one metadata handle per builder
  int32_t has = 7;
  ASSERT_EQ(aar_graph_has(g, 4, &has), AAR_OK) << last();
  EXPECT_EQ(has, 0);
  aar_graph_params_destroy(g);
}

// Destroy clears the tag: a handle used after its destroy (or a metadata after
// its builder's) is rejected as destroyed, and a second destroy frees nothing.
// Best effort by contract (c_api.h HANDLES); it holds for recent destroys.
TEST(CApi, DestroyedHandlesAreRejected) {
  auto s = std::make_unique<Gqa>();
  const aar_gqa_metadata_t* md = nullptr;
  ASSERT_EQ(aar_gqa_builder_build(s->builder, &s->in, &md), AAR_OK) << last();
  aar_gqa_builder_t* builder = s->builder;
  aar_gqa_impl_t* impl = s->impl;
  s.reset();  // destroys both
  aar_gqa_metadata_info_t info;
  info.struct_size = sizeof(info);
  EXPECT_REJECTED(aar_gqa_metadata_get_info(md, &info), AAR_ERR_INVALID_ARGUMENT,
                  "metadata is an aar_gqa_metadata_t that has been destroyed");
  aar_gqa_build_inputs_t in;
  aar_gqa_build_inputs_init(&in);
  EXPECT_REJECTED(aar_gqa_builder_build(builder, &in, &md), AAR_ERR_INVALID_ARGUMENT,
                  "builder is an aar_gqa_builder_t that has been destroyed");
  EXPECT_STREQ(aar_gqa_impl_last_path(impl), "");
  EXPECT_NE(last().find("impl is an aar_gqa_impl_t that has been destroyed"), std::string::npos) << last();
  aar_gqa_builder_destroy(builder);  // twice: nothing freed again
  EXPECT_NE(last().find("aar_gqa_builder_destroy: builder is an aar_gqa_builder_t that has been destroyed"),
            std::string::npos)
      << last();
  aar_gqa_impl_destroy(impl);
  EXPECT_NE(last().find("has been destroyed"), std::string::npos) << last();

  aar_graph_params_t* g = nullptr;
  ASSERT_EQ(aar_graph_params_create("recording", nullptr, 0, &g), AAR_OK) << last();
  aar_graph_params_destroy(g);
  EXPECT_REJECTED(aar_graph_replay(g, 4), AAR_ERR_INVALID_ARGUMENT,
                  "graph is an aar_graph_params_t that has been destroyed");
  // A destroyed handle of another type says both.
  EXPECT_REJECTED(aar_gqa_builder_build(reinterpret_cast<aar_gqa_builder_t*>(g), &in, &md), AAR_ERR_INVALID_ARGUMENT,
                  "builder is a destroyed aar_graph_params_t, expected an aar_gqa_builder_t");
}

// DLPack fields the runtime cannot honour are rejected by name and value
// before anything is written; an aligned byte_offset is honoured.
TEST(CApi, DlpackOffsetsAndDtypesTheRuntimeCannotHonourAreRejected) {
  Gqa s;
  const aar_gqa_metadata_t* md = nullptr;
  ASSERT_EQ(aar_gqa_builder_build(s.builder, &s.in, &md), AAR_OK) << last();
  constexpr int64_t kPad = 3;  // floats before the query in its buffer
  const at::Tensor buf = at::randn({kPad + 5 * H * D + 1});
  const at::Tensor q = buf.narrow(0, kPad, 5 * H * D).view({5, H, D}).clone();
  at::Tensor k = at::randn({5, HKV, D}), v = at::randn({5, HKV, D});
  at::Tensor kc = at::randn({NB, BS, HKV, D}), vc = at::randn({NB, BS, HKV, D}), out = at::zeros({5, H, D});
  const at::Tensor kc0 = kc.clone(), vc0 = vc.clone();
  Dl dq(q), dk(k), dv(v), dkc(kc), dvc(vc), dout(out);
  auto forward = [&](const DLManagedTensor* query, const DLManagedTensor* key_cache, const DLManagedTensor* output) {
    return aar_gqa_impl_forward(s.impl, query, dk.get(), dv.get(), key_cache, dvc.get(), md, output);
  };

  // The query at buf + kPad floats, described as buf's data + a byte_offset.
  DLManagedTensor off = *dq.get();
  off.dl_tensor.data = buf.data_ptr();
  off.dl_tensor.byte_offset = kPad * sizeof(float) - 2;  // 2 bytes short of a float boundary
  EXPECT_REJECTED(forward(&off, dkc.get(), dout.get()), AAR_ERR_INVALID_ARGUMENT, "query.byte_offset 10 puts the first element at");
  EXPECT_NE(last().find("not a multiple of 4 bytes, the element size of Float"), std::string::npos) << last();
  DLManagedTensor bad = *dq.get();
  bad.dl_tensor.data = static_cast<char*>(buf.data_ptr()) + 1;  // misaligned data, no offset
  EXPECT_REJECTED(forward(&bad, dkc.get(), dout.get()), AAR_ERR_INVALID_ARGUMENT, "query.byte_offset 0 puts the first element at");
  DLManagedTensor bad_cache = *dkc.get();
  bad_cache.dl_tensor.byte_offset = 6;
  EXPECT_REJECTED(forward(dq.get(), &bad_cache, dout.get()), AAR_ERR_INVALID_ARGUMENT, "key_cache.byte_offset 6");
  DLManagedTensor bad_out = *dout.get();
  bad_out.dl_tensor.byte_offset = 1;
  EXPECT_REJECTED(forward(dq.get(), dkc.get(), &bad_out), AAR_ERR_INVALID_ARGUMENT, "output.byte_offset 1");

  bad = *dq.get();
  bad.dl_tensor.dtype.bits = 4;  // a packed sub-byte float
  bad.dl_tensor.dtype.code = kDLFloat4_e2m1fn;
  EXPECT_REJECTED(forward(&bad, dkc.get(), dout.get()), AAR_ERR_INVALID_ARGUMENT,
                  "query.dtype.bits must be a positive multiple of 8, got 4 (code 17)");
  bad.dl_tensor.dtype.code = kDLInt;
  bad.dl_tensor.dtype.bits = 12;
  EXPECT_REJECTED(forward(&bad, dkc.get(), dout.get()), AAR_ERR_INVALID_ARGUMENT,
                  "query.dtype.bits must be a positive multiple of 8, got 12");
  bad.dl_tensor.dtype.bits = 0;
  EXPECT_REJECTED(forward(&bad, dkc.get(), dout.get()), AAR_ERR_INVALID_ARGUMENT,
                  "query.dtype.bits must be a positive multiple of 8, got 0");
  bad = *dq.get();
  bad.dl_tensor.dtype.code = kDLOpaqueHandle;
  EXPECT_REJECTED(forward(&bad, dkc.get(), dout.get()), AAR_ERR_INVALID_ARGUMENT, "query.dtype (code 3, bits 32)");
  bad = *dq.get();
  int64_t neg_strides[3] = {H * D, -D, 1};
  bad.dl_tensor.strides = neg_strides;
  EXPECT_REJECTED(forward(&bad, dkc.get(), dout.get()), AAR_ERR_INVALID_ARGUMENT, "query.strides[1] is negative: -16");
  bad = *dq.get();
  bad.dl_tensor.ndim = 2;  // (5, H): the layer's shape check names the query
  EXPECT_REJECTED(forward(&bad, dkc.get(), dout.get()), AAR_ERR_INVALID_ARGUMENT, "query must have shape");
  EXPECT_TRUE(at::equal(kc, kc0));
  EXPECT_TRUE(at::equal(vc, vc0));
  EXPECT_EQ(out.abs().sum().item<float>(), 0.0f);

  // An aligned byte_offset is honoured: the same output as the plain query.
  off.dl_tensor.byte_offset = kPad * sizeof(float);
  ASSERT_EQ(forward(&off, dkc.get(), dout.get()), AAR_OK) << last();
  at::Tensor out2 = at::zeros({5, H, D});
  Dl dout2(out2);
  ASSERT_EQ(forward(dq.get(), dkc.get(), dout2.get()), AAR_OK) << last();
  EXPECT_GT(out.abs().sum().item<float>(), 0.0f);
  EXPECT_TRUE(at::equal(out, out2));
}

// An NPU tensor (or device) in a process without torch_npu is rejected with the
// argument, the device and what is missing, not with torch's own message.
TEST(CApi, NpuTensorsWithoutTorchNpuAreRejectedByName) {
  if (c10::impl::hasDeviceGuardImpl(c10::DeviceType::PrivateUse1)) GTEST_SKIP() << "a PrivateUse1 backend is loaded";
  Gqa s;
  const aar_gqa_metadata_t* md = nullptr;
  ASSERT_EQ(aar_gqa_builder_build(s.builder, &s.in, &md), AAR_OK) << last();
  at::Tensor q = at::randn({5, H, D}), k = at::randn({5, HKV, D}), v = at::randn({5, HKV, D});
  at::Tensor kc = at::randn({NB, BS, HKV, D}), vc = at::randn({NB, BS, HKV, D}), out = at::zeros({5, H, D});
  const at::Tensor kc0 = kc.clone(), vc0 = vc.clone();
  Dl dq(q), dk(k), dv(v), dkc(kc), dvc(vc), dout(out);
  DLManagedTensor npu_q = *dq.get();
  npu_q.dl_tensor.device = DLDevice{kDLExtDev, 1};
  EXPECT_REJECTED(aar_gqa_impl_forward(s.impl, &npu_q, dk.get(), dv.get(), dkc.get(), dvc.get(), md, dout.get()),
                  AAR_ERR_INVALID_ARGUMENT,
                  "query.device is kDLExtDev (12) device 1, an Ascend NPU, but no NPU backend is loaded");
  EXPECT_NE(last().find("NPU tensors need torch_npu"), std::string::npos) << last();
  DLManagedTensor npu_vc = *dvc.get();
  npu_vc.dl_tensor.device = DLDevice{kDLExtDev, 0};
  EXPECT_REJECTED(aar_gqa_impl_forward(s.impl, dq.get(), dk.get(), dv.get(), dkc.get(), &npu_vc, md, dout.get()),
                  AAR_ERR_INVALID_ARGUMENT, "value_cache.device is kDLExtDev (12) device 0");
  EXPECT_TRUE(at::equal(kc, kc0));
  EXPECT_TRUE(at::equal(vc, vc0));
  EXPECT_EQ(out.abs().sum().item<float>(), 0.0f);

  aar_gqa_builder_config_t bc;
  aar_gqa_builder_config_init(&bc);
  bc.num_blocks = NB;
  bc.device = DLDevice{kDLExtDev, 0};
  aar_gqa_builder_t* b = nullptr;
  EXPECT_REJECTED(aar_gqa_builder_create(&bc, &b), AAR_ERR_INVALID_ARGUMENT,
                  "config->device is kDLExtDev (12) device 0, an Ascend NPU");
  EXPECT_NE(last().find("torch_npu"), std::string::npos) << last();
  EXPECT_EQ(b, nullptr);
  const at::Tensor table = at::ones({32, 8});
  Dl dtable(table);
  DLManagedTensor npu_table = *dtable.get();
  npu_table.dl_tensor.device = DLDevice{kDLExtDev, 0};
  aar_mla_builder_config_t mbc;
  aar_mla_builder_config_init(&mbc);
  mbc.num_blocks = NB;
  mbc.cos_table = &npu_table;
  mbc.sin_table = dtable.get();
  aar_mla_builder_t* mb = nullptr;
  EXPECT_REJECTED(aar_mla_builder_create(&mbc, &mb), AAR_ERR_INVALID_ARGUMENT,
                  "config->cos_table.device is kDLExtDev (12) device 0");
  EXPECT_EQ(mb, nullptr);
}

}  // namespace
