// Provider selection and the schema table: wrappers reach the CPU twins by
// default on CPU tensors, the no-compute provider under ProviderOverride, and
// fail clearly for the NPU provider without torch_npu.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/InferenceMode.h>
#include <gtest/gtest.h>
#include <torch/csrc/jit/frontend/function_schema_parser.h>

#include "ascend_attn_rt/errors.h"
#include "ascend_attn_rt/ops/fused_infer_attention.h"
#include "ascend_attn_rt/ops/fusion_attention.h"
#include "ascend_attn_rt/ops/kv_cache_write.h"
#include "ascend_attn_rt/ops/paged_attention.h"
#include "../../cpp/ops/noop/output_cache.h"
#include "ascend_attn_rt/ops/cann_ops_library.h"
#include "ascend_attn_rt/ops/provider.h"
#include "ascend_attn_rt/ops/schemas.h"
#include "ascend_attn_rt/ops/batch_matmul_transpose.h"
#include "ascend_attn_rt/ops/lightning_indexer.h"
#include "ascend_attn_rt/ops/quant.h"
#include "ascend_attn_rt/ops/sfa_c8_rows.h"
#include "ascend_attn_rt/ops/sparse_flash_attention.h"
#include "../../cpp/ops/op_handle.h"
#include "test_rt_ops_util.h"

namespace ops = aar::ops;
using namespace aar_test;

TEST(RtOpsProvider, Namespaces) {
  EXPECT_STREQ(ops::provider_namespace(ops::Provider::Npu), "npu");
  EXPECT_STREQ(ops::provider_namespace(ops::Provider::Npu, true), "atb");
  EXPECT_STREQ(ops::provider_namespace(ops::Provider::Cpu), "ascend_cpu");
  EXPECT_STREQ(ops::provider_namespace(ops::Provider::Cpu, true), "ascend_cpu");
  EXPECT_STREQ(ops::provider_namespace(ops::Provider::NoCompute), "ascend_noop");
  EXPECT_THROW(ops::provider_namespace(ops::Provider::Auto), aar::InvalidArgument);
  EXPECT_STREQ(ops::to_string(ops::Provider::NoCompute), "NoCompute");
  // The two operator libraries and their providers' namespaces.
  using L = ops::OpLibrary;
  EXPECT_STREQ(ops::provider_namespace(ops::Provider::Npu, L::TorchNpu), "npu");
  EXPECT_STREQ(ops::provider_namespace(ops::Provider::Cpu, L::TorchNpu), "ascend_cpu");
  EXPECT_STREQ(ops::provider_namespace(ops::Provider::NoCompute, L::TorchNpu), "ascend_noop");
  EXPECT_STREQ(ops::provider_namespace(ops::Provider::Npu, L::Atb), "atb");
  EXPECT_STREQ(ops::provider_namespace(ops::Provider::Cpu, L::Atb), "ascend_cpu");
  EXPECT_STREQ(ops::provider_namespace(ops::Provider::NoCompute, L::Atb), "ascend_noop");
  EXPECT_STREQ(ops::provider_namespace(ops::Provider::Npu, L::VllmAscend), "_C_ascend");
  EXPECT_STREQ(ops::provider_namespace(ops::Provider::Cpu, L::VllmAscend), "ascend_cpu_va");
  EXPECT_STREQ(ops::provider_namespace(ops::Provider::NoCompute, L::VllmAscend), "ascend_noop_va");
  EXPECT_THROW(ops::provider_namespace(ops::Provider::Auto, L::VllmAscend), aar::InvalidArgument);
  EXPECT_THROW(ops::provider_namespace(ops::Provider::Cpu, static_cast<L>(7)), aar::InvalidArgument);
  EXPECT_STREQ(ops::to_string(L::VllmAscend), "VllmAscend");
  EXPECT_STREQ(ops::provider_namespace(ops::Provider::Npu, ops::kCannOpsTransformer), "cann_ops_transformer");
  EXPECT_STREQ(ops::provider_namespace(ops::Provider::Cpu, ops::kCannOpsTransformer), "ascend_cpu_cot");
  EXPECT_STREQ(ops::provider_namespace(ops::Provider::NoCompute, ops::kCannOpsTransformer), "ascend_noop_cot");
  EXPECT_STREQ(ops::to_string(ops::kCannOpsTransformer), "CannOpsTransformer");
}

