// C ABI of the SFA backend: builder (main and draft lanes), metadata facts, the
// model's top-k buffer, the layer (unquantised weights, no offload); DCP and PCP (version 7):
// the builder's CP fields and the layer's communicators, the same handles otherwise.
#include <algorithm>
#include <memory>
#include <optional>
#include <vector>

#include "ascend_attn_rt/sfa/builder.h"
#include "ascend_attn_rt/sfa/impl.h"
#include "ascend_attn_rt/sparse/topk_buffer.h"
#include "cp_comm.h"
#include "internal.h"

using aar::capi::guarded;
namespace capi = aar::capi;
namespace sfa = aar::sfa;
namespace mla = aar::mla;
namespace cp = aar::cp;

struct aar_sfa_metadata {
  static constexpr capi::Kind kKind = capi::Kind::SfaMetadata;
  capi::Tag tag;
  const sfa::Metadata* md;
};

struct aar_sfa_builder {
  static constexpr capi::Kind kKind = capi::Kind::SfaBuilder;
  capi::Tag tag;
  sfa::MetadataBuilder* builder;                     // owned
  capi::LaneShells<aar_sfa_metadata> metadata;       // owned: [0] main, [1 + d] draft lane d
};

namespace aar::capi {
// The cache tuple's tensors, one borrow cache per position (the composed tuple has at most 4).
constexpr size_t kSfaMaxKv = 4;
// A context-parallel layer borrows its Comms (ImplConfig's pointers): the state holds a reference to
// each first, so they outlive the layer whatever the caller destroys first (as MlaImplState).
struct SfaImplState {
  SfaImplState(const sfa::ImplConfig& c, const mla::Weights& w, const std::optional<sfa::IndexerWeights>& iw,
               std::shared_ptr<cp::Comm> dcp_ = nullptr, std::shared_ptr<cp::Comm> pcp_ = nullptr)
      : dcp(std::move(dcp_)), pcp(std::move(pcp_)), impl(with_comms(c, dcp.get(), pcp.get()), w, iw) {}
  static sfa::ImplConfig with_comms(sfa::ImplConfig c, cp::Comm* d, cp::Comm* p) {
    c.dcp_comm = d;
    c.pcp_comm = p;
    return c;
  }
  std::shared_ptr<cp::Comm> dcp, pcp;
  sfa::Impl impl;
  BorrowCache kv[kSfaMaxKv];
  std::vector<at::Tensor> tuple;  // kept between calls: a steady-state call allocates no vector
};
}  // namespace aar::capi

struct aar_sfa_impl {
  static constexpr capi::Kind kKind = capi::Kind::SfaImpl;
  capi::Tag tag;
  capi::SfaImplState* state;  // owned
};

