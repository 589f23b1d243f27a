// C ABI of the MLA backend: builder, metadata facts, layer (unquantised weights), and
// LatentAttention (the attention without the projections).
#include <algorithm>
#include <memory>
#include <vector>

#include "ascend_attn_rt/mla/builder.h"
#include "ascend_attn_rt/mla/impl.h"
#include "ascend_attn_rt/mla/latent_attention.h"
#include "cp_comm.h"
#include "internal.h"

using aar::capi::guarded;
namespace capi = aar::capi;
namespace cp = aar::cp;
namespace mla = aar::mla;

struct aar_mla_builder {
  static constexpr capi::Kind kKind = capi::Kind::MlaBuilder;
  capi::Tag tag;
  mla::MetadataBuilder* builder;  // owned
  aar_mla_metadata metadata;      // what build returns
};

namespace aar::capi {
// A context-parallel layer borrows its Comms (ImplConfig's pointers): the state holds a
// reference to each first, so they outlive the layer whatever the caller destroys first.
struct MlaImplState {
  MlaImplState(const mla::ImplConfig& c, const mla::Weights& w, std::shared_ptr<cp::Comm> dcp_ = nullptr,
               std::shared_ptr<cp::Comm> pcp_ = nullptr)
      : dcp(std::move(dcp_)), pcp(std::move(pcp_)), impl(with_comms(c, dcp.get(), pcp.get()), w) {}
  static mla::ImplConfig with_comms(mla::ImplConfig c, cp::Comm* d, cp::Comm* p) {
    c.dcp_comm = d;
    c.pcp_comm = p;
    return c;
  }
  std::shared_ptr<cp::Comm> dcp, pcp;
  mla::Impl impl;
  BorrowCache nope_cache, rope_cache;
};
}  // namespace aar::capi

struct aar_mla_impl {
  static constexpr capi::Kind kKind = capi::Kind::MlaImpl;
  capi::Tag tag;
  capi::MlaImplState* state;  // owned
};

