// Static facts of the DeepSeek-V4 ("DSA") backends and caches
// (docs/design/dsa.md §2.1, §2.2): the six backend descriptors, DSV4_BLOCK_SIZES, and per cache kind
// the scheduler block size, page geometry, dtypes, page bytes (and their
// padding into the two page-size tiers) and the cache views. Torch-free.
//
// Every cache has one KV head. A page of a compressed cache holds
// storage_block_size = block_size / compress_ratio physical rows, while the
// scheduler's block table is LOGICAL: one entry per block_size raw tokens
// (docs/design/dsa.md §2.2 geometry rule). Compressed row c lives in table[c / rows],
// offset c % rows.
//
// Device dependence: the backend descriptors and block sizes are per device
// by definition (docs/design/dsa.md §2.1: the C128 state backend's sizes differ on A5); the
// functions here take plan::DeviceKind for those facts, or read it from the
// AttnKvPlan (plan/dsa_kv_plan.h). Dtypes and row sizes come from the plan's fields,
// never from the device.
//
// Page-size tiers (docs/design/dsa.md §2.2): every cache group's page is padded to one of two
// sizes so all groups share num_blocks. pad_t1 (the indexer tier) is the
// indexer K+scale page; pad_t2 (the attention tier) is the SWA page. The
// indexer K and indexer state caches are in tier 1, everything else in tier 2.
// The A5 + BF16 plan (docs/design/dsa.md §4.2) has bf16 rows of 512 on A5: its pad_t2 is the
// bf16 SWA page (131072 at cache block size 128, as the PR says; 65536 / 32768
// at 64 / 32, the same rule), its pad_t1 A5's fp8 indexer page, and its state
// block sizes A5's.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "ascend_attn_rt/dsa/plan/dsa_kv_plan.h"
#include "ascend_attn_rt/plan/span.h"

