// CPU twin of npu_scatter_pa_kv_cache (docs/design/ops.md §4.4): cache_mode "Norm" writes
// key[t] to cache[s / bs, s % bs] for every slot s >= 0 of an ND cache
// (nb, bs, Nkv, D); "PA_NZ" writes the 5-D NZ cache (nb, Nkv, D/c, bs, c).
// The compress_* / seq_lens arguments are not implemented and must be None.
#include <torch/library.h>

#include "../op_signatures.h"
#include "attention_reference.h"
#include "kv_scatter.h"

namespace aar::ops::cpu {

namespace {

constexpr const char* kScatterPaKvCacheOp = "npu_scatter_pa_kv_cache";

void scatter_pa_kv_cache(AAR_SCATTER_PA_PARAMS) {
  reject_tensor(kScatterPaKvCacheOp, compress_lens, "compress_lens");
  reject_tensor(kScatterPaKvCacheOp, compress_seq_offsets, "compress_seq_offsets");
  reject_tensor(kScatterPaKvCacheOp, seq_lens, "seq_lens");
  if (!cache_mode.has_value()) {
    throw_invalid(kScatterPaKvCacheOp, ": cache_mode=None is ambiguous; pass \"Norm\" (ND cache) or \"PA_NZ\" (NZ cache)");
  }
  CacheFormat format;
  if (*cache_mode == "Norm") {
    format = CacheFormat::Nd;
  } else if (*cache_mode == "PA_NZ") {
    format = CacheFormat::Nz;
  } else {
    throw_not_supported(kScatterPaKvCacheOp, ": not supported by the CPU twin: cache_mode=\"", *cache_mode,
                        "\" (only \"Norm\" and \"PA_NZ\")");
  }
  scatter_kv(kScatterPaKvCacheOp, "slot_mapping", key, value, key_cache, value_cache, slot_mapping, format);
}

}  // namespace

}  // namespace aar::ops::cpu

TORCH_LIBRARY_IMPL(ascend_cpu, CPU, m) {
  m.impl("npu_scatter_pa_kv_cache", TORCH_FN(aar::ops::cpu::scatter_pa_kv_cache));
}
