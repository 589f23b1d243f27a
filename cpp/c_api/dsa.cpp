// C ABI of the DSA (DeepSeek-V4) backend: the step builder, the group builders,
// their metadata facts, the layer (single rank).
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ascend_attn_rt/dsa/builder.h"
#include "ascend_attn_rt/dsa/graph.h"
#include "ascend_attn_rt/graph/graph_params.h"
#include "ascend_attn_rt/dsa/impl.h"
#include "ascend_attn_rt/sparse/topk_buffer.h"
#include "cp_comm.h"
#include "internal.h"

using aar::capi::guarded;
namespace capi = aar::capi;
namespace dsa = aar::dsa;
namespace cp = aar::cp;

struct aar_dsa_step_metadata {
  static constexpr capi::Kind kKind = capi::Kind::DsaStepMetadata;
  capi::Tag tag;
  const dsa::StepMetadata* md;
};
struct aar_dsa_group_metadata {
  static constexpr capi::Kind kKind = capi::Kind::DsaGroupMetadata;
  capi::Tag tag;
  const dsa::GroupMetadata* md;
};

struct aar_dsa_step_builder {
  static constexpr capi::Kind kKind = capi::Kind::DsaStepBuilder;
  capi::Tag tag;
  dsa::StepBuilder* builder;                          // owned
  capi::LaneShells<aar_dsa_step_metadata> metadata;   // owned
};

struct aar_dsa_group_builder {
  static constexpr capi::Kind kKind = capi::Kind::DsaGroupBuilder;
  capi::Tag tag;
  dsa::GroupBuilder* builder;                          // owned
  const aar_dsa_step_builder* step;                    // the step builder it reads
  capi::LaneShells<aar_dsa_group_metadata> metadata;   // owned
};

namespace aar::capi {
// The tuple has at most 7 entries (indexer_full on A5).
constexpr size_t kDsaMaxKv = 7;
// A DCP layer borrows its Comm (ImplConfig::dcp_comm): the state holds a reference first, so it
// outlives the layer whatever the caller destroys first (as MlaImplState).
struct DsaImplState {
  DsaImplState(const dsa::ImplConfig& c, const dsa::Weights& w, std::shared_ptr<cp::Comm> dcp_ = nullptr)
      : dcp(std::move(dcp_)), impl(with_comm(c, dcp.get()), w) {}
  static dsa::ImplConfig with_comm(dsa::ImplConfig c, cp::Comm* d) {
    c.dcp_comm = d;
    return c;
  }
  std::shared_ptr<cp::Comm> dcp;
  dsa::Impl impl;
  BorrowCache kv[kDsaMaxKv];
  std::vector<at::Tensor> tuple;
  std::vector<const dsa::GroupMetadata*> groups;
};
}  // namespace aar::capi

struct aar_dsa_impl {
  static constexpr capi::Kind kKind = capi::Kind::DsaImpl;
  capi::Tag tag;
  capi::DsaImplState* state;  // owned
};

