#include "ascend_attn_rt/gqa/validate.h"

#include "../common/impl_checks.h"
#include "../common/kv_cache.h"
#include "ascend_attn_rt/errors.h"

namespace aar::gqa {

const char* const kNdCacheLayout = "(num_blocks, block_size, num_kv_heads, head_size) = kv_cache_shape(...)[1:]";

void validate_layer_inputs(const LayerShape& s, const at::Tensor& query, const std::optional<at::Tensor>& key,
                           const std::optional<at::Tensor>& value, const Metadata& md, const at::Tensor& output,
                           int64_t min_query_rows, const char* rows_what) {
  const int64_t N = s.num_heads, Nkv = s.num_kv_heads, D = s.head_size;
  AAR_CHECK_ARG(query.defined() && query.dim() == 3 && query.sizes()[1] == N && query.sizes()[2] == D,
                "query must have shape (T, ", N, ", ", D, "), got ",
                query.defined() ? query.sizes() : c10::IntArrayRef{});
  const int64_t T = query.sizes()[0];
  const auto dtype = query.scalar_type();
  AAR_CHECK_ARG(dtype == at::kFloat || dtype == at::kHalf || dtype == at::kBFloat16,
                "query dtype must be float32, float16 or bfloat16, got ", dtype);
  AAR_CHECK_ARG(output.defined() && output.sizes() == query.sizes(), "output must have the query's shape ",
                query.sizes(), ", got ", output.defined() ? output.sizes() : c10::IntArrayRef{});
  AAR_CHECK_ARG(output.scalar_type() == dtype, "output dtype ", output.scalar_type(), " differs from query dtype ",
                dtype);
  AAR_CHECK_ARG(output.is_contiguous(), "output must be contiguous");
  AAR_CHECK_ARG(output.device() == query.device(), "output is on ", output.device(), " but query is on ",
                query.device());
  const internal::OutputApart apart(output);
  apart.check(query, "query");
  AAR_CHECK_ARG(T >= min_query_rows, "query has ", T, " rows but the metadata ", rows_what);
  AAR_CHECK_ARG(key.has_value() == value.has_value(), "key and value must be given together");
  if (!key.has_value()) return;
  for (const at::Tensor* t : {&*key, &*value}) {
    const char* name = t == &*key ? "key" : "value";
    AAR_CHECK_ARG(t->defined() && t->dim() == 3 && t->sizes()[1] == Nkv && t->sizes()[2] == D, name,
                  " must have shape (T, ", Nkv, ", ", D, "), got ", t->defined() ? t->sizes() : c10::IntArrayRef{});
    AAR_CHECK_ARG(t->sizes()[0] == md.num_input_tokens || t->sizes()[0] == md.num_actual_tokens, name, " has ",
                  t->sizes()[0], " rows; the metadata has num_input_tokens=", md.num_input_tokens,
                  " and num_actual_tokens=", md.num_actual_tokens);
    AAR_CHECK_ARG(t->scalar_type() == dtype, name, " dtype ", t->scalar_type(), " differs from query dtype ",
                  dtype);
    AAR_CHECK_ARG(t->device() == query.device(), name, " is on ", t->device(), " but query is on ",
                  query.device());
  }
  AAR_CHECK_ARG(key->sizes()[0] == value->sizes()[0], "key has ", key->sizes()[0], " rows but value has ",
                value->sizes()[0]);
  apart.check(*key, "key");
  apart.check(*value, "value");
}

void validate_nd_caches(const LayerShape& s, const at::Tensor& key_cache, const at::Tensor& value_cache,
                        const Metadata& md, at::ScalarType dtype, c10::Device device, const at::Tensor& output) {
  AAR_CHECK_ARG(key_cache.defined() == value_cache.defined(), "key_cache and value_cache must be given together");
  if (!key_cache.defined()) return;
  for (const at::Tensor* c : {&key_cache, &value_cache}) {
    const char* name = c == &key_cache ? "key_cache" : "value_cache";
    AAR_CHECK_ARG(c->dim() == 4 && c->sizes()[1] == md.block_size && c->sizes()[2] == s.num_kv_heads &&
                      c->sizes()[3] == s.head_size,
                  name, " must have shape (num_blocks, ", md.block_size, ", ", s.num_kv_heads, ", ", s.head_size,
                  "), got ", c->sizes());
    AAR_CHECK_ARG(c->sizes()[0] >= md.num_blocks, name, " has ", c->sizes()[0],
                  " blocks but the metadata was built for num_blocks=", md.num_blocks);
    detail::check_kv_cache_layout(*c, name, kNdCacheLayout);
    AAR_CHECK_ARG(c->scalar_type() == dtype, name, " dtype ", c->scalar_type(), " differs from query dtype ", dtype);
    AAR_CHECK_ARG(c->device() == device, name, " is on ", c->device(), " but query is on ", device);
  }
  AAR_CHECK_ARG(value_cache.sizes() == key_cache.sizes(), "value_cache shape ", value_cache.sizes(),
                " differs from key_cache shape ", key_cache.sizes(), " (a layer's K and V caches are one pair)");
  detail::check_caches_disjoint(key_cache, value_cache, "key_cache", "value_cache");
  const internal::OutputApart apart(output);
  apart.check(key_cache, "key_cache");
  apart.check(value_cache, "value_cache");
}

}  // namespace aar::gqa
