// C ABI of the GQA/MHA backend: builder, metadata facts, layer.
#include <memory>
#include <string>
#include <vector>

#include "ascend_attn_rt/gqa/builder.h"
#include "ascend_attn_rt/gqa/impl.h"
#include "internal.h"

using aar::capi::guarded;
namespace capi = aar::capi;
namespace gqa = aar::gqa;

struct aar_gqa_builder {
  static constexpr capi::Kind kKind = capi::Kind::GqaBuilder;
  capi::Tag tag;
  gqa::MetadataBuilder* builder;  // owned
  aar_gqa_metadata metadata;      // what build returns
};

namespace aar::capi {
struct GqaImplState {
  explicit GqaImplState(const gqa::ImplConfig& c) : impl(c) {}
  gqa::AttentionImpl impl;
  GqaCaches caches;
};
}  // namespace aar::capi

struct aar_gqa_impl {
  static constexpr capi::Kind kKind = capi::Kind::GqaImpl;
  capi::Tag tag;
  capi::GqaImplState* state;  // owned
};

namespace aar::capi {

gqa::ImplConfig gqa_impl_config(const aar_gqa_impl_config_t& cfg) {
  const aar_gqa_impl_config_t* c = &cfg;
  gqa::ImplConfig ic;
  ic.num_heads = c->num_heads;
  ic.head_size = c->head_size;
  ic.scale = c->scale;
  ic.num_kv_heads = c->num_kv_heads;
  AAR_CHECK_ARG(c->sliding_window >= 0, "config->sliding_window must be 0 (none) or positive, got ",
                c->sliding_window);
  if (c->sliding_window > 0) ic.sliding_window = c->sliding_window;
  ic.sinks = borrow_optional(c->sinks, "config->sinks");
  ic.has_alibi_slopes = flag(c->has_alibi_slopes, "config->has_alibi_slopes");
  AAR_CHECK_ARG(c->logits_soft_cap >= 0.0, "config->logits_soft_cap must be 0 (none) or positive, got ",
                c->logits_soft_cap);
  if (c->logits_soft_cap > 0.0) ic.logits_soft_cap = c->logits_soft_cap;
  if (c->kv_cache_dtype != nullptr) ic.kv_cache_dtype = c->kv_cache_dtype;
  ic.attn_type = attn_type(c->attn_type, "config->attn_type");
  ic.kv_sharing = flag(c->kv_sharing, "config->kv_sharing");
  ic.device_kind = device_kind(c->device_kind, "config->device_kind");
  ic.has_speculative_config = flag(c->has_speculative_config, "config->has_speculative_config");
  ic.full_decode_only_graph = flag(c->full_decode_only_graph, "config->full_decode_only_graph");
  const auto pa = host_array(c->pa_shape_list, c->pa_shape_list_len, "config->pa_shape_list");
  ic.pa_shape_list.assign(pa.begin(), pa.end());
  ic.layer_index = c->layer_index;
  ic.kv_cache_group = c->kv_cache_group;
  return ic;
}

}  // namespace aar::capi

namespace {

const aar_gqa_metadata_t* wrap(aar_gqa_builder* b, const gqa::Metadata& md) {
  b->metadata.md = &md;
  return &b->metadata;
}

gqa::BuildInputs build_inputs(const aar_gqa_build_inputs_t* in) {
  capi::check_struct(in, "inputs", "aar_gqa_build_inputs_init");
  gqa::BuildInputs b;
  b.query_start_loc = capi::host_array(in->query_start_loc, in->query_start_loc_len, "inputs->query_start_loc");
  b.seq_lens = capi::host_array(in->seq_lens, in->seq_lens_len, "inputs->seq_lens");
  b.block_table = capi::host_array(in->block_table, in->block_table_len, "inputs->block_table");
  b.block_table_stride = in->block_table_stride;
  b.num_input_tokens = in->num_input_tokens;
  b.attn_state = capi::attn_state(in->attn_state, "inputs->attn_state");
  b.is_prefilling = capi::host_array(in->is_prefilling, in->is_prefilling_len, "inputs->is_prefilling");
  b.num_spec_tokens = capi::host_array(in->num_spec_tokens, in->num_spec_tokens_len, "inputs->num_spec_tokens");
  b.causal = capi::flag(in->causal, "inputs->causal");
  return b;
}

}  // namespace

