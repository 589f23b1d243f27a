// The C ABI of SFA (include/ascend_attn_rt/c_api.h): the builder's main and
// draft lanes, the top-k buffer and two layers (one with an indexer writing the
// buffer, one reusing it) compute exactly what the C++ API computes on the same
// inputs; bad arguments and handles of another type are rejected by name with
// the caches, the buffer and the output untouched.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <vector>

#include "ascend_attn_rt/c_api.h"
#include "ascend_attn_rt/sfa/builder.h"
#include "ascend_attn_rt/sfa/impl.h"
#include "ascend_attn_rt/sparse/topk_buffer.h"
#include "c_api_test_util.h"

namespace {

using aar_c_api_test::Dl;
using aar_c_api_test::last;

constexpr int64_t kH = 4, kHidden = 64, kQ = 48, kL = 64, kP = 32, kR = 16, kV = 32;
constexpr int64_t kIdxHeads = 4, kIdxD = 32, kIdxK = 8;
constexpr int32_t kBlock = 16, kMbr = 4, kNb = 8, kMaxTokens = 32;

at::Tensor weight(int64_t o, int64_t i) { return at::randn({o, i}) / std::sqrt(static_cast<double>(i)); }

// Weights, RoPE tables and their DLPack views, shared by the C++ and the C layers.
struct Model {
  Model() {
    at::manual_seed(11);
    const at::Tensor ang = at::arange(kMbr * kBlock, at::kDouble).unsqueeze(1) *
                           at::pow(10000.0, -at::arange(0, kR, 2, at::kDouble) / kR);
    cos = at::cat({ang.cos(), ang.cos()}, 1).to(at::kFloat);
    sin = at::cat({ang.sin(), ang.sin()}, 1).to(at::kFloat);
    for (int l = 0; l < 2; ++l) {
      Layer& y = layers[l];
      y.q_a = weight(kQ, kHidden);
      y.q_a_norm = 1 + 0.1 * at::randn({kQ});
      y.q = weight(kH * (kP + kR), kQ);
      y.kv_a = weight(kL + kR, kHidden);
      y.kv_norm = 1 + 0.1 * at::randn({kL});
      y.kv_b = weight(kH * (kP + kV), kL);
      y.o = weight(kHidden, kH * kV);
    }
    iw = {weight(kIdxHeads * kIdxD, kQ), weight(kIdxD, kHidden), weight(kIdxHeads, kHidden),
          1 + 0.1 * at::randn({kIdxD}), 0.1 * at::randn({kIdxD})};
  }
  struct Layer {
    at::Tensor q_a, q_a_norm, q, kv_a, kv_norm, kv_b, o;
    aar::mla::Weights cpp() const {
      aar::mla::Weights w;
      w.q_a_proj = q_a;
      w.q_a_layernorm = q_a_norm;
      w.q_proj = q;
      w.kv_a_proj_with_mqa = kv_a;
      w.kv_a_layernorm = kv_norm;
      w.kv_b_proj = kv_b;
      w.o_proj = o;
      return w;
    }
  };
  at::Tensor cos, sin;
  Layer layers[2];
  aar::sfa::IndexerWeights iw;
};

// The C layer's weights as DLPack, owned for the layer's life.
struct CWeights {
  explicit CWeights(const Model::Layer& y)
      : q_a(y.q_a), q_a_norm(y.q_a_norm), q(y.q), kv_a(y.kv_a), kv_norm(y.kv_norm), kv_b(y.kv_b), o(y.o) {
    aar_mla_weights_init(&w);
    w.q_a_proj = q_a.get();
    w.q_a_layernorm = q_a_norm.get();
    w.q_proj = q.get();
    w.kv_a_proj_with_mqa = kv_a.get();
    w.kv_a_layernorm = kv_norm.get();
    w.kv_b_proj = kv_b.get();
    w.o_proj = o.get();
  }
  Dl q_a, q_a_norm, q, kv_a, kv_norm, kv_b, o;
  aar_mla_weights_t w;
};

struct CIndexerWeights {
  explicit CIndexerWeights(const aar::sfa::IndexerWeights& iw)
      : wq_b(iw.wq_b), wk(iw.wk), proj(iw.weights_proj), nw(iw.k_norm_weight), nb(iw.k_norm_bias) {
    aar_sfa_indexer_weights_init(&w);
    w.wq_b = wq_b.get();
    w.wk = wk.get();
    w.weights_proj = proj.get();
    w.k_norm_weight = nw.get();
    w.k_norm_bias = nb.get();
  }
  Dl wq_b, wk, proj, nw, nb;
  aar_sfa_indexer_weights_t w;
};

aar::sfa::ImplConfig cpp_config(bool indexer) {
  aar::sfa::ImplConfig c;
  c.dims = {kH, kHidden, kQ, kL, kP, kR, kV};
  if (indexer) {
    aar::sfa::IndexerConfig idx;
    idx.n_head = kIdxHeads;
    idx.head_dim = kIdxD;
    idx.topk = kIdxK;
    c.indexer = idx;
    c.use_index_cache = true;
  }
  return c;
}

aar_sfa_impl_config_t c_config(bool indexer) {
  aar_sfa_impl_config_t c;
  aar_sfa_impl_config_init(&c);
  c.num_heads = kH;
  c.hidden_size = kHidden;
  c.q_lora_rank = kQ;
  c.kv_lora_rank = kL;
  c.qk_nope_head_dim = kP;
  c.qk_rope_head_dim = kR;
  c.v_head_dim = kV;
  c.has_indexer = indexer;
  c.index_n_heads = kIdxHeads;
  c.index_head_dim = kIdxD;
  c.index_topk = kIdxK;
  c.use_index_cache = indexer;
  return c;
}

aar::sfa::BuilderConfig cpp_builder_config(const Model& m) {
  aar::sfa::BuilderConfig c;
  c.max_num_reqs = 4;
  c.max_num_tokens = kMaxTokens;
  c.max_blocks_per_req = kMbr;
  c.block_size = kBlock;
  c.num_blocks = kNb;
  c.num_drafts = 1;
  c.cos_table = m.cos;
  c.sin_table = m.sin;
  return c;
}

struct Step {
  std::vector<int32_t> qsl, seq;
};
const std::vector<int32_t> kTable = {3, 1, 0, 0, 5, 2, 0, 0};

aar::sfa::BuildInputs cpp_inputs(const Step& s) {
  aar::sfa::BuildInputs in;
  in.query_start_loc = {s.qsl.data(), s.qsl.size()};
  in.seq_lens = {s.seq.data(), s.seq.size()};
  in.block_table = {kTable.data(), kTable.size()};
  in.block_table_stride = kMbr;
  return in;
}

aar_sfa_build_inputs_t c_inputs(const Step& s) {
  aar_sfa_build_inputs_t in;
  aar_sfa_build_inputs_init(&in);
  in.query_start_loc = s.qsl.data();
  in.query_start_loc_len = s.qsl.size();
  in.seq_lens = s.seq.data();
  in.seq_lens_len = s.seq.size();
  in.block_table = kTable.data();
  in.block_table_len = kTable.size();
  in.block_table_stride = kMbr;
  return in;
}

template <typename H>
using Owned = std::unique_ptr<H, void (*)(H*)>;

// The C side of the model: builder, buffer, two layers.
struct CModel {
  explicit CModel(const Model& m) : dcos(m.cos), dsin(m.sin), w0(m.layers[0]), w1(m.layers[1]), iw(m.iw) {
    aar_sfa_builder_config_t bc;
    aar_sfa_builder_config_init(&bc);
    bc.max_num_reqs = 4;
    bc.max_num_tokens = kMaxTokens;
    bc.max_blocks_per_req = kMbr;
    bc.block_size = kBlock;
    bc.num_blocks = kNb;
    bc.num_drafts = 1;
    bc.cos_table = dcos.get();
    bc.sin_table = dsin.get();
    aar_sfa_builder_t* b = nullptr;
    EXPECT_EQ(aar_sfa_builder_create(&bc, &b), AAR_OK) << last();
    builder.reset(b);
    aar_sfa_topk_buffer_t* t = nullptr;
    EXPECT_EQ(aar_sfa_topk_buffer_create(kMaxTokens, kIdxK, DLDevice{kDLCPU, 0}, &t), AAR_OK) << last();
    topk.reset(t);
    const aar_sfa_impl_config_t c0 = c_config(true), c1 = c_config(false);
    aar_sfa_impl_t* l = nullptr;
    EXPECT_EQ(aar_sfa_impl_create(&c0, &w0.w, &iw.w, &l), AAR_OK) << last();
    indexer_layer.reset(l);
    l = nullptr;
    EXPECT_EQ(aar_sfa_impl_create(&c1, &w1.w, nullptr, &l), AAR_OK) << last();
    reuse_layer.reset(l);
  }
  Dl dcos, dsin;
  CWeights w0, w1;
  CIndexerWeights iw;
  Owned<aar_sfa_builder_t> builder{nullptr, aar_sfa_builder_destroy};
  Owned<aar_sfa_topk_buffer_t> topk{nullptr, aar_sfa_topk_buffer_destroy};
  Owned<aar_sfa_impl_t> indexer_layer{nullptr, aar_sfa_impl_destroy}, reuse_layer{nullptr, aar_sfa_impl_destroy};
};

std::vector<at::Tensor> caches(bool indexer) {
  std::vector<at::Tensor> kv{at::zeros({kNb, kBlock, 1, kL}), at::zeros({kNb, kBlock, 1, kR})};
  if (indexer) kv.push_back(at::zeros({kNb, kBlock, 1, kIdxD}));
  return kv;
}

bool all_equal(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!at::equal(a[i], b[i])) return false;
  }
  return true;
}

