// The DSA (DeepSeek-V4) attention-KV plan and backend facts
// (docs/design/dsa.md §2.1, §2.2, §4.1, §4.2): every row of the tables of docs/design/dsa.md, written out here as
// literals, against make_attn_kv_plan, resolve_attn_kv_dtype, the backend
// descriptors, DSV4_BLOCK_SIZES and the cache specs; the SparseFlashMla
// length adapter and the slot-mapping formats against brute-force
// definitions; and the errors (named, before any write).
#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ascend_attn_rt/dsa/plan/dsa_backend_facts.h"
#include "ascend_attn_rt/dsa/plan/dsa_kv_plan.h"
#include "test_plan_util.h"

using namespace aar::dsa;
using aar::plan::DeviceKind;

namespace {

AttnKvPlan plan_for(DeviceKind d, std::optional<std::string> cache_dtype = std::nullopt,
                    KvDtype model = KvDtype::BF16) {
  DsaConfig c;
  c.device = d;
  c.cache_dtype = std::move(cache_dtype);
  c.model_dtype = model;
  return make_attn_kv_plan(c);
}

const DeviceKind kA2A3[] = {DeviceKind::A2, DeviceKind::A3};

}  // namespace

// ------------------------------------------------------------------ dtypes

TEST(PlanDsaKvPlan, DtypeNamesAndSizes) {
  struct Row {
    KvDtype d;
    const char* name;
    int64_t size;
  };
  const Row rows[] = {{KvDtype::BF16, "bfloat16", 2},
                      {KvDtype::FP16, "float16", 2},
                      {KvDtype::FP32, "float32", 4},
                      {KvDtype::INT8, "int8", 1},
                      {KvDtype::FP8_E4M3, "float8_e4m3fn", 1}};
  for (const Row& r : rows) {
    EXPECT_STREQ(to_string(r.d), r.name);
    EXPECT_EQ(element_size(r.d), r.size) << r.name;
  }
  EXPECT_INVALID(element_size(static_cast<KvDtype>(42)), "not a KvDtype");
  EXPECT_STREQ(device_name(DeviceKind::Ascend310P), "Ascend310P");
  EXPECT_STREQ(device_name(DeviceKind::A5), "A5");
}

TEST(PlanDsaKvPlan, Fp8RowLayoutTilesThe640ByteRow) {
  // [448 fp8 nope | 64 bf16 rope (128 B) | 7 e8m0 scales | 57 pad] (docs/design/dsa.md §1.4)
  EXPECT_EQ(Fp8KvRowLayout::kNopeOffset, 0);
  EXPECT_EQ(Fp8KvRowLayout::kNopeBytes, 448);
  EXPECT_EQ(Fp8KvRowLayout::kRopeOffset, Fp8KvRowLayout::kNopeOffset + Fp8KvRowLayout::kNopeBytes);
  EXPECT_EQ(Fp8KvRowLayout::kRopeBytes, 64 * 2);
  EXPECT_EQ(Fp8KvRowLayout::kScaleOffset, Fp8KvRowLayout::kRopeOffset + Fp8KvRowLayout::kRopeBytes);
  EXPECT_EQ(Fp8KvRowLayout::kScaleBytes, 448 / 64);
  EXPECT_EQ(Fp8KvRowLayout::kPadOffset, Fp8KvRowLayout::kScaleOffset + Fp8KvRowLayout::kScaleBytes);
  EXPECT_EQ(Fp8KvRowLayout::kPadBytes, 57);
  EXPECT_EQ(Fp8KvRowLayout::kPadOffset + Fp8KvRowLayout::kPadBytes, 640);
  EXPECT_EQ(Fp8KvRowLayout::kRowBytes, 640);
}

// ------------------------------------------------------------- resolve (docs/design/dsa.md §4.2)

TEST(PlanDsaKvPlan, ResolveAttnKvDtypeTable) {
  struct Row {
    DeviceKind dev;
    std::optional<std::string> cache;
    KvDtype non_a5;
    KvDtype want;
  };
  const std::vector<std::optional<std::string>> all = {std::nullopt, "auto",     "bfloat16",     "bf16",
                                                       "fp8",        "fp8_e4m3", "float8_e4m3fn"};
  std::vector<Row> rows;
  // non-A5, any accepted value: non_a5_dtype.
  for (DeviceKind d : kA2A3) {
    for (const auto& c : all) {
      rows.push_back({d, c, KvDtype::BF16, KvDtype::BF16});
      rows.push_back({d, c, KvDtype::FP16, KvDtype::FP16});
    }
  }
  // A5: None / "auto" -> fp8; resolves to bf16 -> bf16; anything else -> fp8.
  for (KvDtype m : {KvDtype::BF16, KvDtype::FP16}) {
    rows.push_back({DeviceKind::A5, std::nullopt, m, KvDtype::FP8_E4M3});
    rows.push_back({DeviceKind::A5, "auto", m, KvDtype::FP8_E4M3});
    rows.push_back({DeviceKind::A5, "bfloat16", m, KvDtype::BF16});
    rows.push_back({DeviceKind::A5, "bf16", m, KvDtype::BF16});
    rows.push_back({DeviceKind::A5, "fp8", m, KvDtype::FP8_E4M3});
    rows.push_back({DeviceKind::A5, "fp8_e4m3", m, KvDtype::FP8_E4M3});
    rows.push_back({DeviceKind::A5, "float8_e4m3fn", m, KvDtype::FP8_E4M3});
  }
  for (const Row& r : rows) {
    const std::optional<std::string> before = r.cache;
    EXPECT_EQ(resolve_attn_kv_dtype(r.dev, r.cache, r.non_a5), r.want)
        << device_name(r.dev) << " cache_dtype=" << r.cache.value_or("<none>") << " non_a5=" << to_string(r.non_a5);
    EXPECT_EQ(r.cache, before);  // never mutated
    // The plan carries the same dtype.
    EXPECT_EQ(plan_for(r.dev, r.cache, r.non_a5).attn_kv_dtype, r.want);
  }
}

TEST(PlanDsaKvPlan, ResolveRejectsUnknownStringsEverywhere) {
  for (DeviceKind d : {DeviceKind::A2, DeviceKind::A3, DeviceKind::A5}) {
    for (const char* bad : {"float16", "fp8_e5m2", "int8", "Auto", "BF16", "", "fp8_inc"}) {
      EXPECT_INVALID(resolve_attn_kv_dtype(d, std::string(bad), KvDtype::BF16),
                     std::string("cache_dtype '") + bad + "'");
      EXPECT_INVALID(plan_for(d, std::string(bad)), "cache_dtype");
    }
  }
}

