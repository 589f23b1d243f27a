#include "ascend_attn_rt/c8/quant.h"

#include <ATen/ATen.h>

#include <vector>

#include "../common/kv_cache.h"
#include "ascend_attn_rt/errors.h"

namespace aar::c8 {

at::Tensor quantize(const at::Tensor& x, const at::Tensor& inv_scale, const at::Tensor& offset) {
  // at::round rounds half to even, as torch.round does upstream.
  return at::round(x.to(at::kFloat) * inv_scale + offset).clamp_(-128, 127).to(at::kChar);
}

at::Tensor dequantize(const at::Tensor& q, const at::Tensor& scale, const at::Tensor& offset, at::ScalarType dtype) {
  return ((q.to(at::kFloat) - offset) * scale).to(dtype);
}

NzCacheGeometry check_nz_cache(const at::Tensor& cache, int64_t num_kv_heads, int64_t head_size, const char* name) {
  AAR_CHECK_ARG(cache.defined(), name, " must be a tensor");
  AAR_CHECK_ARG(cache.scalar_type() == at::kChar, name, " must be int8 (the C8 cache), got ", cache.scalar_type());
  AAR_CHECK_ARG(head_size % kNzWidth == 0, "head_size=", head_size, " must be a multiple of 32 for the NZ cache");
  const int64_t d1 = head_size / kNzWidth;
  NzCacheGeometry g;
  if (cache.dim() == 5) {
    AAR_CHECK_ARG(cache.size(1) == num_kv_heads && cache.size(2) == d1 && cache.size(4) == kNzWidth, name,
                  " must be NZ (num_blocks, Nkv=", num_kv_heads, ", D/32=", d1, ", block_size, 32), got ",
                  cache.sizes());
    detail::check_kv_cache_layout(
        cache, name, "(num_blocks, num_kv_heads, head_size/32, block_size, 32) = kv_cache_shape(...)[1:]");
    g.block_size = cache.size(3);
  } else {
    AAR_CHECK_ARG(cache.dim() == 4 && cache.size(2) == num_kv_heads && cache.size(3) == head_size, name,
                  " must be NZ (num_blocks, Nkv, D/32, block_size, 32) or the declared ND shape (num_blocks, "
                  "block_size, Nkv=", num_kv_heads, ", D=", head_size, "), got ", cache.sizes());
    detail::check_kv_cache_layout(cache, name,
                                  "(num_blocks, block_size, num_kv_heads, head_size) holding the NZ bytes of "
                                  "kv_cache_shape(...)[1:]");
    g.block_size = cache.size(1);
  }
  AAR_CHECK_ARG(g.block_size % kNzWidth == 0, name, ": block_size=", g.block_size,
                " must be a multiple of 32 for the NZ cache");
  g.num_blocks = cache.size(0);
  return g;
}

at::Tensor nz_view(const at::Tensor& cache, int64_t num_kv_heads, int64_t head_size, const char* name) {
  const NzCacheGeometry g = check_nz_cache(cache, num_kv_heads, head_size, name);
  if (cache.dim() == 5) return cache;
  return cache.view({g.num_blocks, num_kv_heads, head_size / kNzWidth, g.block_size, kNzWidth});
}

at::Tensor dequant_paged_to_dense(const at::Tensor& cache_nz, const at::Tensor& block_table,
                                  c10::IntArrayRef seq_lens, const at::Tensor& scale, const at::Tensor& offset,
                                  at::ScalarType dtype) {
  const int64_t nb = cache_nz.size(0), nkv = cache_nz.size(1), d = cache_nz.size(2) * kNzWidth,
                bs = cache_nz.size(3);
  const int64_t B = static_cast<int64_t>(seq_lens.size());
  AAR_CHECK_ARG(block_table.dim() == 2 && block_table.size(0) == B, "block_table must have ", B,
                " rows (one per seq_lens entry), got ", block_table.sizes());
  int64_t max_len = 0, total = 0;
  for (int64_t s : seq_lens) {
    AAR_CHECK_ARG(s >= 0, "seq_lens must be non-negative, got ", s);
    max_len = std::max(max_len, s);
    total += s;
  }
  const auto dev = cache_nz.device();
  if (total == 0) return at::empty({0, nkv, d}, cache_nz.options().dtype(dtype));
  const int64_t nblk = (max_len + bs - 1) / bs;
  AAR_CHECK_ARG(nblk <= block_table.size(1), "seq_lens need ", nblk, " blocks but block_table has ",
                block_table.size(1), " columns");
  AAR_CHECK_ARG(block_table.scalar_type() == at::kInt || block_table.scalar_type() == at::kLong,
                "block_table must be int32 or int64, got ", block_table.scalar_type());
  {  // every block a request reads must exist (a utility, not a step path: the ids are read on the host)
    const at::Tensor host = block_table.to(at::kCPU, at::kLong).contiguous();
    const int64_t* bt = host.data_ptr<int64_t>();
    const int64_t stride = host.size(1);
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t j = 0; j < (seq_lens[b] + bs - 1) / bs; ++j) {
        const int64_t id = bt[b * stride + j];
        AAR_CHECK_ARG(id >= 0 && id < nb, "block_table[", b, "][", j, "]=", id, " is out of range [0, ", nb,
                      ") (the cache's blocks)");
      }
    }
  }
  // Rows of the gathered (B * nblk * bs) token-major positions that exist.
  std::vector<int64_t> rows;
  rows.reserve(total);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t j = 0; j < seq_lens[b]; ++j) rows.push_back(b * nblk * bs + j);
  }
  // Rows past a request's length may hold any id: clamped, their tokens are not kept.
  const at::Tensor ids = block_table.narrow(1, 0, nblk).to(dev, at::kLong).clamp(0, nb - 1).reshape({-1});
  // NZ (h, d1, off, d0) -> token-major (off, h, d1*32 + d0).
  const at::Tensor tokens = cache_nz.index_select(0, ids).permute({0, 3, 1, 2, 4}).reshape({B * nblk * bs, nkv, d});
  const at::Tensor idx = at::from_blob(rows.data(), {total}, at::kLong).to(dev);
  return dequantize(tokens.index_select(0, idx), scale, offset, dtype);
}

c10::List<std::optional<at::Tensor>> nz_slot_index(const at::Tensor& slots, int64_t block_size) {
  c10::List<std::optional<at::Tensor>> idx;
  idx.push_back(slots.div(block_size, "floor"));
  idx.push_back(slots.remainder(block_size));
  return idx;
}

at::Tensor dequant_slots(const at::Tensor& cache_nz, const c10::List<std::optional<at::Tensor>>& slot_index,
                         const at::Tensor& scale, const at::Tensor& offset, at::ScalarType dtype) {
  const int64_t nkv = cache_nz.size(1), d = cache_nz.size(2) * kNzWidth;
  // (nb, bs, Nkv, D/32, 32): a view of the NZ bytes indexed by (block, offset).
  const at::Tensor rows = at::index(cache_nz.permute({0, 3, 1, 2, 4}), slot_index);
  return dequantize(rows.view({rows.size(0), nkv, d}), scale, offset, dtype);
}

}  // namespace aar::c8