namespace {

const char* const kKvNames[capi::kDsaMaxKv] = {"kv_cache[0]", "kv_cache[1]", "kv_cache[2]", "kv_cache[3]",
                                               "kv_cache[4]", "kv_cache[5]", "kv_cache[6]"};

// A step builder that is still alive (a group builder's is checked at each use: it must outlive the group).
const dsa::StepBuilder& live_step(const aar_dsa_group_builder* g) {
  AAR_CHECK_ARG(capi::has_tag(g->step, capi::Kind::DsaStepBuilder),
                "builder's step builder has been destroyed (destroy the group builders first)");
  return *g->step->builder;
}

dsa::AttnKvPlan make_plan(const aar_dsa_plan_config_t& p, const char* name) {
  dsa::DsaConfig c;
  c.device = capi::device_kind(p.device_kind, (std::string(name) + ".device_kind").c_str());  // 310P: NotSupported
  if (p.cache_dtype != nullptr) c.cache_dtype = std::string(p.cache_dtype);
  AAR_CHECK_ARG(p.model_dtype == 0 || p.model_dtype == 1, name, ".model_dtype must be 0 (bfloat16) or 1 (float16), got ",
                p.model_dtype);
  c.model_dtype = static_cast<dsa::KvDtype>(p.model_dtype);
  return dsa::make_attn_kv_plan(c);
}

dsa::StepInputs step_inputs(const aar_dsa_step_inputs_t* in) {
  capi::check_struct(in, "inputs", "aar_dsa_step_inputs_init");
  dsa::StepInputs s;
  s.query_start_loc = capi::host_array(in->query_start_loc, in->query_start_loc_len, "inputs->query_start_loc");
  s.seq_lens = capi::host_array(in->seq_lens, in->seq_lens_len, "inputs->seq_lens");
  s.num_input_tokens = in->num_input_tokens;
  s.attn_state = capi::attn_state(in->attn_state, "inputs->attn_state");
  s.num_spec_tokens = capi::host_array(in->num_spec_tokens, in->num_spec_tokens_len, "inputs->num_spec_tokens");
  s.num_reqs_actual = in->num_reqs_actual;
  return s;
}

dsa::GroupInputs group_inputs(const int32_t* table, size_t len, int32_t stride) {
  dsa::GroupInputs g;
  g.block_table = capi::host_array(table, len, "block_table");
  g.block_table_stride = stride;
  return g;
}

DLDataType dl_dtype(dsa::KvDtype d) {
  switch (d) {
    case dsa::KvDtype::BF16: return DLDataType{kDLBfloat, 16, 1};
    case dsa::KvDtype::FP16: return DLDataType{kDLFloat, 16, 1};
    case dsa::KvDtype::FP32: return DLDataType{kDLFloat, 32, 1};
    case dsa::KvDtype::INT8: return DLDataType{kDLInt, 8, 1};
    case dsa::KvDtype::FP8_E4M3: return DLDataType{kDLFloat8_e4m3fn, 8, 1};
  }
  return DLDataType{kDLOpaqueHandle, 0, 0};
}

void set_shape(const std::vector<int64_t>& s, int32_t& ndim, int64_t (&shape)[4]) {
  AAR_CHECK_ARG(s.size() <= 4, "a cache shape of ", s.size(), " dims (at most 4 expected)");
  ndim = static_cast<int32_t>(s.size());
  for (size_t i = 0; i < 4; ++i) shape[i] = i < s.size() ? s[i] : 0;
}

at::Tensor optional_weight(const DLManagedTensor* t, const char* name) {
  return t == nullptr ? at::Tensor() : capi::borrow(t, name);
}

}  // namespace

extern "C" {

void aar_dsa_step_builder_config_init(aar_dsa_step_builder_config_t* c) {
  if (c == nullptr) return;
  const dsa::StepBuilderConfig d;
  *c = aar_dsa_step_builder_config_t{};
  c->struct_size = sizeof(*c);
  c->max_num_reqs = d.max_num_reqs;
  c->max_num_tokens = d.max_num_tokens;
  c->num_speculative_tokens = d.num_speculative_tokens;
  c->num_drafts = -1;
  c->chunked_prefill_enabled = d.chunked_prefill_enabled;
  c->head_dim = d.model.head_dim;
  c->window = d.model.window;
  c->dspark_num_spec = d.model.dspark_num_spec;
  c->dspark_width = d.model.dspark_width;
  c->num_heads_q = d.model.num_heads_q;
  c->index_topk = d.model.index_topk;
  c->index_n_heads = d.model.index_n_heads;
  c->index_head_dim = d.model.index_head_dim;
  c->device = DLDevice{kDLCPU, 0};
  c->separate_device_buffers = AAR_DEFAULT;
  c->staging_buffers = d.staging_buffers;
}

void aar_dsa_step_inputs_init(aar_dsa_step_inputs_t* in) {
  if (in == nullptr) return;
  *in = aar_dsa_step_inputs_t{};
  in->struct_size = sizeof(*in);
  in->attn_state = AAR_STATE_AUTO;
  in->num_reqs_actual = -1;
}

void aar_dsa_group_config_init(aar_dsa_group_config_t* c) {
  if (c == nullptr) return;
  const dsa::GroupConfig d;
  *c = aar_dsa_group_config_t{};
  c->struct_size = sizeof(*c);
  c->kind = AAR_DSA_SWA;
  c->cache_block_size = d.cache_block_size;
  c->max_blocks_per_req = d.max_blocks_per_req;
  c->num_blocks = d.num_blocks;
}

void aar_dsa_impl_config_init(aar_dsa_impl_config_t* c) {
  if (c == nullptr) return;
  const dsa::ImplConfig d;
  *c = aar_dsa_impl_config_t{};
  c->struct_size = sizeof(*c);
  c->head_dim = d.head_dim;
  c->rope_dim = d.rope_dim;
  c->window = d.window;
  c->compress_ratio = d.compress_ratio;
  c->index_n_heads = d.index_n_heads;
  c->index_head_dim = d.index_head_dim;
  c->index_topk = d.index_topk;
  c->eps = d.eps;
  c->o_groups = d.o_groups;
  c->layer_index = d.layer_index;
  c->workspace_group = d.workspace_group;
}

void aar_dsa_weights_init(aar_dsa_weights_t* w) {
  if (w == nullptr) return;
  *w = aar_dsa_weights_t{};
  w->struct_size = sizeof(*w);
}

}  // extern "C"

