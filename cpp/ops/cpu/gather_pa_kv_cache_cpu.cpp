// CPU twin of npu_gather_pa_kv_cache (docs/design/ops.md §4.5): for b in order and t in
// [0, seq_lens[b]): output row sum_{b'<b} seq_lens[b'] + t <-
// cache[block_tables[b, seq_offset[b]/bs + t/bs], t % bs]; a block index past
// the table or an invalid block id yields zeros (golden semantics). seq_offset
// must be a multiple of the block size (the golden applies it per block; we
// reject what it would silently truncate). is_seq_lens_cumsum=True is rejected.
// Caches may be ND (nb, bs, Nkv, D) or FRACTAL_NZ (nb, Nkv, D/c, bs, c), c = 32 /
// element size (an int8 FA-quant latent cache): rows are gathered as the ND
// rows they stand for [verify the NZ support of the kernel on hardware].
#include <torch/library.h>

#include "../op_signatures.h"
#include "attention_reference.h"

namespace aar::ops::cpu {
namespace {

constexpr const char* kGatherPaKvCacheOp = "npu_gather_pa_kv_cache";

// The (nb, bs, Nkv, D) view of an ND cache, or the ND copy of an NZ one.
at::Tensor nd_cache(const at::Tensor& c, const char* name) {
  if (c.dim() == 5) {
    const int64_t cb = 32 / static_cast<int64_t>(c.element_size());
    AAR_CHECK_ARG(c.size(4) == cb, kGatherPaKvCacheOp, ": ", name, " as an NZ cache must be (num_blocks, Nkv, D/", cb,
                  ", block_size, ", cb, "), got ", c.sizes());
    return c.permute({0, 3, 1, 2, 4}).reshape({c.size(0), c.size(3), c.size(1), c.size(2) * cb});
  }
  AAR_CHECK_ARG(c.dim() == 4, kGatherPaKvCacheOp, ": ", name, " must be an ND paged cache (num_blocks, block_size, Nkv, D) or an "
                "NZ one (num_blocks, Nkv, D/c, block_size, c), got ", c.sizes());
  return c;
}

void gather_pa_kv_cache(const at::Tensor& key_cache_in, const at::Tensor& value_cache_in, const at::Tensor& block_tables,
                        const at::Tensor& seq_lens, at::Tensor& key, at::Tensor& value, sig::OptT seq_offset,
                        bool is_seq_lens_cumsum) {
  if (is_seq_lens_cumsum) throw_not_supported(kGatherPaKvCacheOp, ": not supported by the CPU twin: is_seq_lens_cumsum=True");
  const at::Tensor key_cache = nd_cache(key_cache_in, "key_cache");
  const at::Tensor value_cache = nd_cache(value_cache_in, "value_cache");
  const int64_t nb = key_cache.size(0), bs = key_cache.size(1);
  AAR_CHECK_ARG(value_cache.size(0) == nb && value_cache.size(1) == bs && value_cache.size(2) == key_cache.size(2),
                kGatherPaKvCacheOp, ": value_cache blocks ", value_cache.sizes(), " must match key_cache ", key_cache.sizes());
  AAR_CHECK_ARG(block_tables.dim() == 2 && block_tables.scalar_type() == at::kInt, kGatherPaKvCacheOp,
                ": block_tables must be int32 (B, max_blocks), got ", block_tables.scalar_type(), " ",
                block_tables.sizes());
  const int64_t B = block_tables.size(0), mb = block_tables.size(1);
  AAR_CHECK_ARG(seq_lens.dim() == 1 && seq_lens.size(0) == B, kGatherPaKvCacheOp, ": seq_lens must be (B=", B, "), got ",
                seq_lens.sizes());
  const at::Tensor lens = seq_lens.to(at::kLong).contiguous();
  std::vector<int64_t> off(B, 0);
  if (seq_offset.has_value() && seq_offset->defined()) {
    AAR_CHECK_ARG(seq_offset->dim() == 1 && seq_offset->size(0) == B, kGatherPaKvCacheOp, ": seq_offset must be (B=", B,
                  "), got ", seq_offset->sizes());
    const at::Tensor o = seq_offset->to(at::kLong).contiguous();
    for (int64_t b = 0; b < B; ++b) {
      off[b] = o.data_ptr<int64_t>()[b];
      AAR_CHECK_ARG(off[b] >= 0 && off[b] % bs == 0, kGatherPaKvCacheOp, ": seq_offset[", b, "]=", off[b],
                    " must be a non-negative multiple of the block size ", bs);
    }
  }
  int64_t total = 0;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t l = lens.data_ptr<int64_t>()[b];
    AAR_CHECK_ARG(l >= 0, kGatherPaKvCacheOp, ": seq_lens[", b, "]=", l, " is negative");
    total += l;
  }
  AAR_CHECK_ARG(key.dim() == 3 && key.size(0) == total && key.size(1) == key_cache.size(2) &&
                    key.size(2) == key_cache.size(3),
                kGatherPaKvCacheOp, ": key must be (sum(seq_lens)=", total, ", Nkv, Dk) like key_cache, got ", key.sizes());
  AAR_CHECK_ARG(value.dim() == 3 && value.size(0) == total && value.size(1) == value_cache.size(2) &&
                    value.size(2) == value_cache.size(3),
                kGatherPaKvCacheOp, ": value must be (sum(seq_lens)=", total, ", Nkv, Dv) like value_cache, got ", value.sizes());
  const at::Tensor bt = block_tables.contiguous();
  const int32_t* btp = bt.data_ptr<int32_t>();
  int64_t row = 0;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t l = lens.data_ptr<int64_t>()[b];
    for (int64_t t = 0; t < l; t += bs) {
      const int64_t n = std::min(bs, l - t);
      const int64_t col = off[b] / bs + t / bs;
      const int64_t blk = col < mb ? btp[b * mb + col] : -1;
      if (blk < 0 || blk >= nb) {
        key.narrow(0, row, n).zero_();
        value.narrow(0, row, n).zero_();
      } else {
        key.narrow(0, row, n).copy_(key_cache[blk].narrow(0, 0, n));
        value.narrow(0, row, n).copy_(value_cache[blk].narrow(0, 0, n));
      }
      row += n;
    }
  }
}

}  // namespace
}  // namespace aar::ops::cpu

TORCH_LIBRARY_IMPL(ascend_cpu, CPU, m) {
  m.impl("npu_gather_pa_kv_cache", TORCH_FN(aar::ops::cpu::gather_pa_kv_cache));
}