std::vector<at::Tensor> clones(const std::vector<at::Tensor>& v) {
  std::vector<at::Tensor> out;
  for (const auto& t : v) out.push_back(t.clone());
  return out;
}

TEST(CApiSfa, MatchesTheCppLayersExactly) {
  const Model m;
  aar::sfa::MetadataBuilder cpp_builder(cpp_builder_config(m));
  aar::sfa::TopkBuffer cpp_topk(kMaxTokens, kIdxK);
  aar::sfa::Impl cpp0(cpp_config(true), m.layers[0].cpp(), m.iw), cpp1(cpp_config(false), m.layers[1].cpp(), std::nullopt);
  CModel c(m);
  ASSERT_TRUE(c.builder && c.topk && c.indexer_layer && c.reuse_layer);

  const std::vector<at::Tensor> kv0_a = caches(true), kv1_a = caches(false);
  const std::vector<at::Tensor> kv0_b = caches(true), kv1_b = caches(false);
  std::vector<std::unique_ptr<Dl>> owners;
  std::vector<const DLManagedTensor*> ckv0, ckv1;
  for (const auto& t : kv0_b) ckv0.push_back(owners.emplace_back(std::make_unique<Dl>(t))->get());
  for (const auto& t : kv1_b) ckv1.push_back(owners.emplace_back(std::make_unique<Dl>(t))->get());
  DLManagedTensor* buf = nullptr;
  ASSERT_EQ(aar_sfa_topk_buffer_tensor(c.topk.get(), &buf), AAR_OK) << last();
  const at::Tensor c_topk = at::fromDLPack(buf);  // owns buf: its deleter runs with the tensor

  // A prefill of 5 + 3 tokens, then two decodes.
  const std::vector<Step> steps = {{{0, 5, 8}, {5, 3}}, {{0, 1, 2}, {6, 4}}, {{0, 1, 2}, {7, 5}}};
  for (size_t s = 0; s < steps.size(); ++s) {
    const aar::sfa::Metadata& md = cpp_builder.build(cpp_inputs(steps[s]));
    const aar_sfa_build_inputs_t cin = c_inputs(steps[s]);
    const aar_sfa_metadata_t* cmd = nullptr;
    ASSERT_EQ(aar_sfa_builder_build(c.builder.get(), &cin, &cmd), AAR_OK) << last();
    aar_sfa_metadata_info_t info;
    info.struct_size = sizeof(info);
    ASSERT_EQ(aar_sfa_metadata_get_info(cmd, &info), AAR_OK) << last();
    EXPECT_EQ(info.num_decodes, md.num_decodes);
    EXPECT_EQ(info.num_prefills, md.num_prefills);
    EXPECT_EQ(info.num_actual_tokens, md.num_actual_tokens);
    EXPECT_EQ(info.draft_index, -1);
    EXPECT_EQ(info.generation, s + 1);

    const int64_t T = steps[s].qsl.back();
    const at::Tensor hidden = at::randn({T, kHidden});
    at::Tensor h1_a = at::empty({T, kHidden}), out_a = at::empty({T, kHidden});
    cpp0.forward(hidden, kv0_a, &md, h1_a, &cpp_topk);
    cpp1.forward(h1_a, kv1_a, &md, out_a, &cpp_topk);
    EXPECT_EQ(cpp1.last_topk_source(), aar::sfa::TopkSource::Reused);

    at::Tensor h1_b = at::full({T, kHidden}, 7.0f), out_b = at::full({T, kHidden}, 7.0f);
    Dl dh(hidden), dh1(h1_b), dout(out_b);
    ASSERT_EQ(aar_sfa_impl_forward(c.indexer_layer.get(), dh.get(), ckv0.data(), ckv0.size(), cmd, dh1.get(),
                                   c.topk.get()),
              AAR_OK)
        << last();
    ASSERT_EQ(aar_sfa_impl_forward(c.reuse_layer.get(), dh1.get(), ckv1.data(), ckv1.size(), cmd, dout.get(),
                                   c.topk.get()),
              AAR_OK)
        << last();
    EXPECT_TRUE(at::equal(h1_a, h1_b)) << "step " << s;
    EXPECT_TRUE(at::equal(out_a, out_b)) << "step " << s << ": max diff " << (out_a - out_b).abs().max().item<float>();
    EXPECT_TRUE(all_equal(kv0_a, kv0_b)) << "step " << s;
    EXPECT_TRUE(all_equal(kv1_a, kv1_b)) << "step " << s;
    EXPECT_GT(out_a.abs().sum().item<double>(), 0.0) << "step " << s;
    EXPECT_TRUE(at::equal(cpp_topk.buffer(), c_topk)) << "step " << s;
  }

  // A draft step: its own lane's metadata, the main one left as it was.
  const Step draft{{0, 1, 2}, {8, 6}};
  const aar::sfa::Metadata& dmd = cpp_builder.build_for_drafting(cpp_inputs(draft), 0);
  const aar_sfa_build_inputs_t din = c_inputs(draft);
  const aar_sfa_metadata_t* main_md = nullptr;
  const aar_sfa_metadata_t* cdmd = nullptr;
  ASSERT_EQ(aar_sfa_builder_build(c.builder.get(), &din, &main_md), AAR_OK) << last();
  ASSERT_EQ(aar_sfa_builder_build_for_drafting(c.builder.get(), &din, 0, &cdmd), AAR_OK) << last();
  EXPECT_NE(cdmd, main_md);
  aar_sfa_metadata_info_t dinfo, minfo;
  dinfo.struct_size = minfo.struct_size = sizeof(dinfo);
  ASSERT_EQ(aar_sfa_metadata_get_info(cdmd, &dinfo), AAR_OK) << last();
  ASSERT_EQ(aar_sfa_metadata_get_info(main_md, &minfo), AAR_OK) << last();
  EXPECT_EQ(dinfo.draft_index, 0);
  EXPECT_EQ(dinfo.generation, dmd.stamp.generation);
  EXPECT_EQ(minfo.draft_index, -1);
  EXPECT_EQ(minfo.generation, 4u);
  EXPECT_REJECTED(aar_sfa_builder_build_for_drafting(c.builder.get(), &din, 1, &cdmd), AAR_ERR_INVALID_ARGUMENT,
                  "aar_sfa_builder_build_for_drafting: draft_index=1 is out of range [0, num_drafts=1)");
  EXPECT_REJECTED(aar_sfa_builder_build_for_graph_capture(c.builder.get(), &din, AAR_STATE_PREFILL_NO_CACHE, &cdmd),
                  AAR_ERR_NOT_SUPPORTED, "aar_sfa_builder_build_for_graph_capture");
}

