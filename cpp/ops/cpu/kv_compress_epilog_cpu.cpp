// CPU twin of vllm-ascend's _C_ascend::kv_compress_epilog (namespace
// ascend_cpu_va; docs/design/dsa.md §1.4 last bullet, §4.1, docs/design/ops.md §4.6, §4.7, §4.4): the A5
// MXFP8 quantise-and-scatter of compressed (and SWA) KV rows. Row i of x
// (N, D) bf16, D = nope + 64 (nope a multiple of 64; 448 in DeepSeek-V4) goes
// to cache row slot_mapping[i] as
//   [nope fp8 e4m3 | 64 bf16 rope (128 B) | nope / 64 ue8m0 scales | zero pad]
// (640 bytes for D = 512). Per group of 64 nope elements:
//   e = clamp(ceil(log2(amax / 448)), -127, 127)   (amax 0 gives -127)
//   scale byte = e + 127,  fp8 = RNE(x / 2^e)       (|x / 2^e| <= 448, no clamp)
// (the twins' one MX codec, mx_codec.h: its "ceil" rule)
// so the row dequantises as fp8 * 2^(byte - 127). [verify] the scale rounding
// (ceil, "round_scale") on hardware. The rope part is copied as bf16 bytes
// (little endian). Slot -1 is skipped; any other slot must be a row of the
// cache. When slots repeat, the last row wins. The cache is
// (rows, 1, W) of a one-byte dtype (the A5 cache viewed as (-1, 1, 640)), any
// strides; every check precedes the write.
// Implemented: quant_group_size 64, quant_mode 2 (MXFP8), round_scale_flag
// true, layout 1; anything else is rejected by name.
#include <torch/library.h>

#include <cmath>

#include "../op_signatures.h"
#include "attention_reference.h"
#include "dsa_common.h"
#include "mx_codec.h"

namespace aar::ops::cpu {
namespace {

constexpr const char* kKvCompressEpilogOp = "_C_ascend::kv_compress_epilog";
constexpr int64_t kRope = 64, kGroup = 64;

void kv_compress_epilog(AAR_KV_COMPRESS_EPILOG_PARAMS) {
  reject_int(kKvCompressEpilogOp, quant_group_size, kGroup, "quant_group_size");
  reject_int(kKvCompressEpilogOp, quant_mode, 2, "quant_mode");
  if (!round_scale_flag) {
    throw_not_supported(kKvCompressEpilogOp, ": not supported by the CPU twin: round_scale_flag=false (only true: ue8m0 = ",
                        "ceil(log2(amax / 448)) + 127)");
  }
  reject_int(kKvCompressEpilogOp, layout, 1, "layout");
  for (const at::Tensor* t : std::initializer_list<const at::Tensor*>{&kv_compress_cache, &x, &slot_mapping}) {
    AAR_CHECK_ARG(t->defined() && t->device().is_cpu(), kKvCompressEpilogOp, ": the CPU twin needs CPU tensors");
  }
  AAR_CHECK_ARG(x.dim() == 2, kKvCompressEpilogOp, ": x must be (N, D), got ", x.sizes());
  AAR_CHECK_ARG(x.scalar_type() == at::kBFloat16, kKvCompressEpilogOp, ": x must be bfloat16 (its rope part is stored as bf16), got ",
                x.scalar_type());
  const int64_t n = x.size(0), d = x.size(1), nope = d - kRope;
  AAR_CHECK_ARG(nope >= kGroup && nope % kGroup == 0, kKvCompressEpilogOp, ": x's width D=", d,
                " must be 64 rope dims plus a positive multiple of 64 nope dims (512 in DeepSeek-V4)");
  const int64_t groups = nope / kGroup, need = nope + 2 * kRope + groups;
  AAR_CHECK_ARG(dsa::is_byte_dtype(kv_compress_cache.scalar_type()), kKvCompressEpilogOp,
                ": kv_compress_cache must have a one-byte dtype (float8_e4m3fn / uint8 / int8), got ",
                kv_compress_cache.scalar_type());
  AAR_CHECK_ARG(kv_compress_cache.dim() == 3 && kv_compress_cache.size(1) == 1 && kv_compress_cache.size(2) >= need,
                kKvCompressEpilogOp, ": kv_compress_cache must be (rows, 1, W >= ", need, " bytes) (the cache viewed as (-1, 1, 640)), got ",
                kv_compress_cache.sizes());
  const int64_t rows = kv_compress_cache.size(0), width = kv_compress_cache.size(2);
  const std::vector<int64_t> slots = dsa::read_ints(kKvCompressEpilogOp, slot_mapping, "slot_mapping");
  AAR_CHECK_ARG(static_cast<int64_t>(slots.size()) == n, kKvCompressEpilogOp, ": slot_mapping must have N=", n, " entries, got ",
                slots.size());
  std::vector<int64_t> dst, src;
  for (int64_t i = 0; i < n; ++i) {
    if (slots[i] == -1) continue;
    AAR_CHECK_ARG(slots[i] >= 0 && slots[i] < rows, kKvCompressEpilogOp, ": slot_mapping[", i, "]=", slots[i],
                  " is outside [0, rows=", rows, ") (-1 skips a row)");
    dst.push_back(slots[i]);
    src.push_back(i);
  }
  if (dst.empty()) return;

  const auto lo = at::TensorOptions().dtype(at::kLong);
  const at::Tensor xs = x.index_select(0, at::tensor(src, lo));
  const int64_t m = xs.size(0);
  const at::Tensor xn = xs.narrow(1, 0, nope).to(at::kFloat).reshape({m, groups, kGroup});
  const at::Tensor amax = xn.abs().amax(-1).to(at::kDouble).contiguous();
  std::vector<int64_t> ex(m * groups);
  const double* ap = amax.data_ptr<double>();
  for (int64_t i = 0; i < m * groups; ++i) ex[i] = mx::exponent_ceil(ap[i]);
  const at::Tensor e = at::tensor(ex, lo).view({m, groups});
  const at::Tensor q8 = mx::quantize_e4m3(xn, e).reshape({m, nope}).view(at::kByte);
  const at::Tensor rope = xs.narrow(1, nope, kRope).contiguous().view(at::kByte);  // (m, 128)
  const at::Tensor sb = (e + 127).to(at::kByte);
  const at::Tensor pad = at::zeros({m, width - need}, at::TensorOptions().dtype(at::kByte));
  const at::Tensor packed = at::cat({q8, rope, sb, pad}, 1);  // (m, width)

  at::Tensor bytes = kv_compress_cache.view(at::kByte).select(1, 0);  // (rows, width), aliases the cache
  bytes.index_put_({at::tensor(dst, lo)}, packed);
}

}  // namespace
}  // namespace aar::ops::cpu

TORCH_LIBRARY_IMPL(ascend_cpu_va, CPU, m) {
  m.impl("kv_compress_epilog", TORCH_FN(aar::ops::cpu::kv_compress_epilog));
}