TEST(PlanDsaKvPlan, ResolveRejectsBadDeviceAndModelDtype) {
  EXPECT_NOT_SUPPORTED(resolve_attn_kv_dtype(DeviceKind::Ascend310P, std::nullopt, KvDtype::BF16), "Ascend310P");
  EXPECT_NOT_SUPPORTED(plan_for(DeviceKind::Ascend310P), "Ascend310P");
  EXPECT_INVALID(resolve_attn_kv_dtype(static_cast<DeviceKind>(9), std::nullopt, KvDtype::BF16), "DeviceKind");
  for (KvDtype bad : {KvDtype::FP32, KvDtype::INT8, KvDtype::FP8_E4M3}) {
    for (DeviceKind d : {DeviceKind::A2, DeviceKind::A5}) {
      EXPECT_INVALID(resolve_attn_kv_dtype(d, std::nullopt, bad), std::string("non_a5_dtype"));
      EXPECT_INVALID(plan_for(d, std::nullopt, bad), to_string(bad));
    }
  }
}

// ------------------------------------------------------------ docs/design/dsa.md §4.1 per device

TEST(PlanDsaKvPlan, HeadAdaptorTableA2A3) {
  for (DeviceKind d : kA2A3) {
    const AttnKvPlan p = plan_for(d);
    EXPECT_EQ(p.device, d);
    // SWA / compressed KV dtype: bf16, head 512
    EXPECT_EQ(p.attn_kv_dtype, KvDtype::BF16);
    EXPECT_EQ(p.attn_head_dim, 512);
    EXPECT_EQ(p.attn_head_size, 512);
    EXPECT_EQ(p.attn_head_bytes, 1024);
    EXPECT_EQ(p.kv_head_extra, 0);
    EXPECT_FALSE(p.fp8_kv_rows);
    // Indexer K / scale: int8 / fp16; the query quant the same.
    EXPECT_EQ(p.indexer_k_dtype, KvDtype::INT8);
    EXPECT_EQ(p.indexer_k_scale_dtype, KvDtype::FP16);
    EXPECT_EQ(p.indexer_q_dtype, KvDtype::INT8);
    EXPECT_EQ(p.indexer_q_scale_dtype, KvDtype::FP16);
    // builder slot_mapping [N,2]; format (block, offset); compressor_metadata format 2
    EXPECT_EQ(p.slot_mapping_columns, 2);
    EXPECT_EQ(p.slot_format, SlotFormat::BlockOffset);
    EXPECT_TRUE(p.requires_block_offset_slots);
    EXPECT_EQ(p.compressor_slot_format_code, 2);
    // floor split of -1: (-1, bs-1)
    EXPECT_EQ(p.block_offset_skip, BlockOffsetSkip::LastOffset);
    // KV scatter
    EXPECT_EQ(p.kv_scatter, KvScatterKind::ScatterNdUpdateV2);
    EXPECT_STREQ(to_string(p.kv_scatter), "npu_scatter_nd_update_v2");
    EXPECT_EQ(p.epilog_quant_group_size, 0);
    EXPECT_EQ(p.epilog_quant_mode, 0);
    // indexer K write: dynamic_quant, scatter k, scatter scale
    EXPECT_EQ(p.indexer_k_write, IndexerKWriteKind::QuantThenScatter);
    EXPECT_EQ(p.indexer_slot_format, SlotFormat::BlockOffset);
    EXPECT_FALSE(p.indexer_full_view);
    // LI weights / k-scale prep: fp16 / fp16
    EXPECT_EQ(p.li_weights_dtype, KvDtype::FP16);
    EXPECT_EQ(p.li_k_scale_dtype, KvDtype::FP16);
    EXPECT_EQ(p.q_norm, QNormKind::RmsFp32);
    // decode cu_seqlens_ori_kv / cmp_kv: the builder's empty tensors; prefill: qsl / none
    EXPECT_EQ(p.decode_cu_seqlens_ori_kv, CuSeqlensKv::EmptyTensor);
    EXPECT_EQ(p.decode_cu_seqlens_cmp_kv, CuSeqlensKv::EmptyTensor);
    EXPECT_EQ(p.prefill_cu_seqlens_ori_kv, CuSeqlensKv::QueryStartLoc);
    EXPECT_EQ(p.prefill_cu_seqlens_cmp_kv, CuSeqlensKv::None);
    // extra SAS kwargs added; SAS op with device=
    EXPECT_TRUE(p.passes_cu_seqlens_kv_extras);
    EXPECT_STREQ(p.sparse_attn_op, "npu_sparse_attn_sharedkv");
    EXPECT_STREQ(p.sparse_attn_metadata_op, "npu_sparse_attn_sharedkv_metadata");
    EXPECT_STREQ(p.sparse_attn_op_library, "_C_ascend");
    EXPECT_TRUE(p.passes_device_kwarg);
    EXPECT_FALSE(p.passes_kv_quant_kwargs);
    // compressor weights: model quant config; o_proj: bmm
    EXPECT_FALSE(p.compressor_weights_unquantised);
    EXPECT_EQ(p.o_proj, OProjKind::Bmm);
    // docs/design/dsa.md §4.2 base plan
    EXPECT_EQ(p.sparse_attn, SparseAttnPath::SharedKv);
    EXPECT_FALSE(p.uses_sparse_flash_mla);
    EXPECT_FALSE(p.renames_seqused_for_flash_mla);
    EXPECT_EQ(p.layout_kv, KvLayout::PA_ND);
    EXPECT_STREQ(to_string(p.layout_kv), "PA_ND");
  }
  // FP16 model: fp16 rows of 512 (2 bytes each).
  const AttnKvPlan h = plan_for(DeviceKind::A3, "auto", KvDtype::FP16);
  EXPECT_EQ(h.attn_kv_dtype, KvDtype::FP16);
  EXPECT_EQ(h.attn_head_bytes, 1024);
}

