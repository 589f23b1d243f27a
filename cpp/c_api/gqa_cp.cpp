// C ABI of GQA context parallelism: the DCP builder and layer (cp/gqa_dcp.h), the PCP builder
// and layer (cp/gqa_pcp.h), over the communicator handles of cp_comm.cpp, and their graph
// updates (aar_graph_update_gqa_dcp / _pcp).
#include <algorithm>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "ascend_attn_rt/cp/gqa_dcp.h"
#include "ascend_attn_rt/cp/gqa_dcp_graph.h"
#include "ascend_attn_rt/cp/gqa_pcp.h"
#include "ascend_attn_rt/gqa/impl.h"
#include "ascend_attn_rt/graph/graph_params.h"
#include "cp_comm.h"
#include "internal.h"

using aar::capi::guarded;
namespace capi = aar::capi;
namespace cp = aar::cp;
namespace gqa = aar::gqa;

struct aar_gqa_dcp_metadata {
  static constexpr capi::Kind kKind = capi::Kind::GqaDcpMetadata;
  capi::Tag tag;
  const gqa::DcpMetadata* md;
};
struct aar_gqa_dcp_builder {
  static constexpr capi::Kind kKind = capi::Kind::GqaDcpBuilder;
  capi::Tag tag;
  gqa::DcpMetadataBuilder* builder;  // owned
  aar_gqa_dcp_metadata metadata;     // what a build returns
};
struct aar_gqa_pcp_metadata {
  static constexpr capi::Kind kKind = capi::Kind::GqaPcpMetadata;
  capi::Tag tag;
  const cp::PcpMetadata* md;
};
struct aar_gqa_pcp_builder {
  static constexpr capi::Kind kKind = capi::Kind::GqaPcpBuilder;
  capi::Tag tag;
  cp::PcpMetadataBuilder* builder;  // owned
  aar_gqa_pcp_metadata metadata;
};

namespace aar::capi {
// The layers borrow their Comm (a reference, or a pointer): the state holds a reference to
// it first, so it outlives the layer whatever the caller destroys first.
struct GqaDcpState {
  GqaDcpState(const gqa::ImplConfig& c, std::shared_ptr<cp::Comm> comm_) : comm(std::move(comm_)), impl(c, *comm) {}
  std::shared_ptr<cp::Comm> comm;
  gqa::DcpAttentionImpl impl;
  GqaCaches caches;
};
struct GqaPcpState {
  GqaPcpState(const gqa::ImplConfig& c, std::shared_ptr<cp::Comm> pcp_, std::shared_ptr<cp::Comm> dcp_)
      : pcp(std::move(pcp_)), dcp(std::move(dcp_)), impl(c, pcp.get(), dcp.get()) {}
  std::shared_ptr<cp::Comm> pcp, dcp;
  cp::PcpAttentionImpl impl;
  GqaCaches caches;
};
}  // namespace aar::capi

struct aar_gqa_dcp_impl {
  static constexpr capi::Kind kKind = capi::Kind::GqaDcpImpl;
  capi::Tag tag;
  capi::GqaDcpState* state;  // owned
};
struct aar_gqa_pcp_impl {
  static constexpr capi::Kind kKind = capi::Kind::GqaPcpImpl;
  capi::Tag tag;
  capi::GqaPcpState* state;  // owned
};