TEST(RtOpsProvider, ResolveFromDeviceAndOverride) {
  const at::Tensor cpu = at::zeros({1});
  EXPECT_EQ(ops::provider_override(), ops::Provider::Auto);
  EXPECT_EQ(ops::resolve_provider(cpu), ops::Provider::Cpu);
  {
    ops::ProviderOverride o(ops::Provider::NoCompute);
    EXPECT_EQ(ops::resolve_provider(cpu), ops::Provider::NoCompute);
    {
      ops::ProviderOverride o2(ops::Provider::Cpu);
      EXPECT_EQ(ops::resolve_provider(cpu), ops::Provider::Cpu);
    }
    EXPECT_EQ(ops::provider_override(), ops::Provider::NoCompute);
  }
  EXPECT_EQ(ops::provider_override(), ops::Provider::Auto);
  // Meta tensors have shapes only: they resolve to the no-compute provider.
  const at::Tensor meta = at::empty({1}, at::TensorOptions().device(at::kMeta));
  EXPECT_EQ(ops::resolve_provider(meta), ops::Provider::NoCompute);
  {
    ops::ProviderOverride o(ops::Provider::Cpu);
    EXPECT_EQ(ops::resolve_provider(meta), ops::Provider::Cpu);  // an override still wins
  }
}

TEST(RtOpsProvider, NoComputeKernelsServeMetaTensors) {
  // Auto resolves meta to the no-compute kernels, registered for the Meta key
  // too: outputs are meta tensors of the right shapes.
  ops::FusionAttentionArgs a;
  const auto meta = at::TensorOptions().device(at::kMeta);
  a.query = at::empty({5, 4, 8}, meta);
  a.key = at::empty({5, 2, 8}, meta);
  a.value = at::empty({5, 2, 16}, meta);
  a.head_num = 4;
  const std::vector<int64_t> l{5};
  a.actual_seq_qlen = l;
  a.actual_seq_kvlen = l;
  const at::Tensor out = ops::fusion_attention(a);
  EXPECT_TRUE(out.is_meta());
  EXPECT_EQ(out.sizes(), (c10::IntArrayRef{5, 4, 16}));
}

TEST(RtOpsProvider, SchemaTableRegisteredIdenticallyInBothNamespaces) {
  const auto& table = ops::op_schemas();
  EXPECT_GE(table.size(), 24u);  // 11 GQA entries + 6 MLA operators (issue 5) + 7 sparse/quant (issue 10)
  for (const auto& s : table) {
    const std::string name = s.name;
    const auto dot = name.find('.');
    const std::string base = name.substr(0, dot);
    const std::string overload = dot == std::string::npos ? "" : name.substr(dot + 1);
    EXPECT_EQ(std::string(s.schema).rfind(base + "(", 0) == 0 || std::string(s.schema).rfind(name + "(", 0) == 0,
              true)
        << s.schema;
    const auto parsed = torch::jit::parseSchema(s.schema);
    for (const char* ns : {"ascend_cpu", "ascend_noop"}) {
      const auto h = c10::Dispatcher::singleton().findSchemaOrThrow((std::string(ns) + "::" + base).c_str(),
                                                                    overload.c_str());
      EXPECT_TRUE(h.hasKernelForDispatchKey(c10::DispatchKey::CPU)) << ns << "::" << name;
      const auto& reg = h.schema();
      EXPECT_EQ(c10::toString(reg), c10::toString(parsed.cloneWithName(reg.name(), reg.overload_name())))
          << ns << "::" << name;
    }
    EXPECT_EQ(s.atb, base == "_npu_paged_attention" || base == "_npu_paged_attention_get_workspace" ||
                         base == "_npu_reshape_and_cache")
        << name;
  }
}

namespace {

struct Small {
  at::Tensor q = at::randn({3, 4, 8}), k = at::randn({3, 2, 8}), v = at::randn({3, 2, 8});
  std::vector<int64_t> lens{3};
  ops::FiaTensors t{q, k, v};
  ops::FiaParams p;
  Small() {
    p.actual_seq_lengths = lens;
    p.actual_seq_lengths_kv = lens;
    p.num_heads = 4;
    p.num_key_value_heads = 2;
    p.softmax_lse_flag = true;
  }
};

}  // namespace

