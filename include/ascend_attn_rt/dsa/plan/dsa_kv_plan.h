// The DeepSeek-V4 ("DSA") attention-KV plan: every per-device decision of the DSA
// backend (KV dtypes and row layouts, slot formats and skip encodings, scatter and
// indexer write kinds, the sparse-attention operator and its metadata arguments,
// the o_proj the device allows), made once by make_attn_kv_plan and read everywhere
// else: no other DSA code branches on the device kind. Torch-free.
// Design: docs/design/dsa.md §4.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "ascend_attn_rt/dsa/plan/dsa_step_plan.h"
#include "ascend_attn_rt/plan/span.h"
#include "ascend_attn_rt/plan/workspace.h"  // plan::DeviceKind

namespace aar::dsa {

using plan::CSpan;
using plan::DeviceKind;
using plan::Span;

// Torch-free element types of the DSA caches and kernel inputs.
enum class KvDtype : int32_t { BF16 = 0, FP16 = 1, FP32 = 2, INT8 = 3, FP8_E4M3 = 4 };
const char* to_string(KvDtype d);  // "bfloat16", "float16", "float32", "int8", "float8_e4m3fn"
int64_t element_size(KvDtype d);   // bytes: 2, 2, 4, 1, 1

// "A2", "A3", "A5", "Ascend310P". Not to_string: an aar::plan::to_string(DeviceKind)
// added later would make unqualified calls here ambiguous (ADL).
const char* device_name(DeviceKind d);

// Throws NotSupported naming the device unless DSA runs on it (A2, A3, A5);
// InvalidArgument for a value outside the enum.
void check_dsa_device(DeviceKind d);

// docs/design/dsa.md §4.2, dsv4_resolve_attn_kv_dtype: the attention (SWA and compressed)
// KV dtype. Never mutates anything (HEAD's A5 path rewrote
// cache_config.cache_dtype; this takes values).
//   device   cache_dtype                              result
//   A2/A3    any accepted value, or none              non_a5_dtype
//   A5       none, "auto"                             FP8_E4M3
//   A5       "bfloat16", "bf16"                       BF16
//   A5       "fp8", "fp8_e4m3", "float8_e4m3fn"       FP8_E4M3
// Accepted strings are exactly those above (case-sensitive); any other is an
// InvalidArgument naming cache_dtype. non_a5_dtype must be BF16 or FP16.
KvDtype resolve_attn_kv_dtype(DeviceKind device, const std::optional<std::string>& cache_dtype,
                              KvDtype non_a5_dtype);

// Which attention kernel family a plan uses.
enum class SparseAttnPath : int32_t {
  SharedKv = 0,         // _C_ascend::npu_sparse_attn_sharedkv (A2/A3)
  KvQuantSharedKv = 1,  // _C_ascend::npu_kv_quant_sparse_attn_sharedkv (A5, fp8 rows)
  SparseFlashMla = 2,   // CANN SparseFlashMla (A5, bf16 rows)
};
const char* to_string(SparseAttnPath p);

enum class KvLayout : int32_t { PA_ND = 0, PA_BBND = 1 };
const char* to_string(KvLayout l);  // "PA_ND", "PA_BBND": the layout_kv string the kernels take

// Slot-mapping format: the plan layer's (plan/dsa_step_plan.h; the numeric
// values are compressor_metadata's slot_mapping_format codes, docs/design/dsa.md §2.2, §4.1).
// Scheduler slots are formatted by plan::format_dsa_slot_mapping (negative
// slots -> -1 / (-1, bs-1) or (-1, -1): every consumer skips on block < 0).
using plan::SlotFormat;
const char* to_string(SlotFormat f);
using plan::BlockOffsetSkip;
const char* to_string(BlockOffsetSkip s);  // "LastOffset" (-1, bs-1), "MinusOne" (-1, -1)

// How new KV rows reach the SWA and compressed caches (docs/design/dsa.md §4.1, §4.2).
enum class KvScatterKind : int32_t {
  ScatterNdUpdateV2 = 0,       // npu_scatter_nd_update_v2(cache, idx [N,2], x)
  KvCompressEpilog = 1,        // kv_compress_epilog(cache.view(-1,1,640), x_bf16, flat slots, ...): quantise + scatter
  // In-place npu_scatter_nd_update_(cache, idx [V,2], x [V,1,D]) over the V
  // valid rows only (the kernel does not support out-of-range indices).
  ScatterNdUpdateInplace = 2,
};
const char* to_string(KvScatterKind k);

// How the indexer k rows (and their scales) are written (docs/design/dsa.md §4.1).
enum class IndexerKWriteKind : int32_t {
  QuantThenScatter = 0,  // dynamic_quant int8, scatter k, then scatter the fp16 scale (4-D)
  CompressEpilogV2 = 1,  // indexer_compress_epilog_v2(full byte view, x, slots, layout 2): quant + both writes
};
const char* to_string(IndexerKWriteKind k);

// As a plan field: the o_proj the device allows (MxFp8QuantBmm on both A5
// plans, upstream's FP8_ATTENTION hardware capability). dsa::Impl takes it
// only when the checkpoint has wo_a's MX scale, else Bmm (dsa/impl.h).
enum class OProjKind : int32_t {
  Bmm = 0,            // transpose-bmm with wo_a (or the OTP / olora variants), then wo_b
  MxFp8QuantBmm = 1,  // npu_dynamic_mx_quant fp8, quantised transpose-bmm with wo_a (group 32), then wo_b
};
const char* to_string(OProjKind k);

// The weightless per-head q RMS norm (docs/design/dsa.md §1.1, §4.1).
enum class QNormKind : int32_t {
  RmsFp32 = 0,               // Triton q_rms or fp32 torch (A2/A3)
  QNormWithoutWeight = 1,    // the q_norm_without_weight module (A5)
};
const char* to_string(QNormKind k);

// What the SAS metadata op gets as cu_seqlens_ori_kv / cu_seqlens_cmp_kv.
enum class CuSeqlensKv : int32_t {
  None = 0,           // not passed
  EmptyTensor = 1,    // the builder's empty tensor
  QueryStartLoc = 2,  // [0, cu_q...] (prefill)
  CumsumSeqLens = 3,  // [0, cumsum(S)] (cached per key)
};
const char* to_string(CuSeqlensKv c);

// A5's 640-byte MXFP8 KV row (docs/design/dsa.md §1.4): [448 fp8 nope | 64 bf16 rope |
// 7 e8m0 scales, one per 64 nope elements | 57 pad].
struct Fp8KvRowLayout {
  static constexpr int64_t kNopeDims = 448;
  static constexpr int64_t kRopeDims = 64;
  static constexpr int64_t kNopeOffset = 0;
  static constexpr int64_t kNopeBytes = 448;  // fp8
  static constexpr int64_t kRopeOffset = 448;
  static constexpr int64_t kRopeBytes = 128;  // 64 bf16
  static constexpr int64_t kScaleOffset = 576;
  static constexpr int64_t kQuantGroup = 64;
  static constexpr int64_t kScaleBytes = 7;  // e8m0, kNopeDims / kQuantGroup
  static constexpr int64_t kPadOffset = 583;
  static constexpr int64_t kPadBytes = 57;
  static constexpr int64_t kRowBytes = 640;
};

// DSV4 attention geometry the plan's numbers are built on (docs/design/dsa.md §1.1).
inline constexpr int64_t kDsaHeadDim = 512;        // nope 448 + rope 64
inline constexpr int64_t kDsaRopeDim = 64;
inline constexpr int64_t kDsaIndexerHeadDim = 128;
inline constexpr int64_t kDsaIndexerHeads = 64;

struct DsaConfig {
  DeviceKind device = DeviceKind::A2;
  std::optional<std::string> cache_dtype;  // the engine's cache_config.cache_dtype; nullopt = not set
  KvDtype model_dtype = KvDtype::BF16;     // non_a5_dtype of docs/design/dsa.md §4.2: the attention KV dtype off A5
};

// Everything of docs/design/dsa.md §4.1 / §4.2, decided once. Plain data: copy it freely.
struct AttnKvPlan {
  DeviceKind device = DeviceKind::A2;