TEST(CApiSfa, BadArgumentsAreNamedAndWriteNothing) {
  const Model m;
  CModel c(m);
  ASSERT_TRUE(c.builder && c.topk && c.indexer_layer && c.reuse_layer);
  const Step step{{0, 5, 8}, {5, 3}};
  const aar_sfa_build_inputs_t cin = c_inputs(step);
  const aar_sfa_metadata_t* cmd = nullptr;
  ASSERT_EQ(aar_sfa_builder_build(c.builder.get(), &cin, &cmd), AAR_OK) << last();

  std::vector<at::Tensor> kv = caches(true);
  for (auto& t : kv) t.normal_();
  const std::vector<at::Tensor> kv_before = clones(kv);
  std::vector<std::unique_ptr<Dl>> owners;
  std::vector<const DLManagedTensor*> ckv;
  for (const auto& t : kv) ckv.push_back(owners.emplace_back(std::make_unique<Dl>(t))->get());
  const at::Tensor hidden = at::randn({8, kHidden});
  at::Tensor out = at::full({8, kHidden}, 7.0f);
  Dl dh(hidden), dout(out);
  DLManagedTensor* buf = nullptr;
  ASSERT_EQ(aar_sfa_topk_buffer_tensor(c.topk.get(), &buf), AAR_OK) << last();
  const at::Tensor topk = at::fromDLPack(buf);
  const at::Tensor topk_before = topk.clone();
  auto untouched = [&] {
    EXPECT_TRUE(all_equal(kv, kv_before));
    EXPECT_TRUE(at::equal(topk, topk_before));
    EXPECT_TRUE(at::equal(out, at::full({8, kHidden}, 7.0f)));
  };
  aar_sfa_impl_t* l0 = c.indexer_layer.get();
  aar_sfa_topk_buffer_t* tb = c.topk.get();

  EXPECT_REJECTED(aar_sfa_impl_forward(l0, dh.get(), nullptr, 3, cmd, dout.get(), tb), AAR_ERR_INVALID_ARGUMENT,
                  "aar_sfa_impl_forward: kv_cache is NULL");
  EXPECT_REJECTED(aar_sfa_impl_forward(l0, dh.get(), ckv.data(), 0, cmd, dout.get(), tb), AAR_ERR_INVALID_ARGUMENT,
                  "num_kv_cache must be in [1, 4]");
  untouched();
  // The indexer layer's tuple without its indexer cache.
  EXPECT_REJECTED(aar_sfa_impl_forward(l0, dh.get(), ckv.data(), 2, cmd, dout.get(), tb), AAR_ERR_INVALID_ARGUMENT,
                  "kv_cache must be the layer's composed tuple of 3 tensors");
  untouched();
  // An indexer cache of the wrong head dim.
  const at::Tensor bad_idx = at::zeros({kNb, kBlock, 1, kIdxD + 1});
  Dl dbad(bad_idx);
  const DLManagedTensor* bad_kv[] = {ckv[0], ckv[1], dbad.get()};
  EXPECT_REJECTED(aar_sfa_impl_forward(l0, dh.get(), bad_kv, 3, cmd, dout.get(), tb), AAR_ERR_INVALID_ARGUMENT,
                  "kv_cache[2] (indexer k) must have shape (num_blocks, block_size=16, 1, 32), got [8, 16, 1, 33]");
  untouched();
  // A malformed DLPack tensor in the tuple.
  DLManagedTensor broken = *ckv[2];
  broken.dl_tensor.ndim = -1;
  const DLManagedTensor* broken_kv[] = {ckv[0], ckv[1], &broken};
  EXPECT_REJECTED(aar_sfa_impl_forward(l0, dh.get(), broken_kv, 3, cmd, dout.get(), tb), AAR_ERR_INVALID_ARGUMENT,
                  "kv_cache[2].ndim must be in [0, 16], got -1");
  untouched();
  // The layer without an indexer needs the buffer.
  const DLManagedTensor* main_kv[] = {ckv[0], ckv[1]};
  EXPECT_REJECTED(aar_sfa_impl_forward(c.reuse_layer.get(), dh.get(), main_kv, 2, cmd, dout.get(), nullptr),
                  AAR_ERR_INVALID_ARGUMENT, "topk must be given");
  untouched();
  // A hidden of the wrong width.
  const at::Tensor narrow = at::randn({8, kHidden - 1});
  Dl dnarrow(narrow);
  EXPECT_REJECTED(aar_sfa_impl_forward(l0, dnarrow.get(), ckv.data(), 3, cmd, dout.get(), tb), AAR_ERR_INVALID_ARGUMENT,
                  "hidden_states must have shape (T, hidden_size=64), got [8, 63]");
  untouched();
  // The same call succeeds, and writes.
  ASSERT_EQ(aar_sfa_impl_forward(l0, dh.get(), ckv.data(), 3, cmd, dout.get(), tb), AAR_OK) << last();
  EXPECT_FALSE(all_equal(kv, kv_before));
  EXPECT_FALSE(at::equal(topk, topk_before));

  // Create: config fields and weights by name.
  aar_sfa_impl_t* l = nullptr;
  aar_sfa_impl_config_t cfg = c_config(true);
  EXPECT_REJECTED(aar_sfa_impl_create(&cfg, &c.w0.w, nullptr, &l), AAR_ERR_INVALID_ARGUMENT,
                  "aar_sfa_impl_create: indexer_weights must be given exactly when config->has_indexer is 1");
  cfg.sfa_c8 = 2;
  EXPECT_REJECTED(aar_sfa_impl_create(&cfg, &c.w0.w, &c.iw.w, &l), AAR_ERR_INVALID_ARGUMENT,
                  "config->sfa_c8 must be 0 or 1, got 2");
  cfg = c_config(true);
  cfg.struct_size = 8;
  EXPECT_REJECTED(aar_sfa_impl_create(&cfg, &c.w0.w, &c.iw.w, &l), AAR_ERR_INVALID_ARGUMENT,
                  "config->struct_size is 8");
  cfg = c_config(true);
  aar_sfa_indexer_weights_t iw = c.iw.w;
  iw.wk = nullptr;
  EXPECT_REJECTED(aar_sfa_impl_create(&cfg, &c.w0.w, &iw, &l), AAR_ERR_INVALID_ARGUMENT,
                  "indexer_weights->wk is NULL");
  EXPECT_EQ(l, nullptr);
  EXPECT_REJECTED(aar_sfa_topk_buffer_create(0, kIdxK, DLDevice{kDLCPU, 0}, nullptr),
                  AAR_ERR_INVALID_ARGUMENT, "out is NULL");
  aar_sfa_topk_buffer_t* t = nullptr;
  EXPECT_REJECTED(aar_sfa_topk_buffer_create(0, kIdxK, DLDevice{kDLCPU, 0}, &t), AAR_ERR_INVALID_ARGUMENT,
                  "max_num_tokens must be positive, got 0");
  EXPECT_REJECTED(aar_sfa_topk_buffer_create(4, kIdxK, DLDevice{kDLCUDA, 0}, &t), AAR_ERR_INVALID_ARGUMENT,
                  "device.device_type 2");
  EXPECT_EQ(t, nullptr);

  // Build: a rejected build keeps the previous metadata.
  aar_sfa_metadata_info_t info;
  info.struct_size = sizeof(info);
  ASSERT_EQ(aar_sfa_metadata_get_info(cmd, &info), AAR_OK) << last();
  aar_sfa_build_inputs_t bad = cin;
  bad.seq_lens = nullptr;
  const aar_sfa_metadata_t* out_md = cmd;
  EXPECT_REJECTED(aar_sfa_builder_build(c.builder.get(), &bad, &out_md), AAR_ERR_INVALID_ARGUMENT,
                  "inputs->seq_lens is NULL with length 2");
  EXPECT_EQ(out_md, cmd);
  aar_sfa_metadata_info_t after;
  after.struct_size = sizeof(after);
  ASSERT_EQ(aar_sfa_metadata_get_info(cmd, &after), AAR_OK) << last();
  EXPECT_EQ(after.generation, info.generation);
  aar_sfa_builder_config_t bc;
  aar_sfa_builder_config_init(&bc);
  bc.num_blocks = kNb;
  aar_sfa_builder_t* b = nullptr;
  EXPECT_REJECTED(aar_sfa_builder_create(&bc, &b), AAR_ERR_INVALID_ARGUMENT, "config->cos_table is NULL");
  bc.num_drafts = -2;
  EXPECT_REJECTED(aar_sfa_builder_create(&bc, &b), AAR_ERR_INVALID_ARGUMENT, "config->num_drafts must be -1");
  EXPECT_EQ(b, nullptr);
}