namespace {

const aar_mla_metadata_t* wrap(aar_mla_builder* b, const mla::Metadata& md) {
  b->metadata.md = &md;
  return &b->metadata;
}

at::Tensor required(const DLManagedTensor* t, const char* name) { return capi::borrow(t, name); }

// aar_mla_builder_config_t as the C++ config, every field checked by its C name.
mla::BuilderConfig builder_config(const aar_mla_builder_config_t* c) {
  mla::BuilderConfig b;
  b.max_num_reqs = c->max_num_reqs;
  b.max_num_tokens = c->max_num_tokens;
  b.max_blocks_per_req = c->max_blocks_per_req;
  b.block_size = c->block_size;
  b.num_blocks = c->num_blocks;
  b.max_model_len = c->max_model_len;
  b.num_speculative_tokens = c->num_speculative_tokens;
  b.chunked_prefill_enabled = capi::flag(c->chunked_prefill_enabled, "config->chunked_prefill_enabled");
  b.graph_decode_padding = capi::flag(c->graph_decode_padding, "config->graph_decode_padding");
  b.disable_padded_drafter_batch =
      capi::flag(c->disable_padded_drafter_batch, "config->disable_padded_drafter_batch");
  b.workspace_tokens = c->workspace_tokens;
  b.cos_table = required(c->cos_table, "config->cos_table");
  b.sin_table = required(c->sin_table, "config->sin_table");
  b.device = capi::device_of(c->device, "config->device");
  b.separate_device_buffers = capi::tristate(c->separate_device_buffers, "config->separate_device_buffers");
  b.staging_buffers = c->staging_buffers;
  return b;
}

// aar_mla_builder_cp_t's fields into b, checked by their C names.
void cp_fields(const aar_mla_builder_cp_t& c, mla::BuilderConfig& b) {
  capi::check_group("cp->", "dcp_world_size", c.dcp_world_size, "dcp_rank", c.dcp_rank);
  AAR_CHECK_ARG(c.interleave >= 1 && b.block_size % c.interleave == 0, "cp->interleave=", c.interleave,
                " must be >= 1 and divide config->block_size=", b.block_size);
  capi::check_group("cp->", "pcp_world_size", c.pcp_world_size, "pcp_rank", c.pcp_rank);
  b.dcp_world_size = c.dcp_world_size;
  b.dcp_rank = c.dcp_rank;
  b.cp_kv_cache_interleave_size = c.interleave;
  b.pd_recompute_scheduler = capi::flag(c.pd_recompute_scheduler, "cp->pd_recompute_scheduler");
  b.pcp_world_size = c.pcp_world_size;
  b.pcp_rank = c.pcp_rank;
}

// aar_mla_build_inputs_t as the C++ inputs, checked by their C names.
mla::BuildInputs build_inputs(const aar_mla_build_inputs_t* in) {
  capi::check_struct(in, "inputs", "aar_mla_build_inputs_init");
  mla::BuildInputs bi;
  bi.query_start_loc = capi::host_array(in->query_start_loc, in->query_start_loc_len, "inputs->query_start_loc");
  bi.seq_lens = capi::host_array(in->seq_lens, in->seq_lens_len, "inputs->seq_lens");
  bi.block_table = capi::host_array(in->block_table, in->block_table_len, "inputs->block_table");
  bi.block_table_stride = in->block_table_stride;
  bi.num_input_tokens = in->num_input_tokens;
  bi.attn_state = capi::attn_state(in->attn_state, "inputs->attn_state");
  bi.num_spec_tokens = capi::host_array(in->num_spec_tokens, in->num_spec_tokens_len, "inputs->num_spec_tokens");
  return bi;
}

// aar_mla_build_inputs_ext_t's fields into bi, checked by their C names. The C++ builder reads
// is_prefilling only where the DCP split consults it (the KV sharded over more than one rank,
// no P/D recompute scheduler, not a draft step: docs/design/cp.md §3.2); elsewhere it would be
// ignored, so it is refused rather than accepted.
void ext_fields(const aar_mla_build_inputs_ext_t& e, size_t num_reqs, const mla::BuilderConfig& cfg,
                mla::BuildInputs& bi) {
  AAR_CHECK_ARG(e.draft_step >= -1, "ext->draft_step must be -1 (a normal step) or a draft step >= 0, got ",
                e.draft_step);
  bi.draft_step = e.draft_step;
  bi.is_prefilling = capi::host_array(e.is_prefilling, e.is_prefilling_len, "ext->is_prefilling");
  if (bi.is_prefilling.empty()) return;
  AAR_CHECK_ARG(e.is_prefilling_len == num_reqs, "ext->is_prefilling_len=", e.is_prefilling_len,
                " must equal inputs->seq_lens_len=", num_reqs, " (one flag per request)");
  const bool sharded = int64_t{cfg.dcp_world_size} * cfg.pcp_world_size > 1;
  AAR_CHECK_ARG(sharded, "ext->is_prefilling was given, but a builder without DCP or PCP does not read it (short "
                         "extends are decodes there); give NULL");
  AAR_CHECK_ARG(!cfg.pd_recompute_scheduler, "ext->is_prefilling was given, but a builder with "
                "cp->pd_recompute_scheduler does not read it (its requests of at most the decode threshold are "
                "decodes); give NULL");
  AAR_CHECK_ARG(e.draft_step < 0, "ext->is_prefilling was given with ext->draft_step=", e.draft_step,
                ": every request of a draft step is a decode; give NULL");
}

aar_mla_builder* make_builder(const mla::BuilderConfig& b) {
  auto builder = std::make_unique<mla::MetadataBuilder>(b);
  aar_mla_builder* h = capi::make<aar_mla_builder>();
  h->builder = builder.release();
  capi::mark_live(h->metadata.tag, capi::Kind::MlaMetadata);
  h->metadata.md = &h->builder->metadata();
  return h;
}

// aar_mla_impl_config_t and aar_mla_weights_t as the C++ config and weights, checked by their C names.
void impl_args(const aar_mla_impl_config_t& c, const aar_mla_weights_t& w, mla::ImplConfig& ic, mla::Weights& mw) {
  AAR_CHECK_ARG(c.q_lora_rank >= 0, "config->q_lora_rank must be 0 (no q-LoRA) or positive, got ", c.q_lora_rank);
  ic.dims = {c.num_heads,        c.hidden_size,
             c.q_lora_rank > 0 ? std::optional<int64_t>(c.q_lora_rank) : std::nullopt,
             c.kv_lora_rank,     c.qk_nope_head_dim,
             c.qk_rope_head_dim, c.v_head_dim};
  ic.scale = c.scale;
  ic.q_norm_eps = c.q_norm_eps;
  ic.kv_norm_eps = c.kv_norm_eps;
  ic.enable_prolog = capi::flag(c.enable_prolog, "config->enable_prolog");
  ic.enable_kv_nz = capi::flag(c.enable_kv_nz, "config->enable_kv_nz");
  ic.layer_index = c.layer_index;
  ic.prefill_in_bf16 = capi::tristate(c.prefill_in_bf16, "config->prefill_in_bf16");
  ic.workspace_group = c.workspace_group;
  const bool lora = c.q_lora_rank > 0;
  AAR_CHECK_ARG(lora == (w.q_a_proj != nullptr), "weights->q_a_proj must be given exactly when q_lora_rank > 0 (",
                c.q_lora_rank, "), got ", w.q_a_proj ? "a tensor" : "NULL");
  AAR_CHECK_ARG(lora == (w.q_a_layernorm != nullptr),
                "weights->q_a_layernorm must be given exactly when q_lora_rank > 0 (", c.q_lora_rank, "), got ",
                w.q_a_layernorm ? "a tensor" : "NULL");
  mw.q_a_proj = capi::borrow_optional(w.q_a_proj, "weights->q_a_proj");
  mw.q_a_layernorm = capi::borrow_optional(w.q_a_layernorm, "weights->q_a_layernorm");
  mw.q_proj = required(w.q_proj, "weights->q_proj");
  mw.kv_a_proj_with_mqa = required(w.kv_a_proj_with_mqa, "weights->kv_a_proj_with_mqa");
  mw.kv_a_layernorm = required(w.kv_a_layernorm, "weights->kv_a_layernorm");
  mw.kv_b_proj = required(w.kv_b_proj, "weights->kv_b_proj");
  mw.o_proj = required(w.o_proj, "weights->o_proj");
}

}  // namespace