  // ---- attention KV (SWA and compressed caches)
  KvDtype attn_kv_dtype = KvDtype::BF16;
  int64_t attn_head_dim = kDsaHeadDim;  // logical dims per row (512)
  int64_t attn_head_size = 512;         // entries of the cache's last dim, in attn_kv_dtype (512, or 640 fp8 bytes)
  int64_t attn_head_bytes = 1024;       // bytes per row: 1024 (bf16) or 640 (MXFP8)
  int64_t kv_head_extra = 0;            // pack_kv_head_dim_extra: attn_head_size - 512 (128 on A5 fp8)
  bool fp8_kv_rows = false;             // rows follow Fp8KvRowLayout

  // ---- indexer (C4 layers)
  KvDtype indexer_k_dtype = KvDtype::INT8;
  KvDtype indexer_k_scale_dtype = KvDtype::FP16;  // one scale per k row
  KvDtype indexer_q_dtype = KvDtype::INT8;        // per (token, head) quantised query
  KvDtype indexer_q_scale_dtype = KvDtype::FP16;
  KvDtype li_weights_dtype = KvDtype::FP16;       // lightning-indexer weights cast
  KvDtype li_k_scale_dtype = KvDtype::FP16;       // k scale after squeeze(-2)
  IndexerKWriteKind indexer_k_write = IndexerKWriteKind::QuantThenScatter;
  SlotFormat indexer_slot_format = SlotFormat::BlockOffset;
  bool indexer_full_view = false;  // A5: the 7th cache-tuple entry, a [nb, rows, 1, 128+4] byte view (docs/design/dsa.md §2.2, §2.3)