TEST(PlanDsaKvPlan, HeadAdaptorTableA5Fp8) {
  for (const std::optional<std::string>& c :
       {std::optional<std::string>{}, std::optional<std::string>{"auto"}, std::optional<std::string>{"fp8"},
        std::optional<std::string>{"float8_e4m3fn"}}) {
    const AttnKvPlan p = plan_for(DeviceKind::A5, c);
    // fp8-e4m3, head 512 + 128 = 640
    EXPECT_EQ(p.attn_kv_dtype, KvDtype::FP8_E4M3);
    EXPECT_EQ(p.attn_head_dim, 512);
    EXPECT_EQ(p.attn_head_size, 640);
    EXPECT_EQ(p.attn_head_bytes, 640);
    EXPECT_EQ(p.kv_head_extra, 128);
    EXPECT_TRUE(p.fp8_kv_rows);
    // Indexer fp8 / fp32
    EXPECT_EQ(p.indexer_k_dtype, KvDtype::FP8_E4M3);
    EXPECT_EQ(p.indexer_k_scale_dtype, KvDtype::FP32);
    EXPECT_EQ(p.indexer_q_dtype, KvDtype::FP8_E4M3);
    EXPECT_EQ(p.indexer_q_scale_dtype, KvDtype::FP32);
    // flat slots, format 1
    EXPECT_EQ(p.slot_mapping_columns, 1);
    EXPECT_EQ(p.slot_format, SlotFormat::Flat);
    EXPECT_FALSE(p.requires_block_offset_slots);
    EXPECT_EQ(p.compressor_slot_format_code, 1);
    // kv_compress_epilog(group 64, MXFP8, round_scale, layout 1)
    EXPECT_EQ(p.kv_scatter, KvScatterKind::KvCompressEpilog);
    EXPECT_STREQ(to_string(p.kv_scatter), "kv_compress_epilog");
    EXPECT_EQ(p.epilog_quant_group_size, 64);
    EXPECT_EQ(p.epilog_quant_mode, 2);
    EXPECT_TRUE(p.epilog_round_scale);
    EXPECT_EQ(p.epilog_layout, 1);
    // indexer_compress_epilog_v2 with the full view, flat slots
    EXPECT_EQ(p.indexer_k_write, IndexerKWriteKind::CompressEpilogV2);
    EXPECT_EQ(p.indexer_slot_format, SlotFormat::Flat);
    EXPECT_TRUE(p.indexer_full_view);
    // LI prep fp32 / fp32
    EXPECT_EQ(p.li_weights_dtype, KvDtype::FP32);
    EXPECT_EQ(p.li_k_scale_dtype, KvDtype::FP32);
    EXPECT_EQ(p.q_norm, QNormKind::QNormWithoutWeight);
    // decode cu_seqlens_ori_kv = [0, cumsum(S)], cmp None
    EXPECT_EQ(p.decode_cu_seqlens_ori_kv, CuSeqlensKv::CumsumSeqLens);
    EXPECT_EQ(p.decode_cu_seqlens_cmp_kv, CuSeqlensKv::None);
    EXPECT_EQ(p.prefill_cu_seqlens_ori_kv, CuSeqlensKv::QueryStartLoc);
    EXPECT_EQ(p.prefill_cu_seqlens_cmp_kv, CuSeqlensKv::None);
    // extra kwargs dropped; kv-quant op with kv_quant_mode=1, tile 64, rope 64; no device
    EXPECT_FALSE(p.passes_cu_seqlens_kv_extras);
    EXPECT_STREQ(p.sparse_attn_op, "npu_kv_quant_sparse_attn_sharedkv");
    EXPECT_STREQ(p.sparse_attn_metadata_op, "npu_kv_quant_sparse_attn_sharedkv_metadata");
    EXPECT_STREQ(p.sparse_attn_op_library, "_C_ascend");
    EXPECT_TRUE(p.passes_kv_quant_kwargs);
    EXPECT_EQ(p.kv_quant_mode, 1);
    EXPECT_EQ(p.tile_size, 64);
    EXPECT_EQ(p.rope_head_dim, 64);
    EXPECT_FALSE(p.passes_device_kwarg);
    EXPECT_TRUE(p.compressor_weights_unquantised);
    // the MX-fp8 o_proj: the only plan that has it
    EXPECT_EQ(p.o_proj, OProjKind::MxFp8QuantBmm);
    // docs/design/dsa.md §4.2 "A5 other"
    EXPECT_EQ(p.sparse_attn, SparseAttnPath::KvQuantSharedKv);
    EXPECT_FALSE(p.uses_sparse_flash_mla);
    EXPECT_FALSE(p.renames_seqused_for_flash_mla);
    EXPECT_EQ(p.layout_kv, KvLayout::PA_ND);
  }
}

TEST(PlanDsaKvPlan, PrPlanTableA5Bf16) {
  for (const char* c : {"bfloat16", "bf16"}) {
    const AttnKvPlan p = plan_for(DeviceKind::A5, std::string(c));
    EXPECT_EQ(p.attn_kv_dtype, KvDtype::BF16);
    EXPECT_EQ(p.attn_head_size, 512);
    EXPECT_EQ(p.attn_head_bytes, 1024);
    EXPECT_EQ(p.kv_head_extra, 0);
    EXPECT_FALSE(p.fp8_kv_rows);
    // SparseFlashMla, PA_BBND
    EXPECT_TRUE(p.uses_sparse_flash_mla);
    EXPECT_EQ(p.sparse_attn, SparseAttnPath::SparseFlashMla);
    EXPECT_STREQ(p.sparse_attn_op, "sparse_flash_mla");
    EXPECT_STREQ(p.sparse_attn_metadata_op, "sparse_flash_mla_metadata");
    EXPECT_STREQ(p.sparse_attn_op_library, "cann_ops_transformer");
    EXPECT_EQ(p.layout_kv, KvLayout::PA_BBND);
    EXPECT_STREQ(to_string(p.layout_kv), "PA_BBND");
    // in-place npu_scatter_nd_update_ with [T,2] block/offset indices
    EXPECT_EQ(p.kv_scatter, KvScatterKind::ScatterNdUpdateInplace);
    EXPECT_STREQ(to_string(p.kv_scatter), "npu_scatter_nd_update_");
    EXPECT_EQ(p.slot_format, SlotFormat::BlockOffset);
    EXPECT_TRUE(p.requires_block_offset_slots);
    EXPECT_EQ(p.slot_mapping_columns, 2);
    EXPECT_EQ(p.compressor_slot_format_code, 2);
    // invalid = [-1, -1] (the PR's explicit where), not the floor split's (-1, bs-1)
    EXPECT_EQ(p.block_offset_skip, BlockOffsetSkip::MinusOne);
    EXPECT_STREQ(to_string(p.block_offset_skip), "MinusOne");
    EXPECT_EQ(p.epilog_quant_mode, 0);
    // The adapter drops kv_quant_mode / tile_size / rope_head_dim / device and renames seqused.
    EXPECT_FALSE(p.passes_kv_quant_kwargs);
    EXPECT_FALSE(p.passes_device_kwarg);
    EXPECT_TRUE(p.renames_seqused_for_flash_mla);
    // The indexer stays fp8 on A5 (independent of the attention dtype).
    EXPECT_EQ(p.indexer_k_dtype, KvDtype::FP8_E4M3);
    EXPECT_EQ(p.indexer_k_scale_dtype, KvDtype::FP32);
    EXPECT_EQ(p.indexer_k_write, IndexerKWriteKind::CompressEpilogV2);
    EXPECT_EQ(p.indexer_slot_format, SlotFormat::Flat);
    EXPECT_TRUE(p.indexer_full_view);
    // o_proj: the device allows the MX-fp8 one (as on the A5 fp8 plan); the layer takes it only for a
    // checkpoint with wo_a's MX scale (dsa/impl.h), so a BF16 checkpoint runs the grouped bmm
    EXPECT_EQ(p.o_proj, OProjKind::MxFp8QuantBmm);
    EXPECT_EQ(p.o_proj, plan_for(DeviceKind::A5, std::string("fp8")).o_proj);
    EXPECT_EQ(p.decode_cu_seqlens_ori_kv, CuSeqlensKv::CumsumSeqLens);
  }
}

// ------------------------------------------------ SparseFlashMla adapter (docs/design/dsa.md §4.2)