TEST(RtOpsProvider, WrappersDispatchToCpuOrNoCompute) {
  Small s;
  const auto [cpu_out, cpu_lse] = ops::fused_infer_attention_score(s.t, s.p);
  EXPECT_GT(cpu_out.abs().sum().item<double>(), 0.0);
  {
    ops::ProviderOverride o(ops::Provider::NoCompute);
    const auto [out, lse] = ops::fused_infer_attention_score(s.t, s.p);
    EXPECT_EQ(out.sizes(), s.q.sizes());
    EXPECT_EQ(lse.sizes(), cpu_lse.sizes());
    EXPECT_EQ(out.abs().sum().item<double>(), 0.0);  // computed nothing
    // Steady state: the same cached tensors come back.
    const auto [out2, lse2] = ops::fused_infer_attention_score(s.t, s.p);
    EXPECT_TRUE(out2.is_same(out));
    EXPECT_TRUE(lse2.is_same(lse));
    at::Tensor o_out = at::full_like(s.q, 5.0), o_lse = at::full({3, 4, 1}, 5.0);
    ops::fused_infer_attention_score_out(s.t, s.p, std::nullopt, o_out, o_lse);
    EXPECT_TRUE(at::all(o_out == 5.0).item<bool>());

    at::Tensor kc = at::zeros({2, 16, 2, 8}), vc = at::zeros({2, 16, 2, 8});
    ops::scatter_pa_kv_cache(s.k, s.v, kc, vc, at::tensor(std::vector<int32_t>{0, 1, 2}, at::kInt), "Norm");
    EXPECT_TRUE(at::all(kc == 0).item<bool>());
  }
  // Explicit provider argument wins over the device.
  const auto [no_out, no_lse] = ops::fused_infer_attention_score(s.t, s.p, ops::Provider::NoCompute);
  EXPECT_EQ(no_out.abs().sum().item<double>(), 0.0);
  at::Tensor kc = at::zeros({2, 16, 2, 8}), vc = at::zeros({2, 16, 2, 8});
  ops::scatter_pa_kv_cache(s.k, s.v, kc, vc, at::tensor(std::vector<int32_t>{0, 1, 2}, at::kInt), "Norm");
  EXPECT_TRUE(at::equal(kc[0].narrow(0, 0, 3), s.k));
}

TEST(RtOpsProvider, NoComputeShapesForEveryFunctionalOp) {
  ops::ProviderOverride o(ops::Provider::NoCompute);
  ops::FusionAttentionArgs a;
  a.query = at::randn({5, 4, 8});
  a.key = at::randn({5, 2, 8});
  a.value = at::randn({5, 2, 16});
  a.head_num = 4;
  const std::vector<int64_t> l{5};
  a.actual_seq_qlen = l;
  a.actual_seq_kvlen = l;
  EXPECT_EQ(ops::fusion_attention(a).sizes(), (c10::IntArrayRef{5, 4, 16}));

  Small s;
  ops::FiaV2Tensors t2{s.q, s.k, s.v};
  ops::FiaV2Params p2;
  p2.actual_seq_qlen = s.lens;
  p2.actual_seq_kvlen = s.lens;
  p2.num_query_heads = 4;
  const auto [out, lse] = ops::fused_infer_attention_score_v2(t2, p2);
  EXPECT_EQ(out.sizes(), s.q.sizes());
  EXPECT_EQ(lse.numel(), 1);
  EXPECT_EQ(ops::fused_infer_attention_score_v2_get_max_workspace(t2, p2).scalar_type(), at::kByte);

  ops::PagedAttentionArgs pa;
  pa.query = at::randn({2, 4, 8});
  pa.key_cache = at::randn({2, 16, 2, 8});
  pa.value_cache = pa.key_cache;
  pa.num_kv_heads = 2;
  pa.num_heads = 4;
  pa.block_table = at::zeros({2, 1}, at::kInt);
  pa.context_lens = at::ones({2}, at::kInt);
  at::Tensor pout = at::full({2, 4, 8}, 9.0);
  ops::paged_attention(pa, pout, std::nullopt);
  EXPECT_TRUE(at::all(pout == 9.0).item<bool>());
  EXPECT_EQ(ops::paged_attention_get_workspace(pa, pout).scalar_type(), at::kByte);
}

