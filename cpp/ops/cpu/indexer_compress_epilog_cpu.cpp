// CPU twin of vllm-ascend's _C_ascend::indexer_compress_epilog_v2 (namespace
// ascend_cpu_va; docs/design/dsa.md §1.3, §2.2, §4.1, docs/design/ops.md §4.6): the A5 indexer-K
// write. Row i of x (N, Di) (float dtype) is quantised per row to fp8 e4m3 with
// an fp32 scale = amax(|x_i|) / 448 (an all-zero row: scale 0, bytes 0),
// q = RNE(clamp(x / scale, -448, 448)), so the row dequantises as fp8 * scale
// ([verify] on hardware whether the device rounds the scale, e.g. to a power of
// two), and written at slot s = slot_mapping[i] (block s / bs, row s % bs).
// The cache is the "full" byte view (nb, bs, 1, Di + 4) of the indexer pages:
// each page (any page stride, the page itself contiguous) holds layout 2,
// block-separated: bs rows of Di fp8 bytes, then bs fp32 scales (little
// endian), i.e. the k view (nb, bs, 1, Di) and the scale view (nb, bs, 1) at
// page offset bs * Di. Slot -1 is skipped; other slots must lie in
// [0, nb * bs). When slots repeat, the last row wins. Every check precedes the
// write. Only layout 2 is implemented.
#include <torch/library.h>

#include "../op_signatures.h"
#include "attention_reference.h"
#include "dsa_common.h"

namespace aar::ops::cpu {
namespace {

constexpr const char* kIndexerCompressEpilogOp = "_C_ascend::indexer_compress_epilog_v2";

void indexer_compress_epilog_v2(AAR_INDEXER_COMPRESS_EPILOG_PARAMS) {
  reject_int(kIndexerCompressEpilogOp, layout, 2, "layout");
  at::Tensor& cache = indexer_compress_cache;
  for (const at::Tensor* t : std::initializer_list<const at::Tensor*>{&cache, &x, &slot_mapping}) {
    AAR_CHECK_ARG(t->defined() && t->device().is_cpu(), kIndexerCompressEpilogOp, ": the CPU twin needs CPU tensors");
  }
  AAR_CHECK_ARG(dsa::is_byte_dtype(cache.scalar_type()), kIndexerCompressEpilogOp,
                ": indexer_compress_cache must be a one-byte view (uint8 / int8 / float8_e4m3fn), got ",
                cache.scalar_type());
  AAR_CHECK_ARG(cache.dim() == 4 && cache.size(2) == 1 && cache.size(3) > 4, kIndexerCompressEpilogOp,
                ": indexer_compress_cache must be the full page view (num_blocks, block_size, 1, Di + 4), got ",
                cache.sizes());
  const int64_t nb = cache.size(0), bs = cache.size(1), di = cache.size(3) - 4;
  AAR_CHECK_ARG(cache.stride(3) == 1 && (bs == 1 || cache.stride(1) == di + 4), kIndexerCompressEpilogOp,
                ": indexer_compress_cache's pages must be contiguous (strides (page, Di + 4, *, 1)), got strides ",
                cache.strides());
  AAR_CHECK_ARG(x.dim() == 2 && x.size(1) == di, kIndexerCompressEpilogOp, ": x must be (N, Di=", di, "), got ", x.sizes());
  AAR_CHECK_ARG(is_float_dtype(x.scalar_type()), kIndexerCompressEpilogOp, ": x must be float32/float16/bfloat16, got ", x.scalar_type());
  const int64_t n = x.size(0);
  const std::vector<int64_t> slots = dsa::read_ints(kIndexerCompressEpilogOp, slot_mapping, "slot_mapping");
  AAR_CHECK_ARG(static_cast<int64_t>(slots.size()) == n, kIndexerCompressEpilogOp, ": slot_mapping must have N=", n, " entries, got ",
                slots.size());
  std::vector<int64_t> blk, off, src;
  for (int64_t i = 0; i < n; ++i) {
    if (slots[i] == -1) continue;
    AAR_CHECK_ARG(slots[i] >= 0 && slots[i] < nb * bs, kIndexerCompressEpilogOp, ": slot_mapping[", i, "]=", slots[i],
                  " is outside [0, num_blocks * block_size=", nb * bs, ") (-1 skips a row)");
    blk.push_back(slots[i] / bs);
    off.push_back(slots[i] % bs);
    src.push_back(i);
  }
  if (src.empty()) return;

  const auto lo = at::TensorOptions().dtype(at::kLong);
  const at::Tensor xs = x.index_select(0, at::tensor(src, lo)).to(at::kFloat);
  const at::Tensor scale = xs.abs().amax(1, /*keepdim=*/true).div_(448.0f);  // (m, 1) fp32
  const at::Tensor safe = at::where(scale.eq(0), at::ones_like(scale), scale);
  const at::Tensor q8 = (xs / safe).clamp_(-448.0, 448.0).to(at::kFloat8_e4m3fn).view(at::kByte);  // (m, Di)
  const at::Tensor sbytes = scale.contiguous().view(at::kByte);                                      // (m, 4)

  const at::Tensor bytes = cache.view(at::kByte);
  const at::Tensor pages = bytes.as_strided({nb, bs * (di + 4)}, {bytes.stride(0), 1});
  at::Tensor k_region = pages.narrow(1, 0, bs * di).view({nb, bs, di});
  at::Tensor s_region = pages.narrow(1, bs * di, bs * 4).view({nb, bs, 4});
  const at::Tensor b = at::tensor(blk, lo), o = at::tensor(off, lo);
  k_region.index_put_({b, o}, q8);
  s_region.index_put_({b, o}, sbytes);
}

}  // namespace
}  // namespace aar::ops::cpu

TORCH_LIBRARY_IMPL(ascend_cpu_va, CPU, m) {
  m.impl("indexer_compress_epilog_v2", TORCH_FN(aar::ops::cpu::indexer_compress_epilog_v2));
}
