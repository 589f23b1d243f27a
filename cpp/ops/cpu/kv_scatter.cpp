#include "kv_scatter.h"

#include "attention_reference.h"

namespace aar::ops::cpu {

namespace {

// Returns the cache viewed as (nb, bs, per-token shape...) so that a slot
// indexes dims 0 and 1. For NZ the view is a permutation of the 5-D cache
// (writes through it land in the NZ storage).
at::Tensor token_major_view(const char* op, const char* name, const at::Tensor& t, const at::Tensor& cache,
                            CacheFormat format) {
  AAR_CHECK_ARG(t.dim() >= 2, op, ": ", name, " must be (tokens, heads, head_dim), got ", t.sizes());
  if (format == CacheFormat::Nd) {
    AAR_CHECK_ARG(cache.dim() >= 3, op, ": ", name, "_cache must be (num_blocks, block_size, ...), got ",
                  cache.sizes());
    AAR_CHECK_ARG(cache.sizes().slice(2) == t.sizes().slice(1), op, ": ", name, "_cache per-slot shape ",
                  cache.sizes().slice(2), " must equal the per-token ", name, " shape ", t.sizes().slice(1));
    return cache;
  }
  const int64_t c = 32 / static_cast<int64_t>(cache.element_size());
  AAR_CHECK_ARG(t.dim() == 3, op, ": ", name, " must be (tokens, Nkv, D) for the NZ cache, got ", t.sizes());
  const int64_t nkv = t.size(1), d = t.size(2);
  AAR_CHECK_ARG(cache.dim() == 5 && cache.size(1) == nkv && cache.size(4) == c && cache.size(2) * c == d, op, ": ",
                name, "_cache must be NZ (num_blocks, Nkv=", nkv, ", D/", c, ", block_size, ", c, ") for D=", d,
                ", got ", cache.sizes());
  return cache.permute({0, 3, 1, 2, 4});  // (nb, bs, Nkv, D/c, c)
}

}  // namespace

void scatter_kv(const char* op, const char* slot_name, const at::Tensor& key, const at::Tensor& value,
                at::Tensor& key_cache, at::Tensor& value_cache, const at::Tensor& slots, CacheFormat format) {
  // ---- validate everything first
  AAR_CHECK_ARG(key.scalar_type() == key_cache.scalar_type(), op, ": key dtype ", key.scalar_type(),
                " must equal key_cache dtype ", key_cache.scalar_type());
  AAR_CHECK_ARG(value.scalar_type() == value_cache.scalar_type(), op, ": value dtype ", value.scalar_type(),
                " must equal value_cache dtype ", value_cache.scalar_type());
  AAR_CHECK_ARG(slots.scalar_type() == at::kInt || slots.scalar_type() == at::kLong, op, ": ", slot_name,
                " must be int32 or int64, got ", slots.scalar_type());
  AAR_CHECK_ARG(slots.dim() == 1, op, ": ", slot_name, " must be 1-D, got ", slots.sizes());
  AAR_CHECK_ARG(key.dim() >= 1 && value.dim() >= 1 && key.size(0) == slots.size(0) && value.size(0) == slots.size(0),
                op, ": key/value must have one row per ", slot_name, " entry (", slots.size(0), "), got ",
                key.sizes(), " and ", value.sizes());
  for (const at::Tensor* t : std::initializer_list<const at::Tensor*>{&key, &value, &key_cache, &value_cache, &slots}) {
    AAR_CHECK_ARG(t->device().is_cpu(), op, ": the CPU twin needs CPU tensors, got one on ", t->device());
  }
  at::Tensor kview = token_major_view(op, "key", key, key_cache, format);
  at::Tensor vview = token_major_view(op, "value", value, value_cache, format);
  AAR_CHECK_ARG(kview.size(0) == vview.size(0) && kview.size(1) == vview.size(1), op,
                ": key_cache and value_cache must have the same (num_blocks, block_size), got ", key_cache.sizes(),
                " and ", value_cache.sizes());
  const int64_t nb = kview.size(0), bs = kview.size(1), capacity = nb * bs;

  const at::Tensor s = slots.to(at::kLong).contiguous();
  const int64_t* sp = s.data_ptr<int64_t>();
  const int64_t n = s.size(0);
  int64_t valid = 0;
  for (int64_t t = 0; t < n; ++t) {
    AAR_CHECK_ARG(sp[t] < capacity, op, ": ", slot_name, "[", t, "]=", sp[t], " is out of range (num_blocks ", nb,
                  " x block_size ", bs, " = ", capacity, " slots)");
    valid += sp[t] >= 0;
  }
  if (valid == 0) return;

  // ---- write: negative slots are padding and skipped
  at::Tensor rows = at::empty({valid}, at::kLong), blk = at::empty({valid}, at::kLong),
             off = at::empty({valid}, at::kLong);
  int64_t* rp = rows.data_ptr<int64_t>();
  int64_t* bp = blk.data_ptr<int64_t>();
  int64_t* op_ = off.data_ptr<int64_t>();
  for (int64_t t = 0, i = 0; t < n; ++t) {
    if (sp[t] < 0) continue;
    rp[i] = t;
    bp[i] = sp[t] / bs;
    op_[i] = sp[t] % bs;
    ++i;
  }
  const c10::List<std::optional<at::Tensor>> idx({blk, off});
  auto per_token = [&](const at::Tensor& t, const at::Tensor& view) {
    std::vector<int64_t> shape{valid};
    for (int64_t i = 2; i < view.dim(); ++i) shape.push_back(view.size(i));
    return t.index_select(0, rows).reshape(shape);
  };
  kview.index_put_(idx, per_token(key, kview));
  vview.index_put_(idx, per_token(value, vview));
}

}  // namespace aar::ops::cpu