namespace {

sfa::BuildInputs build_inputs(const aar_sfa_build_inputs_t* in) {
  capi::check_struct(in, "inputs", "aar_sfa_build_inputs_init");
  sfa::BuildInputs bi;
  bi.query_start_loc = capi::host_array(in->query_start_loc, in->query_start_loc_len, "inputs->query_start_loc");
  bi.seq_lens = capi::host_array(in->seq_lens, in->seq_lens_len, "inputs->seq_lens");
  bi.block_table = capi::host_array(in->block_table, in->block_table_len, "inputs->block_table");
  bi.block_table_stride = in->block_table_stride;
  bi.num_input_tokens = in->num_input_tokens;
  bi.attn_state = capi::attn_state(in->attn_state, "inputs->attn_state");
  bi.num_spec_tokens = capi::host_array(in->num_spec_tokens, in->num_spec_tokens_len, "inputs->num_spec_tokens");
  return bi;
}

// aar_sfa_builder_config_t as the C++ config, every field checked by its C name.
sfa::BuilderConfig builder_config(const aar_sfa_builder_config_t* c) {
  sfa::BuilderConfig b;
  b.max_num_reqs = c->max_num_reqs;
  b.max_num_tokens = c->max_num_tokens;
  b.max_blocks_per_req = c->max_blocks_per_req;
  b.block_size = c->block_size;
  b.num_blocks = c->num_blocks;
  b.num_speculative_tokens = c->num_speculative_tokens;
  AAR_CHECK_ARG(c->num_drafts >= -1, "config->num_drafts must be -1 (num_speculative_tokens) or >= 0, got ",
                c->num_drafts);
  if (c->num_drafts >= 0) b.num_drafts = c->num_drafts;
  b.chunked_prefill_enabled = capi::flag(c->chunked_prefill_enabled, "config->chunked_prefill_enabled");
  b.graph_decode_padding = capi::flag(c->graph_decode_padding, "config->graph_decode_padding");
  b.cos_table = capi::borrow(c->cos_table, "config->cos_table");
  b.sin_table = capi::borrow(c->sin_table, "config->sin_table");
  b.device = capi::device_of(c->device, "config->device");
  b.separate_device_buffers = capi::tristate(c->separate_device_buffers, "config->separate_device_buffers");
  b.staging_buffers = c->staging_buffers;
  return b;
}

// aar_sfa_builder_cp_t's fields into b, checked by their C names (the C++ builder repeats the
// checks under its own names and refuses what it does not build: graph decode padding or a
// draft lane's PCP build, ...).
void cp_fields(const aar_sfa_builder_cp_t& c, sfa::BuilderConfig& b) {
  capi::check_group("cp->", "dcp_world_size", c.dcp_world_size, "dcp_rank", c.dcp_rank);
  AAR_CHECK_ARG(c.interleave >= 1 && b.block_size % c.interleave == 0, "cp->interleave=", c.interleave,
                " must be >= 1 and divide config->block_size=", b.block_size);
  capi::check_group("cp->", "pcp_world_size", c.pcp_world_size, "pcp_rank", c.pcp_rank);
  b.dcp_world_size = c.dcp_world_size;
  b.dcp_rank = c.dcp_rank;
  b.cp_kv_cache_interleave_size = c.interleave;
  b.pcp_world_size = c.pcp_world_size;
  b.pcp_rank = c.pcp_rank;
}

aar_sfa_builder* make_builder(const sfa::BuilderConfig& b) {
  auto builder = std::make_unique<sfa::MetadataBuilder>(b);
  capi::LaneShells<aar_sfa_metadata> shells;
  shells.allocate(1 + builder->num_drafts());
  aar_sfa_builder* h = capi::make<aar_sfa_builder>();
  h->builder = builder.release();
  h->metadata = shells;
  return h;
}

// aar_sfa_impl_config_t and the weights as the C++ config and weights, checked by their C names.
void impl_args(const aar_sfa_impl_config_t* c, const aar_mla_weights_t* w, const aar_sfa_indexer_weights_t* iw,
               sfa::ImplConfig& ic, mla::Weights& mw, std::optional<sfa::IndexerWeights>& siw) {
  AAR_CHECK_ARG(c->q_lora_rank >= 0, "config->q_lora_rank must be 0 (no q-LoRA) or positive, got ", c->q_lora_rank);
  const bool lora = c->q_lora_rank > 0;
  ic.dims = {c->num_heads,        c->hidden_size,
             lora ? std::optional<int64_t>(c->q_lora_rank) : std::nullopt,
             c->kv_lora_rank,     c->qk_nope_head_dim,
             c->qk_rope_head_dim, c->v_head_dim};
  ic.scale = c->scale;
  ic.q_norm_eps = c->q_norm_eps;
  ic.kv_norm_eps = c->kv_norm_eps;
  const bool has_indexer = capi::flag(c->has_indexer, "config->has_indexer");
  if (has_indexer) {
    sfa::IndexerConfig idx;
    idx.n_head = c->index_n_heads;
    idx.head_dim = c->index_head_dim;
    idx.topk = c->index_topk;
    idx.k_norm_eps = c->index_k_norm_eps;
    idx.glm_moe_dsa = capi::flag(c->glm_moe_dsa, "config->glm_moe_dsa");
    ic.indexer = idx;
  }
  ic.use_index_cache = capi::flag(c->use_index_cache, "config->use_index_cache");
  ic.sfa_c8 = capi::flag(c->sfa_c8, "config->sfa_c8");
  ic.li_c8 = capi::flag(c->li_c8, "config->li_c8");
  ic.device_kind = capi::device_kind(c->device_kind, "config->device_kind");
  ic.layer_index = c->layer_index;
  ic.workspace_group = c->workspace_group;
  ic.preprocess.is_kv_consumer = capi::flag(c->is_kv_consumer, "config->is_kv_consumer");
  ic.preprocess.is_kv_producer = capi::flag(c->is_kv_producer, "config->is_kv_producer");
  ic.preprocess.chunked_q_proj = capi::flag(c->chunked_q_proj, "config->chunked_q_proj");
  ic.preprocess.enable_sparse_sfa_c8 = ic.sfa_c8;  // the selection follows the layer's SFA C8
  AAR_CHECK_ARG(lora == (w->q_a_proj != nullptr), "weights->q_a_proj must be given exactly when q_lora_rank > 0 (",
                c->q_lora_rank, "), got ", w->q_a_proj ? "a tensor" : "NULL");
  AAR_CHECK_ARG(lora == (w->q_a_layernorm != nullptr),
                "weights->q_a_layernorm must be given exactly when q_lora_rank > 0 (", c->q_lora_rank, "), got ",
                w->q_a_layernorm ? "a tensor" : "NULL");
  mw.q_a_proj = capi::borrow_optional(w->q_a_proj, "weights->q_a_proj");
  mw.q_a_layernorm = capi::borrow_optional(w->q_a_layernorm, "weights->q_a_layernorm");
  mw.q_proj = capi::borrow(w->q_proj, "weights->q_proj");
  mw.kv_a_proj_with_mqa = capi::borrow(w->kv_a_proj_with_mqa, "weights->kv_a_proj_with_mqa");
  mw.kv_a_layernorm = capi::borrow(w->kv_a_layernorm, "weights->kv_a_layernorm");
  mw.kv_b_proj = capi::borrow(w->kv_b_proj, "weights->kv_b_proj");
  mw.o_proj = capi::borrow(w->o_proj, "weights->o_proj");
  AAR_CHECK_ARG(has_indexer == (iw != nullptr), "indexer_weights must be given exactly when config->has_indexer is 1 (",
                c->has_indexer, "), got ", iw ? "a struct" : "NULL");
  if (has_indexer) {
    capi::check_struct(iw, "indexer_weights", "aar_sfa_indexer_weights_init");
    siw = sfa::IndexerWeights{capi::borrow(iw->wq_b, "indexer_weights->wq_b"),
                              capi::borrow(iw->wk, "indexer_weights->wk"),
                              capi::borrow(iw->weights_proj, "indexer_weights->weights_proj"),
                              capi::borrow(iw->k_norm_weight, "indexer_weights->k_norm_weight"),
                              capi::borrow(iw->k_norm_bias, "indexer_weights->k_norm_bias")};
  }
}

const char* const kKvNames[capi::kSfaMaxKv] = {"kv_cache[0]", "kv_cache[1]", "kv_cache[2]", "kv_cache[3]"};

}  // namespace

