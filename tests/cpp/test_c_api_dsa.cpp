// The C ABI of DSA (include/ascend_attn_rt/c_api.h): a step builder, the five
// group builders of a C4 layer and the layer compute exactly what the C++ API
// computes on the same inputs (a prefill, a decode, a mixed step); bad arguments
// and handles of another type are rejected by name with the caches and the
// output untouched; a group outliving its step builder is named.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <vector>

#include "ascend_attn_rt/c_api.h"
#include "ascend_attn_rt/dsa/builder.h"
#include "ascend_attn_rt/dsa/impl.h"
#include "c_api_test_util.h"

namespace {

using aar::dsa::DsaCacheKind;
using aar_c_api_test::Dl;
using aar_c_api_test::last;

constexpr int64_t kHidden = 64, kN = 2, kD = 32, kR = 16, kQ = 32, kNi = 2, kDi = 16, kK = 8, kG = 2, kOl = 8;
constexpr int32_t kW = 8, kCbs = 32, kMbr = 24, kNumBlocks = 3 * kMbr + 1, kMaxTokens = 32;
constexpr DsaCacheKind kKinds[] = {DsaCacheKind::Swa, DsaCacheKind::C4Kv, DsaCacheKind::C4AttnState,
                                   DsaCacheKind::C4IndexerK, DsaCacheKind::C4IndexerState};

template <typename H>
using Owned = std::unique_ptr<H, void (*)(H*)>;

struct Model {
  Model() {
    at::manual_seed(21);
    auto lin = [](int64_t out, int64_t in) { return at::randn({out, in}) / std::sqrt(double(in)); };
    auto norm = [](int64_t n) { return 1.0 + 0.1 * at::randn({n}); };
    w.wq_a = lin(kQ, kHidden);
    w.q_norm = norm(kQ);
    w.wq_b = lin(kN * kD, kQ);
    w.wkv = lin(kD, kHidden);
    w.kv_norm = norm(kD);
    w.attn_sink = at::randn({kN});
    w.wo_a = at::randn({kG, kN * kD / kG, kOl}) / std::sqrt(double(kN * kD / kG));
    w.wo_b = lin(kHidden, kG * kOl);
    w.cmp_wkv = lin(2 * kD, kHidden);
    w.cmp_wgate = lin(2 * kD, kHidden);
    w.cmp_ape = 0.5 * at::randn({4, 2 * kD});
    w.cmp_norm = norm(kD);
    w.idx_wq_b = lin(kNi * kDi, kQ);
    w.idx_weights_proj = lin(kNi, kHidden);
    w.idx_cmp_wkv = lin(2 * kDi, kHidden);
    w.idx_cmp_wgate = lin(2 * kDi, kHidden);
    w.idx_cmp_ape = 0.5 * at::randn({4, 2 * kDi});
    w.idx_cmp_norm = norm(kDi);
    const at::Tensor inv = at::pow(10000.0, -at::arange(0, kR, 2, at::kDouble) / kR);
    const at::Tensor ang = (at::arange(512, at::kDouble).unsqueeze(1) * inv).repeat_interleave(2, -1);
    cos = ang.cos().to(at::kFloat);
    sin = ang.sin().to(at::kFloat);
  }
  aar::dsa::Weights w;
  at::Tensor cos, sin;
};

aar::dsa::StepBuilderConfig cpp_step_config(const Model& m) {
  aar::dsa::StepBuilderConfig c;
  c.max_num_reqs = 4;
  c.max_num_tokens = kMaxTokens;
  c.num_drafts = 1;
  c.cos_table = c.compress_cos_table = m.cos;
  c.sin_table = c.compress_sin_table = m.sin;
  c.model.head_dim = kD;
  c.model.window = kW;
  c.model.num_heads_q = kN;
  c.model.index_topk = kK;
  c.model.index_n_heads = kNi;
  c.model.index_head_dim = kDi;
  return c;
}

aar::dsa::ImplConfig cpp_impl_config(const aar::dsa::AttnKvPlan& plan) {
  aar::dsa::ImplConfig ic;
  ic.hidden_size = kHidden;
  ic.num_heads = kN;
  ic.head_dim = kD;
  ic.rope_dim = kR;
  ic.q_lora_rank = kQ;
  ic.compress_ratio = 4;
  ic.index_n_heads = kNi;
  ic.index_head_dim = kDi;
  ic.index_topk = kK;
  ic.o_groups = kG;
  ic.o_lora_rank = kOl;
  ic.plan = plan;
  return ic;
}

// The C side: DLPack views of the model and its builders and layer.
struct CModel {
  explicit CModel(const Model& m) {
    for (const at::Tensor* t : {&m.cos, &m.sin}) owners.push_back(std::make_unique<Dl>(*t));
    aar_dsa_step_builder_config_t sc;
    aar_dsa_step_builder_config_init(&sc);
    sc.max_num_reqs = 4;
    sc.max_num_tokens = kMaxTokens;
    sc.num_drafts = 1;
    sc.cos_table = sc.compress_cos_table = owners[0]->get();
    sc.sin_table = sc.compress_sin_table = owners[1]->get();
    sc.head_dim = kD;
    sc.window = kW;
    sc.num_heads_q = kN;
    sc.index_topk = kK;
    sc.index_n_heads = kNi;
    sc.index_head_dim = kDi;
    aar_dsa_step_builder_t* s = nullptr;
    EXPECT_EQ(aar_dsa_step_builder_create(&sc, &s), AAR_OK) << last();
    step.reset(s);
    for (DsaCacheKind k : kKinds) {
      aar_dsa_group_config_t gc;
      aar_dsa_group_config_init(&gc);
      gc.kind = static_cast<aar_dsa_cache_kind_t>(k);
      gc.cache_block_size = kCbs;
      gc.max_blocks_per_req = kMbr;
      gc.num_blocks = kNumBlocks;
      aar_dsa_group_builder_t* g = nullptr;
      EXPECT_EQ(aar_dsa_group_builder_create(s, &gc, &g), AAR_OK) << last();
      groups.emplace_back(g, aar_dsa_group_builder_destroy);
    }
    aar_dsa_weights_init(&cw);
    const std::pair<const DLManagedTensor**, const at::Tensor*> ws[] = {
        {&cw.wq_a, &m.w.wq_a},           {&cw.q_norm, &m.w.q_norm},
        {&cw.wq_b, &m.w.wq_b},           {&cw.wkv, &m.w.wkv},
        {&cw.kv_norm, &m.w.kv_norm},     {&cw.attn_sink, &m.w.attn_sink},
        {&cw.wo_a, &m.w.wo_a},           {&cw.wo_b, &m.w.wo_b},
        {&cw.cmp_wkv, &m.w.cmp_wkv},     {&cw.cmp_wgate, &m.w.cmp_wgate},
        {&cw.cmp_ape, &m.w.cmp_ape},     {&cw.cmp_norm, &m.w.cmp_norm},
        {&cw.idx_wq_b, &m.w.idx_wq_b},   {&cw.idx_weights_proj, &m.w.idx_weights_proj},
        {&cw.idx_cmp_wkv, &m.w.idx_cmp_wkv}, {&cw.idx_cmp_wgate, &m.w.idx_cmp_wgate},
        {&cw.idx_cmp_ape, &m.w.idx_cmp_ape}, {&cw.idx_cmp_norm, &m.w.idx_cmp_norm}};
    for (const auto& [field, t] : ws) *field = owners.emplace_back(std::make_unique<Dl>(*t))->get();
    aar_dsa_impl_config_init(&ic);
    ic.hidden_size = kHidden;
    ic.num_heads = kN;
    ic.head_dim = kD;
    ic.rope_dim = kR;
    ic.q_lora_rank = kQ;
    ic.compress_ratio = 4;
    ic.index_n_heads = kNi;
    ic.index_head_dim = kDi;
    ic.index_topk = kK;
    ic.o_groups = kG;
    ic.o_lora_rank = kOl;
    aar_dsa_impl_t* l = nullptr;
    EXPECT_EQ(aar_dsa_impl_create(&ic, &cw, &l), AAR_OK) << last();
    layer.reset(l);
  }
  ~CModel() {
    layer.reset();
    groups.clear();  // before their step builder
    step.reset();
  }
  std::vector<std::unique_ptr<Dl>> owners;
  Owned<aar_dsa_step_builder_t> step{nullptr, aar_dsa_step_builder_destroy};
  std::vector<Owned<aar_dsa_group_builder_t>> groups;
  aar_dsa_weights_t cw;
  aar_dsa_impl_config_t ic;
  Owned<aar_dsa_impl_t> layer{nullptr, aar_dsa_impl_destroy};
};

// A layer's composed tuple over caches sized by the groups' specs.
std::vector<at::Tensor> make_caches(const aar::dsa::AttnKvPlan& plan, const aar::dsa::StepBuilder& sb) {
  std::vector<at::Tensor> c;
  at::Tensor iscale;
  for (DsaCacheKind k : kKinds) {
    aar::dsa::GroupConfig gc;
    gc.kind = k;
    gc.cache_block_size = kCbs;
    gc.plan = plan;
    gc.max_blocks_per_req = kMbr;
    gc.num_blocks = kNumBlocks;
    aar::dsa::GroupBuilder g(sb, gc);
    const aar::dsa::DsaCacheSpec& sp = g.cache_spec();
    c.push_back(at::randn(aar::dsa::dsa_kv_cache_shape(sp, kNumBlocks)).to(k == DsaCacheKind::C4IndexerK ? at::kChar
                                                                                                          : at::kFloat));
    if (k == DsaCacheKind::C4IndexerK) iscale = at::rand(aar::dsa::dsa_scale_cache_shape(sp, kNumBlocks)).to(at::kHalf);
  }
  return aar::dsa::compose_kv_cache(plan, c[1], c[0], c[2], c[4], c[3], iscale);
}

std::vector<at::Tensor> clones(const std::vector<at::Tensor>& v) {
  std::vector<at::Tensor> out;
  for (const auto& t : v) out.push_back(t.defined() ? t.clone() : t);
  return out;
}

bool all_equal(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].defined() != b[i].defined() || (a[i].defined() && !at::equal(a[i], b[i]))) return false;
  }
  return a.size() == b.size();
}