  // ---- sparse attention call
  SparseAttnPath sparse_attn = SparseAttnPath::SharedKv;
  bool uses_sparse_flash_mla = false;
  const char* sparse_attn_op = "npu_sparse_attn_sharedkv";
  const char* sparse_attn_metadata_op = "npu_sparse_attn_sharedkv_metadata";
  const char* sparse_attn_op_library = "_C_ascend";  // "cann_ops_transformer" for SparseFlashMla
  KvLayout layout_kv = KvLayout::PA_ND;
  // kv_quant_mode / tile_size / rope_head_dim on both the metadata op and the
  // attention call (A5 fp8 only); values when passed:
  bool passes_kv_quant_kwargs = false;
  int64_t kv_quant_mode = 0;
  int64_t tile_size = 0;
  int64_t rope_head_dim = 0;
  bool passes_device_kwarg = true;       // metadata op's device="npu" (A2/A3 only)
  bool passes_cu_seqlens_kv_extras = true;  // cu_seqlens_ori_kv (prefill) / cu_seqlens_cmp_kv on the attention call
  bool renames_seqused_for_flash_mla = false;  // seqused_kv -> seqused_ori_kv, derive cmp lengths (flash_mla_cmp_lengths)
  CuSeqlensKv decode_cu_seqlens_ori_kv = CuSeqlensKv::EmptyTensor;
  CuSeqlensKv decode_cu_seqlens_cmp_kv = CuSeqlensKv::EmptyTensor;
  CuSeqlensKv prefill_cu_seqlens_ori_kv = CuSeqlensKv::QueryStartLoc;
  CuSeqlensKv prefill_cu_seqlens_cmp_kv = CuSeqlensKv::None;

  // ---- KV writes and slot mappings
  SlotFormat slot_format = SlotFormat::BlockOffset;  // attention groups (SWA, compressed KV)
  bool requires_block_offset_slots = true;           // slot_format == BlockOffset
  // Skip rows of the token (ratio <= 1) BlockOffset mappings: LastOffset
  // (-1, bs-1) on A2/A3, MinusOne (-1, -1) on A5 + BF16 (docs/design/dsa.md §4.2). Compressed
  // groups always use LastOffset (compressor_metadata's encoding).
  BlockOffsetSkip block_offset_skip = BlockOffsetSkip::LastOffset;
  int32_t compressor_slot_format_code = 2;           // compressor_metadata's slot_mapping_format (2 / 1)
  int32_t slot_mapping_columns = 2;                  // builder slot_mapping buffer: [N, 2] or [N]
  KvScatterKind kv_scatter = KvScatterKind::ScatterNdUpdateV2;
  // kv_compress_epilog arguments (meaningful when kv_scatter == KvCompressEpilog, else 0 / false):
  int64_t epilog_quant_group_size = 0;  // 64
  int64_t epilog_quant_mode = 0;        // 2 = MXFP8
  bool epilog_round_scale = false;      // true
  int64_t epilog_layout = 0;            // 1

  // ---- everything else the adaptor switched on
  QNormKind q_norm = QNormKind::RmsFp32;
  bool compressor_weights_unquantised = false;  // A5: compressor wkv / wgate unquantised, norm weight fp32
  OProjKind o_proj = OProjKind::Bmm;

};

// The only place that looks at the device kind. Throws NotSupported for
// Ascend310P, InvalidArgument for bad cache_dtype / model_dtype (named).
AttnKvPlan make_attn_kv_plan(const DsaConfig& cfg);

// docs/design/dsa.md §4.2, the SparseFlashMla adapter's derived lengths, for cmp_ratio > 1:
//   seqused_cmp_kv[b]  = seqused_kv[b] / cmp_ratio   (floor)
//   cmp_residual_kv[b] = seqused_kv[b] % cmp_ratio
//   return value       = max_seqlen_kv / cmp_ratio   (max_seqlen_cmp_kv)
// seqused_kv are per-request raw KV lengths (not cumulative), >= 0 and
// <= max_seqlen_kv. Validates everything (cmp_ratio >= 2, lengths, room in
// both outputs: >= seqused_kv.size()) before writing; a rejected call writes
// nothing. The renames (seqused_kv -> seqused_ori_kv, max_seqlen_kv ->
// max_seqlen_ori_kv) pass the input through unchanged.
int32_t flash_mla_cmp_lengths(CSpan<int32_t> seqused_kv, int32_t max_seqlen_kv, int32_t cmp_ratio,
                              Span<int32_t> seqused_cmp_kv, Span<int32_t> cmp_residual_kv);

}  // namespace aar::dsa