namespace {

// aar_dsa_step_builder_config_t as the C++ config, every field checked by its C name.
dsa::StepBuilderConfig step_builder_config(const aar_dsa_step_builder_config_t* c) {
  dsa::StepBuilderConfig b;
  b.max_num_reqs = c->max_num_reqs;
  b.max_num_tokens = c->max_num_tokens;
  b.num_speculative_tokens = c->num_speculative_tokens;
  AAR_CHECK_ARG(c->num_drafts >= -1, "config->num_drafts must be -1 (num_speculative_tokens) or >= 0, got ",
                c->num_drafts);
  if (c->num_drafts >= 0) b.num_drafts = c->num_drafts;
  b.chunked_prefill_enabled = capi::flag(c->chunked_prefill_enabled, "config->chunked_prefill_enabled");
  b.cos_table = capi::borrow(c->cos_table, "config->cos_table");
  b.sin_table = capi::borrow(c->sin_table, "config->sin_table");
  AAR_CHECK_ARG((c->compress_cos_table == nullptr) == (c->compress_sin_table == nullptr),
                "config->compress_cos_table and config->compress_sin_table must both be given or both be NULL");
  if (c->compress_cos_table != nullptr) {
    b.compress_cos_table = capi::borrow(c->compress_cos_table, "config->compress_cos_table");
    b.compress_sin_table = capi::borrow(c->compress_sin_table, "config->compress_sin_table");
  }
  b.model.head_dim = c->head_dim;
  b.model.window = c->window;
  b.model.dspark_num_spec = c->dspark_num_spec;
  b.model.dspark_width = c->dspark_width;
  b.model.num_heads_q = c->num_heads_q;
  b.model.index_topk = c->index_topk;
  b.model.index_n_heads = c->index_n_heads;
  b.model.index_head_dim = c->index_head_dim;
  b.device = capi::device_of(c->device, "config->device");
  b.separate_device_buffers = capi::tristate(c->separate_device_buffers, "config->separate_device_buffers");
  b.staging_buffers = c->staging_buffers;
  return b;
}

aar_dsa_step_builder* make_step_builder(const dsa::StepBuilderConfig& b) {
  auto builder = std::make_unique<dsa::StepBuilder>(b);
  capi::LaneShells<aar_dsa_step_metadata> shells;
  shells.allocate(1 + builder->num_drafts());
  aar_dsa_step_builder* h = capi::make<aar_dsa_step_builder>();
  h->builder = builder.release();
  h->metadata = shells;
  return h;
}

}  // namespace