struct CTuple {
  explicit CTuple(const std::vector<at::Tensor>& kv) {
    for (const auto& t : kv) {
      if (!t.defined()) {
        ptrs.push_back(nullptr);
        continue;
      }
      ptrs.push_back(owners.emplace_back(std::make_unique<Dl>(t))->get());
    }
  }
  std::vector<std::unique_ptr<Dl>> owners;
  std::vector<const DLManagedTensor*> ptrs;
};

struct Step {
  std::vector<int32_t> qsl, seq;
};

std::vector<int32_t> table_for(size_t reqs) {
  std::vector<int32_t> t;
  for (size_t b = 0; b < reqs; ++b) {
    for (int32_t c = 0; c < kMbr; ++c) t.push_back(1 + static_cast<int32_t>(b) * kMbr + c);
  }
  return t;
}

aar_dsa_step_inputs_t c_inputs(const Step& s) {
  aar_dsa_step_inputs_t in;
  aar_dsa_step_inputs_init(&in);
  in.query_start_loc = s.qsl.data();
  in.query_start_loc_len = s.qsl.size();
  in.seq_lens = s.seq.data();
  in.seq_lens_len = s.seq.size();
  return in;
}

TEST(CApiDsa, MatchesTheCppLayerExactly) {
  const Model m;
  const aar::dsa::AttnKvPlan plan = aar::dsa::make_attn_kv_plan(aar::dsa::DsaConfig{});
  aar::dsa::StepBuilder cpp_step(cpp_step_config(m));
  std::vector<std::unique_ptr<aar::dsa::GroupBuilder>> cpp_groups;
  for (DsaCacheKind k : kKinds) {
    aar::dsa::GroupConfig gc;
    gc.kind = k;
    gc.cache_block_size = kCbs;
    gc.plan = plan;
    gc.max_blocks_per_req = kMbr;
    gc.num_blocks = kNumBlocks;
    cpp_groups.push_back(std::make_unique<aar::dsa::GroupBuilder>(cpp_step, gc));
  }
  aar::dsa::Impl cpp_layer(cpp_impl_config(plan), m.w);
  CModel c(m);
  ASSERT_TRUE(c.step && c.layer && c.groups.size() == 5);

  // The groups' cache facts through the C ABI are the C++ specs'.
  for (size_t i = 0; i < 5; ++i) {
    aar_dsa_group_cache_info_t info;
    info.struct_size = sizeof(info);
    ASSERT_EQ(aar_dsa_group_builder_cache_info(c.groups[i].get(), kNumBlocks, &info), AAR_OK) << last();
    const aar::dsa::DsaCacheSpec& sp = cpp_groups[i]->cache_spec();
    const auto shape = aar::dsa::dsa_kv_cache_shape(sp, kNumBlocks);
    EXPECT_EQ(info.kind, static_cast<aar_dsa_cache_kind_t>(kKinds[i]));
    EXPECT_EQ(info.block_size, sp.block_size);
    EXPECT_EQ(info.storage_block_size, sp.storage_block_size);
    ASSERT_EQ(info.kv_ndim, static_cast<int32_t>(shape.size()));
    for (size_t d = 0; d < shape.size(); ++d) EXPECT_EQ(info.kv_shape[d], shape[d]);
    EXPECT_EQ(info.scale_ndim, kKinds[i] == DsaCacheKind::C4IndexerK ? 3 : 0);
  }

  at::manual_seed(5);
  const std::vector<at::Tensor> kv_a = make_caches(plan, cpp_step);
  const std::vector<at::Tensor> kv_b = clones(kv_a);
  const CTuple ckv(kv_b);
  // A prefill of 6 + 10 tokens, a decode, a mixed step.
  const std::vector<Step> steps = {{{0, 6, 16}, {6, 10}}, {{0, 1, 2}, {7, 11}}, {{0, 1, 5}, {8, 15}}};
  for (size_t s = 0; s < steps.size(); ++s) {
    const std::vector<int32_t> table = table_for(steps[s].seq.size());
    aar::dsa::StepInputs in;
    in.query_start_loc = {steps[s].qsl.data(), steps[s].qsl.size()};
    in.seq_lens = {steps[s].seq.data(), steps[s].seq.size()};
    const aar::dsa::StepMetadata& sm = cpp_step.build(in);
    aar::dsa::GroupInputs gi;
    gi.block_table = {table.data(), table.size()};
    gi.block_table_stride = kMbr;
    std::vector<const aar::dsa::GroupMetadata*> gms;
    for (auto& g : cpp_groups) gms.push_back(&g->build(sm, gi));
    const aar::dsa::LayerMetadata lm = aar::dsa::route_layer(4, sm, {gms.data(), gms.size()});

    const aar_dsa_step_inputs_t cin = c_inputs(steps[s]);
    const aar_dsa_step_metadata_t* csm = nullptr;
    ASSERT_EQ(aar_dsa_step_builder_build(c.step.get(), &cin, &csm), AAR_OK) << last();
    aar_dsa_step_metadata_info_t info;
    info.struct_size = sizeof(info);
    ASSERT_EQ(aar_dsa_step_metadata_get_info(csm, &info), AAR_OK) << last();
    EXPECT_EQ(info.num_decodes, sm.num_decodes);
    EXPECT_EQ(info.num_prefills, sm.num_prefills);
    EXPECT_EQ(info.generation, s + 1);
    // The groups in another order than the C++ side's: the layer picks them by kind.
    std::vector<const aar_dsa_group_metadata_t*> cgm(5);
    for (size_t i = 0; i < 5; ++i) {
      ASSERT_EQ(aar_dsa_group_builder_build(c.groups[i].get(), csm, table.data(), table.size(), kMbr, &cgm[4 - i]),
                AAR_OK)
          << last();
    }

    const int64_t T = steps[s].qsl.back();
    const at::Tensor hidden = at::randn({T, kHidden});
    at::Tensor out_a = at::empty({T, kHidden}), out_b = at::full({T, kHidden}, 7.0f);
    cpp_layer.forward(hidden, kv_a, &lm, out_a);
    Dl dh(hidden), dout(out_b);
    ASSERT_EQ(aar_dsa_impl_forward(c.layer.get(), dh.get(), ckv.ptrs.data(), ckv.ptrs.size(), csm, cgm.data(),
                                   cgm.size(), dout.get(), nullptr),
              AAR_OK)
        << last();
    EXPECT_TRUE(at::equal(out_a, out_b)) << "step " << s << ": max diff " << (out_a - out_b).abs().max().item<float>();
    EXPECT_TRUE(all_equal(kv_a, kv_b)) << "step " << s;
    EXPECT_GT(out_a.abs().sum().item<double>(), 0.0) << "step " << s;
  }

  // A draft step: the SWA group drafts in its own lane, a compressed group refuses by name.
  const Step draft{{0, 1, 2}, {9, 16}};
  const std::vector<int32_t> table = table_for(2);
  const aar_dsa_step_inputs_t din = c_inputs(draft);
  const aar_dsa_step_metadata_t* dsm = nullptr;
  ASSERT_EQ(aar_dsa_step_builder_build_for_drafting(c.step.get(), &din, 0, &dsm), AAR_OK) << last();
  aar_dsa_step_metadata_info_t dinfo;
  dinfo.struct_size = sizeof(dinfo);
  ASSERT_EQ(aar_dsa_step_metadata_get_info(dsm, &dinfo), AAR_OK) << last();
  EXPECT_EQ(dinfo.draft_index, 0);
  const aar_dsa_group_metadata_t* dgm = nullptr;
  ASSERT_EQ(aar_dsa_group_builder_build_for_drafting(c.groups[0].get(), dsm, table.data(), table.size(), kMbr, 0, &dgm),
            AAR_OK)
      << last();
  EXPECT_REJECTED(aar_dsa_group_builder_build_for_drafting(c.groups[1].get(), dsm, table.data(), table.size(), kMbr, 0,
                                                           &dgm),
                  AAR_ERR_NOT_SUPPORTED, "C4");
  EXPECT_REJECTED(aar_dsa_step_builder_build_for_drafting(c.step.get(), &din, 1, &dsm), AAR_ERR_INVALID_ARGUMENT,
                  "draft_index=1 is out of range [0, num_drafts=1)");
  // A draft step given to a main group build is refused.
  EXPECT_EQ(aar_dsa_group_builder_build(c.groups[0].get(), dsm, table.data(), table.size(), kMbr, &dgm),
            AAR_ERR_INVALID_ARGUMENT);
}