namespace {

const gqa::DcpMetadata* unwrap(const aar_gqa_dcp_metadata_t* m, const char* name) {
  return capi::checked(m, name)->md;
}
const cp::PcpMetadata* unwrap(const aar_gqa_pcp_metadata_t* m, const char* name) {
  return capi::checked(m, name)->md;
}

// The builder core's fields (core/step.h), common to both configs.
template <typename C>
void core_fields(const C* c, aar::core::BuilderCore& b) {
  b.max_num_reqs = c->max_num_reqs;
  b.max_num_tokens = c->max_num_tokens;
  b.max_blocks_per_req = c->max_blocks_per_req;
  b.block_size = c->block_size;
  b.num_blocks = c->num_blocks;
  b.device = capi::device_of(c->device, "config->device");
  b.separate_device_buffers = capi::tristate(c->separate_device_buffers, "config->separate_device_buffers");
  b.staging_buffers = c->staging_buffers;
}

template <typename C>
void core_defaults(C* c) {
  const aar::core::BuilderCore d;
  c->max_num_reqs = d.max_num_reqs;
  c->max_num_tokens = d.max_num_tokens;
  c->max_blocks_per_req = d.max_blocks_per_req;
  c->block_size = d.block_size;
  c->num_blocks = d.num_blocks;
  c->device = DLDevice{kDLCPU, 0};
  c->separate_device_buffers = AAR_DEFAULT;
  c->staging_buffers = d.staging_buffers;
}

// The step fields both input structs have (core::StepInput).
template <typename In>
void step_fields(const In* in, aar::core::StepInput& b) {
  b.query_start_loc = capi::host_array(in->query_start_loc, in->query_start_loc_len, "inputs->query_start_loc");
  b.seq_lens = capi::host_array(in->seq_lens, in->seq_lens_len, "inputs->seq_lens");
  b.block_table = capi::host_array(in->block_table, in->block_table_len, "inputs->block_table");
  b.block_table_stride = in->block_table_stride;
  b.num_input_tokens = in->num_input_tokens;
  b.is_prefilling = capi::host_array(in->is_prefilling, in->is_prefilling_len, "inputs->is_prefilling");
}

gqa::DcpBuildInputs dcp_inputs(const aar_gqa_dcp_build_inputs_t* in) {
  capi::check_struct(in, "inputs", "aar_gqa_dcp_build_inputs_init");
  gqa::DcpBuildInputs b;
  step_fields(in, b);
  b.draft_step = in->draft_step;
  return b;
}

cp::PcpBuildInputs pcp_inputs(const aar_gqa_pcp_build_inputs_t* in) {
  capi::check_struct(in, "inputs", "aar_gqa_pcp_build_inputs_init");
  cp::PcpBuildInputs b;
  step_fields(in, b);
  return b;
}

// The GQA config's fields that steer the plain GQA layer's decode path and graph keys
// (gqa/impl.h's path rule): the DCP layer has one decode path and keys its captured calls by
// layer only, so it reads none of them, and a value other than the default is refused by name
// rather than ignored. (The PCP layer reads them: its replicated mode runs the GQA layer.)
void refuse_gqa_only_fields(const aar_gqa_impl_config_t& c) {
  const char* what = " with a DCP layer (it has one decode path; the field steers the GQA layer's)";
  if (c.pa_shape_list_len != 0) aar::throw_not_supported("config->pa_shape_list", what);
  if (c.full_decode_only_graph != 0) aar::throw_not_supported("config->full_decode_only_graph", what);
  if (c.has_speculative_config != 0) {
    aar::throw_not_supported("config->has_speculative_config", what,
                             "; speculative decode is the builder's num_speculative_tokens");
  }
  if (c.kv_cache_group != 0) {
    aar::throw_not_supported("config->kv_cache_group=", c.kv_cache_group,
                             " with a DCP layer (its captured calls are keyed by layer_index only)");
  }
}


// aar_gqa_pcp_builder_create(_ext): the builder of config (and ext's options; NULL: their
// defaults), every field checked by its C name before anything is made. Returns the handle for
// the caller to store in *out (checked not NULL here).
aar_gqa_pcp_builder* pcp_builder(const aar_gqa_pcp_builder_config_t* c, const aar_gqa_pcp_builder_ext_t* ext,
                                 aar_gqa_pcp_builder_t** out) {
  capi::check_struct(c, "config", "aar_gqa_pcp_builder_config_init");
  capi::check_not_null(out, "out");
  cp::PcpConfig b;
  core_fields(c, b);
  if (ext != nullptr) {
    AAR_CHECK_ARG(ext->num_speculative_tokens >= 0 && ext->num_speculative_tokens <= 15,
                  "ext->num_speculative_tokens must be in [0, 15], got ", ext->num_speculative_tokens);
    b.num_speculative_tokens = ext->num_speculative_tokens;
  }
  capi::check_group("config->", "pcp_size", c->pcp_size, "pcp_rank", c->pcp_rank);
  capi::check_group("config->", "dcp_size", c->dcp_size, "dcp_rank", c->dcp_rank);
  b.pcp_size = c->pcp_size;
  b.pcp_rank = c->pcp_rank;
  b.dcp_size = c->dcp_size;
  b.dcp_rank = c->dcp_rank;
  b.interleave_size = c->interleave_size;
  const int32_t mode = capi::enum_int(c->kv_mode);
  AAR_CHECK_ARG(mode == AAR_PCP_SHARDED || mode == AAR_PCP_REPLICATED,
                "config->kv_mode must be AAR_PCP_SHARDED (0) or AAR_PCP_REPLICATED (1), got ", mode);
  b.kv_mode = mode == AAR_PCP_SHARDED ? aar::plan::PcpKvMode::Sharded : aar::plan::PcpKvMode::Replicated;
  auto builder = std::make_unique<cp::PcpMetadataBuilder>(b);
  aar_gqa_pcp_builder* h = capi::make<aar_gqa_pcp_builder>();
  h->builder = builder.release();
  capi::mark_live(h->metadata.tag, capi::Kind::GqaPcpMetadata);
  h->metadata.md = &h->builder->metadata();
  return h;
}

}  // namespace