extern "C" {

void aar_gqa_builder_config_init(aar_gqa_builder_config_t* c) {
  if (c == nullptr) return;
  const gqa::BuilderConfig d;
  *c = aar_gqa_builder_config_t{};
  c->struct_size = sizeof(*c);
  c->max_num_reqs = d.max_num_reqs;
  c->max_num_tokens = d.max_num_tokens;
  c->max_blocks_per_req = d.max_blocks_per_req;
  c->block_size = d.block_size;
  c->num_blocks = d.num_blocks;
  c->num_speculative_tokens = d.num_speculative_tokens;
  c->spec_method = static_cast<int32_t>(d.spec_method);
  c->chunked_prefill_enabled = d.chunked_prefill_enabled;
  c->pooling = d.pooling;
  c->pad_fia_batch = d.pad_fia_batch;
  c->uniform_decode_padding = d.uniform_decode_padding;
  c->device = DLDevice{kDLCPU, 0};
  c->separate_device_buffers = AAR_DEFAULT;
  c->staging_buffers = d.staging_buffers;
  c->dense_context = AAR_DEFAULT;
}

void aar_gqa_build_inputs_init(aar_gqa_build_inputs_t* in) {
  if (in == nullptr) return;
  *in = aar_gqa_build_inputs_t{};
  in->struct_size = sizeof(*in);
  in->attn_state = AAR_STATE_AUTO;
  in->causal = 1;
}

void aar_gqa_impl_config_init(aar_gqa_impl_config_t* c) {
  if (c == nullptr) return;
  *c = aar_gqa_impl_config_t{};
  c->struct_size = sizeof(*c);
  c->layer_index = -1;
}

aar_status_t aar_gqa_builder_create(const aar_gqa_builder_config_t* c, aar_gqa_builder_t** out) {
  return guarded("aar_gqa_builder_create", [&] {
    capi::check_struct(c, "config", "aar_gqa_builder_config_init");
    capi::check_not_null(out, "out");
    gqa::BuilderConfig b;
    b.max_num_reqs = c->max_num_reqs;
    b.max_num_tokens = c->max_num_tokens;
    b.max_blocks_per_req = c->max_blocks_per_req;
    b.block_size = c->block_size;
    b.num_blocks = c->num_blocks;
    b.num_speculative_tokens = c->num_speculative_tokens;
    AAR_CHECK_ARG(c->spec_method >= 0 && c->spec_method <= 2,
                  "config->spec_method must be 0 (none), 1 (MTP) or 2 (other), got ", c->spec_method);
    b.spec_method = static_cast<aar::plan::SpecMethod>(c->spec_method);
    b.chunked_prefill_enabled = capi::flag(c->chunked_prefill_enabled, "config->chunked_prefill_enabled");
    b.pooling = capi::flag(c->pooling, "config->pooling");
    b.pad_fia_batch = capi::flag(c->pad_fia_batch, "config->pad_fia_batch");
    b.uniform_decode_padding = capi::flag(c->uniform_decode_padding, "config->uniform_decode_padding");
    b.device = capi::device_of(c->device, "config->device");
    b.separate_device_buffers = capi::tristate(c->separate_device_buffers, "config->separate_device_buffers");
    b.staging_buffers = c->staging_buffers;
    b.dense_context = capi::tristate(c->dense_context, "config->dense_context");
    auto builder = std::make_unique<gqa::MetadataBuilder>(b);
    aar_gqa_builder* h = capi::make<aar_gqa_builder>();
    h->builder = builder.release();
    capi::mark_live(h->metadata.tag, capi::Kind::GqaMetadata);
    h->metadata.md = &h->builder->metadata();
    *out = h;
  });
}

void aar_gqa_builder_destroy(aar_gqa_builder_t* b) {
  capi::destroy("aar_gqa_builder_destroy", b, "builder", [](aar_gqa_builder* h) {
    delete h->builder;
    capi::mark_dead(h->metadata.tag);
  });
}

aar_status_t aar_gqa_builder_build(aar_gqa_builder_t* b, const aar_gqa_build_inputs_t* in,
                                   const aar_gqa_metadata_t** out) {
  return guarded("aar_gqa_builder_build", [&] {
    capi::checked(b, "builder");
    capi::check_not_null(out, "out");
    const gqa::BuildInputs bi = build_inputs(in);
    *out = wrap(b, b->builder->build(bi));
  });
}

aar_status_t aar_gqa_builder_build_for_graph_capture(aar_gqa_builder_t* b, const aar_gqa_build_inputs_t* in,
                                                     aar_attn_state_t state, const aar_gqa_metadata_t** out) {
  return guarded("aar_gqa_builder_build_for_graph_capture", [&] {
    capi::checked(b, "builder");
    capi::check_not_null(out, "out");
    const gqa::BuildInputs bi = build_inputs(in);
    const auto s = capi::capture_state(state);
    *out = wrap(b, b->builder->build_for_graph_capture(bi, s));
  });
}

aar_status_t aar_gqa_builder_block_table(aar_gqa_builder_t* b, DLManagedTensor** out) {
  return capi::lend_block_table("aar_gqa_builder_block_table", b, out);
}

aar_status_t aar_gqa_metadata_get_info(const aar_gqa_metadata_t* m, aar_gqa_metadata_info_t* info) {
  return guarded("aar_gqa_metadata_get_info", [&] {
    const gqa::Metadata& md = *capi::unwrap(m, "metadata");
    capi::check_struct(info, "info", "sizeof(aar_gqa_metadata_info_t)");
    info->attn_state = capi::to_c(md.attn_state);
    info->num_reqs = md.num_reqs;
    info->num_kernel_reqs = md.num_kernel_reqs;
    info->num_actual_tokens = md.num_actual_tokens;
    info->num_input_tokens = md.num_input_tokens;
    info->num_kernel_tokens = md.num_kernel_tokens;
    info->num_decodes = md.num_decodes;
    info->num_prefills = md.num_prefills;
    info->num_decode_tokens = md.num_decode_tokens;
    info->max_query_len = md.max_query_len;
    info->max_seq_len = md.max_seq_len;
    info->generation = md.stamp.generation;
  });
}

aar_status_t aar_gqa_impl_create(const aar_gqa_impl_config_t* c, aar_gqa_impl_t** out) {
  return guarded("aar_gqa_impl_create", [&] {
    capi::check_struct(c, "config", "aar_gqa_impl_config_init");
    capi::check_not_null(out, "out");
    auto state = std::make_unique<capi::GqaImplState>(capi::gqa_impl_config(*c));
    aar_gqa_impl* h = capi::make<aar_gqa_impl>();
    h->state = state.release();
    *out = h;
  });
}

void aar_gqa_impl_destroy(aar_gqa_impl_t* impl) {
  capi::destroy("aar_gqa_impl_destroy", impl, "impl", [](aar_gqa_impl* h) { delete h->state; });
}

aar_status_t aar_gqa_impl_forward(aar_gqa_impl_t* impl, const DLManagedTensor* query, const DLManagedTensor* key,
                                  const DLManagedTensor* value, const DLManagedTensor* key_cache,
                                  const DLManagedTensor* value_cache, const aar_gqa_metadata_t* metadata,
                                  const DLManagedTensor* output) {
  return guarded("aar_gqa_impl_forward", [&] {
    capi::GqaImplState& st = *capi::checked(impl, "impl")->state;
    const gqa::Metadata* md = metadata ? capi::unwrap(metadata, "metadata") : nullptr;
    capi::gqa_forward(st.impl, st.caches, query, key, value, key_cache, value_cache, md, output);
  });
}

const char* aar_gqa_impl_last_path(const aar_gqa_impl_t* impl) {
  const char* path = "";
  guarded("aar_gqa_impl_last_path", [&] { path = gqa::to_string(capi::checked(impl, "impl")->state->impl.last_path()); });
  return path;
}

}  // extern "C"
