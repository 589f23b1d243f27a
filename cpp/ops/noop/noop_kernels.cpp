// The no-compute provider (namespace ascend_noop): the same schemas as the CPU
// twins and torch_npu, no arithmetic. Functional variants return correctly
// shaped tensors from a small per-thread cache keyed by (shape, dtype), so a
// steady-state call allocates nothing; .out / in-place variants do nothing.
// Used to measure the runtime's host overhead alone. Assumes Dv == D for the
// FIA output shape (what every caller of this runtime passes).
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <array>

#include "../op_signatures.h"
#include "output_cache.h"
#include "ascend_attn_rt/errors.h"

namespace aar::ops::noop {

namespace {

struct Entry {
  std::array<int64_t, 6> shape{};
  int64_t rank = -1;
  at::ScalarType dtype = at::kFloat;
  c10::Device device = c10::Device(c10::kCPU);
  at::Tensor t;
};

// The per-thread cache: 256 entries addressed by a hash of the key, probed
// over 16 slots; on a miss the first free slot of the probe takes the new
// entry, or the home slot is replaced. (64 entries probed over 8 thrashed once
// the context-parallel layers' glue had its own outputs: a replaced entry is a
// fresh zero-filled tensor, 4 MiB for a PCP step's gathered top-k, every call.) (A linear scan of 32 entries, with
// the thread_local re-resolved in every iteration, was a fifth of a DSA C4
// forward's measured host instructions.)
constexpr int kCacheBits = 8;
constexpr size_t kProbe = 16;

struct OutputCache {
  std::array<Entry, size_t{1} << kCacheBits> entries;
};

bool same_key(const Entry& e, c10::IntArrayRef shape, at::ScalarType dtype, c10::Device device) {
  if (e.rank != static_cast<int64_t>(shape.size()) || e.dtype != dtype || e.device != device) return false;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (e.shape[d] != shape[d]) return false;
  }
  return true;
}

// Out of line, so the caller holds a plain pointer: GCC re-resolved an inline
// thread_local's address (__tls_get_addr) in every iteration of a loop.
__attribute__((noinline)) OutputCache& output_cache() {
  thread_local OutputCache tls;
  return tls;
}

}  // namespace

at::Tensor cached(c10::IntArrayRef shape, at::ScalarType dtype, c10::Device device) {
  AAR_CHECK_ARG(shape.size() <= 6, "ascend_noop: at most 6 dims, got ", shape);
  OutputCache& c = output_cache();  // one TLS look-up per call
  uint64_t h = (static_cast<uint64_t>(dtype) << 8) ^ static_cast<uint64_t>(device.index() + 1) ^
               (static_cast<uint64_t>(device.type()) << 16) ^ shape.size();
  const int64_t* dims = shape.data();
  for (size_t d = 0; d < shape.size(); ++d) h = (h ^ static_cast<uint64_t>(dims[d])) * 0x9E3779B97F4A7C15ull;
  const size_t n = c.entries.size(), home = static_cast<size_t>(h >> (64 - kCacheBits)) & (n - 1);
  Entry* slot = &c.entries[home];
  for (size_t k = 0; k < kProbe; ++k) {
    Entry& e = c.entries[(home + k) & (n - 1)];
    if (same_key(e, shape, dtype, device)) return e.t;
    if (e.rank < 0) {
      slot = &e;
      break;
    }
  }
  Entry& e = *slot;
  e.rank = static_cast<int64_t>(shape.size());
  std::copy(shape.begin(), shape.end(), e.shape.begin());
  e.dtype = dtype;
  e.device = device;
  e.t = at::zeros(shape, at::TensorOptions().dtype(dtype).device(device));
  return e.t;
}