TEST(CApiDsa, BadArgumentsAreNamedAndWriteNothing) {
  const Model m;
  const aar::dsa::AttnKvPlan plan = aar::dsa::make_attn_kv_plan(aar::dsa::DsaConfig{});
  CModel c(m);
  ASSERT_TRUE(c.step && c.layer && c.groups.size() == 5);
  aar::dsa::StepBuilder sizes(cpp_step_config(m));
  const std::vector<at::Tensor> kv = make_caches(plan, sizes), kv_before = clones(kv);
  const CTuple ckv(kv);
  const Step step{{0, 6, 16}, {6, 10}};
  const std::vector<int32_t> table = table_for(2);
  const aar_dsa_step_inputs_t cin = c_inputs(step);
  const aar_dsa_step_metadata_t* csm = nullptr;
  ASSERT_EQ(aar_dsa_step_builder_build(c.step.get(), &cin, &csm), AAR_OK) << last();
  std::vector<const aar_dsa_group_metadata_t*> cgm(5);
  for (size_t i = 0; i < 5; ++i) {
    ASSERT_EQ(aar_dsa_group_builder_build(c.groups[i].get(), csm, table.data(), table.size(), kMbr, &cgm[i]), AAR_OK)
        << last();
  }
  const at::Tensor hidden = at::randn({16, kHidden});
  at::Tensor out = at::full({16, kHidden}, 7.0f);
  Dl dh(hidden), dout(out);
  auto untouched = [&] {
    EXPECT_TRUE(all_equal(kv, kv_before));
    EXPECT_TRUE(at::equal(out, at::full({16, kHidden}, 7.0f)));
  };
  aar_dsa_impl_t* l = c.layer.get();
  const auto* p = ckv.ptrs.data();

  EXPECT_REJECTED(aar_dsa_impl_forward(l, dh.get(), p, 5, csm, cgm.data(), 5, dout.get(), nullptr),
                  AAR_ERR_INVALID_ARGUMENT, "aar_dsa_impl_forward: num_kv_cache must be 6 or 7");
  // The C4 layer without its indexer state group.
  EXPECT_REJECTED(aar_dsa_impl_forward(l, dh.get(), p, 6, csm, cgm.data(), 4, dout.get(), nullptr),
                  AAR_ERR_INVALID_ARGUMENT, "groups: no group of cache kind C4 indexer state");
  untouched();
  std::vector<const aar_dsa_group_metadata_t*> with_null = cgm;
  with_null[2] = nullptr;
  EXPECT_REJECTED(aar_dsa_impl_forward(l, dh.get(), p, 6, csm, with_null.data(), 5, dout.get(), nullptr),
                  AAR_ERR_INVALID_ARGUMENT, "groups[2] is NULL");
  // A cache of the wrong shape: the swa cache with one block less.
  const at::Tensor small_swa = kv[1].narrow(0, 0, kv[1].size(0) - 1).contiguous();
  Dl dsmall(small_swa);
  std::vector<const DLManagedTensor*> bad(ckv.ptrs);
  bad[1] = dsmall.get();
  EXPECT_EQ(aar_dsa_impl_forward(l, dh.get(), bad.data(), 6, csm, cgm.data(), 5, dout.get(), nullptr),
            AAR_ERR_INVALID_ARGUMENT);
  EXPECT_NE(last().find("swa"), std::string::npos) << last();
  untouched();
  const at::Tensor narrow = at::randn({16, kHidden - 1});
  Dl dnarrow(narrow);
  EXPECT_EQ(aar_dsa_impl_forward(l, dnarrow.get(), p, 6, csm, cgm.data(), 5, dout.get(), nullptr),
            AAR_ERR_INVALID_ARGUMENT);
  EXPECT_NE(last().find("hidden"), std::string::npos) << last();
  untouched();
  ASSERT_EQ(aar_dsa_impl_forward(l, dh.get(), p, 6, csm, cgm.data(), 5, dout.get(), nullptr), AAR_OK) << last();
  EXPECT_FALSE(all_equal(kv, kv_before));

  // Create and build arguments by name.
  aar_dsa_impl_t* l2 = nullptr;
  aar_dsa_impl_config_t ic = c.ic;
  ic.plan.device_kind = 7;
  EXPECT_REJECTED(aar_dsa_impl_create(&ic, &c.cw, &l2), AAR_ERR_INVALID_ARGUMENT,
                  "config->plan.device_kind must be 0 (A2), 1 (A3), 2 (A5) or 3 (310P), got 7");
  ic = c.ic;
  ic.plan.cache_dtype = "int4";
  EXPECT_REJECTED(aar_dsa_impl_create(&ic, &c.cw, &l2), AAR_ERR_INVALID_ARGUMENT, "cache_dtype 'int4'");
  aar_dsa_weights_t w = c.cw;
  w.wkv = nullptr;
  EXPECT_REJECTED(aar_dsa_impl_create(&c.ic, &w, &l2), AAR_ERR_INVALID_ARGUMENT, "weights->wkv is NULL");
  EXPECT_EQ(l2, nullptr);
  aar_dsa_group_config_t gc;
  aar_dsa_group_config_init(&gc);
  gc.num_blocks = kNumBlocks;
  gc.kind = static_cast<aar_dsa_cache_kind_t>(9);
  aar_dsa_group_builder_t* g = nullptr;
  EXPECT_REJECTED(aar_dsa_group_builder_create(c.step.get(), &gc, &g), AAR_ERR_INVALID_ARGUMENT,
                  "config->kind must be an aar_dsa_cache_kind_t in [0, 6], got 9");
  EXPECT_EQ(g, nullptr);
  const aar_dsa_group_metadata_t* gm = cgm[0];
  std::vector<int32_t> bad_table = table;
  bad_table[0] = kNumBlocks;
  EXPECT_REJECTED(aar_dsa_group_builder_build(c.groups[0].get(), csm, bad_table.data(), bad_table.size(), kMbr, &gm),
                  AAR_ERR_INVALID_ARGUMENT, "block_table");
  EXPECT_EQ(gm, cgm[0]);
  aar_dsa_step_inputs_t bad_in = cin;
  bad_in.num_reqs_actual = 5;
  const aar_dsa_step_metadata_t* sm2 = csm;
  EXPECT_EQ(aar_dsa_step_builder_build(c.step.get(), &bad_in, &sm2), AAR_ERR_INVALID_ARGUMENT) << last();
  EXPECT_EQ(sm2, csm);
  aar_dsa_group_cache_info_t info;
  info.struct_size = sizeof(info);
  EXPECT_REJECTED(aar_dsa_group_builder_cache_info(c.groups[0].get(), -1, &info), AAR_ERR_INVALID_ARGUMENT,
                  "num_blocks must be >= 0, got -1");
}

