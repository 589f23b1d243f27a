// Static facts of the DSA backends and caches (docs/design/dsa.md §2.1, §2.2).
#include "ascend_attn_rt/dsa/plan/dsa_backend_facts.h"

#include <algorithm>
#include <initializer_list>
#include <sstream>

#include "ascend_attn_rt/errors.h"

namespace aar::dsa {

namespace {

DsaBackendFacts make_facts(DsaBackendKind kind, const char* name, std::initializer_list<int32_t> sizes) {
  DsaBackendFacts f;
  f.kind = kind;
  f.name = name;
  for (int32_t s : sizes) f.block_sizes[f.num_block_sizes++] = s;
  return f;
}

std::string list_of(CSpan<int32_t> v) {
  std::ostringstream os;
  for (std::size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
  return os.str();
}

}  // namespace

bool DsaBackendFacts::supports(int64_t block_size) const {
  const CSpan<int32_t> v = kernel_block_sizes();
  return std::find(v.begin(), v.end(), block_size) != v.end();
}

DsaBackendFacts dsa_backend(DsaBackendKind kind, DeviceKind device) {
  check_dsa_device(device);
  switch (kind) {
    case DsaBackendKind::Generic: return make_facts(kind, "ASCEND_DSA", {2, 4, 8, 16, 32, 64, 128});
    case DsaBackendKind::C4: return make_facts(kind, "ASCEND_DSA_C4", {128, 256, 512});
    case DsaBackendKind::C128: return make_facts(kind, "ASCEND_DSA_C128", {4096, 8192, 16384});
    case DsaBackendKind::Swa: return make_facts(kind, "ASCEND_DSA_SWA", {32, 64, 128});
    case DsaBackendKind::C4State: return make_facts(kind, "ASCEND_DSA_C4_STATE", {2, 4, 8});
    case DsaBackendKind::C128State:
      return device == DeviceKind::A5 ? make_facts(kind, "ASCEND_DSA_C128_STATE", {4, 8, 16})
                                      : make_facts(kind, "ASCEND_DSA_C128_STATE", {8, 16, 32});
  }
  throw_invalid("dsa_backend: kind is not a DsaBackendKind (value ", static_cast<int32_t>(kind), ")");
}

void check_kernel_block_size(DsaBackendKind kind, DeviceKind device, int64_t block_size) {
  const DsaBackendFacts f = dsa_backend(kind, device);
  AAR_CHECK_ARG(f.supports(block_size), "block_size ", block_size, " is not a kernel block size of ", f.name,
                " on ", device_name(device), " (supported: ", list_of(f.kernel_block_sizes()), ")");
}

// ---------------------------------------------------------------- docs/design/dsa.md §2.2 table

const Dsv4BlockSizesRow kDsv4BlockSizes[9] = {
    {Dsv4GeometryClass::A2A3, {128, 128, 128, 8, 32, 16640, 131072}},
    {Dsv4GeometryClass::A2A3, {64, 64, 64, 4, 16, 8320, 65536}},
    {Dsv4GeometryClass::A2A3, {32, 32, 32, 2, 8, 4160, 32768}},
    {Dsv4GeometryClass::A5Fp8, {128, 128, 128, 8, 16, 16896, 81920}},
    {Dsv4GeometryClass::A5Fp8, {64, 64, 64, 4, 8, 8448, 40960}},
    {Dsv4GeometryClass::A5Fp8, {32, 32, 32, 2, 4, 4224, 20480}},
    // docs/design/dsa.md §4.2: A5 + BF16 pads the attention tier to the bf16 page (131072 at 128).
    {Dsv4GeometryClass::A5Bf16, {128, 128, 128, 8, 16, 16896, 131072}},
    {Dsv4GeometryClass::A5Bf16, {64, 64, 64, 4, 8, 8448, 65536}},
    {Dsv4GeometryClass::A5Bf16, {32, 32, 32, 2, 4, 4224, 32768}},
};

Dsv4GeometryClass geometry_class(const AttnKvPlan& plan) {
  check_dsa_device(plan.device);
  if (plan.device != DeviceKind::A5) return Dsv4GeometryClass::A2A3;
  return plan.fp8_kv_rows ? Dsv4GeometryClass::A5Fp8 : Dsv4GeometryClass::A5Bf16;
}

Dsv4BlockSizes dsv4_block_sizes(int64_t cache_block_size, const AttnKvPlan& plan) {
  const Dsv4GeometryClass cls = geometry_class(plan);
  for (const Dsv4BlockSizesRow& r : kDsv4BlockSizes) {
    if (r.cls == cls && r.sizes.cache_block_size == cache_block_size) return r.sizes;
  }
  throw_invalid("DSA (DeepSeek-V4): cache_block_size must be 32, 64 or 128 (DSV4_BLOCK_SIZES), got ",
                cache_block_size);
}

// ---------------------------------------------------------------- docs/design/dsa.md §2.2 caches

const char* to_string(DsaCacheKind k) {
  switch (k) {
    case DsaCacheKind::Swa: return "SWA";
    case DsaCacheKind::C4Kv: return "C4 compressed KV";
    case DsaCacheKind::C128Kv: return "C128 compressed KV";
    case DsaCacheKind::C4IndexerK: return "C4 indexer K";
    case DsaCacheKind::C4AttnState: return "C4 attention state";
    case DsaCacheKind::C4IndexerState: return "C4 indexer state";
    case DsaCacheKind::C128State: return "C128 state";
  }
  return "<invalid DsaCacheKind>";
}

DsaBackendKind backend_of(DsaCacheKind k) {
  switch (k) {
    case DsaCacheKind::Swa: return DsaBackendKind::Swa;
    case DsaCacheKind::C4Kv:
    case DsaCacheKind::C4IndexerK: return DsaBackendKind::C4;
    case DsaCacheKind::C128Kv: return DsaBackendKind::C128;
    case DsaCacheKind::C4AttnState:
    case DsaCacheKind::C4IndexerState: return DsaBackendKind::C4State;
    case DsaCacheKind::C128State: return DsaBackendKind::C128State;
  }
  throw_invalid("DSA: cache kind is not a DsaCacheKind (value ", static_cast<int32_t>(k), ")");
}

SlotFormat slot_format_for(const AttnKvPlan& plan, DsaCacheKind k) {
  backend_of(k);  // validates k
  return k == DsaCacheKind::C4IndexerK ? plan.indexer_slot_format : plan.slot_format;
}

int64_t storage_block_size(int64_t block_size, int64_t compress_ratio) {
  AAR_CHECK_ARG(block_size > 0, "storage_block_size: block_size must be > 0, got ", block_size);
  AAR_CHECK_ARG(compress_ratio >= 0, "storage_block_size: compress_ratio must be >= 0 (0 or 1 = uncompressed), got ",
                compress_ratio);
  if (compress_ratio <= 1) return block_size;
  AAR_CHECK_ARG(block_size % compress_ratio == 0, "storage_block_size: block_size ", block_size,
                " is not a multiple of compress_ratio ", compress_ratio,
                " (a page must hold whole compressed rows)");
  return block_size / compress_ratio;
}

void check_compress_ratio(int64_t ratio) {
  for (int32_t r : kDsaLayerRatios) {
    if (ratio == r) return;
  }
  throw_invalid("compress_ratio=", ratio, " is not a DSA layer ratio: the supported ones are 1 (sliding window "
                "only), 4 (C4) and 128 (C128)");
}

std::vector<DsaCacheKind> layer_cache_kinds(int64_t ratio) {
  check_compress_ratio(ratio);
  if (ratio == 1) return {DsaCacheKind::Swa};
  if (ratio == 128) return {DsaCacheKind::Swa, DsaCacheKind::C128Kv, DsaCacheKind::C128State};
  return {DsaCacheKind::Swa, DsaCacheKind::C4Kv, DsaCacheKind::C4AttnState, DsaCacheKind::C4IndexerK,
          DsaCacheKind::C4IndexerState};
}

void check_cache_dims(const DsaCacheDims& d, const AttnKvPlan& plan) {
  AAR_CHECK_ARG(d.head_dim > 0, "head_dim must be positive, got ", d.head_dim);
  AAR_CHECK_ARG(d.rope_dim > 0 && d.rope_dim % 2 == 0 && d.rope_dim <= d.head_dim, "rope_dim=", d.rope_dim,
                " must be even and in (0, head_dim=", d.head_dim, "]");
  AAR_CHECK_ARG(d.index_head_dim > 0, "index_head_dim must be positive, got ", d.index_head_dim);
  AAR_CHECK_ARG(!plan.fp8_kv_rows || (d.head_dim == Fp8KvRowLayout::kNopeDims + Fp8KvRowLayout::kRopeDims &&
                                      d.rope_dim == Fp8KvRowLayout::kRopeDims),
                "the plan's 640-byte fp8 rows hold head_dim 512 and rope_dim 64, got head_dim=", d.head_dim,
                ", rope_dim=", d.rope_dim);
}

namespace {

// The geometry and element layout of one cache kind, before its page is padded to a tier.
DsaCacheSpec unpadded_spec(DsaCacheKind kind, const Dsv4BlockSizes& t, const AttnKvPlan& plan,
                           const DsaCacheDims& dims) {
  DsaCacheSpec s;
  s.kind = kind;
  s.cache_block_size = t.cache_block_size;
  s.num_kv_heads = 1;
  switch (kind) {
    case DsaCacheKind::Swa:
    case DsaCacheKind::C4Kv:
    case DsaCacheKind::C128Kv:
      s.compress_ratio = kind == DsaCacheKind::Swa ? 1 : kind == DsaCacheKind::C4Kv ? 4 : 128;
      s.block_size = int64_t{kind == DsaCacheKind::Swa ? t.swa : t.mla} * s.compress_ratio;
      // Plain rows hold the model's D; the fp8 plan's rows are its fixed 640 bytes (check_cache_dims).
      s.head_size = plan.fp8_kv_rows ? plan.attn_head_size : dims.head_dim;
      s.dtype = plan.attn_kv_dtype;
      s.pad_tier = 2;
      break;
    case DsaCacheKind::C4IndexerK:
      s.compress_ratio = 4;
      s.block_size = int64_t{t.mla} * 4;
      s.head_size = dims.index_head_dim;
      s.dtype = plan.indexer_k_dtype;
      s.scale_dim = 1;
      s.scale_dtype = plan.indexer_k_scale_dtype;
      s.pad_tier = 1;
      break;
    case DsaCacheKind::C4AttnState:
    case DsaCacheKind::C4IndexerState:
    case DsaCacheKind::C128State: {
      // [kv_state (coff*D) | score_state (coff*D)] fp32 per raw position (docs/design/dsa.md §1.2).
      const bool c128 = kind == DsaCacheKind::C128State;
      const int64_t d = kind == DsaCacheKind::C4IndexerState ? dims.index_head_dim : dims.head_dim;
      s.compress_ratio = 1;
      s.coff = c128 ? 1 : 2;
      s.block_size = c128 ? t.c128_state : t.c4_state;
      s.head_size = 2 * s.coff * d;
      s.dtype = KvDtype::FP32;
      s.pad_tier = kind == DsaCacheKind::C4IndexerState ? 1 : 2;
      break;
    }
  }
  s.storage_block_size = storage_block_size(s.block_size, s.compress_ratio);
  s.page_bytes = s.storage_block_size * s.num_kv_heads *
                 (s.head_size * element_size(s.dtype) + s.scale_dim * element_size(s.scale_dtype));
  return s;
}

constexpr DsaCacheKind kAllCacheKinds[] = {DsaCacheKind::Swa,         DsaCacheKind::C4Kv,
                                           DsaCacheKind::C128Kv,      DsaCacheKind::C4IndexerK,
                                           DsaCacheKind::C4AttnState, DsaCacheKind::C4IndexerState,
                                           DsaCacheKind::C128State};

}  // namespace

DsaCacheSpec dsa_cache_spec(DsaCacheKind kind, int64_t cache_block_size, const AttnKvPlan& plan,
                            const DsaCacheDims& dims) {
  const DsaBackendKind backend = backend_of(kind);
  const Dsv4BlockSizes t = dsv4_block_sizes(cache_block_size, plan);
  check_cache_dims(dims, plan);
  DsaCacheSpec s = unpadded_spec(kind, t, plan, dims);
  const DsaBackendFacts facts = dsa_backend(backend, plan.device);
  s.backend = facts.name;
  check_kernel_block_size(backend, plan.device, s.block_size);
  if (dims.is_dsv4()) {
    s.padded_page_bytes = s.pad_tier == 1 ? t.pad_t1 : t.pad_t2;
    AAR_CHECK_ARG(s.page_bytes <= s.padded_page_bytes, "DSA: the ", to_string(kind), " page of ", s.page_bytes,
                  " bytes does not fit its tier pad_t", s.pad_tier, " = ", s.padded_page_bytes,
                  " (cache_block_size ", cache_block_size, ")");
  } else {
    for (DsaCacheKind k : kAllCacheKinds) {
      const DsaCacheSpec o = unpadded_spec(k, t, plan, dims);
      if (o.pad_tier == s.pad_tier) s.padded_page_bytes = std::max(s.padded_page_bytes, o.page_bytes);
    }
  }
  return s;
}

namespace {

bool is_state(DsaCacheKind k) {
  return k == DsaCacheKind::C4AttnState || k == DsaCacheKind::C4IndexerState || k == DsaCacheKind::C128State;
}

}  // namespace

std::vector<int64_t> dsa_kv_cache_shape(const DsaCacheSpec& spec, int64_t num_blocks) {
  AAR_CHECK_ARG(num_blocks >= 0, "dsa_kv_cache_shape: num_blocks must be >= 0, got ", num_blocks);
  if (is_state(spec.kind)) return {num_blocks, spec.storage_block_size, spec.num_kv_heads * spec.head_size};
  return {num_blocks, spec.storage_block_size, spec.num_kv_heads, spec.head_size};
}

std::vector<int64_t> dsa_scale_cache_shape(const DsaCacheSpec& spec, int64_t num_blocks) {
  AAR_CHECK_ARG(num_blocks >= 0, "dsa_scale_cache_shape: num_blocks must be >= 0, got ", num_blocks);
  AAR_CHECK_ARG(spec.scale_dim > 0, "dsa_scale_cache_shape: the ", to_string(spec.kind),
                " cache has no scale (scale_dim 0)");
  return {num_blocks, spec.storage_block_size, spec.scale_dim};
}

IndexerPageLayout dsa_indexer_page_layout(const DsaCacheSpec& spec, const AttnKvPlan& plan) {
  AAR_CHECK_ARG(spec.kind == DsaCacheKind::C4IndexerK, "dsa_indexer_page_layout: spec is the ", to_string(spec.kind),
                " cache, not the C4 indexer K cache");
  IndexerPageLayout l;
  l.page_stride_bytes = spec.padded_page_bytes;
  l.k_offset_bytes = 0;
  l.k_row_bytes = spec.num_kv_heads * spec.head_size * element_size(spec.dtype);
  l.scale_offset_bytes = spec.storage_block_size * l.k_row_bytes;
  l.scale_row_bytes = spec.num_kv_heads * spec.scale_dim * element_size(spec.scale_dtype);
  l.full_row_bytes = plan.indexer_full_view ? l.k_row_bytes + l.scale_row_bytes : 0;
  return l;
}

namespace {

int64_t elements_of(int64_t bytes, KvDtype dtype, const char* what, const DsaCacheSpec& spec) {
  const int64_t e = element_size(dtype);
  AAR_CHECK_ARG(bytes % e == 0, "DSA: the ", to_string(spec.kind), " ", what, " of ", bytes,
                " bytes is not a whole number of ", to_string(dtype), " elements (", e, " bytes)");
  return bytes / e;
}

}  // namespace

DsaCacheView dsa_cache_view(const DsaCacheSpec& spec, int64_t num_blocks) {
  DsaCacheView v;
  v.dtype = spec.dtype;
  v.shape = dsa_kv_cache_shape(spec, num_blocks);
  const int64_t page = elements_of(spec.padded_page_bytes, spec.dtype, "page stride", spec);
  if (is_state(spec.kind)) {
    v.stride = {page, spec.num_kv_heads * spec.head_size, 1};
  } else {
    v.stride = {page, spec.num_kv_heads * spec.head_size, spec.head_size, 1};
  }
  v.storage_offset = 0;
  return v;
}

DsaCacheView dsa_indexer_scale_view(const DsaCacheSpec& spec, int64_t num_blocks) {
  AAR_CHECK_ARG(spec.kind == DsaCacheKind::C4IndexerK, "dsa_indexer_scale_view: spec is the ", to_string(spec.kind),
                " cache, not the C4 indexer K cache");
  DsaCacheView v;
  v.dtype = spec.scale_dtype;
  v.shape = dsa_scale_cache_shape(spec, num_blocks);
  const int64_t page = elements_of(spec.padded_page_bytes, spec.scale_dtype, "page stride", spec);
  const int64_t k_bytes = spec.storage_block_size * spec.num_kv_heads * spec.head_size * element_size(spec.dtype);
  v.stride = {page, spec.scale_dim, 1};
  v.storage_offset = elements_of(k_bytes, spec.scale_dtype, "scale offset", spec);
  return v;
}

DsaCacheView dsa_indexer_full_view(const DsaCacheSpec& spec, const AttnKvPlan& plan, int64_t num_blocks) {
  AAR_CHECK_ARG(spec.kind == DsaCacheKind::C4IndexerK, "dsa_indexer_full_view: spec is the ", to_string(spec.kind),
                " cache, not the C4 indexer K cache");
  AAR_CHECK_ARG(plan.indexer_full_view, "dsa_indexer_full_view: the plan for ", device_name(plan.device),
                " has no full indexer view (only the A5 indexer_compress_epilog_v2 write uses one)");
  AAR_CHECK_ARG(num_blocks >= 0, "dsa_indexer_full_view: num_blocks must be >= 0, got ", num_blocks);
  const IndexerPageLayout l = dsa_indexer_page_layout(spec, plan);
  DsaCacheView v;
  v.dtype = KvDtype::INT8;  // bytes
  v.shape = {num_blocks, spec.storage_block_size, 1, l.full_row_bytes};
  v.stride = {l.page_stride_bytes, l.full_row_bytes, l.full_row_bytes, 1};
  v.storage_offset = 0;
  return v;
}

}  // namespace aar::dsa