TEST(CApiSfa, HandlesOfAnotherTypeAreRejectedByName) {
  const Model m;
  CModel c(m);
  ASSERT_TRUE(c.builder && c.topk && c.indexer_layer && c.reuse_layer);
  aar_gqa_builder_config_t gbc;
  aar_gqa_builder_config_init(&gbc);
  gbc.num_blocks = kNb;
  gbc.block_size = kBlock;
  aar_gqa_builder_t* gb = nullptr;
  ASSERT_EQ(aar_gqa_builder_create(&gbc, &gb), AAR_OK) << last();
  Owned<aar_gqa_builder_t> gb_owner(gb, aar_gqa_builder_destroy);
  const std::vector<int32_t> qsl{0, 1}, seq{1}, table{0};
  aar_gqa_build_inputs_t gin;
  aar_gqa_build_inputs_init(&gin);
  gin.query_start_loc = qsl.data();
  gin.query_start_loc_len = qsl.size();
  gin.seq_lens = seq.data();
  gin.seq_lens_len = seq.size();
  gin.block_table = table.data();
  gin.block_table_len = table.size();
  gin.block_table_stride = 1;
  const aar_gqa_metadata_t* gmd = nullptr;
  ASSERT_EQ(aar_gqa_builder_build(gb, &gin, &gmd), AAR_OK) << last();

  const Step step{{0, 1, 2}, {5, 3}};
  const aar_sfa_build_inputs_t cin = c_inputs(step);
  const aar_sfa_metadata_t* cmd = nullptr;
  ASSERT_EQ(aar_sfa_builder_build(c.builder.get(), &cin, &cmd), AAR_OK) << last();
  std::vector<at::Tensor> kv = caches(true);
  std::vector<std::unique_ptr<Dl>> owners;
  std::vector<const DLManagedTensor*> ckv;
  for (const auto& t : kv) ckv.push_back(owners.emplace_back(std::make_unique<Dl>(t))->get());
  const at::Tensor hidden = at::randn({2, kHidden});
  at::Tensor out = at::zeros({2, kHidden});
  Dl dh(hidden), dout(out);

  auto* as_md = reinterpret_cast<const aar_sfa_metadata_t*>(gmd);
  EXPECT_REJECTED(aar_sfa_impl_forward(c.indexer_layer.get(), dh.get(), ckv.data(), 3, as_md, dout.get(), c.topk.get()),
                  AAR_ERR_INVALID_ARGUMENT, "metadata is an aar_gqa_metadata_t, expected an aar_sfa_metadata_t");
  auto* as_topk = reinterpret_cast<aar_sfa_topk_buffer_t*>(c.reuse_layer.get());
  EXPECT_REJECTED(aar_sfa_impl_forward(c.indexer_layer.get(), dh.get(), ckv.data(), 3, cmd, dout.get(), as_topk),
                  AAR_ERR_INVALID_ARGUMENT, "topk is an aar_sfa_impl_t, expected an aar_sfa_topk_buffer_t");
  auto* as_impl = reinterpret_cast<aar_sfa_impl_t*>(c.builder.get());
  EXPECT_REJECTED(aar_sfa_impl_forward(as_impl, dh.get(), ckv.data(), 3, cmd, dout.get(), c.topk.get()),
                  AAR_ERR_INVALID_ARGUMENT, "impl is an aar_sfa_builder_t, expected an aar_sfa_impl_t");
  auto* as_builder = reinterpret_cast<aar_sfa_builder_t*>(gb);
  EXPECT_REJECTED(aar_sfa_builder_build(as_builder, &cin, &cmd), AAR_ERR_INVALID_ARGUMENT,
                  "builder is an aar_gqa_builder_t, expected an aar_sfa_builder_t");
  EXPECT_REJECTED(aar_gqa_metadata_get_info(reinterpret_cast<const aar_gqa_metadata_t*>(cmd), nullptr),
                  AAR_ERR_INVALID_ARGUMENT, "metadata is an aar_sfa_metadata_t, expected an aar_gqa_metadata_t");
  EXPECT_TRUE(at::equal(out, at::zeros({2, kHidden})));
  // The wrong destroy frees nothing; a destroyed buffer and a destroyed builder's metadata are named.
  aar_sfa_impl_destroy(reinterpret_cast<aar_sfa_impl_t*>(c.topk.get()));
  EXPECT_NE(last().find("impl is an aar_sfa_topk_buffer_t"), std::string::npos) << last();
  aar_sfa_topk_buffer_t* t = c.topk.release();
  aar_sfa_topk_buffer_destroy(t);
  EXPECT_REJECTED(aar_sfa_impl_forward(c.indexer_layer.get(), dh.get(), ckv.data(), 3, cmd, dout.get(), t),
                  AAR_ERR_INVALID_ARGUMENT, "topk is an aar_sfa_topk_buffer_t that has been destroyed");
  aar_sfa_builder_destroy(c.builder.release());
  aar_sfa_metadata_info_t info;
  info.struct_size = sizeof(info);
  EXPECT_REJECTED(aar_sfa_metadata_get_info(cmd, &info), AAR_ERR_INVALID_ARGUMENT,
                  "metadata is an aar_sfa_metadata_t that has been destroyed");
}