TEST(CApiDsa, HandlesOfAnotherTypeAreRejectedByName) {
  const Model m;
  CModel c(m);
  ASSERT_TRUE(c.step && c.layer && c.groups.size() == 5);
  const Step step{{0, 1, 2}, {6, 10}};
  const std::vector<int32_t> table = table_for(2);
  const aar_dsa_step_inputs_t cin = c_inputs(step);
  const aar_dsa_step_metadata_t* csm = nullptr;
  ASSERT_EQ(aar_dsa_step_builder_build(c.step.get(), &cin, &csm), AAR_OK) << last();
  std::vector<const aar_dsa_group_metadata_t*> cgm(5);
  for (size_t i = 0; i < 5; ++i) {
    ASSERT_EQ(aar_dsa_group_builder_build(c.groups[i].get(), csm, table.data(), table.size(), kMbr, &cgm[i]), AAR_OK)
        << last();
  }
  const at::Tensor hidden = at::randn({2, kHidden});
  at::Tensor out = at::zeros({2, kHidden});
  Dl dh(hidden), dout(out);
  std::vector<const DLManagedTensor*> none(6, nullptr);

  // A step metadata given as a group, a group as the step, a group builder as the step builder.
  std::vector<const aar_dsa_group_metadata_t*> mixed = cgm;
  mixed[3] = reinterpret_cast<const aar_dsa_group_metadata_t*>(csm);
  EXPECT_REJECTED(aar_dsa_impl_forward(c.layer.get(), dh.get(), none.data(), 6, csm, mixed.data(), 5, dout.get(),
                                       nullptr),
                  AAR_ERR_INVALID_ARGUMENT, "groups[3] is an aar_dsa_step_metadata_t, expected an aar_dsa_group_metadata_t");
  EXPECT_REJECTED(aar_dsa_impl_forward(c.layer.get(), dh.get(), none.data(), 6,
                                       reinterpret_cast<const aar_dsa_step_metadata_t*>(cgm[0]), cgm.data(), 5,
                                       dout.get(), nullptr),
                  AAR_ERR_INVALID_ARGUMENT, "step is an aar_dsa_group_metadata_t, expected an aar_dsa_step_metadata_t");
  aar_dsa_group_config_t gc;
  aar_dsa_group_config_init(&gc);
  gc.num_blocks = kNumBlocks;
  aar_dsa_group_builder_t* g = nullptr;
  EXPECT_REJECTED(aar_dsa_group_builder_create(reinterpret_cast<const aar_dsa_step_builder_t*>(c.groups[0].get()), &gc,
                                               &g),
                  AAR_ERR_INVALID_ARGUMENT, "step_builder is an aar_dsa_group_builder_t, expected an aar_dsa_step_builder_t");
  EXPECT_REJECTED(aar_dsa_impl_forward(reinterpret_cast<aar_dsa_impl_t*>(c.step.get()), dh.get(), none.data(), 6, csm,
                                       cgm.data(), 5, dout.get(), nullptr),
                  AAR_ERR_INVALID_ARGUMENT, "impl is an aar_dsa_step_builder_t, expected an aar_dsa_impl_t");
  EXPECT_REJECTED(aar_dsa_impl_forward(c.layer.get(), dh.get(), none.data(), 6, csm, cgm.data(), 5, dout.get(),
                                       reinterpret_cast<aar_sfa_topk_buffer_t*>(c.layer.get())),
                  AAR_ERR_INVALID_ARGUMENT, "topk is an aar_dsa_impl_t, expected an aar_sfa_topk_buffer_t");
  EXPECT_TRUE(at::equal(out, at::zeros({2, kHidden})));
  // A group builder whose step builder was destroyed is named; the step's metadata is dead.
  aar_dsa_step_builder_destroy(c.step.release());
  const aar_dsa_group_metadata_t* gm = nullptr;
  EXPECT_REJECTED(aar_dsa_group_builder_build(c.groups[0].get(), csm, table.data(), table.size(), kMbr, &gm),
                  AAR_ERR_INVALID_ARGUMENT, "builder's step builder has been destroyed");
  aar_dsa_step_metadata_info_t info;
  info.struct_size = sizeof(info);
  EXPECT_REJECTED(aar_dsa_step_metadata_get_info(csm, &info), AAR_ERR_INVALID_ARGUMENT,
                  "metadata is an aar_dsa_step_metadata_t that has been destroyed");
}