TEST(PlanDsaKvPlan, FlashMlaCmpLengthsMatchesTheDefinition) {
  const std::vector<int32_t> S = {0, 1, 3, 4, 5, 127, 128, 129, 1000, 16383, 16384, 16385};
  const int32_t max_s = 16385;
  for (int32_t r : {2, 4, 128}) {
    std::vector<int32_t> cmp(S.size() + 2, 777), res(S.size() + 2, 777);
    const int32_t max_cmp = flash_mla_cmp_lengths(S, max_s, r, cmp, res);
    for (std::size_t b = 0; b < S.size(); ++b) {
      // Definition by counting whole groups: largest q with q*r <= S.
      int32_t q = 0;
      while ((q + 1) * r <= S[b]) ++q;
      EXPECT_EQ(cmp[b], q) << "r=" << r << " S=" << S[b];
      EXPECT_EQ(res[b], S[b] - q * r) << "r=" << r << " S=" << S[b];
    }
    EXPECT_EQ(cmp[S.size()], 777);  // nothing past B
    EXPECT_EQ(res[S.size() + 1], 777);
    int32_t q = 0;
    while ((q + 1) * r <= max_s) ++q;
    EXPECT_EQ(max_cmp, q);
  }
  // Empty batch, zero max.
  std::vector<int32_t> none;
  EXPECT_EQ(flash_mla_cmp_lengths(none, 0, 4, none, none), 0);
}

TEST(PlanDsaKvPlan, FlashMlaCmpLengthsErrorsWriteNothing) {
  const std::vector<int32_t> S = {5, 9};
  std::vector<int32_t> cmp(2, 7), res(2, 7), small(1, 7);
  auto untouched = [&] {
    EXPECT_EQ(cmp, std::vector<int32_t>(2, 7));
    EXPECT_EQ(res, std::vector<int32_t>(2, 7));
    EXPECT_EQ(small, std::vector<int32_t>(1, 7));
  };
  EXPECT_INVALID(flash_mla_cmp_lengths(S, 9, 1, cmp, res), "cmp_ratio");
  EXPECT_INVALID(flash_mla_cmp_lengths(S, 9, 0, cmp, res), "cmp_ratio");
  EXPECT_INVALID(flash_mla_cmp_lengths(S, 9, -4, cmp, res), "cmp_ratio");
  EXPECT_INVALID(flash_mla_cmp_lengths(S, -1, 4, cmp, res), "max_seqlen_kv");
  EXPECT_INVALID(flash_mla_cmp_lengths(S, 8, 4, cmp, res), "seqused_kv[1] = 9");
  const std::vector<int32_t> neg = {5, -1};
  EXPECT_INVALID(flash_mla_cmp_lengths(neg, 9, 4, cmp, res), "seqused_kv[1] = -1");
  EXPECT_INVALID(flash_mla_cmp_lengths(S, 9, 4, small, res), "seqused_cmp_kv");
  EXPECT_INVALID(flash_mla_cmp_lengths(S, 9, 4, cmp, small), "cmp_residual_kv");
  untouched();
}

// ------------------------------------------------------------ docs/design/dsa.md §2.1 backends

TEST(PlanDsaBackendFacts, SixBackendDescriptors) {
  struct Row {
    DsaBackendKind kind;
    const char* name;
    std::vector<int32_t> a2a3, a5;
  };
  const Row rows[] = {
      {DsaBackendKind::Generic, "ASCEND_DSA", {2, 4, 8, 16, 32, 64, 128}, {2, 4, 8, 16, 32, 64, 128}},
      {DsaBackendKind::C4, "ASCEND_DSA_C4", {128, 256, 512}, {128, 256, 512}},
      {DsaBackendKind::C128, "ASCEND_DSA_C128", {4096, 8192, 16384}, {4096, 8192, 16384}},
      {DsaBackendKind::Swa, "ASCEND_DSA_SWA", {32, 64, 128}, {32, 64, 128}},
      {DsaBackendKind::C4State, "ASCEND_DSA_C4_STATE", {2, 4, 8}, {2, 4, 8}},
      {DsaBackendKind::C128State, "ASCEND_DSA_C128_STATE", {8, 16, 32}, {4, 8, 16}},
  };
  for (const Row& r : rows) {
    for (DeviceKind d : {DeviceKind::A2, DeviceKind::A3, DeviceKind::A5}) {
      const DsaBackendFacts f = dsa_backend(r.kind, d);
      EXPECT_STREQ(f.name, r.name);
      const std::vector<int32_t>& want = d == DeviceKind::A5 ? r.a5 : r.a2a3;
      const CSpan<int32_t> got = f.kernel_block_sizes();
      EXPECT_EQ(std::vector<int32_t>(got.begin(), got.end()), want) << r.name << " " << device_name(d);
      for (int64_t bs = 0; bs <= 20000; ++bs) {
        const bool in = std::find(want.begin(), want.end(), bs) != want.end();
        ASSERT_EQ(f.supports(bs), in) << r.name << " bs " << bs;
        if (!in && (bs % 512 == 3 || bs == 1 || bs == 256 || bs == 64)) {
          EXPECT_INVALID(check_kernel_block_size(r.kind, d, bs), std::string("block_size ") + std::to_string(bs));
        }
      }
      for (int32_t bs : want) check_kernel_block_size(r.kind, d, bs);
    }
  }
  // The logical C4 / C128 sizes are the physical 32/64/128 times the ratio.
  const DsaBackendFacts c4 = dsa_backend(DsaBackendKind::C4, DeviceKind::A2);
  const DsaBackendFacts c128 = dsa_backend(DsaBackendKind::C128, DeviceKind::A2);
  const DsaBackendFacts swa = dsa_backend(DsaBackendKind::Swa, DeviceKind::A2);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(c4.block_sizes[i], swa.block_sizes[i] * 4);
    EXPECT_EQ(c128.block_sizes[i], swa.block_sizes[i] * 128);
  }
  EXPECT_INVALID(check_kernel_block_size(DsaBackendKind::C128State, DeviceKind::A5, 32),
                 "ASCEND_DSA_C128_STATE on A5 (supported: 4, 8, 16)");
  EXPECT_INVALID(check_kernel_block_size(DsaBackendKind::C4, DeviceKind::A3, 128 * 3), "ASCEND_DSA_C4");
  EXPECT_NOT_SUPPORTED(dsa_backend(DsaBackendKind::Swa, DeviceKind::Ascend310P), "Ascend310P");
  EXPECT_INVALID(dsa_backend(static_cast<DsaBackendKind>(17), DeviceKind::A2), "DsaBackendKind");
}

// ------------------------------------------------------ docs/design/dsa.md §2.2 DSV4_BLOCK_SIZES