TEST(RtOpsProvider, VllmAscendSchemaTableRegisteredIdenticallyInBothVaNamespaces) {
  const auto& table = ops::vllm_ascend_op_schemas();
  // issue 10: 2 indexers, 2 sparse attentions, batch_matmul_transpose, mla_preprocess; issue 12: the DSA
  // shared-KV attention and its metadata (plain and A5 kv-quant), scatter_nd_update_v2, partial rotary mul,
  // compressor, compressor_metadata(_out), kv_compress_epilog, indexer_compress_epilog_v2,
  // npu_vllm_quant_lightning_indexer (+ _metadata); issue 30: npu_rms_norm_dynamic_quant
  EXPECT_EQ(table.size(), 20u);
  for (const auto& s : table) {
    EXPECT_FALSE(s.atb) << s.name;
    EXPECT_EQ(std::string(s.schema).rfind(std::string(s.name) + "(", 0), 0u) << s.schema;
    const auto parsed = torch::jit::parseSchema(s.schema);
    for (const char* ns : {"ascend_cpu_va", "ascend_noop_va"}) {
      const auto h = c10::Dispatcher::singleton().findSchemaOrThrow((std::string(ns) + "::" + s.name).c_str(), "");
      EXPECT_TRUE(h.hasKernelForDispatchKey(c10::DispatchKey::CPU)) << ns << "::" << s.name;
      EXPECT_FALSE(h.hasKernelForDispatchKey(c10::DispatchKey::Autograd)) << ns << "::" << s.name;
      EXPECT_FALSE(h.hasKernelForDispatchKey(c10::DispatchKey::AutogradCPU)) << ns << "::" << s.name;
      if (std::string(ns) == "ascend_noop_va") {
        EXPECT_TRUE(h.hasKernelForDispatchKey(c10::DispatchKey::Meta)) << ns << "::" << s.name;
      }
      const auto& reg = h.schema();
      EXPECT_EQ(c10::toString(reg), c10::toString(parsed.cloneWithName(reg.name(), reg.overload_name())))
          << ns << "::" << s.name;
    }
  }
  // Names shared with torch_npu (npu_lightning_indexer, ...) keep each library's own schema.
  const auto npu = c10::Dispatcher::singleton().findSchemaOrThrow("ascend_cpu::npu_sparse_flash_attention", "");
  const auto va = c10::Dispatcher::singleton().findSchemaOrThrow("ascend_cpu_va::npu_sparse_flash_attention", "");
  EXPECT_NE(c10::toString(npu.schema()).find("Tensor? sinks"), std::string::npos);
  EXPECT_EQ(c10::toString(va.schema()).find("sinks"), std::string::npos);
}

// Every provider dispatches like torch_npu's operators: no Autograd kernel
// (torch_npu registers none for them; ours no fallthrough either), and every
// wrapper call runs under InferenceMode, entered when the caller is not in it.
TEST(RtOpsProvider, EveryProviderDispatchesLikeTorchNpu) {
  for (const auto& s : ops::op_schemas()) {
    const std::string name = s.name;
    const auto dot = name.find('.');
    for (const char* ns : {"ascend_cpu", "ascend_noop"}) {
      const auto h = c10::Dispatcher::singleton().findSchemaOrThrow(
          (std::string(ns) + "::" + name.substr(0, dot)).c_str(), dot == std::string::npos ? "" : &s.name[dot + 1]);
      EXPECT_FALSE(h.hasKernelForDispatchKey(c10::DispatchKey::Autograd)) << ns << "::" << name;
      EXPECT_FALSE(h.hasKernelForDispatchKey(c10::DispatchKey::AutogradCPU)) << ns << "::" << name;
    }
  }
  ASSERT_FALSE(c10::InferenceMode::is_enabled());
  for (const ops::Provider p : {ops::Provider::Npu, ops::Provider::Cpu, ops::Provider::NoCompute}) {
    {
      ops::detail::DispatchGuard guard(p);
      EXPECT_TRUE(c10::InferenceMode::is_enabled()) << ops::to_string(p);
    }
    EXPECT_FALSE(c10::InferenceMode::is_enabled()) << ops::to_string(p);
  }
  {
    c10::InferenceMode outer;
    { ops::detail::DispatchGuard guard(ops::Provider::Cpu); }
    EXPECT_TRUE(c10::InferenceMode::is_enabled());  // an enclosing guard is left alone
  }
  // Through a wrapper, outside inference mode: the CPU twin ran under the guard.
  Small s;
  const auto [out, lse] = ops::fused_infer_attention_score(s.t, s.p);
  EXPECT_TRUE(out.is_inference());
  EXPECT_TRUE(lse.is_inference());
  EXPECT_FALSE(c10::InferenceMode::is_enabled());
}