// Graph mode: a decode bucket of a C4 layer captured through the C ABI, then per step the step and
// group builds, aar_graph_update_dsa and a replay compute what the C++ layer computes eagerly.
TEST(CApiDsa, CapturedDecodeBucketReplaysLikeTheCppLayer) {
  const Model m;
  const aar::dsa::AttnKvPlan plan = aar::dsa::make_attn_kv_plan(aar::dsa::DsaConfig{});
  aar::dsa::StepBuilder cpp_step(cpp_step_config(m));
  std::vector<std::unique_ptr<aar::dsa::GroupBuilder>> cpp_groups;
  for (DsaCacheKind k : kKinds) {
    aar::dsa::GroupConfig gc;
    gc.kind = k;
    gc.cache_block_size = kCbs;
    gc.plan = plan;
    gc.max_blocks_per_req = kMbr;
    gc.num_blocks = kNumBlocks;
    cpp_groups.push_back(std::make_unique<aar::dsa::GroupBuilder>(cpp_step, gc));
  }
  aar::dsa::Impl cpp_layer(cpp_impl_config(plan), m.w);
  CModel c(m);
  ASSERT_TRUE(c.step && c.layer && c.groups.size() == 5);
  aar_graph_params_t* g = nullptr;
  ASSERT_EQ(aar_graph_params_create("recording", nullptr, 0, &g), AAR_OK) << last();
  Owned<aar_graph_params_t> graph(g, aar_graph_params_destroy);

  at::manual_seed(7);
  const std::vector<at::Tensor> kv_a = make_caches(plan, cpp_step);
  const std::vector<at::Tensor> kv_b = clones(kv_a);
  const CTuple ckv(kv_b);
  constexpr int64_t kBucket = 3;
  const std::vector<int32_t> table = table_for(3);
  const at::Tensor hidden = at::zeros({kBucket, kHidden}), out = at::zeros({kBucket, kHidden});
  Dl dh(hidden), dout(out);
  auto c_build = [&](const Step& s, bool capture, std::vector<const aar_dsa_group_metadata_t*>& gm) {
    const aar_dsa_step_inputs_t in = c_inputs(s);
    const aar_dsa_step_metadata_t* st = nullptr;
    EXPECT_EQ(capture ? aar_dsa_step_builder_build_for_graph_capture(c.step.get(), &in, AAR_STATE_DECODE_ONLY, &st)
                      : aar_dsa_step_builder_build(c.step.get(), &in, &st),
              AAR_OK)
        << last();
    gm.assign(5, nullptr);
    for (size_t i = 0; i < 5; ++i) {
      EXPECT_EQ(aar_dsa_group_builder_build(c.groups[i].get(), st, table.data(), table.size(), kMbr, &gm[i]), AAR_OK)
          << last();
    }
    return st;
  };
  std::vector<const aar_dsa_group_metadata_t*> gm;
  Step step{{0, 1, 2, 3}, {9, 41, 20}};
  const aar_dsa_step_metadata_t* st = c_build(step, true, gm);
  ASSERT_EQ(aar_graph_begin_capture(graph.get(), kBucket), AAR_OK) << last();
  ASSERT_EQ(aar_dsa_impl_forward(c.layer.get(), dh.get(), ckv.ptrs.data(), ckv.ptrs.size(), st, gm.data(), gm.size(),
                                 dout.get(), nullptr),
            AAR_OK)
      << last();
  ASSERT_EQ(aar_graph_end_capture(graph.get()), AAR_OK) << last();
  EXPECT_TRUE(all_equal(kv_a, kv_b)) << "the capture ran the layer";
  // The update is refused for a group other than the SWA one.
  EXPECT_REJECTED(aar_graph_update_dsa(graph.get(), kBucket, st, gm[1]), AAR_ERR_INVALID_ARGUMENT,
                  "swa is the metadata of a C4");

  for (int it = 0; it < 2; ++it) {
    for (auto& s : step.seq) ++s;
    st = c_build(step, false, gm);
    aar::dsa::StepInputs in;
    in.query_start_loc = {step.qsl.data(), step.qsl.size()};
    in.seq_lens = {step.seq.data(), step.seq.size()};
    const aar::dsa::StepMetadata& sm = cpp_step.build(in);
    aar::dsa::GroupInputs gi;
    gi.block_table = {table.data(), table.size()};
    gi.block_table_stride = kMbr;
    std::vector<const aar::dsa::GroupMetadata*> gms;
    for (auto& grp : cpp_groups) gms.push_back(&grp->build(sm, gi));
    const aar::dsa::LayerMetadata lm = aar::dsa::route_layer(4, sm, {gms.data(), gms.size()});
    hidden.normal_();
    at::Tensor out_a = at::zeros({kBucket, kHidden});
    cpp_layer.forward(hidden, kv_a, &lm, out_a);
    ASSERT_EQ(aar_graph_update_dsa(graph.get(), kBucket, st, gm[0]), AAR_OK) << last();
    ASSERT_EQ(aar_graph_replay(graph.get(), kBucket), AAR_OK) << last();
    EXPECT_TRUE(at::equal(out_a, out)) << "step " << it << ": max diff " << (out_a - out).abs().max().item<float>();
    EXPECT_GT(out.abs().sum().item<double>(), 0.0);
    EXPECT_TRUE(all_equal(kv_a, kv_b)) << "step " << it;
  }
}

}  // namespace