namespace {
struct TableRow {
  int32_t bs;
  int32_t mla, swa, c4s, c128s;
  int64_t t1, t2;
};
// docs/design/dsa.md §2.2, verbatim.
const TableRow kSpecA2A3[] = {{128, 128, 128, 8, 32, 16640, 131072},
                              {64, 64, 64, 4, 16, 8320, 65536},
                              {32, 32, 32, 2, 8, 4160, 32768}};
const TableRow kSpecA5[] = {{128, 128, 128, 8, 16, 16896, 81920},
                            {64, 64, 64, 4, 8, 8448, 40960},
                            {32, 32, 32, 2, 4, 4224, 20480}};
// docs/design/dsa.md §4.2 gives 131072 at 128 for A5 + BF16; 64 / 32 by the same rule (the bf16 SWA page).
const TableRow kA5Bf16[] = {{128, 128, 128, 8, 16, 16896, 131072},
                            {64, 64, 64, 4, 8, 8448, 65536},
                            {32, 32, 32, 2, 4, 4224, 32768}};

void expect_row(const Dsv4BlockSizes& g, const TableRow& r, const char* what) {
  EXPECT_EQ(g.cache_block_size, r.bs) << what;
  EXPECT_EQ(g.mla, r.mla) << what << " bs " << r.bs;
  EXPECT_EQ(g.swa, r.swa) << what << " bs " << r.bs;
  EXPECT_EQ(g.c4_state, r.c4s) << what << " bs " << r.bs;
  EXPECT_EQ(g.c128_state, r.c128s) << what << " bs " << r.bs;
  EXPECT_EQ(g.pad_t1, r.t1) << what << " bs " << r.bs;
  EXPECT_EQ(g.pad_t2, r.t2) << what << " bs " << r.bs;
}
}  // namespace

TEST(PlanDsaBackendFacts, Dsv4BlockSizesTable) {
  for (DeviceKind d : kA2A3) {
    const AttnKvPlan p = plan_for(d);
    EXPECT_EQ(geometry_class(p), Dsv4GeometryClass::A2A3);
    for (const TableRow& r : kSpecA2A3) expect_row(dsv4_block_sizes(r.bs, p), r, "A2/A3");
  }
  for (const char* c : {"auto", "fp8"}) {
    const AttnKvPlan p = plan_for(DeviceKind::A5, std::string(c));
    EXPECT_EQ(geometry_class(p), Dsv4GeometryClass::A5Fp8);
    for (const TableRow& r : kSpecA5) expect_row(dsv4_block_sizes(r.bs, p), r, "A5");
  }
  const AttnKvPlan b = plan_for(DeviceKind::A5, std::string("bfloat16"));
  EXPECT_EQ(geometry_class(b), Dsv4GeometryClass::A5Bf16);
  for (const TableRow& r : kA5Bf16) expect_row(dsv4_block_sizes(r.bs, b), r, "A5 bf16");
  EXPECT_EQ(dsv4_block_sizes(128, b).pad_t2, 131072);  // docs/design/dsa.md §4.2: A5 BF16 page pad
  // The state-backend lists contain the table's state sizes.
  for (const TableRow& r : kSpecA5) {
    EXPECT_TRUE(dsa_backend(DsaBackendKind::C128State, DeviceKind::A5).supports(r.c128s));
    EXPECT_TRUE(dsa_backend(DsaBackendKind::C4State, DeviceKind::A5).supports(r.c4s));
  }
  for (int64_t bad : {0, 16, 31, 96, 256, -128}) {
    EXPECT_INVALID(dsv4_block_sizes(bad, plan_for(DeviceKind::A2)),
                   std::string("cache_block_size must be 32, 64 or 128 (DSV4_BLOCK_SIZES), got ") +
                       std::to_string(bad));
  }
}

// ----------------------------------------------------------- docs/design/dsa.md §2.2 cache specs

TEST(PlanDsaBackendFacts, SpecRulesTableAtBlockSize128) {
  struct Row {
    DsaCacheKind kind;
    const char* backend;
    int64_t block_size;       // scheduler, raw tokens
    int64_t rows;             // storage rows per page
    int64_t head;             // A2/A3 (A5 in head_a5)
    int64_t head_a5;
    KvDtype dt_a2, dt_a5;
    int64_t scale_dim;
    KvDtype sc_a2, sc_a5;
    int64_t page_a2, page_a5;
    int64_t padded_a2, padded_a5;
    int64_t block_size_a5, rows_a5;
  };
  const KvDtype bf = KvDtype::BF16, f8 = KvDtype::FP8_E4M3, f32 = KvDtype::FP32, i8 = KvDtype::INT8,
                f16 = KvDtype::FP16;
  const Row rows[] = {
      {DsaCacheKind::Swa, "ASCEND_DSA_SWA", 128, 128, 512, 640, bf, f8, 0, f32, f32, 131072, 81920, 131072, 81920,
       128, 128},
      {DsaCacheKind::C4Kv, "ASCEND_DSA_C4", 512, 128, 512, 640, bf, f8, 0, f32, f32, 131072, 81920, 131072, 81920,
       512, 128},
      {DsaCacheKind::C128Kv, "ASCEND_DSA_C128", 16384, 128, 512, 640, bf, f8, 0, f32, f32, 131072, 81920, 131072,
       81920, 16384, 128},
      {DsaCacheKind::C4IndexerK, "ASCEND_DSA_C4", 512, 128, 128, 128, i8, f8, 1, f16, f32, 16640, 16896, 16640,
       16896, 512, 128},
      // 65536, padded to pad_t2
      {DsaCacheKind::C4AttnState, "ASCEND_DSA_C4_STATE", 8, 8, 2048, 2048, f32, f32, 0, f32, f32, 65536, 65536,
       131072, 81920, 8, 8},
      // 16384, padded to pad_t1
      {DsaCacheKind::C4IndexerState, "ASCEND_DSA_C4_STATE", 8, 8, 512, 512, f32, f32, 0, f32, f32, 16384, 16384,
       16640, 16896, 8, 8},
      // 131072 (A5: 65536, padded to 81920)
      {DsaCacheKind::C128State, "ASCEND_DSA_C128_STATE", 32, 32, 1024, 1024, f32, f32, 0, f32, f32, 131072, 65536,
       131072, 81920, 16, 16},
  };
  for (const Row& r : rows) {
    for (DeviceKind d : {DeviceKind::A2, DeviceKind::A3, DeviceKind::A5}) {
      const bool a5 = d == DeviceKind::A5;
      const DsaCacheSpec s = dsa_cache_spec(r.kind, 128, plan_for(d));
      const std::string what = std::string(to_string(r.kind)) + " on " + device_name(d);
      EXPECT_STREQ(s.backend, r.backend) << what;
      EXPECT_EQ(s.cache_block_size, 128) << what;
      EXPECT_EQ(s.block_size, a5 ? r.block_size_a5 : r.block_size) << what;
      EXPECT_EQ(s.storage_block_size, a5 ? r.rows_a5 : r.rows) << what;
      EXPECT_EQ(s.storage_block_size * std::max<int64_t>(s.compress_ratio, 1), s.block_size) << what;
      EXPECT_EQ(s.num_kv_heads, 1) << what;
      EXPECT_EQ(s.head_size, a5 ? r.head_a5 : r.head) << what;
      EXPECT_EQ(s.dtype, a5 ? r.dt_a5 : r.dt_a2) << what;
      EXPECT_EQ(s.scale_dim, r.scale_dim) << what;
      if (r.scale_dim) EXPECT_EQ(s.scale_dtype, a5 ? r.sc_a5 : r.sc_a2) << what;
      EXPECT_EQ(s.page_bytes, a5 ? r.page_a5 : r.page_a2) << what;
      EXPECT_EQ(s.padded_page_bytes, a5 ? r.padded_a5 : r.padded_a2) << what;
    }
  }
}