extern "C" {

void aar_sfa_builder_config_init(aar_sfa_builder_config_t* c) {
  if (c == nullptr) return;
  const sfa::BuilderConfig d;
  *c = aar_sfa_builder_config_t{};
  c->struct_size = sizeof(*c);
  c->max_num_reqs = d.max_num_reqs;
  c->max_num_tokens = d.max_num_tokens;
  c->max_blocks_per_req = d.max_blocks_per_req;
  c->block_size = d.block_size;
  c->num_blocks = d.num_blocks;
  c->num_speculative_tokens = d.num_speculative_tokens;
  c->num_drafts = -1;
  c->chunked_prefill_enabled = d.chunked_prefill_enabled;
  c->graph_decode_padding = d.graph_decode_padding;
  c->device = DLDevice{kDLCPU, 0};
  c->separate_device_buffers = AAR_DEFAULT;
  c->staging_buffers = d.staging_buffers;
}

void aar_sfa_build_inputs_init(aar_sfa_build_inputs_t* in) {
  if (in == nullptr) return;
  *in = aar_sfa_build_inputs_t{};
  in->struct_size = sizeof(*in);
  in->attn_state = AAR_STATE_AUTO;
}

void aar_sfa_impl_config_init(aar_sfa_impl_config_t* c) {
  if (c == nullptr) return;
  const sfa::ImplConfig d;
  const sfa::IndexerConfig di;
  *c = aar_sfa_impl_config_t{};
  c->struct_size = sizeof(*c);
  c->kv_lora_rank = d.dims.kv_lora_rank;
  c->qk_nope_head_dim = d.dims.qk_nope_head_dim;
  c->qk_rope_head_dim = d.dims.qk_rope_head_dim;
  c->v_head_dim = d.dims.v_head_dim;
  c->scale = d.scale;
  c->q_norm_eps = d.q_norm_eps;
  c->kv_norm_eps = d.kv_norm_eps;
  c->has_indexer = 1;
  c->index_n_heads = di.n_head;
  c->index_head_dim = di.head_dim;
  c->index_topk = di.topk;
  c->index_k_norm_eps = di.k_norm_eps;
  c->device_kind = static_cast<int32_t>(d.device_kind);
  c->layer_index = d.layer_index;
  c->workspace_group = d.workspace_group;
}

void aar_sfa_indexer_weights_init(aar_sfa_indexer_weights_t* w) {
  if (w == nullptr) return;
  *w = aar_sfa_indexer_weights_t{};
  w->struct_size = sizeof(*w);
}

aar_status_t aar_sfa_builder_create(const aar_sfa_builder_config_t* c, aar_sfa_builder_t** out) {
  return guarded("aar_sfa_builder_create", [&] {
    capi::check_struct(c, "config", "aar_sfa_builder_config_init");
    capi::check_not_null(out, "out");
    *out = make_builder(builder_config(c));
  });
}

void aar_sfa_builder_cp_init(aar_sfa_builder_cp_t* c) {
  if (c == nullptr) return;
  const sfa::BuilderConfig d;
  *c = aar_sfa_builder_cp_t{};
  c->struct_size = sizeof(*c);
  c->dcp_world_size = d.dcp_world_size;
  c->dcp_rank = d.dcp_rank;
  c->interleave = d.cp_kv_cache_interleave_size;
  c->pcp_world_size = d.pcp_world_size;
  c->pcp_rank = d.pcp_rank;
}

aar_status_t aar_sfa_builder_create_cp(const aar_sfa_builder_config_t* c, const aar_sfa_builder_cp_t* cp,
                                       aar_sfa_builder_t** out) {
  return guarded("aar_sfa_builder_create_cp", [&] {
    capi::check_struct(c, "config", "aar_sfa_builder_config_init");
    capi::check_struct(cp, "cp", "aar_sfa_builder_cp_init");
    capi::check_not_null(out, "out");
    sfa::BuilderConfig b = builder_config(c);
    cp_fields(*cp, b);
    *out = make_builder(b);
  });
}

aar_status_t aar_sfa_builder_pcp_local_rows(const aar_sfa_builder_t* b, int32_t* token_index, size_t capacity,
                                            size_t* count) {
  return guarded("aar_sfa_builder_pcp_local_rows", [&] {
    const sfa::MetadataBuilder& builder = *capi::checked(b, "builder")->builder;
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

void aar_sfa_builder_destroy(aar_sfa_builder_t* b) {
  capi::destroy("aar_sfa_builder_destroy", b, "builder", [](aar_sfa_builder* h) {
    delete h->builder;
    h->metadata.retire_all();
  });
}

aar_status_t aar_sfa_builder_build(aar_sfa_builder_t* b, const aar_sfa_build_inputs_t* in,
                                   const aar_sfa_metadata_t** out) {
  return guarded("aar_sfa_builder_build", [&] {
    capi::checked(b, "builder");
    capi::check_not_null(out, "out");
    const sfa::BuildInputs bi = build_inputs(in);
    *out = b->metadata.wrap(0, b->builder->build(bi));
  });
}

aar_status_t aar_sfa_builder_build_for_graph_capture(aar_sfa_builder_t* b, const aar_sfa_build_inputs_t* in,
                                                     aar_attn_state_t state, const aar_sfa_metadata_t** out) {
  return guarded("aar_sfa_builder_build_for_graph_capture", [&] {
    capi::checked(b, "builder");
    capi::check_not_null(out, "out");
    const sfa::BuildInputs bi = build_inputs(in);
    const auto s = capi::capture_state(state);
    *out = b->metadata.wrap(0, b->builder->build_for_graph_capture(bi, s));
  });
}

aar_status_t aar_sfa_builder_build_for_drafting(aar_sfa_builder_t* b, const aar_sfa_build_inputs_t* in,
                                                int32_t draft_index, const aar_sfa_metadata_t** out) {
  return guarded("aar_sfa_builder_build_for_drafting", [&] {
    capi::checked(b, "builder");
    capi::check_not_null(out, "out");
    const sfa::BuildInputs bi = build_inputs(in);
    const int32_t lane = b->metadata.draft_lane(draft_index);
    *out = b->metadata.wrap(lane, b->builder->build_for_drafting(bi, draft_index));
  });
}

aar_status_t aar_sfa_builder_block_table(aar_sfa_builder_t* b, DLManagedTensor** out) {
  return capi::lend_block_table("aar_sfa_builder_block_table", b, out);
}

aar_status_t aar_sfa_metadata_get_info(const aar_sfa_metadata_t* m, aar_sfa_metadata_info_t* info) {
  return guarded("aar_sfa_metadata_get_info", [&] {
    const sfa::Metadata& md = *capi::checked(m, "metadata")->md;
    capi::check_struct(info, "info", "sizeof(aar_sfa_metadata_info_t)");
    info->attn_state = capi::to_c(md.attn_state);
    info->num_reqs = md.num_reqs;
    info->num_kernel_reqs = md.num_kernel_reqs;
    info->num_actual_tokens = md.num_actual_tokens;
    info->num_input_tokens = md.num_input_tokens;
    info->num_decodes = md.num_decodes;
    info->num_prefills = md.num_prefills;
    info->num_decode_tokens = md.num_decode_tokens;
    info->num_prefill_tokens = md.num_prefill_tokens;
    info->max_query_len = md.max_query_len;
    info->max_seq_len = md.max_seq_len;
    info->draft_index = md.draft_index;
    info->generation = md.stamp.generation;
  });
}

aar_status_t aar_sfa_topk_buffer_create(int64_t max_num_tokens, int64_t index_topk, DLDevice device,
                                        aar_sfa_topk_buffer_t** out) {
  return guarded("aar_sfa_topk_buffer_create", [&] {
    capi::check_not_null(out, "out");
    const c10::Device dev = capi::device_of(device, "device");
    auto buffer = std::make_unique<sfa::TopkBuffer>(max_num_tokens, index_topk, dev);
    aar_sfa_topk_buffer* h = capi::make<aar_sfa_topk_buffer>();
    h->buffer = buffer.release();
    *out = h;
  });
}

void aar_sfa_topk_buffer_destroy(aar_sfa_topk_buffer_t* t) {
  capi::destroy("aar_sfa_topk_buffer_destroy", t, "buffer", [](aar_sfa_topk_buffer* h) { delete h->buffer; });
}

aar_status_t aar_sfa_topk_buffer_tensor(aar_sfa_topk_buffer_t* t, DLManagedTensor** out) {
  return guarded("aar_sfa_topk_buffer_tensor", [&] {
    capi::checked(t, "buffer");
    capi::check_not_null(out, "out");
    *out = capi::lend(t->buffer->buffer());
  });
}

aar_status_t aar_sfa_impl_create(const aar_sfa_impl_config_t* c, const aar_mla_weights_t* w,
                                 const aar_sfa_indexer_weights_t* iw, aar_sfa_impl_t** out) {
  return guarded("aar_sfa_impl_create", [&] {
    capi::check_struct(c, "config", "aar_sfa_impl_config_init");
    capi::check_struct(w, "weights", "aar_mla_weights_init");
    capi::check_not_null(out, "out");
    sfa::ImplConfig ic;
    mla::Weights mw;
    std::optional<sfa::IndexerWeights> siw;
    impl_args(c, w, iw, ic, mw, siw);
    auto state = std::make_unique<capi::SfaImplState>(ic, mw, siw);
    aar_sfa_impl* h = capi::make<aar_sfa_impl>();
    h->state = state.release();
    *out = h;
  });
}

aar_status_t aar_sfa_impl_create_cp(const aar_sfa_impl_config_t* c, const aar_mla_weights_t* w,
                                    const aar_sfa_indexer_weights_t* iw, aar_cp_comm_t* dcp_comm,
                                    aar_cp_comm_t* pcp_comm, aar_sfa_impl_t** out) {
  return guarded("aar_sfa_impl_create_cp", [&] {
    capi::check_struct(c, "config", "aar_sfa_impl_config_init");
    capi::check_struct(w, "weights", "aar_mla_weights_init");
    AAR_CHECK_ARG(dcp_comm != nullptr || pcp_comm != nullptr,
                  "dcp_comm and pcp_comm are both NULL (aar_sfa_impl_create makes a single-rank layer)");
    std::shared_ptr<cp::Comm> d = dcp_comm != nullptr ? capi::comm_of(dcp_comm, "dcp_comm") : nullptr;
    std::shared_ptr<cp::Comm> p = pcp_comm != nullptr ? capi::comm_of(pcp_comm, "pcp_comm") : nullptr;
    capi::check_not_null(out, "out");
    sfa::ImplConfig ic;
    mla::Weights mw;
    std::optional<sfa::IndexerWeights> siw;
    impl_args(c, w, iw, ic, mw, siw);
    auto state = std::make_unique<capi::SfaImplState>(ic, mw, siw, std::move(d), std::move(p));
    aar_sfa_impl* h = capi::make<aar_sfa_impl>();
    h->state = state.release();
    *out = h;
  });
}

void aar_sfa_impl_destroy(aar_sfa_impl_t* impl) {
  capi::destroy("aar_sfa_impl_destroy", impl, "impl", [](aar_sfa_impl* h) { delete h->state; });
}

aar_status_t aar_sfa_impl_forward(aar_sfa_impl_t* impl, const DLManagedTensor* hidden,
                                  const DLManagedTensor* const* kv_cache, size_t num_kv_cache,
                                  const aar_sfa_metadata_t* metadata, const DLManagedTensor* output,
                                  aar_sfa_topk_buffer_t* topk) {
  return guarded("aar_sfa_impl_forward", [&] {
    capi::SfaImplState& st = *capi::checked(impl, "impl")->state;
    const sfa::Metadata* md = metadata ? capi::checked(metadata, "metadata")->md : nullptr;
    sfa::TopkBuffer* tb = topk ? capi::checked(topk, "topk")->buffer : nullptr;
    AAR_CHECK_ARG(kv_cache != nullptr, "kv_cache is NULL");
    AAR_CHECK_ARG(num_kv_cache >= 1 && num_kv_cache <= capi::kSfaMaxKv, "num_kv_cache must be in [1, ",
                  capi::kSfaMaxKv, "] (the composed cache tuple), got ", num_kv_cache);
    const at::Tensor h = capi::borrow(hidden, "hidden");
    st.tuple.resize(num_kv_cache);
    for (size_t i = 0; i < num_kv_cache; ++i) st.tuple[i] = st.kv[i].get(kv_cache[i], kKvNames[i]);
    const at::Tensor out = capi::borrow(output, "output");
    st.impl.forward(h, st.tuple, md, out, tb);
  });
}

}  // extern "C"