namespace aar::dsa {

// ---------------------------------------------------------------- docs/design/dsa.md §2.1 backends
enum class DsaBackendKind : int32_t { Generic = 0, C4 = 1, C128 = 2, Swa = 3, C4State = 4, C128State = 5 };

struct DsaBackendFacts {
  DsaBackendKind kind = DsaBackendKind::Generic;
  const char* name = "";  // "ASCEND_DSA", "ASCEND_DSA_C4", ...
  int32_t num_block_sizes = 0;
  int32_t block_sizes[7] = {};  // supported logical kernel block sizes, ascending
  CSpan<int32_t> kernel_block_sizes() const { return {block_sizes, static_cast<std::size_t>(num_block_sizes)}; }
  bool supports(int64_t block_size) const;
};

// The descriptor of a backend on a device (NotSupported for a device DSA does
// not run on, InvalidArgument for a kind outside the enum).
DsaBackendFacts dsa_backend(DsaBackendKind kind, DeviceKind device);

// Throws InvalidArgument naming block_size, the backend and its list unless
// block_size is one of the backend's kernel block sizes.
void check_kernel_block_size(DsaBackendKind kind, DeviceKind device, int64_t block_size);

// -------------------------------------------------------- docs/design/dsa.md §2.2 DSV4_BLOCK_SIZES
// DSV4_BLOCK_SIZES[cache_block_size] = [[mla, swa, c4_state, c128_state], [pad_t1, pad_t2]].
struct Dsv4BlockSizes {
  int32_t cache_block_size = 0;
  int32_t mla = 0, swa = 0, c4_state = 0, c128_state = 0;  // rows per page of each cache family
  int64_t pad_t1 = 0;  // indexer tier, bytes
  int64_t pad_t2 = 0;  // attention tier, bytes
};

// The table's rows, by the plan's geometry class: A2/A3 (bf16 rows), A5 with
// fp8 rows (upstream's A5 column), A5 with bf16 rows (docs/design/dsa.md §4.2).
enum class Dsv4GeometryClass : int32_t { A2A3 = 0, A5Fp8 = 1, A5Bf16 = 2 };
Dsv4GeometryClass geometry_class(const AttnKvPlan& plan);

struct Dsv4BlockSizesRow {
  Dsv4GeometryClass cls;
  Dsv4BlockSizes sizes;
};
// Upstream's DSV4_BLOCK_SIZES, one row per (geometry class, cache block size).
extern const Dsv4BlockSizesRow kDsv4BlockSizes[9];

// InvalidArgument naming cache_block_size unless it is 32, 64 or 128.
Dsv4BlockSizes dsv4_block_sizes(int64_t cache_block_size, const AttnKvPlan& plan);

// ---------------------------------------------------------------- docs/design/dsa.md §2.2 caches
enum class DsaCacheKind : int32_t {
  Swa = 0,             // every layer: the sliding-window KV
  C4Kv = 1,            // compressed KV of ratio-4 layers
  C128Kv = 2,          // compressed KV of ratio-128 layers
  C4IndexerK = 3,      // indexer k rows + one scale per row (ratio-4 layers)
  C4AttnState = 4,     // compressor state of the C4 attention compressor (fp32)
  C4IndexerState = 5,  // compressor state of the C4 indexer compressor (fp32)
  C128State = 6,       // compressor state of the C128 compressor (fp32)
};
const char* to_string(DsaCacheKind k);
DsaBackendKind backend_of(DsaCacheKind k);

// The slot format of a cache group's slot mapping: the indexer K group's is
// plan.indexer_slot_format, every other group's plan.slot_format (the state
// groups get one too, as upstream's builders format it; the compressor
// itself addresses the state through its state block table).
SlotFormat slot_format_for(const AttnKvPlan& plan, DsaCacheKind k);

// docs/design/dsa.md §2.2: block_size / compress_ratio (ratio 0 or 1 = uncompressed, the
// block size itself). InvalidArgument naming the argument for block_size <= 0,
// compress_ratio < 0, or a ratio that does not divide block_size.
int64_t storage_block_size(int64_t block_size, int64_t compress_ratio);

// ------------------------------------------------------------ layer ratios
// The compress ratios a DSA layer may have: 1 (sliding window only), 4 (C4:
// compressed KV with the indexer's top-k) and 128 (C128: dense compressed
// KV). They are the only ones the cache kinds above exist for. Every public
// entry that takes a layer's ratio (route_layer, Impl, layer_cache_kinds)
// checks it here. 0, which upstream's specs use as another spelling of 1, is
// refused so that a layer's ratio has one spelling.
inline constexpr int32_t kDsaLayerRatios[] = {1, 4, 128};
// InvalidArgument naming compress_ratio, its value and the supported ratios.
void check_compress_ratio(int64_t compress_ratio);
// docs/design/dsa.md §3.3: the cache kinds a layer of compress_ratio reads, in the order of
// the groups route_layer takes (SWA; the compressed KV and its compressor
// state; the indexer K and the indexer state).
std::vector<DsaCacheKind> layer_cache_kinds(int64_t compress_ratio);

struct DsaCacheSpec {
  DsaCacheKind kind = DsaCacheKind::Swa;
  const char* backend = "";       // backend name (docs/design/dsa.md §2.1)
  int32_t cache_block_size = 0;   // the configured cache block size (32 / 64 / 128)
  int32_t compress_ratio = 1;     // 1 (SWA and every state), 4, 128
  int32_t coff = 0;               // compressor overlap factor of a state cache (2, or 1 for C128), else 0
  int64_t block_size = 0;         // scheduler block size, raw tokens (a kernel block size of the backend)
  int64_t storage_block_size = 0; // rows per page = block_size / compress_ratio
  int64_t num_kv_heads = 1;
  int64_t head_size = 0;          // entries per row per head, in dtype (A5 fp8 KV: 640 bytes)
  KvDtype dtype = KvDtype::BF16;
  int64_t scale_dim = 0;          // 1 for the indexer K cache, else 0
  KvDtype scale_dtype = KvDtype::FP32;  // meaningful when scale_dim > 0
  // page = rows * n_kv * (head_size * sizeof(dtype) + scale_dim * sizeof(scale_dtype))
  int64_t page_bytes = 0;
  int32_t pad_tier = 2;           // 1 = indexer tier (pad_t1), 2 = attention tier (pad_t2)
  int64_t padded_page_bytes = 0;  // the tier's size: the page stride of the group's raw buffer
};

// The model dimensions the caches are sized by. The defaults are
// DeepSeek-V4's; another model (a smaller test model, a future variant) gets
// its cache shapes from these instead of a table of its own.
//   head_dim        D: the SWA and compressed KV rows, and the compressor
//                   states' 2 * coff * D columns
//   rope_dim        R, the rope slice of D (even, 0 < R <= D); the fp8 plan's
//                   640-byte rows hold D = 512 with R = 64 only
//   index_head_dim  Di: the indexer K rows and the indexer state's 2 * 2 * Di
struct DsaCacheDims {
  int64_t head_dim = kDsaHeadDim;
  int64_t rope_dim = kDsaRopeDim;
  int64_t index_head_dim = kDsaIndexerHeadDim;
  bool is_dsv4() const {
    return head_dim == kDsaHeadDim && rope_dim == kDsaRopeDim && index_head_dim == kDsaIndexerHeadDim;
  }
};
// InvalidArgument naming the dimension unless dims are usable under plan.
void check_cache_dims(const DsaCacheDims& dims, const AttnKvPlan& plan);

// The spec of one cache kind for a cache block size (32, 64, 128) under a
// plan, for a model of `dims`. Throws InvalidArgument naming cache_block_size
// outside the table, a dimension check_cache_dims refuses, and (a bug in the
// facts, never expected) when a page does not fit its tier or the scheduler
// block size is not a kernel block size of the backend.
// Page tiers: at DeepSeek-V4's dims the table's pad_t1 / pad_t2 (every page
// must fit its tier); at other dims the table's byte sizes do not apply, and
// a tier is the largest page of its kinds (the rule the table follows at
// DeepSeek-V4's dims: pad_t2 is the SWA page, pad_t1 the indexer K page).
DsaCacheSpec dsa_cache_spec(DsaCacheKind kind, int64_t cache_block_size, const AttnKvPlan& plan,
                            const DsaCacheDims& dims = DsaCacheDims());

// The cache tensor shapes the layer takes (dsa::Impl::forward): the KV and
// indexer K caches (nb, rows, n_kv, head_size); the compressor state caches
// (nb, rows, head_size), the compressor's layout; for the indexer K cache the
// scale's (nb, rows, scale_dim). num_blocks >= 0.
std::vector<int64_t> dsa_kv_cache_shape(const DsaCacheSpec& spec, int64_t num_blocks);
std::vector<int64_t> dsa_scale_cache_shape(const DsaCacheSpec& spec, int64_t num_blocks);

// A strided view over a group's raw byte buffer of num_blocks *
// padded_page_bytes bytes, in elements of dtype (shape, stride and
// storage_offset as torch's as_strided takes them).
struct DsaCacheView {
  KvDtype dtype = KvDtype::INT8;
  std::vector<int64_t> shape;
  std::vector<int64_t> stride;
  int64_t storage_offset = 0;
};

// The indexer page (docs/design/dsa.md §2.2): [k: rows x 128 B][scale: rows x sizeof(scale)]
// then padding up to the page stride; on A5 also a "full" byte view
// [nb, rows, 1, 128 + 4] from the page base, the write handle of
// indexer_compress_epilog_v2 (layout 2: k rows, then scales).
struct IndexerPageLayout {
  int64_t page_stride_bytes = 0;  // padded_page_bytes
  int64_t k_offset_bytes = 0;
  int64_t k_row_bytes = 0;        // 128 * sizeof(k)
  int64_t scale_offset_bytes = 0; // rows * k_row_bytes
  int64_t scale_row_bytes = 0;    // sizeof(scale)
  int64_t full_row_bytes = 0;     // k_row_bytes + scale_row_bytes when the plan has the full view, else 0
};
IndexerPageLayout dsa_indexer_page_layout(const DsaCacheSpec& spec, const AttnKvPlan& plan);

// The main view of any cache (the KV rows, the state rows, or the indexer k):
// shape dsa_kv_cache_shape, page stride padded_page_bytes / sizeof(dtype).
// InvalidArgument when the padded page is not a whole number of elements.
DsaCacheView dsa_cache_view(const DsaCacheSpec& spec, int64_t num_blocks);
// The indexer scale view (shape dsa_scale_cache_shape, offset past the k rows).
// InvalidArgument for a non-indexer spec or a page / offset not divisible by
// sizeof(scale).
DsaCacheView dsa_indexer_scale_view(const DsaCacheSpec& spec, int64_t num_blocks);
// The A5 full byte view (INT8 elements = bytes), [nb, rows, 1, full_row_bytes].
// InvalidArgument for a non-indexer spec or a plan without the full view.
DsaCacheView dsa_indexer_full_view(const DsaCacheSpec& spec, const AttnKvPlan& plan, int64_t num_blocks);

}  // namespace aar::dsa