TEST(PlanDsaBackendFacts, EveryBlockSizeAndPlanFromFirstPrinciples) {
  struct PlanCase {
    AttnKvPlan plan;
    const TableRow* table;
  };
  const PlanCase cases[] = {{plan_for(DeviceKind::A2), kSpecA2A3},
                            {plan_for(DeviceKind::A3), kSpecA2A3},
                            {plan_for(DeviceKind::A5), kSpecA5},
                            {plan_for(DeviceKind::A5, std::string("bf16")), kA5Bf16}};
  const DsaCacheKind kinds[] = {DsaCacheKind::Swa,         DsaCacheKind::C4Kv,           DsaCacheKind::C128Kv,
                                DsaCacheKind::C4IndexerK,  DsaCacheKind::C4AttnState,    DsaCacheKind::C4IndexerState,
                                DsaCacheKind::C128State};
  for (const PlanCase& pc : cases) {
    const AttnKvPlan& p = pc.plan;
    const bool a5 = p.device == DeviceKind::A5;
    const bool fp8 = a5 && p.attn_kv_dtype == KvDtype::FP8_E4M3;
    for (int i = 0; i < 3; ++i) {
      const TableRow& t = pc.table[i];
      for (DsaCacheKind k : kinds) {
        const DsaCacheSpec s = dsa_cache_spec(k, t.bs, p);
        const std::string what = std::string(to_string(k)) + " " + device_name(p.device) + " " +
                                 to_string(p.attn_kv_dtype) + " bs " + std::to_string(t.bs);
        int64_t ratio = 1, rows = 0, head = 0, row_bytes = 0, tier = 0;
        switch (k) {
          case DsaCacheKind::Swa: rows = t.swa; head = fp8 ? 640 : 512; row_bytes = fp8 ? 640 : 1024; tier = t.t2; break;
          case DsaCacheKind::C4Kv: ratio = 4; rows = t.mla; head = fp8 ? 640 : 512; row_bytes = fp8 ? 640 : 1024; tier = t.t2; break;
          case DsaCacheKind::C128Kv: ratio = 128; rows = t.mla; head = fp8 ? 640 : 512; row_bytes = fp8 ? 640 : 1024; tier = t.t2; break;
          case DsaCacheKind::C4IndexerK: ratio = 4; rows = t.mla; head = 128; row_bytes = a5 ? 128 + 4 : 128 + 2; tier = t.t1; break;
          case DsaCacheKind::C4AttnState: rows = t.c4s; head = 2 * 2 * 512; row_bytes = head * 4; tier = t.t2; break;
          case DsaCacheKind::C4IndexerState: rows = t.c4s; head = 2 * 2 * 128; row_bytes = head * 4; tier = t.t1; break;
          case DsaCacheKind::C128State: rows = t.c128s; head = 2 * 1 * 512; row_bytes = head * 4; tier = t.t2; break;
        }
        EXPECT_EQ(s.compress_ratio, ratio) << what;
        EXPECT_EQ(s.block_size, rows * ratio) << what;
        EXPECT_EQ(s.storage_block_size, rows) << what;
        EXPECT_EQ(s.head_size, head) << what;
        EXPECT_EQ(s.page_bytes, rows * row_bytes) << what;
        EXPECT_EQ(s.padded_page_bytes, tier) << what;
        EXPECT_LE(s.page_bytes, s.padded_page_bytes) << what;
        EXPECT_TRUE(dsa_backend(backend_of(k), p.device).supports(s.block_size)) << what;
        // The tier sizes are the indexer K page and the SWA page exactly.
        if (k == DsaCacheKind::C4IndexerK) EXPECT_EQ(s.page_bytes, t.t1) << what;
        if (k == DsaCacheKind::Swa) EXPECT_EQ(s.page_bytes, t.t2) << what;
      }
    }
  }
}

TEST(PlanDsaBackendFacts, SlotFormatPerCacheGroup) {
  const AttnKvPlan a2 = plan_for(DeviceKind::A2), a5 = plan_for(DeviceKind::A5),
                   a5b = plan_for(DeviceKind::A5, std::string("bfloat16"));
  for (DsaCacheKind k : {DsaCacheKind::Swa, DsaCacheKind::C4Kv, DsaCacheKind::C128Kv, DsaCacheKind::C4AttnState,
                         DsaCacheKind::C4IndexerState, DsaCacheKind::C128State}) {
    EXPECT_EQ(slot_format_for(a2, k), SlotFormat::BlockOffset);
    EXPECT_EQ(slot_format_for(a5, k), SlotFormat::Flat);
    EXPECT_EQ(slot_format_for(a5b, k), SlotFormat::BlockOffset);
  }
  EXPECT_EQ(slot_format_for(a2, DsaCacheKind::C4IndexerK), SlotFormat::BlockOffset);
  EXPECT_EQ(slot_format_for(a5, DsaCacheKind::C4IndexerK), SlotFormat::Flat);
  EXPECT_EQ(slot_format_for(a5b, DsaCacheKind::C4IndexerK), SlotFormat::Flat);
  EXPECT_EQ(static_cast<int32_t>(SlotFormat::Flat), 1);
  EXPECT_EQ(static_cast<int32_t>(SlotFormat::BlockOffset), 2);
  EXPECT_STREQ(to_string(SlotFormat::BlockOffset), "BLOCK_OFFSET");
  EXPECT_INVALID(slot_format_for(a2, static_cast<DsaCacheKind>(11)), "DsaCacheKind");
}