TEST(RtOpsProvider, NpuProviderWithoutTorchNpuFailsClearly) {
  Small s;
  expect_throw_with<aar::NotSupported>(
      [&] { ops::fused_infer_attention_score(s.t, s.p, ops::Provider::Npu); }, "torch_npu is not loaded");
  at::Tensor kc = at::zeros({2, 16, 2, 8}), vc = at::zeros({2, 16, 2, 8});
  expect_throw_with<aar::NotSupported>(
      [&] {
        ops::reshape_and_cache(s.k, s.v, kc, vc, at::zeros({3}, at::kInt), ops::Provider::Npu);
      },
      "atb::_npu_reshape_and_cache");
  // Still failing (not cached as success) on a second call.
  EXPECT_THROW(ops::fused_infer_attention_score(s.t, s.p, ops::Provider::Npu), aar::NotSupported);
  // vllm-ascend's operators live in _C_ascend: the message says which library is missing.
  at::Tensor c = at::zeros({2, 3, 5});
  expect_throw_with<aar::NotSupported>(
      [&] { ops::batch_matmul_transpose(at::zeros({2, 3, 4}), at::zeros({3, 4, 5}), c, std::nullopt, std::nullopt,
                                        ops::Provider::Npu); },
      "_C_ascend::batch_matmul_transpose is not registered: vllm-ascend");
}

TEST(RtOpsProvider, NoComputeShapesForTheSparseOperators) {
  // Meta tensors (shapes only) resolve to the no-compute kernels of both libraries.
  const auto meta = at::TensorOptions().device(at::kMeta);
  const int64_t t = 7, n = 16, k = 2048;
  for (const ops::OpLibrary lib : {ops::OpLibrary::TorchNpu, ops::OpLibrary::VllmAscend}) {
    ops::LightningIndexerArgs li;
    li.query = at::empty({t, 64, 128}, meta.dtype(at::kBFloat16));
    li.key = at::empty({40, 128, 1, 128}, meta.dtype(at::kBFloat16));
    li.weights = at::empty({t, 64}, meta.dtype(at::kBFloat16));
    li.actual_seq_lengths_query = at::empty({3}, meta.dtype(at::kInt));
    li.actual_seq_lengths_key = at::empty({3}, meta.dtype(at::kInt));
    li.block_table = at::empty({3, 16}, meta.dtype(at::kInt));
    const auto [idx, val] = ops::lightning_indexer(li, lib);
    EXPECT_TRUE(idx.is_meta());
    EXPECT_EQ(idx.sizes(), (c10::IntArrayRef{t, 1, k}));
    EXPECT_EQ(idx.scalar_type(), at::kInt);
    EXPECT_EQ(val.numel(), 0);
    ops::QuantLightningIndexerArgs qli;
    qli.base = li;
    qli.base.query = at::empty({t, 64, 128}, meta.dtype(at::kChar));
    qli.base.key = at::empty({40, 128, 1, 128}, meta.dtype(at::kChar));
    qli.query_dequant_scale = at::empty({t, 64}, meta.dtype(at::kHalf));
    qli.key_dequant_scale = at::empty({40, 128, 1}, meta.dtype(at::kHalf));
    EXPECT_EQ(ops::quant_lightning_indexer(qli, lib).sizes(), (c10::IntArrayRef{t, 1, k}));

    ops::SparseFlashAttentionArgs sfa;
    sfa.query = at::empty({t, n, 512}, meta.dtype(at::kBFloat16));
    sfa.key = at::empty({40, 128, 1, 512}, meta.dtype(at::kBFloat16));
    sfa.query_rope = at::empty({t, n, 64}, meta.dtype(at::kBFloat16));
    sfa.key_rope = at::empty({40, 128, 1, 64}, meta.dtype(at::kBFloat16));
    sfa.sparse_indices = at::empty({t, 1, k}, meta.dtype(at::kInt));
    sfa.return_softmax_lse = true;
    const auto [out, smax, ssum] = ops::sparse_flash_attention(sfa, lib);
    EXPECT_EQ(out.sizes(), (c10::IntArrayRef{t, n, 512}));
    EXPECT_EQ(out.scalar_type(), at::kBFloat16);
    EXPECT_EQ(smax.sizes(), (c10::IntArrayRef{1, t, n}));
    EXPECT_EQ(ssum.sizes(), (c10::IntArrayRef{1, t, n}));
    EXPECT_EQ(smax.scalar_type(), at::kFloat);

    ops::KvQuantSparseFlashAttentionArgs c8;
    c8.query = at::empty({t, n, 576}, meta.dtype(at::kBFloat16));
    c8.key = c8.value = at::empty({40, 128, 1, 656}, meta.dtype(at::kChar));
    c8.sparse_indices = sfa.sparse_indices;
    c8.return_softmax_lse = lib == ops::OpLibrary::VllmAscend;
    const auto [o8, m8, s8] = ops::kv_quant_sparse_flash_attention(c8, lib);
    EXPECT_EQ(o8.sizes(), (c10::IntArrayRef{t, n, 512}));
    if (lib == ops::OpLibrary::VllmAscend) EXPECT_EQ(m8.sizes(), (c10::IntArrayRef{1, t, n}));
  }
  at::Tensor self = at::empty({100, 128}, meta);
  EXPECT_TRUE(ops::scatter_nd_update_(self, at::empty({4, 1}, meta.dtype(at::kLong)), at::empty({4, 128}, meta))
                  .is_same(self));
  ops::DynamicQuantArgs dq;
  dq.input = at::empty({t, 64, 128}, meta.dtype(at::kBFloat16));
  const auto [q, qs] = ops::dynamic_quant(dq);
  EXPECT_EQ(q.sizes(), (c10::IntArrayRef{t, 64, 128}));
  EXPECT_EQ(q.scalar_type(), at::kChar);
  EXPECT_EQ(qs.sizes(), (c10::IntArrayRef{t, 64}));
  const auto [y, ys] = ops::dynamic_block_quant(at::empty({t, 1, 512}, meta.dtype(at::kBFloat16)), 1, 128);
  EXPECT_EQ(y.sizes(), (c10::IntArrayRef{t, 1, 512}));
  EXPECT_EQ(ys.sizes(), (c10::IntArrayRef{t, 1, 4}));
  at::Tensor c = at::empty({t, n, 128}, meta.dtype(at::kBFloat16));
  ops::batch_matmul_transpose(at::empty({t, n, 512}, meta.dtype(at::kBFloat16)),
                              at::empty({n, 512, 128}, meta.dtype(at::kBFloat16)), c);
  // The C8 row packer runs on meta too (block quant + views).
  const at::Tensor rows = ops::pack_sfa_c8_rows(at::empty({t, 1, 512}, meta.dtype(at::kBFloat16)),
                                                at::empty({t, 1, 64}, meta.dtype(at::kBFloat16)));
  EXPECT_EQ(rows.sizes(), (c10::IntArrayRef{t, 1, 656}));
  EXPECT_TRUE(rows.is_meta());
}