// Graph mode: a padded decode bucket captured through the C ABI and replayed per step (the SFA
// layer reads its lengths from the builder's stable buffers: no update) computes what the C++
// layer computes eagerly on the same steps, bitwise.
TEST(CApiSfa, CapturedDecodeBucketReplaysLikeTheCppLayer) {
  const Model m;
  constexpr int64_t kBucket = 4;
  aar::sfa::BuilderConfig cbc = cpp_builder_config(m);
  cbc.graph_decode_padding = true;
  aar::sfa::MetadataBuilder cpp_builder(cbc);
  aar::sfa::Impl cpp0(cpp_config(true), m.layers[0].cpp(), m.iw);
  aar::sfa::TopkBuffer cpp_topk(kMaxTokens, kIdxK);
  CModel c(m);
  ASSERT_TRUE(c.indexer_layer && c.topk);
  Dl dcos(m.cos), dsin(m.sin);
  aar_sfa_builder_config_t bc;
  aar_sfa_builder_config_init(&bc);
  bc.max_num_reqs = 4;
  bc.max_num_tokens = kMaxTokens;
  bc.max_blocks_per_req = kMbr;
  bc.block_size = kBlock;
  bc.num_blocks = kNb;
  bc.graph_decode_padding = 1;
  bc.cos_table = dcos.get();
  bc.sin_table = dsin.get();
  aar_sfa_builder_t* b = nullptr;
  ASSERT_EQ(aar_sfa_builder_create(&bc, &b), AAR_OK) << last();
  Owned<aar_sfa_builder_t> builder(b, aar_sfa_builder_destroy);
  aar_graph_params_t* g = nullptr;
  ASSERT_EQ(aar_graph_params_create("recording", nullptr, 0, &g), AAR_OK) << last();
  Owned<aar_graph_params_t> graph(g, aar_graph_params_destroy);

  const std::vector<int32_t> table = {0, 1, 0, 0, 2, 3, 0, 0, 4, 5, 0, 0, 6, 7, 0, 0};
  auto inputs = [&](const std::vector<int32_t>& qsl, const std::vector<int32_t>& seq) {
    aar_sfa_build_inputs_t in;
    aar_sfa_build_inputs_init(&in);
    in.query_start_loc = qsl.data();
    in.query_start_loc_len = qsl.size();
    in.seq_lens = seq.data();
    in.seq_lens_len = seq.size();
    in.block_table = table.data();
    in.block_table_len = seq.size() * kMbr;
    in.block_table_stride = kMbr;
    in.num_input_tokens = kBucket;
    return in;
  };
  const std::vector<at::Tensor> kv_a = caches(true), kv_b = caches(true);
  std::vector<std::unique_ptr<Dl>> owners;
  std::vector<const DLManagedTensor*> ckv;
  for (const auto& t : kv_b) ckv.push_back(owners.emplace_back(std::make_unique<Dl>(t))->get());
  const at::Tensor hidden = at::zeros({kBucket, kHidden});
  const at::Tensor out = at::zeros({kBucket, kHidden});
  Dl dh(hidden), dout(out);

  const std::vector<int32_t> qsl4 = {0, 1, 2, 3, 4}, seq4 = {9, 14, 20, 11};
  const aar_sfa_build_inputs_t cap_in = inputs(qsl4, seq4);
  const aar_sfa_metadata_t* md = nullptr;
  ASSERT_EQ(aar_sfa_builder_build_for_graph_capture(builder.get(), &cap_in, AAR_STATE_DECODE_ONLY, &md), AAR_OK)
      << last();
  ASSERT_EQ(aar_graph_begin_capture(graph.get(), kBucket), AAR_OK) << last();
  ASSERT_EQ(aar_sfa_impl_forward(c.indexer_layer.get(), dh.get(), ckv.data(), ckv.size(), md, dout.get(), c.topk.get()),
            AAR_OK)
      << last();
  ASSERT_EQ(aar_graph_end_capture(graph.get()), AAR_OK) << last();
  EXPECT_TRUE(all_equal(kv_a, kv_b)) << "the capture ran the layer";

  std::vector<int32_t> seq = seq4;
  for (int32_t B : {4, 2, 3}) {
    for (auto& s : seq) ++s;
    const std::vector<int32_t> qsl(qsl4.begin(), qsl4.begin() + B + 1), sb(seq.begin(), seq.begin() + B);
    const aar_sfa_build_inputs_t in = inputs(qsl, sb);
    ASSERT_EQ(aar_sfa_builder_build(builder.get(), &in, &md), AAR_OK) << last();
    aar::sfa::BuildInputs cin;
    cin.query_start_loc = {qsl.data(), qsl.size()};
    cin.seq_lens = {sb.data(), sb.size()};
    cin.block_table = {table.data(), sb.size() * kMbr};
    cin.block_table_stride = kMbr;
    cin.num_input_tokens = kBucket;
    const aar::sfa::Metadata& cmd = cpp_builder.build(cin);
    hidden.normal_();
    hidden.narrow(0, B, kBucket - B).zero_();
    at::Tensor out_a = at::zeros({kBucket, kHidden});
    cpp0.forward(hidden, kv_a, &cmd, out_a, &cpp_topk);
    ASSERT_EQ(aar_graph_replay(graph.get(), kBucket), AAR_OK) << last();
    EXPECT_TRUE(at::equal(out_a, out)) << "B=" << B << ": max diff "
                                                      << (out_a - out).abs().max().item<float>();
    EXPECT_GT(out.narrow(0, 0, B).abs().sum().item<double>(), 0.0);
    EXPECT_TRUE(all_equal(kv_a, kv_b)) << "B=" << B;
  }
}

}  // namespace
