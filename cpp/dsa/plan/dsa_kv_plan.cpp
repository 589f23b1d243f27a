// The DSA attention-KV plan (docs/design/dsa.md §4.1, §4.2): the one place that
// turns the device kind into decisions.
#include "ascend_attn_rt/dsa/plan/dsa_kv_plan.h"

#include <limits>

#include "ascend_attn_rt/errors.h"

namespace aar::dsa {

const char* to_string(KvDtype d) {
  switch (d) {
    case KvDtype::BF16: return "bfloat16";
    case KvDtype::FP16: return "float16";
    case KvDtype::FP32: return "float32";
    case KvDtype::INT8: return "int8";
    case KvDtype::FP8_E4M3: return "float8_e4m3fn";
  }
  return "<invalid KvDtype>";
}

int64_t element_size(KvDtype d) {
  switch (d) {
    case KvDtype::BF16:
    case KvDtype::FP16: return 2;
    case KvDtype::FP32: return 4;
    case KvDtype::INT8:
    case KvDtype::FP8_E4M3: return 1;
  }
  throw_invalid("element_size: dtype is not a KvDtype (value ", static_cast<int32_t>(d), ")");
}

const char* device_name(DeviceKind d) {
  switch (d) {
    case DeviceKind::A2: return "A2";
    case DeviceKind::A3: return "A3";
    case DeviceKind::A5: return "A5";
    case DeviceKind::Ascend310P: return "Ascend310P";
  }
  return "<invalid DeviceKind>";
}

void check_dsa_device(DeviceKind d) {
  switch (d) {
    case DeviceKind::A2:
    case DeviceKind::A3:
    case DeviceKind::A5: return;
    case DeviceKind::Ascend310P:
      throw_not_supported("DSA (DeepSeek-V4): device Ascend310P is not supported (DSA runs on A2, A3 and A5)");
  }
  throw_invalid("DSA (DeepSeek-V4): device is not a DeviceKind (value ", static_cast<int32_t>(d), ")");
}

const char* to_string(SparseAttnPath p) {
  switch (p) {
    case SparseAttnPath::SharedKv: return "SharedKv";
    case SparseAttnPath::KvQuantSharedKv: return "KvQuantSharedKv";
    case SparseAttnPath::SparseFlashMla: return "SparseFlashMla";
  }
  return "<invalid SparseAttnPath>";
}

const char* to_string(KvLayout l) {
  switch (l) {
    case KvLayout::PA_ND: return "PA_ND";
    case KvLayout::PA_BBND: return "PA_BBND";
  }
  return "<invalid KvLayout>";
}

const char* to_string(SlotFormat f) {
  switch (f) {
    case SlotFormat::Flat: return "FLAT";
    case SlotFormat::BlockOffset: return "BLOCK_OFFSET";
  }
  return "<invalid SlotFormat>";
}

const char* to_string(BlockOffsetSkip s) {
  switch (s) {
    case BlockOffsetSkip::LastOffset: return "LastOffset";
    case BlockOffsetSkip::MinusOne: return "MinusOne";
  }
  return "<invalid BlockOffsetSkip>";
}

const char* to_string(KvScatterKind k) {
  switch (k) {
    case KvScatterKind::ScatterNdUpdateV2: return "npu_scatter_nd_update_v2";
    case KvScatterKind::KvCompressEpilog: return "kv_compress_epilog";
    case KvScatterKind::ScatterNdUpdateInplace: return "npu_scatter_nd_update_";
  }
  return "<invalid KvScatterKind>";
}

const char* to_string(IndexerKWriteKind k) {
  switch (k) {
    case IndexerKWriteKind::QuantThenScatter: return "QuantThenScatter";
    case IndexerKWriteKind::CompressEpilogV2: return "indexer_compress_epilog_v2";
  }
  return "<invalid IndexerKWriteKind>";
}

const char* to_string(OProjKind k) {
  switch (k) {
    case OProjKind::Bmm: return "Bmm";
    case OProjKind::MxFp8QuantBmm: return "MxFp8QuantBmm";
  }
  return "<invalid OProjKind>";
}

const char* to_string(QNormKind k) {
  switch (k) {
    case QNormKind::RmsFp32: return "RmsFp32";
    case QNormKind::QNormWithoutWeight: return "QNormWithoutWeight";
  }
  return "<invalid QNormKind>";
}

const char* to_string(CuSeqlensKv c) {
  switch (c) {
    case CuSeqlensKv::None: return "None";
    case CuSeqlensKv::EmptyTensor: return "EmptyTensor";
    case CuSeqlensKv::QueryStartLoc: return "QueryStartLoc";
    case CuSeqlensKv::CumsumSeqLens: return "CumsumSeqLens";
  }
  return "<invalid CuSeqlensKv>";
}

namespace {

enum class CacheDtypeRequest { Auto, Bf16, Fp8 };

CacheDtypeRequest parse_cache_dtype(const std::optional<std::string>& s) {
  if (!s) return CacheDtypeRequest::Auto;
  const std::string& v = *s;
  if (v == "auto") return CacheDtypeRequest::Auto;
  if (v == "bfloat16" || v == "bf16") return CacheDtypeRequest::Bf16;
  if (v == "fp8" || v == "fp8_e4m3" || v == "float8_e4m3fn") return CacheDtypeRequest::Fp8;
  throw_invalid("DSA: cache_dtype '", v,
                "' is not supported (accepted: none, 'auto', 'bfloat16', 'bf16', 'fp8', 'fp8_e4m3', "
                "'float8_e4m3fn')");
}

}  // namespace

KvDtype resolve_attn_kv_dtype(DeviceKind device, const std::optional<std::string>& cache_dtype,
                              KvDtype non_a5_dtype) {
  check_dsa_device(device);
  AAR_CHECK_ARG(non_a5_dtype == KvDtype::BF16 || non_a5_dtype == KvDtype::FP16,
                "DSA: non_a5_dtype (the model dtype) must be bfloat16 or float16, got ", to_string(non_a5_dtype));
  const CacheDtypeRequest req = parse_cache_dtype(cache_dtype);  // validated on every device
  if (device != DeviceKind::A5) return non_a5_dtype;
  return req == CacheDtypeRequest::Bf16 ? KvDtype::BF16 : KvDtype::FP8_E4M3;
}

AttnKvPlan make_attn_kv_plan(const DsaConfig& cfg) {
  const KvDtype attn = resolve_attn_kv_dtype(cfg.device, cfg.cache_dtype, cfg.model_dtype);
  AttnKvPlan p;
  p.device = cfg.device;
  p.attn_kv_dtype = attn;
  p.attn_head_dim = kDsaHeadDim;

  const bool a5 = cfg.device == DeviceKind::A5;
  if (!a5) {
    // docs/design/dsa.md §4.1 base column / §4.2 "base" plan: the defaults of AttnKvPlan are
    // the base plan; set them explicitly so the table reads here.
    p.attn_head_size = kDsaHeadDim;
    p.attn_head_bytes = kDsaHeadDim * element_size(attn);
    p.kv_head_extra = 0;
    p.fp8_kv_rows = false;
    p.indexer_k_dtype = KvDtype::INT8;
    p.indexer_k_scale_dtype = KvDtype::FP16;
    p.indexer_q_dtype = KvDtype::INT8;
    p.indexer_q_scale_dtype = KvDtype::FP16;
    p.li_weights_dtype = KvDtype::FP16;
    p.li_k_scale_dtype = KvDtype::FP16;
    p.indexer_k_write = IndexerKWriteKind::QuantThenScatter;
    p.indexer_slot_format = SlotFormat::BlockOffset;
    p.indexer_full_view = false;
    p.sparse_attn = SparseAttnPath::SharedKv;
    p.uses_sparse_flash_mla = false;
    p.sparse_attn_op = "npu_sparse_attn_sharedkv";
    p.sparse_attn_metadata_op = "npu_sparse_attn_sharedkv_metadata";
    p.sparse_attn_op_library = "_C_ascend";
    p.layout_kv = KvLayout::PA_ND;
    p.passes_kv_quant_kwargs = false;
    p.passes_device_kwarg = true;
    p.passes_cu_seqlens_kv_extras = true;
    p.renames_seqused_for_flash_mla = false;
    p.decode_cu_seqlens_ori_kv = CuSeqlensKv::EmptyTensor;
    p.decode_cu_seqlens_cmp_kv = CuSeqlensKv::EmptyTensor;
    p.slot_format = SlotFormat::BlockOffset;
    p.block_offset_skip = BlockOffsetSkip::LastOffset;
    p.kv_scatter = KvScatterKind::ScatterNdUpdateV2;
    p.q_norm = QNormKind::RmsFp32;
    p.compressor_weights_unquantised = false;
    p.o_proj = OProjKind::Bmm;
  } else {
    // Everything both A5 plans share (docs/design/dsa.md §4.1 A5 column).
    p.indexer_k_dtype = KvDtype::FP8_E4M3;
    p.indexer_k_scale_dtype = KvDtype::FP32;
    p.indexer_q_dtype = KvDtype::FP8_E4M3;
    p.indexer_q_scale_dtype = KvDtype::FP32;
    p.li_weights_dtype = KvDtype::FP32;
    p.li_k_scale_dtype = KvDtype::FP32;
    p.indexer_k_write = IndexerKWriteKind::CompressEpilogV2;
    p.indexer_slot_format = SlotFormat::Flat;
    p.indexer_full_view = true;
    p.passes_device_kwarg = false;
    p.passes_cu_seqlens_kv_extras = false;
    p.decode_cu_seqlens_ori_kv = CuSeqlensKv::CumsumSeqLens;
    p.decode_cu_seqlens_cmp_kv = CuSeqlensKv::None;
    p.q_norm = QNormKind::QNormWithoutWeight;
    p.compressor_weights_unquantised = true;
    if (attn == KvDtype::BF16) {
      // docs/design/dsa.md §4.2 "A5 + BF16": SparseFlashMla over bf16 rows of 512.
      p.attn_head_size = kDsaHeadDim;
      p.attn_head_bytes = kDsaHeadDim * element_size(attn);
      p.kv_head_extra = 0;
      p.fp8_kv_rows = false;
      p.sparse_attn = SparseAttnPath::SparseFlashMla;
      p.uses_sparse_flash_mla = true;
      p.sparse_attn_op = "sparse_flash_mla";
      p.sparse_attn_metadata_op = "sparse_flash_mla_metadata";  // schema: third_party/cann_ops_transformer_ops.txt
      p.sparse_attn_op_library = "cann_ops_transformer";
      p.layout_kv = KvLayout::PA_BBND;
      p.passes_kv_quant_kwargs = false;
      p.renames_seqused_for_flash_mla = true;
      p.slot_format = SlotFormat::BlockOffset;
      p.block_offset_skip = BlockOffsetSkip::MinusOne;  // docs/design/dsa.md §4.2: invalid = [-1, -1]
      p.kv_scatter = KvScatterKind::ScatterNdUpdateInplace;
      // The o_proj the device allows (upstream's FP8_ATTENTION capability is
      // the A5's, whatever the cache dtype): dsa::Impl takes the MX-fp8 path
      // only when the checkpoint carries wo_a's MX scale; a BF16 checkpoint
      // (the usual A5 + BF16-cache deployment) runs the grouped bmm.
      p.o_proj = OProjKind::MxFp8QuantBmm;
    } else {
      // docs/design/dsa.md §4.1 A5 column / §4.2 "A5 other": 640-byte MXFP8 rows.
      p.attn_head_size = Fp8KvRowLayout::kRowBytes;
      p.attn_head_bytes = Fp8KvRowLayout::kRowBytes * element_size(attn);
      p.kv_head_extra = Fp8KvRowLayout::kRowBytes - kDsaHeadDim;
      p.fp8_kv_rows = true;
      p.sparse_attn = SparseAttnPath::KvQuantSharedKv;
      p.uses_sparse_flash_mla = false;
      p.sparse_attn_op = "npu_kv_quant_sparse_attn_sharedkv";
      p.sparse_attn_metadata_op = "npu_kv_quant_sparse_attn_sharedkv_metadata";
      p.sparse_attn_op_library = "_C_ascend";
      p.layout_kv = KvLayout::PA_ND;
      p.passes_kv_quant_kwargs = true;
      p.kv_quant_mode = 1;
      p.tile_size = Fp8KvRowLayout::kQuantGroup;
      p.rope_head_dim = Fp8KvRowLayout::kRopeDims;
      p.renames_seqused_for_flash_mla = false;
      p.slot_format = SlotFormat::Flat;
      p.block_offset_skip = BlockOffsetSkip::LastOffset;  // unused: flat slots
      p.kv_scatter = KvScatterKind::KvCompressEpilog;
      p.o_proj = OProjKind::MxFp8QuantBmm;
      p.epilog_quant_group_size = Fp8KvRowLayout::kQuantGroup;
      p.epilog_quant_mode = 2;  // MXFP8
      p.epilog_round_scale = true;
      p.epilog_layout = 1;
    }
  }
  p.prefill_cu_seqlens_ori_kv = CuSeqlensKv::QueryStartLoc;
  p.prefill_cu_seqlens_cmp_kv = CuSeqlensKv::None;
  p.requires_block_offset_slots = p.slot_format == SlotFormat::BlockOffset;
  p.compressor_slot_format_code = static_cast<int32_t>(p.slot_format);
  p.slot_mapping_columns = p.requires_block_offset_slots ? 2 : 1;
  return p;
}

int32_t flash_mla_cmp_lengths(CSpan<int32_t> seqused_kv, int32_t max_seqlen_kv, int32_t cmp_ratio,
                              Span<int32_t> seqused_cmp_kv, Span<int32_t> cmp_residual_kv) {
  AAR_CHECK_ARG(cmp_ratio >= 2, "flash_mla_cmp_lengths: cmp_ratio must be >= 2 (the adapter derives compressed ",
                "lengths only for compressed layers), got ", cmp_ratio);
  AAR_CHECK_ARG(max_seqlen_kv >= 0, "flash_mla_cmp_lengths: max_seqlen_kv must be >= 0, got ", max_seqlen_kv);
  const std::size_t n = seqused_kv.size();
  AAR_CHECK_ARG(seqused_cmp_kv.size() >= n, "flash_mla_cmp_lengths: seqused_cmp_kv has room for ",
                seqused_cmp_kv.size(), " entries, needs ", n);
  AAR_CHECK_ARG(cmp_residual_kv.size() >= n, "flash_mla_cmp_lengths: cmp_residual_kv has room for ",
                cmp_residual_kv.size(), " entries, needs ", n);
  for (std::size_t b = 0; b < n; ++b) {
    const int32_t s = seqused_kv[b];
    AAR_CHECK_ARG(s >= 0 && s <= max_seqlen_kv, "flash_mla_cmp_lengths: seqused_kv[", b, "] = ", s,
                  " must be in [0, max_seqlen_kv = ", max_seqlen_kv, "]");
  }
  for (std::size_t b = 0; b < n; ++b) {
    const int32_t s = seqused_kv[b];
    seqused_cmp_kv[b] = s / cmp_ratio;
    cmp_residual_kv[b] = s % cmp_ratio;
  }
  return max_seqlen_kv / cmp_ratio;
}

}  // namespace aar::dsa