TEST(PlanDsaBackendFacts, StorageBlockSizeAndErrors) {
  EXPECT_EQ(storage_block_size(512, 4), 128);
  EXPECT_EQ(storage_block_size(16384, 128), 128);
  EXPECT_EQ(storage_block_size(128, 1), 128);
  EXPECT_EQ(storage_block_size(128, 0), 128);
  EXPECT_INVALID(storage_block_size(130, 4), "block_size 130 is not a multiple of compress_ratio 4");
  EXPECT_INVALID(storage_block_size(4096, 3), "compress_ratio 3");
  EXPECT_INVALID(storage_block_size(0, 4), "block_size must be > 0");
  EXPECT_INVALID(storage_block_size(128, -4), "compress_ratio must be >= 0");
  const AttnKvPlan p = plan_for(DeviceKind::A2);
  EXPECT_INVALID(dsa_cache_spec(DsaCacheKind::Swa, 256, p), "cache_block_size");
  EXPECT_INVALID(dsa_cache_spec(DsaCacheKind::C4Kv, 16, p), "got 16");
  EXPECT_INVALID(dsa_cache_spec(static_cast<DsaCacheKind>(9), 128, p), "DsaCacheKind");
  AttnKvPlan bad = p;
  bad.device = DeviceKind::Ascend310P;
  EXPECT_NOT_SUPPORTED(dsa_cache_spec(DsaCacheKind::Swa, 128, bad), "Ascend310P");
  // A plan whose attention rows do not fit the tier is refused (the facts are checked, not trusted): fixed-width
  // rows wider than the table's tier.
  AttnKvPlan fat = p;
  fat.fp8_kv_rows = true;
  fat.attn_head_size = 1024;
  EXPECT_INVALID(dsa_cache_spec(DsaCacheKind::C4Kv, 128, fat), "does not fit its tier pad_t2 = 131072");
}

// ---------------------------------------------------------- shapes and views

TEST(PlanDsaBackendFacts, CacheShapesAndMainViews) {
  const int64_t nb = 7;
  for (DeviceKind d : {DeviceKind::A2, DeviceKind::A5}) {
    const AttnKvPlan p = plan_for(d);
    const DsaCacheSpec swa = dsa_cache_spec(DsaCacheKind::Swa, 64, p);
    const int64_t head = d == DeviceKind::A5 ? 640 : 512;
    EXPECT_EQ(dsa_kv_cache_shape(swa, nb), (std::vector<int64_t>{nb, 64, 1, head}));
    const DsaCacheView v = dsa_cache_view(swa, nb);
    EXPECT_EQ(v.dtype, p.attn_kv_dtype);
    EXPECT_EQ(v.shape, (std::vector<int64_t>{nb, 64, 1, head}));
    EXPECT_EQ(v.stride, (std::vector<int64_t>{swa.padded_page_bytes / element_size(v.dtype), head, head, 1}));
    EXPECT_EQ(v.storage_offset, 0);
    // A padded state page: the page stride is the tier, not the page.
    const DsaCacheSpec st = dsa_cache_spec(DsaCacheKind::C128State, 128, p);
    const DsaCacheView sv = dsa_cache_view(st, nb);
    // A state cache is the compressor's (nb, rows, 2 coff D).
    EXPECT_EQ(sv.shape, (std::vector<int64_t>{nb, st.storage_block_size, 1024}));
    EXPECT_EQ(dsa_kv_cache_shape(st, nb), sv.shape);
    EXPECT_EQ(sv.stride, (std::vector<int64_t>{(d == DeviceKind::A5 ? 81920 : 131072) / 4, 1024, 1}));
    // The last element of the view lies inside the raw buffer.
    int64_t last = sv.storage_offset;
    for (std::size_t i = 0; i < sv.shape.size(); ++i) last += (sv.shape[i] - 1) * sv.stride[i];
    EXPECT_LT((last + 1) * 4, nb * st.padded_page_bytes + 1);
    EXPECT_INVALID(dsa_scale_cache_shape(swa, nb), "has no scale");
    EXPECT_INVALID(dsa_kv_cache_shape(swa, -1), "num_blocks");
  }
  EXPECT_EQ(dsa_kv_cache_shape(dsa_cache_spec(DsaCacheKind::C4Kv, 128, plan_for(DeviceKind::A2)), 0),
            (std::vector<int64_t>{0, 128, 1, 512}));
}

TEST(PlanDsaBackendFacts, IndexerPageLayoutAndViews) {
  const int64_t nb = 3;
  for (DeviceKind d : {DeviceKind::A3, DeviceKind::A5}) {
    for (int64_t bs : {32, 64, 128}) {
      const AttnKvPlan p = plan_for(d);
      const bool a5 = d == DeviceKind::A5;
      const int64_t sc = a5 ? 4 : 2;
      const DsaCacheSpec s = dsa_cache_spec(DsaCacheKind::C4IndexerK, bs, p);
      const IndexerPageLayout l = dsa_indexer_page_layout(s, p);
      EXPECT_EQ(l.page_stride_bytes, bs * (128 + sc));
      EXPECT_EQ(l.k_offset_bytes, 0);
      EXPECT_EQ(l.k_row_bytes, 128);
      EXPECT_EQ(l.scale_offset_bytes, bs * 128);
      EXPECT_EQ(l.scale_row_bytes, sc);
      EXPECT_EQ(l.full_row_bytes, a5 ? 132 : 0);
      EXPECT_EQ(dsa_scale_cache_shape(s, nb), (std::vector<int64_t>{nb, bs, 1}));

      // Byte address of every k byte and every scale byte, through the views,
      // against the page layout [k rows][scales]: disjoint, in-page, covering.
      const DsaCacheView kv = dsa_cache_view(s, nb);
      const DsaCacheView sv = dsa_indexer_scale_view(s, nb);
      EXPECT_EQ(kv.dtype, p.indexer_k_dtype);
      EXPECT_EQ(sv.dtype, p.indexer_k_scale_dtype);
      std::vector<int> hits(static_cast<std::size_t>(nb * l.page_stride_bytes), 0);
      for (int64_t b = 0; b < nb; ++b) {
        for (int64_t r = 0; r < bs; ++r) {
          for (int64_t e = 0; e < 128; ++e) {
            const int64_t addr = kv.storage_offset + b * kv.stride[0] + r * kv.stride[1] + e * kv.stride[3];
            ASSERT_EQ(addr, b * l.page_stride_bytes + r * 128 + e);
            ++hits[addr];
          }
          const int64_t saddr = (sv.storage_offset + b * sv.stride[0] + r * sv.stride[1]) * sc;
          ASSERT_EQ(saddr, b * l.page_stride_bytes + bs * 128 + r * sc);
          for (int64_t e = 0; e < sc; ++e) ++hits[saddr + e];
        }
      }
      for (int h : hits) ASSERT_EQ(h, 1);  // the two views tile the page exactly

      if (a5) {
        const DsaCacheView fv = dsa_indexer_full_view(s, p, nb);
        EXPECT_EQ(fv.dtype, KvDtype::INT8);
        EXPECT_EQ(fv.shape, (std::vector<int64_t>{nb, bs, 1, 132}));
        EXPECT_EQ(fv.stride, (std::vector<int64_t>{l.page_stride_bytes, 132, 132, 1}));
        EXPECT_EQ(fv.storage_offset, 0);
        EXPECT_EQ(fv.shape[1] * fv.shape[3], l.page_stride_bytes);  // the full view spans k and scales of a page
      } else {
        EXPECT_INVALID(dsa_indexer_full_view(s, p, nb), "has no full indexer view");
      }
    }
  }
  const AttnKvPlan p = plan_for(DeviceKind::A5);
  const DsaCacheSpec swa = dsa_cache_spec(DsaCacheKind::Swa, 128, p);
  EXPECT_INVALID(dsa_indexer_scale_view(swa, 1), "not the C4 indexer K cache");
  EXPECT_INVALID(dsa_indexer_full_view(swa, p, 1), "not the C4 indexer K cache");
  EXPECT_INVALID(dsa_indexer_page_layout(swa, p), "not the C4 indexer K cache");
}