extern "C" {

// ---------------------------------------------------------------- DCP

void aar_gqa_dcp_builder_config_init(aar_gqa_dcp_builder_config_t* c) {
  if (c == nullptr) return;
  const gqa::DcpBuilderConfig d;
  *c = aar_gqa_dcp_builder_config_t{};
  c->struct_size = sizeof(*c);
  core_defaults(c);
  c->num_speculative_tokens = d.num_speculative_tokens;
  c->dcp_world_size = d.shard.world;
  c->dcp_rank = d.shard.rank;
  c->interleave = d.shard.interleave;
  c->pd_recompute_scheduler = d.pd_recompute_scheduler;
}

void aar_gqa_dcp_build_inputs_init(aar_gqa_dcp_build_inputs_t* in) {
  if (in == nullptr) return;
  *in = aar_gqa_dcp_build_inputs_t{};
  in->struct_size = sizeof(*in);
  in->draft_step = -1;
}

aar_status_t aar_gqa_dcp_builder_create(const aar_gqa_dcp_builder_config_t* c, aar_gqa_dcp_builder_t** out) {
  return guarded("aar_gqa_dcp_builder_create", [&] {
    capi::check_struct(c, "config", "aar_gqa_dcp_builder_config_init");
    capi::check_not_null(out, "out");
    gqa::DcpBuilderConfig b;
    core_fields(c, b);
    b.num_speculative_tokens = c->num_speculative_tokens;
    capi::check_group("config->", "dcp_world_size", c->dcp_world_size, "dcp_rank", c->dcp_rank);
    b.shard = aar::plan::DcpShard{c->dcp_world_size, c->dcp_rank, c->interleave};
    b.pd_recompute_scheduler = capi::flag(c->pd_recompute_scheduler, "config->pd_recompute_scheduler");
    auto builder = std::make_unique<gqa::DcpMetadataBuilder>(b);
    aar_gqa_dcp_builder* h = capi::make<aar_gqa_dcp_builder>();
    h->builder = builder.release();
    capi::mark_live(h->metadata.tag, capi::Kind::GqaDcpMetadata);
    h->metadata.md = &h->builder->metadata();
    *out = h;
  });
}

void aar_gqa_dcp_builder_destroy(aar_gqa_dcp_builder_t* b) {
  capi::destroy("aar_gqa_dcp_builder_destroy", b, "builder", [](aar_gqa_dcp_builder* h) {
    delete h->builder;
    capi::mark_dead(h->metadata.tag);
  });
}

aar_status_t aar_gqa_dcp_builder_build(aar_gqa_dcp_builder_t* b, const aar_gqa_dcp_build_inputs_t* in,
                                       const aar_gqa_dcp_metadata_t** out) {
  return guarded("aar_gqa_dcp_builder_build", [&] {
    capi::checked(b, "builder");
    capi::check_not_null(out, "out");
    const gqa::DcpBuildInputs bi = dcp_inputs(in);
    b->metadata.md = &b->builder->build(bi);
    *out = &b->metadata;
  });
}

aar_status_t aar_gqa_dcp_builder_build_for_drafting(aar_gqa_dcp_builder_t* b, const aar_gqa_dcp_build_inputs_t* in,
                                                    int32_t draft_index, const aar_gqa_dcp_metadata_t** out) {
  return guarded("aar_gqa_dcp_builder_build_for_drafting", [&] {
    capi::checked(b, "builder");
    capi::check_not_null(out, "out");
    const gqa::DcpBuildInputs bi = dcp_inputs(in);
    b->metadata.md = &b->builder->build_for_drafting(bi, draft_index);
    *out = &b->metadata;
  });
}

aar_status_t aar_gqa_dcp_builder_build_for_graph_capture(aar_gqa_dcp_builder_t* b,
                                                         const aar_gqa_dcp_build_inputs_t* in, aar_attn_state_t state,
                                                         const aar_gqa_dcp_metadata_t** out) {
  return guarded("aar_gqa_dcp_builder_build_for_graph_capture", [&] {
    capi::checked(b, "builder");
    capi::check_not_null(out, "out");
    const gqa::DcpBuildInputs bi = dcp_inputs(in);
    const auto s = capi::capture_state(state);
    b->metadata.md = &b->builder->build_for_graph_capture(bi, s);
    *out = &b->metadata;
  });
}

aar_status_t aar_graph_update_gqa_dcp(aar_graph_params_t* g, int64_t num_tokens, const aar_gqa_dcp_metadata_t* m) {
  return guarded("aar_graph_update_gqa_dcp", [&] {
    aar::graph::GraphParams& params = *capi::checked(g, "graph")->g;
    const gqa::DcpMetadata& md = *unwrap(m, "metadata");
    params.update(num_tokens, std::vector<aar::graph::StepParams>{gqa::dcp_graph_step_params(md)});
  });
}

aar_status_t aar_gqa_dcp_metadata_get_info(const aar_gqa_dcp_metadata_t* m, aar_gqa_dcp_metadata_info_t* info) {
  return guarded("aar_gqa_dcp_metadata_get_info", [&] {
    const gqa::DcpMetadata& md = *unwrap(m, "metadata");
    capi::check_struct(info, "info", "sizeof(aar_gqa_dcp_metadata_info_t)");
    info->num_reqs = md.num_reqs;
    info->num_kernel_reqs = md.num_kernel_reqs;
    info->num_actual_tokens = md.num_actual_tokens;
    info->num_input_tokens = md.num_input_tokens;
    info->num_decodes = md.num_decodes;
    info->num_prefills = md.num_prefills;
    info->num_decode_tokens = md.num_decode_tokens;
    info->dcp_world_size = md.shard.world;
    info->dcp_rank = md.shard.rank;
    info->interleave = md.shard.interleave;
    info->num_local_writes = md.num_local_writes;
    info->draft_step = md.draft_step;
    info->generation = md.stamp.generation;
  });
}

aar_status_t aar_gqa_dcp_impl_create(const aar_gqa_impl_config_t* c, aar_cp_comm_t* comm, aar_gqa_dcp_impl_t** out) {
  return guarded("aar_gqa_dcp_impl_create", [&] {
    capi::check_struct(c, "config", "aar_gqa_impl_config_init");
    refuse_gqa_only_fields(*c);
    std::shared_ptr<cp::Comm> cm = capi::comm_of(comm, "comm");
    capi::check_not_null(out, "out");
    auto state = std::make_unique<capi::GqaDcpState>(capi::gqa_impl_config(*c), std::move(cm));
    aar_gqa_dcp_impl* h = capi::make<aar_gqa_dcp_impl>();
    h->state = state.release();
    *out = h;
  });
}

void aar_gqa_dcp_impl_destroy(aar_gqa_dcp_impl_t* impl) {
  capi::destroy("aar_gqa_dcp_impl_destroy", impl, "impl", [](aar_gqa_dcp_impl* h) { delete h->state; });
}

aar_status_t aar_gqa_dcp_impl_forward(aar_gqa_dcp_impl_t* impl, const DLManagedTensor* query,
                                      const DLManagedTensor* key, const DLManagedTensor* value,
                                      const DLManagedTensor* key_cache, const DLManagedTensor* value_cache,
                                      const aar_gqa_dcp_metadata_t* metadata, const DLManagedTensor* output) {
  return guarded("aar_gqa_dcp_impl_forward", [&] {
    capi::GqaDcpState& st = *capi::checked(impl, "impl")->state;
    const gqa::DcpMetadata* md = metadata ? unwrap(metadata, "metadata") : nullptr;
    capi::gqa_forward(st.impl, st.caches, query, key, value, key_cache, value_cache, md, output);
  });
}

// ---------------------------------------------------------------- PCP

void aar_gqa_pcp_builder_config_init(aar_gqa_pcp_builder_config_t* c) {
  if (c == nullptr) return;
  const cp::PcpConfig d;
  *c = aar_gqa_pcp_builder_config_t{};
  c->struct_size = sizeof(*c);
  core_defaults(c);
  c->pcp_size = d.pcp_size;
  c->pcp_rank = d.pcp_rank;
  c->dcp_size = d.dcp_size;
  c->dcp_rank = d.dcp_rank;
  c->interleave_size = d.interleave_size;
  c->kv_mode = d.kv_mode == aar::plan::PcpKvMode::Sharded ? AAR_PCP_SHARDED : AAR_PCP_REPLICATED;
}

void aar_gqa_pcp_builder_ext_init(aar_gqa_pcp_builder_ext_t* ext) {
  if (ext == nullptr) return;
  const cp::PcpConfig d;
  *ext = aar_gqa_pcp_builder_ext_t{};
  ext->struct_size = sizeof(*ext);
  ext->num_speculative_tokens = d.num_speculative_tokens;
}

void aar_gqa_pcp_build_inputs_init(aar_gqa_pcp_build_inputs_t* in) {
  if (in == nullptr) return;
  *in = aar_gqa_pcp_build_inputs_t{};
  in->struct_size = sizeof(*in);
}

aar_status_t aar_gqa_pcp_builder_create(const aar_gqa_pcp_builder_config_t* c, aar_gqa_pcp_builder_t** out) {
  return guarded("aar_gqa_pcp_builder_create", [&] {
    aar_gqa_pcp_builder* h = pcp_builder(c, nullptr, out);
    *out = h;
  });
}

aar_status_t aar_gqa_pcp_builder_create_ext(const aar_gqa_pcp_builder_config_t* c, const aar_gqa_pcp_builder_ext_t* ext,
                                            aar_gqa_pcp_builder_t** out) {
  return guarded("aar_gqa_pcp_builder_create_ext", [&] {
    capi::check_struct(ext, "ext", "aar_gqa_pcp_builder_ext_init");
    aar_gqa_pcp_builder* h = pcp_builder(c, ext, out);
    *out = h;
  });
}

void aar_gqa_pcp_builder_destroy(aar_gqa_pcp_builder_t* b) {
  capi::destroy("aar_gqa_pcp_builder_destroy", b, "builder", [](aar_gqa_pcp_builder* h) {
    delete h->builder;
    capi::mark_dead(h->metadata.tag);
  });
}

aar_status_t aar_gqa_pcp_builder_build(aar_gqa_pcp_builder_t* b, const aar_gqa_pcp_build_inputs_t* in,
                                       const aar_gqa_pcp_metadata_t** out) {
  return guarded("aar_gqa_pcp_builder_build", [&] {
    capi::checked(b, "builder");
    capi::check_not_null(out, "out");
    const cp::PcpBuildInputs bi = pcp_inputs(in);
    b->metadata.md = &b->builder->build(bi);
    *out = &b->metadata;
  });
}

aar_status_t aar_gqa_pcp_builder_build_for_graph_capture(aar_gqa_pcp_builder_t* b,
                                                         const aar_gqa_pcp_build_inputs_t* in, aar_attn_state_t state,
                                                         const aar_gqa_pcp_metadata_t** out) {
  return guarded("aar_gqa_pcp_builder_build_for_graph_capture", [&] {
    capi::checked(b, "builder");
    capi::check_not_null(out, "out");
    const cp::PcpBuildInputs bi = pcp_inputs(in);
    const auto s = capi::capture_state(state);
    b->metadata.md = &b->builder->build_for_graph_capture(bi, s);
    *out = &b->metadata;
  });
}

aar_status_t aar_graph_update_gqa_pcp(aar_graph_params_t* g, int64_t num_tokens, const aar_gqa_pcp_metadata_t* m) {
  return guarded("aar_graph_update_gqa_pcp", [&] {
    aar::graph::GraphParams& params = *capi::checked(g, "graph")->g;
    const cp::PcpMetadata& md = *unwrap(m, "metadata");
    params.update(num_tokens, std::vector<aar::graph::StepParams>{cp::graph_step_params(md)});
  });
}

aar_status_t aar_gqa_pcp_builder_local_rows(const aar_gqa_pcp_builder_t* b, int32_t* token_index, int32_t* positions,
                                            size_t capacity, size_t* count) {
  return guarded("aar_gqa_pcp_builder_local_rows", [&] {
    const cp::PcpMetadataBuilder& builder = *capi::checked(b, "builder")->builder;
    capi::check_not_null(count, "count");
    const std::vector<int32_t>& idx = builder.local_token_index();
    const std::vector<int32_t>& pos = builder.local_positions();
    const size_t n = idx.size();
    if (token_index != nullptr || positions != nullptr) {
      AAR_CHECK_ARG(capacity >= n, "capacity=", capacity, " is less than the ", n,
                    " local rows of the latest build (num_local_tokens)");
    }
    if (token_index != nullptr) std::copy(idx.begin(), idx.end(), token_index);
    if (positions != nullptr) {
      if (pos.size() != n) {
        throw std::runtime_error("the PCP builder has " + std::to_string(pos.size()) + " local positions for " +
                                 std::to_string(n) + " local rows");
      }
      std::copy(pos.begin(), pos.end(), positions);
    }
    *count = n;
  });
}

aar_status_t aar_gqa_pcp_metadata_get_info(const aar_gqa_pcp_metadata_t* m, aar_gqa_pcp_metadata_info_t* info) {
  return guarded("aar_gqa_pcp_metadata_get_info", [&] {
    const cp::PcpMetadata& md = *unwrap(m, "metadata");
    capi::check_struct(info, "info", "sizeof(aar_gqa_pcp_metadata_info_t)");
    info->attn_state = capi::to_c(md.attn_state);
    info->num_reqs = md.num_reqs;
    info->num_actual_tokens = md.num_actual_tokens;
    info->num_decodes = md.num_decodes;
    info->num_prefills = md.num_prefills;
    info->num_decode_tokens = md.num_decode_tokens;
    info->kv_mode = md.kv_mode == aar::plan::PcpKvMode::Sharded ? AAR_PCP_SHARDED : AAR_PCP_REPLICATED;
    info->pcp_size = md.pcp_size;
    info->pcp_rank = md.pcp_rank;
    info->dcp_size = md.dcp_size;
    info->dcp_rank = md.dcp_rank;
    info->num_local_tokens = md.num_local_tokens;
    info->has_context = md.has_context ? 1 : 0;
    info->generation = md.stamp.generation;
  });
}

aar_status_t aar_gqa_pcp_impl_create(const aar_gqa_impl_config_t* c, aar_cp_comm_t* pcp, aar_cp_comm_t* dcp,
                                     aar_gqa_pcp_impl_t** out) {
  return guarded("aar_gqa_pcp_impl_create", [&] {
    capi::check_struct(c, "config", "aar_gqa_impl_config_init");
    std::shared_ptr<cp::Comm> p = capi::comm_of(pcp, "pcp");
    std::shared_ptr<cp::Comm> d = dcp != nullptr ? capi::comm_of(dcp, "dcp") : nullptr;
    capi::check_not_null(out, "out");
    auto state = std::make_unique<capi::GqaPcpState>(capi::gqa_impl_config(*c), std::move(p), std::move(d));
    aar_gqa_pcp_impl* h = capi::make<aar_gqa_pcp_impl>();
    h->state = state.release();
    *out = h;
  });
}

void aar_gqa_pcp_impl_destroy(aar_gqa_pcp_impl_t* impl) {
  capi::destroy("aar_gqa_pcp_impl_destroy", impl, "impl", [](aar_gqa_pcp_impl* h) { delete h->state; });
}

aar_status_t aar_gqa_pcp_impl_forward(aar_gqa_pcp_impl_t* impl, const DLManagedTensor* query,
                                      const DLManagedTensor* key, const DLManagedTensor* value,
                                      const DLManagedTensor* key_cache, const DLManagedTensor* value_cache,
                                      const aar_gqa_pcp_metadata_t* metadata, const DLManagedTensor* output) {
  return guarded("aar_gqa_pcp_impl_forward", [&] {
    capi::GqaPcpState& st = *capi::checked(impl, "impl")->state;
    const cp::PcpMetadata* md = metadata ? unwrap(metadata, "metadata") : nullptr;
    capi::check_not_null(key, "key");
    capi::check_not_null(value, "value");
    capi::check_not_null(key_cache, "key_cache");
    capi::check_not_null(value_cache, "value_cache");
    const at::Tensor q = capi::borrow(query, "query");
    const at::Tensor k = capi::borrow(key, "key");
    const at::Tensor v = capi::borrow(value, "value");
    const at::Tensor kc = st.caches.key_cache.get(key_cache, "key_cache");
    const at::Tensor vc = st.caches.value_cache.get(value_cache, "value_cache");
    const at::Tensor out = capi::borrow(output, "output");
    st.impl.forward(q, k, v, kc, vc, md, out);
  });
}

}  // extern "C"