extern "C" {

void aar_mla_builder_config_init(aar_mla_builder_config_t* c) {
  if (c == nullptr) return;
  const mla::BuilderConfig d;
  *c = aar_mla_builder_config_t{};
  c->struct_size = sizeof(*c);
  c->max_num_reqs = d.max_num_reqs;
  c->max_num_tokens = d.max_num_tokens;
  c->max_blocks_per_req = d.max_blocks_per_req;
  c->block_size = d.block_size;
  c->num_blocks = d.num_blocks;
  c->max_model_len = d.max_model_len;
  c->num_speculative_tokens = d.num_speculative_tokens;
  c->chunked_prefill_enabled = d.chunked_prefill_enabled;
  c->graph_decode_padding = d.graph_decode_padding;
  c->disable_padded_drafter_batch = d.disable_padded_drafter_batch;
  c->workspace_tokens = d.workspace_tokens;
  c->device = DLDevice{kDLCPU, 0};
  c->separate_device_buffers = AAR_DEFAULT;
  c->staging_buffers = d.staging_buffers;
}

void aar_mla_build_inputs_init(aar_mla_build_inputs_t* in) {
  if (in == nullptr) return;
  *in = aar_mla_build_inputs_t{};
  in->struct_size = sizeof(*in);
  in->attn_state = AAR_STATE_AUTO;
}

void aar_mla_impl_config_init(aar_mla_impl_config_t* c) {
  if (c == nullptr) return;
  const mla::ImplConfig d;
  *c = aar_mla_impl_config_t{};
  c->struct_size = sizeof(*c);
  c->kv_lora_rank = d.dims.kv_lora_rank;
  c->qk_nope_head_dim = d.dims.qk_nope_head_dim;
  c->qk_rope_head_dim = d.dims.qk_rope_head_dim;
  c->v_head_dim = d.dims.v_head_dim;
  c->scale = d.scale;
  c->q_norm_eps = d.q_norm_eps;
  c->kv_norm_eps = d.kv_norm_eps;
  c->layer_index = d.layer_index;
  c->prefill_in_bf16 = AAR_DEFAULT;
  c->workspace_group = d.workspace_group;
}

void aar_mla_weights_init(aar_mla_weights_t* w) {
  if (w == nullptr) return;
  *w = aar_mla_weights_t{};
  w->struct_size = sizeof(*w);
}

aar_status_t aar_mla_builder_create(const aar_mla_builder_config_t* c, aar_mla_builder_t** out) {
  return guarded("aar_mla_builder_create", [&] {
    capi::check_struct(c, "config", "aar_mla_builder_config_init");
    capi::check_not_null(out, "out");
    *out = make_builder(builder_config(c));
  });
}

void aar_mla_builder_cp_init(aar_mla_builder_cp_t* c) {
  if (c == nullptr) return;
  const mla::BuilderConfig d;
  *c = aar_mla_builder_cp_t{};
  c->struct_size = sizeof(*c);
  c->dcp_world_size = d.dcp_world_size;
  c->dcp_rank = d.dcp_rank;
  c->interleave = d.cp_kv_cache_interleave_size;
  c->pd_recompute_scheduler = d.pd_recompute_scheduler ? 1 : 0;
  c->pcp_world_size = d.pcp_world_size;
  c->pcp_rank = d.pcp_rank;
}

aar_status_t aar_mla_builder_create_cp(const aar_mla_builder_config_t* c, const aar_mla_builder_cp_t* cp,
                                       aar_mla_builder_t** out) {
  return guarded("aar_mla_builder_create_cp", [&] {
    capi::check_struct(c, "config", "aar_mla_builder_config_init");
    capi::check_struct(cp, "cp", "aar_mla_builder_cp_init");
    capi::check_not_null(out, "out");
    mla::BuilderConfig b = builder_config(c);
    cp_fields(*cp, b);
    *out = make_builder(b);
  });
}

void aar_mla_builder_destroy(aar_mla_builder_t* b) {
  capi::destroy("aar_mla_builder_destroy", b, "builder", [](aar_mla_builder* h) {
    delete h->builder;
    capi::mark_dead(h->metadata.tag);
  });
}

aar_status_t aar_mla_builder_build(aar_mla_builder_t* b, const aar_mla_build_inputs_t* in,
                                   const aar_mla_metadata_t** out) {
  return guarded("aar_mla_builder_build", [&] {
    capi::checked(b, "builder");
    capi::check_not_null(out, "out");
    const mla::BuildInputs bi = build_inputs(in);
    *out = wrap(b, b->builder->build(bi));
  });
}

void aar_mla_build_inputs_ext_init(aar_mla_build_inputs_ext_t* ext) {
  if (ext == nullptr) return;
  const mla::BuildInputs d;
  *ext = aar_mla_build_inputs_ext_t{};
  ext->struct_size = sizeof(*ext);
  ext->draft_step = d.draft_step;
}

aar_status_t aar_mla_builder_build_ext(aar_mla_builder_t* b, const aar_mla_build_inputs_t* in,
                                       const aar_mla_build_inputs_ext_t* ext, const aar_mla_metadata_t** out) {
  return guarded("aar_mla_builder_build_ext", [&] {
    capi::checked(b, "builder");
    capi::check_not_null(out, "out");
    mla::BuildInputs bi = build_inputs(in);
    capi::check_struct(ext, "ext", "aar_mla_build_inputs_ext_init");
    ext_fields(*ext, in->seq_lens_len, b->builder->config(), bi);
    *out = wrap(b, b->builder->build(bi));
  });
}

aar_status_t aar_mla_builder_pcp_local_rows(const aar_mla_builder_t* b, int32_t* token_index, size_t capacity,
                                            size_t* count) {
  return guarded("aar_mla_builder_pcp_local_rows", [&] {
    const mla::MetadataBuilder& builder = *capi::checked(b, "builder")->builder;
    capi::check_not_null(count, "count");
    const std::vector<int32_t>& idx = builder.pcp_local_token_index();
    const size_t n = idx.size();
    if (token_index != nullptr) {
      AAR_CHECK_ARG(capacity >= n, "capacity=", capacity, " is less than the ", n,
                    " local rows of the latest build (num_local_tokens)");
      std::copy(idx.begin(), idx.end(), token_index);
    }
    *count = n;
  });
}

aar_status_t aar_mla_builder_block_table(aar_mla_builder_t* b, DLManagedTensor** out) {
  return capi::lend_block_table("aar_mla_builder_block_table", b, out);
}

aar_status_t aar_mla_metadata_get_info(const aar_mla_metadata_t* m, aar_mla_metadata_info_t* info) {
  return guarded("aar_mla_metadata_get_info", [&] {
    const mla::Metadata& md = *capi::unwrap(m, "metadata");
    capi::check_struct(info, "info", "sizeof(aar_mla_metadata_info_t)");
    info->attn_state = capi::to_c(md.attn_state);
    info->num_reqs = md.num_reqs;
    info->num_kernel_reqs = md.num_kernel_reqs;
    info->num_actual_tokens = md.num_actual_tokens;
    info->num_input_tokens = md.num_input_tokens;
    info->num_decodes = md.num_decodes;
    info->num_prefills = md.num_prefills;
    info->num_decode_tokens = md.num_decode_tokens;
    info->num_prefill_tokens = md.num_prefill_tokens;
    info->generation = md.stamp.generation;
  });
}

aar_status_t aar_mla_impl_create(const aar_mla_impl_config_t* c, const aar_mla_weights_t* w, aar_mla_impl_t** out) {
  return guarded("aar_mla_impl_create", [&] {
    capi::check_struct(c, "config", "aar_mla_impl_config_init");
    capi::check_struct(w, "weights", "aar_mla_weights_init");
    capi::check_not_null(out, "out");
    mla::ImplConfig ic;
    mla::Weights mw;
    impl_args(*c, *w, ic, mw);
    auto state = std::make_unique<capi::MlaImplState>(ic, mw);
    aar_mla_impl* h = capi::make<aar_mla_impl>();
    h->state = state.release();
    *out = h;
  });
}

aar_status_t aar_mla_impl_create_cp(const aar_mla_impl_config_t* c, const aar_mla_weights_t* w,
                                    aar_cp_comm_t* dcp_comm, aar_cp_comm_t* pcp_comm, aar_mla_impl_t** out) {
  return guarded("aar_mla_impl_create_cp", [&] {
    capi::check_struct(c, "config", "aar_mla_impl_config_init");
    capi::check_struct(w, "weights", "aar_mla_weights_init");
    AAR_CHECK_ARG(dcp_comm != nullptr || pcp_comm != nullptr,
                  "dcp_comm and pcp_comm are both NULL (aar_mla_impl_create makes a single-rank layer)");
    std::shared_ptr<cp::Comm> d = dcp_comm != nullptr ? capi::comm_of(dcp_comm, "dcp_comm") : nullptr;
    std::shared_ptr<cp::Comm> p = pcp_comm != nullptr ? capi::comm_of(pcp_comm, "pcp_comm") : nullptr;
    capi::check_not_null(out, "out");
    mla::ImplConfig ic;
    mla::Weights mw;
    impl_args(*c, *w, ic, mw);
    auto state = std::make_unique<capi::MlaImplState>(ic, mw, std::move(d), std::move(p));
    aar_mla_impl* h = capi::make<aar_mla_impl>();
    h->state = state.release();
    *out = h;
  });
}

void aar_mla_impl_destroy(aar_mla_impl_t* impl) {
  capi::destroy("aar_mla_impl_destroy", impl, "impl", [](aar_mla_impl* h) { delete h->state; });
}

aar_status_t aar_mla_impl_forward(aar_mla_impl_t* impl, const DLManagedTensor* hidden,
                                  const DLManagedTensor* nope_cache, const DLManagedTensor* rope_cache,
                                  const aar_mla_metadata_t* metadata, const DLManagedTensor* output) {
  return guarded("aar_mla_impl_forward", [&] {
    capi::MlaImplState& st = *capi::checked(impl, "impl")->state;
    const mla::Metadata* md = metadata ? capi::unwrap(metadata, "metadata") : nullptr;
    const at::Tensor h = capi::borrow(hidden, "hidden");
    const at::Tensor nc = st.nope_cache.get(nope_cache, "nope_cache");
    const at::Tensor rc = st.rope_cache.get(rope_cache, "rope_cache");
    const at::Tensor out = capi::borrow(output, "output");
    st.impl.forward(h, nc, rc, md, out);
  });
}

}  // extern "C"

