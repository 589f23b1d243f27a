// The configuration rules of the plan layer: the DSA attention-KV plan (make_attn_kv_plan over
// any device value, cache_dtype string and model dtype, against docs/design/dsa.md §4.2's table
// written here and the plan's own consistency rules), the SparseFlashMla adapter's derived
// lengths (flash_mla_cmp_lengths: floor and remainder, outputs untouched on rejection) and the
// paged-attention selection rule (using_paged_attention, docs/design/gqa.md §2.6's table), and the DSA
// cache facts (docs/design/dsa.md §2.1 / §2.2: storage_block_size, every cache kind's spec under every plan, the
// cache shapes and the strided views, which must stay inside the group's raw buffer).
#include <optional>
#include <string>

#include "ascend_attn_rt/dsa/plan/dsa_backend_facts.h"
#include "ascend_attn_rt/dsa/plan/dsa_kv_plan.h"
#include "ascend_attn_rt/plan/workspace.h"
#include "fuzz_util.h"

using namespace aar;

namespace {

const char* const kCacheDtypes[] = {"auto", "bfloat16", "bf16", "fp8", "fp8_e4m3", "float8_e4m3fn",
                                    "float16", "BF16", "fp8_e5m2", "", "int8"};

void check_kv_plan(fuzz::Bytes& in) {
  dsa::DsaConfig cfg;
  const int32_t dev = in.u8() % 8 == 0 ? in.maybe_bad(2) : in.range(0, 3);
  cfg.device = static_cast<plan::DeviceKind>(dev);
  const int32_t md = in.u8() % 8 == 0 ? in.maybe_bad(0) : in.range(0, 4);
  cfg.model_dtype = static_cast<dsa::KvDtype>(md);
  switch (in.u8() % 4) {
    case 0: break;  // not set
    case 1: {       // arbitrary bytes
      std::string s;
      for (int32_t i = in.range(0, 12); i > 0; --i) s.push_back(static_cast<char>(in.u8()));
      cfg.cache_dtype = s;
      break;
    }
    default: cfg.cache_dtype = kCacheDtypes[in.u8() % (sizeof(kCacheDtypes) / sizeof(kCacheDtypes[0]))];
  }
  const std::string s = cfg.cache_dtype.value_or("auto");
  const bool bf16_req = s == "bfloat16" || s == "bf16";
  const bool known = s == "auto" || bf16_req || s == "fp8" || s == "fp8_e4m3" || s == "float8_e4m3fn";
  const bool dev_ok = dev == 0 || dev == 1 || dev == 2;
  const bool model_ok = md == static_cast<int32_t>(dsa::KvDtype::BF16) || md == static_cast<int32_t>(dsa::KvDtype::FP16);
  dsa::AttnKvPlan p;
  bool ok = false;
  try {
    p = dsa::make_attn_kv_plan(cfg);
    ok = true;
  } catch (const NotSupported& e) {
    FUZZ_CHECK(dev == static_cast<int32_t>(plan::DeviceKind::Ascend310P));  // only 310P is "not supported"
    FUZZ_CHECK(std::string(e.what()).find("Ascend310P") != std::string::npos);
  } catch (const InvalidArgument& e) {
    FUZZ_CHECK(e.what()[0] != '\0');
  }
  FUZZ_CHECK(ok == (dev_ok && model_ok && known));
  if (!ok) return;
  const bool a5 = cfg.device == plan::DeviceKind::A5;
  // docs/design/dsa.md §4.2's table: the attention KV dtype and the three plans.
  const dsa::KvDtype want = !a5 ? cfg.model_dtype : bf16_req ? dsa::KvDtype::BF16 : dsa::KvDtype::FP8_E4M3;
  FUZZ_CHECK(p.attn_kv_dtype == want);
  FUZZ_CHECK(p.device == cfg.device);
  const dsa::SparseAttnPath path = !a5 ? dsa::SparseAttnPath::SharedKv
                                   : want == dsa::KvDtype::BF16 ? dsa::SparseAttnPath::SparseFlashMla
                                                                : dsa::SparseAttnPath::KvQuantSharedKv;
  FUZZ_CHECK(p.sparse_attn == path);
  FUZZ_CHECK(p.uses_sparse_flash_mla == (path == dsa::SparseAttnPath::SparseFlashMla));
  FUZZ_CHECK(p.layout_kv == (p.uses_sparse_flash_mla ? dsa::KvLayout::PA_BBND : dsa::KvLayout::PA_ND));
  FUZZ_CHECK(p.fp8_kv_rows == (want == dsa::KvDtype::FP8_E4M3));
  // The row geometry: 512 logical dims; MXFP8 rows are 640 bytes of which 128 are extra.
  FUZZ_CHECK(p.attn_head_dim == dsa::kDsaHeadDim);
  FUZZ_CHECK(p.attn_head_bytes == p.attn_head_size * dsa::element_size(p.attn_kv_dtype));
  FUZZ_CHECK(p.kv_head_extra == p.attn_head_size - dsa::kDsaHeadDim);
  FUZZ_CHECK(p.attn_head_bytes == (p.fp8_kv_rows ? 640 : 1024));
  // Slot formats and scatter kinds agree with each other.
  FUZZ_CHECK(p.requires_block_offset_slots == (p.slot_format == plan::SlotFormat::BlockOffset));
  FUZZ_CHECK(p.slot_mapping_columns == (p.requires_block_offset_slots ? 2 : 1));
  FUZZ_CHECK(p.compressor_slot_format_code == static_cast<int32_t>(p.slot_format));
  FUZZ_CHECK((p.kv_scatter == dsa::KvScatterKind::KvCompressEpilog) == p.fp8_kv_rows);
  FUZZ_CHECK((p.kv_scatter == dsa::KvScatterKind::KvCompressEpilog) == (p.slot_format == plan::SlotFormat::Flat));
  FUZZ_CHECK((p.kv_scatter == dsa::KvScatterKind::KvCompressEpilog) == (p.epilog_quant_mode != 0));
  FUZZ_CHECK(p.passes_kv_quant_kwargs == p.fp8_kv_rows);
  FUZZ_CHECK((p.block_offset_skip == plan::BlockOffsetSkip::MinusOne) == p.uses_sparse_flash_mla);
  // The indexer follows the device, not the attention dtype.
  FUZZ_CHECK(p.indexer_k_dtype == (a5 ? dsa::KvDtype::FP8_E4M3 : dsa::KvDtype::INT8));
  FUZZ_CHECK(p.indexer_slot_format == (a5 ? plan::SlotFormat::Flat : plan::SlotFormat::BlockOffset));
  FUZZ_CHECK(p.indexer_full_view == a5);
  FUZZ_CHECK(p.passes_device_kwarg == !a5);
  FUZZ_CHECK(p.o_proj == (a5 ? dsa::OProjKind::MxFp8QuantBmm : dsa::OProjKind::Bmm));
  FUZZ_CHECK(std::string(p.sparse_attn_op_library) == (p.uses_sparse_flash_mla ? "cann_ops_transformer" : "_C_ascend"));
  FUZZ_CHECK(p.sparse_attn_op[0] != '\0' && p.sparse_attn_metadata_op[0] != '\0');
  FUZZ_CHECK(std::string(p.sparse_attn_metadata_op) == std::string(p.sparse_attn_op) + "_metadata");
  // Every field names itself.
  for (const char* name : {dsa::to_string(p.attn_kv_dtype), dsa::to_string(p.sparse_attn), dsa::to_string(p.layout_kv),
                           dsa::to_string(p.slot_format), dsa::to_string(p.kv_scatter), dsa::to_string(p.o_proj),
                           dsa::to_string(p.indexer_k_write), dsa::to_string(p.q_norm), dsa::device_name(p.device)}) {
    FUZZ_CHECK(name != nullptr && name[0] != '\0' && name[0] != '<');
  }
}

void check_cmp_lengths(fuzz::Bytes& in) {
  const int32_t ratio = in.u8() % 8 == 0 ? in.maybe_bad(1) : (in.flag() ? 4 : 128);
  const int32_t max_kv = in.u8() % 8 == 0 ? in.maybe_bad(500) : in.range(0, 1000);
  std::vector<int32_t> seq(in.range(0, 8));
  for (auto& s : seq) s = in.u8() % 16 == 0 ? in.maybe_bad(max_kv) : in.range(0, std::max(0, max_kv));
  const size_t room_c = in.u8() % 8 == 0 ? in.range(0, 8) : seq.size();
  const size_t room_r = in.u8() % 8 == 0 ? in.range(0, 8) : seq.size();
  auto cmp = fuzz::canary<int32_t>(room_c, -9), res = fuzz::canary<int32_t>(room_r, -9);
  fuzz::Snapshot snap;
  snap.add(cmp), snap.add(res);
  int32_t max_cmp = -1;
  const bool ok = fuzz::accepted([&] { max_cmp = dsa::flash_mla_cmp_lengths(seq, max_kv, ratio, cmp, res); }, snap);
  bool valid = ratio >= 2 && max_kv >= 0 && room_c >= seq.size() && room_r >= seq.size();
  for (int32_t s : seq) valid = valid && s >= 0 && s <= max_kv;
  FUZZ_CHECK(ok == valid);
  if (!ok) return;
  FUZZ_CHECK(max_cmp == max_kv / ratio);
  for (size_t b = 0; b < seq.size(); ++b) {
    FUZZ_CHECK(int64_t{cmp[b]} * ratio + res[b] == seq[b]);
    FUZZ_CHECK(res[b] >= 0 && res[b] < ratio);
  }
  for (size_t b = seq.size(); b < cmp.size(); ++b) FUZZ_CHECK(cmp[b] == -9);
}

void check_paged_rule(fuzz::Bytes& in) {
  plan::PagedAttentionRule rule;
  rule.has_speculative_config = in.flag();
  rule.device = static_cast<plan::DeviceKind>(in.range(0, 3));
  rule.full_decode_only_graph = in.flag();
  std::vector<int32_t> shapes(in.range(0, 6));
  for (auto& s : shapes) s = in.range(0, 64);
  rule.pa_shape_list = shapes;
  const int64_t shape = in.flag() ? in.range(0, 64) : static_cast<int64_t>(in.u32()) - (int64_t{1} << 31);
  const int64_t head = in.flag() ? -1 : (in.flag() ? 512 : in.range(0, 1024));
  const bool got = plan::using_paged_attention(shape, rule, head);
  // docs/design/gqa.md §2.6, row by row: speculative decoding and the A5 never; head size 512 always;
  // otherwise only captured FULL_DECODE_ONLY shapes listed in pa_shape_list.
  bool listed = false;
  for (int32_t s : shapes) listed = listed || s == shape;
  const bool want = !rule.has_speculative_config && rule.device != plan::DeviceKind::A5 &&
                    (head == 512 || (rule.full_decode_only_graph && listed));
  FUZZ_CHECK(got == want);
}

int64_t element_bytes(dsa::KvDtype d) { return dsa::element_size(d); }

// The largest byte a view reaches (exclusive), or -1 for an empty view.
int64_t view_end_bytes(const dsa::DsaCacheView& v) {
  int64_t last = v.storage_offset;
  for (size_t i = 0; i < v.shape.size(); ++i) {
    if (v.shape[i] == 0) return -1;
    last += (v.shape[i] - 1) * v.stride[i];
  }
  return (last + 1) * element_bytes(v.dtype);
}

void check_cache_facts(fuzz::Bytes& in) {
  // storage_block_size on its own: any block size and ratio.
  {
    const int64_t bs = in.u8() % 4 == 0 ? static_cast<int64_t>(in.u32()) - (int64_t{1} << 31) : in.range(0, 256);
    const int64_t r = in.u8() % 4 == 0 ? in.maybe_bad(4) : (in.flag() ? 4 : (in.flag() ? 128 : in.range(0, 2)));
    int64_t got = -1;
    bool ok = true;
    try {
      got = dsa::storage_block_size(bs, r);
    } catch (const InvalidArgument&) {
      ok = false;
    }
    const bool valid = bs > 0 && r >= 0 && (r <= 1 || bs % r == 0);
    FUZZ_CHECK(ok == valid);
    if (ok) FUZZ_CHECK(got == (r <= 1 ? bs : bs / r));
  }
  dsa::DsaConfig cfg;
  cfg.device = static_cast<plan::DeviceKind>(in.range(0, 2));
  const char* dt[] = {"auto", "bfloat16", "fp8"};
  cfg.cache_dtype = dt[in.u8() % 3];
  const dsa::AttnKvPlan plan = dsa::make_attn_kv_plan(cfg);
  const int32_t kind_i = in.u8() % 8 == 0 ? in.maybe_bad(3) : in.range(0, 6);
  const auto kind = static_cast<dsa::DsaCacheKind>(kind_i);
  const int64_t cbs = in.u8() % 4 == 0 ? in.maybe_bad(64) : (in.flag() ? 128 : (in.flag() ? 64 : 32));
  dsa::DsaCacheSpec spec;
  bool ok = true;
  try {
    spec = dsa::dsa_cache_spec(kind, cbs, plan);
  } catch (const InvalidArgument& e) {
    FUZZ_CHECK(e.what()[0] != '\0');
    ok = false;
  }
  FUZZ_CHECK(ok == (kind_i >= 0 && kind_i <= 6 && (cbs == 32 || cbs == 64 || cbs == 128)));
  if (!ok) return;
  // The documented rules (docs/design/dsa.md §2.2).
  FUZZ_CHECK(spec.kind == kind && spec.cache_block_size == cbs && spec.num_kv_heads == 1);
  FUZZ_CHECK(spec.storage_block_size == dsa::storage_block_size(spec.block_size, spec.compress_ratio));
  dsa::check_kernel_block_size(dsa::backend_of(kind), plan.device, spec.block_size);  // throws if not
  const int64_t row = spec.head_size * element_bytes(spec.dtype) + spec.scale_dim * element_bytes(spec.scale_dtype);
  FUZZ_CHECK(spec.page_bytes == spec.storage_block_size * spec.num_kv_heads * row);
  FUZZ_CHECK(spec.page_bytes <= spec.padded_page_bytes);
  const bool tier1 = kind == dsa::DsaCacheKind::C4IndexerK || kind == dsa::DsaCacheKind::C4IndexerState;
  FUZZ_CHECK(spec.pad_tier == (tier1 ? 1 : 2));
  const dsa::Dsv4BlockSizes sizes = dsa::dsv4_block_sizes(cbs, plan);
  FUZZ_CHECK(spec.padded_page_bytes == (tier1 ? sizes.pad_t1 : sizes.pad_t2));
  FUZZ_CHECK((spec.scale_dim > 0) == (kind == dsa::DsaCacheKind::C4IndexerK));
  // Shapes and views of num_blocks pages stay inside num_blocks * padded_page_bytes.
  const int64_t nb = in.u8() % 8 == 0 ? in.maybe_bad(3) : in.range(0, 9);
  auto views = [&](auto&& f) {
    try {
      f();
      return true;
    } catch (const InvalidArgument& e) {
      FUZZ_CHECK(e.what()[0] != '\0');
      return false;
    }
  };
  dsa::DsaCacheView v;
  const bool vok = views([&] { v = dsa::dsa_cache_view(spec, nb); });
  FUZZ_CHECK(vok == (nb >= 0));
  if (!vok) return;
  FUZZ_CHECK(v.shape.size() == v.stride.size() && !v.shape.empty() && v.shape[0] == nb);
  FUZZ_CHECK(v.shape == dsa::dsa_kv_cache_shape(spec, nb));
  FUZZ_CHECK(v.stride[0] * element_bytes(v.dtype) == spec.padded_page_bytes);
  FUZZ_CHECK(view_end_bytes(v) <= nb * spec.padded_page_bytes);
  if (kind != dsa::DsaCacheKind::C4IndexerK) {
    FUZZ_CHECK(!views([&] { dsa::dsa_indexer_scale_view(spec, nb); }));
    return;
  }
  const dsa::IndexerPageLayout l = dsa::dsa_indexer_page_layout(spec, plan);
  FUZZ_CHECK(l.scale_offset_bytes == spec.storage_block_size * l.k_row_bytes);
  FUZZ_CHECK(l.scale_offset_bytes + spec.storage_block_size * l.scale_row_bytes <= l.page_stride_bytes);
  const dsa::DsaCacheView sv = dsa::dsa_indexer_scale_view(spec, nb);
  FUZZ_CHECK(sv.shape == dsa::dsa_scale_cache_shape(spec, nb));
  FUZZ_CHECK(view_end_bytes(sv) <= nb * spec.padded_page_bytes);
  if (nb > 0) FUZZ_CHECK(sv.storage_offset * element_bytes(sv.dtype) == l.scale_offset_bytes);
  dsa::DsaCacheView fv;
  const bool fok = views([&] { fv = dsa::dsa_indexer_full_view(spec, plan, nb); });
  FUZZ_CHECK(fok == plan.indexer_full_view);
  if (fok) FUZZ_CHECK(view_end_bytes(fv) <= nb * spec.padded_page_bytes);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Bytes in(data, size);
  switch (in.u8() % 4) {
    case 0: check_kv_plan(in); break;
    case 1: check_cmp_lengths(in); break;
    case 2: check_paged_rule(in); break;
    default: check_cache_facts(in); break;
  }
  return 0;
}
