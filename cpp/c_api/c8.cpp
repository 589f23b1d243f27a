// C ABI of the C8 backend (static INT8 KV cache, a GQA variant over the GQA metadata).
#include <memory>

#include "ascend_attn_rt/c8/impl.h"
#include "ascend_attn_rt/gqa/metadata.h"
#include "internal.h"

using aar::capi::guarded;
namespace capi = aar::capi;
namespace c8 = aar::c8;

namespace aar::capi {
struct C8ImplState {
  explicit C8ImplState(const c8::ImplConfig& c) : impl(c) {}
  c8::AttentionImpl impl;
  GqaCaches caches;
};
}  // namespace aar::capi

struct aar_c8_impl {
  static constexpr capi::Kind kKind = capi::Kind::C8Impl;
  capi::Tag tag;
  capi::C8ImplState* state;  // owned
};

namespace {
at::Tensor optional_tensor(const DLManagedTensor* t, const char* name) {
  return t == nullptr ? at::Tensor() : capi::borrow(t, name);
}
}  // namespace

extern "C" {

void aar_c8_impl_config_init(aar_c8_impl_config_t* c) {
  if (c == nullptr) return;
  const c8::ImplConfig d;
  *c = aar_c8_impl_config_t{};
  c->struct_size = sizeof(*c);
  c->tp_rank = d.tp_rank;
  c->tp_size = d.tp_size;
  c->layer_index = d.layer_index;
  c->kv_cache_group = d.kv_cache_group;
}

aar_status_t aar_c8_impl_create(const aar_c8_impl_config_t* c, aar_c8_impl_t** out) {
  return guarded("aar_c8_impl_create", [&] {
    capi::check_struct(c, "config", "aar_c8_impl_config_init");
    capi::check_not_null(out, "out");
    c8::ImplConfig ic;
    ic.num_heads = c->num_heads;
    ic.head_size = c->head_size;
    ic.scale = c->scale;
    ic.num_kv_heads = c->num_kv_heads;
    ic.attn_type = capi::attn_type(c->attn_type, "config->attn_type");
    ic.kv_sharing = capi::flag(c->kv_sharing, "config->kv_sharing");
    AAR_CHECK_ARG(c->kv_transfer >= 0 && c->kv_transfer <= 2,
                  "config->kv_transfer must be 0 (none), 1 (producer) or 2 (consumer), got ", c->kv_transfer);
    ic.kv_transfer = static_cast<c8::KvTransferRole>(c->kv_transfer);
    ic.device_kind = capi::device_kind(c->device_kind, "config->device_kind");
    ic.tp_rank = c->tp_rank;
    ic.tp_size = c->tp_size;
    ic.scales.k_scale = optional_tensor(c->k_scale, "config->k_scale");
    ic.scales.k_offset = optional_tensor(c->k_offset, "config->k_offset");
    ic.scales.v_scale = optional_tensor(c->v_scale, "config->v_scale");
    ic.scales.v_offset = optional_tensor(c->v_offset, "config->v_offset");
    ic.layer_index = c->layer_index;
    ic.kv_cache_group = c->kv_cache_group;
    auto state = std::make_unique<capi::C8ImplState>(ic);
    aar_c8_impl* h = capi::make<aar_c8_impl>();
    h->state = state.release();
    *out = h;
  });
}

void aar_c8_impl_destroy(aar_c8_impl_t* impl) {
  capi::destroy("aar_c8_impl_destroy", impl, "impl", [](aar_c8_impl* h) { delete h->state; });
}

aar_status_t aar_c8_impl_forward(aar_c8_impl_t* impl, const DLManagedTensor* query, const DLManagedTensor* key,
                                 const DLManagedTensor* value, const DLManagedTensor* key_cache,
                                 const DLManagedTensor* value_cache, const aar_gqa_metadata_t* metadata,
                                 const DLManagedTensor* output) {
  return guarded("aar_c8_impl_forward", [&] {
    capi::C8ImplState& st = *capi::checked(impl, "impl")->state;
    const aar::gqa::Metadata* md = metadata ? capi::unwrap(metadata, "metadata") : nullptr;
    capi::gqa_forward(st.impl, st.caches, query, key, value, key_cache, value_cache, md, output);
  });
}

const char* aar_c8_impl_last_path(const aar_c8_impl_t* impl) {
  const char* path = "";
  guarded("aar_c8_impl_last_path", [&] { path = c8::to_string(capi::checked(impl, "impl")->state->impl.last_path()); });
  return path;
}

}  // extern "C"
