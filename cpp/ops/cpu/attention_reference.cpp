#include "attention_reference.h"

#include <limits>

namespace aar::ops::cpu {

bool is_float_dtype(at::ScalarType t) {
  return t == at::kFloat || t == at::kHalf || t == at::kBFloat16;
}

std::vector<int64_t> to_vector(at::OptionalSymIntArrayRef v) {
  std::vector<int64_t> r;
  if (!v.has_value()) return r;
  r.reserve(v->size());
  for (const auto& s : *v) r.push_back(s.expect_int());
  return r;
}

std::vector<int64_t> to_vector(at::OptionalIntArrayRef v) {
  if (!v.has_value()) return {};
  return std::vector<int64_t>(v->begin(), v->end());
}

void cumulative_to_ranges(const char* op, const char* name, const std::vector<int64_t>& ends, int64_t total,
                          const char* total_name, std::vector<int64_t>& start, std::vector<int64_t>& len) {
  start.resize(ends.size());
  len.resize(ends.size());
  int64_t prev = 0;
  for (size_t b = 0; b < ends.size(); ++b) {
    AAR_CHECK_ARG(ends[b] >= prev, op, ": ", name, " must be cumulative ends (non-negative, non-decreasing); got ",
                  name, "[", b, "]=", ends[b], " after ", prev);
    start[b] = prev;
    len[b] = ends[b] - prev;
    prev = ends[b];
  }
  if (total >= 0) {
    AAR_CHECK_ARG(prev == total, op, ": the last cumulative end of ", name, " (", prev, ") must equal ",
                  total_name, " (", total, ")");
  }
}

void check_block_table(const char* op, const at::Tensor& block_table, int64_t batch,
                       const std::vector<int64_t>& kv_len, int64_t block_size, int64_t num_blocks,
                       const char* kv_len_name) {
  AAR_CHECK_ARG(block_table.scalar_type() == at::kInt, op, ": block_table must be int32, got ",
                block_table.scalar_type());
  AAR_CHECK_ARG(block_table.dim() == 2 && block_table.size(0) == batch, op,
                ": block_table must be (batch=", batch, ", max_blocks), got ", block_table.sizes());
  AAR_CHECK_ARG(block_table.device().is_cpu(), op, ": the CPU twin needs a CPU block_table, got ",
                block_table.device());
  AAR_CHECK_ARG(block_size > 0, op, ": block size must be positive, got ", block_size);
  const int64_t max_blocks = block_table.size(1);
  const auto bt = block_table.accessor<int32_t, 2>();
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t n = kv_len[b];
    AAR_CHECK_ARG(n >= 0, op, ": ", kv_len_name, "[", b, "]=", n, " is negative");
    AAR_CHECK_ARG(n <= max_blocks * block_size, op, ": ", kv_len_name, "[", b, "]=", n,
                  " exceeds the block table capacity (", max_blocks, " blocks x ", block_size, " = ",
                  max_blocks * block_size, ")");
    const int64_t need = (n + block_size - 1) / block_size;
    for (int64_t i = 0; i < need; ++i) {
      const int64_t id = bt[b][i];
      AAR_CHECK_ARG(id >= 0 && id < num_blocks, op, ": block_table[", b, ", ", i, "]=", id,
                    " is out of range [0, ", num_blocks, ")");
    }
  }
}

at::Tensor gather_paged(const at::Tensor& cache, PagedLayout layout, const at::Tensor& block_table, int64_t row,
                        int64_t kv_len, int64_t block_size, int64_t num_kv_heads, int64_t head_dim) {
  const int64_t nblk = (kv_len + block_size - 1) / block_size;
  const at::Tensor ids = block_table.select(0, row).narrow(0, 0, nblk).to(at::kLong);
  at::Tensor blocks = cache.index_select(0, ids);
  switch (layout) {
    case PagedLayout::Hidden3D:
    case PagedLayout::Nd4D:
      break;  // already (nblk, bs, ...) token-major
    case PagedLayout::Bnbd4D:
      blocks = blocks.permute({0, 2, 1, 3});
      break;
    case PagedLayout::Nz5D:
      blocks = blocks.permute({0, 3, 1, 2, 4});
      break;
  }
  return blocks.reshape({nblk * block_size, num_kv_heads, head_dim}).narrow(0, 0, kv_len);
}

void attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const MaskSpec& mask, double scale,
            const at::Tensor& sink, at::Tensor out, at::Tensor lse) {
  const int64_t sq = q.size(0), n = q.size(1), d = q.size(2);
  const int64_t skv = k.size(0), nkv = k.size(1), dv = v.size(2);
  const int64_t g = n / nkv;
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();

  // (Nkv, G*Sq, D) x (Nkv, D, Skv): query head h = kv_head * G + r reads kv head h / G.
  const at::Tensor qf = q.to(at::kFloat).reshape({sq, nkv, g, d}).permute({1, 2, 0, 3}).reshape({nkv, g * sq, d});
  const at::Tensor kf = k.to(at::kFloat).permute({1, 2, 0});
  const at::Tensor vf = v.to(at::kFloat).permute({1, 0, 2});
  at::Tensor s = at::bmm(qf, kf).mul_(scale).view({nkv, g, sq, skv});

  bool need_mask = false;
  if (mask.sparse_mode == 3) {
    need_mask = sq > 1;  // a single query row (p = Skv - 1) sees every key
  } else if (mask.sparse_mode == 4) {
    need_mask = true;
  }
  if (need_mask) {
    const auto opts = at::TensorOptions().dtype(at::kLong);
    const at::Tensor p = at::arange(sq, opts).add_(skv - sq).view({sq, 1});  // right-down aligned position
    const at::Tensor j = at::arange(skv, opts).view({1, skv});
    at::Tensor allowed;
    if (mask.sparse_mode == 3) {
      allowed = j.le(p);
    } else {
      allowed = j.ge(p - mask.pre_tokens).logical_and_(j.le(p + mask.next_tokens));
    }
    s.masked_fill_(allowed.logical_not(), kNegInf);
  }

  at::Tensor m = std::get<0>(s.max(-1, /*keepdim=*/true));  // (Nkv, G, Sq, 1)
  at::Tensor sink4;
  if (sink.defined()) {
    sink4 = sink.to(at::kFloat).view({nkv, g, 1, 1});
    m = at::maximum(m, sink4);
  }
  const at::Tensor m_safe = m.masked_fill(m.eq(kNegInf), 0.0f);  // rows with no allowed key
  const at::Tensor pexp = s.sub_(m_safe).exp_();
  at::Tensor z = pexp.sum(-1, /*keepdim=*/true);
  if (sink.defined()) z.add_((sink4 - m_safe).exp_());

  // z == 0 only when no key is allowed, and then the numerator is 0 too.
  const at::Tensor o = at::bmm(pexp.view({nkv, g * sq, skv}), vf)
                           .view({nkv, g, sq, dv})
                           .div_(z.clamp_min(std::numeric_limits<float>::min()));
  out.copy_(o.permute({2, 0, 1, 3}).reshape({sq, n, dv}));
  if (lse.defined()) {
    lse.copy_((m_safe + z.log()).permute({2, 0, 1, 3}).reshape({sq, n, 1}));
  }
}

void check_compressed_mask(const char* op, const std::optional<at::Tensor>& mask, int64_t sparse_mode) {
  AAR_CHECK_ARG(mask.has_value() && mask->defined(), op, ": sparse_mode=", sparse_mode,
                " requires atten_mask (the compressed 2048x2048 mask)");
  const at::Tensor& t = *mask;
  const auto st = t.scalar_type();
  AAR_CHECK_ARG(st == at::kBool || st == at::kByte || st == at::kChar, op,
                ": atten_mask must be bool/uint8/int8, got ", st);
  bool ok = t.dim() >= 2 && t.size(-1) == 2048 && t.size(-2) == 2048;
  for (int64_t i = 0; ok && i + 2 < t.dim(); ++i) ok = t.size(i) == 1;
  AAR_CHECK_ARG(ok, op, ": sparse_mode=", sparse_mode,
                " needs the compressed atten_mask of shape (2048, 2048) (leading dims of size 1 allowed), got ",
                t.sizes());
}

}  // namespace aar::ops::cpu