extern "C" {

aar_status_t aar_dsa_step_builder_create(const aar_dsa_step_builder_config_t* c, aar_dsa_step_builder_t** out) {
  return guarded("aar_dsa_step_builder_create", [&] {
    capi::check_struct(c, "config", "aar_dsa_step_builder_config_init");
    capi::check_not_null(out, "out");
    *out = make_step_builder(step_builder_config(c));
  });
}

void aar_dsa_step_builder_cp_init(aar_dsa_step_builder_cp_t* c) {
  if (c == nullptr) return;
  const dsa::StepBuilderConfig d;
  *c = aar_dsa_step_builder_cp_t{};
  c->struct_size = sizeof(*c);
  c->dcp_world_size = d.dcp_world_size;
  c->dcp_rank = d.dcp_rank;
  c->interleave = d.dcp_interleave;
}

aar_status_t aar_dsa_step_builder_create_cp(const aar_dsa_step_builder_config_t* c, const aar_dsa_step_builder_cp_t* cp,
                                            aar_dsa_step_builder_t** out) {
  return guarded("aar_dsa_step_builder_create_cp", [&] {
    capi::check_struct(c, "config", "aar_dsa_step_builder_config_init");
    capi::check_struct(cp, "cp", "aar_dsa_step_builder_cp_init");
    capi::check_not_null(out, "out");
    dsa::StepBuilderConfig b = step_builder_config(c);
    capi::check_group("cp->", "dcp_world_size", cp->dcp_world_size, "dcp_rank", cp->dcp_rank);
    AAR_CHECK_ARG(cp->interleave >= 1, "cp->interleave must be >= 1, got ", cp->interleave);
    b.dcp_world_size = cp->dcp_world_size;
    b.dcp_rank = cp->dcp_rank;
    b.dcp_interleave = cp->interleave;
    *out = make_step_builder(b);
  });
}

void aar_dsa_step_builder_destroy(aar_dsa_step_builder_t* b) {
  capi::destroy("aar_dsa_step_builder_destroy", b, "builder", [](aar_dsa_step_builder* h) {
    delete h->builder;
    h->metadata.retire_all();
  });
}

aar_status_t aar_dsa_step_builder_build(aar_dsa_step_builder_t* b, const aar_dsa_step_inputs_t* in,
                                        const aar_dsa_step_metadata_t** out) {
  return guarded("aar_dsa_step_builder_build", [&] {
    capi::checked(b, "builder");
    capi::check_not_null(out, "out");
    const dsa::StepInputs si = step_inputs(in);
    *out = b->metadata.wrap(0, b->builder->build(si));
  });
}

aar_status_t aar_dsa_step_builder_build_for_graph_capture(aar_dsa_step_builder_t* b, const aar_dsa_step_inputs_t* in,
                                                          aar_attn_state_t state, const aar_dsa_step_metadata_t** out) {
  return guarded("aar_dsa_step_builder_build_for_graph_capture", [&] {
    capi::checked(b, "builder");
    capi::check_not_null(out, "out");
    const dsa::StepInputs si = step_inputs(in);
    const auto s = capi::capture_state(state);
    *out = b->metadata.wrap(0, b->builder->build_for_graph_capture(si, s));
  });
}

aar_status_t aar_dsa_step_builder_build_for_drafting(aar_dsa_step_builder_t* b, const aar_dsa_step_inputs_t* in,
                                                     int32_t draft_index, const aar_dsa_step_metadata_t** out) {
  return guarded("aar_dsa_step_builder_build_for_drafting", [&] {
    capi::checked(b, "builder");
    capi::check_not_null(out, "out");
    const dsa::StepInputs si = step_inputs(in);
    const int32_t lane = b->metadata.draft_lane(draft_index);
    *out = b->metadata.wrap(lane, b->builder->build_for_drafting(si, draft_index));
  });
}

aar_status_t aar_dsa_step_metadata_get_info(const aar_dsa_step_metadata_t* m, aar_dsa_step_metadata_info_t* info) {
  return guarded("aar_dsa_step_metadata_get_info", [&] {
    const dsa::StepMetadata& md = *capi::checked(m, "metadata")->md;
    capi::check_struct(info, "info", "sizeof(aar_dsa_step_metadata_info_t)");
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

aar_status_t aar_dsa_group_builder_create(const aar_dsa_step_builder_t* step, const aar_dsa_group_config_t* c,
                                          aar_dsa_group_builder_t** out) {
  return guarded("aar_dsa_group_builder_create", [&] {
    capi::checked(step, "step_builder");
    capi::check_struct(c, "config", "aar_dsa_group_config_init");
    capi::check_not_null(out, "out");
    dsa::GroupConfig g;
    const int32_t kind = capi::enum_int(c->kind);
    AAR_CHECK_ARG(kind >= AAR_DSA_SWA && kind <= AAR_DSA_C128_STATE,
                  "config->kind must be an aar_dsa_cache_kind_t in [0, 6], got ", kind);
    g.kind = static_cast<dsa::DsaCacheKind>(kind);
    g.cache_block_size = c->cache_block_size;
    g.max_blocks_per_req = c->max_blocks_per_req;
    g.num_blocks = c->num_blocks;
    g.plan = make_plan(c->plan, "config->plan");
    auto builder = std::make_unique<dsa::GroupBuilder>(*step->builder, g);
    capi::LaneShells<aar_dsa_group_metadata> shells;
    shells.allocate(1 + builder->num_drafts());
    aar_dsa_group_builder* h = capi::make<aar_dsa_group_builder>();
    h->builder = builder.release();
    h->step = step;
    h->metadata = shells;
    *out = h;
  });
}

void aar_dsa_group_builder_destroy(aar_dsa_group_builder_t* b) {
  capi::destroy("aar_dsa_group_builder_destroy", b, "builder", [](aar_dsa_group_builder* h) {
    delete h->builder;
    h->metadata.retire_all();
  });
}

aar_status_t aar_dsa_group_builder_cache_info(const aar_dsa_group_builder_t* b, int64_t num_blocks,
                                              aar_dsa_group_cache_info_t* info) {
  return guarded("aar_dsa_group_builder_cache_info", [&] {
    capi::checked(b, "builder");
    capi::check_struct(info, "info", "sizeof(aar_dsa_group_cache_info_t)");
    AAR_CHECK_ARG(num_blocks >= 0, "num_blocks must be >= 0, got ", num_blocks);
    const dsa::DsaCacheSpec& sp = b->builder->cache_spec();
    aar_dsa_group_cache_info_t r = *info;  // written at the end: nothing on error
    r.kind = static_cast<aar_dsa_cache_kind_t>(sp.kind);
    r.compress_ratio = sp.compress_ratio;
    r.block_size = sp.block_size;
    r.storage_block_size = sp.storage_block_size;
    set_shape(dsa::dsa_kv_cache_shape(sp, num_blocks), r.kv_ndim, r.kv_shape);
    r.kv_dtype = dl_dtype(sp.dtype);
    if (sp.scale_dim > 0) {
      set_shape(dsa::dsa_scale_cache_shape(sp, num_blocks), r.scale_ndim, r.scale_shape);
      r.scale_dtype = dl_dtype(sp.scale_dtype);
    } else {
      r.scale_ndim = 0;
      for (int64_t& d : r.scale_shape) d = 0;
      r.scale_dtype = DLDataType{kDLOpaqueHandle, 0, 0};
    }
    *info = r;
  });
}

aar_status_t aar_dsa_group_builder_build(aar_dsa_group_builder_t* b, const aar_dsa_step_metadata_t* step,
                                         const int32_t* block_table, size_t block_table_len,
                                         int32_t block_table_stride, const aar_dsa_group_metadata_t** out) {
  return guarded("aar_dsa_group_builder_build", [&] {
    capi::checked(b, "builder");
    live_step(b);
    const dsa::StepMetadata& st = *capi::checked(step, "step")->md;
    capi::check_not_null(out, "out");
    const dsa::GroupInputs gi = group_inputs(block_table, block_table_len, block_table_stride);
    *out = b->metadata.wrap(0, b->builder->build(st, gi));
  });
}

aar_status_t aar_dsa_group_builder_build_for_drafting(aar_dsa_group_builder_t* b, const aar_dsa_step_metadata_t* step,
                                                      const int32_t* block_table, size_t block_table_len,
                                                      int32_t block_table_stride, int32_t draft_index,
                                                      const aar_dsa_group_metadata_t** out) {
  return guarded("aar_dsa_group_builder_build_for_drafting", [&] {
    capi::checked(b, "builder");
    live_step(b);
    const dsa::StepMetadata& st = *capi::checked(step, "step")->md;
    capi::check_not_null(out, "out");
    const dsa::GroupInputs gi = group_inputs(block_table, block_table_len, block_table_stride);
    const dsa::GroupMetadata& md = b->builder->build_for_drafting(st, gi, draft_index);  // checks draft_index
    *out = b->metadata.wrap(1 + draft_index, md);
  });
}

}  // extern "C"

namespace {

// aar_dsa_impl_config_t and aar_dsa_weights_t as the C++ config and weights, checked by their C names.
void impl_args(const aar_dsa_impl_config_t* c, const aar_dsa_weights_t* w, dsa::ImplConfig& ic, dsa::Weights& dw) {
  ic.hidden_size = c->hidden_size;
  ic.num_heads = c->num_heads;
  ic.head_dim = c->head_dim;
  ic.rope_dim = c->rope_dim;
  ic.q_lora_rank = c->q_lora_rank;
  ic.window = c->window;
  ic.compress_ratio = c->compress_ratio;
  ic.index_n_heads = c->index_n_heads;
  ic.index_head_dim = c->index_head_dim;
  ic.index_topk = c->index_topk;
  ic.eps = c->eps;
  ic.o_groups = c->o_groups;
  ic.o_lora_rank = c->o_lora_rank;
  ic.plan = make_plan(c->plan, "config->plan");
  ic.use_index_cache = capi::flag(c->use_index_cache, "config->use_index_cache");
  ic.skip_topk = capi::flag(c->skip_topk, "config->skip_topk");
  ic.layer_index = c->layer_index;
  ic.workspace_group = c->workspace_group;
  dw.wq_a = capi::borrow(w->wq_a, "weights->wq_a");
  dw.q_norm = capi::borrow(w->q_norm, "weights->q_norm");
  dw.wq_b = capi::borrow(w->wq_b, "weights->wq_b");
  dw.wkv = capi::borrow(w->wkv, "weights->wkv");
  dw.kv_norm = capi::borrow(w->kv_norm, "weights->kv_norm");
  dw.attn_sink = capi::borrow(w->attn_sink, "weights->attn_sink");
  dw.wo_a = capi::borrow(w->wo_a, "weights->wo_a");
  dw.wo_b = capi::borrow(w->wo_b, "weights->wo_b");
  dw.wo_a_scale = optional_weight(w->wo_a_scale, "weights->wo_a_scale");
  dw.cmp_wkv = optional_weight(w->cmp_wkv, "weights->cmp_wkv");
  dw.cmp_wgate = optional_weight(w->cmp_wgate, "weights->cmp_wgate");
  dw.cmp_ape = optional_weight(w->cmp_ape, "weights->cmp_ape");
  dw.cmp_norm = optional_weight(w->cmp_norm, "weights->cmp_norm");
  dw.idx_wq_b = optional_weight(w->idx_wq_b, "weights->idx_wq_b");
  dw.idx_weights_proj = optional_weight(w->idx_weights_proj, "weights->idx_weights_proj");
  dw.idx_cmp_wkv = optional_weight(w->idx_cmp_wkv, "weights->idx_cmp_wkv");
  dw.idx_cmp_wgate = optional_weight(w->idx_cmp_wgate, "weights->idx_cmp_wgate");
  dw.idx_cmp_ape = optional_weight(w->idx_cmp_ape, "weights->idx_cmp_ape");
  dw.idx_cmp_norm = optional_weight(w->idx_cmp_norm, "weights->idx_cmp_norm");
}

}  // namespace

extern "C" {

aar_status_t aar_dsa_impl_create(const aar_dsa_impl_config_t* c, const aar_dsa_weights_t* w, aar_dsa_impl_t** out) {
  return guarded("aar_dsa_impl_create", [&] {
    capi::check_struct(c, "config", "aar_dsa_impl_config_init");
    capi::check_struct(w, "weights", "aar_dsa_weights_init");
    capi::check_not_null(out, "out");
    dsa::ImplConfig ic;
    dsa::Weights dw;
    impl_args(c, w, ic, dw);
    auto state = std::make_unique<capi::DsaImplState>(ic, dw);
    aar_dsa_impl* h = capi::make<aar_dsa_impl>();
    h->state = state.release();
    *out = h;
  });
}

aar_status_t aar_dsa_impl_create_cp(const aar_dsa_impl_config_t* c, const aar_dsa_weights_t* w,
                                    aar_cp_comm_t* dcp_comm, aar_dsa_impl_t** out) {
  return guarded("aar_dsa_impl_create_cp", [&] {
    capi::check_struct(c, "config", "aar_dsa_impl_config_init");
    capi::check_struct(w, "weights", "aar_dsa_weights_init");
    AAR_CHECK_ARG(dcp_comm != nullptr, "dcp_comm is NULL (aar_dsa_impl_create makes a single-rank layer)");
    std::shared_ptr<cp::Comm> d = capi::comm_of(dcp_comm, "dcp_comm");
    capi::check_not_null(out, "out");
    dsa::ImplConfig ic;
    dsa::Weights dw;
    impl_args(c, w, ic, dw);
    auto state = std::make_unique<capi::DsaImplState>(ic, dw, std::move(d));
    aar_dsa_impl* h = capi::make<aar_dsa_impl>();
    h->state = state.release();
    *out = h;
  });
}

void aar_dsa_impl_destroy(aar_dsa_impl_t* impl) {
  capi::destroy("aar_dsa_impl_destroy", impl, "impl", [](aar_dsa_impl* h) { delete h->state; });
}

aar_status_t aar_dsa_impl_forward(aar_dsa_impl_t* impl, const DLManagedTensor* hidden,
                                  const DLManagedTensor* const* kv_cache, size_t num_kv_cache,
                                  const aar_dsa_step_metadata_t* step, const aar_dsa_group_metadata_t* const* groups,
                                  size_t num_groups, const DLManagedTensor* output, aar_sfa_topk_buffer_t* topk) {
  return guarded("aar_dsa_impl_forward", [&] {
    capi::DsaImplState& st = *capi::checked(impl, "impl")->state;
    std::optional<dsa::LayerMetadata> md;
    if (step != nullptr) {
      const dsa::StepMetadata& sm = *capi::checked(step, "step")->md;
      AAR_CHECK_ARG(groups != nullptr || num_groups == 0, "groups is NULL with num_groups ", num_groups);
      // A layer reads at most one group per cache kind (docs/design/dsa.md §2.3).
      AAR_CHECK_ARG(num_groups <= 16, "num_groups must be at most 16, got ", num_groups);
      st.groups.resize(num_groups);
      for (size_t i = 0; i < num_groups; ++i) {
        AAR_CHECK_ARG(groups[i] != nullptr, "groups[", i, "] is NULL");
        if (!capi::has_tag(groups[i], capi::Kind::DsaGroupMetadata)) {
          capi::check_tag(groups[i], capi::Kind::DsaGroupMetadata, ("groups[" + std::to_string(i) + "]").c_str());
        }
        st.groups[i] = groups[i]->md;
      }
      md = dsa::route_layer(st.impl.config().compress_ratio, sm,
                            aar::plan::CSpan<const dsa::GroupMetadata*>(st.groups.data(), st.groups.size()));
    }
    aar::sfa::TopkBuffer* tb = topk ? capi::checked(topk, "topk")->buffer : nullptr;
    AAR_CHECK_ARG(kv_cache != nullptr, "kv_cache is NULL");
    AAR_CHECK_ARG(num_kv_cache == 6 || num_kv_cache == 7,
                  "num_kv_cache must be 6 or 7 (compress_kv, swa_kv, state, indexer_state, indexer_k, "
                  "indexer_scale[, indexer_full]), got ",
                  num_kv_cache);
    const at::Tensor h = capi::borrow(hidden, "hidden");
    st.tuple.resize(num_kv_cache);
    for (size_t i = 0; i < num_kv_cache; ++i) {
      st.tuple[i] = kv_cache[i] == nullptr ? at::Tensor() : st.kv[i].get(kv_cache[i], kKvNames[i]);
    }
    const at::Tensor out = capi::borrow(output, "output");
    st.impl.forward(h, st.tuple, md ? &*md : nullptr, out, tb);
  });
}

aar_status_t aar_graph_update_dsa(aar_graph_params_t* g, int64_t num_tokens, const aar_dsa_step_metadata_t* step,
                                  const aar_dsa_group_metadata_t* swa) {
  return guarded("aar_graph_update_dsa", [&] {
    aar::graph::GraphParams& params = *capi::checked(g, "graph")->g;
    dsa::LayerMetadata l;
    l.step = capi::checked(step, "step")->md;
    l.swa = capi::checked(swa, "swa")->md;
    AAR_CHECK_ARG(l.swa->kind == dsa::DsaCacheKind::Swa, "swa is the metadata of a ", dsa::to_string(l.swa->kind),
                  " group, expected the SWA group's");
    params.update(num_tokens, std::vector<aar::graph::StepParams>{dsa::graph_step_params(l)});
  });
}

}  // extern "C"