// The no-compute provider's per-thread output cache (cpp/ops/noop/output_cache.h):
// one tensor per (shape, dtype, device), returned again on a repeat (a steady-state
// call allocates nothing), right-shaped for any number of distinct keys (replacement
// past its 64 entries).
TEST(RtOpsProvider, NoComputeOutputCacheKeysOnShapeDtypeAndDevice) {
  const c10::Device meta(c10::kMeta), cpu(c10::kCPU);
  const std::vector<int64_t> s{3, 4};
  const at::Tensor a = ops::noop::cached(s, at::kFloat, meta);
  EXPECT_TRUE(a.is_same(ops::noop::cached(s, at::kFloat, meta)));
  EXPECT_EQ(a.sizes(), c10::IntArrayRef(s));
  EXPECT_EQ(a.device(), meta);
  const at::Tensor b = ops::noop::cached(s, at::kHalf, meta);
  const at::Tensor c = ops::noop::cached(s, at::kFloat, cpu);
  const std::vector<int64_t> s2{4, 3}, s3{3, 4, 1};
  const at::Tensor d = ops::noop::cached(s2, at::kFloat, meta);
  const at::Tensor e = ops::noop::cached(s3, at::kFloat, meta);
  for (const at::Tensor* t : {&b, &c, &d, &e}) EXPECT_FALSE(t->is_same(a));
  EXPECT_EQ(b.scalar_type(), at::kHalf);
  EXPECT_EQ(c.device(), cpu);
  EXPECT_EQ(d.sizes(), c10::IntArrayRef(s2));
  EXPECT_EQ(e.sizes(), c10::IntArrayRef(s3));
  // Far more keys than entries: every answer has its key's shape, old or new.
  for (int round = 0; round < 2; ++round) {
    for (int64_t n = 1; n <= 300; ++n) {
      const std::vector<int64_t> k{n, 2};
      const at::Tensor t = ops::noop::cached(k, at::kFloat, meta);
      ASSERT_EQ(t.sizes(), c10::IntArrayRef(k)) << n;
      ASSERT_TRUE(t.is_same(ops::noop::cached(k, at::kFloat, meta))) << n;
    }
  }
  EXPECT_THROW(ops::noop::cached(std::vector<int64_t>(7, 1), at::kFloat, meta), aar::InvalidArgument);
}