TEST(PlanDsaBackendFacts, ViewsRefuseGeometryThatDoesNotDivide) {
  const AttnKvPlan p = plan_for(DeviceKind::A5);
  DsaCacheSpec s = dsa_cache_spec(DsaCacheKind::C4IndexerK, 128, p);
  s.padded_page_bytes = 16898;  // not a whole number of fp32 scales
  EXPECT_INVALID(dsa_indexer_scale_view(s, 1), "page stride of 16898 bytes is not a whole number of float32");
  DsaCacheSpec st = dsa_cache_spec(DsaCacheKind::C4AttnState, 128, p);
  st.padded_page_bytes = 81922;
  EXPECT_INVALID(dsa_cache_view(st, 1), "not a whole number of float32");
  DsaCacheSpec k = dsa_cache_spec(DsaCacheKind::C4IndexerK, 128, p);
  k.storage_block_size = 127;
  k.head_size = 129;  // k rows end at a byte offset that is no fp32 boundary
  EXPECT_INVALID(dsa_indexer_scale_view(k, 1), "scale offset");
}

// A model of other dims (item 14 of issue 26: the caches of a non-production
// model from the runtime): every kind's spec follows the dims, the tiers are
// the largest page of their kinds, the views tile num_blocks pages.
TEST(PlanDsaBackendFacts, CacheSpecsOfAModelOfOtherDims) {
  DsaCacheDims dims;
  dims.head_dim = 64;
  dims.rope_dim = 16;
  dims.index_head_dim = 32;
  EXPECT_FALSE(dims.is_dsv4());
  EXPECT_TRUE(DsaCacheDims().is_dsv4());
  for (DeviceKind d : {DeviceKind::A2, DeviceKind::A5}) {
    const AttnKvPlan p = plan_for(d, d == DeviceKind::A5 ? std::optional<std::string>("bfloat16") : std::nullopt);
    const int64_t nb = 5;
    const int64_t sc = d == DeviceKind::A5 ? 4 : 2;  // fp32 / fp16 indexer scales
    int64_t tier[3] = {0, 0, 0};
    struct Want {
      DsaCacheKind kind;
      std::vector<int64_t> shape;
      int64_t row_bytes;
    };
    const int64_t c4s = 2, c128s = d == DeviceKind::A5 ? 4 : 8;  // state rows at cache block size 32
    const Want wants[] = {
        {DsaCacheKind::Swa, {nb, 32, 1, 64}, 64 * 2},
        {DsaCacheKind::C4Kv, {nb, 32, 1, 64}, 64 * 2},
        {DsaCacheKind::C128Kv, {nb, 32, 1, 64}, 64 * 2},
        {DsaCacheKind::C4IndexerK, {nb, 32, 1, 32}, 32 + sc},
        {DsaCacheKind::C4AttnState, {nb, c4s, 2 * 2 * 64}, 2 * 2 * 64 * 4},
        {DsaCacheKind::C4IndexerState, {nb, c4s, 2 * 2 * 32}, 2 * 2 * 32 * 4},
        {DsaCacheKind::C128State, {nb, c128s, 2 * 64}, 2 * 64 * 4},
    };
    for (const Want& w : wants) {
      const DsaCacheSpec s = dsa_cache_spec(w.kind, 32, p, dims);
      EXPECT_EQ(dsa_kv_cache_shape(s, nb), w.shape) << to_string(w.kind);
      EXPECT_EQ(s.page_bytes, w.shape[1] * w.row_bytes) << to_string(w.kind);
      tier[s.pad_tier] = std::max(tier[s.pad_tier], s.page_bytes);
    }
    for (const Want& w : wants) {
      const DsaCacheSpec s = dsa_cache_spec(w.kind, 32, p, dims);
      EXPECT_EQ(s.padded_page_bytes, tier[s.pad_tier]) << to_string(w.kind);
      const DsaCacheView v = dsa_cache_view(s, nb);
      EXPECT_EQ(v.shape, w.shape);
      int64_t last = v.storage_offset;
      for (std::size_t i = 0; i < v.shape.size(); ++i) last += (v.shape[i] - 1) * v.stride[i];
      EXPECT_LE((last + 1) * element_size(v.dtype), nb * s.padded_page_bytes) << to_string(w.kind);
    }
    EXPECT_EQ(tier[2], 32 * 64 * 2);  // the SWA page, as at DeepSeek-V4's dims
  }
  // The fp8 rows hold D 512 / R 64 only; bad dims are named.
  const AttnKvPlan a5 = plan_for(DeviceKind::A5);
  EXPECT_INVALID(dsa_cache_spec(DsaCacheKind::Swa, 32, a5, dims), "640-byte fp8 rows hold head_dim 512 and rope_dim 64");
  DsaCacheDims bad = dims;
  bad.head_dim = 0;
  EXPECT_INVALID(dsa_cache_spec(DsaCacheKind::Swa, 32, plan_for(DeviceKind::A2), bad), "head_dim must be positive");
  bad = dims;
  bad.rope_dim = 15;
  EXPECT_INVALID(dsa_cache_spec(DsaCacheKind::Swa, 32, plan_for(DeviceKind::A2), bad), "rope_dim=15");
  bad = dims;
  bad.index_head_dim = -2;
  EXPECT_INVALID(dsa_cache_spec(DsaCacheKind::C4IndexerK, 32, plan_for(DeviceKind::A2), bad), "index_head_dim");
}

TEST(PlanDsaBackendFacts, LayerRatiosAndTheirCaches) {
  for (int64_t r : {0, 2, 3, 8, 64, -1, 256}) {
    EXPECT_INVALID(check_compress_ratio(r), "compress_ratio=" + std::to_string(r) +
                                                " is not a DSA layer ratio: the supported ones are 1 (sliding "
                                                "window only), 4 (C4) and 128 (C128)");
    EXPECT_INVALID(layer_cache_kinds(r), "compress_ratio=" + std::to_string(r));
  }
  EXPECT_EQ(layer_cache_kinds(1), (std::vector<DsaCacheKind>{DsaCacheKind::Swa}));
  EXPECT_EQ(layer_cache_kinds(128),
            (std::vector<DsaCacheKind>{DsaCacheKind::Swa, DsaCacheKind::C128Kv, DsaCacheKind::C128State}));
  EXPECT_EQ(layer_cache_kinds(4),
            (std::vector<DsaCacheKind>{DsaCacheKind::Swa, DsaCacheKind::C4Kv, DsaCacheKind::C4AttnState,
                                       DsaCacheKind::C4IndexerK, DsaCacheKind::C4IndexerState}));
}
