// The DeepSeek-V4 (DSA) model set-up shared by bench_dsa_cpp (the builders) and
// bench_dsa_impl_cpp (the layer): one StepBuilder with bf16 R = 64 RoPE tables
// (rope_theta and compress_rope_theta) and the seven KV-cache groups of a V4
// model (SWA, C4 KV, C128 KV, C4 indexer K, C4 attention state, C4 indexer
// state, C128 state) on the A2 plan at cache block size 128, each with a
// scheduler block table of cdiv(max_model_len, block_size) columns (vLLM's
// width; max_model_len 8192), and decode batches at a fixed context.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "ascend_attn_rt/dsa/builder.h"

namespace aar_bench {

constexpr int kDsaMaxReqs = 256, kDsaMaxModelLen = 8192, kDsaCbs = 128;

// In the order of the groups below; route_layer's arguments by index.
inline constexpr aar::dsa::DsaCacheKind kDsaKinds[] = {
    aar::dsa::DsaCacheKind::Swa,         aar::dsa::DsaCacheKind::C4Kv,          aar::dsa::DsaCacheKind::C128Kv,
    aar::dsa::DsaCacheKind::C4IndexerK,  aar::dsa::DsaCacheKind::C4AttnState,   aar::dsa::DsaCacheKind::C4IndexerState,
    aar::dsa::DsaCacheKind::C128State};
inline constexpr const char* kDsaGroupNames[] = {"group swa",           "group c4_kv",          "group c128_kv",
                                                 "group c4_indexer_k",  "group c4_attn_state",  "group c4_indexer_state",
                                                 "group c128_state"};

struct DsaModelOptions {
  c10::Device device = c10::Device(c10::kCPU);
  bool separate = false;      // separate device buffers
  bool narrow_state = false;  // the state groups get 64 columns (only the window's blocks)
  int32_t num_heads_q = 0;    // SAS blobs (0: none)
  int32_t index_topk = 512;
  int32_t index_n_heads = aar::dsa::kDsaIndexerHeads;
  int32_t index_head_dim = aar::dsa::kDsaIndexerHeadDim;
  bool wrap_table_ids = true;  // table ids i % num_blocks (else i: every id < num_blocks as well)
  int32_t max_reqs = kDsaMaxReqs;
  int32_t max_num_tokens = 4096;
};

struct DsaModel {
  aar::dsa::AttnKvPlan plan;
  std::unique_ptr<aar::dsa::StepBuilder> step;
  std::vector<std::unique_ptr<aar::dsa::GroupBuilder>> groups;
  std::vector<std::vector<int32_t>> tables;  // per group: max_reqs rows x strides[g]
  std::vector<int32_t> strides;
  std::vector<int64_t> storage_block_sizes, num_blocks;
};

inline DsaModel make_dsa_model(const DsaModelOptions& o) {
  aar::dsa::StepBuilderConfig sc;
  sc.max_num_reqs = o.max_reqs;
  sc.max_num_tokens = o.max_num_tokens;
  sc.cos_table = at::randn({kDsaMaxModelLen, 64}).to(at::kBFloat16);
  sc.sin_table = at::randn({kDsaMaxModelLen, 64}).to(at::kBFloat16);
  sc.compress_cos_table = at::randn({kDsaMaxModelLen, 64}).to(at::kBFloat16);
  sc.compress_sin_table = at::randn({kDsaMaxModelLen, 64}).to(at::kBFloat16);
  sc.device = o.device;
  if (o.device.is_cpu()) sc.separate_device_buffers = o.separate;
  sc.model.num_heads_q = o.num_heads_q;
  sc.model.index_topk = o.index_topk;
  sc.model.index_n_heads = o.index_n_heads;
  sc.model.index_head_dim = o.index_head_dim;
  DsaModel m;
  m.plan = aar::dsa::make_attn_kv_plan(aar::dsa::DsaConfig{});
  m.step = std::make_unique<aar::dsa::StepBuilder>(sc);
  for (aar::dsa::DsaCacheKind k : kDsaKinds) {
    const aar::dsa::DsaCacheSpec spec = aar::dsa::dsa_cache_spec(k, kDsaCbs, m.plan);
    const bool state = k == aar::dsa::DsaCacheKind::C4AttnState || k == aar::dsa::DsaCacheKind::C4IndexerState ||
                       k == aar::dsa::DsaCacheKind::C128State;
    int32_t cols = static_cast<int32_t>((kDsaMaxModelLen + spec.block_size - 1) / spec.block_size);
    if (state && o.narrow_state) cols = 64;
    aar::dsa::GroupConfig gc;
    gc.kind = k;
    gc.cache_block_size = kDsaCbs;
    gc.plan = m.plan;
    gc.max_blocks_per_req = cols;
    gc.num_blocks = o.max_reqs * cols;
    m.groups.push_back(std::make_unique<aar::dsa::GroupBuilder>(*m.step, gc));
    std::vector<int32_t> t(static_cast<size_t>(o.max_reqs) * cols);
    for (size_t i = 0; i < t.size(); ++i) {
      t[i] = static_cast<int32_t>(o.wrap_table_ids ? i % static_cast<size_t>(gc.num_blocks) : i);
    }
    m.tables.push_back(std::move(t));
    m.strides.push_back(cols);
    m.storage_block_sizes.push_back(spec.storage_block_size);
    m.num_blocks.push_back(gc.num_blocks);
  }
  return m;
}

// B one-token decode requests at context ctx (seq_lens = ctx each), then
// `prefills` requests of prefill_new new tokens on prefill_ctx cached ones.
struct DecodeBatch {
  std::vector<int32_t> qsl, seq;
  DecodeBatch(int B, int ctx, int prefills = 0, int prefill_new = 0, int prefill_ctx = 0)
      : qsl(static_cast<size_t>(B) + 1), seq(static_cast<size_t>(B), ctx) {
    for (int b = 0; b <= B; ++b) qsl[static_cast<size_t>(b)] = b;
    for (int p = 0; p < prefills; ++p) {
      qsl.push_back(qsl.back() + prefill_new);
      seq.push_back(prefill_ctx + prefill_new);
    }
  }
  int num_reqs() const { return static_cast<int>(seq.size()); }
  aar::dsa::StepInputs inputs() const {
    aar::dsa::StepInputs in;
    in.query_start_loc = aar::plan::CSpan<int32_t>(qsl.data(), qsl.size());
    in.seq_lens = aar::plan::CSpan<int32_t>(seq.data(), seq.size());
    return in;
  }
};

// Group g's inputs for B requests from its host table.
inline aar::dsa::GroupInputs dsa_group_inputs(const DsaModel& m, size_t g, int B, const int32_t* table = nullptr) {
  aar::dsa::GroupInputs gi;
  gi.block_table =
      aar::plan::CSpan<int32_t>(table ? table : m.tables[g].data(), static_cast<size_t>(B) * m.strides[g]);
  gi.block_table_stride = m.strides[g];
  return gi;
}

}  // namespace aar_bench