// ---------------------------------------------------------------- LatentAttention
namespace aar::capi {
struct MlaLatentState {
  explicit MlaLatentState(const mla::LatentAttentionConfig& c) : attn(c) {}
  mla::LatentAttention attn;
  BorrowCache nope_cache, rope_cache;
};
}  // namespace aar::capi

struct aar_mla_latent {
  static constexpr capi::Kind kKind = capi::Kind::MlaLatent;
  capi::Tag tag;
  capi::MlaLatentState* state;  // owned
};

extern "C" {

void aar_mla_latent_config_init(aar_mla_latent_config_t* c) {
  if (c == nullptr) return;
  const mla::LatentAttentionConfig d;
  *c = aar_mla_latent_config_t{};
  c->struct_size = sizeof(*c);
  c->kv_lora_rank = d.kv_lora_rank;
  c->qk_nope_head_dim = d.qk_nope_head_dim;
  c->qk_rope_head_dim = d.qk_rope_head_dim;
  c->v_head_dim = d.v_head_dim;
  c->scale = d.scale;
  c->prefill_in_bf16 = AAR_DEFAULT;
  c->workspace_group = d.workspace_group;
}

aar_status_t aar_mla_latent_create(const aar_mla_latent_config_t* c, aar_mla_latent_t** out) {
  return guarded("aar_mla_latent_create", [&] {
    capi::check_struct(c, "config", "aar_mla_latent_config_init");
    capi::check_not_null(out, "out");
    mla::LatentAttentionConfig lc;
    lc.num_heads = c->num_heads;
    lc.kv_lora_rank = c->kv_lora_rank;
    lc.qk_nope_head_dim = c->qk_nope_head_dim;
    lc.qk_rope_head_dim = c->qk_rope_head_dim;
    lc.v_head_dim = c->v_head_dim;
    lc.scale = c->scale;
    lc.prefill_in_bf16 = capi::tristate(c->prefill_in_bf16, "config->prefill_in_bf16");
    lc.workspace_group = c->workspace_group;
    auto state = std::make_unique<capi::MlaLatentState>(lc);
    aar_mla_latent* h = capi::make<aar_mla_latent>();
    h->state = state.release();
    *out = h;
  });
}

void aar_mla_latent_destroy(aar_mla_latent_t* latent) {
  capi::destroy("aar_mla_latent_destroy", latent, "latent", [](aar_mla_latent* h) { delete h->state; });
}

aar_status_t aar_mla_latent_write_kv(aar_mla_latent_t* latent, const DLManagedTensor* kv_c, const DLManagedTensor* k_pe,
                                     const DLManagedTensor* slot_mapping, const DLManagedTensor* nope_cache,
                                     const DLManagedTensor* rope_cache) {
  return guarded("aar_mla_latent_write_kv", [&] {
    capi::MlaLatentState& st = *capi::checked(latent, "latent")->state;
    const at::Tensor c = capi::borrow(kv_c, "kv_c");
    const at::Tensor pe = capi::borrow(k_pe, "k_pe");
    const at::Tensor slots = capi::borrow(slot_mapping, "slot_mapping");
    const at::Tensor nc = st.nope_cache.get(nope_cache, "nope_cache");
    const at::Tensor rc = st.rope_cache.get(rope_cache, "rope_cache");
    st.attn.write_kv(c, pe, slots, nc, rc);
  });
}

aar_status_t aar_mla_latent_forward_decode(aar_mla_latent_t* latent, const DLManagedTensor* ql_nope,
                                           const DLManagedTensor* q_pe, const DLManagedTensor* nope_cache,
                                           const DLManagedTensor* rope_cache, const aar_mla_metadata_t* metadata,
                                           const DLManagedTensor* out) {
  return guarded("aar_mla_latent_forward_decode", [&] {
    capi::MlaLatentState& st = *capi::checked(latent, "latent")->state;
    const mla::Metadata* md = metadata ? capi::unwrap(metadata, "metadata") : nullptr;
    const at::Tensor ql = capi::borrow(ql_nope, "ql_nope");
    const at::Tensor qp = capi::borrow(q_pe, "q_pe");
    const at::Tensor nc = st.nope_cache.get(nope_cache, "nope_cache");
    const at::Tensor rc = st.rope_cache.get(rope_cache, "rope_cache");
    const at::Tensor o = capi::borrow(out, "out");
    st.attn.forward_decode(ql, qp, nc, rc, md, o);
  });
}

aar_status_t aar_mla_latent_forward_prefill(aar_mla_latent_t* latent, const DLManagedTensor* q,
                                            const DLManagedTensor* kv_c, const DLManagedTensor* k_pe,
                                            const DLManagedTensor* nope_cache, const DLManagedTensor* rope_cache,
                                            const aar_mla_metadata_t* metadata, const DLManagedTensor* out,
                                            const DLManagedTensor* kv_b_proj) {
  return guarded("aar_mla_latent_forward_prefill", [&] {
    capi::MlaLatentState& st = *capi::checked(latent, "latent")->state;
    const mla::Metadata* md = metadata ? capi::unwrap(metadata, "metadata") : nullptr;
    const at::Tensor qq = capi::borrow(q, "q");
    const at::Tensor c = capi::borrow(kv_c, "kv_c");
    const at::Tensor pe = capi::borrow(k_pe, "k_pe");
    const at::Tensor nc = st.nope_cache.get(nope_cache, "nope_cache");
    const at::Tensor rc = st.rope_cache.get(rope_cache, "rope_cache");
    const at::Tensor o = capi::borrow(out, "out");
    const at::Tensor w = capi::borrow(kv_b_proj, "kv_b_proj");
    st.attn.forward_prefill(qq, c, pe, nc, rc, md, o, w);
  });
}

}  // extern "C"
