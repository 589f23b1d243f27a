// C ABI of the FA3 backend (a GQA variant over the GQA metadata, K/V read from the paged cache).
#include <memory>

#include "ascend_attn_rt/fa3/impl.h"
#include "ascend_attn_rt/gqa/metadata.h"
#include "internal.h"

using aar::capi::guarded;
namespace capi = aar::capi;
namespace fa3 = aar::fa3;

namespace aar::capi {
struct Fa3ImplState {
  explicit Fa3ImplState(const fa3::ImplConfig& c) : impl(c) {}
  fa3::AttentionImpl impl;
  GqaCaches caches;
};
}  // namespace aar::capi

struct aar_fa3_impl {
  static constexpr capi::Kind kKind = capi::Kind::Fa3Impl;
  capi::Tag tag;
  capi::Fa3ImplState* state;  // owned
};

extern "C" {

void aar_fa3_impl_config_init(aar_fa3_impl_config_t* c) {
  if (c == nullptr) return;
  const fa3::ImplConfig d;
  *c = aar_fa3_impl_config_t{};
  c->struct_size = sizeof(*c);
  c->enforce_eager = d.enforce_eager;
  c->full_decode_only_graph = d.full_decode_only_graph;
}

aar_status_t aar_fa3_impl_create(const aar_fa3_impl_config_t* c, aar_fa3_impl_t** out) {
  return guarded("aar_fa3_impl_create", [&] {
    capi::check_struct(c, "config", "aar_fa3_impl_config_init");
    capi::check_not_null(out, "out");
    fa3::ImplConfig ic;
    ic.num_heads = c->num_heads;
    ic.head_size = c->head_size;
    ic.scale = c->scale;
    ic.num_kv_heads = c->num_kv_heads;
    ic.attn_type = capi::attn_type(c->attn_type, "config->attn_type");
    ic.kv_sharing = capi::flag(c->kv_sharing, "config->kv_sharing");
    ic.enforce_eager = capi::flag(c->enforce_eager, "config->enforce_eager");
    ic.full_decode_only_graph = capi::flag(c->full_decode_only_graph, "config->full_decode_only_graph");
    auto state = std::make_unique<capi::Fa3ImplState>(ic);
    aar_fa3_impl* h = capi::make<aar_fa3_impl>();
    h->state = state.release();
    *out = h;
  });
}

void aar_fa3_impl_destroy(aar_fa3_impl_t* impl) {
  capi::destroy("aar_fa3_impl_destroy", impl, "impl", [](aar_fa3_impl* h) { delete h->state; });
}

aar_status_t aar_fa3_impl_forward(aar_fa3_impl_t* impl, const DLManagedTensor* query, const DLManagedTensor* key,
                                  const DLManagedTensor* value, const DLManagedTensor* key_cache,
                                  const DLManagedTensor* value_cache, const aar_gqa_metadata_t* metadata,
                                  const DLManagedTensor* output) {
  return guarded("aar_fa3_impl_forward", [&] {
    capi::Fa3ImplState& st = *capi::checked(impl, "impl")->state;
    const aar::gqa::Metadata* md = metadata ? capi::unwrap(metadata, "metadata") : nullptr;
    capi::gqa_forward(st.impl, st.caches, query, key, value, key_cache, value_cache, md, output);
  });
}

const char* aar_fa3_impl_last_path(const aar_fa3_impl_t* impl) {
  const char* path = "";
  guarded("aar_fa3_impl_last_path", [&] { path = fa3::to_string(capi::checked(impl, "impl")->state->impl.last_path()); });
  return path;
}

}  // extern "C"