namespace {

std::tuple<at::Tensor, at::Tensor> fia_outputs(const at::Tensor& query, bool lse) {
  const at::Tensor out = cached(query.sizes(), query.scalar_type(), query.device());
  std::array<int64_t, 5> s{};
  const int64_t r = query.dim();
  AAR_CHECK_ARG(r >= 1 && r <= 5, "ascend_noop FIA: query must have 1..5 dims, got ", query.sizes());
  std::copy(query.sizes().begin(), query.sizes().end(), s.begin());
  s[r - 1] = 1;
  if (!lse) s[0] = 1;  // the [1] placeholder
  const c10::IntArrayRef lse_shape(s.data(), lse ? r : 1);
  return {out, cached(lse_shape, at::kFloat, query.device())};
}

at::Tensor workspace(const at::Tensor& like) {
  static const std::array<int64_t, 1> shape{64};
  return cached(c10::IntArrayRef(shape.data(), 1), at::kByte, like.device());
}

// MLA layouts (docs/design/mla.md §5.3): head-major outputs (_NBSD / _NTD), BSND, and
// dense TND with a value width different from the query's (MLA prefill).
std::tuple<at::Tensor, at::Tensor> fia_layout_outputs(const at::Tensor& query, const at::Tensor& value,
                                                      bool paged, c10::string_view layout, bool lse) {
  const bool ntd = layout == "TND_NTD", nbsd = layout == "BNSD_NBSD" || layout == "BSND_NBSD";
  const bool dense_tnd = layout == "TND" && !paged && value.dim() == 3 && value.size(-1) != query.size(-1);
  if (!ntd && !nbsd && !dense_tnd) return fia_outputs(query, lse);
  std::array<int64_t, 4> s{};
  const int64_t r = query.dim();
  std::copy(query.sizes().begin(), query.sizes().end(), s.begin());
  if (dense_tnd) s[2] = value.size(-1);
  if (ntd) std::swap(s[0], s[1]);
  if (layout == "BNSD_NBSD") std::swap(s[0], s[1]);
  if (layout == "BSND_NBSD") s = {s[2], s[0], s[1], s[3]};
  const at::Tensor out = cached(c10::IntArrayRef(s.data(), r), query.scalar_type(), query.device());
  return {out, std::get<1>(fia_outputs(query, lse))};
}

std::tuple<at::Tensor, at::Tensor> fia_v1(AAR_FIA_V1_PARAMS) {
  return fia_layout_outputs(query, value, block_table.has_value(), input_layout, softmax_lse_flag);
}
std::tuple<at::Tensor&, at::Tensor&> fia_v1_out(AAR_FIA_V1_PARAMS, AAR_OUT_TAIL_PARAMS) {
  return {attention_out, softmax_lse};
}
at::Tensor fia_v1_ws(AAR_FIA_V1_PARAMS) { return workspace(query); }

std::tuple<at::Tensor, at::Tensor> fia_v2(AAR_FIA_V2_PARAMS) {
  return fia_layout_outputs(query, value, block_table.has_value(), input_layout, return_softmax_lse);
}
std::tuple<at::Tensor&, at::Tensor&> fia_v2_out(AAR_FIA_V2_PARAMS, AAR_OUT_TAIL_PARAMS) {
  return {attention_out, softmax_lse};
}
at::Tensor fia_v2_ws(AAR_FIA_V2_PARAMS) { return workspace(query); }

sig::FusionAttentionResult fusion_attention(AAR_FUSION_ATTENTION_PARAMS) {
  std::array<int64_t, 3> s{query.size(0), head_num, value.size(-1)};
  static const std::array<int64_t, 1> empty{0};
  const at::Tensor ph = cached(c10::IntArrayRef(empty.data(), 1), at::kFloat, query.device());
  return {cached(c10::IntArrayRef(s.data(), 3), query.scalar_type(), query.device()), ph, ph, ph, 0, 0, 0};
}

void scatter_pa_kv_cache(AAR_SCATTER_PA_PARAMS) {}
void reshape_and_cache(AAR_RESHAPE_AND_CACHE_PARAMS) {}
void paged_attention(AAR_PAGED_ATTENTION_PARAMS, sig::OptT workspace) {}
at::Tensor paged_attention_ws(AAR_PAGED_ATTENTION_PARAMS) { return workspace(query); }

}  // namespace

}  // namespace aar::ops::noop

namespace aar::ops::noop {
namespace {
void register_kernels(torch::Library& m) {
  m.impl("npu_fused_infer_attention_score", TORCH_FN(fia_v1));
  m.impl("npu_fused_infer_attention_score.out", TORCH_FN(fia_v1_out));
  m.impl("_npu_fused_infer_attention_score_get_max_workspace", TORCH_FN(fia_v1_ws));
  m.impl("npu_fused_infer_attention_score_v2", TORCH_FN(fia_v2));
  m.impl("npu_fused_infer_attention_score_v2.out", TORCH_FN(fia_v2_out));
  m.impl("_npu_fused_infer_attention_score_v2_get_max_workspace", TORCH_FN(fia_v2_ws));
  m.impl("npu_fusion_attention", TORCH_FN(fusion_attention));
  m.impl("npu_scatter_pa_kv_cache", TORCH_FN(scatter_pa_kv_cache));
  m.impl("_npu_paged_attention", TORCH_FN(paged_attention));
  m.impl("_npu_paged_attention_get_workspace", TORCH_FN(paged_attention_ws));
  m.impl("_npu_reshape_and_cache", TORCH_FN(reshape_and_cache));
}
}  // namespace
}  // namespace aar::ops::noop

TORCH_LIBRARY_IMPL(ascend_noop, CPU, m) { aar::ops::noop::register_kernels(m); }
TORCH_LIBRARY_IMPL(ascend_noop, Meta, m) { aar::ops::noop::register_kernels(m); }
