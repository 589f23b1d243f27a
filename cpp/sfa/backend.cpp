// SFA backend facts and the cache-tuple composition (docs/design/sfa.md §2.1, §2.2, §2.3).
#include "ascend_attn_rt/sfa/backend.h"

#include <ATen/ATen.h>

#include <string>

#include "../common/kv_cache.h"
#include "ascend_attn_rt/core/backend.h"
#include "ascend_attn_rt/errors.h"

namespace aar::sfa {

namespace {

void check_sizes(const char* what, int64_t nb, int64_t bs, int64_t a, const char* a_name, int64_t b,
                 const char* b_name) {
  AAR_CHECK_ARG(nb >= 0, what, ": num_blocks must be non-negative, got ", nb);
  AAR_CHECK_ARG(Backend::is_builder_block_size(bs), what, ": block_size=", bs,
                " is not supported (SFA's kernel block is 128; multiples of 16 in [16, 128] are accepted for tests)");
  AAR_CHECK_ARG(a > 0, what, ": ", a_name, " must be positive, got ", a);
  AAR_CHECK_ARG(b > 0, what, ": ", b_name, " must be positive, got ", b);
}

bool is_c8_cache_dtype(at::ScalarType t) { return t == at::kChar || t == at::kFloat8_e4m3fn; }
bool is_fp8(at::ScalarType t) { return t == at::kFloat8_e4m3fn || t == at::kFloat8_e5m2; }
bool is_model_dtype(at::ScalarType t) { return t == at::kHalf || t == at::kBFloat16 || t == at::kFloat; }

void check_model_dtype(at::ScalarType model_dtype) {
  AAR_CHECK_ARG(is_model_dtype(model_dtype), "model_dtype must be float16, bfloat16 or float32, got ", model_dtype);
}

std::string entry(const char* tuple, size_t i, const char* role) {
  return std::string(tuple) + "[" + std::to_string(i) + "] (" + role + ")";
}

// A 4-D (num_blocks, block_size, 1, width) cache tensor.
void check_cache_tensor(const at::Tensor& t, const std::string& name) {
  AAR_CHECK_ARG(t.defined(), name, " must be a tensor, got None");
  AAR_CHECK_ARG(t.dim() == 4 && t.size(2) == 1, name, " must be (num_blocks, block_size, 1, width), got shape ",
                t.sizes());
}

}  // namespace

const char* Backend::name() { return "ASCEND_SFA"; }

const std::vector<int64_t>& Backend::supported_block_sizes() {
  static const std::vector<int64_t> sizes = {128};
  return sizes;
}

bool Backend::is_supported_block_size(int64_t bs) { return bs == 128; }

bool Backend::is_builder_block_size(int64_t bs) { return bs >= 16 && bs <= 128 && bs % 16 == 0; }

const char* Backend::graph_support() { return "UNIFORM_BATCH"; }

std::vector<int64_t> Backend::kv_cache_shape(int64_t nb, int64_t bs, int64_t nkv, int64_t head_size) {
  check_sizes("kv_cache_shape", nb, bs, nkv, "num_kv_heads", head_size, "head_size");
  return {nb, bs, nkv, head_size};
}

std::vector<int64_t> Backend::kv_cache_stride_order(bool include_num_layers_dimension) {
  return aar::detail::identity_stride_order(4, include_num_layers_dimension);
}

std::vector<std::vector<int64_t>> Backend::main_cache_shapes(int64_t nb, int64_t bs, bool sfa_c8, int64_t L,
                                                             int64_t R) {
  check_sizes("main_cache_shapes", nb, bs, L, "kv_lora_rank", R, "qk_rope_head_dim");
  if (!sfa_c8) return {{nb, bs, 1, L}, {nb, bs, 1, R}};
  AAR_CHECK_ARG(L % kC8Tile == 0, "main_cache_shapes: kv_lora_rank=", L, " must be a multiple of the SFA C8 tile ",
                kC8Tile, " (one fp32 scale per tile)");
  // [k_nope (L bytes) | k_pe in bf16 (2R bytes) | L/128 fp32 scales (4 bytes each)].
  return {{nb, bs, 1, L + 2 * R + 4 * (L / kC8Tile)}};
}

at::ScalarType Backend::c8_dtype(plan::DeviceKind device) {
  return device == plan::DeviceKind::A5 ? at::kFloat8_e4m3fn : at::kChar;
}

std::vector<at::ScalarType> Backend::main_cache_dtypes(bool sfa_c8, plan::DeviceKind device,
                                                       at::ScalarType model_dtype) {
  check_model_dtype(model_dtype);
  if (sfa_c8) return {c8_dtype(device)};
  return {model_dtype, model_dtype};
}

ComposedKvCache compose_kv_cache(const std::vector<at::Tensor>& main, const std::vector<at::Tensor>& indexer,
                                 bool sfa_c8, bool li_c8) {
  const size_t want_main = sfa_c8 ? 1 : 2;
  AAR_CHECK_ARG(main.size() == want_main, "main_kv_cache has ", main.size(), " tensors, expected ", want_main,
                sfa_c8 ? " (the packed SFA C8 cache)" : " (k_nope, k_pe) without SFA C8",
                main.size() == 6 ? "; the KV-offload 6-tuple belongs to the offload variant" : "");
  if (sfa_c8) {
    const std::string n = entry("main_kv_cache", 0, "packed SFA C8 cache");
    check_cache_tensor(main[0], n);
    AAR_CHECK_ARG(is_c8_cache_dtype(main[0].scalar_type()), n, " must be int8 (A2/A3) or float8_e4m3fn (A5), got ",
                  main[0].scalar_type());
  } else {
    const std::string nope = entry("main_kv_cache", 0, "k_nope"), pe = entry("main_kv_cache", 1, "k_pe");
    check_cache_tensor(main[0], nope);
    check_cache_tensor(main[1], pe);
    // The forward routes by the latent cache's dtype (docs/design/sfa.md §4.1): a byte cache
    // here would take the KV-quant path with the SFA C8 flag off.
    AAR_CHECK_ARG(is_model_dtype(main[0].scalar_type()), nope,
                  " must be float16, bfloat16 or float32 without SFA C8, got ", main[0].scalar_type(),
                  (main[0].scalar_type() == at::kChar || is_fp8(main[0].scalar_type()))
                      ? " (a quantised cache: set sfa_c8)"
                      : "");
    AAR_CHECK_ARG(main[1].scalar_type() == main[0].scalar_type(), pe, " dtype ", main[1].scalar_type(),
                  " differs from k_nope's ", main[0].scalar_type());
    AAR_CHECK_ARG(main[1].size(0) == main[0].size(0) && main[1].size(1) == main[0].size(1), pe, " shape ",
                  main[1].sizes(), " has another block geometry than k_nope's ", main[0].sizes());
  }
  const c10::Device device = main[0].device();
  auto check_device = [&](const at::Tensor& t, const std::string& name) {
    AAR_CHECK_ARG(t.device() == device, name, " is on ", t.device(), " but main_kv_cache[0] is on ", device);
  };
  if (!sfa_c8) check_device(main[1], entry("main_kv_cache", 1, "k_pe"));
  ComposedKvCache out;
  out.caches = main;
  out.num_main = static_cast<int32_t>(main.size());
  if (indexer.empty()) return out;  // a layer without an indexer reuses the last top-k (docs/design/sparse.md §6)

  const size_t want_idx = li_c8 ? 2 : 1;
  AAR_CHECK_ARG(indexer.size() == want_idx, "indexer_kv_cache has ", indexer.size(), " tensors, expected ", want_idx,
                li_c8 ? " (idx_k, idx_scale) with LI C8" : " (idx_k) without LI C8",
                " (or none for a layer without an indexer)");
  const std::string kn = entry("indexer_kv_cache", 0, "idx_k");
  const at::Tensor& k = indexer[0];
  check_cache_tensor(k, kn);
  const at::ScalarType kt = k.scalar_type();
  if (li_c8) {
    AAR_CHECK_ARG(is_c8_cache_dtype(kt), kn, " must be int8 (A2/A3) or float8_e4m3fn (A5) with LI C8, got ", kt);
    const std::string sn = entry("indexer_kv_cache", 1, "idx_scale");
    const at::Tensor& s = indexer[1];
    check_cache_tensor(s, sn);
    const at::ScalarType want_scale = kt == at::kChar ? at::kHalf : at::kFloat;
    AAR_CHECK_ARG(s.scalar_type() == want_scale, sn, " must be ", want_scale, " for ", kt, " keys (docs/design/sfa.md §2.2: ",
                  "int8 keys with fp16 scales on A2/A3, fp8 keys with fp32 scales on A5), got ", s.scalar_type());
    AAR_CHECK_ARG(s.size(3) == 1 && s.size(0) == k.size(0) && s.size(1) == k.size(1), sn,
                  " must be (num_blocks, block_size, 1, 1) with idx_k's blocks ", k.sizes(), ", got ", s.sizes());
  } else {
    AAR_CHECK_ARG(is_model_dtype(kt), kn, " must be float16, bfloat16 or float32 without LI C8, got ", kt,
                  (kt == at::kChar || is_fp8(kt)) ? " (a quantised indexer cache: set li_c8)" : "");
  }
  for (size_t i = 0; i < indexer.size(); ++i) check_device(indexer[i], entry("indexer_kv_cache", i, i ? "idx_scale" : "idx_k"));
  const int64_t main_nb = main[0].size(0), main_bs = main[0].size(1);
  AAR_CHECK_ARG(k.size(1) == main_bs, kn, " has block_size ", k.size(1), " but main_kv_cache[0] has ", main_bs,
                " (the indexer cache shares the main group's block ids, docs/design/sfa.md §2.3)");
  AAR_CHECK_ARG(k.size(0) > 0 ? (main_nb > 0 && k.size(0) % main_nb == 0) : main_nb == 0, kn, " has ", k.size(0),
                " blocks, not a positive multiple of main_kv_cache[0]'s ", main_nb,
                " (the same blocks, or dcp copies of them under DCP)");
  out.indexer_k_index = out.num_main;
  if (li_c8) out.indexer_scale_index = out.num_main + 1;
  out.caches.insert(out.caches.end(), indexer.begin(), indexer.end());
  return out;
}

const char* IndexerBackend::name() { return "ASCEND_SFA_INDEXER"; }

const std::vector<int64_t>& IndexerBackend::supported_block_sizes() { return Backend::supported_block_sizes(); }

const char* IndexerBackend::graph_support() { return "UNIFORM_BATCH"; }

std::vector<int64_t> IndexerBackend::kv_cache_shape(int64_t nb, int64_t bs, int64_t nkv, int64_t head_size) {
  return Backend::kv_cache_shape(nb, bs, nkv, head_size);
}

std::vector<int64_t> IndexerBackend::kv_cache_stride_order(bool include_num_layers_dimension) {
  return Backend::kv_cache_stride_order(include_num_layers_dimension);
}

std::vector<std::vector<int64_t>> IndexerBackend::cache_shapes(int64_t nb, int64_t bs, bool li_c8, int64_t repl,
                                                               int64_t D) {
  check_sizes("cache_shapes", nb, bs, repl, "repl", D, "index_head_dim");
  if (!li_c8) return {{nb * repl, bs, 1, D}};
  return {{nb * repl, bs, 1, D}, {nb * repl, bs, 1, 1}};
}

std::vector<at::ScalarType> IndexerBackend::cache_dtypes(bool li_c8, plan::DeviceKind device,
                                                         at::ScalarType model_dtype) {
  check_model_dtype(model_dtype);
  if (!li_c8) return {model_dtype};
  return {Backend::c8_dtype(device), device == plan::DeviceKind::A5 ? at::kFloat : at::kHalf};
}

int64_t IndexerBackend::page_bytes(int64_t bs, bool li_c8, plan::DeviceKind device, at::ScalarType model_dtype,
                                   int64_t repl, int64_t D) {
  check_sizes("page_bytes", 0, bs, repl, "repl", D, "index_head_dim");
  const std::vector<at::ScalarType> dt = cache_dtypes(li_c8, device, model_dtype);
  const int64_t k_bytes = D * static_cast<int64_t>(c10::elementSize(dt[0]));
  const int64_t scale_bytes = li_c8 ? static_cast<int64_t>(c10::elementSize(dt[1])) : 0;
  return repl * bs * (k_bytes + scale_bytes);
}

core::BackendFacts Backend::facts() {
  core::BackendFacts f;
  f.id = "sfa";
  f.name = name();
  f.block_sizes = supported_block_sizes();  // what an engine allocates (the builder also takes 16..128, see backend.h)
  f.dtypes = {c10::kHalf, c10::kBFloat16, c10::kFloat};
  // The composed tuple without C8 (compose_kv_cache): SFA C8 packs the first
  // two into one byte cache, LI C8 appends the indexer scale cache, a layer
  // without an indexer has the main part only.
  f.kv_caches = {"nope_cache", "rope_cache", "indexer_k_cache"};
  f.capturable = core::state_bit(plan::AttentionState::DecodeOnly) | core::state_bit(plan::AttentionState::SpecDecoding);
  f.draft_lanes = true;  // build_for_drafting writes lane 1 + draft_index
  return f;
}

namespace {
const core::BackendRegistrar kRegisterSfaBackend(&Backend::facts);
}  // namespace

}  // namespace aar::sfa
